//! The nvmet plan functions (`plan_apply`, `plan_apply_revoking`,
//! `plan_teardown`) over states built from the fuzz bytes. Names go through
//! the crates' constructors (a name they refuse is an error, never a panic);
//! values (device paths, serials, UUIDs) may be anything, and a plan refuses
//! a bad one with an error. For a present state reached by applying a plan
//! to an empty target, and any desired state:
//!
//! - every plan made runs in an in-memory model of the kernel's configfs
//!   ([`nvmet_model`]) without a step the kernel would refuse;
//! - after the steps of a plan ran, planning again makes no step;
//! - tearing down everything present leaves nothing, and tearing down what
//!   the desired state names leaves none of it.
#![no_main]
use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;

#[path = "plans/nvmet_model.rs"]
mod nvmet_model;

/// A name: one of a few valid ones (so states overlap), or any text.
#[derive(Arbitrary, Debug)]
enum Name {
    Known(u8),
    Raw(String),
}

/// A value: a well-formed one from a number, or any text.
#[derive(Arbitrary, Debug)]
enum Text {
    Valid(u128),
    Raw(String),
}

#[derive(Arbitrary, Debug)]
struct NsIn {
    nsid: u8,
    device: Text,
    uuid: Option<Text>,
    nguid: Option<Text>,
    enabled: bool,
}

#[derive(Arbitrary, Debug)]
struct SubIn {
    name: Name,
    allow_any_host: bool,
    serial: Option<Text>,
    model: Option<Text>,
    namespaces: Vec<NsIn>,
    allowed_hosts: Vec<Name>,
}

#[derive(Arbitrary, Debug)]
struct PortIn {
    id: u8,
    transport: u8,
    address: Option<(bool, u8)>,
    inline_data_size: Option<u32>,
    max_queue_size: Option<u32>,
    subsystems: Vec<Name>,
}

#[derive(Arbitrary, Debug)]
struct NvmetIn {
    subsystems: Vec<SubIn>,
    ports: Vec<PortIn>,
    hosts: Vec<Name>,
}

#[derive(Arbitrary, Debug)]
struct Input {
    present: NvmetIn,
    desired: NvmetIn,
}

fn nqn(n: &Name) -> Option<nvmet::Nqn> {
    match n {
        Name::Known(i) => Some(
            nvmet::Nqn::new(&format!("nqn.2026-01.org.example:n{}", i % 4))
                .expect("a valid NQN"),
        ),
        Name::Raw(s) => nvmet::Nqn::new(s).ok(),
    }
}

fn uuid(t: &Text) -> String {
    match t {
        Text::Valid(n) => {
            let h = format!("{n:032x}");
            format!(
                "{}-{}-{}-{}-{}",
                &h[..8],
                &h[8..12],
                &h[12..16],
                &h[16..20],
                &h[20..]
            )
        }
        Text::Raw(s) => s.clone(),
    }
}

fn text(t: &Text, prefix: &str) -> String {
    match t {
        Text::Valid(n) => format!("{prefix}{}", n % 7),
        Text::Raw(s) => s.clone(),
    }
}

fn nvmet_state(i: &NvmetIn) -> nvmet::State {
    use nvmet::{Namespace, Nsid, Port, PortId, State, Subsystem, Transport};
    let mut s = State::default();
    for sub in &i.subsystems {
        let Some(name) = nqn(&sub.name) else { continue };
        let mut want = Subsystem {
            allow_any_host: sub.allow_any_host,
            serial: sub.serial.as_ref().map(|t| text(t, "serial")),
            model: sub.model.as_ref().map(|t| text(t, "model")),
            allowed_hosts: sub.allowed_hosts.iter().filter_map(nqn).collect(),
            ..Default::default()
        };
        for ns in &sub.namespaces {
            let Ok(id) = Nsid::new(u64::from(ns.nsid % 4)) else {
                continue;
            };
            want.namespaces.insert(
                id,
                Namespace {
                    device_path: text(&ns.device, "/dev/zd").into(),
                    uuid: ns.uuid.as_ref().map(uuid),
                    nguid: ns.nguid.as_ref().map(uuid),
                    enabled: ns.enabled,
                },
            );
        }
        s.subsystems.insert(name, want);
    }
    for p in &i.ports {
        let transport = match p.transport % 3 {
            0 => Transport::Tcp,
            1 => Transport::Rdma,
            _ => Transport::Loop,
        };
        let address = p.address.map(|(v6, port)| {
            let ip: std::net::IpAddr = if v6 {
                std::net::Ipv6Addr::LOCALHOST.into()
            } else {
                std::net::Ipv4Addr::LOCALHOST.into()
            };
            std::net::SocketAddr::new(ip, 4420 + u16::from(port % 2))
        });
        s.ports.insert(
            PortId(u16::from(p.id % 3)),
            Port {
                transport,
                address,
                inline_data_size: p.inline_data_size,
                max_queue_size: p.max_queue_size,
                subsystems: p.subsystems.iter().filter_map(nqn).collect(),
            },
        );
    }
    s.hosts = i.hosts.iter().filter_map(nqn).collect();
    s
}

fn nvmet_properties(input: &Input) {
    use nvmet::{plan_apply, plan_apply_revoking, plan_teardown, State, Teardown};
    use nvmet_model::Model;
    // A present state the target can be in: what a plan from nothing made.
    let mut present = Model::default();
    if let Ok(steps) = plan_apply(&State::default(), &nvmet_state(&input.present)) {
        present.run(&steps).expect("a plan from nothing runs");
    }
    let desired = nvmet_state(&input.desired);
    if let Ok(steps) = plan_apply(&present.state, &desired) {
        let mut m = present.clone();
        m.run(&steps).expect("the plan runs");
        assert_eq!(
            plan_apply(&m.state, &desired).expect("planned once, plans again"),
            Vec::new(),
            "a second plan after the first ran"
        );
    }
    if let Ok(plan) = plan_apply_revoking(&present.state, &desired) {
        let mut m = present.clone();
        m.run(&plan.steps).expect("the revoking plan runs");
        assert_eq!(
            plan_apply(&m.state, &desired).expect("planned once, plans again"),
            Vec::new(),
            "a second plan after the revoking one ran"
        );
    }
    let everything = Teardown {
        subsystems: present.state.subsystems.keys().cloned().collect(),
        ports: present.state.ports.keys().copied().collect(),
        hosts: present.state.hosts.clone(),
    };
    let mut m = present.clone();
    let steps = plan_teardown(&m.state, &everything).expect("everything can go");
    m.run(&steps).expect("the teardown runs");
    assert_eq!(m.state, State::default(), "a teardown of everything");
    let named = Teardown {
        subsystems: desired.subsystems.keys().cloned().collect(),
        ports: desired.ports.keys().copied().collect(),
        hosts: desired.hosts.clone(),
    };
    let mut m = present.clone();
    if let Ok(steps) = plan_teardown(&m.state, &named) {
        m.run(&steps).expect("the teardown runs");
        assert!(named.subsystems.iter().all(|n| !m.state.subsystems.contains_key(n)));
        assert!(named.ports.iter().all(|p| !m.state.ports.contains_key(p)));
        assert!(named.hosts.iter().all(|h| !m.state.hosts.contains(h)));
    }
}

fuzz_target!(|input: Input| {
    nvmet_properties(&input);
});
