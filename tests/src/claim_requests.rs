//! The CSI requests the cluster's components send for a claim, built the
//! way they build them: external-provisioner's CreateVolume (the
//! StorageClass's parameters less its reserved ones, plus the claim's
//! metadata), external-attacher's ControllerPublishVolume and kubelet's
//! NodeStageVolume. The claim's life ([`crate::claim_life`]) and the
//! claim benchmark send them.
use crate::csi::csi_pb as pb;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// The prefix of the StorageClass parameters the external-provisioner
/// keeps to itself (fsType, secrets), never passing them to CreateVolume.
const RESERVED_PREFIX: &str = "csi.storage.k8s.io/";

/// A single-node-writer mount of `fs_type`.
pub fn capability(fs_type: &str) -> pb::VolumeCapability {
    use pb::volume_capability::{access_mode::Mode, AccessMode, AccessType, MountVolume};
    pb::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs_type.to_owned(),
            ..Default::default()
        })),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

/// At least `bytes`, no limit.
pub fn range(bytes: u64) -> Option<pb::CapacityRange> {
    Some(pb::CapacityRange {
        required_bytes: bytes as i64,
        limit_bytes: 0,
    })
}

/// The claim a CreateVolume is for.
#[derive(Debug, Clone, Copy)]
pub struct ClaimRef<'a> {
    /// The PVC's namespace.
    pub namespace: &'a str,
    /// The PVC's name.
    pub name: &'a str,
    /// The PV's name (`pvc-<claim UID>`), CreateVolume's name.
    pub pv: &'a str,
}

/// The StorageClass parameters `params` the external-provisioner passes to
/// CreateVolume: all but its reserved ones.
pub fn passed_parameters(
    params: &BTreeMap<String, String>,
) -> impl Iterator<Item = (String, String)> + '_ {
    params
        .iter()
        .filter(|(k, _)| !k.starts_with(RESERVED_PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
}

/// external-provisioner's CreateVolume for `claim` of `bytes` from a
/// StorageClass with `params`, formatted as `fs_type`.
pub fn create_volume(
    params: &BTreeMap<String, String>,
    claim: ClaimRef<'_>,
    bytes: u64,
    fs_type: &str,
) -> pb::CreateVolumeRequest {
    let mut parameters: HashMap<String, String> = passed_parameters(params).collect();
    parameters.insert("csi.storage.k8s.io/pvc/name".into(), claim.name.into());
    parameters.insert(
        "csi.storage.k8s.io/pvc/namespace".into(),
        claim.namespace.into(),
    );
    parameters.insert("csi.storage.k8s.io/pv/name".into(), claim.pv.into());
    pb::CreateVolumeRequest {
        name: claim.pv.to_owned(),
        capacity_range: range(bytes),
        volume_capabilities: vec![capability(fs_type)],
        parameters,
        ..Default::default()
    }
}

/// external-attacher's ControllerPublishVolume of `volume` to `node_id`.
pub fn publish_volume(
    volume: &pb::Volume,
    node_id: &str,
    fs_type: &str,
) -> pb::ControllerPublishVolumeRequest {
    pb::ControllerPublishVolumeRequest {
        volume_id: volume.volume_id.clone(),
        node_id: node_id.to_owned(),
        volume_capability: Some(capability(fs_type)),
        readonly: false,
        volume_context: volume.volume_context.clone(),
        ..Default::default()
    }
}

/// kubelet's NodeStageVolume of `volume` at `staging` with the publish
/// `context`.
pub fn stage_volume(
    volume: &pb::Volume,
    context: &HashMap<String, String>,
    staging: &Path,
    fs_type: &str,
) -> pb::NodeStageVolumeRequest {
    pb::NodeStageVolumeRequest {
        volume_id: volume.volume_id.clone(),
        publish_context: context.clone(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(capability(fs_type)),
        volume_context: volume.volume_context.clone(),
        ..Default::default()
    }
}
