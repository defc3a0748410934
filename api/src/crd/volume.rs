//! The resources the controller writes: one PillarVolumeState per volume,
//! and PillarVolumeReservations for imports.

use super::{Filesystem, ProtocolConfig, StoreBackend};
use crate::tokens::{Backend, Protocol};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The controller's record of one volume, named after the PV
/// (`pvc-<claim UID>`). It is written before the agent is called; its
/// `metadata.uid` and `status.publicationGeneration` (absent = 0) are the
/// fence token of every agent call for the volume.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "pillar-csi.bhyoo.com",
    version = "v1alpha1",
    kind = "PillarVolumeState",
    doc = "The controller's record of one volume; its UID and status.publicationGeneration fence every agent call.",
    plural = "pillarvolumestates",
    shortname = "pvst",
    status = "PillarVolumeStateStatus",
    printcolumn(name = "Agent", type_ = "string", json_path = ".spec.agentRef"),
    printcolumn(
        name = "AgentVolume",
        type_ = "string",
        json_path = ".spec.agentVolumeID"
    ),
    printcolumn(name = "Backend", type_ = "string", json_path = ".spec.backendType"),
    printcolumn(name = "Protocol", type_ = "string", json_path = ".spec.protocolType"),
    printcolumn(
        name = "Capacity",
        type_ = "integer",
        json_path = ".spec.capacityBytes"
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Generation",
        type_ = "integer",
        json_path = ".status.publicationGeneration"
    ),
    printcolumn(
        name = "Imported",
        type_ = "string",
        json_path = ".spec.importedFrom",
        priority = "1"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct PillarVolumeStateSpec {
    /// The CSI volume handle `<agent>/<protocol>/<backend>/<agent volume ID>`.
    #[serde(rename = "volumeID")]
    pub volume_id: String,
    /// The volume's name on its agent.
    #[serde(rename = "agentVolumeID")]
    pub agent_volume_id: String,
    /// The PillarAgent serving the volume.
    pub agent_ref: String,
    /// `zfs-zvol` or `lvm-lv`.
    pub backend_type: Backend,
    /// `nvmeof-tcp` or `iscsi`.
    pub protocol_type: Protocol,
    /// The capacity provisioned (for an import: the adopted volume's size).
    #[serde(default)]
    pub capacity_bytes: u64,
    /// The claim the volume was provisioned for. Immutable: the controller
    /// writes it once, at creation, and never changes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_ref: Option<ClaimRef>,
    /// The zvol an `import-zvol` claim imported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imported_from: Option<String>,
    /// The LV an `import-lv` claim adopted, pinned by name and UUID, and its policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lvm_source: Option<LvmSource>,
    /// The configuration resolved at CreateVolume (class, store, protocol,
    /// filesystem), so later changes to those objects do not move the volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved: Option<Resolved>,
    /// The export the agent must keep (re-sent with ReconcileState).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub export_spec: Option<ExportSpec>,
    /// A metadata-loss recovery in progress (`RecoveryPending` until committed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery: Option<Recovery>,
}

/// A claim named by namespace, name and UID.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimRef {
    /// The claim's `metadata.uid`.
    pub uid: String,
    /// The claim's namespace.
    pub namespace: String,
    /// The claim's name.
    pub name: String,
}

/// An adopted LV's identity and policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LvmSource {
    /// The volume group's name.
    pub volume_group: String,
    /// The logical volume's name.
    pub logical_volume: String,
    /// The volume group's UUID.
    #[serde(rename = "volumeGroupUUID")]
    pub volume_group_uuid: String,
    /// The logical volume's UUID.
    #[serde(rename = "logicalVolumeUUID")]
    pub logical_volume_uuid: String,
    /// PreserveOriginal (true) or Managed (false).
    pub preserve_original: bool,
}

/// The configuration a volume was created with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Resolved {
    /// The PillarStorageClass.
    pub storage_class_ref: String,
    /// The PillarStore.
    pub store_ref: String,
    /// The PillarProtocol.
    pub protocol_ref: String,
    /// The store's backend as it was.
    pub backend: StoreBackend,
    /// The protocol's settings as they were.
    pub protocol: ProtocolConfig,
    /// The filesystem (class, then annotation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filesystem: Option<Filesystem>,
    /// Whether the volume was made encrypted (the class's `encrypted`);
    /// its key is the agent's, sealed on the zvol, never in this record.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub encrypted: bool,
}

/// The export of a volume as the agent must keep it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExportSpec {
    /// Whether only the listed initiators may connect.
    pub acl_enabled: bool,
    /// Host NQNs or initiator IQNs of the nodes the volume is published to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_initiators: Vec<String>,
}

/// A metadata-loss recovery: the old lifecycle, the grant and its pins.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Recovery {
    /// The lifecycle that owned the LV.
    #[serde(rename = "oldVolumeUID")]
    pub old_volume_uid: String,
    /// Its last generation.
    pub old_generation: u64,
    /// The generation the new lifecycle starts at.
    pub new_generation: u64,
    /// The LV and policy being recovered.
    pub source: LvmSource,
    /// This record's UID, set once.
    #[serde(
        rename = "newVolumeUID",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub new_volume_uid: Option<String>,
    /// The signed RecoveryAuthorization (base64), set once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authorization: Option<String>,
    /// The grant's SHA-256 digest (hex), set once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authorization_digest: Option<String>,
}

/// What the controller has done with the volume.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PillarVolumeStateStatus {
    /// The fence generation; rises with every publication change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publication_generation: Option<u64>,
    /// The nodes the volume is published to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub published_nodes: Vec<PublishedNode>,
    /// Set once DeleteVolume has started; nothing is published after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleting: Option<bool>,
    /// Where the volume is in its life.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<VolumePhase>,
    /// The last refusal or failure, for a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The write-once fields of `spec.recovery` as the controller first saw
    /// them set; a later change of the spec is refused (no CEL on 1.20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_latch: Option<RecoveryLatch>,
}

/// The write-once recovery fields, latched by the controller.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecoveryLatch {
    /// `spec.recovery.newVolumeUID` as first seen.
    #[serde(rename = "newVolumeUID")]
    pub new_volume_uid: String,
    /// `spec.recovery.authorizationDigest` as first seen.
    pub authorization_digest: String,
    /// SHA-256 (hex) of the bytes of `spec.recovery.authorization` as first seen.
    pub authorization_sha256: String,
}

/// One publication.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PublishedNode {
    /// The CSI node ID (`<node name>/<host NQN>/<initiator IQN>`).
    #[serde(rename = "nodeID")]
    pub node_id: String,
    /// The generation the publication was made under.
    pub generation: u64,
}

/// A volume's phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum VolumePhase {
    /// Recorded; the agent has not yet created or imported the volume.
    Pending,
    /// The agent holds the volume.
    Ready,
    /// DeleteVolume is under way.
    Deleting,
    /// A recovery record waiting for its grant; serves nothing.
    RecoveryPending,
}

/// An imported zvol or adopted LV reserved for one claim, taken before the
/// agent is called and never released automatically.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "pillar-csi.bhyoo.com",
    version = "v1alpha1",
    kind = "PillarVolumeReservation",
    doc = "An imported zvol or adopted LV reserved for one claim; never released automatically.",
    plural = "pillarvolumereservations",
    printcolumn(name = "Agent", type_ = "string", json_path = ".spec.agentRef"),
    printcolumn(
        name = "AgentVolume",
        type_ = "string",
        json_path = ".spec.agentVolumeID"
    ),
    printcolumn(
        name = "Namespace",
        type_ = "string",
        json_path = ".spec.claimRef.namespace"
    ),
    printcolumn(name = "Claim", type_ = "string", json_path = ".spec.claimRef.name"),
    printcolumn(name = "Owner", type_ = "string", json_path = ".spec.ownerVolume"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct PillarVolumeReservationSpec {
    /// The claim holding the reservation.
    pub claim_ref: ClaimRef,
    /// The PillarVolumeState of that claim's volume.
    pub owner_volume: String,
    /// The agent holding the reserved volume.
    pub agent_ref: String,
    /// The reserved volume's name on the agent.
    #[serde(rename = "agentVolumeID")]
    pub agent_volume_id: String,
}
