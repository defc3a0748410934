//! Exports behind one small trait: NVMe/TCP through nvmet, iSCSI through LIO.
use crate::{config::Listener, error::AgentError, marks::ExportRecord, volume::VolumeId};
use std::path::Path;

mod identity;
mod iscsi;
mod nvmeof;

pub use identity::StableIdentity;
pub use iscsi::{LioExporter, IQN_PREFIX};
pub use nvmeof::{NvmetExporter, NQN_PREFIX};

/// A transport protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    /// NVMe/TCP.
    NvmeofTcp,
    /// iSCSI.
    Iscsi,
}

impl Protocol {
    /// The name used in marks and volume handles.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::NvmeofTcp => "nvmeof-tcp",
            Protocol::Iscsi => "iscsi",
        }
    }

    /// Parses [`Protocol::as_str`].
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "nvmeof-tcp" => Some(Protocol::NvmeofTcp),
            "iscsi" => Some(Protocol::Iscsi),
            _ => None,
        }
    }
}

/// Where initiators find an export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    /// Subsystem NQN or target IQN.
    pub target_id: String,
    /// Listen address and port.
    pub listener: Listener,
    /// Namespace ID or LUN.
    pub lun: u32,
}

/// One protocol's kernel target. Methods are synchronous and idempotent.
pub trait Exporter: Send + Sync {
    /// The protocol.
    fn protocol(&self) -> Protocol;
    /// Checks an initiator name (host NQN or IQN) for this protocol.
    fn check_initiator(&self, initiator: &str) -> Result<(), AgentError>;
    /// Makes the export of `volume` serving `device` match `record`.
    fn export(
        &self,
        volume: &VolumeId,
        device: &Path,
        record: &ExportRecord,
    ) -> Result<ExportInfo, AgentError>;
    /// Removes the export of `volume`, if present.
    fn unexport(&self, volume: &VolumeId) -> Result<(), AgentError>;
    /// Tells connected initiators the device changed size.
    fn revalidate(&self, volume: &VolumeId) -> Result<(), AgentError>;
    /// Whether the kernel target is reachable.
    fn health(&self) -> Result<(), AgentError>;
}
