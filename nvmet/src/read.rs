//! Reading the present nvmet state back from configfs.
use crate::{
    error::Error,
    model::{Namespace, Port, State, Subsystem, Teardown, Transport},
    names::{Nqn, Nsid, PortId},
    plan::{port_dir, subsystem_dir},
};
use configfs::{Folder, Tree};
use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
};

/// Reads every object. Each object's files are read through its folder, held
/// open ([`Folder`]), so a file costs a lookup of its own name instead of a
/// walk of its whole path; the cost per object does not depend on how many
/// there are.
pub(crate) fn read_all(tree: &Tree) -> Result<State, Error> {
    let mut state = State::default();
    if let Some(subsystems) = tree.folder("subsystems")? {
        for name in subsystems.list()? {
            let nqn = Nqn::from_kernel(&name)?;
            // A subsystem removed since the listing is skipped.
            if let Some(dir) = subsystems.folder(nqn.as_str())? {
                state.subsystems.insert(nqn, read_subsystem_in(&dir)?);
            }
        }
    }
    if let Some(ports) = tree.folder("ports")? {
        for name in ports.list()? {
            let id: PortId = name.parse()?;
            if let Some(dir) = ports.folder(&id.to_string())? {
                state
                    .ports
                    .insert(id, read_port_in(&dir, Links::All, true)?);
            }
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
        // The port's parameters are compared only where the desired state
        // sets them: the others are not read (they read as unset).
        let params = want.inline_data_size.is_some() || want.max_queue_size.is_some();
        let mut port = read_port_in_tree(tree, *id, Links::Only(&want.subsystems), params)?;
        if port
            .as_ref()
            .is_some_and(|p| p.transport != want.transport || p.address != want.address)
        {
            port = read_port_in_tree(tree, *id, Links::All, params)?;
        }
        if let Some(port) = port {
            state.ports.insert(*id, port);
        }
    }
    state.hosts = present_hosts(tree, desired);
    Ok(state)
}

/// The host objects `desired` names or its subsystems allow that exist.
pub(crate) fn present_hosts(tree: &Tree, desired: &State) -> BTreeSet<Nqn> {
    desired
        .hosts
        .iter()
        .chain(desired.subsystems.values().flat_map(|s| &s.allowed_hosts))
        .filter(|host| tree.exists(&format!("hosts/{host}")))
        .cloned()
        .collect()
}

/// What a teardown needs, and only that: of each named subsystem its
/// namespaces (enabled or not) and allowed hosts; of each port its links to
/// the named subsystems (all links of a port torn down). Nothing else is
/// read, so the other fields hold defaults.
pub(crate) fn read_for_teardown(tree: &Tree, teardown: &Teardown) -> Result<State, Error> {
    if !teardown.hosts.is_empty() {
        // Removing a host needs to know every subsystem that admits it.
        return read_all(tree);
    }
    let mut state = State::default();
    for nqn in &teardown.subsystems {
        if let Some(dir) = tree.folder(&subsystem_dir(nqn))? {
            state
                .subsystems
                .insert(nqn.clone(), read_subsystem_for_teardown(&dir)?);
        }
    }
    let Some(ports) = tree.folder("ports")? else {
        return Ok(state);
    };
    for name in ports.list()? {
        let id: PortId = name.parse()?;
        // A port removed since the listing is skipped.
        let Some(dir) = ports.folder(&id.to_string())? else {
            continue;
        };
        let subsystems = if teardown.ports.contains(&id) {
            linked_nqns(&dir, "subsystems")?
        } else {
            linked_of(&dir, &teardown.subsystems)
        };
        let port = Port {
            transport: Transport::Other(String::new()),
            address: None,
            inline_data_size: None,
            max_queue_size: None,
            subsystems,
        };
        state.ports.insert(id, port);
    }
    Ok(state)
}

/// The namespaces (with their `enable` only) and allowed hosts of the
/// subsystem whose folder is `dir`.
fn read_subsystem_for_teardown(dir: &Folder) -> Result<Subsystem, Error> {
    let mut namespaces = BTreeMap::new();
    for name in dir.children("namespaces")? {
        let nsid: Nsid = name.parse()?;
        // A namespace removed since the listing is skipped.
        let Some(ns) = dir.folder(&format!("namespaces/{nsid}"))? else {
            continue;
        };
        let enabled = flag(&ns, "enable")?;
        namespaces.insert(
            nsid,
            Namespace {
                enabled,
                ..Default::default()
            },
        );
    }
    Ok(Subsystem {
        namespaces,
        allowed_hosts: linked_nqns(dir, "allowed_hosts")?,
        ..Default::default()
    })
}

/// The subsystems among `names` linked to the port whose folder is `dir`.
fn linked_of(dir: &Folder, names: &BTreeSet<Nqn>) -> BTreeSet<Nqn> {
    names
        .iter()
        .filter(|n| dir.exists(&format!("subsystems/{n}")))
        .cloned()
        .collect()
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

/// The NQNs that the links in the folder `rel` of `dir` point at
/// (`.../subsystems/<nqn>` or `hosts/<nqn>`).
fn linked_nqns(dir: &Folder, rel: &str) -> Result<BTreeSet<Nqn>, Error> {
    let mut out = BTreeSet::new();
    let Some(links) = dir.folder(rel)? else {
        return Ok(out);
    };
    for link in links.list()? {
        let target = links.link_target(&link)?;
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

fn flag(dir: &Folder, rel: &str) -> Result<bool, Error> {
    Ok(dir.parse_attr(rel, "0 or 1", |v| match v {
        "0" => Some(false),
        "1" => Some(true),
        _ => None,
    })?)
}

/// A numeric attribute that older kernels may not have. The kernel shows a
/// port parameter nobody set as `-1`: that reads as unset.
fn number(dir: &Folder, rel: &str) -> Result<Option<u32>, Error> {
    let Some(value) = dir.read_attr_opt(rel)? else {
        return Ok(None);
    };
    match value.trim().parse::<i64>() {
        Ok(n) if n < 0 => Ok(None),
        Ok(n) => u32::try_from(n).map(Some).map_err(|_| {
            configfs::Error::Parse {
                path: dir.path().join(rel),
                value: value.clone(),
                why: "expected a number below 2^32".into(),
            }
            .into()
        }),
        Err(_) => Err(configfs::Error::Parse {
            path: dir.path().join(rel),
            value,
            why: "expected a number".into(),
        }
        .into()),
    }
}

pub(crate) fn read_subsystem(tree: &Tree, nqn: &Nqn) -> Result<Option<Subsystem>, Error> {
    tree.folder(&subsystem_dir(nqn))?
        .map(|dir| read_subsystem_in(&dir))
        .transpose()
}

/// Reads the subsystem whose folder is `dir`.
fn read_subsystem_in(dir: &Folder) -> Result<Subsystem, Error> {
    let mut namespaces = BTreeMap::new();
    for name in dir.children("namespaces")? {
        let nsid: Nsid = name.parse()?;
        // A namespace removed since the listing is skipped.
        let Some(ns) = dir.folder(&format!("namespaces/{nsid}"))? else {
            continue;
        };
        namespaces.insert(
            nsid,
            Namespace {
                device_path: ns.read_attr("device_path")?.into(),
                uuid: ns.read_attr_opt("device_uuid")?,
                nguid: ns.read_attr_opt("device_nguid")?,
                enabled: flag(&ns, "enable")?,
            },
        );
    }
    Ok(Subsystem {
        allow_any_host: flag(dir, "attr_allow_any_host")?,
        // The kernel pads the serial to its field width with spaces.
        serial: trimmed(dir.read_attr_opt("attr_serial")?),
        model: trimmed(dir.read_attr_opt("attr_model")?),
        namespaces,
        allowed_hosts: linked_nqns(dir, "allowed_hosts")?,
    })
}

pub(crate) fn read_port(tree: &Tree, id: PortId, links: Links<'_>) -> Result<Option<Port>, Error> {
    read_port_in_tree(tree, id, links, true)
}

/// Reads port `id`, its parameters only when `params`.
fn read_port_in_tree(
    tree: &Tree,
    id: PortId,
    links: Links<'_>,
    params: bool,
) -> Result<Option<Port>, Error> {
    tree.folder(&port_dir(id))?
        .map(|dir| read_port_in(&dir, links, params))
        .transpose()
}

/// Reads the port whose folder is `dir`; its parameters (`param_*`) only
/// when `params` (else they read as unset).
fn read_port_in(dir: &Folder, links: Links<'_>, params: bool) -> Result<Port, Error> {
    let transport = Transport::parse(&dir.read_attr("addr_trtype")?);
    let traddr = dir.read_attr("addr_traddr")?;
    let trsvcid = dir.read_attr("addr_trsvcid")?;
    let address = match (traddr.parse::<IpAddr>(), trsvcid.parse::<u16>()) {
        (Ok(ip), Ok(port)) => Some(SocketAddr::new(ip, port)),
        _ => None,
    };
    Ok(Port {
        transport,
        address,
        inline_data_size: if params {
            number(dir, "param_inline_data_size")?
        } else {
            None
        },
        max_queue_size: if params {
            number(dir, "param_max_queue_size")?
        } else {
            None
        },
        subsystems: match links {
            Links::All => linked_nqns(dir, "subsystems")?,
            Links::Only(names) => linked_of(dir, names),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{fs, os::unix::fs::symlink, path::Path};

    fn nqn(s: &str) -> Nqn {
        Nqn::from_kernel(s).unwrap_or_else(|e| panic!("{e}"))
    }

    fn write(root: &Path, rel: &str, value: &str) -> std::io::Result<()> {
        let path = root.join(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write(path, value)
    }

    /// A copy of an nvmet tree: subsystem `a` with a namespace and an allowed
    /// host, subsystem `b` without serial and model files (an older kernel),
    /// port 1 linking both (one link absolute, one relative, its queue size
    /// unset), one host.
    fn fake_tree(root: &Path) -> std::io::Result<()> {
        let a = "subsystems/nqn.2026-01.org.example:a";
        let b = "subsystems/nqn.2026-01.org.example:b";
        write(root, &format!("{a}/attr_allow_any_host"), "0\n")?;
        write(root, &format!("{a}/attr_serial"), "abc                 \n")?;
        write(root, &format!("{a}/attr_model"), "Linux\n")?;
        write(
            root,
            &format!("{a}/namespaces/1/device_path"),
            "/dev/zvol/p/v\n",
        )?;
        write(
            root,
            &format!("{a}/namespaces/1/device_uuid"),
            "00000000-0000-0000-0000-000000000001\n",
        )?;
        write(root, &format!("{a}/namespaces/1/enable"), "1\n")?;
        fs::create_dir_all(root.join("hosts/nqn.2026-01.org.example:h"))?;
        fs::create_dir_all(root.join(format!("{a}/allowed_hosts")))?;
        symlink(
            root.join("hosts/nqn.2026-01.org.example:h"),
            root.join(format!("{a}/allowed_hosts/nqn.2026-01.org.example:h")),
        )?;
        write(root, &format!("{b}/attr_allow_any_host"), "1\n")?;
        fs::create_dir_all(root.join(format!("{b}/namespaces")))?;
        write(root, "ports/1/addr_trtype", "tcp\n")?;
        write(root, "ports/1/addr_traddr", "127.0.0.1\n")?;
        write(root, "ports/1/addr_trsvcid", "4420\n")?;
        write(root, "ports/1/param_inline_data_size", "16384\n")?;
        // A parameter nobody set reads -1 (a port whose enable failed).
        write(root, "ports/1/param_max_queue_size", "-1\n")?;
        fs::create_dir_all(root.join("ports/1/subsystems"))?;
        symlink(
            root.join(a),
            root.join("ports/1/subsystems/nqn.2026-01.org.example:a"),
        )?;
        symlink(
            format!("../../../{b}"),
            root.join("ports/1/subsystems/nqn.2026-01.org.example:b"),
        )
    }

    fn expected() -> State {
        let mut state = State::default();
        let mut a = Subsystem {
            serial: Some("abc".into()),
            model: Some("Linux".into()),
            ..Default::default()
        };
        a.namespaces.insert(
            Nsid::new(1).unwrap_or_else(|e| panic!("{e}")),
            Namespace {
                device_path: "/dev/zvol/p/v".into(),
                uuid: Some("00000000-0000-0000-0000-000000000001".into()),
                nguid: None,
                enabled: true,
            },
        );
        a.allowed_hosts.insert(nqn("nqn.2026-01.org.example:h"));
        state.subsystems.insert(nqn("nqn.2026-01.org.example:a"), a);
        let b = Subsystem {
            allow_any_host: true,
            ..Default::default()
        };
        state.subsystems.insert(nqn("nqn.2026-01.org.example:b"), b);
        let mut port = Port::tcp(([127, 0, 0, 1], 4420).into());
        port.inline_data_size = Some(16384);
        port.subsystems.insert(nqn("nqn.2026-01.org.example:a"));
        port.subsystems.insert(nqn("nqn.2026-01.org.example:b"));
        state.ports.insert(PortId(1), port);
        state.hosts.insert(nqn("nqn.2026-01.org.example:h"));
        state
    }

    #[test]
    fn reads_a_tree_back_whole_and_scoped() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        fake_tree(dir.path())?;
        let tree = Tree::at(dir.path());
        let all = expected();
        assert_eq!(read_all(&tree)?, all);

        // Scoped to subsystem b on port 1: only b, and only b's link.
        let b = nqn("nqn.2026-01.org.example:b");
        let mut desired = State::default();
        desired.subsystems.insert(b.clone(), Subsystem::default());
        let mut port = Port::tcp(([127, 0, 0, 1], 4420).into());
        port.subsystems.insert(b.clone());
        desired.ports.insert(PortId(1), port);
        let scoped = read_scoped(&tree, &desired)?;
        assert_eq!(scoped.subsystems.keys().collect::<Vec<_>>(), vec![&b]);
        assert_eq!(scoped.subsystems[&b], all.subsystems[&b]);
        assert_eq!(
            scoped.ports[&PortId(1)].subsystems,
            BTreeSet::from([b.clone()])
        );
        assert!(scoped.hosts.is_empty());

        // Absent objects read as absent.
        let absent = nqn("nqn.2026-01.org.example:absent");
        assert_eq!(read_subsystem(&tree, &absent)?, None);
        assert_eq!(read_port(&tree, PortId(2), Links::All)?, None);
        Ok(())
    }
}
