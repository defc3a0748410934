//! Claims with Pods through a real kubelet (issue 41): kube-scheduler
//! places each Pod, kube-controller-manager's attach-detach controller and
//! the real external-attacher attach the volume, kubelet 1.20 (with
//! containerd, the guest's kernel and the images of `tests/lab/mkimage.py`)
//! stages, publishes and grows it through the node plugin it registered,
//! and the Pod's container writes; a second Pod reads the data back after a
//! new attach; when the claim goes, nothing is left on either side
//! ([`pillar_csi_lab::pod_life`]). Once for a zvol over NVMe/TCP (ext4),
//! once for a thin LV over iSCSI (xfs).
//!
//! Still played: node-driver-registrar's registration answer
//! (`tests/lab/registrar.py`; the Go module proxy serves no version of it).
//!
//! Run with `tests/lab/run tests -- claim_kubelet`.
use pillar_csi_lab::{
    claim_bed::ClaimBed,
    k8s_cluster::Cluster,
    node_bed::measured,
    pod_life::{event_reasons, lives, pod_life},
    Result,
};
use std::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn claim_kubelet_pods_write_grow_and_read_through_the_real_kubelet_and_scheduler(
) -> Result<()> {
    let bed = ClaimBed::start("kubelet").await?;
    let started = Instant::now();
    let cluster = Cluster::start_with_kubelet(&bed).await?;
    let ready = started.elapsed().as_secs_f64();
    println!("\n kubelet Ready and the node plugin registered: {ready:.1} s");
    for (class, claim, mib) in lives(&bed.objects) {
        bed.storage_class(class).await?;
        let t = pod_life(&cluster, class, claim, mib).await?;
        measured(
            &bed.lab,
            &format!(
                "claim_kubelet {claim} ({}): Bound {:.1} s, writer Running {:.1} s, grown {:.1} s, \
                 detached {:.1} s, reader Succeeded {:.1} s, deleted {:.1} s (kubelet Ready {ready:.1} s)",
                class.storage_class, t.bound, t.running, t.grown, t.detached, t.read, t.deleted
            ),
        )?;
    }
    let reasons = event_reasons(&cluster).await?;
    for reason in [
        "ProvisioningSucceeded",
        "Scheduled",
        "SuccessfulAttachVolume",
        "Started",
        "FileSystemResizeSuccessful",
    ] {
        assert!(
            reasons.iter().any(|r| r == reason),
            "no {reason} event: {reasons:?}"
        );
    }
    let kubelet = cluster.kubelet().ok_or("no kubelet")?;
    for call in [
        "MountDevice succeeded",
        "SetUp succeeded",
        "UnmountDevice succeeded",
    ] {
        assert!(
            !kubelet.log_lines(call).is_empty(),
            "kubelet's log has no {call:?}:\n{}",
            kubelet.logs()
        );
    }
    cluster.stop().await
}
