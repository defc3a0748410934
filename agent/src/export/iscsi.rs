//! iSCSI exports through the kernel LIO target.
use super::identity::StableIdentity;
use super::names::TargetNames;
use super::{ExportInfo, Exporter, Protocol};
use crate::{config::Listener, error::AgentError, marks::ExportRecord, volume::VolumeId};
use lio::{
    Acl, Chap, Iqn, Lio, Lun, MappedLun, State, StorageObject, StorageObjectName, Target, Teardown,
    Tpg, TpgAttributes, TpgLun, Tpgt,
};
use std::{net::SocketAddr, path::Path, sync::Mutex};
use tracing::info;

const LUN: u16 = 0;

/// iSCSI exports through LIO: one iblock storage object and one target
/// (TPG 1, LUN 0) per volume. With an ACL, only the listed initiators log
/// in; without one, the TPG admits any initiator (demo mode, writable).
#[derive(Debug)]
pub struct LioExporter {
    target: Lio,
    listener: Listener,
    names: TargetNames,
    apply: Mutex<()>,
}

impl LioExporter {
    /// An exporter on `target` whose portals listen on `listener`, naming
    /// new targets with `names`.
    pub fn new(target: Lio, listener: Listener, names: TargetNames) -> Self {
        #[cfg(feature = "crash-points")]
        let target = target.with_step_hook(std::sync::Arc::new(|s| {
            crate::crash::configfs_step(crate::crash::Target::Lio, s)
        }));
        Self {
            target,
            listener,
            names,
            apply: Mutex::new(()),
        }
    }

    /// The target IQN of the export `record` describes.
    pub fn iqn_of(volume: &VolumeId, record: &ExportRecord) -> Result<Iqn, AgentError> {
        let name = match &record.target {
            Some(name) => name.clone(),
            None => TargetNames::legacy_iqn(volume),
        };
        Iqn::new(&name).map_err(|e| AgentError::InvalidArgument(e.to_string()))
    }

    /// The storage object name of a volume (one storage node's, so the
    /// same on every agent).
    pub fn object(volume: &VolumeId) -> Result<StorageObjectName, AgentError> {
        StorageObjectName::new(&format!("pillar-{}", volume.target_suffix()))
            .map_err(|e| AgentError::InvalidArgument(e.to_string()))
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

    fn new_target(&self, volume: &VolumeId) -> String {
        self.names.iqn(volume)
    }

    fn own_names(&self, volume: &VolumeId) -> Vec<String> {
        let mut names = vec![self.names.iqn(volume), TargetNames::legacy_iqn(volume)];
        names.extend(Self::object(volume).map(|o| o.to_string()));
        names
    }

    fn export(
        &self,
        volume: &VolumeId,
        device: &Path,
        record: &ExportRecord,
    ) -> Result<ExportInfo, AgentError> {
        let iqn = Self::iqn_of(volume, record)?;
        let object = Self::object(volume)?;
        let mut desired = desired_state(&iqn, object.clone(), device, self.listener, record)?;
        // A storage object being made gets the volume's stable unit serial
        // (the LUN's WWN derives from it); one that exists keeps its own:
        // the kernel refuses the change while a LUN exports it.
        let tree = self.target.tree();
        let made = self
            .target
            .hbas()?
            .iter()
            .any(|n| tree.exists(&format!("core/iblock_{n}/{object}")));
        if !made {
            if let Some(so) = desired.storage_objects.get_mut(&object) {
                so.unit_serial = Some(StableIdentity::of(iqn.as_str()).uuid);
            }
        }
        // Initiators that lose access hold no session when this returns: a
        // removed node ACL ends its sessions, and a target leaving demo mode
        // is removed (ending every session, dropping its cached dynamic
        // ACLs) and made again.
        let revoked = self.locked(|| Ok(self.target.apply_revoking(&desired)?))?;
        if !revoked.recreated.is_empty() {
            info!(volume = %volume, target = %iqn, "sessions ended: demo mode replaced by an ACL, target made again");
        }
        let device_identity = self
            .target
            .read_scoped(&desired)?
            .storage_objects
            .remove(&object)
            .and_then(|so| so.unit_serial)
            .unwrap_or_default();
        Ok(ExportInfo {
            target_id: iqn.to_string(),
            listener: self.listener,
            lun: u32::from(LUN),
            device_identity,
        })
    }

    fn unexport(&self, volume: &VolumeId, recorded: Option<&str>) -> Result<(), AgentError> {
        let targets = recorded
            .map(str::to_owned)
            .into_iter()
            .chain([self.names.iqn(volume), TargetNames::legacy_iqn(volume)])
            .filter_map(|name| Iqn::new(&name).ok())
            .collect();
        let object = Self::object(volume)?;
        self.locked(|| {
            self.target.teardown(&Teardown {
                targets,
                storage_objects: [object].into(),
            })?;
            Ok(())
        })
    }

    fn revalidate(&self, _volume: &VolumeId, _record: &ExportRecord) -> Result<(), AgentError> {
        // LIO's iblock reads the device size on every READ CAPACITY; the
        // initiator rescans to see it. Nothing to do on the target.
        Ok(())
    }

    fn health(&self) -> Result<(), AgentError> {
        Lio::open_at(self.target.tree().root())?;
        Ok(())
    }
}

/// The LIO state that exports `device` as `iqn` per `record`: TPG 1 on
/// `listener` with LUN 0; with an ACL, one node ACL per allowed initiator,
/// and with CHAP the TPG requires authentication and every ACL carries the
/// credentials.
fn desired_state(
    iqn: &Iqn,
    object: StorageObjectName,
    device: &Path,
    listener: Listener,
    record: &ExportRecord,
) -> Result<State, AgentError> {
    let mut tpg = Tpg {
        enabled: true,
        attributes: if record.acl {
            TpgAttributes::default()
        } else {
            TpgAttributes::open()
        },
        ..Default::default()
    };
    let chap = match (&record.chap, record.acl) {
        (Some(c), true) => Some(Chap {
            userid: c.username.clone(),
            password: c.password.clone(),
        }),
        (Some(_), false) => {
            return Err(AgentError::InvalidArgument(
                "chap: CHAP needs acl_enabled (LIO checks CHAP per allowed initiator)".into(),
            ))
        }
        (None, _) => None,
    };
    tpg.attributes.authentication = chap.is_some();
    tpg.portals
        .insert(SocketAddr::new(listener.address, listener.port));
    tpg.luns.insert(Lun(LUN), TpgLun::new(object.clone()));
    if record.acl {
        for initiator in &record.allowed_initiators {
            let name = Iqn::new(initiator)
                .map_err(|e| AgentError::InvalidArgument(format!("initiator: {e}")))?;
            let mut acl = Acl::default();
            acl.mapped_luns.insert(Lun(LUN), MappedLun::new(Lun(LUN)));
            acl.chap = chap.clone();
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
    Ok(desired)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::marks::ChapRecord;

    fn record(chap: bool) -> ExportRecord {
        ExportRecord {
            acl: true,
            allowed_initiators: [
                "iqn.2003-01.org.example:a".to_owned(),
                "iqn.2003-01.org.example:b".to_owned(),
            ]
            .into(),
            chap: chap.then(|| ChapRecord {
                username: "user".into(),
                password: "secret123456".into(),
            }),
            target: None,
        }
    }

    fn tpg(state: &State) -> &Tpg {
        state
            .targets
            .values()
            .next()
            .unwrap()
            .tpgs
            .values()
            .next()
            .unwrap()
    }

    #[test]
    fn chap_requires_authentication_on_the_tpg_and_sits_on_every_acl() {
        let iqn = Iqn::new("iqn.2026-01.com.bhyoo.pillar-csi:v").unwrap();
        let object = StorageObjectName::new("pillar-v").unwrap();
        let listener = Listener {
            address: "127.0.0.1".parse().unwrap(),
            port: 3260,
        };
        let dev = Path::new("/dev/zvol/tank/v");
        let with = desired_state(&iqn, object.clone(), dev, listener, &record(true)).unwrap();
        assert!(tpg(&with).attributes.authentication);
        assert_eq!(tpg(&with).acls.len(), 2);
        for acl in tpg(&with).acls.values() {
            let chap = acl.chap.as_ref().unwrap();
            assert_eq!(
                (chap.userid.as_str(), chap.password.as_str()),
                ("user", "secret123456")
            );
        }
        let without = desired_state(&iqn, object.clone(), dev, listener, &record(false)).unwrap();
        assert!(!tpg(&without).attributes.authentication);
        assert!(tpg(&without).acls.values().all(|a| a.chap.is_none()));
        let open = ExportRecord {
            acl: false,
            ..record(true)
        };
        let e = desired_state(&iqn, object, dev, listener, &open).unwrap_err();
        assert!(e.to_string().contains("acl_enabled"), "{e}");
    }
}
