//! Tests of the plan functions (`plan.rs`).
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
    assert!(matches!(steps.first(), Some(Step::Unlink(p)) if p.starts_with("ports/1/subsystems/")));
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

#[test]
fn numbers_in_paths_are_their_decimal_digits() {
    for n in [0, 7, 10, 65535, 1_000_000, u32::MAX] {
        assert_eq!(Decimal::of(n).as_str(), n.to_string());
    }
    assert_eq!(port_dir(PortId(4420)), "ports/4420");
    let ns = namespace_dir("subsystems/x", Nsid::new(12).expect("nsid"));
    assert_eq!(ns, "subsystems/x/namespaces/12");
}
