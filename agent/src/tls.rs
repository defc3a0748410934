//! The agent's mTLS listener: accepts TCP connections and completes each
//! TLS handshake with the server configuration of that moment
//! ([`ServerTls::current`]), so certificates renewed in place are served
//! from the next connection on, without a restart. Handshakes run in tasks
//! of their own (a slow or silent client holds up no one) and end after
//! [`HANDSHAKE_TIMEOUT`]; the finished streams are what tonic serves.
use pillar_csi_proto::tls::ServerTls;
use std::{io, sync::Arc, time::Duration};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::{server::TlsStream, TlsAcceptor};
use tokio_stream::wrappers::ReceiverStream;
use tracing::{debug, warn};

/// How long a client has to complete its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The connections of `listener` after their TLS handshake, for
/// `Server::serve_with_incoming*`. Accepting stops when the stream is
/// dropped.
pub fn incoming(
    listener: TcpListener,
    tls: Arc<ServerTls>,
) -> ReceiverStream<io::Result<TlsStream<TcpStream>>> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = tx.closed() => return,
                a = listener.accept() => a,
            };
            let (tcp, peer) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: pause, go on.
                    warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let tls = tls.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                if let Err(e) = tcp.set_nodelay(true) {
                    debug!(%peer, error = %e, "TCP_NODELAY not set");
                }
                let (config, reload_error) = tls.current();
                if let Some(e) = reload_error {
                    warn!(error = %e, "the TLS files changed but cannot be used; serving the previous ones");
                }
                let handshake = TlsAcceptor::from(config).accept(tcp);
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => debug!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => debug!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}
