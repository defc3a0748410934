//! The nvmet and LIO plan functions (nvmet's `plan_apply`,
//! `plan_apply_revoking`, `plan_teardown`; LIO's `plan_apply`,
//! `plan_teardown` and the teardown-then-apply of its revoking apply) over
//! states built from the fuzz bytes. Names go through
//! the crates' constructors (a name they refuse is an error, never a panic);
//! values (device paths, serials, UUIDs) may be anything, and a plan refuses
//! a bad one with an error. For a present state reached by applying a plan
//! to an empty target, and any desired state:
//!
//! - every plan made runs in an in-memory model of the kernel's configfs
//!   ([`nvmet_model`], [`lio_model`]) without a step the kernel would
//!   refuse;
//! - after the steps of a plan ran, planning again makes no step;
//! - tearing down everything present leaves nothing, and tearing down what
//!   the desired state names leaves none of it.
#![no_main]
use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;

#[path = "plans/lio_model.rs"]
mod lio_model;
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
struct SoIn {
    name: Name,
    device: Text,
    readonly: bool,
    serial: Option<Text>,
}

#[derive(Arbitrary, Debug)]
struct AclIn {
    initiator: Name,
    /// (mapped LUN, TPG LUN, write protect)
    mapped: Vec<(u8, u8, bool)>,
    chap: Option<(Text, Text)>,
}

#[derive(Arbitrary, Debug)]
struct TpgIn {
    tpgt: u8,
    enabled: bool,
    /// The four attributes, one bit each.
    attributes: u8,
    /// (IPv6, port choice)
    portals: Vec<(bool, u8)>,
    /// (LUN, storage object)
    luns: Vec<(u8, Name)>,
    acls: Vec<AclIn>,
}

#[derive(Arbitrary, Debug)]
struct TargetIn {
    iqn: Name,
    tpgs: Vec<TpgIn>,
}

#[derive(Arbitrary, Debug)]
struct LioIn {
    storage_objects: Vec<SoIn>,
    targets: Vec<TargetIn>,
}

#[derive(Arbitrary, Debug)]
enum Input {
    Nvmet { present: NvmetIn, desired: NvmetIn },
    Lio { present: LioIn, desired: LioIn },
}

fn nqn(n: &Name) -> Option<nvmet::Nqn> {
    match n {
        Name::Known(i) => Some(
            nvmet::Nqn::new(&format!("nqn.2026-01.org.example:n{}", i % 4)).expect("a valid NQN"),
        ),
        Name::Raw(s) => nvmet::Nqn::new(s).ok(),
    }
}

fn iqn(n: &Name) -> Option<lio::Iqn> {
    match n {
        Name::Known(i) => Some(
            lio::Iqn::new(&format!("iqn.2003-01.org.example:n{}", i % 4)).expect("a valid IQN"),
        ),
        Name::Raw(s) => lio::Iqn::new(s).ok(),
    }
}

fn so_name(n: &Name) -> Option<lio::StorageObjectName> {
    match n {
        Name::Known(i) => {
            Some(lio::StorageObjectName::new(&format!("so{}", i % 4)).expect("a valid name"))
        }
        Name::Raw(s) => lio::StorageObjectName::new(s).ok(),
    }
}

fn socket(v6: bool, port: u8, base: u16) -> std::net::SocketAddr {
    let ip: std::net::IpAddr = if v6 {
        std::net::Ipv6Addr::LOCALHOST.into()
    } else {
        std::net::Ipv4Addr::LOCALHOST.into()
    };
    std::net::SocketAddr::new(ip, base + u16::from(port % 2))
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
        let address = p.address.map(|(v6, port)| socket(v6, port, 4420));
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

fn nvmet_properties(present_in: &NvmetIn, desired_in: &NvmetIn) {
    use nvmet::{plan_apply, plan_apply_revoking, plan_teardown, State, Teardown};
    use nvmet_model::Model;
    // A present state the target can be in: what a plan from nothing made.
    let mut present = Model::default();
    if let Ok(steps) = plan_apply(&State::default(), &nvmet_state(present_in)) {
        present.run(&steps).expect("a plan from nothing runs");
    }
    let desired = nvmet_state(desired_in);
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
        assert!(named
            .subsystems
            .iter()
            .all(|n| !m.state.subsystems.contains_key(n)));
        assert!(named.ports.iter().all(|p| !m.state.ports.contains_key(p)));
        assert!(named.hosts.iter().all(|h| !m.state.hosts.contains(h)));
    }
}

fn lio_state(i: &LioIn) -> lio::State {
    use lio::{Acl, Chap, Lun, MappedLun, State, StorageObject, Tpg, TpgAttributes, TpgLun, Tpgt};
    let mut s = State::default();
    for so in &i.storage_objects {
        let Some(name) = so_name(&so.name) else {
            continue;
        };
        let want = StorageObject {
            udev_path: text(&so.device, "/dev/zd").into(),
            readonly: so.readonly,
            unit_serial: so.serial.as_ref().map(|t| text(t, "serial")),
            ..Default::default()
        };
        s.storage_objects.insert(name, want);
    }
    for t in &i.targets {
        let Some(name) = iqn(&t.iqn) else { continue };
        let target = s.targets.entry(name).or_default();
        for tpg in &t.tpgs {
            let Ok(tag) = Tpgt::new(u16::from(tpg.tpgt % 3)) else {
                continue;
            };
            let bit = |n: u8| tpg.attributes & (1 << n) != 0;
            let mut want = Tpg {
                enabled: tpg.enabled,
                attributes: TpgAttributes {
                    authentication: bit(0),
                    generate_node_acls: bit(1),
                    demo_mode_write_protect: bit(2),
                    cache_dynamic_acls: bit(3),
                },
                portals: tpg
                    .portals
                    .iter()
                    .map(|(v6, port)| socket(*v6, *port, 3260))
                    .collect(),
                ..Default::default()
            };
            for (lun, so) in &tpg.luns {
                if let Some(so) = so_name(so) {
                    want.luns.insert(Lun(u16::from(lun % 3)), TpgLun::new(so));
                }
            }
            for acl in &tpg.acls {
                let Some(initiator) = iqn(&acl.initiator) else {
                    continue;
                };
                let mut a = Acl {
                    chap: acl.chap.as_ref().map(|(u, p)| Chap {
                        userid: text(u, "user"),
                        password: text(p, "secretsecret"),
                    }),
                    ..Default::default()
                };
                for (mapped, lun, wp) in &acl.mapped {
                    let mut m = MappedLun::new(Lun(u16::from(lun % 3)));
                    m.write_protect = *wp;
                    a.mapped_luns.insert(Lun(u16::from(mapped % 3)), m);
                }
                want.acls.insert(initiator, a);
            }
            target.tpgs.insert(tag, want);
        }
    }
    s
}

/// A fresh HBA index for each storage object of `desired` not in `present`.
fn new_hbas(
    m: &lio_model::Model,
    desired: &lio::State,
) -> std::collections::BTreeMap<lio::StorageObjectName, u32> {
    let mut next = m.hbas.iter().max().map_or(0, |n| n + 1);
    desired
        .storage_objects
        .keys()
        .filter(|n| !m.state.storage_objects.contains_key(*n))
        .map(|n| {
            next += 1;
            (n.clone(), next)
        })
        .collect()
}

fn lio_properties(present_in: &LioIn, desired_in: &LioIn) {
    use lio::{plan_apply, plan_teardown, targets_leaving_demo_mode, State, Teardown};
    use lio_model::Model;
    let mut present = Model::default();
    let first = lio_state(present_in);
    if let Ok(steps) = plan_apply(&State::default(), &first, &new_hbas(&present, &first)) {
        present.run(&steps).expect("a plan from nothing runs");
    }
    let desired = lio_state(desired_in);
    let none = Default::default();
    if let Ok(steps) = plan_apply(&present.state, &desired, &new_hbas(&present, &desired)) {
        let mut m = present.clone();
        m.run(&steps).expect("the plan runs");
        assert_eq!(
            plan_apply(&m.state, &desired, &none).expect("planned once, plans again"),
            Vec::new(),
            "a second plan after the first ran"
        );
    }
    // Lio::apply_revoking: the targets leaving demo mode torn down, then the apply.
    let recreated = targets_leaving_demo_mode(&present.state, &desired);
    if !recreated.is_empty() {
        let mut m = present.clone();
        let t = Teardown {
            targets: recreated,
            ..Default::default()
        };
        let steps = plan_teardown(&m.state, &t).expect("targets can go");
        m.run(&steps).expect("the teardown runs");
        if let Ok(steps) = plan_apply(&m.state, &desired, &new_hbas(&m, &desired)) {
            m.run(&steps).expect("the plan runs");
            assert_eq!(
                plan_apply(&m.state, &desired, &none).expect("planned once, plans again"),
                Vec::new(),
                "a second plan after the revoking one ran"
            );
        }
    }
    let everything = Teardown {
        targets: present.state.targets.keys().cloned().collect(),
        storage_objects: present.state.storage_objects.keys().cloned().collect(),
    };
    let mut m = present.clone();
    let steps = plan_teardown(&m.state, &everything).expect("everything can go");
    m.run(&steps).expect("the teardown runs");
    assert_eq!(m.state, State::default(), "a teardown of everything");
    assert!(m.hbas.is_empty(), "HBA folders left: {:?}", m.hbas);
    let named = Teardown {
        targets: desired.targets.keys().cloned().collect(),
        storage_objects: desired.storage_objects.keys().cloned().collect(),
    };
    let mut m = present.clone();
    if let Ok(steps) = plan_teardown(&m.state, &named) {
        m.run(&steps).expect("the teardown runs");
        assert!(named
            .targets
            .iter()
            .all(|t| !m.state.targets.contains_key(t)));
        assert!(named
            .storage_objects
            .iter()
            .all(|n| !m.state.storage_objects.contains_key(n)));
    }
}

fuzz_target!(|input: Input| {
    match &input {
        Input::Nvmet { present, desired } => nvmet_properties(present, desired),
        Input::Lio { present, desired } => lio_properties(present, desired),
    }
});
