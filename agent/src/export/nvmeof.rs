//! NVMe/TCP exports through the kernel nvmet target.
use super::{ExportInfo, Exporter, Protocol};
use crate::{config::Listener, error::AgentError, marks::ExportRecord, volume::VolumeId};
use nvmet::{Namespace, Nqn, Nsid, Nvmet, Port, PortId, State, Subsystem, Teardown};
use std::{path::Path, sync::Mutex};
use tracing::info;

/// The NQN prefix of every subsystem this agent makes.
pub const NQN_PREFIX: &str = "nqn.2026-01.com.bhyoo.pillar-csi:";
const NSID: u32 = 1;

/// NVMe/TCP exports through the kernel nvmet target: one subsystem per
/// volume (namespace 1), all linked to one port.
#[derive(Debug)]
pub struct NvmetExporter {
    target: Nvmet,
    listener: Listener,
    port: PortId,
    /// configfs changes are serialised: they are fast, and two exports
    /// racing to create the shared port would collide.
    apply: Mutex<()>,
}

impl NvmetExporter {
    /// An exporter on `target` listening on `listener` through port `port`.
    pub fn new(target: Nvmet, listener: Listener, port: PortId) -> Self {
        #[cfg(feature = "crash-points")]
        let target = target.with_step_hook(std::sync::Arc::new(|s| {
            crate::crash::configfs_step(crate::crash::Target::Nvmet, s)
        }));
        Self {
            target,
            listener,
            port,
            apply: Mutex::new(()),
        }
    }

    /// The subsystem NQN of a volume.
    pub fn nqn(volume: &VolumeId) -> Result<Nqn, AgentError> {
        Ok(Nqn::new(&format!(
            "{NQN_PREFIX}{}",
            volume.target_suffix()
        ))?)
    }

    /// When the port must move (it is half-made from a failed start, or the
    /// agent now listens elsewhere), the subsystems of this agent linked to
    /// it, so they move with it. Another tool's subsystem on the port makes
    /// the plan refuse the move instead of cutting its hosts off.
    fn own_links_if_moving(&self, want: &Port) -> Result<Vec<Nqn>, AgentError> {
        let mut probe = State::default();
        probe.ports.insert(
            self.port,
            Port {
                subsystems: Default::default(),
                ..want.clone()
            },
        );
        let present = self.target.read_scoped(&probe)?;
        Ok(match present.ports.get(&self.port) {
            Some(p) if p.transport != want.transport || p.address != want.address => p
                .subsystems
                .iter()
                .filter(|n| n.as_str().starts_with(NQN_PREFIX))
                .cloned()
                .collect(),
            _ => Vec::new(),
        })
    }

    fn locked<T>(&self, f: impl FnOnce() -> Result<T, AgentError>) -> Result<T, AgentError> {
        let _guard = self
            .apply
            .lock()
            .map_err(|_| AgentError::Internal("nvmet exporter lock poisoned".into()))?;
        f()
    }
}

impl Exporter for NvmetExporter {
    fn protocol(&self) -> Protocol {
        Protocol::NvmeofTcp
    }

    fn check_initiator(&self, initiator: &str) -> Result<(), AgentError> {
        Nqn::new(initiator)
            .map(|_| ())
            .map_err(|e| AgentError::InvalidArgument(format!("initiator_id: {e}")))
    }

    fn export(
        &self,
        volume: &VolumeId,
        device: &Path,
        record: &ExportRecord,
    ) -> Result<ExportInfo, AgentError> {
        let nqn = Self::nqn(volume)?;
        let hosts = if record.acl {
            record
                .allowed_initiators
                .iter()
                .map(|h| {
                    Nqn::new(h).map_err(|e| AgentError::InvalidArgument(format!("initiator: {e}")))
                })
                .collect::<Result<_, _>>()?
        } else {
            Default::default()
        };
        let mut sub = Subsystem {
            allow_any_host: !record.acl,
            allowed_hosts: hosts,
            ..Default::default()
        };
        sub.namespaces.insert(
            Nsid::new(u64::from(NSID))?,
            Namespace {
                device_path: device.to_path_buf(),
                enabled: true,
                ..Default::default()
            },
        );
        let mut port = Port::tcp(std::net::SocketAddr::new(
            self.listener.address,
            self.listener.port,
        ));
        port.subsystems.insert(nqn.clone());
        let mut desired = State::default();
        desired.subsystems.insert(nqn.clone(), sub);
        // Hosts that lose access are cut off before this returns: the
        // subsystem is unlinked from its port (the kernel deletes its
        // controllers there), its ACL changed, and linked back.
        let plan = self.locked(|| {
            port.subsystems.extend(self.own_links_if_moving(&port)?);
            desired.ports.insert(self.port, port);
            Ok(self.target.apply_revoking(&desired)?)
        })?;
        if !plan.cut_off.is_empty() {
            info!(volume = %volume, subsystem = %nqn, "controllers cut off: access narrowed, subsystem relinked to its ports");
        }
        Ok(ExportInfo {
            target_id: nqn.to_string(),
            listener: self.listener,
            lun: NSID,
        })
    }

    fn unexport(&self, volume: &VolumeId) -> Result<(), AgentError> {
        let nqn = Self::nqn(volume)?;
        self.locked(|| {
            self.target.teardown(&Teardown {
                subsystems: [nqn].into(),
                ..Default::default()
            })?;
            Ok(())
        })
    }

    fn revalidate(&self, volume: &VolumeId) -> Result<(), AgentError> {
        let nqn = Self::nqn(volume)?;
        if !self.target.tree().exists(&format!("subsystems/{nqn}")) {
            return Ok(());
        }
        Ok(self
            .target
            .revalidate_size(&nqn, Nsid::new(u64::from(NSID))?)?)
    }

    fn health(&self) -> Result<(), AgentError> {
        Nvmet::open_at(self.target.tree().root())?;
        Ok(())
    }
}
