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
mod error;
mod ffi;
mod nodes;

pub use api::names::zfs::{
    check_dataset_name, DatasetName, InvalidName, NameRule, SnapshotName, MAX_NAME_LEN,
};
pub use error::Error;

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
    fn from_raw(t: c_int) -> Self {
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

    /// Creates a volume. Every check (name below a pool, size not 0 and a
    /// multiple of the block size, block size a power of two, properties
    /// known, settable on volumes and of valid values) is made before
    /// anything is created; a failed create leaves nothing behind.
    ///
    /// The libzfs lock is held only to translate properties and, for a
    /// thick volume, compute its reservation; the create itself runs
    /// unlocked, so creates from many threads proceed at once.
    pub fn create_zvol(&self, spec: &ZvolSpec) -> Result<(), Error> {
        let ds = spec.name.as_str();
        let parent = spec.name.parent().ok_or_else(|| InvalidName {
            name: ds.to_owned(),
            rule: NameRule::NotBelowPool,
        })?;
        let c_name = c_string(ds, ds)?;
        let props = {
            let mut lib = self.lib();
            let default_bs = lib.prop_info(Prop::VOLBLOCKSIZE).default;
            check_volume_size(ds, spec.size, spec.volblocksize, default_bs)?;
            let mut nv = new_nvlist(ds)?;
            add_u64(&mut nv, ds, "volsize", spec.size)?;
            if let Some(bs) = spec.volblocksize {
                add_u64(&mut nv, ds, "volblocksize", bs)?;
            }
            for (k, v) in &spec.properties {
                translate_property(&lib, ds, k, v, &mut nv)?;
            }
            if spec.provisioning == Provisioning::Thick {
                let resv = lib
                    .volsize_to_reservation(&c_string(ds, spec.name.pool())?, spec.size, &nv)
                    .map_err(|_| Error::PoolNotFound {
                        pool: spec.name.pool().to_owned(),
                        dataset: ds.to_owned(),
                    })?;
                add_u64(&mut nv, ds, "refreservation", resv)?;
            }
            nv
        };
        self.lzc
            .create(&c_name, true, &props)
            .map_err(|e| self.create_error(ds, &parent, "create", e))
    }

    /// Maps a create's or clone's errno, telling a missing pool from a
    /// missing parent.
    fn create_error(&self, ds: &str, parent: &DatasetName, op: &'static str, e: c_int) -> Error {
        match e {
            errno::EEXIST => Error::AlreadyExists {
                dataset: ds.to_owned(),
            },
            errno::ENOENT if !self.exists(parent.pool()) => Error::PoolNotFound {
                pool: parent.pool().to_owned(),
                dataset: ds.to_owned(),
            },
            errno::ENOENT => Error::ParentNotFound {
                dataset: ds.to_owned(),
                parent: parent.to_string(),
            },
            e => kernel(ds, op, e),
        }
    }

    /// Destroys a filesystem or volume, never recursively: one with
    /// snapshots or children is refused with their names
    /// ([`Error::HasDependents`]) and nothing is destroyed.
    ///
    /// A volume the kernel reports busy is tried again for up to
    /// [`BUSY_GRACE`]: udev opens a new volume's device for a moment to
    /// probe it. Still busy after that is [`Error::Busy`].
    pub fn destroy(&self, name: &DatasetName) -> Result<(), Error> {
        let ds = name.as_str();
        let c_name = c_string(ds, ds)?;
        // The kernel refuses a dataset with snapshots (EBUSY) or children
        // (EEXIST) atomically in the destroy itself; their names are looked
        // up only then, for the refusal.
        let start = std::time::Instant::now();
        let mut pause = Duration::from_millis(20);
        loop {
            match self.lzc.destroy(&c_name) {
                Ok(()) => return Ok(()),
                Err(errno::ENOENT) => {
                    return Err(Error::NotFound {
                        dataset: ds.to_owned(),
                    })
                }
                Err(errno::EEXIST) => {
                    self.refuse_dependents(name)?;
                    return Err(kernel(ds, "destroy", errno::EEXIST));
                }
                Err(errno::EBUSY) => {
                    self.refuse_dependents(name)?;
                    // udev probes a new volume's device for a moment after
                    // it appears; a holder still there after the grace
                    // period is a real user (mount, export, open).
                    if start.elapsed() >= BUSY_GRACE {
                        return Err(Error::Busy {
                            dataset: ds.to_owned(),
                            op: "destroy",
                        });
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(250));
                }
                Err(e) => return Err(kernel(ds, "destroy", e)),
            }
        }
    }

    fn refuse_dependents(&self, name: &DatasetName) -> Result<(), Error> {
        let ds = name.as_str();
        self.with_open(ds, ffi::TYPE_DATASET, "destroy", |_, d| {
            let snapshots = d
                .snapshots()
                .map_err(|e| kernel(ds, "list snapshots of", e))?;
            let children: Vec<String> = d
                .children()
                .map_err(|e| kernel(ds, "list children of", e))?
                .into_iter()
                .map(|(n, _)| n)
                .collect();
            if snapshots.is_empty() && children.is_empty() {
                Ok(())
            } else {
                Err(Error::HasDependents {
                    dataset: ds.to_owned(),
                    snapshots,
                    children,
                })
            }
        })
    }

    /// A dataset's type, sizes, guid and user properties, in one open.
    pub fn get(&self, name: &DatasetName) -> Result<DatasetInfo, Error> {
        let ds = name.as_str();
        self.with_open(ds, ffi::TYPE_DATASET, "get", |_, d| {
            let kind = DatasetType::from_raw(d.kind());
            let vol = |p| {
                (kind == DatasetType::Volume)
                    .then(|| d.prop_u64(p))
                    .flatten()
            };
            Ok(DatasetInfo {
                name: ds.to_owned(),
                kind,
                volsize: vol(Prop::VOLSIZE),
                volblocksize: vol(Prop::VOLBLOCKSIZE),
                refreservation: d.prop_u64(Prop::REFRESERVATION),
                used: d.prop_u64(Prop::USED),
                guid: d.prop_u64(Prop::GUID),
                origin: d
                    .prop_string(Prop::ORIGIN)
                    .filter(|o| !o.is_empty() && o != "-"),
                user_properties: d.user_props().into_iter().collect(),
            })
        })
    }

    /// A dataset's type.
    pub fn dataset_type(&self, name: &DatasetName) -> Result<DatasetType, Error> {
        let ds = name.as_str();
        self.with_open(ds, ffi::TYPE_DATASET, "get type of", |_, d| {
            Ok(DatasetType::from_raw(d.kind()))
        })
    }

    /// A volume's `volsize` in bytes; a filesystem is [`Error::WrongType`].
    pub fn volsize(&self, name: &DatasetName) -> Result<u64, Error> {
        let ds = name.as_str();
        self.with_open(ds, ffi::TYPE_DATASET, "get volsize of", |_, d| {
            let kind = DatasetType::from_raw(d.kind());
            if kind != DatasetType::Volume {
                return Err(wrong_type(ds, kind));
            }
            d.prop_u64(Prop::VOLSIZE).ok_or_else(|| Error::Libzfs {
                dataset: ds.to_owned(),
                op: "get volsize of",
                code: 0,
                message: "no volsize".into(),
            })
        })
    }

    /// One property as `zfs get -Hp -o value` prints it (native, literal
    /// numbers) or a user property's value; `None` for an unset user
    /// property or a property that does not apply.
    pub fn property(&self, name: &DatasetName, property: &str) -> Result<Option<String>, Error> {
        let ds = name.as_str();
        let c_prop = cstring(property).map_err(|_| Error::InvalidProperty {
            dataset: ds.to_owned(),
            property: property.to_owned(),
            why: "contains NUL".into(),
        })?;
        self.with_open(ds, ffi::TYPE_DATASET, "get property of", |lib, d| match lib
            .prop_by_name(&c_prop)
        {
            Some(p) => Ok(d.prop_string(p)),
            None if property.contains(':') => Ok(d
                .user_props()
                .into_iter()
                .find_map(|(k, v)| (k == property).then_some(v))),
            None => Err(Error::InvalidProperty {
                dataset: ds.to_owned(),
                property: property.to_owned(),
                why: "no such property".into(),
            }),
        })
    }

    /// Sets a property as `zfs set name=value` would (libzfs translates the
    /// value); `volsize` goes through [`Zfs::set_volsize`].
    pub fn set_property(
        &self,
        name: &DatasetName,
        property: &str,
        value: &str,
    ) -> Result<(), Error> {
        let ds = name.as_str();
        if property == "volsize" {
            return Err(Error::InvalidProperty {
                dataset: ds.to_owned(),
                property: property.to_owned(),
                why: "use set_volsize, which refuses to shrink".into(),
            });
        }
        let invalid = |why: &str| Error::InvalidProperty {
            dataset: ds.to_owned(),
            property: property.to_owned(),
            why: why.to_owned(),
        };
        let c_prop = cstring(property).map_err(|_| invalid("contains NUL"))?;
        let c_value = cstring(value).map_err(|_| invalid("value contains NUL"))?;
        self.with_open(ds, ffi::TYPE_DATASET, "set property of", |lib, d| {
            d.set_prop(lib, &c_prop, &c_value)
                .map_err(|e| libzfs(ds, "set property of", e))
        })
    }

    /// Grows a volume to `new_size` bytes (a multiple of its block size).
    /// The same size is a no-op; a smaller one is [`Error::Shrink`]. A thick
    /// volume's reservation grows with it, as `zfs set volsize` does.
    pub fn set_volsize(&self, name: &DatasetName, new_size: u64) -> Result<(), Error> {
        let ds = name.as_str();
        self.with_open(ds, ffi::TYPE_DATASET, "resize", |lib, d| {
            let kind = DatasetType::from_raw(d.kind());
            if kind != DatasetType::Volume {
                return Err(wrong_type(ds, kind));
            }
            let current = d.prop_u64(Prop::VOLSIZE).unwrap_or(0);
            if new_size < current {
                return Err(Error::Shrink {
                    dataset: ds.to_owned(),
                    current,
                    requested: new_size,
                });
            }
            if new_size == current {
                return Ok(());
            }
            let bs = d.prop_u64(Prop::VOLBLOCKSIZE).unwrap_or(1);
            check_volume_size(ds, new_size, Some(bs), bs)?;
            let value = c_string(ds, &new_size.to_string())?;
            d.set_prop(lib, c"volsize", &value)
                .map_err(|e| libzfs(ds, "resize", e))
        })
    }

    /// The volumes exactly one level below `parent` (not deeper, no
    /// filesystems), sorted by name. ZFS also allows a space in names; a
    /// volume whose name breaks [`check_dataset_name`] is left out, as
    /// nothing here can manage it.
    pub fn list_zvols(&self, parent: &DatasetName) -> Result<Vec<DatasetName>, Error> {
        let ds = parent.as_str();
        self.with_open(ds, ffi::TYPE_DATASET, "list", |_, d| {
            let mut out: Vec<DatasetName> = d
                .children()
                .map_err(|e| kernel(ds, "list", e))?
                .into_iter()
                .filter(|(_, t)| *t == ffi::TYPE_VOLUME)
                .filter_map(|(child, _)| DatasetName::new(&child).ok())
                .collect();
            out.sort();
            Ok(out)
        })
    }

    /// The snapshots of a dataset, sorted by name (those whose names break
    /// the naming rules left out; [`Zfs::destroy`] still names them all).
    pub fn snapshots(&self, name: &DatasetName) -> Result<Vec<SnapshotName>, Error> {
        let ds = name.as_str();
        self.with_open(ds, ffi::TYPE_DATASET, "list snapshots of", |_, d| {
            let mut out: Vec<SnapshotName> = d
                .snapshots()
                .map_err(|e| kernel(ds, "list snapshots of", e))?
                .iter()
                .filter_map(|s| SnapshotName::new(s).ok())
                .collect();
            out.sort();
            Ok(out)
        })
    }

    /// A pool's size, free and allocated bytes.
    pub fn pool_capacity(&self, pool: &str) -> Result<PoolCapacity, Error> {
        let lib = self.lib();
        let p = lib
            .open_pool(&c_string(pool, pool)?)
            .map_err(|_| Error::PoolNotFound {
                pool: pool.to_owned(),
                dataset: pool.to_owned(),
            })?;
        Ok(PoolCapacity {
            size: p.prop_u64(PoolProp::Size),
            free: p.prop_u64(PoolProp::Free),
            allocated: p.prop_u64(PoolProp::Allocated),
        })
    }

    /// Takes a snapshot, with optional user properties (`module:name`).
    pub fn snapshot(
        &self,
        snap: &SnapshotName,
        user_properties: &[(String, String)],
    ) -> Result<(), Error> {
        let s = snap.as_str();
        let mut snaps = new_nvlist(s)?;
        snaps.add_boolean(s).map_err(|e| kernel(s, "snapshot", e))?;
        let mut props = new_nvlist(s)?;
        for (k, v) in user_properties {
            check_user_property(s, k, v)?;
            props
                .add_string(k, v)
                .map_err(|e| kernel(s, "snapshot", e))?;
        }
        self.lzc.snapshot(&snaps, &props).map_err(|(e, errs)| {
            let e = errs.first().map(|(_, e)| *e).unwrap_or(e);
            match e {
                errno::EEXIST => Error::AlreadyExists {
                    dataset: s.to_owned(),
                },
                errno::ENOENT => Error::NotFound {
                    dataset: snap.dataset().to_string(),
                },
                errno::ENOSPC => Error::NoSpace {
                    dataset: s.to_owned(),
                    op: "snapshot",
                },
                e => kernel(s, "snapshot", e),
            }
        })
    }

    /// Clones `origin` as `target` (sparse: no reservation), with further
    /// properties as in [`ZvolSpec::properties`].
    pub fn clone_snapshot(
        &self,
        origin: &SnapshotName,
        target: &DatasetName,
        properties: &[(String, String)],
    ) -> Result<(), Error> {
        let ds = target.as_str();
        let parent = target.parent().ok_or_else(|| InvalidName {
            name: ds.to_owned(),
            rule: NameRule::NotBelowPool,
        })?;
        let props = {
            let lib = self.lib();
            let mut nv = new_nvlist(ds)?;
            for (k, v) in properties {
                translate_property(&lib, ds, k, v, &mut nv)?;
            }
            nv
        };
        let c_origin = c_string(origin.as_str(), origin.as_str())?;
        self.lzc
            .clone(&c_string(ds, ds)?, &c_origin, &props)
            .map_err(|e| match e {
                errno::ENOENT if !self.exists(origin.as_str()) => Error::NotFound {
                    dataset: origin.to_string(),
                },
                e => self.create_error(ds, &parent, "clone", e),
            })
    }

    /// Destroys a snapshot; one that clones depend on is refused with their
    /// names ([`Error::HasClones`]) and kept.
    pub fn destroy_snapshot(&self, snap: &SnapshotName) -> Result<(), Error> {
        let s = snap.as_str();
        let clones = self.clones_of(snap)?;
        if !clones.is_empty() {
            return Err(Error::HasClones {
                snapshot: s.to_owned(),
                clones,
            });
        }
        let mut snaps = new_nvlist(s)?;
        snaps.add_boolean(s).map_err(|e| kernel(s, "destroy", e))?;
        self.lzc.destroy_snaps(&snaps).map_err(|(e, errs)| {
            match errs.first().map(|(_, e)| *e).unwrap_or(e) {
                errno::EEXIST => Error::HasClones {
                    snapshot: s.to_owned(),
                    clones: self.clones_of(snap).unwrap_or_default(),
                },
                errno::EBUSY => Error::Busy {
                    dataset: s.to_owned(),
                    op: "destroy (held)",
                },
                e => kernel(s, "destroy", e),
            }
        })
    }

    /// The clones of a snapshot (its `clones` property).
    fn clones_of(&self, snap: &SnapshotName) -> Result<Vec<String>, Error> {
        let s = snap.as_str();
        self.with_open(s, ffi::TYPE_SNAPSHOT, "destroy", |_, d| {
            Ok(d.prop_string(Prop::CLONES)
                .map(|c| {
                    c.split(',')
                        .filter(|x| !x.is_empty())
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default())
        })
    }

    /// The device node of a volume, `/dev/zvol/<name>` (not waited for).
    pub fn device_path(name: &DatasetName) -> PathBuf {
        PathBuf::from(format!("/dev/zvol/{name}"))
    }

    /// Waits through udev, up to `timeout`, for the volume's device node;
    /// returns `/dev/zvol/<name>`. While it is missing, zvol devices that
    /// udev left without their link are retriggered (udev loses events when
    /// many zvols appear at once).
    pub fn wait_device(&self, name: &DatasetName, timeout: Duration) -> Result<PathBuf, Error> {
        let path = Self::device_path(name);
        match crate::udev::wait_for_node_nudging(&path, timeout, nodes::nudge_unlinked_zvols) {
            Ok(_) => Ok(path),
            Err(crate::udev::Error::Timeout { path, waited }) => Err(Error::DeviceTimeout {
                dataset: name.to_string(),
                path,
                waited,
            }),
            Err(source) => Err(Error::Udev {
                dataset: name.to_string(),
                source,
            }),
        }
    }
}

/// The volume size checks `zfs create -V` makes, on our side first: not 0,
/// block size a power of two from 512 bytes to 16 MiB, size a multiple of
/// it.
pub(crate) fn check_volume_size(
    ds: &str,
    size: u64,
    volblocksize: Option<u64>,
    default_bs: u64,
) -> Result<(), Error> {
    let invalid = |why: String| Error::InvalidSize {
        dataset: ds.to_owned(),
        why,
    };
    if size == 0 {
        return Err(invalid("size 0: a volume needs a size".into()));
    }
    let bs = volblocksize.unwrap_or(default_bs);
    if !bs.is_power_of_two() || !(512..=16 << 20).contains(&bs) {
        return Err(invalid(format!(
            "volblocksize {bs} is not a power of two from 512 bytes to 16 MiB"
        )));
    }
    if !size.is_multiple_of(bs) {
        return Err(invalid(format!(
            "size {size} is not a multiple of volblocksize {bs}{}",
            if volblocksize.is_none() {
                " (the default)"
            } else {
                ""
            }
        )));
    }
    Ok(())
}

/// Adds `name=value` to a creation list in the kernel's form: index
/// properties as their numbers, numeric ones parsed (`8K`, `none`), string
/// and user properties as strings. Refuses unknown, read-only and
/// non-volume properties, and those the spec's fields own.
fn translate_property(
    lib: &Libzfs,
    ds: &str,
    name: &str,
    value: &str,
    nv: &mut NvList,
) -> Result<(), Error> {
    let invalid = |why: String| Error::InvalidProperty {
        dataset: ds.to_owned(),
        property: name.to_owned(),
        why,
    };
    let c_name = cstring(name).map_err(|_| invalid("contains NUL".into()))?;
    let c_value = cstring(value).map_err(|_| invalid("value contains NUL".into()))?;
    let Some(prop) = lib.prop_by_name(&c_name) else {
        if name.contains(':') {
            if !lib.is_user_prop(&c_name) {
                return Err(invalid(
                    "not a valid user property name (lowercase letters, digits, - _ . : with a ':')".into(),
                ));
            }
            check_user_property(ds, name, value)?;
            return nv
                .add_string(name, value)
                .map_err(|e| kernel(ds, "create", e));
        }
        return Err(invalid("no such property".into()));
    };
    let info = lib.prop_info(prop);
    if matches!(
        info.name.as_str(),
        "volsize" | "volblocksize" | "refreservation" | "reservation"
    ) {
        return Err(invalid(format!(
            "{} follows from the size, block size and provisioning",
            info.name
        )));
    }
    if info.readonly {
        return Err(invalid("read-only".into()));
    }
    if !info.valid_for_volume {
        return Err(invalid("does not apply to volumes".into()));
    }
    match info.kind {
        PropKind::String => nv.add_string(&info.name, value),
        PropKind::Index => {
            let Some(i) = lib.prop_index(prop, &c_value) else {
                return Err(invalid(format!(
                    "{value:?} is not a value of {}",
                    info.name
                )));
            };
            nv.add_u64(&info.name, i)
        }
        PropKind::Number => {
            let n = if value == "none" {
                Some(0)
            } else {
                lib.parse_number(&c_value)
            };
            let Some(n) = n else {
                return Err(invalid(format!("{value:?} is not a number")));
            };
            nv.add_u64(&info.name, n)
        }
    }
    .map_err(|e| kernel(ds, "create", e))
}

/// User property rules ZFS enforces: name under 256 bytes, value under
/// `ZFS_MAXPROPLEN`.
fn check_user_property(ds: &str, name: &str, value: &str) -> Result<(), Error> {
    let invalid = |why: String| Error::InvalidProperty {
        dataset: ds.to_owned(),
        property: name.to_owned(),
        why,
    };
    if !name.contains(':') {
        return Err(invalid("a user property name needs a ':'".into()));
    }
    if name.len() >= 256 {
        return Err(invalid(format!(
            "name is {} bytes, at most 255",
            name.len()
        )));
    }
    if value.len() >= zfs_sys::ZFS_MAXPROPLEN as usize {
        return Err(invalid(format!(
            "value is {} bytes, at most {}",
            value.len(),
            zfs_sys::ZFS_MAXPROPLEN - 1
        )));
    }
    Ok(())
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
    fn volume_sizes_are_checked_before_any_call() {
        let default = 16384;
        assert!(check_volume_size("p/v", 1 << 30, None, default).is_ok());
        assert!(check_volume_size("p/v", 8192, Some(8192), default).is_ok());
        let zero = check_volume_size("p/v", 0, None, default).expect_err("must be refused");
        assert!(matches!(zero, Error::InvalidSize { .. }));
        assert!(zero.to_string().contains("p/v") && zero.to_string().contains("size 0"));
        let odd = check_volume_size("p/v", 8192, None, default).expect_err("must be refused");
        assert!(
            odd.to_string()
                .contains("not a multiple of volblocksize 16384 (the default)"),
            "{odd}"
        );
        let odd =
            check_volume_size("p/v", 3 * 4096, Some(8192), default).expect_err("must be refused");
        assert!(
            odd.to_string()
                .contains("not a multiple of volblocksize 8192"),
            "{odd}"
        );
        for bs in [0, 256, 3000, 32 << 20] {
            assert!(
                check_volume_size("p/v", 1 << 30, Some(bs), default).is_err(),
                "{bs}"
            );
        }
    }

    #[test]
    fn user_property_limits() {
        assert!(check_user_property("p/v", "democratic-csi:x", "y").is_ok());
        assert!(check_user_property("p/v", "nocolon", "y").is_err());
        assert!(check_user_property("p/v", &format!("a:{}", "b".repeat(300)), "y").is_err());
        assert!(check_user_property("p/v", "a:b", &"v".repeat(9000)).is_err());
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
