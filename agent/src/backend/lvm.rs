//! Logical volumes in one volume group, through `sys::lvm` (liblvm2cmd on
//! one worker thread): linear LVs, and thin LVs in the backend's thin pool.
use super::{Backend, BackendKind, Capacity, CreateOptions, ImportSource, VolumeState};
use crate::{
    adopt::{in_use, refused, usage},
    error::AgentError,
    marks::BackendRecord,
    volume::VolumeId,
};
use std::sync::Arc;
use sys::lvm::{classify, Error as LvmError, LvName, Lvm, LvmUuid, Refusal, VgName};

/// One LVM backend: a volume group and, optionally, its thin pool.
#[derive(Debug)]
pub struct LvmBackend {
    lvm: Arc<Lvm>,
    vg: VgName,
    thin_pool: Option<LvName>,
}

impl LvmBackend {
    /// A backend for `vg`; thin LVs go into `thin_pool` when one is given.
    pub fn new(lvm: Arc<Lvm>, vg: &str, thin_pool: Option<&str>) -> Result<Self, AgentError> {
        Ok(Self {
            lvm,
            vg: VgName::new(vg).map_err(|e| AgentError::InvalidArgument(e.to_string()))?,
            thin_pool: thin_pool
                .map(LvName::new)
                .transpose()
                .map_err(|e| AgentError::InvalidArgument(e.to_string()))?,
        })
    }

    fn names(at: &BackendRecord) -> Result<(VgName, LvName, Option<LvmUuid>), AgentError> {
        match at {
            BackendRecord::Lv { vg, lv, lv_uuid } => Ok((
                VgName::new(vg).map_err(|e| AgentError::InvalidArgument(e.to_string()))?,
                LvName::new(lv).map_err(|e| AgentError::InvalidArgument(e.to_string()))?,
                lv_uuid
                    .as_deref()
                    .map(LvmUuid::new)
                    .transpose()
                    .map_err(|e| AgentError::Internal(format!("recorded LV UUID: {e}")))?,
            )),
            other => Err(AgentError::Internal(format!(
                "LVM backend asked about {other:?}"
            ))),
        }
    }

    /// The LV, checked against the pinned UUID; `None` when it does not exist.
    fn current(&self, at: &BackendRecord) -> Result<Option<sys::lvm::Lv>, AgentError> {
        let (vg, lv, pinned) = Self::names(at)?;
        let found = match self.lvm.lv(&vg, &lv) {
            Ok(found) => found,
            Err(LvmError::LvNotFound { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if let Some(pinned) = pinned {
            if found.uuid != pinned {
                return Err(AgentError::FailedPrecondition(format!(
                    "logical volume {vg}/{lv} has UUID {}, not the pinned {pinned}: it was renamed or re-created; refusing to touch it",
                    found.uuid.as_str()
                )));
            }
        }
        Ok(Some(found))
    }

    fn state(lv: &sys::lvm::Lv) -> VolumeState {
        VolumeState {
            capacity_bytes: lv.size,
            device_path: lv
                .path
                .clone()
                .unwrap_or_else(|| format!("/dev/{}/{}", lv.vg.as_str(), lv.name).into()),
        }
    }
}

mod snapshots;

impl Backend for LvmBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Lvm
    }

    fn pool(&self) -> &str {
        self.vg.as_str()
    }

    fn locate(&self, id: &VolumeId) -> Result<BackendRecord, AgentError> {
        let lv = LvName::new(id.name())
            .map_err(|e| AgentError::InvalidArgument(format!("volume {id}: {e}")))?;
        // Snapshots are LVs of the same volume group: their names are not
        // volume names.
        if let Some(prefix) = [
            crate::snapshot_id::SNAPSHOT_PREFIX,
            crate::snapshot_id::CLONE_PREFIX,
        ]
        .into_iter()
        .find(|p| id.name().starts_with(p))
        {
            return Err(AgentError::InvalidArgument(format!(
                "volume {id}: LV names starting with {prefix} are the agent's snapshots"
            )));
        }
        Ok(BackendRecord::Lv {
            vg: self.vg.as_str().to_owned(),
            lv: lv.as_str().to_owned(),
            lv_uuid: None,
        })
    }

    fn create(
        &self,
        at: &BackendRecord,
        bytes: u64,
        options: &CreateOptions,
    ) -> Result<(BackendRecord, VolumeState), AgentError> {
        let (vg, lv, _) = Self::names(at)?;
        refuse_encryption(&vg, &lv, options)?;
        if let Some(existing) = self.current(at)? {
            if existing.size < bytes {
                return Err(AgentError::AlreadyExists(format!(
                    "logical volume {vg}/{lv} exists with {} bytes, less than the {bytes} requested",
                    existing.size
                )));
            }
            let record = BackendRecord::Lv {
                vg: vg.as_str().to_owned(),
                lv: lv.as_str().to_owned(),
                lv_uuid: Some(existing.uuid.as_str().to_owned()),
            };
            return Ok((record, Self::state(&existing)));
        }
        let thin = options.thin.unwrap_or(self.thin_pool.is_some());
        let created = match (thin, &self.thin_pool) {
            (true, Some(pool)) => self.lvm.create_thin(&vg, pool, &lv, bytes)?,
            (true, None) => {
                return Err(AgentError::InvalidArgument(format!(
                    "volume {vg}/{lv}: thin provisioning asked, but backend {vg} has no thinPool"
                )))
            }
            (false, _) => self.lvm.create_linear(&vg, &lv, bytes)?,
        };
        let record = BackendRecord::Lv {
            vg: vg.as_str().to_owned(),
            lv: lv.as_str().to_owned(),
            lv_uuid: Some(created.uuid.as_str().to_owned()),
        };
        let state = VolumeState {
            capacity_bytes: created.size,
            device_path: created.path,
        };
        Ok((record, state))
    }

    fn lookup(&self, at: &BackendRecord) -> Result<Option<VolumeState>, AgentError> {
        Ok(self.current(at)?.map(|lv| Self::state(&lv)))
    }

    fn destroy(&self, at: &BackendRecord) -> Result<(), AgentError> {
        let (vg, lv, _) = Self::names(at)?;
        let Some(found) = self.current(at)? else {
            return Ok(());
        };
        Ok(self.lvm.remove(&vg, &lv, &found.uuid)?)
    }

    fn expand(&self, at: &BackendRecord, bytes: u64) -> Result<u64, AgentError> {
        let (vg, lv, _) = Self::names(at)?;
        let found = self.current(at)?.ok_or_else(|| {
            AgentError::NotFound(format!("logical volume {vg}/{lv} does not exist"))
        })?;
        if bytes <= found.size {
            return Ok(found.size);
        }
        Ok(self.lvm.extend(&vg, &lv, bytes)?.size)
    }

    fn import(
        &self,
        id: &VolumeId,
        source: &ImportSource,
        bytes: u64,
    ) -> Result<(BackendRecord, VolumeState), AgentError> {
        let ImportSource::Lv { identity, .. } = source else {
            return Err(AgentError::InvalidArgument(format!(
                "volume {id}: an LVM backend adopts logical volumes only (import_lv), not zvols"
            )));
        };
        let (vg, lv) = (&identity.vg, &identity.lv);
        if id.pool() != vg.as_str() || id.name() != lv.as_str() {
            return Err(refused(
                id,
                format!("layout: the volume ID must be the adopted LV's \"<vg>/<lv>\", {vg}/{lv}"),
            ));
        }
        let found = match self.lvm.lv(vg, lv) {
            Ok(found) => found,
            Err(LvmError::LvNotFound { .. }) => {
                return Err(refused(
                    id,
                    format!("missing: logical volume {vg}/{lv} does not exist"),
                ))
            }
            Err(e) => return Err(e.into()),
        };
        if found.vg_uuid != identity.vg_uuid {
            return Err(refused(
                id,
                format!(
                    "identity: volume group {vg} has UUID {}, not the pinned {}; it is another volume group",
                    found.vg_uuid, identity.vg_uuid
                ),
            ));
        }
        if found.uuid != identity.lv_uuid {
            return Err(refused(
                id,
                format!(
                    "identity: logical volume {vg}/{lv} has UUID {}, not the pinned {}; it was renamed or re-created",
                    found.uuid, identity.lv_uuid
                ),
            ));
        }
        match classify(&found, self.thin_pool.as_ref()) {
            Ok(_) => {}
            Err(Refusal::NotActive { .. }) => {
                return Err(refused(
                    id,
                    format!(
                        "inactive: logical volume {vg}/{lv} is not active (lv_attr {}); import never activates it",
                        found.attr.raw
                    ),
                ))
            }
            Err(why) => {
                return Err(refused(
                    id,
                    format!("layout: logical volume {vg}/{lv} cannot be adopted: {why}"),
                ))
            }
        }
        if found.size < bytes {
            return Err(refused(
                id,
                format!(
                    "too small: logical volume {vg}/{lv} is {} bytes, requested capacity is {bytes} bytes; import never resizes",
                    found.size
                ),
            ));
        }
        let state = Self::state(&found);
        if !state.device_path.exists() {
            return Err(refused(
                id,
                format!(
                    "missing: block device {} is not present on the storage node",
                    state.device_path.display()
                ),
            ));
        }
        if let Some(reason) = in_use(&usage(&state.device_path)?, None, true) {
            return Err(refused(id, reason));
        }
        let record = BackendRecord::Lv {
            vg: vg.as_str().to_owned(),
            lv: lv.as_str().to_owned(),
            lv_uuid: Some(found.uuid.as_str().to_owned()),
        };
        Ok((record, state))
    }

    fn report_lv(&self, at: &BackendRecord) -> Result<Option<sys::lvm::Lv>, AgentError> {
        let (vg, lv, _) = Self::names(at)?;
        match self.lvm.lv(&vg, &lv) {
            Ok(found) => Ok(Some(found)),
            Err(LvmError::LvNotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    fn layout_refusal(&self, lv: &sys::lvm::Lv) -> Option<String> {
        classify(lv, self.thin_pool.as_ref())
            .err()
            .map(|r| r.to_string())
    }

    fn snapshots(&self) -> Option<&dyn super::Snapshots> {
        Some(self)
    }

    fn capacity(&self) -> Result<Capacity, AgentError> {
        match &self.thin_pool {
            Some(pool) => {
                let p = self.lvm.thin_pool(&self.vg, pool)?;
                Ok(Capacity {
                    total_bytes: p.size,
                    available_bytes: p.size.saturating_sub(p.used),
                    used_bytes: p.used,
                })
            }
            None => {
                let v = self.lvm.vg(&self.vg)?;
                Ok(Capacity {
                    total_bytes: v.size,
                    available_bytes: v.free,
                    used_bytes: v.size.saturating_sub(v.free),
                })
            }
        }
    }
}

/// LVM volumes are not encrypted: encryption is ZFS's, of zvols.
fn refuse_encryption(vg: &VgName, lv: &LvName, options: &CreateOptions) -> Result<(), AgentError> {
    if options.encrypted {
        return Err(AgentError::InvalidArgument(format!(
            "logical volume {vg}/{lv}: encryption is ZFS native encryption of zvols; LVM volumes are not encrypted"
        )));
    }
    Ok(())
}
