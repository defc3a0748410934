//! Errors of `sys::zfs`: each names the dataset (or pool) and the cause.
use api::names::zfs::InvalidName;
use std::{io, path::PathBuf, time::Duration};

/// An error from a ZFS operation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A name broke a naming rule; nothing was tried.
    #[error(transparent)]
    Name(#[from] InvalidName),
    /// `/dev/zfs` could not be opened (module not loaded, or no permission).
    #[error("cannot open /dev/zfs (is the zfs module loaded?): {0}")]
    Unavailable(#[source] io::Error),
    /// The ZFS userland library and the kernel module differ in version.
    #[error(
        "ZFS userland {userland} does not match kernel module {kernel} (/sys/module/zfs/version); \
         install matching zfsutils/libzfs and zfs-dkms (or reboot into the new module)"
    )]
    VersionMismatch {
        /// The userland library's version (`zfs_version_userland`).
        userland: String,
        /// The kernel module's version (`/sys/module/zfs/version`).
        kernel: String,
    },
    /// A size is not acceptable for the volume; nothing was created or
    /// changed.
    #[error("volume {dataset}: {why}")]
    InvalidSize {
        /// The volume.
        dataset: String,
        /// What is wrong with the size.
        why: String,
    },
    /// A property name or value is not acceptable; nothing was created or
    /// changed.
    #[error("dataset {dataset}: property {property:?}: {why}")]
    InvalidProperty {
        /// The dataset.
        dataset: String,
        /// The property as given.
        property: String,
        /// What is wrong with it.
        why: String,
    },
    /// The dataset (or snapshot) does not exist.
    #[error("dataset {dataset} does not exist")]
    NotFound {
        /// The dataset.
        dataset: String,
    },
    /// The pool does not exist (or is not imported).
    #[error("pool {pool} does not exist (dataset {dataset})")]
    PoolNotFound {
        /// The pool.
        pool: String,
        /// The dataset the operation was for.
        dataset: String,
    },
    /// The parent dataset of a dataset to create does not exist.
    #[error("cannot create {dataset}: parent {parent} does not exist")]
    ParentNotFound {
        /// The dataset to create.
        dataset: String,
        /// Its missing parent.
        parent: String,
    },
    /// A dataset of that name already exists; it was left as it is.
    #[error("dataset {dataset} already exists")]
    AlreadyExists {
        /// The dataset.
        dataset: String,
    },
    /// The dataset is of another type than the operation needs.
    #[error("dataset {dataset} is a {found}, not a {expected}")]
    WrongType {
        /// The dataset.
        dataset: String,
        /// The type needed.
        expected: super::DatasetType,
        /// The type it has.
        found: super::DatasetType,
    },
    /// Destroy refused: the dataset has snapshots or children, and destroy
    /// is never recursive. Nothing was destroyed.
    #[error(
        "refusing to destroy {dataset}: it has {} (destroy is never recursive; remove them first)",
        describe_dependents(snapshots, children)
    )]
    HasDependents {
        /// The dataset.
        dataset: String,
        /// Its snapshots, full names.
        snapshots: Vec<String>,
        /// Its child datasets, full names.
        children: Vec<String>,
    },
    /// Destroy of a snapshot refused: clones depend on it.
    #[error("refusing to destroy snapshot {snapshot}: clones depend on it: {}", clones.join(", "))]
    HasClones {
        /// The snapshot.
        snapshot: String,
        /// The clones, full names.
        clones: Vec<String>,
    },
    /// Shrinking a volume is refused: it would cut off data.
    #[error(
        "refusing to shrink volume {dataset} from {current} to {requested} bytes (volumes only grow)"
    )]
    Shrink {
        /// The volume.
        dataset: String,
        /// Its volsize now.
        current: u64,
        /// The smaller size asked for.
        requested: u64,
    },
    /// The key given is not the encrypted dataset's key; nothing was
    /// loaded or changed.
    #[error(
        "the key given for {dataset} does not open it (EACCES): nothing was loaded or changed"
    )]
    WrongKey {
        /// The dataset.
        dataset: String,
    },
    /// A change of key needs the dataset's current key loaded.
    #[error("the key of {dataset} is not loaded: load it before changing it")]
    KeyNotLoaded {
        /// The dataset.
        dataset: String,
    },
    /// The dataset is busy (open, mounted or exported).
    #[error("dataset {dataset} is busy: {op} refused (EBUSY): it is open, mounted or exported")]
    Busy {
        /// The dataset.
        dataset: String,
        /// The operation.
        op: &'static str,
    },
    /// The pool has no room.
    #[error("{op} {dataset}: out of space in the pool (ENOSPC)")]
    NoSpace {
        /// The dataset.
        dataset: String,
        /// The operation.
        op: &'static str,
    },
    /// The kernel refused an ioctl with an errno not mapped above.
    #[error("{op} {dataset}: {source}")]
    Kernel {
        /// The dataset.
        dataset: String,
        /// The operation.
        op: &'static str,
        /// The errno as an OS error.
        #[source]
        source: io::Error,
    },
    /// libzfs refused an operation; its own message is kept.
    #[error("{op} {dataset}: {message} (libzfs error {code})")]
    Libzfs {
        /// The dataset or pool.
        dataset: String,
        /// The operation.
        op: &'static str,
        /// libzfs's error code (`EZFS_*`).
        code: i32,
        /// libzfs's action and description.
        message: String,
    },
    /// The device node of a volume did not appear in time.
    #[error("device {} of volume {dataset} did not appear within {waited:?}", path.display())]
    DeviceTimeout {
        /// The volume.
        dataset: String,
        /// The node waited for.
        path: PathBuf,
        /// How long we waited.
        waited: Duration,
    },
}

fn describe_dependents(snapshots: &[String], children: &[String]) -> String {
    let mut parts = Vec::new();
    if !snapshots.is_empty() {
        parts.push(format!("snapshots {}", snapshots.join(", ")));
    }
    if !children.is_empty() {
        parts.push(format!("children {}", children.join(", ")));
    }
    parts.join(" and ")
}
