//! Thin snapshots of thin LVs, and the volumes made from them. A thin
//! snapshot shares blocks in the pool but depends on nothing: its origin,
//! it and the volumes made from it can each be removed in any order, so an
//! LVM volume is never kept for its snapshots.
use super::LvmBackend;
use crate::{
    backend::{CreateOptions, SnapshotState, Snapshots, VolumeState},
    error::AgentError,
    marks::BackendRecord,
};
use std::time::{SystemTime, UNIX_EPOCH};
use sys::lvm::{Error as LvmError, LvName, VolumeType};

impl LvmBackend {
    /// The snapshot LV `name` beside the volume at `at`.
    fn snapshot_record(at: &BackendRecord, name: &str) -> Result<BackendRecord, AgentError> {
        let (vg, _, _) = Self::names(at)?;
        let lv = LvName::new(name).map_err(|e| AgentError::InvalidArgument(e.to_string()))?;
        Ok(BackendRecord::Lv {
            vg: vg.as_str().to_owned(),
            lv: lv.as_str().to_owned(),
            lv_uuid: None,
        })
    }

    /// The thin LV at `at`; a missing one is NOT_FOUND, a linear one is
    /// refused (a classic snapshot would make it an origin).
    fn thin_origin(&self, at: &BackendRecord) -> Result<sys::lvm::Lv, AgentError> {
        let (vg, lv, _) = Self::names(at)?;
        let found = self.current(at)?.ok_or_else(|| {
            AgentError::NotFound(format!("logical volume {vg}/{lv} does not exist"))
        })?;
        if found.attr.volume_type != VolumeType::Thin {
            return Err(AgentError::FailedPrecondition(format!(
                "logical volume {vg}/{lv} is {} (lv_attr {}), not thin: snapshots and clones are made of thin LVs only",
                found.segtype, found.attr.raw
            )));
        }
        Ok(found)
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

impl Snapshots for LvmBackend {
    fn take(&self, at: &BackendRecord, name: &str) -> Result<SnapshotState, AgentError> {
        let origin = self.thin_origin(at)?;
        if let Some(existing) = self.find(at, name)? {
            return Ok(existing);
        }
        let (vg, lv, _) = Self::names(at)?;
        let snap = LvName::new(name).map_err(|e| AgentError::InvalidArgument(e.to_string()))?;
        let created = self.lvm.create_thin_snapshot(&vg, &lv, &snap, false)?;
        Ok(SnapshotState {
            guid: created.uuid.as_str().to_owned(),
            size_bytes: origin.size,
            creation: now(),
        })
    }

    fn find(&self, at: &BackendRecord, name: &str) -> Result<Option<SnapshotState>, AgentError> {
        let (_, origin, _) = Self::names(at)?;
        let Some(found) = self.current(&Self::snapshot_record(at, name)?)? else {
            return Ok(None);
        };
        // Another LV of the reserved name is not a snapshot of this volume
        // (a thin snapshot whose origin was removed names none; the UUID
        // pinned in the mark says whether it is the one taken).
        let origin_ok = found.origin.as_deref().is_none_or(|o| o == origin.as_str());
        if found.attr.volume_type != VolumeType::Thin || !origin_ok {
            return Err(AgentError::FailedPrecondition(format!(
                "logical volume {}/{name} is not a thin snapshot of {origin} (lv_attr {}, origin {}); it is left alone",
                found.vg.as_str(),
                found.attr.raw,
                found.origin.as_deref().unwrap_or("none")
            )));
        }
        Ok(Some(SnapshotState {
            guid: found.uuid.as_str().to_owned(),
            size_bytes: found.size,
            creation: now(),
        }))
    }

    fn delete(&self, at: &BackendRecord, name: &str) -> Result<bool, AgentError> {
        let record = Self::snapshot_record(at, name)?;
        let Some(found) = self.current(&record)? else {
            return Ok(true);
        };
        let (vg, lv, _) = Self::names(&record)?;
        match self.lvm.remove(&vg, &lv, &found.uuid) {
            Ok(()) | Err(LvmError::LvNotFound { .. }) => Ok(true),
            Err(e) => Err(e.into()),
        }
    }

    fn dependents(&self, _at: &BackendRecord) -> Result<Vec<String>, AgentError> {
        // Thin snapshots hold nothing of their origin: none keeps it.
        Ok(Vec::new())
    }

    fn clone_volume(
        &self,
        source: &BackendRecord,
        name: &str,
        target: &BackendRecord,
        bytes: u64,
        options: &CreateOptions,
    ) -> Result<(BackendRecord, VolumeState), AgentError> {
        let (vg, snap, _) = Self::names(&Self::snapshot_record(source, name)?)?;
        let (_, lv, _) = Self::names(target)?;
        super::refuse_encryption(&vg, &lv, options)?;
        let made = match self.current(target)? {
            Some(existing) if existing.origin.as_deref() == Some(snap.as_str()) => existing,
            Some(existing) => {
                return Err(AgentError::AlreadyExists(format!(
                    "logical volume {vg}/{lv} exists and was not made from {vg}/{snap} (its origin: {})",
                    existing.origin.as_deref().unwrap_or("none")
                )))
            }
            None => {
                self.lvm.create_thin_snapshot(&vg, &snap, &lv, true)?;
                self.lvm.lv(&vg, &lv)?
            }
        };
        let grown = if made.size < bytes {
            self.lvm.extend(&vg, &lv, bytes)?
        } else {
            made
        };
        let record = BackendRecord::Lv {
            vg: vg.as_str().to_owned(),
            lv: lv.as_str().to_owned(),
            lv_uuid: Some(grown.uuid.as_str().to_owned()),
        };
        Ok((record, Self::state(&grown)))
    }

    fn retain(&self, at: &BackendRecord) -> Result<(), AgentError> {
        Err(AgentError::Internal(format!(
            "{at} asked to be kept for its snapshots, which thin LVs never need"
        )))
    }
}
