//! The CSI node service: attach a volume over NVMe/TCP or iSCSI, format it
//! only when blank, mount it, publish it to pods, grow it, report on it.
//!
//! - [`initiator`]: the host NQN and initiator IQN (created when missing);
//! - [`nvme`], [`iscsi`]: the two initiators ([`iscsi_secret`]: the CHAP
//!   secret kept off iscsiadm's command line); [`attach`] over both;
//! - [`format`](mod@format): the libblkid probe and mkfs of blank devices only;
//! - [`mounts`]: mount(2), bind mounts and the mount table;
//! - [`nfs`]: filesystem volumes, their exports mounted by mount(2);
//! - [`local`]: node-local directory volumes, bind-mounted ([`share`]:
//!   what both kinds of filesystem volume share);
//! - [`record`]: per-volume staging records, written atomically;
//! - [`stage`], [`publish`], [`volume`]: the RPCs' work, synchronous;
//! - [`service`]: the gRPC service over them.
//!
//! Every operation on a volume runs under that volume's lock; connecting and
//! disconnecting run under the connection's lock too, so an Unstage that
//! ends a connection cannot race a Stage that reuses it.
pub mod attach;
pub mod command;
pub mod disk_identity;
pub mod error;
pub mod format;
pub mod initiator;
pub mod iscsi;
pub mod iscsi_secret;
pub mod local;
pub mod mounts;
pub mod nfs;
pub mod nvme;
pub mod publish;
pub mod record;
pub mod service;
pub mod share;
pub mod stage;
pub mod volume;

use crate::node_id::{FilesNodeId, NodeId};
use attach::Attacher;
use error::{Error, Result};
use record::Records;
use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

/// Runs one step of attaching or mounting a volume and logs how long it
/// took (`step`: `connect`, `device`, `probe`, `mkfs`, `mount` or `bind`;
/// `ms`), failed or not: where a Stage's time goes, read by the node
/// benchmark. It measures only; the step runs as it would without it.
pub fn timed<T>(step: &'static str, f: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let out = f();
    let ms = start.elapsed().as_secs_f64() * 1000.0;
    tracing::info!(step, ms, "step timed");
    out
}

/// How the node plugin runs.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The Kubernetes node name.
    pub node_name: String,
    /// The folder of staging records.
    pub state_dir: PathBuf,
    /// Whether iSCSI is in use on this node (Probe then needs iscsid).
    pub iscsi: bool,
    /// The host NQN file (`/etc/nvme/hostnqn`).
    pub host_nqn_file: PathBuf,
    /// The host ID file (`/etc/nvme/hostid`).
    pub host_id_file: PathBuf,
    /// The initiator name file (`/etc/iscsi/initiatorname.iscsi`).
    pub initiator_name_file: PathBuf,
    /// How long a connected volume's disk may take to appear.
    pub device_wait: Duration,
    /// How NVMe/TCP controllers ride out a lost connection.
    pub nvme_reconnect: nvme::ReconnectPolicy,
    /// A fault to inject for tests ([`Fault`]).
    pub fault: Option<Fault>,
    /// This node's NFS client: the address its mounts come from (what
    /// exports admit; set when the node serves the files identity) and the
    /// version it mounts by default.
    pub nfs: nfs::NfsClient,
    /// The folders under which node-local volumes' directories may be
    /// bind-mounted (the agent's directory backend paths on this node).
    pub local_roots: Vec<PathBuf>,
}

impl NodeConfig {
    /// The defaults for node `node_name`: state in
    /// `/var/lib/pillar-csi/node`, initiator names in `/etc`, no iSCSI.
    pub fn new(node_name: &str) -> Self {
        Self {
            node_name: node_name.to_owned(),
            state_dir: "/var/lib/pillar-csi/node".into(),
            iscsi: false,
            host_nqn_file: initiator::HOST_NQN_FILE.into(),
            host_id_file: initiator::HOST_ID_FILE.into(),
            initiator_name_file: initiator::INITIATOR_NAME_FILE.into(),
            device_wait: Duration::from_secs(60),
            nvme_reconnect: nvme::ReconnectPolicy::default(),
            fault: None,
            nfs: nfs::NfsClient::default(),
            local_roots: Vec::new(),
        }
    }
}

/// A point where a test may stop the plugin, to prove what a restart does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// NodeStageVolume stops for good after connecting and formatting,
    /// before mounting (the test then kills the process).
    HangBeforeMount,
}

impl Fault {
    /// Parses the `PILLAR_CSI_NODE_FAULT` value (`hang-before-mount`).
    pub fn parse(value: &str) -> Option<Self> {
        (value == "hang-before-mount").then_some(Fault::HangBeforeMount)
    }
}

/// Named locks, one per key, made on first use and dropped when the last
/// caller of a key is done (a node that stages thousands of volumes over
/// its life keeps no entry per volume).
#[derive(Debug, Default)]
struct Locks {
    map: Mutex<HashMap<String, Arc<Mutex<()>>>>,
}

impl Locks {
    /// Runs `f` holding the lock of `key`.
    fn with<T>(&self, key: &str, f: impl FnOnce() -> T) -> T {
        let lock = {
            let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
            map.entry(key.to_owned()).or_default().clone()
        };
        let out = {
            let _held = lock.lock().unwrap_or_else(|e| e.into_inner());
            f()
        };
        // Callers clone the entry under the map's lock: with only the map's
        // and this caller's references left, no one else waits for it.
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if Arc::strong_count(&lock) == 2 {
            map.remove(key);
        }
        out
    }

    /// How many keys have an entry.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// The node plugin's state.
#[derive(Debug)]
pub struct Node {
    config: NodeConfig,
    node_id: NodeId,
    files_node_id: Option<FilesNodeId>,
    records: Records,
    attacher: Attacher,
    volume_locks: Locks,
    connection_locks: Locks,
}

impl Node {
    /// Reads (or creates) the initiator names and opens the state folder.
    pub fn new(config: NodeConfig) -> Result<Self> {
        let nqn = initiator::host_nqn(&config.host_nqn_file)
            .map_err(|e| Error::internal(e.to_string()))?;
        let host_id = initiator::host_id(&config.host_id_file, &nqn)
            .map_err(|e| Error::internal(e.to_string()))?;
        let iqn = initiator::initiator_iqn(&config.initiator_name_file)
            .map_err(|e| Error::internal(e.to_string()))?;
        let node_id = NodeId::new(&config.node_name, &nqn, &iqn)
            .map_err(|e| Error::invalid(e.to_string()))?;
        nfs::check_version(&config.nfs.version)?;
        let files_node_id = config
            .nfs
            .address
            .map(|address| FilesNodeId::new(&config.node_name, address))
            .transpose()
            .map_err(|e| Error::invalid(e.to_string()))?;
        Ok(Self {
            files_node_id,
            records: Records::open(&config.state_dir)?,
            attacher: Attacher {
                nvme: nvme::NvmeHost {
                    reconnect: config.nvme_reconnect,
                    ..Default::default()
                },
                iscsi: iscsi::IscsiHost::default(),
                host: nvme::HostIdentity { nqn, id: host_id },
                device_wait: config.device_wait,
            },
            node_id,
            config,
            volume_locks: Locks::default(),
            connection_locks: Locks::default(),
        })
    }

    /// The node ID NodeGetInfo reports.
    pub fn node_id(&self) -> &NodeId {
        &self.node_id
    }

    /// The node ID the files identity's NodeGetInfo reports, when the node
    /// has an NFS client address.
    pub fn files_node_id(&self) -> Option<&FilesNodeId> {
        self.files_node_id.as_ref()
    }

    /// Whether the node's prerequisites are there: the NVMe-oF interface
    /// (`/dev/nvme-fabrics`, module nvme-fabrics) and, when iSCSI is
    /// configured, a reachable iscsid. `Err` says what is missing.
    pub fn ready(&self) -> std::result::Result<(), String> {
        if !self.attacher.nvme.fabrics.exists() {
            return Err(format!(
                "{} is missing (load the nvme-tcp module)",
                self.attacher.nvme.fabrics.display()
            ));
        }
        if self.config.iscsi && !iscsi::iscsid_reachable() {
            return Err("iscsid is not reachable (start iscsid)".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_locked_key_serialises_and_other_keys_do_not_wait() {
        let locks = Arc::new(Locks::default());
        let inside = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let (locks, inside) = (locks.clone(), inside.clone());
                std::thread::spawn(move || {
                    locks.with("v", || {
                        let n = inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        assert_eq!(n, 0, "two holders of one key");
                        locks.with("other", || ());
                        inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    })
                })
            })
            .collect();
        for h in handles {
            h.join().expect("no panic");
        }
        assert_eq!(locks.len(), 0, "no entry outlives its callers");
        assert_eq!(
            Fault::parse("hang-before-mount"),
            Some(Fault::HangBeforeMount)
        );
        assert_eq!(Fault::parse("other"), None);
    }
}
