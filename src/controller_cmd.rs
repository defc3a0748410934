//! `pillar-csi controller`: the CSI Controller service on the CSI endpoint,
//! with the Kubernetes API from a kubeconfig or the in-cluster account and
//! agents reached over mTLS; beside it the reconcilers (on the leader only
//! with `--leader-elect`) and, with `--metrics-address`, `/metrics`.
use clap::Args;
use csi::controller::{
    agents::{AgentTls, Agents},
    Controller,
};
use csi::driver::Driver;
use csi::metrics::{http as metrics_http, metered::Metered, Metrics};
use csi::reconcile::{leader::Election, parse_duration, Reconcilers, Settings};
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::watch;

/// Arguments of `pillar-csi controller`.
#[derive(Args)]
pub struct ControllerArgs {
    /// A kubeconfig file for the Kubernetes API (else `--in-cluster`).
    #[arg(
        long,
        conflicts_with = "in_cluster",
        required_unless_present = "in_cluster"
    )]
    kubeconfig: Option<PathBuf>,
    /// Use the pod's ServiceAccount.
    #[arg(long)]
    in_cluster: bool,
    /// The CSI endpoint the sidecars connect to.
    #[arg(long, default_value = "unix:///csi/csi.sock")]
    endpoint: String,
    /// Also serve the filesystem identity (`files.pillar-csi.bhyoo.com`:
    /// ZFS filesystems and directories over NFS) on this endpoint, for its own sidecars.
    #[arg(long)]
    files_endpoint: Option<String>,
    /// Client certificate presented to agents (PEM).
    #[arg(long)]
    agent_tls_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long)]
    agent_tls_key: Option<PathBuf>,
    /// CA that signed the agents' certificates (PEM).
    #[arg(long)]
    agent_tls_ca: Option<PathBuf>,
    /// Name agent certificates are issued for (a PillarAgent's
    /// `tlsServerName` overrides it; default: the agent's address).
    #[arg(long)]
    agent_tls_server_name: Option<String>,
    /// Reach agents without TLS (labs only).
    #[arg(long)]
    agent_insecure_plaintext: bool,
    /// Serve Prometheus metrics on `host:port` or `:port` (e.g. `:8080`) at
    /// `/metrics`; off when absent.
    #[arg(long)]
    metrics_address: Option<String>,
    /// How often every recorded export is re-sent to its agent with
    /// ReconcileState (also once on start or on becoming leader): `30s`, `5m`, `1h`.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    sync_period: std::time::Duration,
    /// How often StorageClasses, agent health and the abandoned-volume
    /// reaper run.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    reconcile_interval: std::time::Duration,
    /// Run the reconcilers only while holding the leader Lease (for more
    /// than one replica). The CSI service runs in every replica: the
    /// sidecars elect their own leader.
    #[arg(long)]
    leader_elect: bool,
    /// The Lease's namespace (default: $POD_NAMESPACE, else pillar-csi).
    #[arg(long)]
    leader_election_namespace: Option<String>,
    /// The Lease's name.
    #[arg(long, default_value = "pillar-csi-controller")]
    leader_election_lease_name: String,
    /// How long a Lease not renewed stays its holder's.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    leader_election_lease_duration: std::time::Duration,
    /// This replica's identity in the Lease (default: $POD_NAME, else the host name).
    #[arg(long)]
    leader_election_identity: Option<String>,
}

/// The leader election the flags ask for, if any.
fn election(args: &ControllerArgs) -> Option<Election> {
    if !args.leader_elect {
        return None;
    }
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    Some(Election {
        namespace: args
            .leader_election_namespace
            .clone()
            .or_else(|| env("POD_NAMESPACE"))
            .unwrap_or_else(|| "pillar-csi".into()),
        name: args.leader_election_lease_name.clone(),
        identity: args
            .leader_election_identity
            .clone()
            .or_else(|| env("POD_NAME"))
            .or_else(|| {
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .ok()
                    .map(|h| h.trim().to_owned())
            })
            .unwrap_or_else(|| format!("pillar-csi-controller-{}", std::process::id())),
        lease_duration: args.leader_election_lease_duration,
    })
}

/// The agent TLS settings: all three files, or none with
/// `--agent-insecure-plaintext`; anything else is refused, naming what is missing.
fn agent_tls(args: &ControllerArgs) -> Result<Option<AgentTls>, String> {
    let files = [
        ("--agent-tls-cert", &args.agent_tls_cert),
        ("--agent-tls-key", &args.agent_tls_key),
        ("--agent-tls-ca", &args.agent_tls_ca),
    ];
    let missing: Vec<&str> = files
        .iter()
        .filter(|(_, v)| v.is_none())
        .map(|(n, _)| *n)
        .collect();
    match (missing.len(), args.agent_insecure_plaintext) {
        (0, true) => Err("--agent-insecure-plaintext conflicts with the agent TLS files".into()),
        (0, false) => Ok(Some(AgentTls {
            cert: args.agent_tls_cert.clone().unwrap_or_default(),
            key: args.agent_tls_key.clone().unwrap_or_default(),
            ca: args.agent_tls_ca.clone().unwrap_or_default(),
            server_name: args.agent_tls_server_name.clone(),
        })),
        (3, true) => Ok(None),
        (3, false) => Err(
            "agents are reached over mTLS: give --agent-tls-cert, --agent-tls-key and --agent-tls-ca (or --agent-insecure-plaintext in a lab)".into(),
        ),
        _ => Err(format!("agent TLS is incomplete: missing {}", missing.join(", "))),
    }
}

async fn kube_client(args: &ControllerArgs) -> Result<kube::Client, String> {
    let config = match &args.kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| format!("kubeconfig {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &Default::default())
                .await
                .map_err(|e| format!("kubeconfig {}: {e}", path.display()))?
        }
        None => kube::Config::incluster().map_err(|e| format!("in-cluster config: {e}"))?,
    };
    kube::Client::try_from(config).map_err(|e| format!("Kubernetes client: {e}"))
}

/// Runs the subcommand until SIGTERM or SIGINT.
pub fn run(args: ControllerArgs) -> Result<(), String> {
    let tls = agent_tls(&args)?;
    let (socket, files_socket) =
        crate::csi_sockets(&args.endpoint, args.files_endpoint.as_deref())?;
    // kube's and tonic's rustls need one process-wide provider; an error
    // means one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let metrics_address = args
        .metrics_address
        .as_deref()
        .map(metrics_http::parse_address)
        .transpose()?;
    let election = election(&args);
    let settings = Settings {
        interval: args.reconcile_interval,
        sync_period: args.sync_period,
        files: files_socket.is_some(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    runtime.block_on(async {
        let client = kube_client(&args).await?;
        let metrics = Arc::new(Metrics::default());
        let agents = Agents::new(tls.as_ref())
            .map_err(|e| e.to_string())?
            .with_metrics(metrics.clone());
        let reconcile_agents = Agents::new(tls.as_ref())
            .map_err(|e| e.to_string())?
            .with_metrics(metrics.clone());
        let server = match metrics_address {
            Some(address) => {
                let listener = metrics_http::bind(address).await?;
                tracing::info!(%address, "metrics serving");
                Some(tokio::spawn(metrics_http::serve(listener, metrics.clone())))
            }
            None => None,
        };
        let reconcilers =
            Reconcilers::new(client.clone(), reconcile_agents, metrics.clone(), settings);
        let (leading_tx, leading) = watch::channel(election.is_none());
        let (stop_tx, stop) = watch::channel(false);
        // Without election this replica always leads: the sender is kept
        // (a dropped sender ends the reconcilers).
        let (elector, _always) = match election {
            Some(e) => (
                Some(tokio::spawn(e.run(client.clone(), leading_tx, stop))),
                None,
            ),
            None => (None, Some(leading_tx)),
        };
        let reconciling = tokio::spawn(async move { reconcilers.run(leading).await });
        let block = Metered::new(
            Controller::serving(Driver::Block, client.clone(), agents),
            metrics.clone(),
        );
        let block = csi::endpoint::serve_controller(block, Driver::Block, crate::VERSION, &socket);
        let served = match &files_socket {
            Some(files_socket) => {
                let agents = Agents::new(tls.as_ref())
                    .map_err(|e| e.to_string())?
                    .with_metrics(metrics.clone());
                let files =
                    Metered::new(Controller::serving(Driver::Files, client, agents), metrics);
                let files = csi::endpoint::serve_controller(
                    files,
                    Driver::Files,
                    crate::VERSION,
                    files_socket,
                );
                tokio::try_join!(block, files).map(drop)
            }
            None => block.await,
        }
        .map_err(|e| e.to_string());
        // Release the Lease (if held) before leaving, so another replica
        // takes over at once.
        stop_tx.send_replace(true);
        if let Some(elector) = elector {
            let _ = elector.await;
        }
        reconciling.abort();
        if let Some(server) = server {
            server.abort();
        }
        served
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ControllerArgs,
    }

    fn parse(argv: &[&str]) -> Result<ControllerArgs, String> {
        Cli::try_parse_from(std::iter::once("controller").chain(argv.iter().copied()))
            .map(|c| c.args)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn kubeconfig_and_in_cluster_are_one_or_the_other() {
        assert!(parse(&["--in-cluster", "--kubeconfig", "k"]).is_err());
        assert!(parse(&[]).is_err());
        let a = parse(&["--in-cluster"]).expect("in-cluster");
        assert_eq!(a.endpoint, "unix:///csi/csi.sock");
    }

    #[test]
    fn agent_tls_is_all_three_files_or_plaintext_by_choice() {
        let a = parse(&["--in-cluster"]).expect("args");
        assert!(agent_tls(&a)
            .err()
            .is_some_and(|e| e.contains("--agent-tls-cert")));
        let a = parse(&[
            "--in-cluster",
            "--agent-tls-cert",
            "c",
            "--agent-tls-ca",
            "ca",
        ])
        .expect("args");
        assert_eq!(
            agent_tls(&a).err().as_deref(),
            Some("agent TLS is incomplete: missing --agent-tls-key")
        );
        let a = parse(&["--in-cluster", "--agent-insecure-plaintext"]).expect("args");
        assert!(matches!(agent_tls(&a), Ok(None)));
        let a = parse(&[
            "--in-cluster",
            "--agent-tls-cert",
            "c",
            "--agent-tls-key",
            "k",
            "--agent-tls-ca",
            "ca",
            "--agent-tls-server-name",
            "pillar-csi-agent.pillar-csi.svc",
        ])
        .expect("args");
        let tls = agent_tls(&a).ok().flatten().expect("tls");
        assert_eq!(
            tls.server_name.as_deref(),
            Some("pillar-csi-agent.pillar-csi.svc")
        );
    }
}
