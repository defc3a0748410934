//! Serving the Controller service on the CSI endpoint (`unix:///csi/csi.sock`).
use super::Controller;
use pillar_csi_proto::csi::v1::controller_server::ControllerServer;
use std::path::PathBuf;
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;

/// A CSI endpoint that cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The endpoint is not `unix://<path>`.
    #[error("CSI endpoint {0:?}: only unix:///<path> is supported")]
    Endpoint(String),
    /// The socket cannot be bound (a stale socket is removed first).
    #[error("bind {path}: {source}")]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The gRPC server failed.
    #[error("serve: {0}")]
    Serve(#[from] tonic::transport::Error),
}

/// The socket path of a `unix://` endpoint.
pub fn socket_path(endpoint: &str) -> Result<PathBuf, ServeError> {
    endpoint
        .strip_prefix("unix://")
        .filter(|p| p.starts_with('/'))
        .map(PathBuf::from)
        .ok_or_else(|| ServeError::Endpoint(endpoint.to_owned()))
}

/// Serves `controller` on `endpoint` until `shutdown` completes.
pub async fn serve(
    controller: Controller,
    endpoint: &str,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let path = socket_path(endpoint)?;
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).map_err(|source| ServeError::Bind {
        path: path.clone(),
        source,
    })?;
    tonic::transport::Server::builder()
        .add_service(ControllerServer::new(controller))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_absolute_unix_endpoints_are_accepted() {
        assert_eq!(
            socket_path("unix:///csi/csi.sock").ok(),
            Some(PathBuf::from("/csi/csi.sock"))
        );
        for bad in ["tcp://127.0.0.1:1", "unix://csi.sock", "/csi/csi.sock"] {
            assert!(socket_path(bad).is_err(), "{bad}");
        }
    }
}
