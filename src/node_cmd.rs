//! `pillar-csi node`: the CSI node plugin on kubelet's unix socket.
use clap::Args;
use std::path::PathBuf;

/// The node plugin's flags.
#[derive(Args)]
pub struct NodeArgs {
    /// The CSI endpoint kubelet dials.
    #[arg(long, default_value = "unix:///csi/csi.sock")]
    pub(crate) endpoint: String,
    /// This Kubernetes node's name (the pod's `spec.nodeName`).
    #[arg(long)]
    pub(crate) node_name: String,
    /// Also serve the filesystem identity (`files.pillar-csi.bhyoo.com`:
    /// NFS mounts) on this endpoint, for its own node-driver-registrar;
    /// needs `--node-address`.
    #[arg(long, requires = "node_address")]
    pub(crate) files_endpoint: Option<String>,
    /// The address this node's NFS mounts come from, which exports admit
    /// (the pod's `status.hostIP`).
    #[arg(long)]
    pub(crate) node_address: Option<std::net::IpAddr>,
    /// The NFS version mounted when a volume's mount options name none
    /// (`vers=` in the StorageClass's mountOptions wins): 3, 4, 4.0, 4.1, 4.2.
    #[arg(long, default_value = csi::node::nfs::DEFAULT_VERSION)]
    pub(crate) nfs_version: String,
    /// A folder under which node-local volumes' directories may be
    /// bind-mounted: the path of a directory backend of the agent on this
    /// node (repeatable; none: node-local volumes are refused).
    #[arg(long = "local-root")]
    pub(crate) local_roots: Vec<PathBuf>,
    /// Folder of per-volume staging records.
    #[arg(long, default_value = "/var/lib/pillar-csi/node")]
    pub(crate) state_dir: PathBuf,
    /// iSCSI is used on this node: Probe then needs a reachable iscsid.
    #[arg(long)]
    pub(crate) iscsi: bool,
    /// NVMe/TCP `ctrl_loss_tmo`: seconds a host keeps reconnecting to a
    /// lost target, holding I/O, before it gives the controller up.
    #[arg(long, default_value_t = 600)]
    pub(crate) nvme_ctrl_loss_tmo: u32,
    /// NVMe/TCP `reconnect_delay`: seconds between reconnect attempts.
    #[arg(long, default_value_t = 2)]
    pub(crate) nvme_reconnect_delay: u32,
    /// NVMe/TCP `fast_io_fail_tmo`: seconds after which held I/O fails while
    /// the host still reconnects (unset: held for the whole ctrl_loss_tmo).
    #[arg(long)]
    pub(crate) nvme_fast_io_fail_tmo: Option<u32>,
}

/// Serves the Identity and Node services until SIGTERM or SIGINT.
pub fn run(args: NodeArgs) -> Result<(), String> {
    use csi::driver::Driver;
    use csi::endpoint::serve_node;
    use csi::node::{Node, NodeConfig};
    let mut config = NodeConfig::new(&args.node_name);
    config.state_dir = args.state_dir;
    config.iscsi = args.iscsi;
    config.nfs = csi::node::nfs::NfsClient {
        address: args.node_address,
        version: args.nfs_version,
    };
    config.local_roots = args.local_roots;
    config.nvme_reconnect = csi::node::nvme::ReconnectPolicy {
        ctrl_loss_tmo: args.nvme_ctrl_loss_tmo,
        reconnect_delay: args.nvme_reconnect_delay,
        fast_io_fail_tmo: args.nvme_fast_io_fail_tmo,
    };
    // Tests only, in the crash-points build: stop NodeStageVolume at a
    // chosen point (see `Fault`).
    #[cfg(feature = "crash-points")]
    {
        config.fault = std::env::var("PILLAR_CSI_NODE_FAULT")
            .ok()
            .and_then(|v| csi::node::Fault::parse(&v));
    }
    let (socket, files_socket) =
        crate::csi_sockets(&args.endpoint, args.files_endpoint.as_deref())?;
    let node = std::sync::Arc::new(Node::new(config).map_err(|e| e.to_string())?);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(64)
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    runtime
        .block_on(async {
            let block = serve_node(node.clone(), Driver::Block, crate::VERSION, &socket);
            match &files_socket {
                Some(files) => {
                    let files = serve_node(node, Driver::Files, crate::VERSION, files);
                    tokio::try_join!(block, files).map(drop)
                }
                None => block.await,
            }
        })
        .map_err(|e| e.to_string())
}
