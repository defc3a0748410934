//! Errors of configfs operations: each carries the path and the OS error.
use std::{fmt, io, path::PathBuf};

/// What a failed operation was doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepKind {
    /// Creating an object directory.
    Mkdir,
    /// Writing an attribute.
    Write,
    /// Linking two objects.
    Symlink,
    /// Removing a link.
    Unlink,
    /// Removing an object directory.
    Rmdir,
    /// Reading an attribute or a link.
    Read,
    /// Listing an object's children.
    List,
}

impl fmt::Display for StepKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StepKind::Mkdir => "mkdir",
            StepKind::Write => "write",
            StepKind::Symlink => "symlink",
            StepKind::Unlink => "unlink",
            StepKind::Rmdir => "rmdir",
            StepKind::Read => "read",
            StepKind::List => "list",
        })
    }
}

/// An error from a configfs tree.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The root of the tree is not there: configfs is not mounted, or the
    /// kernel module that provides the tree is not loaded.
    #[error("configfs tree {root} is not present: {why}")]
    RootMissing {
        /// The root that was asked for.
        root: PathBuf,
        /// What is missing and how to provide it.
        why: String,
    },
    /// A relative path tried to leave the tree (`..`, `.`, an absolute or empty component).
    #[error("path {rel:?} escapes the configfs tree at {root}")]
    Escape {
        /// The tree's root.
        root: PathBuf,
        /// The offending relative path.
        rel: String,
    },
    /// The kernel (or the filesystem) refused an operation.
    #[error("{kind} {path} failed: {source}")]
    Io {
        /// The operation.
        kind: StepKind,
        /// The full path it acted on.
        path: PathBuf,
        /// The OS error, with its errno.
        #[source]
        source: io::Error,
    },
    /// An attribute held text that is not what the object expects.
    #[error("attribute {path} holds {value:?}: {why}")]
    Parse {
        /// The attribute's full path.
        path: PathBuf,
        /// What it held.
        value: String,
        /// What was expected.
        why: String,
    },
}

impl Error {
    /// The errno of a refused operation, if this is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Io { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    /// The kind and path of a refused operation, if this is one.
    pub fn step(&self) -> Option<(StepKind, &std::path::Path)> {
        match self {
            Error::Io { kind, path, .. } => Some((*kind, path)),
            _ => None,
        }
    }
}
