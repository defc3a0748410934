//! The plain types of the ZFS API: dataset types, provisioning, a
//! volume's spec, dataset and pool figures, and the version check.
use super::*;

/// A dataset's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DatasetType {
    /// A filesystem.
    Filesystem,
    /// A volume (zvol).
    Volume,
    /// A snapshot.
    Snapshot,
    /// Another type (a bookmark, or one this library does not know).
    Other,
}

impl DatasetType {
    pub(super) fn from_raw(t: c_int) -> Self {
        match t {
            ffi::TYPE_FILESYSTEM => DatasetType::Filesystem,
            ffi::TYPE_VOLUME => DatasetType::Volume,
            ffi::TYPE_SNAPSHOT => DatasetType::Snapshot,
            _ => DatasetType::Other,
        }
    }
}

impl fmt::Display for DatasetType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DatasetType::Filesystem => "filesystem",
            DatasetType::Volume => "volume",
            DatasetType::Snapshot => "snapshot",
            DatasetType::Other => "dataset of another type",
        })
    }
}

/// How a new volume's space is reserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Provisioning {
    /// `refreservation` set to what the volume can grow to, as
    /// `zfs create -V` does without `-s`.
    #[default]
    Thick,
    /// No reservation (`zfs create -s -V`).
    Sparse,
}

/// What to create: a volume's name, size, block size, provisioning and
/// further properties.
#[derive(Debug, Clone)]
pub struct ZvolSpec {
    /// The volume, below a pool.
    pub name: DatasetName,
    /// `volsize` in bytes: not 0, a multiple of the block size.
    pub size: u64,
    /// `volblocksize` in bytes; `None` takes ZFS's default.
    pub volblocksize: Option<u64>,
    /// Thick (the default) or sparse.
    pub provisioning: Provisioning,
    /// Further properties as `zfs create -o name=value` takes them, e.g.
    /// `("compression", "lz4")`, `("volmode", "dev")`, or a user property
    /// `("pillar-csi.bhyoo.com:owner", "...")`; translated to what the
    /// kernel wants (index numbers, parsed sizes). `volsize`,
    /// `volblocksize`, `refreservation` and `reservation` are not taken
    /// here: they follow from the fields above.
    pub properties: Vec<(String, String)>,
}

impl ZvolSpec {
    /// A thick volume of `size` bytes with the default block size.
    pub fn new(name: DatasetName, size: u64) -> Self {
        Self {
            name,
            size,
            volblocksize: None,
            provisioning: Provisioning::Thick,
            properties: Vec::new(),
        }
    }
}

/// What every request about a volume needs, read in one statistics ioctl
/// without the libzfs lock ([`Zfs::volume_stats`](super::Zfs::volume_stats)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VolumeStats {
    /// `volsize` in bytes.
    pub volsize: u64,
    /// The dataset's GUID (`zfs get guid`): it stays with the volume
    /// through renames, and a new volume of the same name has another.
    pub guid: u64,
}

/// What a dataset is and holds, read in one open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatasetInfo {
    /// The dataset.
    pub name: String,
    /// Its type.
    pub kind: DatasetType,
    /// `volsize` (volumes only).
    pub volsize: Option<u64>,
    /// `volblocksize` (volumes only).
    pub volblocksize: Option<u64>,
    /// `refreservation`.
    pub refreservation: Option<u64>,
    /// `used`.
    pub used: Option<u64>,
    /// `guid`.
    pub guid: Option<u64>,
    /// `origin`: the snapshot a clone was made from.
    pub origin: Option<String>,
    /// Every user property (`module:name`) with its value, whoever set it
    /// (another driver's `democratic-csi:*` keys included).
    pub user_properties: BTreeMap<String, String>,
}

/// What [`Zfs::snapshot_info`](super::Zfs::snapshot_info) reads of a
/// snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// The snapshot.
    pub name: SnapshotName,
    /// Its `guid`: stays the same for the snapshot's life, and a snapshot
    /// destroyed and taken again under the same name gets a new one.
    pub guid: u64,
    /// `creation`, in seconds since the Unix epoch.
    pub creation: u64,
    /// `volsize` of a volume's snapshot: the volume's size when it was
    /// taken.
    pub volsize: Option<u64>,
    /// `used`: the blocks only this snapshot holds.
    pub used: u64,
    /// The clones made from it, full names.
    pub clones: Vec<String>,
    /// Whether it is marked for destruction with its last clone.
    pub defer_destroy: bool,
    /// Every user property (`module:name`) with its value.
    pub user_properties: BTreeMap<String, String>,
}

/// A pool's capacity in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolCapacity {
    /// `size`.
    pub size: u64,
    /// `free`.
    pub free: u64,
    /// `allocated`.
    pub allocated: u64,
}

/// The ZFS versions seen at open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versions {
    /// The userland library's version string, e.g. `zfs-2.3.2-2~bpo12+2`.
    pub userland: String,
    /// The kernel module's, from `/sys/module/zfs/version`, e.g.
    /// `2.3.2-2~bpo12+2`.
    pub kernel: String,
}

/// The release (`x.y.z`) in a version string such as `zfs-2.3.2-2~bpo12+2`,
/// `zfs-kmod-2.3.2-1` or `2.3.2-2`.
pub fn release_of(version: &str) -> Option<&str> {
    let v = version.trim();
    let v = v
        .strip_prefix("zfs-kmod-")
        .or_else(|| v.strip_prefix("zfs-"))
        .unwrap_or(v);
    let end = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(v.len());
    let release = v[..end].trim_end_matches('.');
    (!release.is_empty()).then_some(release)
}

/// Whether userland and kernel versions have the same release.
pub fn versions_match(userland: &str, kernel: &str) -> bool {
    match (release_of(userland), release_of(kernel)) {
        (Some(u), Some(k)) => u == k,
        _ => false,
    }
}
