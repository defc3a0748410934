//! Dataset and pool handles opened through a [`Libzfs`], borrowing it.
use super::*;

/// An open dataset (`zfs_handle_t`), closed on drop; borrows its `Libzfs`.
#[derive(Debug)]
pub(crate) struct Dataset<'h>(
    pub(super) NonNull<z::zfs_handle_t>,
    pub(super) PhantomData<&'h Libzfs>,
);

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

    /// `zfs_mount` at the dataset's `mountpoint`, with no extra options
    /// (`zfs mount`).
    pub fn mount(&self, lib: &Libzfs) -> Result<(), LibzfsError> {
        // SAFETY: live handle opened through lib; NULL options are none.
        let rc = unsafe { z::zfs_mount(self.ptr(), ptr::null(), 0) };
        if rc == 0 {
            Ok(())
        } else {
            Err(lib.last_error())
        }
    }

    /// `zfs_unmount` of the dataset wherever it is mounted, not forced
    /// (`zfs unmount`): a busy mount is refused.
    pub fn unmount(&self, lib: &Libzfs) -> Result<(), LibzfsError> {
        // SAFETY: live handle opened through lib; a NULL mountpoint is the
        // dataset's own.
        let rc = unsafe { z::zfs_unmount(self.ptr(), ptr::null(), 0) };
        if rc == 0 {
            Ok(())
        } else {
            Err(lib.last_error())
        }
    }

    /// `zfs_prop_inherit` of one property (`zfs inherit`): a value set on
    /// this dataset goes; a user property then shows its parent's, if any.
    pub fn inherit_prop(&self, lib: &Libzfs, name: &CStr) -> Result<(), LibzfsError> {
        // SAFETY: live handle opened through lib; the name is only read.
        let rc = unsafe { z::zfs_prop_inherit(self.ptr(), name.as_ptr(), 0) };
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
pub(crate) struct Pool<'h>(
    pub(super) NonNull<z::zpool_handle_t>,
    pub(super) PhantomData<&'h Libzfs>,
);

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
