//! Storage backends behind one small trait: a ZFS pool or an LVM volume group.
use crate::{error::AgentError, marks::BackendRecord, volume::VolumeId};
use std::{collections::BTreeMap, path::PathBuf};

/// Which kind of backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// ZFS zvols.
    Zvol,
    /// LVM logical volumes.
    Lvm,
    /// ZFS filesystems (datasets): filesystem volumes, exported over NFS.
    Dataset,
    /// Directories bounded by project quotas: filesystem volumes, exported
    /// over NFS.
    Directory,
}

impl BackendKind {
    /// Whether its volumes are filesystems (exported over NFS).
    pub fn is_filesystem(self) -> bool {
        matches!(self, BackendKind::Dataset | BackendKind::Directory)
    }
}

/// A volume as the backend sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeState {
    /// Size in bytes (a filesystem's quota).
    pub capacity_bytes: u64,
    /// The block device node; for a filesystem, where it is mounted.
    pub device_path: PathBuf,
}

/// Options of a new volume.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CreateOptions {
    /// ZFS properties by name (`sparse`, `volblocksize`, `compression`, ...).
    pub zfs_properties: BTreeMap<String, String>,
    /// Thin LV (`Some(true)`), linear (`Some(false)`), or the backend's default.
    pub thin: Option<bool>,
    /// ZFS native encryption with a key of the volume's own (zvols only).
    pub encrypted: bool,
}

/// Capacity of a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// Total bytes.
    pub total_bytes: u64,
    /// Bytes a new volume can use.
    pub available_bytes: u64,
    /// Bytes in use.
    pub used_bytes: u64,
}

/// An existing volume to adopt instead of creating one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImportSource {
    /// A zvol, by its full dataset name as the request gave it (checked by the backend).
    Zvol {
        /// `<pool>[/<parent>]/<name>` (a snapshot name is refused as the wrong type).
        dataset: String,
        /// The key of an encrypted zvol, as its owner's Secret holds it.
        key: Option<ImportKey>,
    },
    /// A ZFS filesystem, by its full dataset name as the request gave it
    /// (checked by the backend); always preserved.
    Dataset {
        /// `<pool>[/<parent>]/<name>`.
        dataset: String,
    },
    /// A directory, by its absolute path as the request gave it (checked
    /// by the backend); always preserved.
    Directory {
        /// `<backend path>/<name>`.
        path: String,
    },
    /// An LV, its identity and policy to pin.
    Lv {
        /// Names and UUIDs.
        identity: api::annotations::LvIdentity,
        /// PreserveOriginal or Managed.
        policy: api::annotations::LvPolicy,
    },
}

/// The key an import names for an encrypted zvol, as the Secret holds it
/// (32 raw bytes, or 64 hexadecimal digits, by the zvol's `keyformat`):
/// zeroed when dropped, never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct ImportKey(zeroize::Zeroizing<Vec<u8>>);

impl ImportKey {
    /// The key `bytes`.
    pub fn new(bytes: Vec<u8>) -> Self {
        Self(zeroize::Zeroizing::new(bytes))
    }

    /// Its bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for ImportKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ImportKey(<redacted>)")
    }
}

/// One configured backend. Methods are synchronous; the service runs them
/// on blocking worker threads, several at once for different volumes.
pub trait Backend: Send + Sync {
    /// The kind.
    fn kind(&self) -> BackendKind;
    /// The pool or volume group this backend serves (the first component of its volume IDs).
    fn pool(&self) -> &str;
    /// Where a volume ID lives (its dataset, or VG and LV); refuses IDs the backend cannot hold.
    fn locate(&self, id: &VolumeId) -> Result<BackendRecord, AgentError>;
    /// Creates the volume, or returns it when it already exists and is large
    /// enough. Returns the record to keep (with identity pinned, such as an
    /// LV's UUID) and the volume's state.
    fn create(
        &self,
        at: &BackendRecord,
        bytes: u64,
        options: &CreateOptions,
    ) -> Result<(BackendRecord, VolumeState), AgentError>;
    /// The volume's state, `None` when it does not exist.
    fn lookup(&self, at: &BackendRecord) -> Result<Option<VolumeState>, AgentError>;
    /// The volume's device node, `None` when the volume does not exist:
    /// [`Backend::lookup`] without what an export does not need.
    fn device(&self, at: &BackendRecord) -> Result<Option<PathBuf>, AgentError> {
        Ok(self.lookup(at)?.map(|state| state.device_path))
    }
    /// Destroys the volume, never recursively; a missing volume is success.
    fn destroy(&self, at: &BackendRecord) -> Result<(), AgentError>;
    /// Grows the volume to at least `bytes`; returns the new size. Never shrinks.
    fn expand(&self, at: &BackendRecord, bytes: u64) -> Result<u64, AgentError>;
    /// The backend's capacity.
    fn capacity(&self) -> Result<Capacity, AgentError>;
    /// Adopts an existing volume for `id` after read-only checks (layout,
    /// existence, type, size of at least `bytes`, idleness), each refusal a
    /// FAILED_PRECONDITION with the spec's message. Never creates, resizes,
    /// formats or changes a property of the volume.
    fn import(
        &self,
        id: &VolumeId,
        source: &ImportSource,
        bytes: u64,
    ) -> Result<(BackendRecord, VolumeState), AgentError> {
        let _ = (source, bytes);
        Err(AgentError::Unimplemented(format!(
            "volume {id}: this backend cannot import existing volumes"
        )))
    }
    /// The LVM report of the LV at `at`, without checking a pinned UUID;
    /// `None` when it does not exist. LVM backends only.
    fn report_lv(&self, at: &BackendRecord) -> Result<Option<sys::lvm::Lv>, AgentError> {
        let _ = at;
        Err(AgentError::Unimplemented(
            "InspectVolume supports BACKEND_TYPE_LVM only".into(),
        ))
    }
    /// Who uses the block device at `device` (mounts, holders, LIO, nvmet,
    /// the exclusive-open probe), read from the host. Read-only.
    fn device_usage(&self, device: &std::path::Path) -> Result<sys::block::Usage, AgentError> {
        crate::adopt::usage(device)
    }
    /// Why the LV may not be adopted by this backend (its layout), `None`
    /// when it may. LVM backends only.
    fn layout_refusal(&self, lv: &sys::lvm::Lv) -> Option<String> {
        let _ = lv;
        None
    }
    /// The backend's snapshots and clones, `None` when it has none.
    fn snapshots(&self) -> Option<&dyn Snapshots> {
        None
    }
    /// Seals again, under the current key-encryption key, every volume key
    /// the previous one sealed (a KEK rotation); returns how many, and the
    /// volumes that could not be, with why. Backends without encryption
    /// have none.
    fn reseal_keys(&self) -> (u32, Vec<String>) {
        (0, Vec::new())
    }
    /// Gives every encrypted volume whose key the agent made a new key
    /// (a change of the volumes' own keys); returns how many, and the
    /// volumes that could not, with why. Backends without encryption have
    /// none.
    fn change_volume_keys(&self) -> (u32, Vec<String>) {
        (0, Vec::new())
    }
}

/// A snapshot as the backend sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotState {
    /// Its identity (a ZFS snapshot's GUID), pinned in the source's mark.
    pub guid: String,
    /// The source's size when it was taken.
    pub size_bytes: u64,
    /// When it was taken, seconds since the Unix epoch.
    pub creation: u64,
}

/// Snapshots of a backend's volumes, and volumes cloned from them. A
/// snapshot is named by its volume's record and its name after `@`.
pub trait Snapshots: Send + Sync {
    /// Takes the snapshot `name` of the volume at `at`, or returns the
    /// one of that name already there.
    fn take(&self, at: &BackendRecord, name: &str) -> Result<SnapshotState, AgentError>;
    /// The snapshot `name` of the volume at `at`, `None` when absent.
    fn find(&self, at: &BackendRecord, name: &str) -> Result<Option<SnapshotState>, AgentError>;
    /// Deletes the snapshot, or when clones still depend on it marks it to
    /// go with the last of them; returns whether it is gone now.
    fn delete(&self, at: &BackendRecord, name: &str) -> Result<bool, AgentError>;
    /// The snapshots that keep the volume from being destroyed, whoever
    /// took them (a zvol: every snapshot of it; a thin LV: none, thin
    /// snapshots depend on nothing), by name.
    fn dependents(&self, at: &BackendRecord) -> Result<Vec<String>, AgentError>;
    /// Clones the snapshot `name` of the volume at `source` as the volume
    /// at `target`, grown to at least `bytes`; a repeat returns the clone
    /// already there when it was made from that snapshot.
    fn clone_volume(
        &self,
        source: &BackendRecord,
        name: &str,
        target: &BackendRecord,
        bytes: u64,
        options: &CreateOptions,
    ) -> Result<(BackendRecord, VolumeState), AgentError>;
    /// Hides a volume kept only for its snapshots: no device node and no
    /// reserved space, the data kept.
    fn retain(&self, at: &BackendRecord) -> Result<(), AgentError>;
}

mod dataset;
mod directory;
mod lvm;
mod zfs;

pub use dataset::DatasetBackend;
pub use directory::DirectoryBackend;
pub use lvm::LvmBackend;
pub use zfs::ZfsBackend;
