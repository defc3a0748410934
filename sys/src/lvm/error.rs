//! Errors of `sys::lvm`: each names the VG or LV and the cause.
use super::report::ReportError;
use api::names::lvm::{InvalidName, InvalidUuid, LvmUuid};

/// An error from an LVM request.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A VG or LV name breaks LVM's rules; nothing was run.
    #[error(transparent)]
    Name(#[from] InvalidName),
    /// A UUID is not in LVM's form; nothing was run.
    #[error(transparent)]
    Uuid(#[from] InvalidUuid),
    /// A size is zero or not a whole number of 512-byte sectors; nothing was run.
    #[error("LV {vg}/{lv}: invalid size {size} bytes: {why}")]
    InvalidSize {
        /// The VG.
        vg: String,
        /// The LV.
        lv: String,
        /// The rejected size in bytes.
        size: u64,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The VG does not exist (or LVM cannot see it).
    #[error("volume group {vg} not found")]
    VgNotFound {
        /// The VG.
        vg: String,
    },
    /// The LV does not exist in its VG.
    #[error("logical volume {vg}/{lv} not found")]
    LvNotFound {
        /// The VG.
        vg: String,
        /// The LV.
        lv: String,
    },
    /// An LV of that name already exists; it was left as it is.
    #[error("logical volume {vg}/{lv} already exists")]
    LvExists {
        /// The VG.
        vg: String,
        /// The LV.
        lv: String,
    },
    /// The VG has less free space than the new LV needs; nothing was created.
    #[error("cannot create {vg}/{lv} of {requested} bytes: volume group {vg} has only {free} bytes free")]
    InsufficientSpace {
        /// The VG.
        vg: String,
        /// The LV that was to be created or grown.
        lv: String,
        /// The bytes asked for.
        requested: u64,
        /// The VG's free bytes.
        free: u64,
    },
    /// The thin pool named for a thin LV does not exist or is not a thin pool.
    #[error("{vg}/{pool} is not a thin pool ({why})")]
    NotAThinPool {
        /// The VG.
        vg: String,
        /// The LV named as the pool.
        pool: String,
        /// What it is instead.
        why: String,
    },
    /// The LV's UUID is not the one the caller pinned: it was re-created or
    /// replaced, so it was left alone.
    #[error(
        "logical volume {vg}/{lv} has UUID {found}, not the expected {expected}; left unchanged"
    )]
    UuidMismatch {
        /// The VG.
        vg: String,
        /// The LV.
        lv: String,
        /// The UUID the caller expected.
        expected: LvmUuid,
        /// The UUID it has.
        found: LvmUuid,
    },
    /// Growing would shrink the LV; LVs are never shrunk.
    #[error("logical volume {vg}/{lv} is {current} bytes; refusing to shrink it to {requested}")]
    Shrink {
        /// The VG.
        vg: String,
        /// The LV.
        lv: String,
        /// Its size now.
        current: u64,
        /// The smaller size asked for.
        requested: u64,
    },
    /// LVM ran the command and it failed for a reason not mapped above.
    #[error("`{command}` failed with code {code}: {}", if messages.is_empty() { "LVM gave no message".to_owned() } else { messages.join("; ") })]
    Command {
        /// The command line.
        command: String,
        /// `lvm2_run`'s code (5: processing failed, 3: invalid parameters).
        code: i32,
        /// LVM's error messages.
        messages: Vec<String>,
    },
    /// A report LVM printed could not be read.
    #[error("`{command}`: {source}")]
    Report {
        /// The command line.
        command: String,
        /// What was wrong with the report.
        #[source]
        source: ReportError,
    },
    /// `lvm2_init` failed.
    #[error("liblvm2cmd could not be initialised (lvm2_init returned NULL)")]
    Init,
    /// Another [`Lvm`](super::Lvm) service (or a benchmark's
    /// [`RawLvm`](super::floor::RawLvm)) is running in this process;
    /// liblvm2cmd allows only one.
    #[error("an LVM service is already running in this process (liblvm2cmd is not thread-safe; share that one)")]
    AlreadyRunning,
    /// The worker thread is gone (it could not start or it panicked).
    #[error("the LVM worker thread is gone: {0}")]
    Worker(String),
}
