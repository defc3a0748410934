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

mod handles;
mod libzfs;
mod lzc;
mod nvlist;

pub(crate) use handles::*;
pub(crate) use libzfs::*;
pub(crate) use lzc::*;
pub(crate) use nvlist::*;

use std::{
    collections::HashMap,
    ffi::{c_char, c_int, c_uint, c_void, CStr, CString},
    marker::PhantomData,
    os::fd::OwnedFd,
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

/// `ENAMETOOLONG` (Linux).
pub(crate) const ENAMETOOLONG: c_int = 36;

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

fn errno(rc: c_int) -> Result<(), c_int> {
    if rc == 0 {
        Ok(())
    } else {
        Err(rc)
    }
}

/// The userland version string (`zfs_version_userland`), e.g. `zfs-2.3.2-2`.
pub(crate) fn userland_version() -> String {
    // SAFETY: returns a pointer to a static string.
    unsafe { owned(z::zfs_version_userland()) }
}
