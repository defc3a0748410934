//! Errors of the lio crate, with the kernel's meaning of each refusal.
use crate::names::InvalidName;
use configfs::StepKind;
use std::path::PathBuf;

/// An error from reading or changing the LIO tree.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A name could not be a LIO object's name.
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
    /// The desired state asks for something the kernel cannot hold, or the
    /// tree holds something this crate cannot model unambiguously.
    #[error("{0}")]
    Conflict(String),
    /// The backstore lock file (shared with rtslib-fb) could not be taken.
    #[error("cannot lock the backstore index file {path}: {source}")]
    Lock {
        /// The lock file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
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

/// The kernel's meaning of an errno on a LIO path.
fn explain(err: &configfs::Error) -> Option<&'static str> {
    let (kind, path) = err.step()?;
    let errno = err.errno()?;
    let name = path.file_name()?.to_str()?;
    let under = |dir: &str| path.components().any(|c| c.as_os_str() == dir);
    let parent = path
        .parent()
        .and_then(|p| p.file_name())
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    Some(match (kind, name, errno) {
        (StepKind::Write, "control" | "udev_path", errno::EEXIST | errno::EINVAL) if under("core") => {
            "the storage object is already configured with a device; its udev_path and readonly cannot change, tear it down and make it again"
        }
        (StepKind::Write, "enable", errno::EBUSY) if under("core") => {
            "the block device is held exclusively by another user (mounted, a device-mapper holder, or another target)"
        }
        (StepKind::Write, "enable", _) if under("core") => {
            "the kernel could not open udev_path as a block device (missing, not a block device, or no udev_path written to control)"
        }
        (StepKind::Write, "vpd_unit_serial", errno::EINVAL) => {
            "the storage object is exported through a LUN, or the serial is too long; set the serial before linking a LUN"
        }
        (StepKind::Write, "enable", errno::EINVAL) if parent.starts_with("tpgt_") => {
            "the TPG is already in that state, or its attributes do not allow enabling it"
        }
        (StepKind::Write, "userid" | "password", errno::EINVAL) => {
            "the CHAP value is too long for the kernel"
        }
        (StepKind::Write, "write_protect", errno::ENODEV) => {
            "the mapped LUN has no link to a TPG LUN yet"
        }
        (StepKind::Mkdir, _, errno::EADDRINUSE) if under("np") => {
            "another listener that is not LIO holds this address and port"
        }
        (StepKind::Mkdir, _, errno::EADDRNOTAVAIL) if under("np") => {
            "the address is not assigned to any interface of this host"
        }
        (StepKind::Mkdir, _, errno::EINVAL) if under("np") => {
            "the kernel could not parse the portal or bind to it"
        }
        (StepKind::Mkdir, _, errno::EINVAL) if under("acls") => {
            "the kernel refused the initiator name for this fabric"
        }
        (StepKind::Symlink, _, errno::ENODEV) => {
            "the storage object is not enabled (configure its device first)"
        }
        (StepKind::Symlink, _, errno::EINVAL) if under("acls") => {
            "a mapped LUN must link to a LUN of the same TPG"
        }
        (StepKind::Symlink, _, errno::EEXIST) => {
            "the LUN or mapped LUN already has a link, or the storage object is already served by this LUN"
        }
        (StepKind::Rmdir, _, errno::ENOTEMPTY | errno::EBUSY) => {
            "the object still has children or links (mapped LUNs, LUNs serving the storage object); remove them first"
        }
        (StepKind::Mkdir, _, errno::EEXIST) => "the object already exists",
        (StepKind::Mkdir, _, errno::ENOENT) if name == "iscsi" => {
            "the iscsi_target_mod module is not loaded"
        }
        (_, _, errno::ENOENT) => "the object or its parent does not exist",
        _ => return None,
    })
}

/// The errno values this crate explains (Linux x86-64 and aarch64 share them).
mod errno {
    pub const ENOENT: i32 = 2;
    pub const EBUSY: i32 = 16;
    pub const EEXIST: i32 = 17;
    pub const ENODEV: i32 = 19;
    pub const EINVAL: i32 = 22;
    pub const ENOTEMPTY: i32 = 39;
    pub const EADDRINUSE: i32 = 98;
    pub const EADDRNOTAVAIL: i32 = 99;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    fn refused(kind: StepKind, path: &str, errno: i32) -> Error {
        Error::from(configfs::Error::Io {
            kind,
            path: path.into(),
            source: io::Error::from_raw_os_error(errno),
        })
    }

    #[test]
    fn errors_name_the_path_and_explain_the_errno() {
        let e = refused(
            StepKind::Write,
            "/sys/kernel/config/target/core/iblock_0/v/enable",
            16,
        );
        let text = e.to_string();
        assert!(text.contains("core/iblock_0/v/enable"), "{text}");
        assert!(text.contains("held exclusively"), "{text}");
        let e = refused(
            StepKind::Rmdir,
            "/sys/kernel/config/target/core/iblock_0/v",
            16,
        );
        assert!(e.to_string().contains("remove them first"));
        let e = refused(StepKind::Write, "/x/y/unknown", 5);
        assert!(matches!(e, Error::Configfs { hint: None, .. }));
    }
}
