//! zvols under `pool[/parentDataset]`, through `sys::zfs` (libzfs_core and libzfs).
use super::{Backend, BackendKind, Capacity, CreateOptions, ImportSource, VolumeState};
use crate::{
    adopt::{in_use, refused, usage},
    error::AgentError,
    imported_keys::ImportedKeys,
    marks::BackendRecord,
    sealed_key::Keks,
    volume::VolumeId,
};
use std::{path::PathBuf, sync::Arc, time::Duration};
use sys::zfs::{DatasetName, DatasetType, Provisioning, SnapshotName, VolumeStats, Zfs, ZvolSpec};

/// How long a new zvol's device node may take to appear (udev is slow when
/// many volumes are created at once).
const DEVICE_TIMEOUT: Duration = Duration::from_secs(90);
/// ZFS's default `volblocksize` since 2.2, used to round sizes up.
const DEFAULT_VOLBLOCKSIZE: u64 = 16 * 1024;

/// One ZFS backend: the zvols exactly one level under its parent dataset.
#[derive(Debug)]
pub struct ZfsBackend {
    zfs: Arc<Zfs>,
    pool: String,
    parent: DatasetName,
    /// Seal the keys of encrypted zvols; none: encryption is refused.
    keks: Option<Arc<Keks>>,
    /// The sealed keys of imported encrypted zvols; none: such imports
    /// are refused.
    imported: Option<ImportedKeys>,
}

impl ZfsBackend {
    /// A backend for `pool` with zvols under `pool/parent_dataset` (or the
    /// pool itself); `keks` seal the keys of encrypted zvols.
    pub fn new(
        zfs: Arc<Zfs>,
        pool: &str,
        parent_dataset: Option<&str>,
        keks: Option<Arc<Keks>>,
    ) -> Result<Self, AgentError> {
        let parent = match parent_dataset {
            Some(p) => format!("{pool}/{p}"),
            None => pool.to_owned(),
        };
        Ok(Self {
            zfs,
            pool: pool.to_owned(),
            parent: DatasetName::new(&parent)
                .map_err(|e| AgentError::InvalidArgument(e.to_string()))?,
            keks,
            imported: None,
        })
    }

    /// The backend keeping the sealed keys of the encrypted zvols it
    /// imports in `keys` (the agent's state folder).
    pub fn with_imported_keys(self, keys: ImportedKeys) -> Self {
        Self {
            imported: Some(keys),
            ..self
        }
    }

    fn dataset(at: &BackendRecord) -> Result<DatasetName, AgentError> {
        match at {
            BackendRecord::Zvol { dataset, .. } => {
                DatasetName::new(dataset).map_err(|e| AgentError::InvalidArgument(e.to_string()))
            }
            other => Err(AgentError::Internal(format!(
                "ZFS backend asked about {other:?}"
            ))),
        }
    }

    /// The record of the zvol `name` with its GUID pinned.
    fn pinned(&self, name: &DatasetName) -> Result<BackendRecord, AgentError> {
        Ok(Self::record(name, self.zfs.volume_stats(name)?))
    }

    /// The record of the zvol `name` with the GUID of `stats`.
    fn record(name: &DatasetName, stats: VolumeStats) -> BackendRecord {
        BackendRecord::Zvol {
            dataset: name.to_string(),
            guid: Some(stats.guid.to_string()),
        }
    }

    /// The size and GUID of the zvol now at `name` (`None`: there is
    /// none), refused when it is not the one `at` pinned (it was renamed
    /// away and another made under its name). One statistics ioctl.
    fn identified(
        &self,
        name: &DatasetName,
        at: &BackendRecord,
    ) -> Result<Option<VolumeStats>, AgentError> {
        let stats = match self.zfs.volume_stats(name) {
            Ok(stats) => stats,
            Err(sys::zfs::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        Self::check_pin(name, at, stats.guid)?;
        Ok(Some(stats))
    }

    /// [`Self::identified`] without the size: the GUID of the zvol now at
    /// `name`, from the statistics ioctl without its property list.
    fn identity(&self, name: &DatasetName, at: &BackendRecord) -> Result<Option<u64>, AgentError> {
        let guid = match self.zfs.volume_guid(name) {
            Ok(guid) => guid,
            Err(sys::zfs::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        Self::check_pin(name, at, guid)?;
        Ok(Some(guid))
    }

    /// Refuses a zvol whose GUID is not the one `at` pinned.
    fn check_pin(name: &DatasetName, at: &BackendRecord, guid: u64) -> Result<(), AgentError> {
        if let BackendRecord::Zvol {
            guid: Some(pinned), ..
        } = at
        {
            let found = guid.to_string();
            if &found != pinned {
                return Err(AgentError::FailedPrecondition(format!(
                    "identity: zvol {name} has GUID {found}, not the pinned {pinned}; it was renamed or re-created"
                )));
            }
        }
        Ok(())
    }

    /// The volume's size and, when `wait`, its device node once udev made it.
    fn state(
        &self,
        name: &DatasetName,
        stats: VolumeStats,
        wait: bool,
    ) -> Result<VolumeState, AgentError> {
        let capacity_bytes = stats.volsize;
        let device_path = if wait {
            self.zfs.wait_device(name, DEVICE_TIMEOUT)?
        } else {
            Zfs::device_path(name)
        };
        Ok(VolumeState {
            capacity_bytes,
            device_path,
        })
    }
}

mod key_change;
mod keys;
mod snapshots;

/// Rounds `bytes` up to a multiple of `block`.
fn round_up(bytes: u64, block: u64) -> u64 {
    bytes.div_ceil(block).saturating_mul(block)
}

impl Backend for ZfsBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Zvol
    }

    fn pool(&self) -> &str {
        &self.pool
    }

    fn locate(&self, id: &VolumeId) -> Result<BackendRecord, AgentError> {
        let dataset = self
            .parent
            .child(id.name())
            .map_err(|e| AgentError::InvalidArgument(format!("volume {id}: {e}")))?;
        Ok(BackendRecord::Zvol {
            dataset: dataset.to_string(),
            guid: None,
        })
    }

    fn create(
        &self,
        at: &BackendRecord,
        bytes: u64,
        options: &CreateOptions,
    ) -> Result<(BackendRecord, VolumeState), AgentError> {
        let name = Self::dataset(at)?;
        let mut spec = ZvolSpec::new(name.clone(), 0);
        for (key, value) in &options.zfs_properties {
            match key.as_str() {
                "sparse" => {
                    spec.provisioning = match value.as_str() {
                        "true" => Provisioning::Sparse,
                        "false" => Provisioning::Thick,
                        _ => {
                            return Err(AgentError::InvalidArgument(format!(
                                "zfs property sparse={value:?}: must be true or false"
                            )))
                        }
                    }
                }
                "volblocksize" => {
                    spec.volblocksize = Some(value.parse().map_err(|_| {
                        AgentError::InvalidArgument(format!(
                            "zfs property volblocksize={value:?}: must be a number of bytes"
                        ))
                    })?)
                }
                _ => spec.properties.push((key.clone(), value.clone())),
            }
        }
        spec.size = round_up(bytes, spec.volblocksize.unwrap_or(DEFAULT_VOLBLOCKSIZE));
        // The create itself tells whether the zvol is there already (the
        // caller refused one this agent did not make): then it is returned
        // when it is the pinned one and large enough.
        let created = if options.encrypted {
            self.create_encrypted(spec.clone())
        } else {
            self.zfs.create_zvol(&spec).map_err(AgentError::from)
        };
        match created {
            Ok(()) => {}
            Err(AgentError::AlreadyExists(_)) => {
                let stats =
                    self.identified(&name, at)?
                        .ok_or_else(|| sys::zfs::Error::NotFound {
                            dataset: name.to_string(),
                        })?;
                if options.encrypted && !self.encrypted(&name)? {
                    return Err(AgentError::AlreadyExists(format!(
                        "zvol {name} exists and is not encrypted; encryption was asked for"
                    )));
                }
                self.ensure_key(&name)?;
                let existing = self.state(&name, stats, true)?;
                if existing.capacity_bytes < spec.size {
                    return Err(AgentError::AlreadyExists(format!(
                        "zvol {name} exists with {} bytes, less than the {} requested",
                        existing.capacity_bytes, spec.size
                    )));
                }
                return Ok((Self::record(&name, stats), existing));
            }
            Err(e) => return Err(e),
        }
        // The size is the one just made; only the new GUID is read, beside
        // the wait for the device node: while many zvols are being made,
        // both wait seconds for the pool (the read for its namespace and
        // configuration locks, the node for udev, whose first open of each
        // new zvol needs the same locks), and one after the other would
        // add the two.
        let (guid, device) = std::thread::scope(|s| {
            let guid = s.spawn(|| self.zfs.volume_guid(&name));
            let device = self.zfs.wait_device(&name, DEVICE_TIMEOUT);
            let guid = guid
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            (guid, device)
        });
        let stats = VolumeStats {
            volsize: spec.size,
            guid: guid?,
        };
        // A slow udev never turns a created volume into a failed create:
        // export waits for the node again.
        let device_path = device.unwrap_or_else(|e| {
            tracing::warn!(volume = %name, error = %e, "created; its device node is not there yet");
            Zfs::device_path(&name)
        });
        let state = VolumeState {
            capacity_bytes: stats.volsize,
            device_path,
        };
        Ok((Self::record(&name, stats), state))
    }

    fn lookup(&self, at: &BackendRecord) -> Result<Option<VolumeState>, AgentError> {
        let name = Self::dataset(at)?;
        let Some(stats) = self.identified(&name, at)? else {
            return Ok(None);
        };
        self.ensure_key(&name)?;
        self.state(&name, stats, true).map(Some)
    }

    fn device(&self, at: &BackendRecord) -> Result<Option<PathBuf>, AgentError> {
        let name = Self::dataset(at)?;
        if self.identity(&name, at)?.is_none() {
            return Ok(None);
        }
        self.ensure_key(&name)?;
        Ok(Some(self.zfs.wait_device(&name, DEVICE_TIMEOUT)?))
    }

    fn destroy(&self, at: &BackendRecord) -> Result<(), AgentError> {
        let name = Self::dataset(at)?;
        if self.identity(&name, at)?.is_none() {
            return Ok(());
        }
        self.zfs.destroy(&name)?;
        self.forget_imported_key(at)
    }

    fn expand(&self, at: &BackendRecord, bytes: u64) -> Result<u64, AgentError> {
        let name = Self::dataset(at)?;
        let current = self
            .identified(&name, at)?
            .ok_or_else(|| sys::zfs::Error::NotFound {
                dataset: name.to_string(),
            })?
            .volsize;
        if bytes <= current {
            return Ok(current);
        }
        self.ensure_key(&name)?;
        let block = self
            .zfs
            .get(&name)?
            .volblocksize
            .unwrap_or(DEFAULT_VOLBLOCKSIZE);
        self.zfs.set_volsize(&name, round_up(bytes, block))?;
        Ok(self.zfs.volsize(&name)?)
    }

    fn import(
        &self,
        id: &VolumeId,
        source: &ImportSource,
        bytes: u64,
    ) -> Result<(BackendRecord, VolumeState), AgentError> {
        let ImportSource::Zvol { dataset: raw, key } = source else {
            return Err(AgentError::InvalidArgument(format!(
                "volume {id}: a ZFS backend imports zvols only (import_zvol), not logical volumes"
            )));
        };
        // A snapshot name is checked for layout by its dataset, then refused
        // as the wrong type; anything else must be a dataset name.
        let snapshot = if raw.contains('@') {
            Some(SnapshotName::new(raw).map_err(|e| {
                AgentError::InvalidArgument(format!("volume {id}: import_zvol: {e}"))
            })?)
        } else {
            None
        };
        let named = match &snapshot {
            Some(s) => s.dataset(),
            None => api::annotations::parse_import_zvol(raw)
                .map_err(|e| AgentError::InvalidArgument(format!("volume {id}: {e}")))?,
        };
        let resolved = Self::dataset(&self.locate(id)?)?;
        if named.pool() == self.pool && named.parent().as_ref() != Some(&self.parent) {
            let requested = named.parent().map(|p| p.to_string()).unwrap_or_default();
            return Err(AgentError::FailedPrecondition(format!(
                "volume {id}: requested ZFS parent dataset {requested} does not match the agent backend's configured ZFS parent dataset {}",
                self.parent
            )));
        }
        if named != resolved {
            return Err(refused(
                id,
                format!("layout: expected dataset {named} does not match the resolved dataset {resolved}"),
            ));
        }
        if let Some(snap) = &snapshot {
            if !self.zfs.exists(snap.as_str()) {
                return Err(refused(
                    id,
                    format!("missing: dataset {raw} does not exist"),
                ));
            }
            return Err(refused(
                id,
                format!(
                    "wrong type: dataset {raw} has type {}, only ZFS volumes (zvols) can be imported",
                    DatasetType::Snapshot
                ),
            ));
        }
        if !self.zfs.exists(named.as_str()) {
            return Err(refused(
                id,
                format!("missing: dataset {named} does not exist"),
            ));
        }
        let info = self.zfs.get(&named)?;
        if info.kind != DatasetType::Volume {
            return Err(refused(
                id,
                format!(
                    "wrong type: dataset {named} has type {}, only ZFS volumes (zvols) can be imported",
                    info.kind
                ),
            ));
        }
        let volsize = info.volsize.ok_or_else(|| {
            AgentError::Internal(format!("zvol {named}: libzfs reported no volsize"))
        })?;
        if volsize < bytes {
            return Err(refused(
                id,
                format!("too small: dataset {named} is {volsize} bytes, requested capacity is {bytes} bytes; import never resizes"),
            ));
        }
        // An encrypted zvol's key is checked (changing nothing) before its
        // device is looked at: without the key loaded there is none.
        let key = self.checked_import_key(id, &named, key.as_ref())?;
        let loaded = match &key {
            Some(key) if self.zfs.key_status(&named)? == sys::zfs::KeyStatus::Unavailable => {
                self.zfs.load_key(&named, key)?;
                true
            }
            _ => false,
        };
        let adopted = self.adopt_checked(id, &named, volsize, key, loaded);
        if adopted.is_err() && loaded {
            // A refusal changes nothing: the key goes back to unloaded.
            if let Err(e) = self.zfs.unload_key(&named) {
                tracing::warn!(zvol = %named, error = %e, "could not unload the key of a refused import");
            }
        }
        adopted
    }

    fn capacity(&self) -> Result<Capacity, AgentError> {
        let c = self.zfs.pool_capacity(&self.pool)?;
        Ok(Capacity {
            total_bytes: c.size,
            available_bytes: c.free,
            used_bytes: c.allocated,
        })
    }

    fn snapshots(&self) -> Option<&dyn super::Snapshots> {
        Some(self)
    }

    fn reseal_keys(&self) -> (u32, Vec<String>) {
        self.reseal_all()
    }

    fn change_volume_keys(&self) -> (u32, Vec<String>) {
        self.change_all_keys()
    }
}

impl ZfsBackend {
    /// The checks of an import that need the zvol's device (waited for
    /// when its key was `loaded` just now), then its key kept sealed: the
    /// record and state of the adopted zvol.
    fn adopt_checked(
        &self,
        id: &VolumeId,
        named: &DatasetName,
        volsize: u64,
        key: Option<sys::zfs::RawKey>,
        loaded: bool,
    ) -> Result<(BackendRecord, VolumeState), AgentError> {
        if loaded {
            self.zfs.wait_device(named, DEVICE_TIMEOUT)?;
        }
        let device = Zfs::device_path(named);
        if !device.exists() {
            return Err(refused(
                id,
                format!(
                    "missing: block device {} is not present on the storage node",
                    device.display()
                ),
            ));
        }
        if let Some(reason) = in_use(&usage(&device)?, None, true) {
            return Err(refused(id, reason));
        }
        let record = self.pinned(named)?;
        if let Some(key) = key {
            self.keep_imported_key(named, &record, &key)?;
        }
        Ok((
            record,
            VolumeState {
                capacity_bytes: volsize,
                device_path: device,
            },
        ))
    }
}
