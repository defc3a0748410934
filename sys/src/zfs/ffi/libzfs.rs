//! The libzfs handle ([`Libzfs`]): opening datasets and pools, property
//! tables, errors recorded on the handle, the per-pool layout cache.
use super::*;

/// An error libzfs recorded on its handle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LibzfsError {
    /// `libzfs_errno` (an `EZFS_*` value).
    pub code: c_int,
    /// `libzfs_error_action: libzfs_error_description`.
    pub text: String,
}

/// How long a pool handle kept for its layout is reused before it is
/// opened again (a pool's vdev layout rarely changes).
pub(crate) const POOL_LAYOUT_TTL: Duration = Duration::from_secs(30);

/// The libzfs handle. Not thread-safe: `Send`, not `Sync`.
///
/// It keeps one pool handle per pool for the pool's layout, which the
/// reservation of a thick volume depends on, so that creates do not pay a
/// pool open each; those handles are reopened after [`POOL_LAYOUT_TTL`] and
/// closed before the libzfs handle.
#[derive(Debug)]
pub(crate) struct Libzfs {
    ptr: NonNull<z::libzfs_handle_t>,
    layouts: HashMap<String, (NonNull<z::zpool_handle_t>, Instant)>,
}

// SAFETY: a libzfs handle may be used from any thread as long as one thread
// uses it at a time; Libzfs is not Sync, and the safe API keeps it in a Mutex.
unsafe impl Send for Libzfs {}

/// Dataset types for `zfs_open`.
pub(crate) const TYPE_FILESYSTEM: c_int = z::ZFS_TYPE_FILESYSTEM as c_int;
pub(crate) const TYPE_SNAPSHOT: c_int = z::ZFS_TYPE_SNAPSHOT as c_int;
pub(crate) const TYPE_VOLUME: c_int = z::ZFS_TYPE_VOLUME as c_int;
/// A filesystem or a volume (not a snapshot), for `zfs_open`.
pub(crate) const TYPE_DATASET: c_int = TYPE_FILESYSTEM | TYPE_VOLUME;
/// libzfs's "pool or dataset is busy".
pub(crate) const EZFS_BUSY: i32 = z::EZFS_BUSY as i32;

impl Libzfs {
    /// `libzfs_init`; on failure the OS error it left in errno.
    pub fn init() -> Result<Self, std::io::Error> {
        let _g = INIT_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: no arguments; serialised with other inits and finis.
        let p = unsafe { z::libzfs_init() };
        let err = std::io::Error::last_os_error();
        NonNull::new(p)
            .map(|ptr| Libzfs {
                ptr,
                layouts: HashMap::new(),
            })
            .ok_or(err)
    }

    fn ptr(&self) -> *mut z::libzfs_handle_t {
        self.ptr.as_ptr()
    }

    /// The refreservation a thick volume of `volsize` needs in `pool`, as
    /// `zfs create -V` computes it (`zvol_volsize_to_reservation`), given
    /// the kernel-form creation properties (volblocksize, copies).
    pub fn volsize_to_reservation(
        &mut self,
        pool: &CStr,
        volsize: u64,
        props: &NvList,
    ) -> Result<u64, LibzfsError> {
        let key = pool.to_string_lossy().into_owned();
        if let Some((p, at)) = self.layouts.get(&key).copied() {
            if at.elapsed() < POOL_LAYOUT_TTL {
                // SAFETY: a live pool handle of this libzfs handle; the
                // list is live; both only read.
                return Ok(unsafe {
                    z::zvol_volsize_to_reservation(p.as_ptr(), volsize, props.as_ptr())
                });
            }
            self.layouts.remove(&key);
            // SAFETY: the handle was ours and is closed once, here.
            unsafe { z::zpool_close(p.as_ptr()) };
        }
        // SAFETY: live handle, NUL-terminated name; the result is a new
        // pool handle kept in `layouts` and closed on expiry or in Drop.
        let p = unsafe { z::zpool_open(self.ptr(), pool.as_ptr()) };
        let p = NonNull::new(p).ok_or_else(|| self.last_error())?;
        self.layouts.insert(key, (p, Instant::now()));
        // SAFETY: as above.
        Ok(unsafe { z::zvol_volsize_to_reservation(p.as_ptr(), volsize, props.as_ptr()) })
    }

    /// The error of the last failed call on this handle.
    pub(super) fn last_error(&self) -> LibzfsError {
        // SAFETY: the handle is live; the strings it returns live in the
        // handle until its next call and are copied at once.
        unsafe {
            let action = owned(z::libzfs_error_action(self.ptr()));
            let description = owned(z::libzfs_error_description(self.ptr()));
            LibzfsError {
                code: z::libzfs_errno(self.ptr()),
                text: if action.is_empty() {
                    description
                } else {
                    format!("{action}: {description}")
                },
            }
        }
    }

    /// `zfs_open` of a dataset of one of `types`.
    pub fn open(&self, name: &CStr, types: c_int) -> Result<Dataset<'_>, LibzfsError> {
        // SAFETY: live handle, NUL-terminated name; the result is a new
        // handle we own (closed in Dataset's Drop) or NULL.
        let p = unsafe { z::zfs_open(self.ptr(), name.as_ptr(), types) };
        NonNull::new(p)
            .map(|p| Dataset(p, PhantomData))
            .ok_or_else(|| self.last_error())
    }

    /// `zpool_open`.
    pub fn open_pool(&self, name: &CStr) -> Result<Pool<'_>, LibzfsError> {
        // SAFETY: as `open`; closed in Pool's Drop.
        let p = unsafe { z::zpool_open(self.ptr(), name.as_ptr()) };
        NonNull::new(p)
            .map(|p| Pool(p, PhantomData))
            .ok_or_else(|| self.last_error())
    }

    /// The property table entry named `name` (aliases such as `compress`
    /// included), `None` for an unknown name or a user property.
    pub fn prop_by_name(&self, name: &CStr) -> Option<Prop> {
        // SAFETY: the tables were built by libzfs_init of this live handle;
        // the name is only read.
        let p = unsafe { z::zfs_name_to_prop(name.as_ptr()) };
        (p != z::ZPROP_INVAL).then_some(Prop(p))
    }

    /// Whether `name` is a valid user property name (`module:property`).
    pub fn is_user_prop(&self, name: &CStr) -> bool {
        // SAFETY: only reads the name.
        unsafe { z::zfs_prop_user(name.as_ptr()) != z::B_FALSE }
    }

    /// What the property table says of `prop`.
    pub fn prop_info(&self, prop: Prop) -> PropInfo {
        // SAFETY: prop came from the table; these calls only read it, and
        // zfs_prop_to_name returns a static string.
        unsafe {
            PropInfo {
                name: owned(z::zfs_prop_to_name(prop.0)),
                kind: match z::zfs_prop_get_type(prop.0) {
                    z::PROP_TYPE_NUMBER => PropKind::Number,
                    z::PROP_TYPE_INDEX => PropKind::Index,
                    _ => PropKind::String,
                },
                readonly: z::zfs_prop_readonly(prop.0) != z::B_FALSE,
                valid_for_volume: z::zfs_prop_valid_for_type(
                    prop.0,
                    z::ZFS_TYPE_VOLUME,
                    z::B_FALSE,
                ) != z::B_FALSE,
                valid_for_filesystem: z::zfs_prop_valid_for_type(
                    prop.0,
                    z::ZFS_TYPE_FILESYSTEM,
                    z::B_FALSE,
                ) != z::B_FALSE,
                default: z::zfs_prop_default_numeric(prop.0),
            }
        }
    }

    /// The index value of `value` for an index property (`lz4` for
    /// `compression`, ...).
    pub fn prop_index(&self, prop: Prop, value: &CStr) -> Option<u64> {
        let mut v = 0u64;
        // SAFETY: reads the table and the value; writes v.
        let rc = unsafe { z::zfs_prop_string_to_index(prop.0, value.as_ptr(), &mut v) };
        (rc == 0).then_some(v)
    }

    /// A number as ZFS reads it (`8K`, `1G`, `512`).
    pub fn parse_number(&self, value: &CStr) -> Option<u64> {
        let mut v = 0u64;
        // SAFETY: a NULL handle makes zfs_nicestrtonum report nothing; it
        // reads the value and writes v.
        let rc = unsafe { z::zfs_nicestrtonum(ptr::null_mut(), value.as_ptr(), &mut v) };
        (rc == 0).then_some(v)
    }
}

impl Drop for Libzfs {
    fn drop(&mut self) {
        for (_, (p, _)) in self.layouts.drain() {
            // SAFETY: kept pool handles are ours, closed once, before fini.
            unsafe { z::zpool_close(p.as_ptr()) };
        }
        let _g = INIT_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: every Dataset and Pool borrowed this handle and is gone;
        // freed once.
        unsafe { z::libzfs_fini(self.ptr()) }
    }
}

/// A property of the table (`zfs_prop_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Prop(pub(super) z::zfs_prop_t);

impl Prop {
    pub const VOLSIZE: Prop = Prop(z::ZFS_PROP_VOLSIZE);
    pub const VOLBLOCKSIZE: Prop = Prop(z::ZFS_PROP_VOLBLOCKSIZE);
    pub const REFRESERVATION: Prop = Prop(z::ZFS_PROP_REFRESERVATION);
    pub const USED: Prop = Prop(z::ZFS_PROP_USED);
    pub const GUID: Prop = Prop(z::ZFS_PROP_GUID);
    pub const CLONES: Prop = Prop(z::ZFS_PROP_CLONES);
    pub const ORIGIN: Prop = Prop(z::ZFS_PROP_ORIGIN);
    pub const CREATION: Prop = Prop(z::ZFS_PROP_CREATION);
    pub const DEFER_DESTROY: Prop = Prop(z::ZFS_PROP_DEFER_DESTROY);
    pub const REFQUOTA: Prop = Prop(z::ZFS_PROP_REFQUOTA);
    pub const REFERENCED: Prop = Prop(z::ZFS_PROP_REFERENCED);
    pub const MOUNTED: Prop = Prop(z::ZFS_PROP_MOUNTED);
    pub const MOUNTPOINT: Prop = Prop(z::ZFS_PROP_MOUNTPOINT);
}

/// The kind of a property's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PropKind {
    Number,
    String,
    Index,
}

/// A property table entry.
#[derive(Debug, Clone)]
pub(crate) struct PropInfo {
    pub name: String,
    pub kind: PropKind,
    pub readonly: bool,
    pub valid_for_volume: bool,
    pub valid_for_filesystem: bool,
    pub default: u64,
}
