//! libzfs_core: the thread-safe calls (create, destroy, snapshot, clone,
//! exists) on its global `/dev/zfs` descriptor.
use super::*;

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
