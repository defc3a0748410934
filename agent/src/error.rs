//! The agent's errors, and the one place they become gRPC status codes.
use crate::{fence::FenceError, marks::MarkError};
use tonic::{Code, Status};

/// An error of an agent operation, classified by what the caller can do about it.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The request is malformed: a field is missing, an ID is hostile.
    #[error("{0}")]
    InvalidArgument(String),
    /// The named object does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The object exists with other attributes.
    #[error("{0}")]
    AlreadyExists(String),
    /// The system is not in a state that allows the request (fencing, device in use, ...).
    #[error("{0}")]
    FailedPrecondition(String),
    /// A size is outside what the source allows (a clone smaller than its
    /// snapshot).
    #[error("{0}")]
    OutOfRange(String),
    /// Not enough space.
    #[error("{0}")]
    ResourceExhausted(String),
    /// This agent does not implement the request for this backend or protocol.
    #[error("{0}")]
    Unimplemented(String),
    /// A dependency (kernel target, pool) is not reachable now.
    #[error("{0}")]
    Unavailable(String),
    /// Anything else: the agent's own state or the host failed.
    #[error("{0}")]
    Internal(String),
}

impl AgentError {
    /// The gRPC code of this error.
    pub fn code(&self) -> Code {
        match self {
            AgentError::InvalidArgument(_) => Code::InvalidArgument,
            AgentError::NotFound(_) => Code::NotFound,
            AgentError::AlreadyExists(_) => Code::AlreadyExists,
            AgentError::FailedPrecondition(_) => Code::FailedPrecondition,
            AgentError::OutOfRange(_) => Code::OutOfRange,
            AgentError::ResourceExhausted(_) => Code::ResourceExhausted,
            AgentError::Unimplemented(_) => Code::Unimplemented,
            AgentError::Unavailable(_) => Code::Unavailable,
            AgentError::Internal(_) => Code::Internal,
        }
    }
}

impl From<AgentError> for Status {
    fn from(e: AgentError) -> Self {
        Status::new(e.code(), e.to_string())
    }
}

impl From<FenceError> for AgentError {
    fn from(e: FenceError) -> Self {
        AgentError::FailedPrecondition(e.to_string())
    }
}

impl From<MarkError> for AgentError {
    fn from(e: MarkError) -> Self {
        match e {
            MarkError::TooLong(_) => AgentError::InvalidArgument(e.to_string()),
            MarkError::Corrupt { .. } | MarkError::Io { .. } | MarkError::Unsynced { .. } => {
                AgentError::Internal(e.to_string())
            }
        }
    }
}

impl From<nvmet::Error> for AgentError {
    fn from(e: nvmet::Error) -> Self {
        match e {
            nvmet::Error::Name(_) | nvmet::Error::InvalidValue { .. } => {
                AgentError::InvalidArgument(format!("nvmet: {e}"))
            }
            nvmet::Error::Conflict(_) => AgentError::FailedPrecondition(format!("nvmet: {e}")),
            nvmet::Error::Configfs {
                source: configfs_error @ configfs::Error::RootMissing { .. },
                ..
            } => AgentError::Unavailable(format!("nvmet: {configfs_error}")),
            nvmet::Error::Configfs { .. } => AgentError::Internal(format!("nvmet: {e}")),
        }
    }
}

impl From<lio::Error> for AgentError {
    fn from(e: lio::Error) -> Self {
        match e {
            lio::Error::Name(_) | lio::Error::InvalidValue { .. } => {
                AgentError::InvalidArgument(format!("LIO: {e}"))
            }
            lio::Error::Conflict(_) => AgentError::FailedPrecondition(format!("LIO: {e}")),
            lio::Error::Configfs {
                source: configfs_error @ configfs::Error::RootMissing { .. },
                ..
            } => AgentError::Unavailable(format!("LIO: {configfs_error}")),
            _ => AgentError::Internal(format!("LIO: {e}")),
        }
    }
}

impl From<sys::zfs::Error> for AgentError {
    fn from(e: sys::zfs::Error) -> Self {
        use sys::zfs::Error as Z;
        let text = e.to_string();
        match e {
            Z::Name(_) | Z::InvalidSize { .. } | Z::InvalidProperty { .. } => {
                AgentError::InvalidArgument(text)
            }
            Z::NotFound { .. } | Z::PoolNotFound { .. } | Z::ParentNotFound { .. } => {
                AgentError::NotFound(text)
            }
            Z::AlreadyExists { .. } => AgentError::AlreadyExists(text),
            Z::WrongType { .. }
            | Z::HasDependents { .. }
            | Z::HasClones { .. }
            | Z::Shrink { .. }
            | Z::WrongKey { .. }
            | Z::KeyNotLoaded { .. }
            | Z::Busy { .. } => AgentError::FailedPrecondition(text),
            Z::NoSpace { .. } => AgentError::ResourceExhausted(text),
            Z::Unavailable(_) | Z::VersionMismatch { .. } => AgentError::Unavailable(text),
            _ => AgentError::Internal(text),
        }
    }
}

impl From<sys::lvm::Error> for AgentError {
    fn from(e: sys::lvm::Error) -> Self {
        use sys::lvm::Error as L;
        let text = e.to_string();
        match e {
            L::Name(_) | L::Uuid(_) | L::InvalidSize { .. } => AgentError::InvalidArgument(text),
            L::VgNotFound { .. } | L::LvNotFound { .. } => AgentError::NotFound(text),
            L::LvExists { .. } => AgentError::AlreadyExists(text),
            L::InsufficientSpace { .. } => AgentError::ResourceExhausted(text),
            L::NotAThinPool { .. } | L::UuidMismatch { .. } | L::Shrink { .. } => {
                AgentError::FailedPrecondition(text)
            }
            L::Init | L::AlreadyRunning | L::Worker(_) => AgentError::Unavailable(text),
            _ => AgentError::Internal(text),
        }
    }
}

impl From<nvmet::InvalidName> for AgentError {
    fn from(e: nvmet::InvalidName) -> Self {
        AgentError::InvalidArgument(e.to_string())
    }
}

impl From<tokio::task::JoinError> for AgentError {
    fn from(e: tokio::task::JoinError) -> Self {
        AgentError::Internal(format!("worker task failed: {e}"))
    }
}
