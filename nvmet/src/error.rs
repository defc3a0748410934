//! Errors of the nvmet crate, with the kernel's meaning of each refusal.
use crate::names::InvalidName;
use configfs::StepKind;

/// An error from reading or changing the nvmet tree.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A name could not be an nvmet object's name.
    #[error(transparent)]
    Name(#[from] InvalidName),
    /// A value of the desired state is malformed.
    #[error("invalid {what}: {why}")]
    InvalidValue {
        /// The value's place.
        what: String,
        /// What is wrong with it.
        why: String,
    },
    /// The desired state asks for something the kernel cannot hold.
    #[error("{0}")]
    Conflict(String),
    /// configfs refused a step or a read.
    #[error("{source}{}", hint.map(|h| format!(" ({h})")).unwrap_or_default())]
    Configfs {
        /// The refused operation, with path and errno.
        #[source]
        source: configfs::Error,
        /// What the errno means for this object, when known.
        hint: Option<&'static str>,
    },
}

impl From<configfs::Error> for Error {
    fn from(source: configfs::Error) -> Self {
        let hint = explain(&source);
        Error::Configfs { source, hint }
    }
}

/// The kernel's meaning of an errno on an nvmet path.
fn explain(err: &configfs::Error) -> Option<&'static str> {
    let (kind, path) = err.step()?;
    let errno = err.errno()?;
    let name = path.file_name()?.to_str()?;
    let under = |dir: &str| path.components().any(|c| c.as_os_str() == dir);
    Some(match (kind, name, errno) {
        (StepKind::Write, "device_path" | "device_uuid" | "device_nguid", libc_errno::EBUSY) => {
            "the namespace is enabled; disable it before changing its device"
        }
        (StepKind::Write, "enable", _) if under("namespaces") => {
            "the target could not open the device path as a block device"
        }
        (StepKind::Write, n, libc_errno::EACCES) if n.starts_with("addr_") => {
            "the port is enabled because a subsystem is linked to it; unlink its subsystems first"
        }
        (StepKind::Write, "attr_allow_any_host", libc_errno::EINVAL) => {
            "the subsystem has allowed_hosts links; remove them before allowing any host"
        }
        (StepKind::Symlink, _, libc_errno::EINVAL) if under("allowed_hosts") => {
            "the subsystem allows any host; clear attr_allow_any_host before linking hosts"
        }
        (StepKind::Write, "attr_serial" | "attr_model", libc_errno::EINVAL) => {
            "a host already identified the subsystem, or the value is too long; set serial and model before the first connection"
        }
        (StepKind::Symlink, _, libc_errno::EADDRINUSE) => "another listener holds this address and port",
        (StepKind::Rmdir, _, libc_errno::ENOTEMPTY | libc_errno::EBUSY) => {
            "the object still has children or links; remove them first"
        }
        (StepKind::Mkdir | StepKind::Symlink, _, libc_errno::EEXIST) => "the object already exists",
        (_, _, libc_errno::ENOENT) => "the object or its parent does not exist",
        _ => return None,
    })
}

/// The errno values this crate explains (Linux x86-64 and aarch64 share them).
mod libc_errno {
    pub const ENOENT: i32 = 2;
    pub const EACCES: i32 = 13;
    pub const EBUSY: i32 = 16;
    pub const EEXIST: i32 = 17;
    pub const EINVAL: i32 = 22;
    pub const ENOTEMPTY: i32 = 39;
    pub const EADDRINUSE: i32 = 98;
}
