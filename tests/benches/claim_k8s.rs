//! Benchmark in the kernel lab with the host's API server: 20 PVCs made
//! Bound by the real Kubernetes components (external-provisioner v6.4.0
//! on the controller's socket, kube-controller-manager's PV binder), all
//! 20 created at once against the same 20 one at a time (each waited for
//! until Bound before the next), on the claim bed: zvols over NVMe/TCP.
//!
//! Where the time goes, per volume: the agent (the controller's own
//! `pillar_csi_agent_rpc_duration_seconds` for the agent RPCs of a
//! provision), the controller with its API server reads and writes (its
//! CreateVolume latency less the agent's share), and the rest: the
//! provisioner, the PV binder and the API server between them (the wall
//! time per volume less the two; meaningful one at a time, where nothing
//! overlaps).
//!
//! Run with `make bench FILTER=claim_k8s`. Absolute times under TCG mean
//! little; the ratio is the result (also written to `claim-k8s-bench.txt`).
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use pillar_csi_lab::{
    claim_bed::ClaimBed,
    k8s::{ControllerManager, Sidecars},
    metrics::clocks,
    Result,
};
use std::time::{Duration, Instant};

const VOLUMES: usize = 20;
const NAMESPACE: &str = "default";
/// The agent RPCs a provision makes.
const PROVISION_RPCS: [&str; 2] = ["CreateVolume", "InspectVolume"];
/// How long 20 claims may take to be Bound (or gone) under the lab's CPU.
const LIMIT: Duration = Duration::from_secs(900);

/// Creates claim `name` of the bed's zvol class.
async fn claim(bed: &ClaimBed, name: &str) -> Result<()> {
    let pvc: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": bed.objects.zvol_nvme.storage_class,
            "resources": {"requests": {"storage": "64Mi"}},
        },
    }))?;
    Api::<PersistentVolumeClaim>::namespaced(bed.admin.clone(), NAMESPACE)
        .create(&PostParams::default(), &pvc)
        .await?;
    Ok(())
}

/// Waits until every claim named in `names` is Bound.
async fn bound(bed: &ClaimBed, names: &[String]) -> Result<()> {
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(bed.admin.clone(), NAMESPACE);
    let start = Instant::now();
    loop {
        let list = pvcs.list(&ListParams::default()).await?;
        let done = names.iter().all(|n| {
            list.items.iter().any(|c| {
                c.metadata.name.as_deref() == Some(n.as_str())
                    && c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
            })
        });
        if done {
            return Ok(());
        }
        if start.elapsed() > LIMIT {
            return Err(format!("claims not Bound within {LIMIT:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Deletes the claims and waits until their PVs are gone (the provisioner
/// deleted the volumes). Not timed.
async fn tear_down(bed: &ClaimBed, names: &[String]) -> Result<()> {
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(bed.admin.clone(), NAMESPACE);
    for n in names {
        pvcs.delete(n, &DeleteParams::default()).await?;
    }
    let pvs = Api::<PersistentVolume>::all(bed.admin.clone());
    let start = Instant::now();
    while !pvs.list(&ListParams::default()).await?.items.is_empty() {
        if start.elapsed() > LIMIT {
            return Err(format!("PVs not deleted within {LIMIT:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

/// One round's figures.
struct Round {
    wall: f64,
    /// Seconds per volume: controller with API server, agent, and the
    /// rest when nothing overlapped (one at a time).
    controller: f64,
    agent: f64,
    rest: Option<f64>,
}

impl Round {
    fn line(&self, what: &str) -> String {
        let rest = match self.rest {
            Some(rest) => format!("provisioner+binder+API {rest:.2} s"),
            None => "the rest overlapped".to_owned(),
        };
        format!(
            "  {what:<14} {:>7.1} s ({:>5.2} s/volume); per volume: controller+API {:.2} s, agent {:.2} s, {rest}\n",
            self.wall,
            self.wall / VOLUMES as f64,
            self.controller,
            self.agent,
        )
    }
}

/// Makes 20 claims Bound, `at_once` or one at a time, then removes them.
async fn round(bed: &ClaimBed, tag: &str, at_once: bool) -> Result<Round> {
    let names: Vec<String> = (0..VOLUMES).map(|i| format!("k8s-{tag}-{i}")).collect();
    let (controller_before, agent_before) =
        clocks(bed.controller_metrics, &["CreateVolume"], &PROVISION_RPCS).await?;
    let start = Instant::now();
    if at_once {
        futures::future::try_join_all(names.iter().map(|n| claim(bed, n))).await?;
        bound(bed, &names).await?;
    } else {
        for n in &names {
            claim(bed, n).await?;
            bound(bed, std::slice::from_ref(n)).await?;
        }
    }
    let wall = start.elapsed().as_secs_f64();
    let (controller_after, agent_after) =
        clocks(bed.controller_metrics, &["CreateVolume"], &PROVISION_RPCS).await?;
    let n = VOLUMES as f64;
    let agent = (agent_after - agent_before) / n;
    let controller = (controller_after - controller_before) / n - agent;
    tear_down(bed, &names).await?;
    Ok(Round {
        wall,
        controller,
        agent,
        rest: (!at_once).then(|| wall / n - controller - agent),
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> Result<()> {
    if !pillar_csi_lab::bench::selected("claim_k8s") {
        return Ok(());
    }
    let bed = ClaimBed::start("k8sbench").await?;
    let _kcm = ControllerManager::start(&bed.server, &bed.lab.work).await?;
    let _sidecars = Sidecars::start(&bed).await?;
    let sequential = round(&bed, "seq", false).await?;
    let at_once = round(&bed, "par", true).await?;
    let report = format!(
        "{VOLUMES} PVCs of 64 MiB zvols over NVMe/TCP until Bound, through the real external-provisioner v6.4.0\n\
         and kube-controller-manager 1.20.2 (API server on the host), pillar-csi controller and the agent (mTLS):\n\
         {}{}  ratio: all at once {:.2}x faster than one at a time\n{}\n",
        sequential.line("one at a time"),
        at_once.line("all at once"),
        sequential.wall / at_once.wall,
        pillar_csi_lab::bench::conditions(),
    );
    print!("{report}");
    std::fs::write(bed.lab.work.join("claim-k8s-bench.txt"), &report)?;
    Ok(())
}
