//! Reaching agents: one gRPC channel per PillarAgent (address, port, TLS
//! server name), with rustls mTLS from the controller's certificate.
use super::error::{Error, Result};
use super::timed::TimedChannel;
use crate::metrics::Metrics;
use api::crd::{PillarAgent, PillarVolumeState};
use pillar_csi_proto::agent::v1 as pb;
use pillar_csi_proto::agent::v1::agent_service_client::AgentServiceClient;
use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// The controller's client certificate, the agents' CA, and the name agent
/// certificates are issued for (overridden by a PillarAgent's
/// `tlsServerName`).
#[derive(Clone, Debug)]
pub struct AgentTls {
    /// Client certificate (PEM).
    pub cert: PathBuf,
    /// Client private key (PEM).
    pub key: PathBuf,
    /// CA that signed the agents' certificates (PEM).
    pub ca: PathBuf,
    /// The name to verify agent certificates against.
    pub server_name: Option<String>,
}

struct TlsPem {
    identity: Identity,
    ca: Certificate,
    server_name: Option<String>,
}

/// Channels to agents, built lazily and kept per PillarAgent.
pub struct Agents {
    tls: Option<TlsPem>,
    channels: Mutex<HashMap<String, (String, Channel)>>,
    metrics: Option<Arc<Metrics>>,
}

/// A client of one agent, and its name for messages.
pub struct AgentClient {
    /// The PillarAgent's name.
    pub name: String,
    /// The gRPC client.
    pub client: AgentServiceClient<TimedChannel>,
}

impl Agents {
    /// Reads the TLS files once (a missing or unreadable file stops the
    /// start, naming it); `None` means plaintext (labs only).
    pub fn new(tls: Option<&AgentTls>) -> Result<Self> {
        let read = |p: &PathBuf| {
            std::fs::read(p)
                .map_err(|e| Error::InvalidArgument(format!("agent TLS file {}: {e}", p.display())))
        };
        let tls = match tls {
            None => None,
            Some(t) => Some(TlsPem {
                identity: Identity::from_pem(read(&t.cert)?, read(&t.key)?),
                ca: Certificate::from_pem(read(&t.ca)?),
                server_name: t.server_name.clone(),
            }),
        };
        Ok(Agents {
            tls,
            channels: Mutex::new(HashMap::new()),
            metrics: None,
        })
    }

    /// Times every agent RPC into `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    fn endpoint(&self, agent: &PillarAgent) -> Result<(String, Endpoint)> {
        let name = agent.metadata.name.clone().unwrap_or_default();
        let host = match agent.spec.address.parse::<IpAddr>() {
            Ok(IpAddr::V6(v6)) => format!("[{v6}]"),
            _ => agent.spec.address.clone(),
        };
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let url = format!("{scheme}://{host}:{}", agent.spec.port);
        let bad = |e: tonic::transport::Error| {
            Error::Unavailable(format!("PillarAgent {name:?} endpoint {url}: {e}"))
        };
        let mut endpoint = Endpoint::from_shared(url.clone())
            .map_err(bad)?
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(120));
        let mut key = url.clone();
        if let Some(tls) = &self.tls {
            let mut config = ClientTlsConfig::new()
                .ca_certificate(tls.ca.clone())
                .identity(tls.identity.clone());
            let server_name = agent
                .spec
                .tls_server_name
                .clone()
                .or_else(|| tls.server_name.clone());
            if let Some(sni) = server_name {
                key.push_str(&format!(" sni={sni}"));
                config = config.domain_name(sni);
            }
            endpoint = endpoint.tls_config(config).map_err(bad)?;
        }
        Ok((key, endpoint))
    }

    /// A client of `agent`, reusing its channel while its address, port
    /// and server name stay the same.
    pub fn client(&self, agent: &PillarAgent) -> Result<AgentClient> {
        let name = agent.metadata.name.clone().unwrap_or_default();
        let (key, endpoint) = self.endpoint(agent)?;
        let mut channels = self
            .channels
            .lock()
            .map_err(|_| Error::Unavailable("agent channel cache poisoned".into()))?;
        let channel = match channels.get(&name) {
            Some((k, ch)) if *k == key => ch.clone(),
            _ => {
                let ch = endpoint.connect_lazy();
                channels.insert(name.clone(), (key, ch.clone()));
                ch
            }
        };
        Ok(AgentClient {
            name,
            client: AgentServiceClient::new(TimedChannel::new(channel, self.metrics.clone())),
        })
    }
}

impl AgentClient {
    /// Wraps the agent's answer with its name.
    pub fn fail(&self) -> impl FnOnce(tonic::Status) -> Error + '_ {
        move |status| Error::Agent {
            agent: self.name.clone(),
            status,
        }
    }

    /// Ends the agent's lifecycle of a record's volume under the record's
    /// fence token: ReleaseVolume (the volume stays, as it was found) when
    /// `release`, else DeleteVolume (the volume is destroyed).
    pub async fn end_lifecycle(&mut self, state: &PillarVolumeState, release: bool) -> Result<()> {
        let fence = Some(super::state::fence(state, super::state::generation(state)));
        let volume_id = state.spec.agent_volume_id.clone();
        let backend_type = super::backend_type(state.spec.backend_type);
        if release {
            let request = pb::ReleaseVolumeRequest {
                volume_id,
                backend_type,
                fence,
            };
            self.client
                .release_volume(request)
                .await
                .map_err(self.fail())?;
        } else {
            let request = pb::DeleteVolumeRequest {
                volume_id,
                backend_type,
                fence,
            };
            self.client
                .delete_volume(request)
                .await
                .map_err(self.fail())?;
        }
        Ok(())
    }
}
