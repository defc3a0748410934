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
use std::collections::BTreeSet;

pub(crate) fn subsystem_dir(nqn: &Nqn) -> String {
    format!("subsystems/{nqn}")
}

pub(crate) fn port_dir(id: PortId) -> String {
    format!("ports/{id}")
}

/// The steps that turn `present` into `desired` for the objects `desired` names.
///
/// Port links are additive: a port's desired `subsystems` are linked, and
/// links to other subsystems stay (they belong to other exports); a link goes
/// away with [`plan_teardown`] of its subsystem or port.
pub fn plan_apply(present: &State, desired: &State) -> Result<Vec<Step>, Error> {
    let mut steps = Vec::new();
    let wanted_hosts: BTreeSet<&Nqn> = desired
        .hosts
        .iter()
        .chain(desired.subsystems.values().flat_map(|s| &s.allowed_hosts))
        .collect();
    for host in wanted_hosts {
        if !present.hosts.contains(host) {
            steps.push(Step::mkdir(format!("hosts/{host}")));
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
                steps.push(Step::write(format!("{dir}/{attr}"), value.as_str()));
            }
        }
    }
    for host in have.allowed_hosts.difference(&want.allowed_hosts) {
        steps.push(Step::unlink(format!("{dir}/allowed_hosts/{host}")));
    }
    if want.allow_any_host != have.allow_any_host {
        steps.push(Step::write(
            format!("{dir}/attr_allow_any_host"),
            if want.allow_any_host { "1" } else { "0" },
        ));
    }
    for host in want.allowed_hosts.difference(&have.allowed_hosts) {
        steps.push(Step::symlink(
            format!("hosts/{host}"),
            format!("{dir}/allowed_hosts/{host}"),
        ));
    }
    for (nsid, ns) in &want.namespaces {
        let ns_dir = format!("{dir}/namespaces/{nsid}");
        check_namespace(nqn, ns)?;
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
            writes.push(Step::write(
                format!("{ns_dir}/device_path"),
                ns.device_path.to_string_lossy(),
            ));
        }
        for (attr, wanted, present) in [
            ("device_uuid", &ns.uuid, &have_ns.uuid),
            ("device_nguid", &ns.nguid, &have_ns.nguid),
        ] {
            if let Some(value) = wanted {
                if present.as_ref() != Some(value) {
                    writes.push(Step::write(format!("{ns_dir}/{attr}"), value.as_str()));
                }
            }
        }
        let reconfigure = !writes.is_empty();
        if have_ns.enabled && (reconfigure || !ns.enabled) {
            steps.push(Step::write(format!("{ns_dir}/enable"), "0"));
        }
        steps.extend(writes);
        if ns.enabled && (reconfigure || !have_ns.enabled) {
            steps.push(Step::write(format!("{ns_dir}/enable"), "1"));
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
    let ns_dir = format!("{dir}/namespaces/{nsid}");
    if ns.enabled {
        steps.push(Step::write(format!("{ns_dir}/enable"), "0"));
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
            format!("{dir}/addr_trtype"),
            want.transport.as_str(),
        ));
        if let Some(addr) = want.address {
            let family = if addr.is_ipv4() { "ipv4" } else { "ipv6" };
            attrs.push(Step::write(format!("{dir}/addr_adrfam"), family));
            attrs.push(Step::write(
                format!("{dir}/addr_traddr"),
                addr.ip().to_string(),
            ));
            attrs.push(Step::write(
                format!("{dir}/addr_trsvcid"),
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
                attrs.push(Step::write(format!("{dir}/{attr}"), value.to_string()));
            }
        }
    }
    let linked = have.map(|h| h.subsystems.clone()).unwrap_or_default();
    let link = |nqn: &Nqn| Step::symlink(subsystem_dir(nqn), format!("{dir}/subsystems/{nqn}"));
    let unlink = |nqn: &Nqn| Step::unlink(format!("{dir}/subsystems/{nqn}"));
    if have.is_none() {
        steps.push(Step::mkdir(&dir));
    }
    if attrs.is_empty() {
        steps.extend(want.subsystems.difference(&linked).map(link));
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
                steps.push(Step::unlink(format!("{dir}/subsystems/{nqn}")));
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
            steps.push(Step::unlink(format!("{dir}/allowed_hosts/{host}")));
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
        steps.push(Step::rmdir(format!("hosts/{host}")));
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

fn check_namespace(nqn: &Nqn, ns: &Namespace) -> Result<(), Error> {
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
    Ok(())
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
mod tests {
    use super::*;
    use crate::Nsid;

    fn nqn(s: &str) -> Nqn {
        Nqn::new(&format!("nqn.2026-01.org.example:{s}")).expect("valid test NQN")
    }

    fn export(name: &str, dev: &str, hosts: &[&str]) -> State {
        let mut s = State::default();
        let mut sub = Subsystem {
            allow_any_host: hosts.is_empty(),
            allowed_hosts: hosts.iter().map(|h| nqn(h)).collect(),
            serial: Some("pillar0001".into()),
            ..Default::default()
        };
        sub.namespaces.insert(
            Nsid::new(1).expect("nsid"),
            Namespace {
                device_path: dev.into(),
                enabled: true,
                ..Default::default()
            },
        );
        s.subsystems.insert(nqn(name), sub);
        let mut port = Port::tcp("127.0.0.1:4420".parse().expect("addr"));
        port.subsystems.insert(nqn(name));
        s.ports.insert(PortId(1), port);
        s
    }

    /// Index of the first step matching `f`, or usize::MAX when none does.
    fn position(steps: &[Step], f: impl Fn(&Step) -> bool) -> usize {
        steps.iter().position(f).unwrap_or(usize::MAX)
    }

    #[test]
    fn fresh_export_orders_serial_enable_and_port_link() -> Result<(), Error> {
        let steps = plan_apply(&State::default(), &export("v", "/dev/zd0", &["h1"]))?;
        let dir = "subsystems/nqn.2026-01.org.example:v";
        let serial = position(
            &steps,
            |s| matches!(s, Step::Write { path, .. } if path.ends_with("attr_serial")),
        );
        let dev = position(
            &steps,
            |s| matches!(s, Step::Write { path, .. } if path.ends_with("device_path")),
        );
        let enable = position(
            &steps,
            |s| matches!(s, Step::Write { path, value } if path.ends_with("enable") && value == "1"),
        );
        let host = position(
            &steps,
            |s| matches!(s, Step::Mkdir(p) if p.starts_with("hosts/")),
        );
        let allow = position(
            &steps,
            |s| matches!(s, Step::Symlink { link, .. } if link.contains("allowed_hosts")),
        );
        let addr = position(
            &steps,
            |s| matches!(s, Step::Write { path, .. } if path.ends_with("addr_traddr")),
        );
        let link = position(
            &steps,
            |s| matches!(s, Step::Symlink { link, .. } if link.starts_with("ports/1/subsystems/")),
        );
        assert_eq!(
            steps.first(),
            Some(&Step::mkdir("hosts/nqn.2026-01.org.example:h1"))
        );
        assert_eq!(steps.get(1), Some(&Step::mkdir(dir)));
        assert!(
            host < allow && serial < dev && dev < enable && enable < link && addr < link,
            "{steps:#?}"
        );
        assert!(
            !steps.iter().any(
                |s| matches!(s, Step::Write { path, .. } if path.ends_with("attr_allow_any_host"))
            ),
            "the kernel default (0) is kept for an ACL subsystem: {steps:#?}"
        );
        Ok(())
    }

    #[test]
    fn applying_the_present_state_changes_nothing() -> Result<(), Error> {
        let s = export("v", "/dev/zd0", &["h1"]);
        let mut present = s.clone();
        present.hosts.insert(nqn("h1"));
        assert_eq!(plan_apply(&present, &s)?, Vec::new());
        Ok(())
    }

    #[test]
    fn changing_a_device_disables_the_namespace_first() -> Result<(), Error> {
        let present = export("v", "/dev/zd0", &[]);
        let steps = plan_apply(&present, &export("v", "/dev/zd16", &[]))?;
        let ns = "subsystems/nqn.2026-01.org.example:v/namespaces/1";
        assert_eq!(
            steps,
            vec![
                Step::write(format!("{ns}/enable"), "0"),
                Step::write(format!("{ns}/device_path"), "/dev/zd16"),
                Step::write(format!("{ns}/enable"), "1"),
            ]
        );
        Ok(())
    }

    #[test]
    fn switching_to_an_acl_clears_allow_any_host_before_linking() -> Result<(), Error> {
        let mut present = export("v", "/dev/zd0", &[]);
        present.hosts.insert(nqn("h1"));
        let steps = plan_apply(&present, &export("v", "/dev/zd0", &["h1"]))?;
        let dir = "subsystems/nqn.2026-01.org.example:v";
        assert_eq!(
            steps,
            vec![
                Step::write(format!("{dir}/attr_allow_any_host"), "0"),
                Step::symlink(
                    "hosts/nqn.2026-01.org.example:h1",
                    format!("{dir}/allowed_hosts/nqn.2026-01.org.example:h1")
                ),
            ]
        );
        let back = plan_apply(
            &export("v", "/dev/zd0", &["h1"]),
            &export("v", "/dev/zd0", &[]),
        )?;
        assert_eq!(
            back,
            vec![
                Step::unlink(format!("{dir}/allowed_hosts/nqn.2026-01.org.example:h1")),
                Step::write(format!("{dir}/attr_allow_any_host"), "1"),
            ]
        );
        Ok(())
    }

    #[test]
    fn moving_a_port_unlinks_before_writing_the_address() -> Result<(), Error> {
        let present = export("v", "/dev/zd0", &[]);
        let mut desired = present.clone();
        if let Some(p) = desired.ports.get_mut(&PortId(1)) {
            p.address = Some("127.0.0.1:4421".parse().expect("addr"));
        }
        let steps = plan_apply(&present, &desired)?;
        assert!(
            matches!(steps.first(), Some(Step::Unlink(p)) if p.starts_with("ports/1/subsystems/"))
        );
        assert!(
            matches!(steps.last(), Some(Step::Symlink { link, .. }) if link.starts_with("ports/1/subsystems/"))
        );
        Ok(())
    }

    #[test]
    fn exporting_one_more_subsystem_keeps_the_other_links() -> Result<(), Error> {
        let mut present = export("a", "/dev/zd0", &[]);
        let b = export("b", "/dev/zd16", &[]);
        present.hosts.clear();
        let steps = plan_apply(&present, &b)?;
        assert!(
            !steps.iter().any(|s| matches!(s, Step::Unlink(_))),
            "{steps:#?}"
        );
        assert!(steps.iter().any(|s| matches!(s, Step::Symlink { link, .. } if link == "ports/1/subsystems/nqn.2026-01.org.example:b")));
        // Moving the port while a subsystem it does not name is linked is
        // refused: that subsystem's hosts would be cut off.
        let mut moved = b.clone();
        if let Some(p) = moved.ports.get_mut(&PortId(1)) {
            p.address = Some("127.0.0.1:4421".parse().expect("addr"));
        }
        let mut both = present.clone();
        both.subsystems.extend(b.subsystems.clone());
        if let Some(p) = both.ports.get_mut(&PortId(1)) {
            p.subsystems.insert(nqn("b"));
        }
        let refused = plan_apply(&both, &moved);
        assert!(
            matches!(&refused, Err(Error::Conflict(m)) if m.contains("nqn.2026-01.org.example:a")),
            "{refused:?}"
        );
        // Naming both moves both.
        if let Some(p) = moved.ports.get_mut(&PortId(1)) {
            p.subsystems.insert(nqn("a"));
        }
        let relinks = plan_apply(&both, &moved)?
            .into_iter()
            .filter(|s| matches!(s, Step::Symlink { link, .. } if link.starts_with("ports/")))
            .count();
        assert_eq!(relinks, 2);
        Ok(())
    }

    #[test]
    fn contradictions_are_refused_before_any_step() {
        let mut s = export("v", "/dev/zd0", &["h1"]);
        if let Some(sub) = s.subsystems.values_mut().next() {
            sub.allow_any_host = true;
        }
        assert!(matches!(
            plan_apply(&State::default(), &s),
            Err(Error::Conflict(_))
        ));
        let mut s = export("v", "relative/dev", &[]);
        assert!(matches!(
            plan_apply(&State::default(), &s),
            Err(Error::InvalidValue { .. })
        ));
        s = export("v", "/dev/zd0", &[]);
        if let Some(sub) = s.subsystems.values_mut().next() {
            sub.serial = Some("x\ny".into());
        }
        assert!(matches!(
            plan_apply(&State::default(), &s),
            Err(Error::InvalidValue { .. })
        ));
        let mut s = export("v", "/dev/zd0", &[]);
        s.subsystems.clear();
        assert!(matches!(
            plan_apply(&State::default(), &s),
            Err(Error::Conflict(_))
        ));
    }

    /// Found by the `plans` fuzz target: a TCP port moved to the loop
    /// transport keeps its old address attributes, and a second apply must
    /// not move it again (unlinking its subsystems each time).
    #[test]
    fn a_loop_port_keeps_the_address_an_earlier_transport_left() -> Result<(), Error> {
        let present = export("v", "/dev/zd0", &[]);
        let mut desired = present.clone();
        if let Some(p) = desired.ports.get_mut(&PortId(1)) {
            p.transport = crate::Transport::Loop;
            p.address = None;
        }
        let steps = plan_apply(&present, &desired)?;
        assert!(
            steps.contains(&Step::write("ports/1/addr_trtype", "loop")),
            "{steps:#?}"
        );
        // Read back after the apply: loop, the TCP address still written.
        let mut after = present.clone();
        if let Some(p) = after.ports.get_mut(&PortId(1)) {
            p.transport = crate::Transport::Loop;
        }
        assert_eq!(plan_apply(&after, &desired)?, Vec::new());
        Ok(())
    }

    #[test]
    fn teardown_unlinks_ports_then_hosts_then_namespaces() -> Result<(), Error> {
        let mut present = export("v", "/dev/zd0", &["h1"]);
        present.hosts.insert(nqn("h1"));
        let t = Teardown {
            subsystems: [nqn("v")].into(),
            ports: BTreeSet::new(),
            hosts: [nqn("h1")].into(),
        };
        let dir = "subsystems/nqn.2026-01.org.example:v";
        assert_eq!(
            plan_teardown(&present, &t)?,
            vec![
                Step::unlink("ports/1/subsystems/nqn.2026-01.org.example:v"),
                Step::unlink(format!("{dir}/allowed_hosts/nqn.2026-01.org.example:h1")),
                Step::write(format!("{dir}/namespaces/1/enable"), "0"),
                Step::rmdir(format!("{dir}/namespaces/1")),
                Step::rmdir(dir),
                Step::rmdir("hosts/nqn.2026-01.org.example:h1"),
            ]
        );
        let keep_sub = Teardown {
            hosts: [nqn("h1")].into(),
            ..Default::default()
        };
        assert!(matches!(
            plan_teardown(&present, &keep_sub),
            Err(Error::Conflict(_))
        ));
        Ok(())
    }
}
