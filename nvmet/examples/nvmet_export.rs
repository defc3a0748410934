//! Export a block device over NVMe/TCP, show what the kernel holds, tear it
//! down.
//!
//! ```sh
//! sudo modprobe nvmet nvmet-tcp      # configfs must be mounted too
//! sudo ./target/debug/examples/nvmet_export /dev/loop0
//! ```
//!
//! A host admitted below can then connect, for example with
//! `nvme connect -t tcp -a 127.0.0.1 -s 4430 -n <subsystem NQN> -q <host NQN>`.
use nvmet::{Namespace, Nqn, Nsid, Nvmet, Port, PortId, State, Subsystem, Teardown};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let device = std::env::args()
        .nth(1)
        .ok_or("usage: nvmet_export <block device>")?;

    // Every name is a checked type: a bad NQN is an error here, before
    // anything in configfs is touched.
    let nqn = Nqn::new("nqn.2026-01.org.example:export-demo")?;
    let host = Nqn::new("nqn.2026-01.org.example:host-1")?;

    // The desired state: one subsystem with namespace 1 on the device, only
    // `host` admitted, linked to one TCP port.
    let mut subsystem = Subsystem {
        allowed_hosts: [host.clone()].into(),
        ..Default::default()
    };
    subsystem.namespaces.insert(
        Nsid::new(1)?,
        Namespace {
            device_path: device.into(),
            enabled: true,
            ..Default::default()
        },
    );
    let mut port = Port::tcp("127.0.0.1:4430".parse()?);
    port.subsystems.insert(nqn.clone());
    let mut desired = State::default();
    desired.subsystems.insert(nqn.clone(), subsystem);
    desired.ports.insert(PortId(4430), port);

    // Apply it: only the missing pieces are created, in the kernel's order.
    let target = Nvmet::open()?;
    let steps = target.apply(&desired)?;
    println!("apply: {} steps", steps.len());
    for step in &steps {
        println!("  {step:?}");
    }
    // Applying again changes nothing: the state is already there.
    println!("apply again: {} steps", target.apply(&desired)?.len());

    // Read back what the kernel holds now.
    let present = target.read_scoped(&desired)?;
    let served = &present.subsystems[&nqn];
    let namespace = &served.namespaces[&Nsid::new(1)?];
    let hosts: Vec<String> = served.allowed_hosts.iter().map(Nqn::to_string).collect();
    println!(
        "{nqn}: namespace 1 on {} (enabled: {}), allowed hosts: {}",
        namespace.device_path.display(),
        namespace.enabled,
        hosts.join(", "),
    );

    // Tear down: the subsystem, the port and the host entry, with
    // everything that hangs off them, in the kernel's order.
    let removed = target.teardown(&Teardown {
        subsystems: [nqn.clone()].into(),
        ports: [PortId(4430)].into(),
        hosts: [host].into(),
    })?;
    println!("teardown: {} steps", removed.len());
    if target.read()?.subsystems.contains_key(&nqn) {
        return Err(format!("{nqn} is still there after teardown").into());
    }
    println!("{nqn} is gone");
    Ok(())
}
