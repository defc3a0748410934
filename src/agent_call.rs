//! Calling an agent from the operator's side: `pillar-csi recovery inspect`
//! and the live `rebind-check` dial the agent over mTLS (as grpcurl's
//! `-cacert`, `-cert`, `-key` and `-servername` do) and print InspectVolume
//! in the proto3 JSON the spec's jq and `recovery sign` read.
use clap::Args;
use pillar_csi_agent::recovery::json::inspection_to_json;
use pillar_csi_proto::agent::v1 as pb;
use pillar_csi_proto::agent::v1::agent_service_client::AgentServiceClient;
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// How to reach an agent over mTLS.
#[derive(Args, Clone, Debug)]
pub struct AgentFlags {
    /// The agent's address, `HOST:PORT` (e.g. `10.0.0.5:9500`).
    #[arg(long, value_name = "HOST:PORT")]
    pub agent: Option<String>,
    /// The client certificate (PEM) the agent's CA issued.
    #[arg(long, value_name = "FILE")]
    pub cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// The CA that signed the agent's server certificate (PEM).
    #[arg(long, value_name = "FILE")]
    pub cacert: Option<PathBuf>,
    /// The name the agent's certificate is checked against (default: the host).
    #[arg(long, value_name = "NAME")]
    pub servername: Option<String>,
}

/// The volume to inspect.
#[derive(Args, Clone, Debug)]
pub struct VolumeFlags {
    /// The agent volume ID, `<vg>/<lv>` (`rebind-check`: default the
    /// record's `spec.agentVolumeID`).
    #[arg(long, value_name = "VG/LV")]
    pub volume_id: Option<String>,
    /// The backend type; InspectVolume takes only `BACKEND_TYPE_LVM`.
    #[arg(long, value_name = "TYPE", default_value = "BACKEND_TYPE_LVM")]
    pub backend_type: String,
}

fn read(what: &str, path: &PathBuf) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{what} {}: {e}", path.display()))
}

/// Calls InspectVolume and returns the answer as proto3 JSON.
pub fn inspect(agent: &AgentFlags, volume: &VolumeFlags) -> Result<Value, String> {
    let address = agent
        .agent
        .as_deref()
        .ok_or("--agent HOST:PORT is missing")?;
    let volume_id = volume
        .volume_id
        .clone()
        .ok_or("--volume-id VG/LV is missing")?;
    let backend_type = pb::BackendType::from_str_name(&volume.backend_type).ok_or_else(|| {
        format!(
            "--backend-type {:?} is not a backend type (InspectVolume takes BACKEND_TYPE_LVM)",
            volume.backend_type
        )
    })? as i32;
    let (Some(cert), Some(key), Some(ca)) = (&agent.cert, &agent.key, &agent.cacert) else {
        let missing: Vec<&str> = [
            ("--cert", agent.cert.is_none()),
            ("--key", agent.key.is_none()),
            ("--cacert", agent.cacert.is_none()),
        ]
        .into_iter()
        .filter_map(|(flag, absent)| absent.then_some(flag))
        .collect();
        return Err(format!(
            "{} missing: the agent gives recovery snapshots only over mTLS",
            missing.join(", ")
        ));
    };
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read("--cacert", ca)?))
        .identity(Identity::from_pem(
            read("--cert", cert)?,
            read("--key", key)?,
        ));
    if let Some(name) = &agent.servername {
        tls = tls.domain_name(name.clone());
    }
    let url = format!("https://{address}");
    let endpoint = Endpoint::from_shared(url.clone())
        .map_err(|e| format!("--agent {address:?}: {e}"))?
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(60))
        .tls_config(tls)
        .map_err(|e| format!("TLS for {address}: {}", chain(&e)))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let answer = runtime.block_on(async {
        let channel = endpoint.connect().await.map_err(|e| {
            format!(
                "agent {address}: no mTLS connection ({}); is it serving plaintext, or is the CA or server name wrong?",
                chain(&e)
            )
        })?;
        AgentServiceClient::new(channel)
            .inspect_volume(pb::InspectVolumeRequest {
                volume_id: volume_id.clone(),
                backend_type,
            })
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| {
                format!(
                    "agent {address}: InspectVolume of {volume_id}: {:?}: {}",
                    s.code(),
                    s.message()
                )
            })
    })?;
    Ok(inspection_to_json(&answer))
}

/// An error with its causes, `a: b: c`.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}

/// `recovery inspect`: the answer, which must carry a snapshot unless
/// `allow_no_snapshot`.
pub fn inspect_for_recovery(
    agent: &AgentFlags,
    volume: &VolumeFlags,
    allow_no_snapshot: bool,
) -> Result<String, String> {
    let answer = inspect(agent, volume)?;
    let text = serde_json::to_string_pretty(&answer).map_err(|e| e.to_string())?;
    if answer.get("snapshot").is_none() && !allow_no_snapshot {
        return Err(format!(
            "InspectVolume answered without a snapshot (--allow-no-snapshot prints it anyway): the agent gives one only to a verified mTLS client, when it runs with --recovery-trust-anchor, while a live lifecycle of an LV adopted through import-lv owns the volume (fence.exists {}, fence.ended {})",
            answer["fence"]["exists"], answer["fence"]["ended"]
        ));
    }
    Ok(text)
}
