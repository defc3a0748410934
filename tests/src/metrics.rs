//! The controller's Prometheus `/metrics`, read by the benchmarks to say
//! where a claim's time goes (the controller's and the agent's RPC
//! latency histograms).
use crate::Result;
use std::collections::HashMap;

/// `GET /metrics` at `addr`: every series with its value.
pub async fn scrape(addr: std::net::SocketAddr) -> Result<HashMap<String, f64>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await?;
    let (_, body) = reply.split_once("\r\n\r\n").ok_or("no HTTP head")?;
    let mut out = HashMap::new();
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        if let Some((series, value)) = line.rsplit_once(' ') {
            out.insert(series.to_owned(), value.parse::<f64>()?);
        }
    }
    Ok(out)
}

/// The sum of the `<family>_sum` series whose method is one of `methods`.
pub fn summed(metrics: &HashMap<String, f64>, family: &str, methods: &[&str]) -> f64 {
    let prefix = format!("{family}_sum{{method=\"");
    metrics
        .iter()
        .filter_map(|(series, v)| {
            let rest = series.strip_prefix(&prefix)?;
            let method = rest.split('"').next()?;
            methods.contains(&method).then_some(*v)
        })
        .sum()
}

/// The controller's seconds in `controller_methods` (its CSI RPCs) and
/// the agent's in `agent_methods` (the agent RPCs the controller made),
/// each summed over every call so far, from `/metrics` at `addr`.
pub async fn clocks(
    addr: std::net::SocketAddr,
    controller_methods: &[&str],
    agent_methods: &[&str],
) -> Result<(f64, f64)> {
    let m = scrape(addr).await?;
    Ok((
        summed(
            &m,
            "pillar_csi_controller_rpc_duration_seconds",
            controller_methods,
        ),
        summed(&m, "pillar_csi_agent_rpc_duration_seconds", agent_methods),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_count_only_the_named_methods() {
        let m: HashMap<String, f64> = [
            ("f_sum{method=\"CreateVolume\",code=\"OK\"}", 1.5),
            ("f_sum{method=\"CreateVolume\",code=\"Aborted\"}", 0.5),
            ("f_sum{method=\"ListVolumes\",code=\"OK\"}", 9.0),
            ("f_count{method=\"CreateVolume\",code=\"OK\"}", 3.0),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        assert_eq!(summed(&m, "f", &["CreateVolume"]), 2.0);
        assert_eq!(summed(&m, "f", &["DeleteVolume"]), 0.0);
    }
}
