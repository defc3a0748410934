//! The demo: the volume lifecycle in the kernel lab, step by step, with what
//! the kernel shows at each one. Run with `make demo`.
use nvmet::{Namespace, Nqn, Nsid, Nvmet, Port, PortId, State, Subsystem, Teardown};
use pillar_csi_lab::{
    block::{pattern, read_at, wait_for, write_at},
    nvme::Connection,
    run, Lab, Result,
};
use std::{path::PathBuf, time::Duration};

fn main() -> Result<()> {
    let lab = Lab::get();
    let dataset = format!("{}/demo-vol", lab.pool);

    // The zvol is made with the CLI until the agent drives libzfs_core.
    run("zfs", &["create", "-V", "128M", &dataset])?;
    let zvol = PathBuf::from(format!("/dev/zvol/{dataset}"));
    wait_for(&zvol, Duration::from_secs(20))?;
    let real = std::fs::canonicalize(&zvol)?;
    println!(
        "1. zvol {dataset} created: {} -> {}",
        zvol.display(),
        real.display()
    );

    let target = Nvmet::open()?;
    let nqn = Nqn::new("nqn.2026-01.com.bhyoo.pillar-csi:labpool.demo-vol")?;
    let host = Nqn::new("nqn.2026-01.com.bhyoo.pillar-csi:demo-host")?;
    let mut sub = Subsystem {
        allowed_hosts: [host.clone()].into(),
        serial: Some("pillardemo01".into()),
        ..Default::default()
    };
    sub.namespaces.insert(
        Nsid::new(1)?,
        Namespace {
            device_path: zvol.clone(),
            enabled: true,
            ..Default::default()
        },
    );
    let mut port = Port::tcp("127.0.0.1:4420".parse()?);
    port.subsystems.insert(nqn.clone());
    let mut desired = State::default();
    desired.subsystems.insert(nqn.clone(), sub);
    desired.ports.insert(PortId(1), port);
    let steps = target.apply(&desired)?;
    println!(
        "2. exported over NVMe/TCP 127.0.0.1:4420 as {nqn} (ACL: {host}); {} configfs changes",
        steps.len()
    );
    let again = target.apply(&desired)?;
    println!("   applying the same state again: {} changes", again.len());
    let present = target.read()?;
    let ns = &present.subsystems[&nqn].namespaces[&Nsid::new(1)?];
    println!(
        "   kernel reads back: namespace 1 device_path={} enabled={}",
        ns.device_path.display(),
        ns.enabled
    );

    let conn = Connection::tcp("127.0.0.1", 4420, nqn.as_str(), host.as_str())?;
    let disk = conn.namespace_device(1)?;
    println!(
        "3. initiator connected as {host}: controller nvme{}, disk {}",
        conn.instance,
        disk.display()
    );

    let data = pattern(2026, 4 << 20);
    write_at(&disk, 0, &data)?;
    println!("4. wrote {} bytes through {}", data.len(), disk.display());
    let back = read_at(&disk, 0, data.len())?;
    let direct = read_at(&zvol, 0, data.len())?;
    println!(
        "   read {} bytes back through NVMe/TCP: {}; on the zvol itself: {}",
        back.len(),
        if back == data {
            "identical"
        } else {
            "DIFFERENT"
        },
        if direct == data {
            "identical"
        } else {
            "DIFFERENT"
        }
    );
    if back != data || direct != data {
        return Err("data read back differs from what was written".into());
    }

    drop(conn);
    let removed = target.teardown(&Teardown {
        subsystems: [nqn.clone()].into(),
        ports: [PortId(1)].into(),
        hosts: [host].into(),
    })?;
    let left = target.read()?;
    println!(
        "5. disconnected and unexported: {} configfs removals; subsystems left: {}, ports left: {}",
        removed.len(),
        left.subsystems.len(),
        left.ports.len()
    );
    run("zfs", &["destroy", &dataset])?;
    println!("6. zvol {dataset} destroyed");
    Ok(())
}
