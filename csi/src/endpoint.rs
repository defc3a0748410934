//! Serving CSI services on the unix socket kubelet and the sidecars dial
//! (`unix:///csi/csi.sock`).
//!
//! Any `:authority` is served. Clients on a unix socket send the socket's
//! path in some form (`/csi/csi.sock`, `%2Fcsi%2Fcsi.sock`,
//! `unix:///csi/csi.sock`: grpc-java, grpcurl, csc, Python grpc, older
//! kubelets), `localhost`, or nothing, and h2 resets a request whose
//! authority is not a URI authority (hyperium/h2#487). Nothing here can
//! intervene before h2 does, short of re-encoding HPACK on the socket, so
//! the workspace builds a patched h2 (`vendor/h2`, `[patch.crates-io]`)
//! that serves such a request as if it had no authority and refuses every
//! other malformed request as before; `vendor/README.md` says why, and
//! `src/tests/unix_authority.rs` runs those clients against both endpoints.
use crate::driver::Driver;
use crate::identity::IdentityService;
use crate::node::{service::NodeService, Node};
use pillar_csi_proto::csi::v1::{
    controller_server::ControllerServer, identity_server::IdentityServer, node_server::NodeServer,
};
use std::{
    path::{Path, PathBuf},
    sync::Arc,
};
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;

/// An endpoint that cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Not a `unix://` URL with an absolute path.
    #[error("endpoint {0:?}: expected unix:///absolute/path")]
    Invalid(String),
    /// The socket could not be made.
    #[error("socket {}: {source}", path.display())]
    Socket {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The server failed.
    #[error("gRPC server: {0}")]
    Serve(#[from] tonic::transport::Error),
}

/// The socket path of a `unix:///path` (or `unix:/path`) endpoint.
pub fn socket_path(endpoint: &str) -> Result<PathBuf, Error> {
    let path = endpoint
        .strip_prefix("unix://")
        .or_else(|| endpoint.strip_prefix("unix:"))
        .filter(|p| p.starts_with('/'))
        .ok_or_else(|| Error::Invalid(endpoint.to_owned()))?;
    Ok(PathBuf::from(path))
}

/// Binds the socket at `path`, replacing a stale one left by an earlier
/// run (its folder is created).
pub fn bind(path: &Path) -> Result<UnixListenerStream, Error> {
    let err = |source| Error::Socket {
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    Ok(UnixListenerStream::new(
        UnixListener::bind(path).map_err(err)?,
    ))
}

/// Serves the Identity and Node services of `node` as identity `driver` on
/// the unix socket at `path` until SIGTERM or SIGINT.
pub async fn serve_node(
    node: Arc<Node>,
    driver: Driver,
    version: &str,
    path: &Path,
) -> Result<(), Error> {
    let incoming = bind(path)?;
    let ready = node.clone();
    let identity = IdentityService::new(driver, version, Arc::new(move || ready.ready()));
    tracing::info!(socket = %path.display(), driver = driver.name(), node_id = %node.node_id(), "node plugin serving");
    tonic::transport::Server::builder()
        .add_service(IdentityServer::new(identity))
        .add_service(NodeServer::new(NodeService::new(driver, node)))
        .serve_with_incoming_shutdown(incoming, shutdown_signal())
        .await?;
    Ok(())
}

/// Serves the Identity and Controller services on the unix socket at `path`
/// until SIGTERM or SIGINT. Probe answers ready once the socket serves: the
/// sidecars only need the driver's name and capabilities from it.
pub async fn serve_controller<C: pillar_csi_proto::csi::v1::controller_server::Controller>(
    controller: C,
    driver: Driver,
    version: &str,
    path: &Path,
) -> Result<(), Error> {
    let incoming = bind(path)?;
    let identity = IdentityService::new(driver, version, Arc::new(|| Ok(())));
    tracing::info!(socket = %path.display(), driver = driver.name(), "controller serving");
    tonic::transport::Server::builder()
        .add_service(IdentityServer::new(identity))
        .add_service(ControllerServer::new(controller))
        .serve_with_incoming_shutdown(incoming, shutdown_signal())
        .await?;
    Ok(())
}

/// Resolves on SIGTERM (kubelet stopping the pod) or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
    tracing::info!("shutting down");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_endpoints_are_read_and_others_refused() {
        assert_eq!(
            socket_path("unix:///csi/csi.sock").expect("ok"),
            PathBuf::from("/csi/csi.sock")
        );
        assert_eq!(
            socket_path("unix:/csi/x.sock").expect("ok"),
            PathBuf::from("/csi/x.sock")
        );
        for bad in ["tcp://1.2.3.4:5", "unix://relative", "/csi/csi.sock"] {
            let e = socket_path(bad).expect_err(bad);
            assert!(e.to_string().contains(bad), "{e}");
        }
    }
}
