//! `pillar-csi`: the one binary of the driver; each role is a subcommand.
use clap::{Args, Parser, Subcommand};
use pillar_csi_agent::{config::AgentConfig, server};
mod agent_call;
mod rebind_check;
mod recovery_cmd;

use std::{net::IpAddr, net::SocketAddr, path::PathBuf, process::ExitCode};

mod controller_cmd;
mod crds;
mod node_cmd;

/// The version and the commit this binary was built from.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("PILLAR_CSI_COMMIT"),
    ")"
);

#[derive(Parser)]
#[command(
    name = "pillar-csi",
    version = VERSION,
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
    /// Run the CSI Controller service.
    Controller(Box<controller_cmd::ControllerArgs>),
    /// Write the CRD YAML (one file per CRD) generated from the types.
    Crds(crds::CrdsArgs),
    /// Metadata-loss recovery, the operator's side: sign and verify grants.
    #[command(subcommand)]
    Recovery(recovery_cmd::RecoveryCommand),
    /// The spec's jq checks of "Rebind a retained volume" (step 4) over an
    /// InspectVolume answer and a PillarVolumeState, one line each.
    RebindCheck(Box<rebind_check::RebindArgs>),
    /// Run the CSI node plugin (Identity and Node services on a unix socket).
    Node(node_cmd::NodeArgs),
    /// Print the version and the commit this binary was built from.
    Version,
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
    /// The agent's name, in the names of its export targets (unique per
    /// agent); default: the host name.
    #[arg(long)]
    name: Option<String>,
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
    /// Address NFS clients reach the kernel NFS server at (filesystem volumes).
    #[arg(long)]
    nfs_address: Option<IpAddr>,
    /// The kernel NFS server's port.
    #[arg(long)]
    nfs_port: Option<u16>,
    /// Seconds between resyncs of exports from the fence marks (0: never).
    #[arg(long)]
    resync_interval_seconds: Option<u64>,
    /// Public keys that may sign metadata-loss recovery grants (PEM:
    /// PUBLIC KEY or CERTIFICATE blocks, RSA or ECDSA); read once at start.
    #[arg(long, value_name = "FILE")]
    recovery_trust_anchor: Option<PathBuf>,
    /// The key-encryption key: a file of exactly 32 random bytes that seals
    /// the keys of encrypted zvols; read once at start.
    #[arg(long, value_name = "FILE")]
    key_encryption_key_file: Option<PathBuf>,
    /// During a rotation of the key-encryption key: the previous one. It
    /// still opens the keys it sealed, and the agent seals each again under
    /// the current one at start.
    #[arg(long, value_name = "FILE")]
    previous_key_encryption_key_file: Option<PathBuf>,
    /// Gives every encrypted zvol the agent made a new key of its own at
    /// start (the data is not rewritten); needs the key-encryption key.
    #[arg(long)]
    change_volume_keys: bool,
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
    c.name = args.name.or(c.name);
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
    c.nfs.address = args.nfs_address.unwrap_or(c.nfs.address);
    c.nfs.port = args.nfs_port.unwrap_or(c.nfs.port);
    c.resync_interval_seconds = args
        .resync_interval_seconds
        .unwrap_or(c.resync_interval_seconds);
    c.recovery_trust_anchor = args.recovery_trust_anchor.or(c.recovery_trust_anchor);
    c.key_encryption_key_file = args.key_encryption_key_file.or(c.key_encryption_key_file);
    c.previous_key_encryption_key_file = args
        .previous_key_encryption_key_file
        .or(c.previous_key_encryption_key_file);
    c.change_volume_keys |= args.change_volume_keys;
    c.validate().map_err(|e| e.to_string())?;
    Ok(c)
}

fn run_agent(args: AgentArgs) -> Result<(), String> {
    // The first line of the log: how long the start-up steps after it take
    // is read from the timestamps of the lines that follow.
    tracing::info!(pid = std::process::id(), "agent starting");
    let config = agent_config(args)?;
    pillar_csi_agent::crash::arm();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(64)
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    runtime.block_on(async {
        let backends = server::open_backends(&config).map_err(|e| e.to_string())?;
        server::reseal_keys(&config, &backends);
        server::change_volume_keys(&config, &backends);
        let agent = server::build(&config, backends).map_err(|e| e.to_string())?;
        server::serve(&config, agent, crate::VERSION)
            .await
            .map_err(|e| e.to_string())
    })
}

/// The socket of a CSI service's `--endpoint`, and of its `--files-endpoint`
/// (the files identity) when given.
fn csi_sockets(endpoint: &str, files: Option<&str>) -> Result<(PathBuf, Option<PathBuf>), String> {
    let socket = csi::endpoint::socket_path(endpoint).map_err(|e| e.to_string())?;
    let files = files
        .map(csi::endpoint::socket_path)
        .transpose()
        .map_err(|e| e.to_string())?;
    Ok((socket, files))
}

fn init_tracing() {
    tracing_subscriber::fmt()
        // Colours only on a terminal: a container's log (kubelet's files,
        // a log collector) gets plain text, not escape sequences.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
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
            println!("pillar-csi {VERSION}");
            ExitCode::SUCCESS
        }
        Command::Controller(args) => {
            init_tracing();
            match controller_cmd::run(*args) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("pillar-csi controller: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Node(args) => {
            init_tracing();
            match node_cmd::run(args) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("pillar-csi node: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Crds(args) => match crds::run(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("pillar-csi crds: {e}");
                ExitCode::FAILURE
            }
        },
        Command::RebindCheck(args) => match rebind_check::run(*args) {
            Ok(text) => {
                println!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                println!("{e}");
                ExitCode::FAILURE
            }
        },
        Command::Recovery(command) => match recovery_cmd::run(command) {
            Ok(text) => {
                println!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("pillar-csi recovery: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Agent(args) => {
            init_tracing();
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
