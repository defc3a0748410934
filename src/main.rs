//! `pillar-csi`: the one binary of the driver; each role is a subcommand.
use clap::{Args, Parser, Subcommand};
use pillar_csi_agent::{config::AgentConfig, server};
use std::{net::IpAddr, net::SocketAddr, path::PathBuf, process::ExitCode};

#[derive(Parser)]
#[command(
    name = "pillar-csi",
    version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("PILLAR_CSI_COMMIT"), ")"),
    about = "CSI driver for ZFS zvols and LVM logical volumes over NVMe-oF/TCP and iSCSI"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the storage-node agent (gRPC, port 9500).
    Agent(Box<AgentArgs>),
    /// Run the CSI node plugin (Identity and Node services on a unix socket).
    Node(NodeArgs),
    /// Print the version and the commit this binary was built from.
    Version,
}

/// The node plugin's flags.
#[derive(Args)]
struct NodeArgs {
    /// The CSI endpoint kubelet dials.
    #[arg(long, default_value = "unix:///csi/csi.sock")]
    endpoint: String,
    /// This Kubernetes node's name (the pod's `spec.nodeName`).
    #[arg(long)]
    node_name: String,
    /// Folder of per-volume staging records.
    #[arg(long, default_value = "/var/lib/pillar-csi/node")]
    state_dir: PathBuf,
    /// iSCSI is used on this node: Probe then needs a reachable iscsid.
    #[arg(long)]
    iscsi: bool,
}

/// Flags override the configuration file.
#[derive(Args)]
struct AgentArgs {
    /// A YAML configuration file (same keys as the flags, camelCase).
    #[arg(long)]
    config: Option<PathBuf>,
    /// A backend: `zfs=<pool>[/<parentDataset>]` or `lvm=<vg>[/<thinPool>]`;
    /// repeatable. Given at least once, these replace the file's backends.
    #[arg(long = "backend", value_name = "KIND=NAME")]
    backends: Vec<String>,
    /// gRPC listen address.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Folder of durable fence marks.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Server certificate (PEM).
    #[arg(long)]
    tls_cert: Option<PathBuf>,
    /// Server private key (PEM).
    #[arg(long)]
    tls_key: Option<PathBuf>,
    /// CA of client certificates (PEM); clients must present one it signed.
    #[arg(long)]
    tls_client_ca: Option<PathBuf>,
    /// Serve gRPC without TLS (labs only).
    #[arg(long)]
    insecure_plaintext: bool,
    /// Address NVMe/TCP initiators connect to.
    #[arg(long)]
    nvmeof_address: Option<IpAddr>,
    /// NVMe/TCP port.
    #[arg(long)]
    nvmeof_port: Option<u16>,
    /// Address iSCSI initiators connect to.
    #[arg(long)]
    iscsi_address: Option<IpAddr>,
    /// iSCSI port.
    #[arg(long)]
    iscsi_port: Option<u16>,
    /// Seconds between resyncs of exports from the fence marks (0: never).
    #[arg(long)]
    resync_interval_seconds: Option<u64>,
}

fn agent_config(args: AgentArgs) -> Result<AgentConfig, String> {
    let mut c = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("config file {}: {e}", path.display()))?;
            AgentConfig::from_yaml(&text).map_err(|e| e.to_string())?
        }
        None => AgentConfig::default(),
    };
    c.override_backends(&args.backends)
        .map_err(|e| e.to_string())?;
    c.listen = args.listen.unwrap_or(c.listen);
    c.state_dir = args.state_dir.unwrap_or(c.state_dir);
    c.tls.cert = args.tls_cert.or(c.tls.cert);
    c.tls.key = args.tls_key.or(c.tls.key);
    c.tls.client_ca = args.tls_client_ca.or(c.tls.client_ca);
    c.insecure_plaintext |= args.insecure_plaintext;
    c.nvmeof.address = args.nvmeof_address.unwrap_or(c.nvmeof.address);
    c.nvmeof.port = args.nvmeof_port.unwrap_or(c.nvmeof.port);
    c.iscsi.address = args.iscsi_address.unwrap_or(c.iscsi.address);
    c.iscsi.port = args.iscsi_port.unwrap_or(c.iscsi.port);
    c.resync_interval_seconds = args
        .resync_interval_seconds
        .unwrap_or(c.resync_interval_seconds);
    c.validate().map_err(|e| e.to_string())?;
    Ok(c)
}

fn run_agent(args: AgentArgs) -> Result<(), String> {
    let config = agent_config(args)?;
    let version = format!(
        "{} ({})",
        env!("CARGO_PKG_VERSION"),
        env!("PILLAR_CSI_COMMIT")
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(64)
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    runtime.block_on(async {
        let backends = server::open_backends(&config).map_err(|e| e.to_string())?;
        let agent = server::build(&config, backends).map_err(|e| e.to_string())?;
        server::serve(&config, agent, &version)
            .await
            .map_err(|e| e.to_string())
    })
}

fn run_node(args: NodeArgs) -> Result<(), String> {
    use csi::node::{Fault, Node, NodeConfig};
    let mut config = NodeConfig::new(&args.node_name);
    config.state_dir = args.state_dir;
    config.iscsi = args.iscsi;
    // Tests only: stop NodeStageVolume at a chosen point (see `Fault`).
    config.fault = std::env::var("PILLAR_CSI_NODE_FAULT")
        .ok()
        .and_then(|v| Fault::parse(&v));
    let socket = csi::endpoint::socket_path(&args.endpoint).map_err(|e| e.to_string())?;
    let node = std::sync::Arc::new(Node::new(config).map_err(|e| e.to_string())?);
    let version = format!(
        "{} ({})",
        env!("CARGO_PKG_VERSION"),
        env!("PILLAR_CSI_COMMIT")
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(64)
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    runtime
        .block_on(csi::endpoint::serve_node(node, &version, &socket))
        .map_err(|e| e.to_string())
}

fn init_logs() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Version => {
            println!(
                "pillar-csi {} ({})",
                env!("CARGO_PKG_VERSION"),
                env!("PILLAR_CSI_COMMIT")
            );
            ExitCode::SUCCESS
        }
        Command::Node(args) => {
            init_logs();
            match run_node(args) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("pillar-csi node: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Agent(args) => {
            init_logs();
            match run_agent(*args) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("pillar-csi agent: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
