//! A claim's life with Pods on the real kubelet, for the claim test and
//! the demo: every step is done by the component a cluster runs for it,
//! and what each one did is printed (its events, the VolumeAttachment,
//! kubelet's mounts, the export in configfs) and asserted.
//!
//! 1. The claim: the external-provisioner creates the volume, the PV binder
//!    binds it.
//! 2. A writer Pod with no node named: kube-scheduler places it, the
//!    attach-detach controller and the external-attacher attach the
//!    volume, kubelet stages and publishes it through the node plugin and
//!    starts the container, which writes 4 MiB and their checksum.
//! 3. The claim grows while the Pod runs: the external-resizer expands the
//!    volume, kubelet grows the filesystem (NodeExpandVolume).
//! 4. The writer goes: kubelet unpublishes and unstages, the volume is
//!    detached and the export admits no one.
//! 5. A reader Pod checks the checksum after a new attach and stage.
//! 6. The claim goes: the provisioner deletes the volume.
use crate::{
    claim_bed::{Class, Objects},
    claim_witness::{Export, Storage},
    k8s_cluster::{from, Cluster},
    run, Result,
};
use api::handle::VolumeHandle;
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::{fs, path::PathBuf, time::Instant};

/// The lives the claim test and the demo run: a zvol over NVMe/TCP (ext4)
/// and a thin LV over iSCSI (xfs, whose mkfs refuses less than 300 MB).
/// Their claims' names start with [`PREFIX`].
pub fn lives(objects: &Objects) -> [(&Class, &'static str, u64); 2] {
    [
        (&objects.zvol_nvme, "pods-zvol", 64),
        (&objects.lv_iscsi, "pods-lv", 320),
    ]
}

/// The start of the names of the lives' claims and Pods, which tells
/// their events from those other tests left in the namespace.
pub const PREFIX: &str = "pods-";

/// The writer's script: 4 MiB of random data and its checksum on the
/// volume, flushed, then it waits to be stopped.
const WRITE: &str = "dd if=/dev/urandom of=/data/blob bs=1M count=4 && \
    cd /data && sha256sum blob >blob.sha256 && sync && \
    trap 'exit 0' TERM && sleep 2147483647 & wait";

/// The reader's script: the checksum holds, or the Pod fails.
const READ: &str = "cd /data && sha256sum -c blob.sha256";

/// How long each step of one life took, in seconds.
#[derive(Debug, Clone, Default)]
pub struct Timings {
    /// PVC created until Bound.
    pub bound: f64,
    /// Writer Pod created until Running (schedule, attach, stage,
    /// publish, container start).
    pub running: f64,
    /// PVC grown until kubelet's filesystem shows the new size.
    pub grown: f64,
    /// Writer Pod deleted until its VolumeAttachment is gone.
    pub detached: f64,
    /// Reader Pod created until Succeeded.
    pub read: f64,
    /// PVC deleted until its PV is gone.
    pub deleted: f64,
}

/// One claim `claim` of `mib` MiB of `class` through its whole life on
/// `cluster`'s kubelet (the steps of the module's doc; it grows to twice
/// that), printing what each component did. The claim, its Pods and its
/// volume are gone when it returns Ok.
pub async fn pod_life(
    cluster: &Cluster<'_>,
    class: &Class,
    claim: &str,
    mib: u64,
) -> Result<Timings> {
    let mut t = Timings::default();
    let mut seen = print_events(cluster, usize::MAX).await?;
    println!(
        "\n 1. [user] PVC {claim} ({mib} MiB) of StorageClass {}",
        class.storage_class
    );
    let start = Instant::now();
    cluster
        .claim(claim, &class.storage_class, &format!("{mib}Mi"), None)
        .await?;
    let pv = cluster.bound(claim).await?;
    t.bound = start.elapsed().as_secs_f64();
    let pv_name = pv.metadata.name.clone().unwrap_or_default();
    let handle = pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .map(|c| c.volume_handle.clone())
        .ok_or("PV without csi")?;
    let storage = Storage::of(&handle, &cluster.parent)?;
    assert_eq!(
        storage.size()?,
        Some(mib << 20),
        "the volume exists at the claimed size"
    );
    println!("      PV {pv_name}: {storage}");
    seen = print_events(cluster, seen).await?;

    let writer = format!("{claim}-writer");
    println!("\n 2. [user] Pod {writer}, no node named");
    let start = Instant::now();
    pod(cluster, &writer, claim, WRITE).await?;
    let running = phase(cluster, &writer, "Running").await?;
    t.running = start.elapsed().as_secs_f64();
    let node = running.spec.as_ref().and_then(|s| s.node_name.clone());
    assert_eq!(
        node.as_deref(),
        Some(cluster.node_name.as_str()),
        "kube-scheduler placed it"
    );
    let va = cluster.attached(&pv).await?;
    let context = va
        .status
        .and_then(|s| s.attachment_metadata)
        .unwrap_or_default();
    let export = Export {
        protocol: VolumeHandle::parse(&handle)?.protocol(),
        target: context
            .get("target")
            .cloned()
            .ok_or("no target in the attachment")?,
    };
    println!(
        "      VolumeAttachment {}: attached; {}",
        va.metadata.name.clone().unwrap_or_default(),
        export.describe()?
    );
    let uid = running.metadata.uid.clone().unwrap_or_default();
    let target = PathBuf::from(format!(
        "/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~csi/{pv_name}/mount"
    ));
    let sums = target.join("blob.sha256");
    cluster
        .until("the writer's checksum on the volume", || {
            let sums = sums.clone();
            async move { Ok(fs::metadata(&sums).ok().filter(|m| m.len() > 0).map(|_| ())) }
        })
        .await?;
    let mounts = mounts_of(&pv_name)?;
    println!(
        "      kubelet's mounts:\n        {}",
        mounts.join("\n        ")
    );
    let device = if export.protocol == api::tokens::Protocol::Iscsi {
        "/dev/sd"
    } else {
        "/dev/nvme"
    };
    let target_text = target.display().to_string();
    assert!(
        mounts
            .iter()
            .any(|m| m.contains(&target_text) && m.contains(device)),
        "kubelet published the {device}* device into the Pod: {mounts:?}"
    );
    let check = format!("cd '{target_text}' && sha256sum -c blob.sha256");
    println!(
        "      the node reads what the Pod wrote: {}",
        run("sh", &["-c", &check])?.trim()
    );
    seen = print_events(cluster, seen).await?;

    let grown = 2 * mib;
    println!("\n 3. [user] PVC {claim} grows to {grown} MiB while {writer} runs");
    let start = Instant::now();
    cluster
        .namespaced::<PersistentVolumeClaim>()
        .patch(
            claim,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"resources": {"requests": {"storage": format!("{grown}Mi")}}}}),
            ),
        )
        .await?;
    let target_for_df = target.clone();
    cluster
        .until("kubelet's filesystem past the claim's first size", || {
            let target = target_for_df.clone();
            async move { Ok((crate::node_bed::df_size(&target)? > mib << 20).then_some(())) }
        })
        .await?;
    t.grown = start.elapsed().as_secs_f64();
    assert_eq!(
        storage.size()?,
        Some(grown << 20),
        "the resizer grew the volume"
    );
    println!("      {storage} is {grown} MiB; the Pod's filesystem grew");
    seen = print_events(cluster, seen).await?;

    println!("\n 4. [user] Pod {writer} deleted");
    let start = Instant::now();
    delete_pod(cluster, &writer).await?;
    cluster.detached(&pv).await?;
    t.detached = start.elapsed().as_secs_f64();
    assert_eq!(
        mounts_of(&pv_name)?,
        Vec::<String>::new(),
        "kubelet left no mount"
    );
    assert_eq!(export.admitted()?.unwrap_or_default(), Vec::<String>::new());
    println!(
        "      no mount of {pv_name} on the node; {}",
        export.describe()?
    );

    let reader = format!("{claim}-reader");
    println!("\n 5. [user] Pod {reader} checks the data after a new attach");
    let start = Instant::now();
    pod(cluster, &reader, claim, READ).await?;
    phase(cluster, &reader, "Succeeded").await?;
    t.read = start.elapsed().as_secs_f64();
    println!("      {reader} Succeeded: sha256sum -c passed in the container");
    delete_pod(cluster, &reader).await?;
    cluster.detached(&pv).await?;
    assert_eq!(
        mounts_of(&pv_name)?,
        Vec::<String>::new(),
        "kubelet left no mount"
    );
    seen = print_events(cluster, seen).await?;

    println!("\n 6. [user] PVC {claim} deleted");
    let start = Instant::now();
    cluster.delete_claim(claim, &pv).await?;
    t.deleted = start.elapsed().as_secs_f64();
    assert_eq!(storage.size()?, None, "the volume is destroyed");
    println!("      {storage} is gone; {}", export.describe()?);
    print_events(cluster, seen).await?;
    Ok(t)
}

/// Prints the namespace's events after the first `seen` (by creation) and
/// returns how many there are now (`usize::MAX` prints none: the count at
/// the start of a life).
async fn print_events(cluster: &Cluster<'_>, seen: usize) -> Result<usize> {
    let mut events = cluster
        .namespaced::<Event>()
        .list(&ListParams::default())
        .await?
        .items;
    events.sort_by_key(|e| e.metadata.creation_timestamp.clone().map(|t| t.0));
    for e in events.iter().skip(seen) {
        println!(
            "      event [{}] {} {}: {}",
            e.source
                .as_ref()
                .and_then(|s| s.component.clone())
                .unwrap_or_default(),
            e.involved_object.name.clone().unwrap_or_default(),
            e.reason.clone().unwrap_or_default(),
            e.message.clone().unwrap_or_default()
        );
    }
    Ok(events.len())
}

/// The reasons of the events about the lives' claims and Pods.
pub async fn event_reasons(cluster: &Cluster<'_>) -> Result<Vec<String>> {
    let events = cluster
        .namespaced::<Event>()
        .list(&ListParams::default())
        .await?;
    Ok(events
        .items
        .into_iter()
        .filter(|e| {
            let name = e.involved_object.name.as_deref().unwrap_or_default();
            name.starts_with(PREFIX)
        })
        .filter_map(|e| e.reason)
        .collect())
}

/// A Pod `name` running `script` in the lab's busybox image, the claim
/// `claim` at `/data`, with no node named (kube-scheduler places it) and
/// no restarts.
pub async fn pod(cluster: &Cluster<'_>, name: &str, claim: &str, script: &str) -> Result<()> {
    let pod: Pod = from(json!({
        "metadata": {"name": name},
        "spec": {"automountServiceAccountToken": false, "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 10,
            "containers": [{"name": "c", "image": "localhost/busybox:lab",
                "imagePullPolicy": "Never", "command": ["/bin/sh", "-c", script],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]},
    }))?;
    cluster
        .namespaced::<Pod>()
        .create(&PostParams::default(), &pod)
        .await?;
    Ok(())
}

/// Waits until Pod `name` is in phase `want`; a Pod that failed instead
/// is an error with its status.
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
