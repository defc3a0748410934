//! A claim's life through the real Kubernetes components (issue 41): the
//! CSI sidecars the chart deploys (external-provisioner, -attacher,
//! -resizer, -snapshotter at the chart's versions, with its flags and
//! RBAC) on the controller's socket, and kube-controller-manager's PV
//! binder, expander and attach-detach controllers, against the lab's API
//! server. The test plays only the user (PVC, Pod) and kubelet, which
//! cannot run here ([`pillar_csi_lab::k8s_cluster`]). Last, an encrypted
//! zvol of another driver is imported with the key Secret its claim names,
//! which the real provisioner reads and passes on.
//!
//! Run with `tests/lab/run tests -- claim_k8s`.
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Secret};
use kube::api::{Patch, PatchParams};
use pillar_csi_lab::{
    block::pattern,
    claim_bed::ClaimBed,
    claim_requests::capability,
    claim_witness::Storage,
    csi::csi_pb as pb,
    k8s_cluster::{Cluster, NAMESPACE},
    node_bed::{
        df_size, key_encryption_key_args, key_encryption_key_file, mounted, unload_zfs_key,
    },
    run, Result,
};
use serde_json::json;
use std::fs;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn claim_k8s_life_through_the_real_sidecars_and_controller_manager() -> Result<()> {
    // The agent with a key-encryption key: step 7 imports an encrypted zvol.
    let (kek, _) = key_encryption_key_file(&pillar_csi_lab::Lab::get(), "k8s-kek")?;
    let bed = ClaimBed::start_with_agent_args("k8s", key_encryption_key_args(&kek)).await?;
    let cluster = Cluster::start(&bed).await?;
    let class = &bed.objects.zvol_nvme;
    bed.storage_class(class).await?;

    // 1. The user's claim: the real provisioner creates the volume, the PV
    //    binder binds it.
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
    assert_eq!(
        storage.size()?,
        Some(64 << 20),
        "the zvol exists at the claimed size"
    );
    println!("      PV {pv_name}, handle {handle}, {storage:?}");

    // 2. A Pod on the node: the attach-detach controller makes the
    //    VolumeAttachment, the real attacher publishes it.
    println!("\n 2. [user] Pod writer on node {}", cluster.node_name);
    cluster.pod("writer", &["data"]).await?;
    let va = cluster.attached(&pv).await?;
    let context = va
        .status
        .as_ref()
        .and_then(|s| s.attachment_metadata.clone())
        .unwrap_or_default();
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
    let volume = cluster
        .stage_and_publish(&pv, &va, class.fs_type, "data")
        .await?;
    cluster.report_in_use(&[&handle]).await?;
    let data = pattern(41, 1 << 20);
    fs::write(volume.target.join("data"), &data)?;
    assert_eq!(fs::read(volume.target.join("data"))?, data);
    println!(
        "      wrote 1 MiB through {}",
        mounted(&volume.target)?.unwrap_or_default()
    );

    // 4. The user grows the claim: the real resizer expands the volume,
    //    kubelet (played) grows the filesystem.
    println!("\n 4. [user] PVC data grows to 128 MiB");
    cluster
        .namespaced::<PersistentVolumeClaim>()
        .patch(
            "data",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"resources": {"requests": {"storage": "128Mi"}}}})),
        )
        .await?;
    let pvs = cluster.api::<PersistentVolume>();
    cluster
        .until("PV capacity 128Mi", || {
            let (pvs, pv_name) = (pvs.clone(), pv_name.clone());
            async move {
                let pv = pvs.get(&pv_name).await?;
                let cap = pv.spec.and_then(|s| s.capacity).unwrap_or_default();
                Ok(cap.get("storage").filter(|q| q.0 == "128Mi").map(|_| ()))
            }
        })
        .await?;
    assert_eq!(storage.size()?, Some(128 << 20), "the zvol grew");
    bed.node_client()
        .await?
        .node_expand_volume(pb::NodeExpandVolumeRequest {
            volume_id: handle.clone(),
            volume_path: volume.target.display().to_string(),
            staging_target_path: volume.staging.display().to_string(),
            volume_capability: Some(capability(class.fs_type)),
            capacity_range: Some(pb::CapacityRange {
                required_bytes: 128 << 20,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await?;
    assert!(df_size(&volume.target)? > 100 << 20, "the filesystem grew");
    assert_eq!(
        fs::read(volume.target.join("data"))?,
        data,
        "the data stays"
    );

    // 5. The Pod goes: kubelet (played) unpublishes, unstages and reports
    //    the volume free; the attach-detach controller deletes the
    //    attachment and the real attacher unpublishes.
    println!("\n 5. [user] Pod writer deleted");
    cluster.delete_pod("writer").await?;
    cluster.unpublish_and_unstage(&volume).await?;
    cluster.report_in_use(&[]).await?;
    cluster.detached(&pv).await?;

    // 6. The claim goes: the PV binder releases the PV, the real
    //    provisioner deletes the volume.
    println!("\n 6. [user] PVC data deleted");
    cluster.delete_claim("data", &pv).await?;
    assert_eq!(storage.size()?, None, "the zvol is destroyed");
    let events = bed
        .server
        .kubectl(&["get", "events", "-n", NAMESPACE, "-o", "wide"])?;
    println!("      events:\n{events}");
    assert!(events.contains("ProvisioningSucceeded"), "{events}");

    // 7. An encrypted zvol another driver left, imported with its key: the
    //    real provisioner reads the Secret the claim names (the class's
    //    templated provisioner secret) and passes it in CreateVolume; the
    //    agent checks it, loads it, keeps it sealed; the data reads.
    println!("\n 7. [user] PVC vault imports an encrypted zvol, its key in Secret vault-key");
    let legacy = Legacy::make(&bed)?;
    let imports = bed.encrypted_imports_class().await?;
    let hex: String = legacy.key.iter().map(|b| format!("{b:02x}")).collect();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "vault-key"},
        "stringData": {"key": hex},
    }))?;
    cluster
        .namespaced::<Secret>()
        .create(&Default::default(), &secret)
        .await?;
    cluster
        .claim_annotated(
            "vault",
            &imports.storage_class,
            "64Mi",
            None,
            json!({
                "pillar-csi.bhyoo.com/import-zvol": legacy.dataset,
                "pillar-csi.bhyoo.com/import-key-secret": "vault-key",
            }),
        )
        .await?;
    let vault_pv = cluster.bound("vault").await?;
    assert_eq!(
        legacy.key_status()?,
        "available",
        "the agent loaded the key"
    );
    let keys = bed.agent.config().state_dir.join("keys");
    assert_eq!(fs::read_dir(&keys)?.count(), 1, "one sealed key kept");
    cluster.pod("reader", &["vault"]).await?;
    let va = cluster.attached(&vault_pv).await?;
    let volume = cluster
        .stage_and_publish(&vault_pv, &va, imports.fs_type, "vault")
        .await?;
    assert_eq!(
        fs::read(volume.target.join("secret-data"))?,
        legacy.data,
        "the imported zvol's data"
    );
    println!("      the data the old driver wrote reads through the imported volume");
    cluster.delete_pod("reader").await?;
    cluster.unpublish_and_unstage(&volume).await?;
    cluster.report_in_use(&[]).await?;
    cluster.detached(&vault_pv).await?;
    cluster.delete_claim("vault", &vault_pv).await?;
    assert!(legacy.key_status().is_err(), "the zvol is destroyed");
    assert_eq!(
        fs::read_dir(&keys)?.count(),
        0,
        "and its sealed key after it"
    );
    cluster.stop().await
}

/// An encrypted zvol (raw key) with an ext4 filesystem holding a file, made
/// by hand under the bed's parent dataset, its key then unloaded: what
/// another driver leaves after a reboot.
struct Legacy {
    dataset: String,
    key: Vec<u8>,
    data: Vec<u8>,
}

impl Legacy {
    fn make(bed: &ClaimBed) -> Result<Self> {
        let key: Vec<u8> = pattern(97, 32);
        let key_file = bed.lab.work.join(bed.lab.unique("legacy-key"));
        fs::write(&key_file, &key)?;
        let dataset = format!(
            "{}/{}/{}",
            bed.parent.pool,
            bed.parent.name,
            bed.lab.unique("pvc-legacy")
        );
        run(
            "zfs",
            &[
                "create",
                "-V",
                "64M",
                "-o",
                "encryption=aes-256-gcm",
                "-o",
                "keyformat=raw",
                "-o",
                &format!("keylocation=file://{}", key_file.display()),
                &dataset,
            ],
        )?;
        run("udevadm", &["settle"])?;
        let device = format!("/dev/zvol/{dataset}");
        run("mkfs.ext4", &["-q", "-F", &device])?;
        let mnt = bed.lab.work.join(bed.lab.unique("legacy-mnt"));
        fs::create_dir_all(&mnt)?;
        let mnt_arg = mnt.display().to_string();
        run("mount", &[&device, &mnt_arg])?;
        let data = pattern(98, 256 << 10);
        let written = fs::write(mnt.join("secret-data"), &data);
        run("umount", &[&mnt_arg])?;
        written?;
        unload_zfs_key(&dataset)?;
        fs::remove_file(&key_file)?;
        let legacy = Self { dataset, key, data };
        assert_eq!(legacy.key_status()?, "unavailable");
        Ok(legacy)
    }

    fn key_status(&self) -> Result<String> {
        Ok(run(
            "zfs",
            &["get", "-H", "-o", "value", "keystatus", &self.dataset],
        )?
        .trim()
        .to_owned())
    }
}
