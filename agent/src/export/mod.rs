//! Exports behind one small trait: NVMe/TCP through nvmet, iSCSI through
//! LIO, NFS through the kernel NFS server, and node-local directories
//! (bind-mounted by the agent's own node: no kernel target).
use crate::{config::Listener, error::AgentError, marks::ExportRecord, volume::VolumeId};
use std::path::Path;

mod identity;
mod iscsi;
mod local;
mod names;
mod nfs;
mod nvmeof;

pub use identity::StableIdentity;
pub use iscsi::LioExporter;
pub use local::LocalExporter;
pub use names::{host_name, TargetNames, IQN_PREFIX, NQN_PREFIX};
pub use nfs::{NfsExporter, EXPORTS_DIR};
pub use nvmeof::NvmetExporter;

/// A transport protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    /// NVMe/TCP.
    NvmeofTcp,
    /// iSCSI.
    Iscsi,
    /// NFS (filesystem volumes).
    Nfs,
    /// A bind mount on the agent's own node (directory volumes).
    Local,
}

impl Protocol {
    /// The name used in marks and volume handles.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::NvmeofTcp => "nvmeof-tcp",
            Protocol::Iscsi => "iscsi",
            Protocol::Nfs => "nfs",
            Protocol::Local => "local",
        }
    }

    /// Parses [`Protocol::as_str`].
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "nvmeof-tcp" => Some(Protocol::NvmeofTcp),
            "iscsi" => Some(Protocol::Iscsi),
            "nfs" => Some(Protocol::Nfs),
            "local" => Some(Protocol::Local),
            _ => None,
        }
    }
}

/// Where initiators find an export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    /// Subsystem NQN or target IQN; an NFS export's path.
    pub target_id: String,
    /// Listen address and port.
    pub listener: Listener,
    /// Namespace ID or LUN.
    pub lun: u32,
    /// The identity the exported device shows initiators, as the target
    /// holds it now: the NVMe namespace's UUID, the LUN's T10 unit serial
    /// (VPD page 0x80). A node checks the disk it finds against it.
    pub device_identity: String,
}

/// One protocol's kernel target. Methods are synchronous and idempotent.
pub trait Exporter: Send + Sync {
    /// The protocol.
    fn protocol(&self) -> Protocol;
    /// Checks an initiator name (host NQN or IQN) for this protocol.
    fn check_initiator(&self, initiator: &str) -> Result<(), AgentError>;
    /// The target name a new export of `volume` is made under.
    fn new_target(&self, volume: &VolumeId) -> String;
    /// The names of every kernel object this exporter may have made for
    /// `volume` (target names, storage objects): its own, not foreign
    /// users of the volume's device.
    fn own_names(&self, volume: &VolumeId) -> Vec<String>;
    /// Makes the export of `volume` serving `device` match `record`, under
    /// the target name `record` holds (the legacy name when none).
    fn export(
        &self,
        volume: &VolumeId,
        device: &Path,
        record: &ExportRecord,
    ) -> Result<ExportInfo, AgentError>;
    /// Removes every export of `volume` this exporter may have made (under
    /// `recorded`, the name a mark records, and the names of
    /// [`Exporter::own_names`]), if present.
    fn unexport(&self, volume: &VolumeId, recorded: Option<&str>) -> Result<(), AgentError>;
    /// Tells initiators connected to the export `record` describes that
    /// the device changed size.
    fn revalidate(&self, volume: &VolumeId, record: &ExportRecord) -> Result<(), AgentError>;
    /// Whether the kernel target is reachable.
    fn health(&self) -> Result<(), AgentError>;
}
