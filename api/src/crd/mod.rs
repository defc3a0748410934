//! The `pillar-csi.bhyoo.com/v1alpha1` custom resources, all cluster-scoped:
//!
//! | kind | plural | job |
//! | --- | --- | --- |
//! | [`PillarAgent`] | `pillaragents` | how to reach one storage-node agent; Ready from its HealthCheck |
//! | [`PillarStore`] | `pillarstores` | a pool (`backend.zfs`) or volume group (`backend.lvm`) of an agent |
//! | [`PillarProtocol`] | `pillarprotocols` | how volumes are exported: `protocol.nvmeofTcp` or `protocol.iscsi` |
//! | [`PillarStorageClass`] | `pillarstorageclasses` | store + protocol + filesystem; owns the StorageClass it generates |
//! | [`PillarVolumeState`] (`pvst`) | `pillarvolumestates` | the controller's record of one volume; status subresource |
//! | [`PillarVolumeReservation`] | `pillarvolumereservations` | an imported zvol or LV reserved for one claim |
//! | [`PillarSnapshot`] (`psnap`) | `pillarsnapshots` | the controller's record of one snapshot; status subresource |
//!
//! Field names are those of the spec's YAML and kubectl/jq commands. The
//! schemas are structural and carry no CEL rules (the lab API server is
//! Kubernetes 1.20). [`crds`] lists every CRD as the chart installs it.

// kube's `printcolumn(..)` repeats attribute keys on purpose, which clippy's
// duplicated_attributes lint mistakes for a copy.
#[allow(clippy::duplicated_attributes)]
mod infra;
#[allow(clippy::duplicated_attributes)]
mod snapshot;
#[allow(clippy::duplicated_attributes)]
mod volume;

pub use infra::{
    AgentStatus, DirectoryBackend, Filesystem, FsType, IscsiProtocol, LocalProtocol, LvmBackend,
    NfsProtocol, NvmeofTcpProtocol, PillarAgent, PillarAgentSpec, PillarProtocol,
    PillarProtocolSpec, PillarStorageClass, PillarStorageClassSpec, PillarStore, PillarStoreSpec,
    ProtocolConfig, ReadyStatus, ReclaimPolicy, StorageClassTemplate, StoreBackend,
    VolumeBindingMode, ZfsBackend,
};
pub use snapshot::{PillarSnapshot, PillarSnapshotSpec, PillarSnapshotStatus};
pub use volume::{
    ClaimRef, ExportSpec, LvmSource, PillarVolumeReservation, PillarVolumeReservationSpec,
    PillarVolumeState, PillarVolumeStateSpec, PillarVolumeStateStatus, PublishedNode, Recovery,
    RecoveryLatch, Resolved, VolumePhase,
};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use std::collections::BTreeMap;

/// The API group.
pub const GROUP: &str = "pillar-csi.bhyoo.com";
/// The one served and stored version.
pub const VERSION: &str = "v1alpha1";
/// The annotation every CRD carries so that neither `helm upgrade` nor
/// `helm uninstall` deletes it (and the objects in it).
pub const HELM_KEEP: (&str, &str) = ("helm.sh/resource-policy", "keep");

/// A status condition (the shape of `metav1.Condition`).
#[derive(
    Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// The condition's type, e.g. `Ready`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// A CamelCase word saying why.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// What a person reads.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// When `status` last changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    /// The `metadata.generation` this condition was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Every CRD, each with the Helm keep annotation, in a fixed order.
pub fn crds() -> Vec<CustomResourceDefinition> {
    let mut all = vec![
        PillarAgent::crd(),
        PillarStore::crd(),
        PillarProtocol::crd(),
        PillarStorageClass::crd(),
        PillarVolumeState::crd(),
        PillarVolumeReservation::crd(),
        PillarSnapshot::crd(),
    ];
    for crd in &mut all {
        crd.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(HELM_KEEP.0.to_owned(), HELM_KEEP.1.to_owned());
    }
    all
}

/// The file name the chart keeps a CRD under: `<plural>.<group>.yaml`.
pub fn file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}.yaml", crd.metadata.name.as_deref().unwrap_or("unnamed"))
}

/// A CRD as the chart's YAML file: a header saying where it comes from,
/// then the object.
pub fn to_yaml(crd: &CustomResourceDefinition) -> Result<String, serde_yaml::Error> {
    Ok(format!(
        "# Generated from the Rust types in api/src/crd/ by `pillar-csi crds`; do not edit.\n{}",
        serde_yaml::to_string(crd)?
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
