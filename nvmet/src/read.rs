//! Reading the present nvmet state back from configfs.
use crate::{
    error::Error,
    model::{Namespace, Port, State, Subsystem, Teardown, Transport},
    names::{Nqn, Nsid, PortId},
    plan::{port_dir, subsystem_dir},
};
use configfs::Tree;
use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
};

pub(crate) fn read_all(tree: &Tree) -> Result<State, Error> {
    let mut state = State::default();
    for name in tree.children("subsystems")? {
        let nqn = Nqn::from_kernel(&name)?;
        if let Some(sub) = read_subsystem(tree, &nqn)? {
            state.subsystems.insert(nqn, sub);
        }
    }
    for name in tree.children("ports")? {
        let id: PortId = name.parse()?;
        if let Some(port) = read_port(tree, id, Links::All)? {
            state.ports.insert(id, port);
        }
    }
    state.hosts = read_hosts(tree)?;
    Ok(state)
}

pub(crate) fn read_scoped(tree: &Tree, desired: &State) -> Result<State, Error> {
    let mut state = State::default();
    let linked = desired.ports.values().flat_map(|p| &p.subsystems);
    for nqn in desired.subsystems.keys().chain(linked) {
        if state.subsystems.contains_key(nqn) {
            continue;
        }
        if let Some(sub) = read_subsystem(tree, nqn)? {
            state.subsystems.insert(nqn.clone(), sub);
        }
    }
    for (id, want) in &desired.ports {
        // Only the links the desired state names are looked up, so the cost
        // does not grow with the exports already on the port; a port whose
        // address changes needs all of them (they are unlinked and relinked).
        let mut port = read_port(tree, *id, Links::Only(&want.subsystems))?;
        if port
            .as_ref()
            .is_some_and(|p| p.transport != want.transport || p.address != want.address)
        {
            port = read_port(tree, *id, Links::All)?;
        }
        if let Some(port) = port {
            state.ports.insert(*id, port);
        }
    }
    let needed = desired
        .hosts
        .iter()
        .chain(desired.subsystems.values().flat_map(|s| &s.allowed_hosts));
    for host in needed {
        if tree.exists(&format!("hosts/{host}")) {
            state.hosts.insert(host.clone());
        }
    }
    Ok(state)
}

pub(crate) fn read_for_teardown(tree: &Tree, teardown: &Teardown) -> Result<State, Error> {
    if !teardown.hosts.is_empty() {
        // Removing a host needs to know every subsystem that admits it.
        return read_all(tree);
    }
    let mut state = State::default();
    for nqn in &teardown.subsystems {
        if let Some(sub) = read_subsystem(tree, nqn)? {
            state.subsystems.insert(nqn.clone(), sub);
        }
    }
    for name in tree.children("ports")? {
        let id: PortId = name.parse()?;
        let links = if teardown.ports.contains(&id) {
            Links::All
        } else {
            Links::Only(&teardown.subsystems)
        };
        if let Some(port) = read_port(tree, id, links)? {
            state.ports.insert(id, port);
        }
    }
    Ok(state)
}

/// Which subsystem links of a port to read.
#[derive(Clone, Copy)]
pub(crate) enum Links<'a> {
    /// Every link.
    All,
    /// Only links to these subsystems (by the link's name, which this crate
    /// makes equal to the NQN).
    Only(&'a BTreeSet<Nqn>),
}

fn read_hosts(tree: &Tree) -> Result<BTreeSet<Nqn>, Error> {
    tree.children("hosts")?
        .iter()
        .map(|h| Nqn::from_kernel(h).map_err(Error::from))
        .collect()
}

/// The NQNs that the links in a folder point at (`.../subsystems/<nqn>` or `hosts/<nqn>`).
fn linked_nqns(tree: &Tree, dir: &str) -> Result<BTreeSet<Nqn>, Error> {
    let mut out = BTreeSet::new();
    for link in tree.children(dir)? {
        let target = tree.link_target(&format!("{dir}/{link}"))?;
        let name = target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or(link);
        out.insert(Nqn::from_kernel(&name)?);
    }
    Ok(out)
}

fn trimmed(value: Option<String>) -> Option<String> {
    value.map(|v| v.trim().to_owned())
}

fn flag(tree: &Tree, path: &str) -> Result<bool, Error> {
    Ok(tree.parse_attr(path, "0 or 1", |v| match v {
        "0" => Some(false),
        "1" => Some(true),
        _ => None,
    })?)
}

fn number(tree: &Tree, path: &str) -> Result<Option<u32>, Error> {
    if !tree.exists(path) {
        return Ok(None);
    }
    Ok(Some(tree.parse_attr(path, "a number", |v| v.parse().ok())?))
}

pub(crate) fn read_subsystem(tree: &Tree, nqn: &Nqn) -> Result<Option<Subsystem>, Error> {
    let dir = subsystem_dir(nqn);
    if !tree.exists(&dir) {
        return Ok(None);
    }
    let mut namespaces = BTreeMap::new();
    for name in tree.children(&format!("{dir}/namespaces"))? {
        let nsid: Nsid = name.parse()?;
        let ns_dir = format!("{dir}/namespaces/{nsid}");
        namespaces.insert(
            nsid,
            Namespace {
                device_path: tree.read_attr(&format!("{ns_dir}/device_path"))?.into(),
                uuid: tree.read_attr_opt(&format!("{ns_dir}/device_uuid"))?,
                nguid: tree.read_attr_opt(&format!("{ns_dir}/device_nguid"))?,
                enabled: flag(tree, &format!("{ns_dir}/enable"))?,
            },
        );
    }
    Ok(Some(Subsystem {
        allow_any_host: flag(tree, &format!("{dir}/attr_allow_any_host"))?,
        // The kernel pads the serial to its field width with spaces.
        serial: trimmed(tree.read_attr_opt(&format!("{dir}/attr_serial"))?),
        model: trimmed(tree.read_attr_opt(&format!("{dir}/attr_model"))?),
        namespaces,
        allowed_hosts: linked_nqns(tree, &format!("{dir}/allowed_hosts"))?,
    }))
}

pub(crate) fn read_port(tree: &Tree, id: PortId, links: Links<'_>) -> Result<Option<Port>, Error> {
    let dir = port_dir(id);
    if !tree.exists(&dir) {
        return Ok(None);
    }
    let transport = Transport::parse(&tree.read_attr(&format!("{dir}/addr_trtype"))?);
    let traddr = tree.read_attr(&format!("{dir}/addr_traddr"))?;
    let trsvcid = tree.read_attr(&format!("{dir}/addr_trsvcid"))?;
    let address = match (traddr.parse::<IpAddr>(), trsvcid.parse::<u16>()) {
        (Ok(ip), Ok(port)) => Some(SocketAddr::new(ip, port)),
        _ => None,
    };
    Ok(Some(Port {
        transport,
        address,
        inline_data_size: number(tree, &format!("{dir}/param_inline_data_size"))?,
        max_queue_size: number(tree, &format!("{dir}/param_max_queue_size"))?,
        subsystems: match links {
            Links::All => linked_nqns(tree, &format!("{dir}/subsystems"))?,
            Links::Only(names) => names
                .iter()
                .filter(|n| tree.exists(&format!("{dir}/subsystems/{n}")))
                .cloned()
                .collect(),
        },
    }))
}
