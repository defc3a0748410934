//! The controller's errors and their one mapping to gRPC codes.
use tonic::{Code, Status};

/// Why a Controller RPC failed; the text names the object at fault.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed (CSI INVALID_ARGUMENT).
    #[error("{0}")]
    InvalidArgument(String),
    /// The volume or node does not exist (NOT_FOUND).
    #[error("{0}")]
    NotFound(String),
    /// The request cannot be carried out in the volume's present state
    /// (FAILED_PRECONDITION).
    #[error("{0}")]
    FailedPrecondition(String),
    /// A volume of the same name exists with other parameters (ALREADY_EXISTS).
    #[error("{0}")]
    AlreadyExists(String),
    /// Another call changed the volume's record first; the CO retries (ABORTED).
    #[error("{0}")]
    Aborted(String),
    /// The volume's size is outside the requested capacity range
    /// (OUT_OF_RANGE): an import larger than `limit_bytes`.
    #[error("{0}")]
    OutOfRange(String),
    /// The volume cannot be made where the request requires
    /// (RESOURCE_EXHAUSTED): a node-local volume's node is not among the
    /// requisite topologies.
    #[error("{0}")]
    ResourceExhausted(String),
    /// A Kubernetes API call failed.
    #[error("{what}: {source}")]
    Kube {
        /// What the controller was doing.
        what: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// The agent refused or failed; its code is kept.
    #[error("agent {agent}: {status_message}", status_message = .status.message())]
    Agent {
        /// The PillarAgent's name.
        agent: String,
        /// The agent's answer.
        status: Status,
    },
    /// The agent cannot be reached or its connection cannot be built.
    #[error("{0}")]
    Unavailable(String),
}

/// The controller's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Wraps a Kubernetes API error with what was being done.
    pub fn kube(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let what = what.into();
        move |source| Error::Kube { what, source }
    }

    /// The gRPC code this error maps to.
    pub fn code(&self) -> Code {
        match self {
            Error::InvalidArgument(_) => Code::InvalidArgument,
            Error::NotFound(_) => Code::NotFound,
            Error::FailedPrecondition(_) => Code::FailedPrecondition,
            Error::AlreadyExists(_) => Code::AlreadyExists,
            Error::Aborted(_) => Code::Aborted,
            Error::OutOfRange(_) => Code::OutOfRange,
            Error::ResourceExhausted(_) => Code::ResourceExhausted,
            Error::Kube { source, .. } => match source {
                kube::Error::Api(s) if s.code == 409 => Code::Aborted,
                kube::Error::Api(s) if s.code == 404 => Code::NotFound,
                kube::Error::Api(s) if s.code == 403 => Code::PermissionDenied,
                // The API server refused the object (a name or field it
                // does not take): the request's fault, not an outage.
                kube::Error::Api(s) if s.code == 422 => Code::InvalidArgument,
                _ => Code::Unavailable,
            },
            Error::Agent { status, .. } => status.code(),
            Error::Unavailable(_) => Code::Unavailable,
        }
    }

    /// The text a claim's event carries: an agent's refusal (its
    /// FAILED_PRECONDITION, INVALID_ARGUMENT or OUT_OF_RANGE, such as the
    /// spec's rows starting `import of volume`) exactly as the agent wrote
    /// it; anything else as [`Display`](std::fmt::Display) writes it (an
    /// unreachable agent keeps its name).
    pub fn for_claim(&self) -> String {
        match self {
            Error::Agent { status, .. }
                if matches!(
                    status.code(),
                    Code::FailedPrecondition | Code::InvalidArgument | Code::OutOfRange
                ) =>
            {
                status.message().to_owned()
            }
            other => other.to_string(),
        }
    }

    /// Whether the Kubernetes API answered 404.
    pub fn is_kube_not_found(&self) -> bool {
        matches!(self, Error::Kube { source: kube::Error::Api(s), .. } if s.code == 404)
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        Status::new(e.code(), e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_codes_are_kept_and_named() {
        let e = Error::Agent {
            agent: "storage-1".into(),
            status: Status::failed_precondition("stale fencing token"),
        };
        let s = Status::from(e);
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert_eq!(s.message(), "agent storage-1: stale fencing token");
        let refusal = Error::Agent {
            agent: "storage-1".into(),
            status: Status::failed_precondition("import of volume tank/x refused: missing: x"),
        };
        assert_eq!(
            refusal.for_claim(),
            "import of volume tank/x refused: missing: x"
        );
        let down = Error::Agent {
            agent: "storage-1".into(),
            status: Status::unavailable("connection refused"),
        };
        assert_eq!(down.for_claim(), "agent storage-1: connection refused");
        assert_eq!(
            Status::from(Error::Aborted("x".into())).code(),
            Code::Aborted
        );
    }

    #[test]
    fn api_server_answers_map_to_the_callers_codes() {
        let answer = |code: u16| Error::Kube {
            what: "create PillarVolumeState \"x\"".into(),
            source: kube::Error::Api(
                kube::core::Status::failure("refused", "Invalid")
                    .with_code(code)
                    .boxed(),
            ),
        };
        for (http, grpc) in [
            (422, Code::InvalidArgument),
            (409, Code::Aborted),
            (404, Code::NotFound),
            (403, Code::PermissionDenied),
            (500, Code::Unavailable),
        ] {
            assert_eq!(answer(http).code(), grpc, "HTTP {http}");
        }
    }
}
