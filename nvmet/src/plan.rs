//! The difference between a present and a desired state, as ordered configfs steps.
//!
//! The order follows the kernel's rules: serial and model before a subsystem
//! is served; a namespace is disabled before its device or identifiers
//! change; a host link is removed before `attr_allow_any_host` is set and
//! added after it is cleared; a port's address is written only while no
//! subsystem is linked to it (the link starts the listener).
use crate::{
    error::Error,
    model::{Namespace, Port, State, Subsystem, Teardown},
    names::{Nqn, PortId},
};
use configfs::Step;
use std::{borrow::Cow, collections::BTreeSet};

/// `parts` joined by `/`, in one allocation: a plan makes a dozen paths
/// per export, and `format!` grows each string as it writes it.
pub(crate) fn path(parts: &[&str]) -> String {
    parts.join("/")
}

pub(crate) fn subsystem_dir(nqn: &Nqn) -> String {
    path(&["subsystems", nqn.as_str()])
}

pub(crate) fn port_dir(id: PortId) -> String {
    path(&["ports", Decimal::of(id.0.into()).as_str()])
}

/// A number's decimal digits, on the stack: a plan names its port and its
/// namespace by number in its paths, and `to_string` goes through the
/// formatter for each.
struct Decimal {
    digits: [u8; 10],
    start: usize,
}

impl Decimal {
    fn of(mut n: u32) -> Self {
        let mut d = Decimal {
            digits: [b'0'; 10],
            start: 10,
        };
        loop {
            d.start -= 1;
            d.digits[d.start] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                return d;
            }
        }
    }

    fn as_str(&self) -> &str {
        // Only ASCII digits were written.
        std::str::from_utf8(&self.digits[self.start..]).unwrap_or_default()
    }
}

/// The folder of namespace `nsid` in the subsystem folder `dir`.
fn namespace_dir(dir: &str, nsid: crate::Nsid) -> String {
    path(&[dir, "namespaces", Decimal::of(nsid.get()).as_str()])
}

/// The link to subsystem `nqn` in the port folder `port_dir`.
pub(crate) fn link_path(port_dir: &str, nqn: &Nqn) -> String {
    path(&[port_dir, "subsystems", nqn.as_str()])
}

/// The steps that turn `present` into `desired` for the objects `desired` names.
///
/// Port links are additive: a port's desired `subsystems` are linked, and
/// links to other subsystems stay (they belong to other exports); a link goes
/// away with [`plan_teardown`] of its subsystem or port.
pub fn plan_apply(present: &State, desired: &State) -> Result<Vec<Step>, Error> {
    // A new export's plan is seven steps or so: made once, not grown.
    let mut steps = Vec::with_capacity(8);
    let wanted_hosts: BTreeSet<&Nqn> = desired
        .hosts
        .iter()
        .chain(desired.subsystems.values().flat_map(|s| &s.allowed_hosts))
        .collect();
    for host in wanted_hosts {
        if !present.hosts.contains(host) {
            steps.push(Step::mkdir(path(&["hosts", host.as_str()])));
        }
    }
    for (nqn, want) in &desired.subsystems {
        plan_subsystem(nqn, present.subsystems.get(nqn), want, &mut steps)?;
    }
    for (id, want) in &desired.ports {
        for nqn in &want.subsystems {
            if !desired.subsystems.contains_key(nqn) && !present.subsystems.contains_key(nqn) {
                return Err(Error::Conflict(format!(
                    "port {id} links subsystem {nqn}, which neither exists nor is desired"
                )));
            }
        }
        plan_port(*id, present.ports.get(id), want, &mut steps)?;
    }
    Ok(steps)
}

fn plan_subsystem(
    nqn: &Nqn,
    have: Option<&Subsystem>,
    want: &Subsystem,
    steps: &mut Vec<Step>,
) -> Result<(), Error> {
    if want.allow_any_host && !want.allowed_hosts.is_empty() {
        return Err(Error::Conflict(format!(
            "subsystem {nqn} cannot both allow any host and list allowed hosts"
        )));
    }
    check_text("serial", nqn, want.serial.as_deref(), 20)?;
    check_text("model", nqn, want.model.as_deref(), 40)?;
    let dir = subsystem_dir(nqn);
    let empty = Subsystem::default();
    let have = match have {
        Some(h) => h,
        None => {
            steps.push(Step::mkdir(&dir));
            &empty
        }
    };
    for (attr, wanted, present) in [
        ("attr_serial", &want.serial, &have.serial),
        ("attr_model", &want.model, &have.model),
    ] {
        if let Some(value) = wanted {
            if present.as_ref() != Some(value) {
                steps.push(Step::write(path(&[&dir, attr]), value.as_str()));
            }
        }
    }
    for host in have.allowed_hosts.difference(&want.allowed_hosts) {
        steps.push(Step::unlink(path(&[&dir, "allowed_hosts", host.as_str()])));
    }
    if want.allow_any_host != have.allow_any_host {
        steps.push(Step::write(
            path(&[&dir, "attr_allow_any_host"]),
            if want.allow_any_host { "1" } else { "0" },
        ));
    }
    for host in want.allowed_hosts.difference(&have.allowed_hosts) {
        steps.push(Step::symlink(
            path(&["hosts", host.as_str()]),
            path(&[&dir, "allowed_hosts", host.as_str()]),
        ));
    }
    for (nsid, ns) in &want.namespaces {
        let ns_dir = namespace_dir(&dir, *nsid);
        let device = check_namespace(nqn, ns)?;
        let blank = Namespace::default();
        let have_ns = match have.namespaces.get(nsid) {
            Some(h) => h,
            None => {
                steps.push(Step::mkdir(&ns_dir));
                &blank
            }
        };
        let mut writes = Vec::new();
        if have_ns.device_path != ns.device_path {
            writes.push(Step::write(path(&[&ns_dir, "device_path"]), device));
        }
        for (attr, wanted, present) in [
            ("device_uuid", &ns.uuid, &have_ns.uuid),
            ("device_nguid", &ns.nguid, &have_ns.nguid),
        ] {
            if let Some(value) = wanted {
                if present.as_ref() != Some(value) {
                    writes.push(Step::write(path(&[&ns_dir, attr]), value.as_str()));
                }
            }
        }
        let reconfigure = !writes.is_empty();
        if have_ns.enabled && (reconfigure || !ns.enabled) {
            steps.push(Step::write(path(&[&ns_dir, "enable"]), "0"));
        }
        steps.extend(writes);
        if ns.enabled && (reconfigure || !have_ns.enabled) {
            steps.push(Step::write(path(&[&ns_dir, "enable"]), "1"));
        }
    }
    for (nsid, ns) in &have.namespaces {
        if !want.namespaces.contains_key(nsid) {
            remove_namespace(&dir, *nsid, ns, steps);
        }
    }
    Ok(())
}

fn remove_namespace(dir: &str, nsid: crate::Nsid, ns: &Namespace, steps: &mut Vec<Step>) {
    let ns_dir = namespace_dir(dir, nsid);
    if ns.enabled {
        steps.push(Step::write(path(&[&ns_dir, "enable"]), "0"));
    }
    steps.push(Step::rmdir(ns_dir));
}

fn plan_port(
    id: PortId,
    have: Option<&Port>,
    want: &Port,
    steps: &mut Vec<Step>,
) -> Result<(), Error> {
    let dir = port_dir(id);
    let mut attrs = Vec::new();
    // A loop port wanted without an address keeps whatever address an
    // earlier transport left in `addr_traddr`/`addr_trsvcid` (nothing clears
    // them, and loop ignores them): comparing it would rewrite the port, and
    // unlink and relink its subsystems, at every apply.
    let same_addr = have.is_some_and(|h| {
        h.transport == want.transport
            && (h.address == want.address
                || (want.transport == crate::Transport::Loop && want.address.is_none()))
    });
    if !same_addr {
        attrs.push(Step::write(
            path(&[&dir, "addr_trtype"]),
            want.transport.as_str(),
        ));
        if let Some(addr) = want.address {
            let family = if addr.is_ipv4() { "ipv4" } else { "ipv6" };
            attrs.push(Step::write(path(&[&dir, "addr_adrfam"]), family));
            attrs.push(Step::write(
                path(&[&dir, "addr_traddr"]),
                addr.ip().to_string(),
            ));
            attrs.push(Step::write(
                path(&[&dir, "addr_trsvcid"]),
                addr.port().to_string(),
            ));
        } else if want.transport != crate::Transport::Loop {
            return Err(Error::Conflict(format!(
                "port {id}: transport {} needs an address",
                want.transport.as_str()
            )));
        }
    }
    for (attr, wanted, present) in [
        (
            "param_inline_data_size",
            want.inline_data_size,
            have.and_then(|h| h.inline_data_size),
        ),
        (
            "param_max_queue_size",
            want.max_queue_size,
            have.and_then(|h| h.max_queue_size),
        ),
    ] {
        if let Some(value) = wanted {
            if present != Some(value) {
                attrs.push(Step::write(path(&[&dir, attr]), value.to_string()));
            }
        }
    }
    let none = std::collections::BTreeSet::new();
    let linked = have.map_or(&none, |h| &h.subsystems);
    let link = |nqn: &Nqn| Step::symlink(subsystem_dir(nqn), link_path(&dir, nqn));
    let unlink = |nqn: &Nqn| Step::unlink(link_path(&dir, nqn));
    if have.is_none() {
        steps.push(Step::mkdir(&dir));
    }
    if attrs.is_empty() {
        steps.extend(want.subsystems.difference(linked).map(link));
    } else {
        // The kernel refuses address writes while the port is enabled, and a
        // port is enabled while any subsystem is linked to it: unlink, write,
        // link again. Only subsystems the desired state names are moved with
        // the port; unlinking another's would disconnect its hosts.
        let others: Vec<String> = linked
            .difference(&want.subsystems)
            .map(|n| n.to_string())
            .collect();
        if !others.is_empty() {
            return Err(Error::Conflict(format!(
                "port {id} must move to {}, but subsystems this state does not name are linked to it ({}); moving it would disconnect their hosts",
                want.address
                    .map_or_else(|| want.transport.as_str().to_owned(), |a| a.to_string()),
                others.join(", ")
            )));
        }
        steps.extend(linked.iter().map(unlink));
        steps.extend(attrs);
        steps.extend(want.subsystems.iter().map(link));
    }
    Ok(())
}

/// The steps that remove the objects `teardown` names, in the kernel's order.
pub fn plan_teardown(present: &State, teardown: &Teardown) -> Result<Vec<Step>, Error> {
    let mut steps = Vec::new();
    for (id, port) in &present.ports {
        let dir = port_dir(*id);
        let whole = teardown.ports.contains(id);
        for nqn in &port.subsystems {
            if whole || teardown.subsystems.contains(nqn) {
                steps.push(Step::unlink(link_path(&dir, nqn)));
            }
        }
        if whole {
            steps.push(Step::rmdir(dir));
        }
    }
    for nqn in &teardown.subsystems {
        let Some(sub) = present.subsystems.get(nqn) else {
            continue;
        };
        let dir = subsystem_dir(nqn);
        for host in &sub.allowed_hosts {
            steps.push(Step::unlink(path(&[&dir, "allowed_hosts", host.as_str()])));
        }
        for (nsid, ns) in &sub.namespaces {
            remove_namespace(&dir, *nsid, ns, &mut steps);
        }
        steps.push(Step::rmdir(dir));
    }
    for host in &teardown.hosts {
        if !present.hosts.contains(host) {
            continue;
        }
        let user = present
            .subsystems
            .iter()
            .find(|(nqn, s)| !teardown.subsystems.contains(*nqn) && s.allowed_hosts.contains(host));
        if let Some((nqn, _)) = user {
            return Err(Error::Conflict(format!(
                "host {host} is still allowed by subsystem {nqn}"
            )));
        }
        steps.push(Step::rmdir(path(&["hosts", host.as_str()])));
    }
    Ok(steps)
}

fn check_text(what: &str, nqn: &Nqn, value: Option<&str>, max: usize) -> Result<(), Error> {
    match value {
        Some(v)
            if v.is_empty() || v.len() > max || !v.bytes().all(|b| (0x20..0x7f).contains(&b)) =>
        {
            Err(Error::InvalidValue {
                what: format!("{what} of subsystem {nqn}"),
                why: format!("{v:?} must be 1 to {max} printable ASCII characters"),
            })
        }
        _ => Ok(()),
    }
}

/// Checks `ns`'s device path and identifiers; its device path as text.
fn check_namespace<'a>(nqn: &Nqn, ns: &'a Namespace) -> Result<Cow<'a, str>, Error> {
    let path = ns.device_path.to_string_lossy();
    if !ns.device_path.is_absolute() || path.contains(['\0', '\n']) || path.len() > 4095 {
        return Err(Error::InvalidValue {
            what: format!("device path of a namespace of {nqn}"),
            why: format!("{path:?} must be an absolute path without NUL or newline"),
        });
    }
    for (what, v) in [("uuid", &ns.uuid), ("nguid", &ns.nguid)] {
        if let Some(v) = v {
            if !is_uuid_text(v) {
                return Err(Error::InvalidValue {
                    what: format!("{what} of a namespace of {nqn}"),
                    why: format!("{v:?} is not of the form xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"),
                });
            }
        }
    }
    Ok(path)
}

fn is_uuid_text(v: &str) -> bool {
    let groups: Vec<&str> = v.split('-').collect();
    groups.len() == 5
        && groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups
            .iter()
            .all(|g| g.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
