//! A Pod's claim through a real kubelet (issue 41): kube-scheduler places
//! the Pod, kube-controller-manager's attach-detach controller and the real
//! external-attacher attach the volume, kubelet 1.20 (with containerd, the
//! guest's kernel and the images of `tests/lab/mkimage.py`) stages and
//! publishes it through the node plugin it registered, and the Pod's
//! container writes. A second Pod reads the data back after the first one's
//! volume was unpublished, unstaged and detached; when the claim goes,
//! nothing is left on either side.
//!
//! Still played here: node-driver-registrar's registration answer
//! (`tests/lab/registrar.py`; the Go module proxy serves no version of it).
//!
//! Run with `tests/lab/run tests -- claim_kubelet`.
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{DeleteParams, ListParams, PostParams};
use pillar_csi_lab::{
    claim_bed::ClaimBed,
    claim_witness::Storage,
    k8s_cluster::{from, Cluster},
    run, Result,
};
use serde_json::json;
use std::{fs, time::Instant};

/// The writer's script: 4 MiB of random data and its checksum on the
/// volume, flushed, then it waits to be stopped.
const WRITE: &str = "dd if=/dev/urandom of=/data/blob bs=1M count=4 && \
    cd /data && sha256sum blob >blob.sha256 && sync && \
    trap 'exit 0' TERM && sleep 2147483647 & wait";

/// The reader's script: the checksum holds, or the Pod fails.
const READ: &str = "cd /data && sha256sum -c blob.sha256";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn claim_kubelet_pod_writes_and_reads_through_the_real_kubelet_and_scheduler() -> Result<()> {
    let bed = ClaimBed::start("kubelet").await?;
    let started = Instant::now();
    let cluster = Cluster::start_with_kubelet(&bed).await?;
    println!(
        "\n 0. kubelet Ready and the node plugin registered: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let class = &bed.objects.zvol_nvme;
    bed.storage_class(class).await?;

    println!(
        "\n 1. [user] PVC data (64 MiB) of StorageClass {}",
        class.storage_class
    );
    cluster
        .claim("data", &class.storage_class, "64Mi", None)
        .await?;
    let pv = cluster.bound("data").await?;
    let pv_name = pv.metadata.name.clone().unwrap_or_default();
    let handle = pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .map(|c| c.volume_handle.clone())
        .ok_or("PV without csi")?;
    let storage = Storage::of(&handle, &format!("{}/{}", bed.parent.pool, bed.parent.name))?;

    println!("\n 2. [user] Pod writer (no node named): scheduled, attached, staged, published");
    pod(&cluster, "writer", WRITE).await?;
    let writer = phase(&cluster, "writer", "Running").await?;
    let node = writer.spec.as_ref().and_then(|s| s.node_name.clone());
    assert_eq!(
        node.as_deref(),
        Some(cluster.node_name.as_str()),
        "kube-scheduler placed it"
    );
    cluster.attached(&pv).await?;
    let uid = writer.metadata.uid.clone().unwrap_or_default();
    let target = format!("/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~csi/{pv_name}/mount");
    let sums = std::path::Path::new(&target).join("blob.sha256");
    cluster
        .until("the writer's checksum on the volume", || {
            let sums = sums.clone();
            async move { Ok(fs::metadata(&sums).ok().filter(|m| m.len() > 0).map(|_| ())) }
        })
        .await?;
    let mount = mounts_of(&pv_name)?;
    println!("      kubelet's mounts of {pv_name}:\n{}", mount.join("\n"));
    assert!(
        mount
            .iter()
            .any(|m| m.contains(&target) && m.contains("/dev/nvme")),
        "kubelet published the NVMe/TCP volume into the Pod: {mount:?}"
    );
    let verified = run(
        "sh",
        &["-c", &format!("cd '{target}' && sha256sum -c blob.sha256")],
    )?;
    println!(
        "      the node reads what the Pod wrote: {}",
        verified.trim()
    );

    println!(
        "\n 3. [user] Pod writer deleted: kubelet unpublishes and unstages, the attacher detaches"
    );
    delete_pod(&cluster, "writer").await?;
    cluster.detached(&pv).await?;
    assert_eq!(
        mounts_of(&pv_name)?,
        Vec::<String>::new(),
        "kubelet left no mount"
    );

    println!("\n 4. [user] Pod reader checks the data after a new attach");
    pod(&cluster, "reader", READ).await?;
    phase(&cluster, "reader", "Succeeded").await?;
    delete_pod(&cluster, "reader").await?;
    cluster.detached(&pv).await?;
    assert_eq!(
        mounts_of(&pv_name)?,
        Vec::<String>::new(),
        "kubelet left no mount"
    );

    println!("\n 5. [user] PVC data deleted");
    cluster.delete_claim("data", &pv).await?;
    assert_eq!(storage.size()?, None, "the zvol is destroyed");
    let events = cluster
        .namespaced::<Event>()
        .list(&ListParams::default())
        .await?;
    for e in &events.items {
        println!(
            "      event {} {}: {}",
            e.source
                .as_ref()
                .and_then(|s| s.component.clone())
                .unwrap_or_default(),
            e.reason.clone().unwrap_or_default(),
            e.message.clone().unwrap_or_default()
        );
    }
    let reasons: Vec<&str> = events
        .items
        .iter()
        .filter_map(|e| e.reason.as_deref())
        .collect();
    for reason in [
        "Scheduled",
        "SuccessfulAttachVolume",
        "Started",
        "ProvisioningSucceeded",
    ] {
        assert!(reasons.contains(&reason), "no {reason} event: {reasons:?}");
    }
    let kubelet = cluster.kubelet().ok_or("no kubelet")?;
    let calls = [
        "MountDevice succeeded",
        "SetUp succeeded",
        "UnmountDevice succeeded",
    ];
    for call in calls {
        assert!(
            !kubelet.log_lines(call).is_empty(),
            "kubelet's log has no {call:?}:\n{}",
            kubelet.logs()
        );
    }
    println!(
        "\n the whole life through the real kubelet: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    cluster.stop().await
}

/// A Pod `name` running `script` in the lab's busybox image, its volume
/// `data` the claim `data` at `/data`, with no node named (kube-scheduler
/// places it) and no restarts.
async fn pod(cluster: &Cluster<'_>, name: &str, script: &str) -> Result<()> {
    let pod: Pod = from(json!({
        "metadata": {"name": name},
        "spec": {"automountServiceAccountToken": false, "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 10,
            "containers": [{"name": "c", "image": "localhost/busybox:lab",
                "imagePullPolicy": "Never", "command": ["/bin/sh", "-c", script],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]},
    }))?;
    cluster
        .namespaced::<Pod>()
        .create(&PostParams::default(), &pod)
        .await?;
    Ok(())
}

/// Waits until Pod `name` is in `want`; a Pod that failed instead is an
/// error with its status.
async fn phase(cluster: &Cluster<'_>, name: &str, want: &str) -> Result<Pod> {
    let pods = cluster.namespaced::<Pod>();
    cluster
        .until(&format!("Pod {name} {want}"), || {
            let pods = pods.clone();
            async move {
                let pod = pods.get(name).await?;
                let now = pod
                    .status
                    .as_ref()
                    .and_then(|s| s.phase.clone())
                    .unwrap_or_default();
                if now == "Failed" && want != "Failed" {
                    return Err(format!("Pod {name} failed: {:?}", pod.status).into());
                }
                Ok((now == want).then_some(pod))
            }
        })
        .await
}

/// Deletes Pod `name` with its grace period and waits until it is gone
/// (kubelet stopped its container and tore its volume down).
async fn delete_pod(cluster: &Cluster<'_>, name: &str) -> Result<()> {
    let pods = cluster.namespaced::<Pod>();
    pods.delete(name, &DeleteParams::default()).await?;
    cluster
        .until(&format!("Pod {name} gone"), || {
            let pods = pods.clone();
            async move { Ok(pods.get_opt(name).await?.is_none().then_some(())) }
        })
        .await
}

/// The lines of `/proc/self/mounts` that name `pv` (kubelet's global and
/// per-Pod mount points carry the PV's name).
fn mounts_of(pv: &str) -> Result<Vec<String>> {
    Ok(fs::read_to_string("/proc/self/mounts")?
        .lines()
        .filter(|l| l.contains(pv))
        .map(str::to_owned)
        .collect())
}
