//! Native ZFS: zvols, snapshots, clones, properties and pool capacity
//! through libzfs_core and libzfs, with no `zfs` or `zpool` process.
//!
//! [`Zfs`] is the entry point: open it once per process and share it
//! (`Arc<Zfs>`); it is `Send + Sync`.
//!
//! # Thread-safety
//!
//! OpenZFS's rules, enforced by the types:
//!
//! - libzfs_core is thread-safe. Creates, destroys, snapshots, clones,
//!   and existence checks issue their ioctl
//!   without any lock of ours, so many threads create at once.
//! - A libzfs handle is not thread-safe. `Zfs` keeps its one handle behind a
//!   mutex; reading properties, listing, resizing, pool capacity, and a
//!   create's property translation and thick reservation (computed from a
//!   pool handle kept for the pool's layout, no ioctl) take that mutex for
//!   the time of their libzfs calls. Dataset and pool handles opened
//!   through it borrow the locked handle and cannot escape the lock.
//! - `libzfs_init`/`libzfs_fini` rebuild process-global tables and are
//!   serialised process-wide. One `Zfs` per process is the intended use.
//!
//! # Example
//!
//! ```no_run
//! use sys::zfs::{DatasetName, Provisioning, Zfs, ZvolSpec};
//! use std::time::Duration;
//!
//! let zfs = Zfs::open()?; // checks userland against kernel module version
//! let name = DatasetName::below_pool("tank/k8s/pvc-1")?;
//! let mut spec = ZvolSpec::new(name.clone(), 1 << 30);
//! spec.provisioning = Provisioning::Sparse;
//! spec.properties.push(("compression".into(), "lz4".into()));
//! zfs.create_zvol(&spec)?;
//! let dev = zfs.wait_device(&name, Duration::from_secs(10))?;
//! println!("{} is {} bytes at {}", name, zfs.volsize(&name)?, dev.display());
//! zfs.set_volsize(&name, 2 << 30)?; // grows; a smaller size is refused
//! zfs.destroy(&name)?; // never recursive: refused while snapshots exist
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! An encrypted volume takes its raw key with the create
//! ([`Zfs::create_encrypted_zvol`]); [`Zfs::load_key`], [`Zfs::check_key`],
//! [`Zfs::unload_key`] and [`Zfs::change_key`] manage it afterwards.
mod create;
mod crypto;
mod error;
mod ffi;
mod filesystems;
pub mod floor;
mod nodes;
mod packed;
mod read;
mod snapshots;
mod types;

pub use api::names::zfs::{
    check_dataset_name, DatasetName, InvalidName, NameRule, SnapshotName, MAX_NAME_LEN,
};
pub use crypto::{KeyStatus, RawKey};
pub use error::Error;
pub use filesystems::{FilesystemSpec, FilesystemStats};
pub use types::{
    release_of, versions_match, DatasetInfo, DatasetType, PoolCapacity, Provisioning, SnapshotInfo,
    Versions, VolumeStats, ZvolSpec,
};

use create::{check_user_property, check_volume_size, translate_encryption, translate_property};
use crypto::{ENCRYPTED, ENCRYPTION_PROPERTIES};
use ffi::{cstring, Libzfs, Lzc, NvList, PoolProp, Prop, PropKind};
use std::{
    collections::BTreeMap,
    ffi::{c_int, CString},
    fmt, io,
    path::PathBuf,
    sync::{Mutex, MutexGuard},
    time::Duration,
};

/// How long [`Zfs::destroy`] retries a volume the kernel reports busy.
pub const BUSY_GRACE: Duration = Duration::from_secs(3);

/// Where the kernel module states its version.
pub const KERNEL_VERSION_FILE: &str = "/sys/module/zfs/version";

/// Errno values (Linux) the kernel answers with.
mod errno {
    pub const ENOENT: i32 = 2;
    pub const EBUSY: i32 = 16;
    pub const EEXIST: i32 = 17;
    pub const ENOSPC: i32 = 28;
}

/// Native ZFS. See the [module documentation](self) for the thread-safety
/// rules.
#[derive(Debug)]
pub struct Zfs {
    /// The libzfs handle: one thread at a time.
    libzfs: Mutex<Libzfs>,
    /// libzfs_core: any thread, no lock.
    lzc: Lzc,
    versions: Versions,
}

impl Zfs {
    /// Opens `/dev/zfs` through libzfs_core and libzfs, after checking that
    /// the userland library and the kernel module are the same release
    /// (a mismatch is [`Error::VersionMismatch`]).
    pub fn open() -> Result<Self, Error> {
        let kernel = std::fs::read_to_string(KERNEL_VERSION_FILE)
            .map_err(Error::Unavailable)?
            .trim()
            .to_owned();
        let userland = ffi::userland_version();
        if !versions_match(&userland, &kernel) {
            return Err(Error::VersionMismatch { userland, kernel });
        }
        let lzc = Lzc::init().map_err(|e| Error::Unavailable(io::Error::from_raw_os_error(e)))?;
        let libzfs = Libzfs::init().map_err(Error::Unavailable)?;
        Ok(Self {
            libzfs: Mutex::new(libzfs),
            lzc,
            versions: Versions { userland, kernel },
        })
    }

    /// The versions checked at open.
    pub fn versions(&self) -> &Versions {
        &self.versions
    }

    fn lib(&self) -> MutexGuard<'_, Libzfs> {
        // A panic while holding the lock leaves the handle usable: every
        // libzfs call is complete or not made.
        self.libzfs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` with the libzfs handle (locked) and `name` opened as one of
    /// `types`; a failed open is the error of `op` on `name`.
    fn with_open<T>(
        &self,
        name: &str,
        types: c_int,
        op: &'static str,
        f: impl FnOnce(&Libzfs, &ffi::Dataset<'_>) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let lib = self.lib();
        let d = lib
            .open(&c_string(name, name)?, types)
            .map_err(|e| open_error(name, op, e))?;
        f(&lib, &d)
    }

    /// Whether a dataset or snapshot of that name exists (libzfs_core, no
    /// lock).
    pub fn exists(&self, name: &str) -> bool {
        match CString::new(name) {
            Ok(c) => self.lzc.exists(&c),
            Err(_) => false,
        }
    }

    /// The device node of a volume, `/dev/zvol/<name>` (not waited for).
    pub fn device_path(name: &DatasetName) -> PathBuf {
        PathBuf::from(format!("/dev/zvol/{name}"))
    }

    /// Waits through udev, up to `timeout`, for the volume's device node;
    /// returns `/dev/zvol/<name>`. udev loses zvol links when many zvols
    /// appear at once: while any of its waits is in progress, the process
    /// asks udev again for a zvol whose event it handled without the link,
    /// and while the node is missing, zvol devices that udev left without their link are
    /// retriggered once its queue is empty.
    pub fn wait_device(&self, name: &DatasetName, timeout: Duration) -> Result<PathBuf, Error> {
        static WATCHING: std::sync::Once = std::sync::Once::new();
        WATCHING.call_once(|| crate::udev::watch(nodes::relink_lost));
        let _waiting = nodes::Waiting::start();
        let path = Self::device_path(name);
        match crate::udev::wait_for_node_nudging(&path, timeout, nodes::nudge_unlinked_zvols) {
            Ok(_) => Ok(path),
            Err(crate::udev::Error::Timeout { path, waited }) => Err(Error::DeviceTimeout {
                dataset: name.to_string(),
                path,
                waited,
            }),
        }
    }
}

fn c_string(ds: &str, s: &str) -> Result<CString, Error> {
    cstring(s).map_err(|_| {
        Error::Name(InvalidName {
            name: ds.to_owned(),
            rule: NameRule::InvalidCharacter {
                component: s.to_owned(),
                character: '\0',
            },
        })
    })
}

fn new_nvlist(ds: &str) -> Result<NvList, Error> {
    NvList::new().map_err(|e| kernel(ds, "allocate a property list for", e))
}

fn add_u64(nv: &mut NvList, ds: &str, key: &str, v: u64) -> Result<(), Error> {
    nv.add_u64(key, v)
        .map_err(|e| kernel(ds, "build properties of", e))
}

fn kernel(ds: &str, op: &'static str, e: c_int) -> Error {
    match e {
        errno::EBUSY => Error::Busy {
            dataset: ds.to_owned(),
            op,
        },
        errno::ENOSPC => Error::NoSpace {
            dataset: ds.to_owned(),
            op,
        },
        e => Error::Kernel {
            dataset: ds.to_owned(),
            op,
            source: io::Error::from_raw_os_error(e),
        },
    }
}

fn libzfs(ds: &str, op: &'static str, e: ffi::LibzfsError) -> Error {
    Error::Libzfs {
        dataset: ds.to_owned(),
        op,
        code: e.code,
        message: e.text,
    }
}

/// A failed `zfs_open`: a missing dataset is [`Error::NotFound`].
fn open_error(ds: &str, op: &'static str, e: ffi::LibzfsError) -> Error {
    if e.code == zfs_sys::EZFS_NOENT as i32 {
        Error::NotFound {
            dataset: ds.to_owned(),
        }
    } else {
        libzfs(ds, op, e)
    }
}

fn wrong_type(ds: &str, found: DatasetType) -> Error {
    Error::WrongType {
        dataset: ds.to_owned(),
        expected: DatasetType::Volume,
        found,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_limit_is_the_one_libzfs_was_built_with() {
        assert_eq!(MAX_NAME_LEN, zfs_sys::ZFS_MAX_DATASET_NAME_LEN as usize);
    }

    #[test]
    fn releases_are_compared_not_packaging() {
        assert_eq!(release_of("zfs-2.3.2-2~bpo12+2"), Some("2.3.2"));
        assert_eq!(release_of("zfs-kmod-2.3.2-1"), Some("2.3.2"));
        assert_eq!(release_of("2.3.2-2~bpo12+2\n"), Some("2.3.2"));
        assert_eq!(release_of("2.2.0"), Some("2.2.0"));
        assert_eq!(release_of("garbage"), None);
        assert!(versions_match("zfs-2.3.2-2~bpo12+2", "2.3.2-2~bpo12+2"));
        assert!(!versions_match("zfs-2.3.2-2", "2.2.7-1"));
        assert!(!versions_match("zfs-2.3.2-2", ""));
    }

    #[test]
    fn mismatch_message_names_both_versions() {
        let e = Error::VersionMismatch {
            userland: "zfs-2.3.2-2".into(),
            kernel: "2.2.7-1".into(),
        };
        let s = e.to_string();
        assert!(s.contains("zfs-2.3.2-2") && s.contains("2.2.7-1"), "{s}");
    }

    #[test]
    fn dependents_are_named_in_the_refusal() {
        let e = Error::HasDependents {
            dataset: "p/v".into(),
            snapshots: vec!["p/v@a".into(), "p/v@b".into()],
            children: vec![],
        };
        assert_eq!(
            e.to_string(),
            "refusing to destroy p/v: it has snapshots p/v@a, p/v@b (destroy is never recursive; remove them first)"
        );
    }

    #[test]
    fn zfs_is_send_and_sync() {
        fn both<T: Send + Sync>() {}
        both::<Zfs>();
    }
}
