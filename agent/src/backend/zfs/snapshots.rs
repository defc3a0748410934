//! Snapshots of zvols and the volumes cloned from them.
use super::{round_up, ZfsBackend, DEFAULT_VOLBLOCKSIZE, DEVICE_TIMEOUT};
use crate::{
    backend::{CreateOptions, SnapshotState, Snapshots, VolumeState},
    error::AgentError,
    marks::BackendRecord,
};
use sys::zfs::{DatasetName, SnapshotName, VolumeStats};

impl ZfsBackend {
    /// The snapshot `name` of the zvol at `at`.
    fn snapshot_name(at: &BackendRecord, name: &str) -> Result<SnapshotName, AgentError> {
        Self::dataset(at)?
            .snapshot(name)
            .map_err(|e| AgentError::InvalidArgument(e.to_string()))
    }

    /// The zvol at `at`, refused when it is gone or is not the pinned one.
    fn present(&self, at: &BackendRecord) -> Result<DatasetName, AgentError> {
        let name = Self::dataset(at)?;
        match self.identity(&name, at)? {
            Some(_) => Ok(name),
            None => Err(AgentError::NotFound(format!("zvol {name} does not exist"))),
        }
    }
}

impl Snapshots for ZfsBackend {
    fn take(&self, at: &BackendRecord, name: &str) -> Result<SnapshotState, AgentError> {
        self.present(at)?;
        let snap = Self::snapshot_name(at, name)?;
        match self.zfs.snapshot(&snap, &[]) {
            Ok(()) | Err(sys::zfs::Error::AlreadyExists { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        self.find(at, name)?.ok_or_else(|| {
            AgentError::Internal(format!("snapshot {snap} vanished after it was taken"))
        })
    }

    fn find(&self, at: &BackendRecord, name: &str) -> Result<Option<SnapshotState>, AgentError> {
        let snap = Self::snapshot_name(at, name)?;
        match self.zfs.snapshot_info(&snap) {
            Ok(info) => Ok(Some(SnapshotState {
                guid: info.guid.to_string(),
                size_bytes: info.volsize.unwrap_or_default(),
                creation: info.creation,
            })),
            Err(sys::zfs::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    fn delete(&self, at: &BackendRecord, name: &str) -> Result<bool, AgentError> {
        let snap = Self::snapshot_name(at, name)?;
        match self.zfs.destroy_snapshot_deferred(&snap) {
            Ok(()) | Err(sys::zfs::Error::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        Ok(!self.zfs.exists(snap.as_str()))
    }

    fn dependents(&self, at: &BackendRecord) -> Result<Vec<String>, AgentError> {
        let name = Self::dataset(at)?;
        let snapshots = match self.zfs.snapshots(&name) {
            Ok(s) => s,
            Err(sys::zfs::Error::NotFound { .. }) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        Ok(snapshots.iter().map(|s| s.snapshot().to_owned()).collect())
    }

    fn clone_volume(
        &self,
        source: &BackendRecord,
        name: &str,
        target: &BackendRecord,
        bytes: u64,
        options: &CreateOptions,
    ) -> Result<(BackendRecord, VolumeState), AgentError> {
        let origin = Self::snapshot_name(source, name)?;
        let clone = Self::dataset(target)?;
        // A clone shares its origin's key (ZFS keeps it under the origin's
        // encryption root): it is encrypted exactly when its source is, and
        // the key must be loaded to make it.
        let source_name = Self::dataset(source)?;
        if options.encrypted && !self.encrypted(&source_name)? {
            return Err(AgentError::FailedPrecondition(format!(
                "zvol {clone}: encryption was asked for, and its source {source_name} is not encrypted (a ZFS clone keeps its origin's encryption)"
            )));
        }
        self.ensure_key(&source_name)?;
        // A clone is sparse and keeps its origin's block size: those two
        // options have no say; the others are set as on a new zvol.
        let properties: Vec<(String, String)> = options
            .zfs_properties
            .iter()
            .filter(|(k, _)| !matches!(k.as_str(), "sparse" | "volblocksize"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        match self.zfs.clone_snapshot(&origin, &clone, &properties) {
            Ok(()) => {}
            Err(sys::zfs::Error::AlreadyExists { .. }) => {
                let made_from = self.zfs.get(&clone)?.origin;
                if made_from.as_deref() != Some(origin.as_str()) {
                    return Err(AgentError::AlreadyExists(format!(
                        "zvol {clone} exists and was not cloned from {origin} (its origin: {})",
                        made_from.as_deref().unwrap_or("none")
                    )));
                }
                self.identity(&clone, target)?;
            }
            Err(e) => return Err(e.into()),
        }
        let block = self
            .zfs
            .get(&clone)?
            .volblocksize
            .unwrap_or(DEFAULT_VOLBLOCKSIZE);
        if self.zfs.volsize(&clone)? < bytes {
            self.zfs.set_volsize(&clone, round_up(bytes, block))?;
        }
        let stats: VolumeStats = self.zfs.volume_stats(&clone)?;
        self.ensure_key(&clone)?;
        let device_path = self.zfs.wait_device(&clone, DEVICE_TIMEOUT)?;
        Ok((
            Self::record(&clone, stats),
            VolumeState {
                capacity_bytes: stats.volsize,
                device_path,
            },
        ))
    }

    fn retain(&self, at: &BackendRecord) -> Result<(), AgentError> {
        let name = self.present(at)?;
        self.zfs.set_property(&name, "volmode", "none")?;
        self.zfs.set_property(&name, "refreservation", "none")?;
        Ok(())
    }
}
