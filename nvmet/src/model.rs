//! Typed values for the state of the nvmet tree, desired or present.
use crate::names::{Nqn, Nsid, PortId};
use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    path::PathBuf,
};

/// A set of nvmet objects: what is present, or what should be.
///
/// As a desired state it names only the objects its owner manages:
/// [`Nvmet::apply`](crate::Nvmet::apply) leaves every other subsystem, port
/// and host alone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// Subsystems by NQN.
    pub subsystems: BTreeMap<Nqn, Subsystem>,
    /// Ports by ID.
    pub ports: BTreeMap<PortId, Port>,
    /// Host NQNs known to the target (`nvmet/hosts`). Hosts named in a
    /// subsystem's `allowed_hosts` are created without being listed here.
    pub hosts: BTreeSet<Nqn>,
}

/// An NVMe subsystem: the unit a host connects to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Subsystem {
    /// `attr_allow_any_host`: any host may connect. Must be false when
    /// `allowed_hosts` is not empty (the kernel refuses both at once).
    pub allow_any_host: bool,
    /// `attr_serial`, at most 20 printable ASCII characters; `None` keeps the
    /// kernel's (random) serial. Set before the first host connects.
    pub serial: Option<String>,
    /// `attr_model`, at most 40 printable ASCII characters; `None` keeps
    /// the kernel's default ("Linux"). Set before the first host connects.
    pub model: Option<String>,
    /// Namespaces by ID.
    pub namespaces: BTreeMap<Nsid, Namespace>,
    /// Hosts admitted when `allow_any_host` is false.
    pub allowed_hosts: BTreeSet<Nqn>,
}

/// A namespace: one block device served by a subsystem.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Namespace {
    /// `device_path`: the block device (for example `/dev/zvol/tank/pvc-1`).
    pub device_path: PathBuf,
    /// `device_uuid` as `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`; `None` keeps the kernel's.
    pub uuid: Option<String>,
    /// `device_nguid` in the same form; `None` keeps the kernel's.
    pub nguid: Option<String>,
    /// `enable`: the namespace serves I/O.
    pub enabled: bool,
}

/// A transport type (`addr_trtype`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// NVMe/TCP.
    Tcp,
    /// NVMe/RDMA.
    Rdma,
    /// The loop transport (no address).
    Loop,
    /// Any other value the kernel holds (read back only).
    Other(String),
}

impl Transport {
    /// The text the kernel uses.
    pub fn as_str(&self) -> &str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Rdma => "rdma",
            Transport::Loop => "loop",
            Transport::Other(s) => s,
        }
    }

    pub(crate) fn parse(s: &str) -> Self {
        match s {
            "tcp" => Transport::Tcp,
            "rdma" => Transport::Rdma,
            "loop" => Transport::Loop,
            other => Transport::Other(other.to_owned()),
        }
    }
}

/// A port: a listener that subsystems are linked to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Port {
    /// `addr_trtype`.
    pub transport: Transport,
    /// `addr_traddr` and `addr_trsvcid` (`addr_adrfam` follows from the
    /// address); `None` for the loop transport or an unconfigured port.
    pub address: Option<SocketAddr>,
    /// `param_inline_data_size`; `None` keeps the kernel's.
    pub inline_data_size: Option<u32>,
    /// `param_max_queue_size` (kernels that have it); `None` keeps the kernel's.
    pub max_queue_size: Option<u32>,
    /// Subsystems linked to the port (served on it). In a desired state these
    /// links are added; links to other subsystems are kept.
    pub subsystems: BTreeSet<Nqn>,
}

impl Port {
    /// A TCP port listening on `address`, with no subsystem yet.
    pub fn tcp(address: SocketAddr) -> Self {
        Self {
            transport: Transport::Tcp,
            address: Some(address),
            inline_data_size: None,
            max_queue_size: None,
            subsystems: BTreeSet::new(),
        }
    }
}

/// Objects to remove, with everything that hangs off them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Teardown {
    /// Subsystems: unlinked from every port, hosts unlinked, namespaces
    /// disabled and removed, then the subsystem removed.
    pub subsystems: BTreeSet<Nqn>,
    /// Ports: their subsystem links removed, then the port.
    pub ports: BTreeSet<PortId>,
    /// Hosts: removed once no remaining subsystem admits them.
    pub hosts: BTreeSet<Nqn>,
}
