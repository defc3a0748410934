//! The only unsafe code of `sys::zfs`: one RAII type per C object, each
//! freeing its object exactly once, and the thread-safety rules of OpenZFS
//! carried by the types.
//!
//! - [`Lzc`] is a reference on libzfs_core's global `/dev/zfs` descriptor.
//!   libzfs_core is thread-safe: `Lzc` is `Send + Sync` and its calls may run
//!   from many threads at once.
//! - [`Libzfs`] owns a `libzfs_handle_t`, which is NOT thread-safe: it is
//!   `Send` (usable from any one thread at a time) but not `Sync`. The safe
//!   API keeps it behind a mutex.
//! - [`Dataset`] and [`Pool`] own a `zfs_handle_t` / `zpool_handle_t` opened
//!   through a `Libzfs` and borrow it, so they cannot outlive it or leave the
//!   thread that holds it (a `&Libzfs` is not `Send`).
//! - [`NvList`] owns an `nvlist_t`; [`NvListRef`] borrows one owned by a C
//!   object.
#![allow(unsafe_code)]

use std::{
    collections::HashMap,
    ffi::{c_char, c_int, c_void, CStr, CString},
    marker::PhantomData,
    ptr::{self, NonNull},
    sync::Mutex,
    time::{Duration, Instant},
};
use zfs_sys as z;

/// libzfs_init and libzfs_fini (re)build process-global tables; serialise them.
static INIT_LOCK: Mutex<()> = Mutex::new(());

/// A `CString` from a Rust string; a NUL inside gives `EINVAL`.
pub(crate) fn cstring(s: &str) -> Result<CString, c_int> {
    CString::new(s).map_err(|_| EINVAL)
}

/// `EINVAL` (Linux).
pub(crate) const EINVAL: c_int = 22;

/// Copies a C string the library owns.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string alive for this call.
unsafe fn owned(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: non-NULL and NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// A reference on libzfs_core, released on drop.
#[derive(Debug)]
pub(crate) struct Lzc(());

impl Lzc {
    /// `libzfs_core_init`: opens `/dev/zfs` (once per process, counted).
    pub fn init() -> Result<Self, c_int> {
        // SAFETY: libzfs_core_init takes no arguments, is thread-safe and
        // reference-counted; each success is paired with one fini in Drop.
        let rc = unsafe { z::libzfs_core_init() };
        if rc == 0 {
            Ok(Lzc(()))
        } else {
            Err(rc)
        }
    }

    /// `lzc_create` of a volume (or filesystem) with kernel-form properties.
    pub fn create(&self, name: &CStr, zvol: bool, props: &NvList) -> Result<(), c_int> {
        let kind = if zvol {
            z::LZC_DATSET_TYPE_ZVOL
        } else {
            z::LZC_DATSET_TYPE_ZFS
        };
        // SAFETY: name is NUL-terminated; props is a live nvlist that
        // lzc_create only reads (it copies it into the ioctl's arguments);
        // no wrapping key (NULL, 0).
        errno(unsafe { z::lzc_create(name.as_ptr(), kind, props.as_ptr(), ptr::null_mut(), 0) })
    }

    /// `lzc_destroy` of a filesystem or volume (never recursive).
    pub fn destroy(&self, name: &CStr) -> Result<(), c_int> {
        // SAFETY: name is NUL-terminated and only read.
        errno(unsafe { z::lzc_destroy(name.as_ptr()) })
    }

    /// `lzc_exists`.
    pub fn exists(&self, name: &CStr) -> bool {
        // SAFETY: name is NUL-terminated and only read.
        unsafe { z::lzc_exists(name.as_ptr()) != z::B_FALSE }
    }

    /// `lzc_snapshot` of the snapshots named as keys of `snaps`; on failure
    /// the errno and the per-snapshot errors.
    pub fn snapshot(
        &self,
        snaps: &NvList,
        props: &NvList,
    ) -> Result<(), (c_int, Vec<(String, i32)>)> {
        let mut errlist: *mut z::nvlist_t = ptr::null_mut();
        // SAFETY: both lists are live and only read; errlist receives a new
        // list (or stays NULL) that we own and free through NvList.
        let rc = unsafe { z::lzc_snapshot(snaps.as_ptr(), props.as_ptr(), &mut errlist) };
        // SAFETY: errlist is NULL or a list allocated for us.
        let errs = unsafe { NvList::from_raw(errlist) }
            .map(|l| l.as_ref().int32_entries())
            .unwrap_or_default();
        if rc == 0 {
            Ok(())
        } else {
            Err((rc, errs))
        }
    }

    /// `lzc_clone` of `origin` (a snapshot) as `name`.
    pub fn clone(&self, name: &CStr, origin: &CStr, props: &NvList) -> Result<(), c_int> {
        // SAFETY: names are NUL-terminated; props is live and only read.
        errno(unsafe { z::lzc_clone(name.as_ptr(), origin.as_ptr(), props.as_ptr()) })
    }

    /// `lzc_destroy_snaps` (not deferred) of the snapshots named as keys of
    /// `snaps`; on failure the errno and the per-snapshot errors.
    pub fn destroy_snaps(&self, snaps: &NvList) -> Result<(), (c_int, Vec<(String, i32)>)> {
        let mut errlist: *mut z::nvlist_t = ptr::null_mut();
        // SAFETY: snaps is live and only read; errlist as in `snapshot`.
        let rc = unsafe { z::lzc_destroy_snaps(snaps.as_ptr(), z::B_FALSE, &mut errlist) };
        // SAFETY: errlist is NULL or a list allocated for us.
        let errs = unsafe { NvList::from_raw(errlist) }
            .map(|l| l.as_ref().int32_entries())
            .unwrap_or_default();
        if rc == 0 {
            Ok(())
        } else {
            Err((rc, errs))
        }
    }
}

impl Drop for Lzc {
    fn drop(&mut self) {
        // SAFETY: pairs the successful libzfs_core_init of `Lzc::init`.
        unsafe { z::libzfs_core_fini() }
    }
}

fn errno(rc: c_int) -> Result<(), c_int> {
    if rc == 0 {
        Ok(())
    } else {
        Err(rc)
    }
}

/// An owned `nvlist_t`, freed on drop.
#[derive(Debug)]
pub(crate) struct NvList(NonNull<z::nvlist_t>);

// SAFETY: the list is owned, never shared; moving it between threads is fine
// (libnvpair keeps no per-thread state). It is not Sync: nvlists are not
// synchronised.
unsafe impl Send for NvList {}

impl NvList {
    /// A new empty list with unique names.
    pub fn new() -> Result<Self, c_int> {
        let mut p: *mut z::nvlist_t = ptr::null_mut();
        // SAFETY: p receives a newly allocated list on success.
        let rc = unsafe { z::nvlist_alloc(&mut p, z::NV_UNIQUE_NAME, 0) };
        errno(rc)?;
        NonNull::new(p).map(NvList).ok_or(EINVAL)
    }

    /// Takes ownership of `p` (NULL gives `None`).
    ///
    /// # Safety
    /// `p` is NULL or a list the caller owns and hands over.
    unsafe fn from_raw(p: *mut z::nvlist_t) -> Option<Self> {
        NonNull::new(p).map(NvList)
    }

    pub fn as_ptr(&self) -> *mut z::nvlist_t {
        self.0.as_ptr()
    }

    /// A borrowed view for reading.
    pub fn as_ref(&self) -> NvListRef<'_> {
        NvListRef(self.0, PhantomData)
    }

    /// Adds `key = value` (uint64).
    pub fn add_u64(&mut self, key: &str, value: u64) -> Result<(), c_int> {
        let k = cstring(key)?;
        // SAFETY: the list is live and exclusively ours; the key is copied.
        errno(unsafe { z::nvlist_add_uint64(self.as_ptr(), k.as_ptr(), value) })
    }

    /// Adds `key = value` (string).
    pub fn add_string(&mut self, key: &str, value: &str) -> Result<(), c_int> {
        let k = cstring(key)?;
        let v = cstring(value)?;
        // SAFETY: as add_u64; the value is copied too.
        errno(unsafe { z::nvlist_add_string(self.as_ptr(), k.as_ptr(), v.as_ptr()) })
    }

    /// Adds `key` as a boolean flag (how snapshot lists name their members).
    pub fn add_boolean(&mut self, key: &str) -> Result<(), c_int> {
        let k = cstring(key)?;
        // SAFETY: as add_u64.
        errno(unsafe { z::nvlist_add_boolean(self.as_ptr(), k.as_ptr()) })
    }
}

impl Drop for NvList {
    fn drop(&mut self) {
        // SAFETY: we own the list and free it once.
        unsafe { z::nvlist_free(self.as_ptr()) }
    }
}

/// A value read from an nvlist.
#[derive(Debug)]
pub(crate) enum NvValue<'a> {
    I32(i32),
    Str(String),
    List(NvListRef<'a>),
    Other,
}

/// A borrowed `nvlist_t`, alive as long as `'a`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NvListRef<'a>(NonNull<z::nvlist_t>, PhantomData<&'a ()>);

impl<'a> NvListRef<'a> {
    /// Every pair, in the list's order.
    pub fn entries(&self) -> Vec<(String, NvValue<'a>)> {
        let mut out = Vec::new();
        let mut pair: *mut z::nvpair_t = ptr::null_mut();
        loop {
            // SAFETY: the list is alive for 'a; pair is NULL or the previous
            // pair of this list.
            pair = unsafe { z::nvlist_next_nvpair(self.0.as_ptr(), pair) };
            if pair.is_null() {
                break;
            }
            // SAFETY: pair is a live pair of the list; the values read are
            // copied out, or (nested lists) borrowed for 'a.
            let (name, value) = unsafe {
                let name = owned(z::nvpair_name(pair));
                let value = match z::nvpair_type(pair) {
                    z::DATA_TYPE_INT32 => {
                        let mut v = 0i32;
                        if z::nvpair_value_int32(pair, &mut v) == 0 {
                            NvValue::I32(v)
                        } else {
                            NvValue::Other
                        }
                    }
                    z::DATA_TYPE_STRING => {
                        let mut v: *const c_char = ptr::null();
                        if z::nvpair_value_string(pair, &mut v) == 0 {
                            NvValue::Str(owned(v))
                        } else {
                            NvValue::Other
                        }
                    }
                    z::DATA_TYPE_NVLIST => {
                        let mut v: *mut z::nvlist_t = ptr::null_mut();
                        if z::nvpair_value_nvlist(pair, &mut v) == 0 {
                            NonNull::new(v)
                                .map(|p| NvValue::List(NvListRef(p, PhantomData)))
                                .unwrap_or(NvValue::Other)
                        } else {
                            NvValue::Other
                        }
                    }
                    _ => NvValue::Other,
                };
                (name, value)
            };
            out.push((name, value));
        }
        out
    }

    /// The int32 pairs (error lists map names to errno values).
    pub fn int32_entries(&self) -> Vec<(String, i32)> {
        self.entries()
            .into_iter()
            .filter_map(|(k, v)| match v {
                NvValue::I32(e) => Some((k, e)),
                _ => None,
            })
            .collect()
    }
}

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
    fn last_error(&self) -> LibzfsError {
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
pub(crate) struct Prop(z::zfs_prop_t);

impl Prop {
    pub const VOLSIZE: Prop = Prop(z::ZFS_PROP_VOLSIZE);
    pub const VOLBLOCKSIZE: Prop = Prop(z::ZFS_PROP_VOLBLOCKSIZE);
    pub const REFRESERVATION: Prop = Prop(z::ZFS_PROP_REFRESERVATION);
    pub const USED: Prop = Prop(z::ZFS_PROP_USED);
    pub const GUID: Prop = Prop(z::ZFS_PROP_GUID);
    pub const CLONES: Prop = Prop(z::ZFS_PROP_CLONES);
    pub const ORIGIN: Prop = Prop(z::ZFS_PROP_ORIGIN);
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
    pub default: u64,
}

/// An open dataset (`zfs_handle_t`), closed on drop; borrows its `Libzfs`.
#[derive(Debug)]
pub(crate) struct Dataset<'h>(NonNull<z::zfs_handle_t>, PhantomData<&'h Libzfs>);

/// A child found by iteration: its name and `zfs_type_t`.
pub(crate) type Child = (String, c_int);

unsafe extern "C" fn collect_child(zhp: *mut z::zfs_handle_t, data: *mut c_void) -> c_int {
    // SAFETY: data is the &mut Vec<Child> that `iterate` passes, alive and
    // exclusively ours during the iteration; zhp is a live handle libzfs
    // opened for this callback, which must close it. Nothing here panics
    // short of an allocation failure, which aborts.
    unsafe {
        let out = &mut *(data as *mut Vec<Child>);
        out.push((owned(z::zfs_get_name(zhp)), z::zfs_get_type(zhp) as c_int));
        z::zfs_close(zhp);
    }
    0
}

impl Dataset<'_> {
    fn ptr(&self) -> *mut z::zfs_handle_t {
        self.0.as_ptr()
    }

    /// `zfs_get_type`.
    pub fn kind(&self) -> c_int {
        // SAFETY: live handle.
        unsafe { z::zfs_get_type(self.ptr()) as c_int }
    }

    /// A numeric property (`zfs_prop_get_numeric`); `None` when the dataset
    /// has no such property.
    pub fn prop_u64(&self, prop: Prop) -> Option<u64> {
        let mut v = 0u64;
        // SAFETY: live handle; no source or statistics buffers wanted.
        let rc = unsafe {
            z::zfs_prop_get_numeric(
                self.ptr(),
                prop.0,
                &mut v,
                ptr::null_mut(),
                ptr::null_mut(),
                0,
            )
        };
        (rc == 0).then_some(v)
    }

    /// A property as a literal string (`zfs_prop_get`, literal); `None` when
    /// unset or not applicable.
    pub fn prop_string(&self, prop: Prop) -> Option<String> {
        let mut buf = vec![0 as c_char; z::ZFS_MAXPROPLEN as usize];
        // SAFETY: live handle; buf has the length given, and zfs_prop_get
        // NUL-terminates within it.
        let rc = unsafe {
            z::zfs_prop_get(
                self.ptr(),
                prop.0,
                buf.as_mut_ptr(),
                buf.len(),
                ptr::null_mut(),
                ptr::null_mut(),
                0,
                z::B_TRUE,
            )
        };
        // SAFETY: on success buf holds a NUL-terminated string.
        (rc == 0).then(|| unsafe { owned(buf.as_ptr()) })
    }

    /// The user properties (`module:name`) and their values.
    pub fn user_props(&self) -> Vec<(String, String)> {
        // SAFETY: the list belongs to the handle and lives as long as it;
        // we only read it while self is borrowed.
        let list = unsafe { z::zfs_get_user_props(self.ptr()) };
        let Some(list) = NonNull::new(list) else {
            return Vec::new();
        };
        NvListRef(list, PhantomData)
            .entries()
            .into_iter()
            .filter_map(|(name, v)| match v {
                NvValue::List(inner) => inner.entries().into_iter().find_map(|(k, v)| match v {
                    NvValue::Str(s) if k == "value" => Some((name.clone(), s)),
                    _ => None,
                }),
                _ => None,
            })
            .collect()
    }

    /// The child filesystems and volumes exactly one level below.
    pub fn children(&self) -> Result<Vec<Child>, c_int> {
        let mut out: Vec<Child> = Vec::new();
        // SAFETY: collect_child's contract: data is &mut out, alive through
        // the call.
        let rc = unsafe {
            z::zfs_iter_filesystems_v2(
                self.ptr(),
                0,
                Some(collect_child),
                &mut out as *mut Vec<Child> as *mut c_void,
            )
        };
        errno(rc).map(|()| out)
    }

    /// The snapshots of this dataset.
    pub fn snapshots(&self) -> Result<Vec<String>, c_int> {
        let mut out: Vec<Child> = Vec::new();
        // SAFETY: as `children`; no txg range (0, 0).
        let rc = unsafe {
            z::zfs_iter_snapshots_v2(
                self.ptr(),
                0,
                Some(collect_child),
                &mut out as *mut Vec<Child> as *mut c_void,
                0,
                0,
            )
        };
        errno(rc).map(|()| out.into_iter().map(|(n, _)| n).collect())
    }

    /// `zfs_prop_set` of one property as the CLI gives it (libzfs
    /// translates and, for volsize, adjusts a thick volume's reservation).
    pub fn set_prop(&self, lib: &Libzfs, name: &CStr, value: &CStr) -> Result<(), LibzfsError> {
        // SAFETY: live handle opened through lib; strings only read.
        let rc = unsafe { z::zfs_prop_set(self.ptr(), name.as_ptr(), value.as_ptr()) };
        if rc == 0 {
            Ok(())
        } else {
            Err(lib.last_error())
        }
    }
}

impl Drop for Dataset<'_> {
    fn drop(&mut self) {
        // SAFETY: we own the handle and close it once.
        unsafe { z::zfs_close(self.ptr()) }
    }
}

/// An open pool (`zpool_handle_t`), closed on drop; borrows its `Libzfs`.
#[derive(Debug)]
pub(crate) struct Pool<'h>(NonNull<z::zpool_handle_t>, PhantomData<&'h Libzfs>);

/// Pool properties read as numbers.
#[derive(Debug, Clone, Copy)]
pub(crate) enum PoolProp {
    Size,
    Free,
    Allocated,
}

impl Pool<'_> {
    /// A numeric pool property (`zpool_get_prop_int`).
    pub fn prop_u64(&self, prop: PoolProp) -> u64 {
        let p = match prop {
            PoolProp::Size => z::ZPOOL_PROP_SIZE,
            PoolProp::Free => z::ZPOOL_PROP_FREE,
            PoolProp::Allocated => z::ZPOOL_PROP_ALLOCATED,
        };
        // SAFETY: live handle; no source wanted.
        unsafe { z::zpool_get_prop_int(self.0.as_ptr(), p, ptr::null_mut()) }
    }
}

impl Drop for Pool<'_> {
    fn drop(&mut self) {
        // SAFETY: we own the handle and close it once.
        unsafe { z::zpool_close(self.0.as_ptr()) }
    }
}

/// The userland version string (`zfs_version_userland`), e.g. `zfs-2.3.2-2`.
pub(crate) fn userland_version() -> String {
    // SAFETY: returns a pointer to a static string.
    unsafe { owned(z::zfs_version_userland()) }
}
