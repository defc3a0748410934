//! Benchmark in the kernel lab with the host's API server: provision,
//! publish and stage of 20 claims through the CSI services as a cluster
//! runs them (the `pillar-csi controller` binary against the API server,
//! the real agent over mTLS, `pillar-csi node`), all 20 at once against
//! the same 20 one at a time, on the claim bed ([`ClaimBed`]): zvols over
//! NVMe/TCP, formatted ext4 on the node.
//!
//! Each claim's PVC exists before the clock starts; the clock covers
//! CreateVolume, ControllerPublishVolume and NodeStageVolume. The cost of
//! a volume is split three ways: the agent (the controller's own
//! `pillar_csi_agent_rpc_duration_seconds` for the agent RPCs of a
//! provision), the controller with its API server reads and writes (its
//! CreateVolume and ControllerPublishVolume latency less the agent's
//! share), and the node (NodeStageVolume as kubelet sees it). The split is
//! summed over volumes, so at once it shows what overlapped.
//!
//! Run with `make bench FILTER=claim_pipeline`. Absolute times under TCG
//! mean little; the ratio is the result (also written to
//! `claim-bench.txt`).
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, DeleteParams, PostParams};
use pillar_csi_lab::{
    claim_bed::{ClaimBed, Class},
    claim_requests::{self as requests, ClaimRef},
    csi::csi_pb as pb,
    metrics::clocks,
    Result,
};
use std::collections::BTreeMap;
use std::time::Instant;

const VOLUMES: usize = 20;
const SIZE: u64 = 64 << 20;
const NAMESPACE: &str = "default";
/// The agent RPCs a provision makes; the reconcilers' HealthCheck,
/// ReconcileState and listings are left out of the agent's share.
const PROVISION_RPCS: [&str; 4] = [
    "CreateVolume",
    "ExportVolume",
    "AllowInitiator",
    "InspectVolume",
];

/// One claim made ready for the clock.
struct Pending {
    name: String,
    pv: String,
}

/// A claim provisioned, published and staged.
struct Staged {
    pending: Pending,
    volume: pb::Volume,
    staging: std::path::PathBuf,
    /// NodeStageVolume's time, seconds.
    stage: f64,
}

/// Creates the claim `name`; the PV name its provisioner would use.
async fn claim(bed: &ClaimBed, class: &Class, name: &str) -> Result<Pending> {
    let pvc: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": class.storage_class,
            "resources": {"requests": {"storage": SIZE.to_string()}},
        },
    }))?;
    let pvc = Api::<PersistentVolumeClaim>::namespaced(bed.admin.clone(), NAMESPACE)
        .create(&PostParams::default(), &pvc)
        .await?;
    Ok(Pending {
        name: name.to_owned(),
        pv: format!("pvc-{}", pvc.metadata.uid.ok_or("a claim without a UID")?),
    })
}

/// The provisioner's, the attacher's and kubelet's calls for one claim.
async fn provision(
    bed: &ClaimBed,
    class: &Class,
    params: &BTreeMap<String, String>,
    pending: Pending,
) -> Result<Staged> {
    let mut controller = bed.controller_client().await?;
    let claim = ClaimRef {
        namespace: NAMESPACE,
        name: &pending.name,
        pv: &pending.pv,
    };
    let volume = controller
        .create_volume(requests::create_volume(params, claim, SIZE, class.fs_type))
        .await?
        .into_inner()
        .volume
        .ok_or("CreateVolume answered no volume")?;
    let context = controller
        .controller_publish_volume(requests::publish_volume(
            &volume,
            &bed.node_id,
            class.fs_type,
        ))
        .await?
        .into_inner()
        .publish_context;
    let staging = bed.path("bench-staging");
    let start = Instant::now();
    bed.node_client()
        .await?
        .node_stage_volume(requests::stage_volume(
            &volume,
            &context,
            &staging,
            class.fs_type,
        ))
        .await?;
    Ok(Staged {
        pending,
        volume,
        staging,
        stage: start.elapsed().as_secs_f64(),
    })
}

/// Unstage, unpublish, delete the volume and the claim (not timed).
async fn tear_down(bed: &ClaimBed, staged: &Staged) -> Result<()> {
    let handle = staged.volume.volume_id.clone();
    bed.node_client()
        .await?
        .node_unstage_volume(pb::NodeUnstageVolumeRequest {
            volume_id: handle.clone(),
            staging_target_path: staged.staging.display().to_string(),
        })
        .await?;
    let mut controller = bed.controller_client().await?;
    controller
        .controller_unpublish_volume(pb::ControllerUnpublishVolumeRequest {
            volume_id: handle.clone(),
            node_id: bed.node_id.clone(),
            ..Default::default()
        })
        .await?;
    controller
        .delete_volume(pb::DeleteVolumeRequest {
            volume_id: handle,
            ..Default::default()
        })
        .await?;
    Api::<PersistentVolumeClaim>::namespaced(bed.admin.clone(), NAMESPACE)
        .delete(&staged.pending.name, &DeleteParams::default())
        .await?;
    Ok(())
}

/// One round's figures.
struct Round {
    wall: f64,
    /// Seconds per volume: controller with API server, agent, node.
    controller: f64,
    agent: f64,
    node: f64,
}

impl Round {
    fn line(&self, what: &str) -> String {
        format!(
            "  {what:<14} {:>8.1} s ({:>6.2} s/volume); per volume: controller+API {:.2} s, agent {:.2} s, node {:.2} s\n",
            self.wall,
            self.wall / VOLUMES as f64,
            self.controller,
            self.agent,
            self.node
        )
    }
}

/// Provisions, publishes and stages 20 claims, `at_once` or one at a
/// time, then tears them down.
async fn round(bed: &ClaimBed, tag: &str, at_once: bool) -> Result<Round> {
    let class = &bed.objects.zvol_nvme;
    let params = bed
        .storage_class(class)
        .await?
        .parameters
        .unwrap_or_default();
    let mut pending = Vec::new();
    for i in 0..VOLUMES {
        pending.push(claim(bed, class, &format!("bench-{tag}-{i}")).await?);
    }
    let (controller_before, agent_before) = clocks(
        bed.controller_metrics,
        &["CreateVolume", "ControllerPublishVolume"],
        &PROVISION_RPCS,
    )
    .await?;
    let start = Instant::now();
    let staged: Vec<Staged> = if at_once {
        let calls = pending
            .into_iter()
            .map(|p| provision(bed, class, &params, p));
        futures::future::try_join_all(calls).await?
    } else {
        let mut staged = Vec::new();
        for p in pending {
            staged.push(provision(bed, class, &params, p).await?);
        }
        staged
    };
    let wall = start.elapsed().as_secs_f64();
    let (controller_after, agent_after) = clocks(
        bed.controller_metrics,
        &["CreateVolume", "ControllerPublishVolume"],
        &PROVISION_RPCS,
    )
    .await?;
    let n = VOLUMES as f64;
    let agent = (agent_after - agent_before) / n;
    let round = Round {
        wall,
        controller: (controller_after - controller_before) / n - agent,
        agent,
        node: staged.iter().map(|s| s.stage).sum::<f64>() / n,
    };
    for s in &staged {
        tear_down(bed, s).await?;
    }
    Ok(round)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> Result<()> {
    if !pillar_csi_lab::bench::selected("claim_pipeline") {
        return Ok(());
    }
    let bed = ClaimBed::start("bench").await?;
    let sequential = round(&bed, "seq", false).await?;
    let at_once = round(&bed, "par", true).await?;
    let report = format!(
        "{VOLUMES} x (CreateVolume + ControllerPublishVolume + NodeStageVolume) of {} MiB zvols over NVMe/TCP, ext4,\n\
         through pillar-csi controller (API server on the host), the agent (mTLS) and pillar-csi node:\n\
         {}{}  ratio: all at once {:.2}x faster than one at a time (goal 5x)\n",
        SIZE >> 20,
        sequential.line("one at a time"),
        at_once.line("all at once"),
        sequential.wall / at_once.wall,
    );
    print!("{report}");
    std::fs::write(bed.lab.work.join("claim-bench.txt"), &report)?;
    Ok(())
}
