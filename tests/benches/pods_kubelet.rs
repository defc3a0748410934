//! Benchmark in the kernel lab with the host's API server: 20 PVCs, each
//! with a Pod that mounts it, until every Pod is Running, through the real
//! components of a cluster (external-provisioner and -attacher,
//! kube-controller-manager, kube-scheduler, kubelet 1.20.2 with containerd:
//! [`Cluster::start_with_kubelet`]), all 20 created at once against the
//! same 20 one at a time (each waited for until Running before the next).
//! zvols of 64 MiB over NVMe/TCP, ext4.
//!
//! Where the time goes, per volume: the controller (its own
//! `pillar_csi_controller_rpc_duration_seconds` for CreateVolume and
//! ControllerPublishVolume, the agent's share taken out), the agent (the
//! agent RPCs the controller made, from the same `/metrics`), the node
//! plugin (NodeStageVolume and NodePublishVolume, from the `took=` of its
//! log), and the rest: the sidecars, the scheduler, the controllers of
//! kube-controller-manager, kubelet and containerd, and the API server
//! between them (the wall time per volume less the three; meaningful one
//! at a time, where nothing overlaps).
//!
//! Run with `make bench FILTER=pods_kubelet`. Absolute times under TCG mean
//! little; the ratio is the result (also written to
//! `pods-kubelet-bench.txt`).
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{DeleteParams, ListParams};
use pillar_csi_lab::{
    claim_bed::ClaimBed, k8s_cluster::Cluster, metrics::clocks, pod_life::pod, Result,
};
use std::time::{Duration, Instant};

const VOLUMES: usize = 20;
/// The controller's CSI RPCs of a claim and its Pod's attach.
const CONTROLLER_RPCS: [&str; 2] = ["CreateVolume", "ControllerPublishVolume"];
/// The agent RPCs the controller makes for them.
const AGENT_RPCS: [&str; 4] = [
    "CreateVolume",
    "InspectVolume",
    "ExportVolume",
    "AllowInitiator",
];
/// The node plugin's RPCs of a Pod's start.
const NODE_RPCS: [&str; 2] = ["NodeStageVolume", "NodePublishVolume"];
/// How long 20 Pods may take to be Running (or gone) under the lab's CPU.
const LIMIT: Duration = Duration::from_secs(1500);

/// Claim `name` of the bed's zvol class and a Pod `name` that mounts it
/// and waits.
async fn claim_and_pod(cluster: &Cluster<'_>, name: &str) -> Result<()> {
    let class = &cluster.bed().objects.zvol_nvme.storage_class;
    cluster.claim(name, class, "64Mi", None).await?;
    pod(
        cluster,
        name,
        name,
        "trap 'exit 0' TERM; sleep 2147483647 & wait",
    )
    .await
}

/// Waits until every Pod named in `names` is Running.
async fn running(cluster: &Cluster<'_>, names: &[String]) -> Result<()> {
    let pods = cluster.namespaced::<Pod>();
    let start = Instant::now();
    loop {
        let list = pods.list(&ListParams::default()).await?;
        let phase = |n: &String| {
            list.items
                .iter()
                .find(|p| p.metadata.name.as_ref() == Some(n))
                .and_then(|p| p.status.as_ref().and_then(|s| s.phase.clone()))
        };
        if let Some(failed) = names.iter().find(|n| phase(n).as_deref() == Some("Failed")) {
            return Err(format!("Pod {failed} failed").into());
        }
        if names.iter().all(|n| phase(n).as_deref() == Some("Running")) {
            return Ok(());
        }
        if start.elapsed() > LIMIT {
            return Err(format!("Pods not Running within {LIMIT:?}\n{}", cluster.logs()).into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Deletes the Pods, then the claims, and waits until the Pods and the PVs
/// are gone (kubelet tore the volumes down, the attacher detached them, the
/// provisioner deleted them). Not timed.
async fn tear_down(cluster: &Cluster<'_>, names: &[String]) -> Result<()> {
    let pods = cluster.namespaced::<Pod>();
    let pvcs = cluster.namespaced::<PersistentVolumeClaim>();
    for n in names {
        pods.delete(n, &DeleteParams::default()).await?;
        pvcs.delete(n, &DeleteParams::default()).await?;
    }
    let pvs = cluster.api::<PersistentVolume>();
    let start = Instant::now();
    while !pods.list(&ListParams::default()).await?.items.is_empty()
        || !pvs.list(&ListParams::default()).await?.items.is_empty()
    {
        if start.elapsed() > LIMIT {
            return Err(format!("Pods and PVs not gone within {LIMIT:?}").into());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Ok(())
}

/// The seconds the node plugin's log says its `NODE_RPCS` took, summed
/// over its lines from `skip` on; and how many lines it has.
fn node_seconds(bed: &ClaimBed, skip: usize) -> Result<(f64, usize)> {
    let log = bed.plugin.log();
    let lines: Vec<&str> = log.lines().collect();
    let seconds = lines
        .iter()
        .skip(skip)
        .filter(|l| {
            NODE_RPCS
                .iter()
                .any(|r| l.contains(&format!("rpc=\"{r}\"")))
        })
        .filter_map(|l| l.split(" ok took=").nth(1))
        .filter_map(parse_duration)
        .sum();
    Ok((seconds, lines.len()))
}

/// A `Debug` Duration as tracing prints it (`875.05ms`, `1.77s`, `36.9µs`).
fn parse_duration(text: &str) -> Option<f64> {
    let text = text.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (number, unit) = text.split_at(split);
    let scale = match unit {
        "s" => 1.0,
        "ms" => 1e-3,
        "µs" | "us" => 1e-6,
        "ns" => 1e-9,
        _ => return None,
    };
    Some(number.parse::<f64>().ok()? * scale)
}

/// One round's figures.
struct Round {
    wall: f64,
    /// Seconds per volume.
    controller: f64,
    agent: f64,
    node: f64,
    rest: Option<f64>,
}

impl Round {
    fn line(&self, what: &str) -> String {
        let rest = match self.rest {
            Some(rest) => format!("sidecars+scheduler+kubelet+containerd+API {rest:.2} s"),
            None => "the rest overlapped".to_owned(),
        };
        format!(
            "  {what:<14} {:>7.1} s ({:>5.2} s/Pod); per volume: controller {:.2} s, agent {:.2} s, node plugin {:.2} s, {rest}\n",
            self.wall,
            self.wall / VOLUMES as f64,
            self.controller,
            self.agent,
            self.node,
        )
    }
}

/// Makes 20 claims with a Pod each Running, `at_once` or one at a time,
/// then removes them.
async fn round(cluster: &Cluster<'_>, tag: &str, at_once: bool) -> Result<Round> {
    let bed = cluster.bed();
    let names: Vec<String> = (0..VOLUMES).map(|i| format!("{tag}-{i}")).collect();
    let (controller_before, agent_before) =
        clocks(bed.controller_metrics, &CONTROLLER_RPCS, &AGENT_RPCS).await?;
    let (_, node_skip) = node_seconds(bed, 0)?;
    let start = Instant::now();
    if at_once {
        futures::future::try_join_all(names.iter().map(|n| claim_and_pod(cluster, n))).await?;
        running(cluster, &names).await?;
    } else {
        for n in &names {
            claim_and_pod(cluster, n).await?;
            running(cluster, std::slice::from_ref(n)).await?;
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let (controller_after, agent_after) =
        clocks(bed.controller_metrics, &CONTROLLER_RPCS, &AGENT_RPCS).await?;
    let (node, _) = node_seconds(bed, node_skip)?;
    let n = VOLUMES as f64;
    let agent = (agent_after - agent_before) / n;
    let controller = (controller_after - controller_before) / n - agent;
    let node = node / n;
    tear_down(cluster, &names).await?;
    Ok(Round {
        wall,
        controller,
        agent,
        node,
        rest: (!at_once).then(|| wall / n - controller - agent - node),
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> Result<()> {
    if !pillar_csi_lab::bench::selected("pods_kubelet") {
        return Ok(());
    }
    let bed = ClaimBed::start("podbench").await?;
    let cluster = Cluster::start_with_kubelet(&bed).await?;
    bed.storage_class(&bed.objects.zvol_nvme).await?;
    let sequential = round(&cluster, "seq", false).await?;
    let at_once = round(&cluster, "par", true).await?;
    let report = format!(
        "{VOLUMES} PVCs of 64 MiB zvols over NVMe/TCP, each with a Pod, until every Pod is Running, through the real\n\
         external-provisioner and -attacher, kube-controller-manager, kube-scheduler and kubelet 1.20.2 with containerd:\n\
         {}{}  ratio: all at once {:.2}x faster than one at a time\n{}\n",
        sequential.line("one at a time"),
        at_once.line("all at once"),
        sequential.wall / at_once.wall,
        pillar_csi_lab::bench::conditions(),
    );
    print!("{report}");
    std::fs::write(bed.lab.work.join("pods-kubelet-bench.txt"), &report)?;
    cluster.stop().await
}
