//! Filesystems bounded by a `refquota`: created and mounted, their quota
//! read and grown, unmounted before they are destroyed.
//!
//! A filesystem's capacity is its `refquota`: what the filesystem itself
//! may reference. (`quota` also counts its snapshots and descendants, so a
//! snapshot would eat into what its users can write, and a full
//! filesystem could not be freed by deleting files.)
use super::*;
use create::translate_filesystem_property;

/// A filesystem to create.
#[derive(Debug, Clone)]
pub struct FilesystemSpec {
    /// The filesystem, below a pool.
    pub name: DatasetName,
    /// `refquota` in bytes: what the filesystem may hold; not 0.
    pub refquota: u64,
    /// Further properties as `zfs create -o name=value` takes them
    /// (`compression`, `recordsize`, user properties). `refquota`,
    /// `quota`, the reservations, `mountpoint`, `canmount`, `sharenfs`
    /// and `sharesmb` are not taken: the spec and its caller own them.
    pub properties: Vec<(String, String)>,
}

impl FilesystemSpec {
    /// A filesystem of `refquota` bytes with no further properties.
    pub fn new(name: DatasetName, refquota: u64) -> Self {
        Self {
            name,
            refquota,
            properties: Vec::new(),
        }
    }
}

/// What a request about a filesystem needs, read in one open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilesystemStats {
    /// `refquota` in bytes; 0 is none.
    pub refquota: u64,
    /// `referenced`: the bytes the filesystem holds now.
    pub referenced: u64,
    /// The dataset's GUID: it stays with the filesystem through renames.
    pub guid: u64,
    /// Where it is mounted, `None` when it is not.
    pub mounted_at: Option<PathBuf>,
}

impl Zfs {
    /// Creates a filesystem with its `refquota` and mounts it where its
    /// parent's `mountpoint` puts it, as `zfs create` does. Every check
    /// (name below a pool, a quota, properties known, settable on
    /// filesystems and of valid values) is made before anything is
    /// created; a filesystem that was created but cannot be mounted is
    /// destroyed again, so a failed create leaves nothing behind.
    pub fn create_filesystem(&self, spec: &FilesystemSpec) -> Result<(), Error> {
        let ds = spec.name.as_str();
        let parent = spec.name.parent().ok_or_else(|| InvalidName {
            name: ds.to_owned(),
            rule: NameRule::NotBelowPool,
        })?;
        if spec.refquota == 0 {
            return Err(Error::InvalidSize {
                dataset: ds.to_owned(),
                why: "a filesystem's refquota must not be 0 (0 is no quota at all)".into(),
            });
        }
        let c_name = c_string(ds, ds)?;
        let props = {
            let lib = self.lib();
            let mut nv = new_nvlist(ds)?;
            add_u64(&mut nv, ds, "refquota", spec.refquota)?;
            for (k, v) in &spec.properties {
                translate_filesystem_property(&lib, ds, k, v, &mut nv)?;
            }
            nv
        };
        self.lzc
            .create(&c_name, false, &props, None)
            .map_err(|e| self.create_error(ds, &parent, "create", e))?;
        if let Err(e) = self.mount(&spec.name) {
            if let Err(undo) = self.destroy(&spec.name) {
                tracing::warn!(dataset = ds, error = %undo, "could not destroy the filesystem whose mount failed");
            }
            return Err(e);
        }
        Ok(())
    }

    /// Mounts the filesystem at its `mountpoint` unless it is mounted
    /// already; returns where it is mounted. One whose `mountpoint` is
    /// `none` or `legacy` is refused: ZFS does not mount it.
    pub fn mount(&self, name: &DatasetName) -> Result<PathBuf, Error> {
        let ds = name.as_str();
        self.with_open(ds, ffi::TYPE_DATASET, "mount", |lib, d| {
            let kind = DatasetType::from_raw(d.kind());
            if kind != DatasetType::Filesystem {
                return Err(not_a_filesystem(ds, kind));
            }
            let at = mountpoint(ds, d)?;
            if d.prop_u64(Prop::MOUNTED) != Some(1) {
                d.mount(lib).map_err(|e| libzfs(ds, "mount", e))?;
            }
            Ok(at)
        })
    }

    /// Unmounts the filesystem, not forced: a mount in use is refused
    /// ([`Error::Busy`]), and stays mounted. One not mounted is left as it
    /// is.
    pub fn unmount(&self, name: &DatasetName) -> Result<(), Error> {
        let ds = name.as_str();
        self.with_open(ds, ffi::TYPE_FILESYSTEM, "unmount", |lib, d| {
            if d.prop_u64(Prop::MOUNTED) != Some(1) {
                return Ok(());
            }
            d.unmount(lib).map_err(|e| match e.code {
                ffi::EZFS_BUSY => Error::Busy {
                    dataset: ds.to_owned(),
                    op: "unmount",
                },
                _ => libzfs(ds, "unmount", e),
            })
        })
    }

    /// A filesystem's quota, size, GUID and mount; a volume is
    /// [`Error::WrongType`].
    pub fn filesystem_stats(&self, name: &DatasetName) -> Result<FilesystemStats, Error> {
        let ds = name.as_str();
        self.with_open(
            ds,
            ffi::TYPE_DATASET,
            "get filesystem statistics of",
            |_, d| {
                let kind = DatasetType::from_raw(d.kind());
                if kind != DatasetType::Filesystem {
                    return Err(not_a_filesystem(ds, kind));
                }
                let mounted_at = if d.prop_u64(Prop::MOUNTED) == Some(1) {
                    Some(mountpoint(ds, d)?)
                } else {
                    None
                };
                let missing = |what: &str| Error::Libzfs {
                    dataset: ds.to_owned(),
                    op: "get filesystem statistics of",
                    code: 0,
                    message: format!("libzfs reported no {what}"),
                };
                Ok(FilesystemStats {
                    refquota: d.prop_u64(Prop::REFQUOTA).unwrap_or(0),
                    referenced: d
                        .prop_u64(Prop::REFERENCED)
                        .ok_or_else(|| missing("referenced"))?,
                    guid: d.prop_u64(Prop::GUID).ok_or_else(|| missing("guid"))?,
                    mounted_at,
                })
            },
        )
    }

    /// The datasets directly below `name` (filesystems and volumes), by
    /// full name.
    pub fn child_datasets(&self, name: &DatasetName) -> Result<Vec<String>, Error> {
        let ds = name.as_str();
        self.with_open(ds, ffi::TYPE_DATASET, "list children of", |_, d| {
            Ok(d.children()
                .map_err(|e| kernel(ds, "list children of", e))?
                .into_iter()
                .map(|(n, _)| n)
                .collect())
        })
    }

    /// Grows a filesystem's `refquota` to `bytes`. A smaller quota than
    /// the one set is refused ([`Error::Shrink`]): filesystems, like
    /// volumes, only grow.
    pub fn set_refquota(&self, name: &DatasetName, bytes: u64) -> Result<(), Error> {
        let ds = name.as_str();
        let current = self.filesystem_stats(name)?.refquota;
        if current != 0 && bytes < current {
            return Err(Error::Shrink {
                dataset: ds.to_owned(),
                current,
                requested: bytes,
            });
        }
        if bytes == current {
            return Ok(());
        }
        self.set_property(name, "refquota", &bytes.to_string())
    }
}

/// Where `d` mounts: its `mountpoint`, refused when ZFS does not mount it.
fn mountpoint(ds: &str, d: &ffi::Dataset<'_>) -> Result<PathBuf, Error> {
    match d.prop_string(Prop::MOUNTPOINT) {
        Some(at) if at.starts_with('/') => Ok(PathBuf::from(at)),
        other => Err(Error::InvalidProperty {
            dataset: ds.to_owned(),
            property: "mountpoint".into(),
            why: format!(
                "is {:?}: ZFS does not mount this filesystem; its parent's mountpoint must be a path",
                other.unwrap_or_default()
            ),
        }),
    }
}

fn not_a_filesystem(ds: &str, found: DatasetType) -> Error {
    Error::WrongType {
        dataset: ds.to_owned(),
        expected: DatasetType::Filesystem,
        found,
    }
}
