//! A claim's life as a cluster runs it, on the [`ClaimBed`]: this side
//! plays the user (the PVC), the external-provisioner (CreateVolume,
//! DeleteVolume), the external-attacher (ControllerPublishVolume,
//! ControllerUnpublishVolume), the external-resizer (ControllerExpandVolume)
//! and kubelet (NodeStage, NodePublish, NodeExpand, NodeUnpublish,
//! NodeUnstage), with the requests those components send. After each step
//! it prints what the kernel and the API server show
//! ([`crate::claim_witness`]) and asserts it: the `claim_` lab tests and
//! the demo run this same code ([`crate::claim_cases`]).
use crate::{
    block::pattern,
    claim_bed::{ClaimBed, Class},
    claim_cases::Legacy,
    claim_requests::{self as requests, capability, range, ClaimRef},
    claim_witness::{self as witness, Export, Storage},
    csi::csi_pb as pb,
    node_bed::{connected_to, df_size, mounted},
    Result,
};
use api::crd::VolumePhase;
use api::tokens::Protocol;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, DeleteParams, PostParams};
use std::{fs, io::Write, path::Path};

/// The namespace of the claims.
pub const NAMESPACE: &str = "default";
/// One claim: its class, size, and what happens to it.
#[derive(Debug, Clone)]
pub struct Claim {
    /// The PVC's name.
    pub name: String,
    /// Its class.
    pub class: Class,
    /// The requested size.
    pub bytes: u64,
    /// The size it is expanded to, if it is.
    pub grown: Option<u64>,
    /// The zvol it imports (the `pillar-csi.bhyoo.com/import-zvol`
    /// annotation), if any.
    pub import: Option<Legacy>,
}

/// Numbered steps and indented observations on standard output.
struct Story {
    step: u32,
}

impl Story {
    fn step(&mut self, who: &str, what: &str) {
        self.step += 1;
        println!("\n{:>2}. [{who}] {what}", self.step);
    }

    fn show(&self, what: &str) {
        println!("      {what}");
    }
}

/// Runs the claim's whole life on the bed, asserting each step.
pub async fn life(bed: &ClaimBed, claim: &Claim) -> Result<()> {
    let mut story = Story { step: 0 };
    let admin = &bed.admin;
    let mut controller = bed.controller_client().await?;
    let mut node = bed.node_client().await?;
    let fs_type = claim.class.fs_type;

    // The StorageClass the controller generated from the PillarStorageClass.
    let sc = bed.storage_class(&claim.class).await?;
    let params = sc.parameters.clone().unwrap_or_default();
    story.step(
        "controller",
        &format!(
            "PillarStorageClass {} generated StorageClass {}",
            claim.class.name, claim.class.storage_class
        ),
    );
    story.show(&format!(
        "API: provisioner {}, parameters {params:?}, allowVolumeExpansion {}",
        sc.provisioner,
        sc.allow_volume_expansion
            .map_or_else(|| "unset".to_owned(), |b| b.to_string())
    ));
    assert_eq!(sc.provisioner, "pillar-csi.bhyoo.com");
    assert_eq!(
        params.get("csi.storage.k8s.io/fstype").map(String::as_str),
        Some(fs_type)
    );

    // The user's claim.
    let mut annotations = serde_json::Map::new();
    if let Some(legacy) = &claim.import {
        annotations.insert(
            "pillar-csi.bhyoo.com/import-zvol".into(),
            legacy.dataset.clone().into(),
        );
    }
    let pvc: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim.name, "namespace": NAMESPACE, "annotations": annotations},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": claim.class.storage_class,
            "resources": {"requests": {"storage": claim.bytes.to_string()}},
        },
    }))?;
    let claims = Api::<PersistentVolumeClaim>::namespaced(admin.clone(), NAMESPACE);
    let pvc = claims.create(&PostParams::default(), &pvc).await?;
    let pv = format!("pvc-{}", pvc.metadata.uid.clone().ok_or("no UID")?);
    story.step(
        "user",
        &format!(
            "PVC {NAMESPACE}/{} asks {} MiB of StorageClass {}",
            claim.name,
            claim.bytes >> 20,
            claim.class.storage_class
        ),
    );
    if let Some(legacy) = &claim.import {
        story.show(&format!(
            "annotation pillar-csi.bhyoo.com/import-zvol: {} (an ext4 zvol holding {} bytes in {})",
            legacy.dataset,
            legacy.data.len(),
            legacy.file
        ));
    }
    story.show(&format!("API: its volume will be PV {pv}"));

    // external-provisioner: CreateVolume with the class's parameters (less
    // the reserved ones) and the claim's metadata.
    let claim_ref = ClaimRef {
        namespace: NAMESPACE,
        name: &claim.name,
        pv: &pv,
    };
    let volume = controller
        .create_volume(requests::create_volume(
            &params,
            claim_ref,
            claim.bytes,
            fs_type,
        ))
        .await?
        .into_inner()
        .volume
        .ok_or("CreateVolume answered no volume")?;
    let handle = volume.volume_id.clone();
    let storage = Storage::of(&handle, &bed.parent.dataset())?;
    let capacity = volume.capacity_bytes as u64;
    story.step(
        "external-provisioner",
        &format!("CreateVolume {pv}: volume {handle}, {} MiB", capacity >> 20),
    );
    let size = storage.size()?;
    story.show(&format!("kernel: {storage}, {}", bytes(size)));
    let record = witness::record(admin, &pv).await?;
    story.show(&format!(
        "API: {}",
        witness::describe_record(&pv, record.as_ref())
    ));
    assert!(capacity >= claim.bytes, "{capacity} < {}", claim.bytes);
    assert_eq!(size, Some(capacity), "{storage} has the volume's size");
    let record = record.ok_or("no PillarVolumeState after CreateVolume")?;
    assert_eq!(
        witness::phase_and_nodes(&record),
        (Some(VolumePhase::Ready), vec![])
    );
    if let Some(legacy) = &claim.import {
        assert_eq!(
            storage,
            Storage::Zvol(legacy.dataset.clone()),
            "the import adopts the annotated zvol"
        );
    }

    // external-attacher: ControllerPublishVolume to the node.
    let context = controller
        .controller_publish_volume(requests::publish_volume(&volume, &bed.node_id, fs_type))
        .await?
        .into_inner()
        .publish_context;
    let protocol = match context.get("protocol").map(String::as_str) {
        Some("iscsi") => Protocol::Iscsi,
        _ => Protocol::NvmeofTcp,
    };
    let export = Export {
        protocol,
        target: context.get("target").cloned().ok_or("no target")?,
    };
    let initiator = {
        let parts: Vec<&str> = bed.node_id.split('/').collect();
        match protocol {
            Protocol::NvmeofTcp => parts[1].to_owned(),
            Protocol::Iscsi => parts[2].to_owned(),
            Protocol::Nfs | Protocol::Local => {
                return Err("a claim's life walks block volumes".into())
            }
        }
    };
    story.step(
        "external-attacher",
        &format!(
            "ControllerPublishVolume to node {}",
            bed.node_id.split('/').next().unwrap_or_default()
        ),
    );
    story.show(&format!("publish context: {context:?}"));
    story.show(&format!("kernel: {}", export.describe()?));
    let record = witness::record(admin, &pv).await?;
    story.show(&format!(
        "API: {}",
        witness::describe_record(&pv, record.as_ref())
    ));
    assert_eq!(export.admitted()?, Some(vec![initiator.clone()]));
    assert_eq!(
        witness::phase_and_nodes(&record.ok_or("record gone")?),
        (Some(VolumePhase::Ready), vec![bed.node_id.clone()])
    );

    // kubelet: NodeStageVolume, NodePublishVolume.
    let staging = bed.path("staging");
    let target = bed.path("target");
    node.node_stage_volume(requests::stage_volume(&volume, &context, &staging, fs_type))
        .await?;
    let line = mounted(&staging)?.ok_or("nothing mounted at the staging path")?;
    story.step(
        "kubelet",
        "NodeStageVolume: connect, format if blank, mount",
    );
    story.show(&format!(
        "kernel: {} connection to {}; mountinfo: {line}",
        match protocol {
            Protocol::NvmeofTcp => "NVMe/TCP",
            Protocol::Iscsi => "iSCSI",
            Protocol::Nfs => "NFS",
            Protocol::Local => "a bind mount of",
        },
        export.target
    ));
    assert!(line.contains(&format!(" - {fs_type} ")), "{line}");
    assert!(connected_to(
        protocol == Protocol::NvmeofTcp,
        &export.target
    ));
    node.node_publish_volume(pb::NodePublishVolumeRequest {
        volume_id: handle.clone(),
        publish_context: context.clone(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(capability(fs_type)),
        volume_context: volume.volume_context.clone(),
        ..Default::default()
    })
    .await?;
    let line = mounted(&target)?.ok_or("nothing mounted at the target path")?;
    story.step("kubelet", "NodePublishVolume: bind-mount into the pod");
    story.show(&format!("kernel: mountinfo: {line}"));

    // The pod's data.
    story.step("pod", "writes and reads back through the mount");
    if let Some(legacy) = &claim.import {
        let seen = fs::read(target.join(&legacy.file))?;
        story.show(&format!(
            "{} written before the import: {} bytes, {}",
            legacy.file,
            seen.len(),
            if seen == legacy.data {
                "identical"
            } else {
                "DIFFERENT"
            }
        ));
        assert!(seen == legacy.data, "the imported zvol's file differs");
    }
    let data = pattern(7, 1 << 20);
    let file = target.join("written-by-the-pod");
    let mut f = fs::File::create(&file)?;
    f.write_all(&data)?;
    f.sync_all()?;
    drop(f);
    let back = fs::read(&file)?;
    let before = df_size(&target)?;
    story.show(&format!(
        "wrote {} bytes and read them back: {}; df: {} MiB",
        data.len(),
        if back == data {
            "identical"
        } else {
            "DIFFERENT"
        },
        before >> 20
    ));
    assert!(back == data, "the data read back differs");

    if let Some(grown) = claim.grown {
        let attached = Attached {
            pv: &pv,
            handle: &handle,
            storage: &storage,
            staging: &staging,
            target: &target,
            fs_type,
            bytes: capacity,
        };
        grow(bed, &mut story, &attached, grown).await?;
        assert!(fs::read(&file)? == data, "the data differs after growing");
    }

    // kubelet: NodeUnpublishVolume, NodeUnstageVolume.
    node.node_unpublish_volume(pb::NodeUnpublishVolumeRequest {
        volume_id: handle.clone(),
        target_path: target.display().to_string(),
    })
    .await?;
    story.step("kubelet", "NodeUnpublishVolume");
    let line = mounted(&target)?;
    story.show(&format!("kernel: target path mounted: {}", line.is_some()));
    assert_eq!(line, None);
    node.node_unstage_volume(pb::NodeUnstageVolumeRequest {
        volume_id: handle.clone(),
        staging_target_path: staging.display().to_string(),
    })
    .await?;
    story.step("kubelet", "NodeUnstageVolume: unmount, disconnect");
    let line = mounted(&staging)?;
    let still = connected_to(protocol == Protocol::NvmeofTcp, &export.target);
    story.show(&format!(
        "kernel: staging path mounted: {}, connected to {}: {still}",
        line.is_some(),
        export.target
    ));
    assert_eq!(line, None);
    assert!(!still, "still connected after NodeUnstageVolume");

    // external-attacher: ControllerUnpublishVolume.
    controller
        .controller_unpublish_volume(pb::ControllerUnpublishVolumeRequest {
            volume_id: handle.clone(),
            node_id: bed.node_id.clone(),
            ..Default::default()
        })
        .await?;
    story.step("external-attacher", "ControllerUnpublishVolume");
    story.show(&format!("kernel: {}", export.describe()?));
    let record = witness::record(admin, &pv).await?;
    story.show(&format!(
        "API: {}",
        witness::describe_record(&pv, record.as_ref())
    ));
    assert_eq!(export.admitted()?, Some(vec![]), "the node's ACL is gone");
    assert_eq!(
        witness::phase_and_nodes(&record.ok_or("record gone")?),
        (Some(VolumePhase::Ready), vec![])
    );

    // The user deletes the claim; external-provisioner: DeleteVolume.
    claims.delete(&claim.name, &DeleteParams::default()).await?;
    controller
        .delete_volume(pb::DeleteVolumeRequest {
            volume_id: handle.clone(),
            ..Default::default()
        })
        .await?;
    story.step(
        "external-provisioner",
        &format!("PVC deleted; DeleteVolume {handle}"),
    );
    let size = storage.size()?;
    let record = witness::record(admin, &pv).await?;
    story.show(&format!(
        "kernel: {}; {storage}: {}",
        export.describe()?,
        if size.is_some() {
            "still there"
        } else {
            "gone"
        }
    ));
    story.show(&format!(
        "API: {}",
        witness::describe_record(&pv, record.as_ref())
    ));
    assert_eq!(export.admitted()?, None, "the export is gone");
    assert_eq!(size, None, "{storage} is gone");
    assert!(record.is_none(), "the PillarVolumeState is gone");
    Ok(())
}

/// A volume staged and published on the node.
struct Attached<'a> {
    pv: &'a str,
    handle: &'a str,
    storage: &'a Storage,
    staging: &'a Path,
    target: &'a Path,
    fs_type: &'a str,
    /// Its size before growing.
    bytes: u64,
}

/// external-resizer then kubelet: ControllerExpandVolume, NodeExpandVolume
/// while mounted; the backend and the filesystem grow.
async fn grow(bed: &ClaimBed, story: &mut Story, v: &Attached<'_>, grown: u64) -> Result<()> {
    let before = df_size(v.target)?;
    let reply = bed
        .controller_client()
        .await?
        .controller_expand_volume(pb::ControllerExpandVolumeRequest {
            volume_id: v.handle.to_owned(),
            capacity_range: range(grown),
            volume_capability: Some(capability(v.fs_type)),
            ..Default::default()
        })
        .await?
        .into_inner();
    story.step(
        "external-resizer",
        &format!("ControllerExpandVolume to {} MiB", grown >> 20),
    );
    let size = v.storage.size()?;
    story.show(&format!(
        "answer: {} bytes, node expansion required: {}; kernel: {}, {}",
        reply.capacity_bytes,
        reply.node_expansion_required,
        v.storage,
        bytes(size)
    ));
    let record = witness::record(&bed.admin, v.pv).await?;
    story.show(&format!(
        "API: {}",
        witness::describe_record(v.pv, record.as_ref())
    ));
    assert!(reply.capacity_bytes as u64 >= grown, "{reply:?}");
    assert_eq!(size, Some(reply.capacity_bytes as u64));
    assert_eq!(
        record.map(|r| r.spec.capacity_bytes),
        Some(reply.capacity_bytes as u64),
        "the record holds the new capacity"
    );
    assert!(
        reply.node_expansion_required,
        "a mounted filesystem grows on the node"
    );
    let reply = bed
        .node_client()
        .await?
        .node_expand_volume(pb::NodeExpandVolumeRequest {
            volume_id: v.handle.to_owned(),
            volume_path: v.target.display().to_string(),
            capacity_range: range(grown),
            staging_target_path: v.staging.display().to_string(),
            volume_capability: Some(capability(v.fs_type)),
            ..Default::default()
        })
        .await?
        .into_inner();
    let after = df_size(v.target)?;
    story.step("kubelet", "NodeExpandVolume: grow the mounted filesystem");
    story.show(&format!(
        "answer: {} bytes; kernel: df {} MiB -> {} MiB",
        reply.capacity_bytes,
        before >> 20,
        after >> 20
    ));
    assert!(
        after > before + (grown - v.bytes) / 2,
        "df shows the new size while mounted: {before} -> {after} (volume {} -> {grown})",
        v.bytes
    );
    Ok(())
}

/// A size the kernel reports, or that it reports none.
fn bytes(size: Option<u64>) -> String {
    size.map_or_else(|| "no size".to_owned(), |b| format!("{b} bytes"))
}
