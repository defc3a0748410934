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

#[cfg(test)]
mod tests {
    use pillar_csi_lab::tls::Ca;
    use pillar_csi_proto::tls::{ServerTls, TlsError, TlsFiles};
    use std::sync::Arc;

    type R = Result<(), Box<dyn std::error::Error + Send + Sync>>;

    #[test]
    fn a_changed_file_is_read_once_and_a_bad_change_keeps_the_previous_configuration() -> R {
        let dir = tempfile::tempdir()?;
        let ca = Ca::new(dir.path(), "ca")?;
        let first = ca.server("agent", [127, 0, 0, 1].into())?;
        let files = TlsFiles {
            cert: dir.path().join("tls.crt"),
            key: dir.path().join("tls.key"),
            ca: ca.pem.cert.clone(),
        };
        std::fs::copy(&first.cert, &files.cert)?;
        std::fs::copy(&first.key, &files.key)?;
        let tls = ServerTls::server(files.clone())?;
        let (built, error) = tls.current();
        assert!(error.is_none());
        let (again, error) = tls.current();
        assert!(
            Arc::ptr_eq(&built, &again) && error.is_none(),
            "unchanged: not rebuilt"
        );

        // A renewal half written: the new certificate, the old key.
        let second = ca.server("agent-2", [127, 0, 0, 1].into())?;
        std::fs::copy(&second.cert, &files.cert)?;
        let (kept, error) = tls.current();
        assert!(
            Arc::ptr_eq(&built, &kept),
            "the previous configuration stays"
        );
        assert!(matches!(error, Some(TlsError::Config { .. })), "{error:?}");
        let (kept, error) = tls.current();
        assert!(
            Arc::ptr_eq(&built, &kept) && error.is_none(),
            "reported once"
        );

        // A key file that is not PEM: named, its content not shown.
        std::fs::write(&files.key, "secret-bytes-not-pem")?;
        let (_, error) = tls.current();
        let shown = error.ok_or("no error for a bad key")?.to_string();
        assert!(
            shown.contains("tls.key") && !shown.contains("secret-bytes"),
            "{shown}"
        );

        // The renewal complete: rebuilt.
        std::fs::copy(&second.key, &files.key)?;
        let (renewed, error) = tls.current();
        assert!(error.is_none(), "{error:?}");
        assert!(!Arc::ptr_eq(&built, &renewed), "rebuilt from the new files");
        Ok(())
    }
}
