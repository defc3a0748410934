//! Each violation kind, found in a consistent node broken one way.
#![allow(clippy::unwrap_used)]
use super::*;
use crate::{
    fence::{Call, Token},
    marks::{encode, ExportRecord, MARK_VERSION},
    service::sim::fixture,
};

const A: &str = "tank/a";
const B: &str = "tank/b";
const HOST: &str = "nqn.2026-01.org.example:host";
const INITIATOR: &str = "iqn.2003-01.org.example:init";

fn mark(id: &str, device_guid: &str, protocol: &str, initiator: &str) -> FenceMark {
    let mut m = FenceMark::new(id);
    let token = Token {
        volume_uid: format!("uid-{id}"),
        generation: 1,
    };
    m.fence = m.fence.admit(id, Some(&token), Call::Other).unwrap().0;
    m.backend = Some(BackendRecord::Zvol {
        dataset: format!("tank/k8s/{}", &id[5..]),
        guid: Some(device_guid.into()),
    });
    m.exports.insert(
        protocol.into(),
        ExportRecord {
            acl: true,
            allowed_initiators: [initiator.to_owned()].into(),
            chap: None,
            target: None,
        },
    );
    m
}

fn file(m: &FenceMark) -> (String, Vec<u8>) {
    (
        format!("{}{SUFFIX}", encode(&m.volume_id)),
        serde_json::to_vec_pretty(m).unwrap(),
    )
}

fn nqn(id: &str) -> nvmet::Nqn {
    NvmetExporter::nqn_of(&VolumeId::parse(id).unwrap(), &ExportRecord::default()).unwrap()
}

fn lio_names(id: &str) -> (lio::Iqn, lio::StorageObjectName) {
    let vid = VolumeId::parse(id).unwrap();
    (
        LioExporter::iqn_of(&vid, &ExportRecord::default()).unwrap(),
        LioExporter::object(&vid).unwrap(),
    )
}

/// Volume A exported over NVMe/TCP to HOST, volume B over iSCSI to
/// INITIATOR: everything in place.
fn consistent() -> Observed {
    let mut seen = Observed {
        files: vec![
            file(&mark(A, "1", "nvmeof-tcp", HOST)),
            file(&mark(B, "2", "iscsi", INITIATOR)),
        ],
        volumes: vec![
            ListedVolume {
                name: "tank/k8s/a".into(),
                device: "/dev/zd0".into(),
            },
            ListedVolume {
                name: "tank/k8s/b".into(),
                device: "/dev/zd16".into(),
            },
        ],
        agent_port: Some(nvmet::PortId(1)),
        lio_hbas: [0].into(),
        reconciled: true,
        ..Default::default()
    };
    seen.resolved
        .insert("/dev/zvol/tank/k8s/a".into(), "/dev/zd0".into());
    let host = nvmet::Nqn::new(HOST).unwrap();
    let mut sub = nvmet::Subsystem {
        allowed_hosts: [host.clone()].into(),
        ..Default::default()
    };
    sub.namespaces.insert(
        nvmet::Nsid::new(1).unwrap(),
        nvmet::Namespace {
            device_path: "/dev/zvol/tank/k8s/a".into(),
            enabled: true,
            ..Default::default()
        },
    );
    seen.nvmet.subsystems.insert(nqn(A), sub);
    let mut port = nvmet::Port::tcp("127.0.0.1:4420".parse().unwrap());
    port.subsystems.insert(nqn(A));
    seen.nvmet.ports.insert(nvmet::PortId(1), port);
    seen.nvmet.hosts.insert(host);
    let (iqn, object) = lio_names(B);
    seen.lio.storage_objects.insert(
        object.clone(),
        lio::StorageObject {
            udev_path: "/dev/zd16".into(),
            hba: Some(0),
            enabled: true,
            ..Default::default()
        },
    );
    let mut tpg = lio::Tpg::default();
    tpg.luns
        .insert(lio::Lun(0), lio::TpgLun::new(object.clone()));
    tpg.acls
        .insert(lio::Iqn::new(INITIATOR).unwrap(), lio::Acl::default());
    let mut target = lio::Target::default();
    target.tpgs.insert(lio::Tpgt::new(1).unwrap(), tpg);
    seen.lio.targets.insert(iqn, target);
    seen
}

/// `check` of `seen` after `change` finds exactly `expected`.
fn finds(change: impl FnOnce(&mut Observed), expected: Vec<Violation>) {
    let mut seen = consistent();
    change(&mut seen);
    assert_eq!(check(&seen), expected);
}

#[test]
fn a_consistent_node_has_no_violation() {
    assert_eq!(check(&consistent()), vec![]);
}

#[test]
fn a_mark_that_does_not_parse() {
    let mut seen = consistent();
    seen.files[0].1 = b"{ not json".to_vec();
    let found = check(&seen);
    assert!(
        matches!(&found[0], Violation::CorruptMark { file, .. } if *file == s_file(A)),
        "{found:?}"
    );
    // Its volume is unrecorded and its export too, since the mark is unreadable.
    assert_eq!(
        found[1..],
        [
            Violation::UnrecordedVolume("tank/k8s/a".into()),
            Violation::UnrecordedExport(nqn(A).to_string()),
        ]
    );
    finds(
        |s| s.files.push((".tank%2Fa.mark.json.1.0.tmp".into(), vec![])),
        vec![Violation::CorruptMark {
            file: ".tank%2Fa.mark.json.1.0.tmp".into(),
            why: "not a mark file name".into(),
        }],
    );
    // A mark recording another volume than its file name says.
    finds(
        |s| s.files[0].0 = s_file("tank/z"),
        vec![
            Violation::CorruptMark {
                file: s_file("tank/z"),
                why: format!(
                    "records volume {A:?} in format {MARK_VERSION}, expected \"tank/z\" in format {MARK_VERSION}"
                ),
            },
            Violation::UnrecordedVolume("tank/k8s/a".into()),
            Violation::UnrecordedExport(nqn(A).to_string()),
        ],
    );
}

fn s_file(id: &str) -> String {
    format!("{}{SUFFIX}", encode(id))
}

#[test]
fn a_volume_without_a_mark_and_a_mark_without_its_volume() {
    finds(
        |s| {
            s.volumes.push(ListedVolume {
                name: "tank/k8s/stray".into(),
                device: "/dev/zd32".into(),
            })
        },
        vec![Violation::UnrecordedVolume("tank/k8s/stray".into())],
    );
    finds(
        |s| {
            s.volumes.remove(1);
            s.lio = Default::default();
            s.lio_hbas.clear();
            s.reconciled = false;
        },
        vec![Violation::MissingVolume {
            volume: B.into(),
            backend: "tank/k8s/b".into(),
        }],
    );
    // A recorded intent (no identity pinned yet) without its volume is fine.
    finds(
        |s| {
            let mut intent = FenceMark::new("tank/c");
            intent.backend = Some(BackendRecord::Zvol {
                dataset: "tank/k8s/c".into(),
                guid: None,
            });
            s.files.push(file(&intent));
        },
        vec![],
    );
}

#[test]
fn two_marks_on_one_volume_and_two_exports_on_one_device() {
    finds(
        |s| {
            let mut m = mark("tank/c", "3", "nvmeof-tcp", HOST);
            m.backend = Some(BackendRecord::Zvol {
                dataset: "tank/k8s/a".into(),
                guid: Some("1".into()),
            });
            m.exports.clear();
            s.files.push(file(&m));
        },
        vec![Violation::SharedVolume {
            backend: "tank/k8s/a".into(),
            volumes: vec![A.into(), "tank/c".into()],
        }],
    );
    finds(
        |s| {
            s.resolved
                .insert("/dev/zvol/tank/k8s/a".into(), "/dev/zd16".into());
        },
        vec![
            Violation::WrongDevice {
                export: nqn(A).to_string(),
                serves: "/dev/zd16".into(),
                expected: "/dev/zd0".into(),
            },
            Violation::SharedDevice {
                device: "/dev/zd16".into(),
                exports: vec![A.into(), B.into()],
            },
        ],
    );
}

#[test]
fn a_wrong_device_behind_a_lun() {
    let (_, object) = lio_names(B);
    finds(
        |s| s.lio.storage_objects.get_mut(&object).unwrap().udev_path = "/dev/zd48".into(),
        vec![Violation::WrongDevice {
            export: object.to_string(),
            serves: "/dev/zd48".into(),
            expected: "/dev/zd16".into(),
        }],
    );
}

#[test]
fn exports_unrecorded_missing_or_different() {
    let (iqn, object) = lio_names(B);
    // B's mark gone (and its volume released from the listing): its
    // export is no mark's.
    finds(
        |s| {
            s.files.remove(1);
            s.volumes.remove(1);
        },
        vec![
            Violation::UnrecordedExport(iqn.to_string()),
            Violation::UnrecordedExport(object.to_string()),
        ],
    );
    // The export is gone: missing once reconciled, tolerated before.
    finds(
        |s| {
            s.nvmet.subsystems.clear();
            s.nvmet
                .ports
                .get_mut(&nvmet::PortId(1))
                .unwrap()
                .subsystems
                .clear();
            s.nvmet.hosts.clear();
        },
        vec![Violation::MissingExport {
            volume: A.into(),
            protocol: "nvmeof-tcp".into(),
        }],
    );
    finds(
        |s| {
            s.lio = Default::default();
            s.lio_hbas.clear();
            s.reconciled = false;
        },
        vec![],
    );
    finds(
        |s| {
            s.nvmet
                .subsystems
                .get_mut(&nqn(A))
                .unwrap()
                .allowed_hosts
                .clear();
        },
        vec![
            Violation::ExportDiffers {
                volume: A.into(),
                why: format!(
                    "nvmet allows any host: false, hosts {{}}; recorded ACL true, {{\"{HOST}\"}}"
                ),
            },
            Violation::OrphanHost(HOST.into()),
        ],
    );
}

#[test]
fn orphaned_ports_subsystems_hosts_hbas_and_backstores() {
    let (iqn, object) = lio_names(B);
    finds(
        |s| {
            s.nvmet.ports.insert(
                nvmet::PortId(7),
                nvmet::Port::tcp("127.0.0.1:4421".parse().unwrap()),
            );
            // The agent's own port may stay empty.
            s.nvmet
                .ports
                .get_mut(&nvmet::PortId(1))
                .unwrap()
                .subsystems
                .clear();
        },
        vec![
            Violation::OrphanPort(7),
            Violation::OrphanSubsystem(nqn(A).to_string()),
        ],
    );
    finds(
        |s| {
            s.nvmet
                .hosts
                .insert(nvmet::Nqn::new("nqn.2026-01.org.example:gone").unwrap());
        },
        vec![Violation::OrphanHost("nqn.2026-01.org.example:gone".into())],
    );
    finds(
        |s| {
            s.lio_hbas.insert(3);
        },
        vec![Violation::OrphanHba(3)],
    );
    finds(
        |s| {
            s.lio.targets.remove(&iqn);
        },
        vec![
            Violation::MissingExport {
                volume: B.into(),
                protocol: "iscsi".into(),
            },
            Violation::OrphanBackstore(object.to_string()),
        ],
    );
}

/// The simulator's agent leaves marks the checker reads as consistent: a
/// created and exported volume, then deleted, leaves no violation.
#[tokio::test]
async fn marks_written_by_the_agent_read_back_consistent() {
    let f = fixture();
    let token = crate::service::sim::tok("u", 1);
    f.agent
        .create_volume("tank/v", None, 10, Default::default(), token.as_ref())
        .await
        .unwrap();
    let read = |f: &crate::service::sim::Fixture| -> Vec<(String, Vec<u8>)> {
        std::fs::read_dir(f.agent.marks().dir())
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.file_name().to_string_lossy().into_owned(),
                    std::fs::read(e.path()).unwrap(),
                )
            })
            .collect()
    };
    let listed = vec![ListedVolume {
        name: "tank/k8s/v".into(),
        device: "/dev/zd0".into(),
    }];
    let seen = Observed {
        files: read(&f),
        volumes: listed.clone(),
        reconciled: true,
        ..Default::default()
    };
    assert_eq!(check(&seen), vec![]);
    // Without its volume the mark (the simulator pins no GUID) is an intent.
    let bare = Observed {
        volumes: vec![],
        ..seen.clone()
    };
    assert_eq!(check(&bare), vec![]);
    f.agent
        .delete_volume("tank/v", None, token.as_ref())
        .await
        .unwrap();
    // The volume is gone and its mark records no backend any more: a stray
    // volume left behind would be found.
    let seen = Observed {
        files: read(&f),
        volumes: listed,
        ..Default::default()
    };
    assert_eq!(
        check(&seen),
        vec![Violation::UnrecordedVolume("tank/k8s/v".into())]
    );
}
