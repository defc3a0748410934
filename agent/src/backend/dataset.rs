//! ZFS filesystems (datasets) under `pool[/parentDataset]`, each bounded by
//! its `refquota`, through `sys::zfs`: the filesystem volumes exported
//! over NFS.
use super::{Backend, BackendKind, Capacity, CreateOptions, ImportSource, VolumeState};
use crate::{adopt::refused, error::AgentError, marks::BackendRecord, volume::VolumeId};
use std::{
    sync::Arc,
    time::{Duration, Instant},
};
use sys::zfs::{DatasetName, DatasetType, FilesystemSpec, FilesystemStats, Zfs};

/// How long a busy filesystem's unmount is tried again.
const UNMOUNT_GRACE: Duration = Duration::from_secs(60);

/// One backend of filesystems: those exactly one level under its parent
/// dataset, which must mount (a `mountpoint` that is a path).
#[derive(Debug)]
pub struct DatasetBackend {
    zfs: Arc<Zfs>,
    pool: String,
    parent: DatasetName,
}

impl DatasetBackend {
    /// A backend for `pool` with filesystems under `pool/parent_dataset`
    /// (or the pool itself).
    pub fn new(
        zfs: Arc<Zfs>,
        pool: &str,
        parent_dataset: Option<&str>,
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
        })
    }

    fn dataset(at: &BackendRecord) -> Result<DatasetName, AgentError> {
        match at {
            BackendRecord::Dataset { dataset, .. } => {
                DatasetName::new(dataset).map_err(|e| AgentError::InvalidArgument(e.to_string()))
            }
            other => Err(AgentError::Internal(format!(
                "ZFS dataset backend asked about {other:?}"
            ))),
        }
    }

    /// The statistics of the filesystem now at `name` (`None`: there is
    /// none), refused when it is not the one `at` pinned (renamed away
    /// and another made under its name).
    fn identified(
        &self,
        name: &DatasetName,
        at: &BackendRecord,
    ) -> Result<Option<FilesystemStats>, AgentError> {
        let stats = match self.zfs.filesystem_stats(name) {
            Ok(stats) => stats,
            Err(sys::zfs::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if let BackendRecord::Dataset {
            guid: Some(pinned), ..
        } = at
        {
            let found = stats.guid.to_string();
            if &found != pinned {
                return Err(AgentError::FailedPrecondition(format!(
                    "identity: filesystem {name} has GUID {found}, not the pinned {pinned}; it was renamed or re-created"
                )));
            }
        }
        Ok(Some(stats))
    }

    /// The volume's state: its quota, and where it is mounted, mounting
    /// it when it is not (after a reboot, or an admin's unmount).
    fn mounted(
        &self,
        name: &DatasetName,
        stats: &FilesystemStats,
    ) -> Result<VolumeState, AgentError> {
        let device_path = match &stats.mounted_at {
            Some(at) => at.clone(),
            None => self.zfs.mount(name)?,
        };
        Ok(VolumeState {
            capacity_bytes: stats.refquota,
            device_path,
        })
    }

    /// Unmounts the filesystem, not forced: one still in use (a process
    /// in it, an export) is refused and stays mounted. The NFS server's
    /// caches hold the mount of a filesystem a client used until they
    /// expire, its export gone or not: when the unmount is busy they are
    /// purged and it is tried again, for up to [`UNMOUNT_GRACE`].
    fn unmount(&self, name: &DatasetName) -> Result<(), AgentError> {
        let start = Instant::now();
        loop {
            match self.zfs.unmount(name) {
                Err(sys::zfs::Error::Busy { .. }) if start.elapsed() < UNMOUNT_GRACE => {
                    let left = UNMOUNT_GRACE.saturating_sub(start.elapsed());
                    if let Err(e) = sys::nfsd::purge_caches(left) {
                        tracing::warn!(filesystem = %name, error = %e, "could not purge the NFS server's caches for the unmount");
                        std::thread::sleep(Duration::from_secs(1));
                    }
                }
                other => return other.map_err(AgentError::from),
            }
        }
    }

    fn record(name: &DatasetName, guid: u64) -> BackendRecord {
        BackendRecord::Dataset {
            dataset: name.to_string(),
            guid: Some(guid.to_string()),
        }
    }
}

impl Backend for DatasetBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Dataset
    }

    fn pool(&self) -> &str {
        &self.pool
    }

    fn locate(&self, id: &VolumeId) -> Result<BackendRecord, AgentError> {
        let dataset = self
            .parent
            .child(id.name())
            .map_err(|e| AgentError::InvalidArgument(format!("volume {id}: {e}")))?;
        Ok(BackendRecord::Dataset {
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
        if options.encrypted {
            return Err(AgentError::InvalidArgument(format!(
                "filesystem {name}: encryption is offered for zvols only"
            )));
        }
        if options.thin.is_some() {
            return Err(AgentError::InvalidArgument(format!(
                "filesystem {name}: LVM provisioning does not apply to ZFS filesystems"
            )));
        }
        let mut spec = FilesystemSpec::new(name.clone(), bytes);
        spec.properties = options
            .zfs_properties
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        // The create itself tells whether the filesystem is there already
        // (the caller refused one this agent did not make): then it is
        // returned when it is the pinned one with a quota large enough.
        match self.zfs.create_filesystem(&spec) {
            Ok(()) => {}
            Err(sys::zfs::Error::AlreadyExists { .. }) => {
                let stats = self.identified(&name, at)?.ok_or_else(|| {
                    AgentError::from(sys::zfs::Error::NotFound {
                        dataset: name.to_string(),
                    })
                })?;
                if stats.refquota < bytes {
                    return Err(AgentError::AlreadyExists(format!(
                        "filesystem {name} exists with a refquota of {} bytes, less than the {bytes} requested",
                        stats.refquota
                    )));
                }
                let state = self.mounted(&name, &stats)?;
                return Ok((Self::record(&name, stats.guid), state));
            }
            Err(e) => return Err(e.into()),
        }
        let stats = self.zfs.filesystem_stats(&name)?;
        let state = self.mounted(&name, &stats)?;
        Ok((Self::record(&name, stats.guid), state))
    }

    fn lookup(&self, at: &BackendRecord) -> Result<Option<VolumeState>, AgentError> {
        let name = Self::dataset(at)?;
        match self.identified(&name, at)? {
            Some(stats) => self.mounted(&name, &stats).map(Some),
            None => Ok(None),
        }
    }

    fn destroy(&self, at: &BackendRecord) -> Result<(), AgentError> {
        let name = Self::dataset(at)?;
        if self.identified(&name, at)?.is_none() {
            return Ok(());
        }
        self.unmount(&name)?;
        if let Err(e) = self.zfs.destroy(&name) {
            // Refused (snapshots, children): it stays as it was, mounted.
            if let Err(again) = self.zfs.mount(&name) {
                tracing::warn!(filesystem = %name, error = %again, "could not mount again the filesystem whose destroy was refused");
            }
            return Err(e.into());
        }
        Ok(())
    }

    fn expand(&self, at: &BackendRecord, bytes: u64) -> Result<u64, AgentError> {
        let name = Self::dataset(at)?;
        let current = self
            .identified(&name, at)?
            .ok_or_else(|| sys::zfs::Error::NotFound {
                dataset: name.to_string(),
            })?
            .refquota;
        if bytes <= current {
            return Ok(current);
        }
        self.zfs.set_refquota(&name, bytes)?;
        Ok(self.zfs.filesystem_stats(&name)?.refquota)
    }

    fn import(
        &self,
        id: &VolumeId,
        source: &ImportSource,
        bytes: u64,
    ) -> Result<(BackendRecord, VolumeState), AgentError> {
        match source {
            ImportSource::Dataset { dataset } => self.adopt(id, dataset, bytes),
            _ => Err(AgentError::InvalidArgument(format!(
                "volume {id}: a ZFS dataset backend imports filesystems only (import_zfs_dataset)"
            ))),
        }
    }

    fn capacity(&self) -> Result<Capacity, AgentError> {
        let c = self.zfs.pool_capacity(&self.pool)?;
        Ok(Capacity {
            total_bytes: c.size,
            available_bytes: c.free,
            used_bytes: c.allocated,
        })
    }
}

impl DatasetBackend {
    /// Adopts the existing filesystem `raw` names for `id` after read-only
    /// checks, each refusal a FAILED_PRECONDITION naming what to change:
    /// layout, existence, type, the exact quota prerequisite (its
    /// `refquota` equals the requested capacity), no ZFS share, no child
    /// datasets, a mountpoint. Nothing is set, resized or destroyed; a
    /// filesystem not mounted is mounted where its `mountpoint` says.
    fn adopt(
        &self,
        id: &VolumeId,
        raw: &str,
        bytes: u64,
    ) -> Result<(BackendRecord, VolumeState), AgentError> {
        let named = api::annotations::parse_import_zfs_dataset(raw)
            .map_err(|e| AgentError::InvalidArgument(format!("volume {id}: {e}")))?;
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
        if !self.zfs.exists(named.as_str()) {
            return Err(refused(
                id,
                format!("missing: dataset {named} does not exist"),
            ));
        }
        let kind = self.zfs.dataset_type(&named)?;
        if kind != DatasetType::Filesystem {
            return Err(refused(
                id,
                format!("wrong type: dataset {named} has type {kind}, only ZFS filesystems can be imported"),
            ));
        }
        let stats = self.zfs.filesystem_stats(&named)?;
        if stats.refquota == 0 {
            return Err(refused(
                id,
                format!("quota: filesystem {named} has no refquota; set refquota={bytes} (the requested capacity) first: import never sets a quota"),
            ));
        }
        if stats.refquota != bytes {
            return Err(refused(
                id,
                format!(
                    "quota: filesystem {named} has refquota {} bytes, requested capacity is {bytes} bytes; they must be equal: import never changes a quota",
                    stats.refquota
                ),
            ));
        }
        for share in ["sharenfs", "sharesmb"] {
            let value = self.zfs.property(&named, share)?.unwrap_or_default();
            if value != "off" {
                return Err(refused(
                    id,
                    format!("shared: filesystem {named} has {share}={value}; ZFS would serve it to clients the fence does not know: set {share}=off first"),
                ));
            }
        }
        let children = self.zfs.child_datasets(&named)?;
        if !children.is_empty() {
            return Err(refused(
                id,
                format!(
                    "children: filesystem {named} has child datasets {}; only a filesystem without children can be imported",
                    children.join(", ")
                ),
            ));
        }
        let state = self.mounted(&named, &stats).map_err(|e| match e {
            AgentError::InvalidArgument(why) => refused(id, format!("mountpoint: {why}")),
            other => other,
        })?;
        Ok((Self::record(&named, stats.guid), state))
    }
}
