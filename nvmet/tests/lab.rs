//! nvmet against the real kernel target, with the kernel NVMe/TCP initiator
//! on 127.0.0.1 as the client. Run by the lab runner (`make lab`).
use nvmet::{Namespace, Nqn, Nsid, Nvmet, Port, PortId, State, Subsystem, Teardown};
use pillar_csi_lab::{
    block::{pattern, read_at, wait_for, write_at},
    nvme::Connection,
    run, Lab, Result,
};
use std::{
    path::{Path, PathBuf},
    time::Duration,
};

/// A zvol made with the CLI for the target to serve (set-up only).
fn zvol(lab: &Lab, name: &str) -> Result<(String, PathBuf)> {
    let ds = format!("{}/{name}", lab.pool);
    run("zfs", &["create", "-V", "64M", &ds])?;
    let dev = PathBuf::from(format!("/dev/zvol/{ds}"));
    wait_for(&dev, Duration::from_secs(20))?;
    Ok((ds, dev))
}

fn nqn(name: &str) -> Result<Nqn> {
    Ok(Nqn::new(&format!(
        "nqn.2026-01.com.bhyoo.pillar-csi.lab:{name}"
    ))?)
}

fn export(nqn: &Nqn, dev: &Path, port: PortId, tcp_port: u16, hosts: &[&Nqn]) -> Result<State> {
    let mut sub = Subsystem {
        allow_any_host: hosts.is_empty(),
        serial: Some("pillarlab0001".into()),
        model: Some("pillar-csi lab".into()),
        allowed_hosts: hosts.iter().map(|h| (*h).clone()).collect(),
        ..Default::default()
    };
    sub.namespaces.insert(
        Nsid::new(1)?,
        Namespace {
            device_path: dev.to_path_buf(),
            enabled: true,
            ..Default::default()
        },
    );
    let mut p = Port::tcp(format!("127.0.0.1:{tcp_port}").parse()?);
    p.subsystems.insert(nqn.clone());
    let mut state = State::default();
    state.subsystems.insert(nqn.clone(), sub);
    state.ports.insert(port, p);
    Ok(state)
}

#[test]
#[ignore = "needs the kernel lab"]
fn zvol_exported_over_nvme_tcp_serves_data_and_tears_down() -> Result<()> {
    let lab = Lab::get();
    let name = lab.unique("nvmet-zvol");
    let (ds, dev) = zvol(&lab, &name)?;
    let target = Nvmet::open()?;
    let nqn = nqn(&name)?;
    let desired = export(&nqn, &dev, PortId(11), 4420, &[])?;

    let steps = target.apply(&desired)?;
    assert!(
        steps.len() >= 8,
        "a fresh export takes several steps: {steps:?}"
    );
    assert_eq!(
        target.apply(&desired)?,
        Vec::new(),
        "a second apply changes nothing"
    );

    let present = target.read()?;
    let sub = &present.subsystems[&nqn];
    assert!(sub.allow_any_host);
    assert_eq!(sub.serial.as_deref(), Some("pillarlab0001"));
    assert_eq!(sub.model.as_deref(), Some("pillar-csi lab"));
    let ns = &sub.namespaces[&Nsid::new(1)?];
    assert_eq!((ns.device_path.clone(), ns.enabled), (dev.clone(), true));
    assert!(present.ports[&PortId(11)].subsystems.contains(&nqn));

    let conn = Connection::tcp(
        "127.0.0.1",
        4420,
        nqn.as_str(),
        "nqn.2026-01.com.bhyoo.pillar-csi.lab:host-a",
    )?;
    let disk = conn.namespace_device(1)?;
    let data = pattern(42, 1 << 20);
    write_at(&disk, 1 << 20, &data)?;
    assert!(
        read_at(&disk, 1 << 20, data.len())? == data,
        "read back through NVMe/TCP"
    );
    assert!(
        read_at(&dev, 1 << 20, data.len())? == data,
        "the bytes reached the zvol"
    );
    drop(conn);

    let removed = target.teardown(&Teardown {
        subsystems: [nqn.clone()].into(),
        ports: [PortId(11)].into(),
        hosts: Default::default(),
    })?;
    assert!(!removed.is_empty());
    let after = target.read()?;
    assert!(!after.subsystems.contains_key(&nqn) && !after.ports.contains_key(&PortId(11)));
    run("zfs", &["destroy", &ds])?;
    Ok(())
}

#[test]
#[ignore = "needs the kernel lab"]
fn allowed_host_connects_and_another_is_refused() -> Result<()> {
    let lab = Lab::get();
    let name = lab.unique("nvmet-acl");
    let (ds, dev) = zvol(&lab, &name)?;
    let target = Nvmet::open()?;
    let nqn = nqn(&name)?;
    let allowed = Nqn::new("nqn.2026-01.com.bhyoo.pillar-csi.lab:host-allowed")?;
    let other = "nqn.2026-01.com.bhyoo.pillar-csi.lab:host-other";
    target.apply(&export(&nqn, &dev, PortId(12), 4421, &[&allowed])?)?;

    let refused = Connection::tcp("127.0.0.1", 4421, nqn.as_str(), other);
    assert!(refused.is_err(), "a host outside allowed_hosts connected");
    let conn = Connection::tcp("127.0.0.1", 4421, nqn.as_str(), allowed.as_str())?;
    let disk = conn.namespace_device(1)?;
    let data = pattern(7, 64 << 10);
    write_at(&disk, 0, &data)?;
    assert!(read_at(&dev, 0, data.len())? == data);
    drop(conn);

    // Opening the subsystem to any host takes the host link away first.
    target.apply(&export(&nqn, &dev, PortId(12), 4421, &[])?)?;
    let any = Connection::tcp("127.0.0.1", 4421, nqn.as_str(), other)?;
    drop(any);

    target.teardown(&Teardown {
        subsystems: [nqn.clone()].into(),
        ports: [PortId(12)].into(),
        hosts: [allowed].into(),
    })?;
    run("zfs", &["destroy", &ds])?;
    Ok(())
}

#[test]
#[ignore = "needs the kernel lab"]
fn kernel_refusals_come_back_with_path_and_meaning() -> Result<()> {
    let lab = Lab::get();
    let name = lab.unique("nvmet-refuse");
    let (ds, dev) = zvol(&lab, &name)?;
    let target = Nvmet::open()?;
    let nqn = nqn(&name)?;
    target.apply(&export(&nqn, &dev, PortId(13), 4422, &[])?)?;
    // Writing a device path under an enabled namespace directly: EBUSY.
    let path = format!("subsystems/{nqn}/namespaces/1/device_path");
    let err = target
        .tree()
        .run(&[nvmet::Step::write(path, "/dev/null")])
        .map_err(nvmet::Error::from)
        .err()
        .ok_or("the kernel accepted a device change on an enabled namespace")?;
    let text = err.to_string();
    assert!(
        text.contains("device_path") && text.contains("the namespace is enabled"),
        "{text}"
    );
    target.teardown(&Teardown {
        subsystems: [nqn].into(),
        ports: [PortId(13)].into(),
        hosts: Default::default(),
    })?;
    run("zfs", &["destroy", &ds])?;
    Ok(())
}
