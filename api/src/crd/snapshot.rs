//! The controller's record of one CSI snapshot.

use crate::tokens::Backend;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The controller's record of one snapshot, named after the
/// VolumeSnapshotContent (`snapcontent-<UID>`). It is written before the
/// agent is called; its `metadata.uid` names the snapshot on the agent
/// (`<agent volume ID>@pillar-snap-<uid>`), so a controller that restarts
/// mid-way converges on the same snapshot.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "pillar-csi.bhyoo.com",
    version = "v1alpha1",
    kind = "PillarSnapshot",
    doc = "The controller's record of one snapshot; its UID names the snapshot on the agent.",
    plural = "pillarsnapshots",
    shortname = "psnap",
    status = "PillarSnapshotStatus",
    printcolumn(name = "Agent", type_ = "string", json_path = ".spec.agentRef"),
    printcolumn(
        name = "Source",
        type_ = "string",
        json_path = ".spec.sourceAgentVolumeID"
    ),
    printcolumn(name = "Ready", type_ = "boolean", json_path = ".status.readyToUse"),
    printcolumn(name = "Size", type_ = "integer", json_path = ".status.sizeBytes"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct PillarSnapshotSpec {
    /// The CSI volume handle of the source volume.
    #[serde(rename = "sourceVolumeID")]
    pub source_volume_id: String,
    /// The source volume's name on its agent.
    #[serde(rename = "sourceAgentVolumeID")]
    pub source_agent_volume_id: String,
    /// The PillarAgent holding the snapshot.
    pub agent_ref: String,
    /// The source's backend (`zfs-zvol`).
    pub backend_type: Backend,
}

/// What the controller has done with the snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PillarSnapshotStatus {
    /// The CSI snapshot ID `<agent>/<agent volume ID>@pillar-snap-<uid>`,
    /// set once the agent took it.
    #[serde(
        default,
        rename = "snapshotID",
        skip_serializing_if = "Option::is_none"
    )]
    pub snapshot_id: Option<String>,
    /// Whether volumes can be made from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_to_use: Option<bool>,
    /// The source's size when it was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// When it was taken, seconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_seconds: Option<i64>,
    /// Set once DeleteSnapshot has started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleting: Option<bool>,
}
