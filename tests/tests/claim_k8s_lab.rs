//! A claim's life through the real Kubernetes components (issue 41): the
//! CSI sidecars the chart deploys (external-provisioner, -attacher,
//! -resizer at the chart's versions, with its flags and RBAC) on the
//! controller's socket, and kube-controller-manager's PV binder, expander
//! and attach-detach controllers, against the lab's API server. The test
//! plays only the user (PVC, Pod) and kubelet, which cannot run here: it
//! stages and publishes from the VolumeAttachment the real attacher filled,
//! and reports the volume in use in the Node's status as kubelet does.
//!
//! Run with `tests/lab/run tests -- claim_k8s`.
use k8s_openapi::api::core::v1::{
    Node, PersistentVolume, PersistentVolumeClaim, Pod, ServiceAccount,
};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use pillar_csi_lab::{
    block::pattern,
    claim_bed::ClaimBed,
    claim_requests::capability,
    claim_witness::Storage,
    csi::csi_pb as pb,
    k8s::{tail, ControllerManager, Sidecars, SIDECARS},
    node_bed::{df_size, mounted},
    Result,
};
use serde_json::json;
use std::{
    collections::HashMap,
    fs,
    time::{Duration, Instant},
};

const DRIVER: &str = "pillar-csi.bhyoo.com";
const NAMESPACE: &str = "default";
/// How long one step of the real components may take under the lab's CPU.
const STEP: Duration = Duration::from_secs(240);

/// Waits (bounded by [`STEP`]) until `f` gives a value; the error names
/// `what` and carries the components' logs.
async fn until<T, F, Fut>(what: &str, logs: impl Fn() -> String, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await? {
            println!("      {what}: after {:.1} s", start.elapsed().as_secs_f64());
            return Ok(v);
        }
        if start.elapsed() > STEP {
            return Err(format!("{what}: not within {STEP:?}\n{}", logs()).into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn from<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> Result<T> {
    Ok(serde_json::from_value(v)?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn claim_k8s_life_through_the_real_sidecars_and_controller_manager() -> Result<()> {
    let bed = ClaimBed::start("k8s").await?;
    let kcm = ControllerManager::start(&bed.server, &bed.lab.work).await?;
    let sidecars = Sidecars::start(&bed).await?;
    let logs = || {
        format!(
            "{}\n==== kube-controller-manager ====\n{}\n==== controller ====\n{}",
            sidecars_log(&bed),
            tail(&kcm.0.log(), 30),
            tail(&bed.logs(), 30)
        )
    };
    let admin = bed.admin.clone();
    let class = &bed.objects.zvol_nvme;
    bed.storage_class(class).await?;

    // The node as kubelet and node-driver-registrar would register it.
    let node_name = bed.node_id.split('/').next().unwrap_or_default().to_owned();
    let nodes: Api<Node> = Api::all(admin.clone());
    let node: Node = from(json!({
        "metadata": {"name": node_name,
            "annotations": {"volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
    }))?;
    nodes.create(&PostParams::default(), &node).await?;
    let csinode: CSINode = from(json!({
        "metadata": {"name": node_name},
        "spec": {"drivers": [{"name": DRIVER, "nodeID": bed.node_id, "topologyKeys": []}]},
    }))?;
    Api::<CSINode>::all(admin.clone())
        .create(&PostParams::default(), &csinode)
        .await?;

    // 1. The user's claim: the real provisioner creates the volume, the PV
    //    binder binds it.
    println!(
        "\n 1. [user] PVC data (64 MiB) of StorageClass {}",
        class.storage_class
    );
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), NAMESPACE);
    let pvc: PersistentVolumeClaim = from(json!({
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class.storage_class,
            "resources": {"requests": {"storage": "64Mi"}}},
    }))?;
    pvcs.create(&PostParams::default(), &pvc).await?;
    let pv_name = until("PVC Bound", &logs, || {
        let pvcs = pvcs.clone();
        async move {
            let c = pvcs.get("data").await?;
            Ok(c.status
                .and_then(|s| s.phase)
                .filter(|p| p == "Bound")
                .and(c.spec.and_then(|s| s.volume_name)))
        }
    })
    .await?;
    let pvs: Api<PersistentVolume> = Api::all(admin.clone());
    let pv = pvs.get(&pv_name).await?;
    let csi = pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.clone())
        .ok_or("PV without csi")?;
    assert_eq!(csi.driver, DRIVER);
    let handle = csi.volume_handle.clone();
    let storage = Storage::of(&handle, &format!("{}/{}", bed.parent.pool, bed.parent.name))?;
    assert_eq!(
        storage.size()?,
        Some(64 << 20),
        "the zvol exists at the claimed size"
    );
    println!("      PV {pv_name}, handle {handle}, {storage:?}");

    // 2. A Pod on the node: the attach-detach controller makes the
    //    VolumeAttachment, the real attacher publishes it.
    println!("\n 2. [user] Pod writer on node {node_name}");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NAMESPACE);
    let pod: Pod = from(json!({
        "metadata": {"name": "writer"},
        "spec": {"nodeName": node_name, "automountServiceAccountToken": false,
            "containers": [{"name": "w", "image": "busybox",
                "volumeMounts": [{"name": "d", "mountPath": "/data"}]}],
            "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]},
    }))?;
    // The API server admits a Pod once its namespace's default
    // ServiceAccount exists (kube-controller-manager makes it).
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), NAMESPACE);
    until("ServiceAccount default", &logs, || {
        let accounts = accounts.clone();
        async move { Ok(accounts.get_opt("default").await?.map(|_| ())) }
    })
    .await?;
    pods.create(&PostParams::default(), &pod).await?;
    let vas: Api<VolumeAttachment> = Api::all(admin.clone());
    let va = until("VolumeAttachment attached", &logs, || {
        let (vas, pv_name) = (vas.clone(), pv_name.clone());
        async move {
            let list = vas.list(&ListParams::default()).await?;
            Ok(list.items.into_iter().find(|va| {
                va.spec.source.persistent_volume_name.as_deref() == Some(pv_name.as_str())
                    && va.status.as_ref().is_some_and(|s| s.attached)
            }))
        }
    })
    .await?;
    assert_eq!(va.spec.attacher, DRIVER);
    assert_eq!(va.spec.node_name, node_name);
    let context: HashMap<String, String> = va
        .status
        .as_ref()
        .and_then(|s| s.attachment_metadata.clone())
        .unwrap_or_default()
        .into_iter()
        .collect();
    assert!(
        context.contains_key("target") && context.contains_key("deviceIdentity"),
        "the publish context reaches the VolumeAttachment: {context:?}"
    );
    println!(
        "      VolumeAttachment {}: attached, target {}",
        va.metadata.name.clone().unwrap_or_default(),
        context["target"]
    );

    // 3. kubelet (played): stage and publish from the attachment, report
    //    the volume in use, write.
    println!("\n 3. [kubelet, played] NodeStage + NodePublish from the VolumeAttachment");
    let mut node_client = bed.node_client().await?;
    let staging = bed.path("staging");
    let target = bed.path("target");
    let volume_context: HashMap<String, String> = csi
        .volume_attributes
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    node_client
        .node_stage_volume(pb::NodeStageVolumeRequest {
            volume_id: handle.clone(),
            publish_context: context.clone(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(capability(class.fs_type)),
            volume_context: volume_context.clone(),
            ..Default::default()
        })
        .await?;
    node_client
        .node_publish_volume(pb::NodePublishVolumeRequest {
            volume_id: handle.clone(),
            publish_context: context.clone(),
            staging_target_path: staging.display().to_string(),
            target_path: target.display().to_string(),
            volume_capability: Some(capability(class.fs_type)),
            volume_context,
            ..Default::default()
        })
        .await?;
    let in_use = format!("kubernetes.io/csi/{DRIVER}^{handle}");
    let status = PatchParams::default();
    nodes
        .patch_status(
            &node_name,
            &status,
            &Patch::Merge(json!({"status": {"volumesInUse": [in_use]}})),
        )
        .await?;
    let data = pattern(1 << 20, 41);
    fs::write(target.join("data"), &data)?;
    assert_eq!(fs::read(target.join("data"))?, data);
    println!(
        "      wrote 1 MiB through {}",
        mounted(&target)?.unwrap_or_default()
    );

    // 4. The user grows the claim: the real resizer expands the volume,
    //    kubelet (played) grows the filesystem.
    println!("\n 4. [user] PVC data grows to 128 MiB");
    pvcs.patch(
        "data",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"resources": {"requests": {"storage": "128Mi"}}}})),
    )
    .await?;
    until("PV capacity 128Mi", &logs, || {
        let (pvs, pv_name) = (pvs.clone(), pv_name.clone());
        async move {
            let pv = pvs.get(&pv_name).await?;
            let cap = pv.spec.and_then(|s| s.capacity).unwrap_or_default();
            Ok(cap.get("storage").filter(|q| q.0 == "128Mi").map(|_| ()))
        }
    })
    .await?;
    assert_eq!(storage.size()?, Some(128 << 20), "the zvol grew");
    node_client
        .node_expand_volume(pb::NodeExpandVolumeRequest {
            volume_id: handle.clone(),
            volume_path: target.display().to_string(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(capability(class.fs_type)),
            capacity_range: Some(pb::CapacityRange {
                required_bytes: 128 << 20,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await?;
    assert!(df_size(&target)? > 100 << 20, "the filesystem grew");
    assert_eq!(fs::read(target.join("data"))?, data, "the data stays");

    // 5. The Pod goes: kubelet (played) unpublishes, unstages and reports
    //    the volume free; the attach-detach controller deletes the
    //    attachment and the real attacher unpublishes.
    println!("\n 5. [user] Pod writer deleted");
    pods.delete("writer", &DeleteParams::default().grace_period(0))
        .await?;
    node_client
        .node_unpublish_volume(pb::NodeUnpublishVolumeRequest {
            volume_id: handle.clone(),
            target_path: target.display().to_string(),
        })
        .await?;
    node_client
        .node_unstage_volume(pb::NodeUnstageVolumeRequest {
            volume_id: handle.clone(),
            staging_target_path: staging.display().to_string(),
        })
        .await?;
    nodes
        .patch_status(
            &node_name,
            &status,
            &Patch::Merge(json!({"status": {"volumesInUse": null}})),
        )
        .await?;
    until("VolumeAttachment gone", &logs, || {
        let (vas, pv_name) = (vas.clone(), pv_name.clone());
        async move {
            let list = vas.list(&ListParams::default()).await?;
            Ok(list
                .items
                .iter()
                .all(|va| {
                    va.spec.source.persistent_volume_name.as_deref() != Some(pv_name.as_str())
                })
                .then_some(()))
        }
    })
    .await?;

    // 6. The claim goes: the PV binder releases the PV, the real
    //    provisioner deletes the volume.
    println!("\n 6. [user] PVC data deleted");
    pvcs.delete("data", &DeleteParams::default()).await?;
    until("PV deleted", &logs, || {
        let (pvs, pv_name) = (pvs.clone(), pv_name.clone());
        async move { Ok(pvs.get_opt(&pv_name).await?.is_none().then_some(())) }
    })
    .await?;
    assert_eq!(storage.size()?, None, "the zvol is destroyed");
    let events = bed
        .server
        .kubectl(&["get", "events", "-n", NAMESPACE, "-o", "wide"])?;
    println!("      events:\n{events}");
    assert!(events.contains("ProvisioningSucceeded"), "{events}");

    nodes.delete(&node_name, &DeleteParams::default()).await?;
    Api::<CSINode>::all(admin)
        .delete(&node_name, &DeleteParams::default())
        .await?;
    drop(sidecars);
    drop(kcm);
    Ok(())
}

fn sidecars_log(bed: &ClaimBed) -> String {
    SIDECARS
        .iter()
        .map(|n| {
            let log =
                fs::read_to_string(bed.lab.work.join(format!("k8s.{n}.log"))).unwrap_or_default();
            format!("==== {n} ====\n{}", tail(&log, 30))
        })
        .collect::<Vec<_>>()
        .join("\n")
}
