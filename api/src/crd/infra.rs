//! The resources an administrator writes: agents, stores, protocols and
//! storage classes.

use super::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

fn default_agent_port() -> u16 {
    9500
}
fn default_nvmeof_port() -> u16 {
    4420
}
fn default_iscsi_port() -> u16 {
    3260
}
fn default_true() -> bool {
    true
}

/// How the controller reaches one storage-node agent
/// (`pillar_csi.agent.v1.AgentService`).
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "pillar-csi.bhyoo.com",
    version = "v1alpha1",
    kind = "PillarAgent",
    doc = "How the controller reaches one storage-node agent; Ready from its HealthCheck.",
    plural = "pillaragents",
    status = "AgentStatus",
    printcolumn(name = "Address", type_ = "string", json_path = ".spec.address"),
    printcolumn(name = "Port", type_ = "integer", json_path = ".spec.port"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Ready")].status"#
    ),
    printcolumn(name = "Version", type_ = "string", json_path = ".status.agentVersion"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct PillarAgentSpec {
    /// The agent's gRPC address: an IP address or DNS name.
    pub address: String,
    /// The agent's gRPC port.
    #[serde(default = "default_agent_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: u16,
    /// The name the agent's certificate is issued for (TLS SNI and
    /// verification); the controller's `--agent-tls-server-name` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_server_name: Option<String>,
    /// The Kubernetes node the agent runs on, when that node also runs
    /// pods: the topology of the node-local volumes it serves (PillarProtocol
    /// `local`), which only that node can mount.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
}

/// What the controller last learned from an agent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    /// `Ready`: the agent answered HealthCheck and reported itself healthy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The version GetCapabilities reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_version: Option<String>,
}

/// The status of a resource whose only news is whether it is usable.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReadyStatus {
    /// `Ready`, with the reason when it is not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// A pool or volume group of one agent, where volumes are created.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "pillar-csi.bhyoo.com",
    version = "v1alpha1",
    kind = "PillarStore",
    doc = "A ZFS pool or LVM volume group of one agent, where volumes are created.",
    plural = "pillarstores",
    status = "ReadyStatus",
    printcolumn(name = "Agent", type_ = "string", json_path = ".spec.agentRef"),
    printcolumn(name = "Pool", type_ = "string", json_path = ".spec.backend.zfs.pool"),
    printcolumn(
        name = "VolumeGroup",
        type_ = "string",
        json_path = ".spec.backend.lvm.volumeGroup"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Ready")].status"#
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct PillarStoreSpec {
    /// The PillarAgent serving this store.
    pub agent_ref: String,
    /// Exactly one of `zfs`, `lvm`, `zfsDataset` and `directory`.
    pub backend: StoreBackend,
}

/// A store's backend: exactly one is set (the controller refuses a store
/// with more or none, naming it).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StoreBackend {
    /// Zvols under `<pool>[/<parentDataset>]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zfs: Option<ZfsBackend>,
    /// Logical volumes of a volume group, thin when `thinPool` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lvm: Option<LvmBackend>,
    /// ZFS filesystems under `<pool>[/<parentDataset>]`, each bounded by its
    /// refquota: filesystem volumes, served over NFS under the
    /// `files.pillar-csi.bhyoo.com` identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zfs_dataset: Option<ZfsBackend>,
    /// Directories of the agent's directory backend, each bounded by an
    /// XFS project quota: filesystem volumes, served over NFS under the
    /// `files.pillar-csi.bhyoo.com` identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub directory: Option<DirectoryBackend>,
}

/// An agent's directory backend, by the name its configuration gives it
/// (`agent.backends[].directory.name`); the path is the agent's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DirectoryBackend {
    /// The backend's name.
    pub name: String,
}

/// A ZFS pool, and the dataset under which zvols live.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ZfsBackend {
    /// The pool.
    pub pool: String,
    /// The dataset below the pool holding the zvols (absent: the pool's root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_dataset: Option<String>,
}

/// An LVM volume group, and its thin pool for thin LVs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LvmBackend {
    /// The volume group.
    pub volume_group: String,
    /// The thin pool (absent: linear LVs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thin_pool: Option<String>,
}

/// How volumes of a class are exported to nodes.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "pillar-csi.bhyoo.com",
    version = "v1alpha1",
    kind = "PillarProtocol",
    doc = "How the volumes of a class are exported: NVMe/TCP, iSCSI, NFS or node-local.",
    plural = "pillarprotocols",
    status = "ReadyStatus",
    printcolumn(
        name = "NVMeoF-Port",
        type_ = "integer",
        json_path = ".spec.protocol.nvmeofTcp.port"
    ),
    printcolumn(
        name = "iSCSI-Port",
        type_ = "integer",
        json_path = ".spec.protocol.iscsi.port"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Ready")].status"#
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct PillarProtocolSpec {
    /// Exactly one of `nvmeofTcp`, `iscsi`, `nfs` and `local`.
    pub protocol: ProtocolConfig,
}

/// A protocol's settings: exactly one is set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProtocolConfig {
    /// NVMe over Fabrics, TCP transport.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvmeof_tcp: Option<NvmeofTcpProtocol>,
    /// iSCSI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iscsi: Option<IscsiProtocol>,
    /// NFS, for the filesystem volumes of a `zfsDataset` store: the agent's
    /// kernel NFS server exports each volume to the nodes it is published
    /// to (always by address: an NFS export has no open mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nfs: Option<NfsProtocol>,
    /// Node-local, for the directories of a `directory` store whose agent
    /// runs on a node that also runs pods (its PillarAgent's `nodeName`):
    /// each volume is bind-mounted by that node only, and its PV's node
    /// affinity names that node, so Kubernetes schedules its pods there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local: Option<LocalProtocol>,
}

/// Node-local settings: none; the node is the agent's (`PillarAgent`
/// `spec.nodeName`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LocalProtocol {}

/// NFS export settings: the server's address and port are the agent's
/// (`nfs:` in its configuration); the NFS version and mount options are the
/// StorageClass's `mountOptions` (NFS 4.2 when none names a version).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NfsProtocol {}

/// NVMe/TCP export settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NvmeofTcpProtocol {
    /// The nvmet port's TCP port.
    #[serde(default = "default_nvmeof_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: u16,
    /// Admit only the host NQNs of the nodes a volume is published to.
    #[serde(default = "default_true")]
    pub acl: bool,
}

/// iSCSI export settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IscsiProtocol {
    /// The portal's TCP port.
    #[serde(default = "default_iscsi_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: u16,
    /// Admit only the initiator IQNs of the nodes a volume is published to.
    #[serde(default = "default_true")]
    pub acl: bool,
}

/// A store, a protocol and a filesystem: the StorageClass it generates and
/// owns.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "pillar-csi.bhyoo.com",
    version = "v1alpha1",
    kind = "PillarStorageClass",
    doc = "A store, a protocol and a filesystem; generates and owns a StorageClass.",
    plural = "pillarstorageclasses",
    status = "ReadyStatus",
    printcolumn(
        name = "StorageClass",
        type_ = "string",
        json_path = ".spec.storageClass.name"
    ),
    printcolumn(name = "Store", type_ = "string", json_path = ".spec.storeRef"),
    printcolumn(name = "Protocol", type_ = "string", json_path = ".spec.protocolRef"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Ready")].status"#
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct PillarStorageClassSpec {
    /// The PillarStore volumes are created in.
    pub store_ref: String,
    /// The PillarProtocol volumes are exported with.
    pub protocol_ref: String,
    /// The StorageClass to generate.
    pub storage_class: StorageClassTemplate,
    /// The filesystem of Filesystem-mode volumes (the node's default when
    /// absent; a PVC's `pillar-csi.bhyoo.com/filesystem` annotation overrides it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filesystem: Option<Filesystem>,
    /// The ZFS properties a claim of this class may set in its
    /// `pillar-csi.bhyoo.com/backend` annotation (`zfs: {properties: ...}`),
    /// e.g. `[compression, volblocksize]`. Empty (the default): claims set
    /// none. Names are compared exactly, so an alias (`compress`) or a user
    /// property (`module:prop`) must be listed by that name; a claim setting
    /// any other property is refused before anything is created.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_claim_zfs_properties: Vec<String>,
    /// Encrypt every new volume of this class with ZFS native encryption
    /// (`aes-256-gcm`, a random key per volume that the agent keeps
    /// sealed under its key-encryption key; the README's "Encryption
    /// keys"). ZFS stores only; no claim annotation can turn it off.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub encrypted: bool,
    /// The claims of this class import encrypted zvols: each names the
    /// Secret in its namespace that holds its zvol's key (field `key`, 64
    /// hexadecimal digits) in the annotation
    /// `pillar-csi.bhyoo.com/import-key-secret`, and the generated
    /// StorageClass has the external-provisioner read it and pass it in
    /// CreateVolume's secrets. A claim of such a class without that
    /// annotation is not provisioned (the provisioner cannot name the
    /// Secret); the chart's `controller.readImportKeySecrets` lets it read
    /// Secrets.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub import_keys: bool,
}

/// The generated StorageClass's name and policies.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageClassTemplate {
    /// The StorageClass's name.
    pub name: String,
    /// What happens to the volume when its claim is deleted (default `Delete`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaim_policy: Option<ReclaimPolicy>,
    /// When volumes are provisioned (default `Immediate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_binding_mode: Option<VolumeBindingMode>,
    /// Whether claims may grow (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_volume_expansion: Option<bool>,
}

/// A PersistentVolume's reclaim policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ReclaimPolicy {
    /// DeleteVolume runs when the claim is deleted.
    Delete,
    /// The volume stays when the claim is deleted.
    Retain,
}

/// A StorageClass's volume binding mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum VolumeBindingMode {
    /// Provision as soon as the claim exists.
    Immediate,
    /// Provision once a pod using the claim is scheduled.
    WaitForFirstConsumer,
}

/// A filesystem choice: on a PillarStorageClass, in the
/// `pillar-csi.bhyoo.com/filesystem` annotation, and resolved into a volume.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Filesystem {
    /// The filesystem type.
    pub fs_type: FsType,
}

/// The filesystems the node plugin formats and grows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum FsType {
    /// ext4.
    Ext4,
    /// XFS.
    Xfs,
}
