//! zvols under `pool[/parentDataset]`, through `sys::zfs` (libzfs_core and libzfs).
use super::{Backend, BackendKind, Capacity, CreateOptions, VolumeState};
use crate::{error::AgentError, marks::BackendRecord, volume::VolumeId};
use std::{sync::Arc, time::Duration};
use sys::zfs::{DatasetName, Provisioning, Zfs, ZvolSpec};

/// How long a new zvol's device node may take to appear.
const DEVICE_TIMEOUT: Duration = Duration::from_secs(30);
/// ZFS's default `volblocksize` since 2.2, used to round sizes up.
const DEFAULT_VOLBLOCKSIZE: u64 = 16 * 1024;

/// One ZFS backend: the zvols exactly one level under its parent dataset.
#[derive(Debug)]
pub struct ZfsBackend {
    zfs: Arc<Zfs>,
    pool: String,
    parent: DatasetName,
}

impl ZfsBackend {
    /// A backend for `pool` with zvols under `pool/parent_dataset` (or the pool itself).
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
            BackendRecord::Zvol { dataset } => {
                DatasetName::new(dataset).map_err(|e| AgentError::InvalidArgument(e.to_string()))
            }
            other => Err(AgentError::Internal(format!(
                "ZFS backend asked about {other:?}"
            ))),
        }
    }

    fn state(&self, name: &DatasetName, wait: bool) -> Result<VolumeState, AgentError> {
        let capacity_bytes = self.zfs.volsize(name)?;
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
        if self.zfs.exists(name.as_str()) {
            let existing = self.state(&name, true)?;
            if existing.capacity_bytes < spec.size {
                return Err(AgentError::AlreadyExists(format!(
                    "zvol {name} exists with {} bytes, less than the {} requested",
                    existing.capacity_bytes, spec.size
                )));
            }
            return Ok((at.clone(), existing));
        }
        self.zfs.create_zvol(&spec)?;
        Ok((at.clone(), self.state(&name, true)?))
    }

    fn lookup(&self, at: &BackendRecord) -> Result<Option<VolumeState>, AgentError> {
        let name = Self::dataset(at)?;
        if !self.zfs.exists(name.as_str()) {
            return Ok(None);
        }
        self.state(&name, true).map(Some)
    }

    fn destroy(&self, at: &BackendRecord) -> Result<(), AgentError> {
        let name = Self::dataset(at)?;
        if !self.zfs.exists(name.as_str()) {
            return Ok(());
        }
        Ok(self.zfs.destroy(&name)?)
    }

    fn expand(&self, at: &BackendRecord, bytes: u64) -> Result<u64, AgentError> {
        let name = Self::dataset(at)?;
        let current = self.zfs.volsize(&name)?;
        if bytes <= current {
            return Ok(current);
        }
        let block = self
            .zfs
            .get(&name)?
            .volblocksize
            .unwrap_or(DEFAULT_VOLBLOCKSIZE);
        self.zfs.set_volsize(&name, round_up(bytes, block))?;
        Ok(self.zfs.volsize(&name)?)
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
