//! `pillar-csi controller`: the CSI Controller service on the CSI endpoint,
//! with the Kubernetes API from a kubeconfig or the in-cluster account and
//! agents reached over mTLS.
use clap::Args;
use csi::controller::{
    agents::{AgentTls, Agents},
    Controller,
};
use std::path::PathBuf;

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
    let socket = csi::endpoint::socket_path(&args.endpoint).map_err(|e| e.to_string())?;
    // kube's and tonic's rustls need one process-wide provider; an error
    // means one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let agents = Agents::new(tls.as_ref()).map_err(|e| e.to_string())?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    runtime.block_on(async {
        let client = kube_client(&args).await?;
        let controller = Controller::new(client, agents);
        csi::endpoint::serve_controller(controller, crate::VERSION, &socket)
            .await
            .map_err(|e| e.to_string())
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
