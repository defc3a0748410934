//! The node service's error: a CSI status code and a message that names the
//! object and the cause. Every module of the node returns it; the gRPC layer
//! turns it into a `tonic::Status` in one place ([`Error::into_status`]).
use std::fmt;

/// Which CSI outcome an error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A request field is missing or malformed (INVALID_ARGUMENT).
    InvalidArgument,
    /// The volume or path is not known (NOT_FOUND).
    NotFound,
    /// The same volume is staged or published with other arguments
    /// (ALREADY_EXISTS).
    AlreadyExists,
    /// The device is not in a state this call may act on, for example it
    /// holds another filesystem (FAILED_PRECONDITION).
    FailedPrecondition,
    /// The target refused this node's credentials, e.g. iSCSI CHAP
    /// (PERMISSION_DENIED).
    PermissionDenied,
    /// A wait ran out (DEADLINE_EXCEEDED); the call may be retried.
    Timeout,
    /// A host operation failed (INTERNAL).
    Internal,
}

/// A node operation that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// The outcome.
    pub kind: Kind,
    /// What failed, naming the object and the cause.
    pub message: String,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl Error {
    /// An error of `kind`.
    pub fn new(kind: Kind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// INVALID_ARGUMENT.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(Kind::InvalidArgument, message)
    }

    /// INTERNAL.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Kind::Internal, message)
    }

    /// FAILED_PRECONDITION.
    pub fn precondition(message: impl Into<String>) -> Self {
        Self::new(Kind::FailedPrecondition, message)
    }

    /// ALREADY_EXISTS.
    pub fn exists(message: impl Into<String>) -> Self {
        Self::new(Kind::AlreadyExists, message)
    }

    /// An I/O failure on `what`.
    pub fn io(what: impl fmt::Display, e: impl fmt::Display) -> Self {
        Self::internal(format!("{what}: {e}"))
    }

    /// The gRPC status.
    pub fn into_status(self) -> tonic::Status {
        let code = match self.kind {
            Kind::InvalidArgument => tonic::Code::InvalidArgument,
            Kind::NotFound => tonic::Code::NotFound,
            Kind::AlreadyExists => tonic::Code::AlreadyExists,
            Kind::FailedPrecondition => tonic::Code::FailedPrecondition,
            Kind::PermissionDenied => tonic::Code::PermissionDenied,
            Kind::Timeout => tonic::Code::DeadlineExceeded,
            Kind::Internal => tonic::Code::Internal,
        };
        tonic::Status::new(code, self.message)
    }
}

/// The node's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
