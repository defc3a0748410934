//! The demo: claims' lives through the driver and the real Kubernetes
//! components in the kernel lab, each step with what each component did and
//! what the kernel shows. Run with `make demo`.
//!
//! The lab runner starts a real kube-apiserver on the host; in the lab
//! kernel run the agent (ZFS pool, LVM thin pool, nvmet, LIO) over mTLS,
//! `pillar-csi controller` with the CSI sidecars the chart deploys
//! (external-provisioner, -attacher, -resizer, -snapshotter),
//! kube-controller-manager, kube-scheduler, and kubelet with containerd and
//! `pillar-csi node` registered with it. The demo plays only the user:
//! PVCs and Pods ([`pillar_csi_lab::pod_life`]). One part is played for a
//! component that cannot be built here: node-driver-registrar's
//! registration answer to kubelet (`tests/lab/registrar.py`).
use pillar_csi_lab::{
    claim_bed::ClaimBed,
    k8s_cluster::Cluster,
    pod_life::{lives, pod_life},
    Result,
};

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> Result<()> {
    println!("Setting up: the CRDs, the agent, the controller, the node plugin, and");
    println!("the PillarAgent/PillarStore/PillarProtocol/PillarStorageClass objects.");
    let bed = ClaimBed::start("demo").await?;
    for line in bed.describe() {
        println!("  {line}");
    }
    println!("\nStarting the cluster: kube-controller-manager, kube-scheduler, the sidecars,");
    println!("containerd and kubelet; the node plugin registers with kubelet.");
    let outcome = async {
        let cluster = Cluster::start_with_kubelet(&bed).await?;
        for (class, claim, mib) in lives(&bed.objects) {
            bed.storage_class(class).await?;
            pod_life(&cluster, class, claim, mib).await?;
        }
        cluster.stop().await
    }
    .await;
    match &outcome {
        Ok(()) => println!(
            "\nEvery claim lived through the real components and was deleted; nothing is left on the storage side."
        ),
        Err(e) => eprintln!("\nthe demo failed: {e}\n{}", bed.logs()),
    }
    outcome
}
