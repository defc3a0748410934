//! The only unsafe code of `sys::lvm`: one liblvm2cmd handle and the log
//! callback that captures its output.
//!
//! liblvm2cmd is not thread-safe and its log callback carries no user data,
//! so a [`Handle`] is created, used and released on one thread (the worker),
//! and the callback appends to a buffer local to that thread.
#![allow(unsafe_code)]

use std::{
    cell::RefCell,
    ffi::{c_char, c_int, CStr, CString},
    marker::PhantomData,
    ptr::NonNull,
};

/// One line LVM logged while a command ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Line {
    /// `LVM2_LOG_*` level: 4 is command output (reports, messages), 3 and 2 are errors.
    pub level: i32,
    /// The text, without a trailing newline.
    pub text: String,
}

/// What one `lvm2_run` returned: its code and the lines logged meanwhile.
#[derive(Debug, Clone)]
pub(crate) struct Outcome {
    /// `LVM2_COMMAND_SUCCEEDED` (1) or another `LVM2_*` code.
    pub code: i32,
    /// Lines logged at level `LVM2_LOG_PRINT` or more severe, in order.
    pub lines: Vec<Line>,
}

thread_local! {
    /// Lines logged by liblvm2cmd on this thread (only the worker runs it).
    static CAPTURE: RefCell<Vec<Line>> = const { RefCell::new(Vec::new()) };
}

/// The callback liblvm2cmd calls with each line it logs. It must not unwind
/// into C, so it never panics: a line that cannot be stored is dropped.
extern "C" fn capture(
    level: c_int,
    _file: *const c_char,
    _line: c_int,
    _dm_errno: c_int,
    message: *const c_char,
) {
    // Verbose and debug lines are not output; keep print, error and fatal.
    if !(1..=lvm_sys::LVM2_LOG_PRINT as c_int).contains(&level) || message.is_null() {
        return;
    }
    // SAFETY: liblvm2cmd passes a NUL-terminated string (checked non-null
    // above) that stays valid for the duration of this call; it is copied
    // before returning.
    let text = unsafe { CStr::from_ptr(message) }
        .to_string_lossy()
        .trim_end_matches('\n')
        .to_owned();
    let _ = CAPTURE.try_with(|c| {
        if let Ok(mut lines) = c.try_borrow_mut() {
            lines.push(Line { level, text });
        }
    });
}

/// A liblvm2cmd handle, owned by the thread that created it (not `Send`).
pub(crate) struct Handle {
    ptr: NonNull<std::ffi::c_void>,
    /// Keeps the handle on its thread: liblvm2cmd is not thread-safe.
    _not_send: PhantomData<*mut ()>,
}

impl Handle {
    /// Installs the capturing log callback and initialises liblvm2cmd;
    /// `None` when `lvm2_init` fails.
    pub(crate) fn init() -> Option<Self> {
        // SAFETY: `capture` is an `extern "C"` function with the exact
        // signature of `lvm2_log_fn_t` and lives for the whole program.
        unsafe { lvm_sys::lvm2_log_fn(Some(capture)) };
        // SAFETY: no other handle is live in this process (the caller
        // guarantees one worker at a time); a NULL return is handled.
        let ptr = unsafe { lvm_sys::lvm2_init() };
        NonNull::new(ptr).map(|ptr| Self {
            ptr,
            _not_send: PhantomData,
        })
    }

    /// Runs one LVM command line (e.g. `lvs --reportformat json labvg`) and
    /// returns its code and output. The line must hold no NUL byte.
    pub(crate) fn run(&mut self, cmdline: &CString) -> Outcome {
        CAPTURE.with(|c| c.borrow_mut().clear());
        // SAFETY: `self.ptr` is a live handle from `lvm2_init`, used only on
        // this thread (`Handle` is not `Send`) and not yet released;
        // `cmdline` is a valid NUL-terminated string that outlives the call
        // (liblvm2cmd copies it before splitting it into arguments).
        let code = unsafe { lvm_sys::lvm2_run(self.ptr.as_ptr(), cmdline.as_ptr()) };
        let lines = CAPTURE.with(|c| std::mem::take(&mut *c.borrow_mut()));
        Outcome { code, lines }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: the handle is live, released exactly once (here), on the
        // thread that created it, and never used afterwards.
        unsafe { lvm_sys::lvm2_exit(self.ptr.as_ptr()) };
    }
}
