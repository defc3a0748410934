//! A minimal HTTP/1.1 server for `GET /metrics` (and `GET /healthz`): one
//! request per connection, answered and closed. Prometheus needs no more.
use super::Metrics;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// The longest request head read (bytes); a longer one is refused.
const MAX_HEAD: usize = 8192;

/// Parses `--metrics-address`: `host:port`, or `:port` for every address.
pub fn parse_address(text: &str) -> Result<SocketAddr, String> {
    let full = if text.starts_with(':') {
        format!("0.0.0.0{text}")
    } else {
        text.to_owned()
    };
    full.parse().map_err(|e| {
        format!("--metrics-address {text:?}: expected host:port or :port (e.g. :8080): {e}")
    })
}

/// Binds `address`; the error names it.
pub async fn bind(address: SocketAddr) -> Result<TcpListener, String> {
    TcpListener::bind(address)
        .await
        .map_err(|e| format!("metrics address {address}: {e}"))
}

/// Serves `metrics` on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    loop {
        let (mut stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "metrics: accept failed");
                continue;
            }
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_HEAD {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let reply = answer(&String::from_utf8_lossy(&head), &metrics);
            if let Err(e) = stream.write_all(reply.as_bytes()).await {
                tracing::debug!(%peer, error = %e, "metrics: reply not sent");
            }
            let _ = stream.shutdown().await;
        });
    }
}

/// The whole HTTP response to a request head.
fn answer(head: &str, metrics: &Metrics) -> String {
    let line = head.lines().next().unwrap_or_default();
    let mut words = line.split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, kind, body) = match (method, path) {
        ("GET", "/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            metrics.render(),
        ),
        ("GET", "/healthz") => ("200 OK", "text/plain; charset=utf-8", "ok\n".to_owned()),
        ("GET", _) => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            format!("no such path {path:?}: try /metrics\n"),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            format!("method {method:?} is not served: use GET\n"),
        ),
    };
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_take_a_bare_port() {
        assert_eq!(
            parse_address(":8080").ok(),
            Some("0.0.0.0:8080".parse().expect("addr"))
        );
        assert!(parse_address("127.0.0.1:9").is_ok());
        let e = parse_address("8080").err().unwrap_or_default();
        assert!(e.contains("\"8080\""), "{e}");
    }

    #[test]
    fn only_get_metrics_serves_the_text() {
        let m = Metrics::default();
        m.set_leader(true);
        let ok = answer("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", &m);
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.contains("\r\n\r\n# HELP") && ok.contains("pillar_csi_leader 1\n"));
        assert!(answer("GET /other HTTP/1.1\r\n\r\n", &m).starts_with("HTTP/1.1 404"));
        assert!(answer("POST /metrics HTTP/1.1\r\n\r\n", &m).starts_with("HTTP/1.1 405"));
    }
}
