//! The controller's agent channels when the controller's client
//! certificate is renewed in place (cert-manager's Secret, swapped by
//! kubelet through `..data`): the next connection uses the new files, the
//! controller not restarted. Between them a relay the test cuts before
//! each call, so every call makes a new connection. No API server is
//! needed: the channel is built from a PillarAgent object.
#![allow(clippy::unwrap_used)]
use api::crd::{PillarAgent, PillarAgentSpec};
use csi::controller::agents::{AgentTls, Agents};
use pillar_csi_agent::grpc::AgentGrpc;
use pillar_csi_agent::service::sim;
use pillar_csi_lab::tls::{Ca, Projected};
use pillar_csi_proto::agent::v1 as ag;
use pillar_csi_proto::agent::v1::agent_service_server::AgentServiceServer;
use pillar_csi_proto::tls::{ServerTls, TlsFiles};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tonic::transport::Server;

type R<T = ()> = pillar_csi_lab::Result<T>;

/// A TCP relay to the agent whose connections the test can cut, as an
/// agent restart or the network ends them over a certificate's 90 days.
struct Relay {
    port: u16,
    connections: Arc<Mutex<JoinSet<()>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn to(port: u16) -> R<Relay> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let relay_port = listener.local_addr()?.port();
        let connections = Arc::new(Mutex::new(JoinSet::new()));
        let held = connections.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                held.lock().unwrap().spawn(async move {
                    if let Ok(mut out) = TcpStream::connect(("127.0.0.1", port)).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                    }
                });
            }
        });
        Ok(Relay {
            port: relay_port,
            connections,
            task,
        })
    }

    /// Ends every connection through the relay.
    fn cut(&self) {
        self.connections.lock().unwrap().abort_all();
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Calls HealthCheck through `agents`, each call on a new connection (the
/// relay cut before it), until `done` holds for the answer, at most
/// `within`; returns the last answer's text.
async fn until(
    relay: &Relay,
    agents: &Agents,
    agent: &PillarAgent,
    within: Duration,
    done: impl Fn(&Result<(), String>) -> bool,
) -> R<Result<(), String>> {
    let deadline = Instant::now() + within;
    loop {
        relay.cut();
        let mut client = agents.client(agent)?;
        let answer = client
            .client
            .health_check(ag::HealthCheckRequest {})
            .await
            .map(|_| ())
            .map_err(|e| format!("{e:?}"));
        if done(&answer) {
            return Ok(answer);
        }
        if Instant::now() > deadline {
            return Err(format!("not within {within:?}; last answer {answer:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_renewed_in_place_is_used_without_a_restart() -> R {
    let started = Instant::now();
    let at = |what: &str| eprintln!("{:5.1} s  {what}", started.elapsed().as_secs_f64());
    let dir = tempfile::tempdir()?;
    let ca = Ca::new(dir.path(), "pillar-test-ca")?;
    let server = ca.server("agent", "127.0.0.1".parse()?)?;
    // The agent's own listener (pillar_csi_agent::tls): no session
    // resumption, so every connection's client certificate is checked.
    let tls = ServerTls::server(TlsFiles {
        cert: server.cert,
        key: server.key,
        ca: ca.pem.cert.clone(),
    })?;
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let port = listener.local_addr()?.port();
    let router = Server::builder().add_service(AgentServiceServer::new(AgentGrpc::new(
        sim::fixture().agent.clone(),
        "sim",
    )));
    let served = tokio::spawn(
        router.serve_with_incoming(pillar_csi_agent::tls::incoming(listener, Arc::new(tls))),
    );

    let relay = Relay::to(port).await?;
    let short = ca.short_lived_client("pillar-csi-controller", Duration::from_secs(8))?;
    let mut mounted = Projected::new(&dir.path().join("mtls"), &short, &ca.pem.cert)?;
    let agents = Agents::new(Some(&AgentTls {
        cert: mounted.pem.cert.clone(),
        key: mounted.pem.key.clone(),
        ca: mounted.ca.clone(),
        server_name: None,
    }))?;
    let agent = PillarAgent::new(
        "storage-1",
        PillarAgentSpec {
            address: "127.0.0.1".into(),
            port: relay.port,
            tls_server_name: None,
            node_name: None,
        },
    );
    at("controller's client certificate valid for 8 s");
    let _ = until(
        &relay,
        &agents,
        &agent,
        Duration::from_secs(10),
        Result::is_ok,
    )
    .await?;
    at("an agent call is answered");
    let refused = until(&relay, &agents, &agent, Duration::from_secs(20), |a| {
        a.as_ref().is_err_and(|e| e.contains("Expired"))
    })
    .await?;
    at(&format!(
        "the certificate expired: a new connection's handshake fails ({})",
        refused.err().unwrap_or_default()
    ));
    let renewed = ca.client("pillar-csi-controller-renewed")?;
    mounted.swap(&renewed, &ca.pem.cert)?;
    at("renewed in place (..data swapped to the new files)");
    let _ = until(
        &relay,
        &agents,
        &agent,
        Duration::from_secs(10),
        Result::is_ok,
    )
    .await?;
    at("an agent call is answered on a new connection, the controller not restarted");
    served.abort();
    Ok(())
}
