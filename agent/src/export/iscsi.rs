//! iSCSI exports through the kernel LIO target.
use super::{ExportInfo, Exporter, Protocol};
use crate::{config::Listener, error::AgentError, marks::ExportRecord, volume::VolumeId};
use lio::{
    Acl, Iqn, Lio, Lun, MappedLun, State, StorageObject, StorageObjectName, Target, Teardown, Tpg,
    TpgAttributes, TpgLun, Tpgt,
};
use std::{net::SocketAddr, path::Path, sync::Mutex};
use tracing::info;

/// The IQN prefix of every target this agent makes.
pub const IQN_PREFIX: &str = "iqn.2026-01.com.bhyoo.pillar-csi:";
const LUN: u16 = 0;

/// iSCSI exports through LIO: one iblock storage object and one target
/// (TPG 1, LUN 0) per volume. With an ACL, only the listed initiators log
/// in; without one, the TPG admits any initiator (demo mode, writable).
#[derive(Debug)]
pub struct LioExporter {
    target: Lio,
    listener: Listener,
    apply: Mutex<()>,
}

impl LioExporter {
    /// An exporter on `target` whose portals listen on `listener`.
    pub fn new(target: Lio, listener: Listener) -> Self {
        Self {
            target,
            listener,
            apply: Mutex::new(()),
        }
    }

    fn names(volume: &VolumeId) -> Result<(Iqn, StorageObjectName), AgentError> {
        let suffix = volume.target_suffix();
        let iqn = Iqn::new(&format!("{IQN_PREFIX}{suffix}"))
            .map_err(|e| AgentError::InvalidArgument(e.to_string()))?;
        let object = StorageObjectName::new(&format!("pillar-{suffix}"))
            .map_err(|e| AgentError::InvalidArgument(e.to_string()))?;
        Ok((iqn, object))
    }

    fn locked<T>(&self, f: impl FnOnce() -> Result<T, AgentError>) -> Result<T, AgentError> {
        let _guard = self
            .apply
            .lock()
            .map_err(|_| AgentError::Internal("LIO exporter lock poisoned".into()))?;
        f()
    }
}

impl Exporter for LioExporter {
    fn protocol(&self) -> Protocol {
        Protocol::Iscsi
    }

    fn check_initiator(&self, initiator: &str) -> Result<(), AgentError> {
        Iqn::new(initiator)
            .map(|_| ())
            .map_err(|e| AgentError::InvalidArgument(format!("initiator_id: {e}")))
    }

    fn export(
        &self,
        volume: &VolumeId,
        device: &Path,
        record: &ExportRecord,
    ) -> Result<ExportInfo, AgentError> {
        let (iqn, object) = Self::names(volume)?;
        let mut tpg = Tpg {
            enabled: true,
            attributes: if record.acl {
                TpgAttributes::default()
            } else {
                TpgAttributes::open()
            },
            ..Default::default()
        };
        tpg.portals
            .insert(SocketAddr::new(self.listener.address, self.listener.port));
        tpg.luns.insert(Lun(LUN), TpgLun::new(object.clone()));
        if record.acl {
            for initiator in &record.allowed_initiators {
                let name = Iqn::new(initiator)
                    .map_err(|e| AgentError::InvalidArgument(format!("initiator: {e}")))?;
                let mut acl = Acl::default();
                acl.mapped_luns.insert(Lun(LUN), MappedLun::new(Lun(LUN)));
                tpg.acls.insert(name, acl);
            }
        }
        let mut target = Target::default();
        target.tpgs.insert(
            Tpgt::new(1).map_err(|e| AgentError::Internal(e.to_string()))?,
            tpg,
        );
        let mut desired = State::default();
        desired.storage_objects.insert(
            object,
            StorageObject {
                udev_path: device.to_path_buf(),
                unit_serial: None,
                ..Default::default()
            },
        );
        desired.targets.insert(iqn.clone(), target);
        // Initiators that lose access hold no session when this returns: a
        // removed node ACL ends its sessions, and a target leaving demo mode
        // is removed (ending every session, dropping its cached dynamic
        // ACLs) and made again.
        let revoked = self.locked(|| Ok(self.target.apply_revoking(&desired)?))?;
        if !revoked.recreated.is_empty() {
            info!(volume = %volume, target = %iqn, "sessions ended: demo mode replaced by an ACL, target made again");
        }
        Ok(ExportInfo {
            target_id: iqn.to_string(),
            listener: self.listener,
            lun: u32::from(LUN),
        })
    }

    fn unexport(&self, volume: &VolumeId) -> Result<(), AgentError> {
        let (iqn, object) = Self::names(volume)?;
        self.locked(|| {
            self.target.teardown(&Teardown {
                targets: [iqn].into(),
                storage_objects: [object].into(),
            })?;
            Ok(())
        })
    }

    fn revalidate(&self, _volume: &VolumeId) -> Result<(), AgentError> {
        // LIO's iblock reads the device size on every READ CAPACITY; the
        // initiator rescans to see it. Nothing to do on the target.
        Ok(())
    }

    fn health(&self) -> Result<(), AgentError> {
        Lio::open_at(self.target.tree().root())?;
        Ok(())
    }
}
