//! Reaching agents: one gRPC channel per PillarAgent (address, port, TLS
//! server name), with rustls mTLS from the controller's certificate. The
//! TLS files are re-read at every new connection's handshake
//! (`pillar_csi_proto::tls`), so a certificate renewed in place is used
//! from the next connection on, without a restart.
use super::error::{Error, Result};
use super::timed::TimedChannel;
use crate::metrics::Metrics;
use api::crd::{PillarAgent, PillarVolumeState};
use hyper_util::rt::TokioIo;
use pillar_csi_proto::agent::v1 as pb;
use pillar_csi_proto::agent::v1::agent_service_client::AgentServiceClient;
use pillar_csi_proto::tls::{ClientTls, TlsFiles};
use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::ServerName;
use tonic::transport::{Channel, Endpoint, Uri};
use tracing::warn;

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
    config: Arc<ClientTls>,
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
    /// Reads the TLS files (a missing or unusable file stops the start,
    /// naming it; later changes are read at each new connection); `None`
    /// means plaintext (labs only).
    pub fn new(tls: Option<&AgentTls>) -> Result<Self> {
        let tls = match tls {
            None => None,
            Some(t) => Some(TlsPem {
                config: Arc::new(
                    ClientTls::client(TlsFiles {
                        cert: t.cert.clone(),
                        key: t.key.clone(),
                        ca: t.ca.clone(),
                    })
                    .map_err(|e| Error::InvalidArgument(format!("agent {e}")))?,
                ),
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

    fn endpoint(&self, agent: &PillarAgent) -> Result<(String, Endpoint, Option<TlsConnector>)> {
        let name = agent.metadata.name.clone().unwrap_or_default();
        let host = match agent.spec.address.parse::<IpAddr>() {
            Ok(IpAddr::V6(v6)) => format!("[{v6}]"),
            _ => agent.spec.address.clone(),
        };
        // TLS is the connector's (below), so tonic sees plain http.
        let url = format!("http://{host}:{}", agent.spec.port);
        let bad = |e: tonic::transport::Error| {
            Error::Unavailable(format!("PillarAgent {name:?} endpoint {url}: {e}"))
        };
        let endpoint = Endpoint::from_shared(url.clone())
            .map_err(bad)?
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(120));
        let mut key = url.clone();
        let connector = self.tls.as_ref().map(|tls| {
            let server_name = agent
                .spec
                .tls_server_name
                .clone()
                .or_else(|| tls.server_name.clone());
            key.push_str(&format!(" tls sni={server_name:?}"));
            TlsConnector {
                tls: tls.config.clone(),
                server_name,
            }
        });
        Ok((key, endpoint, connector))
    }

    /// A client of `agent`, reusing its channel while its address, port
    /// and server name stay the same.
    pub fn client(&self, agent: &PillarAgent) -> Result<AgentClient> {
        let name = agent.metadata.name.clone().unwrap_or_default();
        let (key, endpoint, connector) = self.endpoint(agent)?;
        let mut channels = self
            .channels
            .lock()
            .map_err(|_| Error::Unavailable("agent channel cache poisoned".into()))?;
        let channel = match channels.get(&name) {
            Some((k, ch)) if *k == key => ch.clone(),
            _ => {
                let ch = match connector {
                    Some(c) => endpoint.connect_with_connector_lazy(c),
                    None => endpoint.connect_lazy(),
                };
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

/// Opens a channel's connections: TCP, then a TLS handshake with the
/// client configuration of that moment.
#[derive(Clone)]
struct TlsConnector {
    tls: Arc<ClientTls>,
    /// The name agent certificates are checked against; else the host.
    server_name: Option<String>,
}

impl tower_service::Service<Uri> for TlsConnector {
    type Response = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let invalid = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, why);
            let host = uri
                .host()
                .ok_or_else(|| invalid(format!("{uri}: no host")))?
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned();
            let port = uri
                .port_u16()
                .ok_or_else(|| invalid(format!("{uri}: no port")))?;
            let name = this.server_name.clone().unwrap_or_else(|| host.clone());
            let name =
                ServerName::try_from(name).map_err(|e| invalid(format!("TLS server name: {e}")))?;
            let tcp = TcpStream::connect((host.as_str(), port)).await?;
            tcp.set_nodelay(true)?;
            let (config, reload_error) = this.tls.current();
            if let Some(e) = reload_error {
                warn!(error = %e, "the agent TLS files changed but cannot be used; keeping the previous ones");
            }
            let tls = tokio_rustls::TlsConnector::from(config)
                .connect(name, tcp)
                .await?;
            Ok(TokioIo::new(tls))
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
