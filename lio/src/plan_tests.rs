//! Tests of the plan functions (`plan.rs`).
use super::*;
use crate::model::{Chap, TpgAttributes};

fn iqn(s: &str) -> Iqn {
    Iqn::new(&format!("iqn.2026-01.org.example:{s}")).expect("valid test IQN")
}

fn so(s: &str) -> StorageObjectName {
    StorageObjectName::new(s).expect("valid test name")
}

/// One LUN of `dev`, admitted to `initiators` (or demo mode when none).
fn export(name: &str, dev: &str, initiators: &[&str]) -> State {
    let mut s = State::default();
    s.storage_objects.insert(
        so(name),
        StorageObject {
            udev_path: dev.into(),
            unit_serial: Some(format!("serial-{name}")),
            ..Default::default()
        },
    );
    let mut tpg = Tpg {
        enabled: true,
        attributes: if initiators.is_empty() {
            TpgAttributes::open()
        } else {
            TpgAttributes::default()
        },
        portals: ["127.0.0.1:3260".parse().expect("addr")].into(),
        ..Default::default()
    };
    tpg.luns.insert(Lun(0), TpgLun::new(so(name)));
    for i in initiators {
        let mut acl = Acl::default();
        acl.mapped_luns.insert(Lun(0), MappedLun::new(Lun(0)));
        tpg.acls.insert(iqn(i), acl);
    }
    let mut target = Target::default();
    target.tpgs.insert(Tpgt::new(1).expect("tpgt"), tpg);
    s.targets.insert(iqn(name), target);
    s
}

/// What the kernel holds after `desired` was applied with HBA `hba`.
fn as_present(desired: &State, hba: u32) -> State {
    let mut p = desired.clone();
    for so in p.storage_objects.values_mut() {
        so.hba = Some(hba);
        so.enabled = true;
    }
    for t in p.targets.values_mut() {
        for tpg in t.tpgs.values_mut() {
            for l in tpg.luns.values_mut() {
                l.link = Some(LUN_LINK.into());
            }
            for acl in tpg.acls.values_mut() {
                for m in acl.mapped_luns.values_mut() {
                    m.link = Some("f3a9c01b2e".into());
                }
            }
        }
    }
    p
}

fn position(steps: &[Step], f: impl Fn(&Step) -> bool) -> usize {
    steps.iter().position(f).unwrap_or(usize::MAX)
}

fn write_to(steps: &[Step], suffix: &str) -> usize {
    position(
        steps,
        |s| matches!(s, Step::Write { path, .. } if path.ends_with(suffix)),
    )
}

/// Found by the `plans` fuzz target: the kernel refuses a new unit
/// serial while a LUN exports the object, so the plan refuses it first
/// instead of failing half-way; an unexported object may change it.
#[test]
fn an_exported_unit_serial_change_is_refused_before_any_step() -> Result<(), Error> {
    let present = as_present(&export("v", "/dev/zd0", &[]), 3);
    let mut desired = export("v", "/dev/zd0", &[]);
    if let Some(o) = desired.storage_objects.get_mut(&so("v")) {
        o.unit_serial = Some("other".into());
    }
    let refused = plan_apply(&present, &desired, &BTreeMap::new());
    assert!(
        matches!(&refused, Err(Error::Conflict(m)) if m.contains("unit serial")),
        "{refused:?}"
    );
    let mut unexported = present.clone();
    unexported.targets.clear();
    desired.targets.clear();
    assert_eq!(
        plan_apply(&unexported, &desired, &BTreeMap::new())?,
        vec![Step::write("core/iblock_3/v/wwn/vpd_unit_serial", "other")]
    );
    Ok(())
}

#[test]
fn fresh_export_orders_device_serial_lun_acl_attributes_enable() -> Result<(), Error> {
    let desired = export("v", "/dev/zd0", &["h1"]);
    let hbas = [(so("v"), 3)].into();
    let steps = plan_apply(&State::default(), &desired, &hbas)?;
    let so_dir = "core/iblock_3/v";
    assert_eq!(
        &steps[..7],
        &[
            Step::mkdir("core/iblock_3"),
            Step::mkdir(so_dir),
            Step::write(format!("{so_dir}/control"), "udev_path=/dev/zd0"),
            Step::write(format!("{so_dir}/control"), "readonly=0"),
            Step::write(format!("{so_dir}/udev_path"), "/dev/zd0"),
            Step::write(format!("{so_dir}/enable"), "1"),
            Step::write(format!("{so_dir}/wwn/vpd_unit_serial"), "serial-v"),
        ]
    );
    let tpg = "iscsi/iqn.2026-01.org.example:v/tpgt_1";
    let lun_link = position(
        &steps,
        |s| matches!(s, Step::Symlink { target, link } if target == so_dir && link == &format!("{tpg}/lun/lun_0/storage")),
    );
    let acl = position(
        &steps,
        |s| matches!(s, Step::Mkdir(p) if p.contains("/acls/")),
    );
    let mapped = position(
        &steps,
        |s| matches!(s, Step::Symlink { target, link } if target == &format!("{tpg}/lun/lun_0") && link.ends_with("/lun_0/tpg_lun")),
    );
    let np = position(
        &steps,
        |s| matches!(s, Step::Mkdir(p) if p == &format!("{tpg}/np/127.0.0.1:3260")),
    );
    let auth = write_to(&steps, "attrib/authentication");
    let gen = write_to(&steps, "attrib/generate_node_acls");
    let enable = write_to(&steps, &format!("{tpg}/enable"));
    assert!(
        6 < lun_link
            && lun_link < mapped
            && acl < mapped
            && np < enable
            && auth < enable
            && gen < enable,
        "{steps:#?}"
    );
    assert_eq!(
        steps.last(),
        Some(&Step::write(format!("{tpg}/enable"), "1"))
    );
    Ok(())
}

#[test]
fn applying_the_present_state_changes_nothing() -> Result<(), Error> {
    let desired = export("v", "/dev/zd0", &["h1", "h2"]);
    let present = as_present(&desired, 0);
    assert_eq!(
        plan_apply(&present, &desired, &BTreeMap::new())?,
        Vec::new()
    );
    Ok(())
}

#[test]
fn half_made_lun_folders_are_linked_or_removed() -> Result<(), Error> {
    let desired = export("v", "/dev/zd0", &["h1"]);
    // The kernel after a crash between the mkdir and the symlink of the
    // TPG LUN and of the ACL's mapped LUN.
    let mut present = as_present(&desired, 0);
    let tpgt = Tpgt::new(1).expect("tpgt");
    if let Some(tpg) = present
        .targets
        .get_mut(&iqn("v"))
        .and_then(|t| t.tpgs.get_mut(&tpgt))
    {
        tpg.luns.clear();
        tpg.unlinked_luns.insert(Lun(0));
        for acl in tpg.acls.values_mut() {
            acl.mapped_luns.clear();
            acl.unlinked_mapped_luns.insert(Lun(0));
        }
    }
    let steps = plan_apply(&present, &desired, &BTreeMap::new())?;
    assert!(
        !steps.iter().any(|s| matches!(s, Step::Mkdir(_))),
        "an existing folder is made again: {steps:#?}"
    );
    assert_eq!(
        steps
            .iter()
            .filter(|s| matches!(s, Step::Symlink { .. }))
            .count(),
        2,
        "{steps:#?}"
    );
    let steps = plan_teardown(
        &present,
        &Teardown {
            targets: [iqn("v")].into(),
            storage_objects: [so("v")].into(),
        },
    )?;
    let rmdir = |suffix: &str| {
        position(
            &steps,
            |s| matches!(s, Step::Rmdir(p) if p.ends_with(suffix)),
        )
    };
    let (mapped, acl) = (
        rmdir("acls/iqn.2026-01.org.example:h1/lun_0"),
        rmdir("acls/iqn.2026-01.org.example:h1"),
    );
    let (lun, tpg) = (rmdir("lun/lun_0"), rmdir("tpgt_1"));
    assert!(mapped < acl && lun < tpg && tpg < usize::MAX, "{steps:#?}");
    Ok(())
}

#[test]
fn a_new_object_without_an_hba_index_is_refused() {
    let desired = export("v", "/dev/zd0", &[]);
    assert!(matches!(
        plan_apply(&State::default(), &desired, &BTreeMap::new()),
        Err(Error::Conflict(_))
    ));
}

#[test]
fn removing_an_acl_unlinks_its_mapped_luns_first() -> Result<(), Error> {
    let present = as_present(&export("v", "/dev/zd0", &["h1", "h2"]), 0);
    let steps = plan_apply(
        &present,
        &export("v", "/dev/zd0", &["h2"]),
        &BTreeMap::new(),
    )?;
    let acl = "iscsi/iqn.2026-01.org.example:v/tpgt_1/acls/iqn.2026-01.org.example:h1";
    assert_eq!(
        steps,
        vec![
            Step::unlink(format!("{acl}/lun_0/f3a9c01b2e")),
            Step::rmdir(format!("{acl}/lun_0")),
            Step::rmdir(acl),
        ]
    );
    Ok(())
}

#[test]
fn moving_a_lun_to_another_object_remaps_its_acls() -> Result<(), Error> {
    let mut desired = export("v", "/dev/zd0", &["h1"]);
    desired.storage_objects.insert(
        so("w"),
        StorageObject {
            udev_path: "/dev/zd16".into(),
            ..Default::default()
        },
    );
    let present = as_present(&desired, 0);
    let mut moved = desired.clone();
    for t in moved.targets.values_mut() {
        for tpg in t.tpgs.values_mut() {
            tpg.luns.insert(Lun(0), TpgLun::new(so("w")));
        }
    }
    let steps = plan_apply(&present, &moved, &BTreeMap::new())?;
    let tpg = "iscsi/iqn.2026-01.org.example:v/tpgt_1";
    let acl = format!("{tpg}/acls/iqn.2026-01.org.example:h1");
    assert_eq!(
        steps,
        vec![
            Step::unlink(format!("{acl}/lun_0/f3a9c01b2e")),
            Step::rmdir(format!("{acl}/lun_0")),
            Step::unlink(format!("{tpg}/lun/lun_0/storage")),
            Step::rmdir(format!("{tpg}/lun/lun_0")),
            Step::mkdir(format!("{tpg}/lun/lun_0")),
            Step::symlink("core/iblock_0/w", format!("{tpg}/lun/lun_0/storage")),
            Step::mkdir(format!("{acl}/lun_0")),
            Step::symlink(format!("{tpg}/lun/lun_0"), format!("{acl}/lun_0/tpg_lun")),
        ]
    );
    Ok(())
}

#[test]
fn attributes_and_chap_change_in_place_and_disable_comes_first() -> Result<(), Error> {
    let present = as_present(&export("v", "/dev/zd0", &["h1"]), 0);
    let mut desired = export("v", "/dev/zd0", &["h1"]);
    for t in desired.targets.values_mut() {
        for tpg in t.tpgs.values_mut() {
            tpg.enabled = false;
            tpg.attributes.authentication = true;
            for acl in tpg.acls.values_mut() {
                acl.chap = Some(Chap {
                    userid: "user".into(),
                    password: "secretsecret".into(),
                });
            }
        }
    }
    let tpg = "iscsi/iqn.2026-01.org.example:v/tpgt_1";
    let acl = format!("{tpg}/acls/iqn.2026-01.org.example:h1");
    assert_eq!(
        plan_apply(&present, &desired, &BTreeMap::new())?,
        vec![
            Step::write(format!("{tpg}/enable"), "0"),
            Step::write(format!("{acl}/auth/userid"), "user"),
            Step::write(format!("{acl}/auth/password"), "secretsecret"),
            Step::write(format!("{tpg}/attrib/authentication"), "1"),
        ]
    );
    Ok(())
}

#[test]
fn a_configured_object_cannot_change_device() {
    let present = as_present(&export("v", "/dev/zd0", &[]), 0);
    let desired = export("v", "/dev/zd16", &[]);
    assert!(matches!(
        plan_apply(&present, &desired, &BTreeMap::new()),
        Err(Error::Conflict(m)) if m.contains("/dev/zd0") && m.contains("/dev/zd16")
    ));
}

#[test]
fn a_half_made_object_is_configured_again() -> Result<(), Error> {
    let mut present = State::default();
    present.storage_objects.insert(
        so("v"),
        StorageObject {
            hba: Some(2),
            ..Default::default()
        },
    );
    let mut desired = State::default();
    desired.storage_objects.insert(
        so("v"),
        StorageObject {
            udev_path: "/dev/zd0".into(),
            readonly: true,
            ..Default::default()
        },
    );
    assert_eq!(
        plan_apply(&present, &desired, &BTreeMap::new())?,
        vec![
            Step::write("core/iblock_2/v/control", "udev_path=/dev/zd0"),
            Step::write("core/iblock_2/v/control", "readonly=1"),
            Step::write("core/iblock_2/v/udev_path", "/dev/zd0"),
            Step::write("core/iblock_2/v/enable", "1"),
        ]
    );
    Ok(())
}

#[test]
fn bad_values_are_refused_before_any_step() {
    let hbas: BTreeMap<_, _> = [(so("v"), 0)].into();
    for dev in ["relative", "/dev/a,readonly=1", "/dev/a b", "/dev/a\nb"] {
        let desired = export("v", dev, &[]);
        assert!(
            matches!(
                plan_apply(&State::default(), &desired, &hbas),
                Err(Error::InvalidValue { .. })
            ),
            "{dev:?}"
        );
    }
    let mut desired = export("v", "/dev/zd0", &["h1"]);
    for t in desired.targets.values_mut() {
        for tpg in t.tpgs.values_mut() {
            tpg.luns.clear();
        }
    }
    assert!(matches!(
        plan_apply(&State::default(), &desired, &hbas),
        Err(Error::Conflict(_))
    ));
    let mut desired = export("v", "/dev/zd0", &[]);
    desired.storage_objects.clear();
    assert!(matches!(
        plan_apply(&State::default(), &desired, &hbas),
        Err(Error::Conflict(_))
    ));
}

proptest::proptest! {
    #[test]
    fn every_step_of_any_accepted_name_stays_in_the_tree(
        so_name in "\\PC{1,40}",
        suffix in "[a-z0-9.:-]{1,40}",
        portal in proptest::prelude::any::<std::net::SocketAddr>(),
    ) {
        let Ok(name) = StorageObjectName::new(&so_name) else { return Ok(()); };
        let Ok(target) = Iqn::new(&format!("iqn.2026-01.org.example:{suffix}")) else { return Ok(()); };
        let mut desired = export("v", "/dev/zd0", &["h1"]);
        let t = desired.targets.remove(&iqn("v")).unwrap_or_default();
        desired.targets.insert(target.clone(), t);
        let so = desired.storage_objects.remove(&so("v")).unwrap_or_default();
        desired.storage_objects.insert(name.clone(), so);
        for t in desired.targets.values_mut() {
            for tpg in t.tpgs.values_mut() {
                tpg.luns.insert(Lun(0), TpgLun::new(name.clone()));
                tpg.portals.insert(portal);
            }
        }
        let hbas = [(name.clone(), 9)].into();
        let tree = configfs::Tree::at("/cfg");
        let mut all = plan_apply(&State::default(), &desired, &hbas)
            .map_err(|e| proptest::test_runner::TestCaseError::fail(e.to_string()))?;
        let present = as_present(&desired, 9);
        let t = Teardown { targets: [target].into(), storage_objects: [name].into() };
        all.extend(plan_teardown(&present, &t)
            .map_err(|e| proptest::test_runner::TestCaseError::fail(e.to_string()))?);
        for step in &all {
            let paths: Vec<&str> = match step {
                Step::Mkdir(p) | Step::Unlink(p) | Step::Rmdir(p) => vec![p.as_str()],
                Step::Write { path, .. } => vec![path.as_str()],
                Step::Symlink { target, link } => vec![target.as_str(), link.as_str()],
            };
            for p in paths {
                proptest::prop_assert!(tree.path(p).is_ok(), "{p:?} escapes");
            }
        }
    }
}

#[test]
fn teardown_runs_in_the_kernel_order() -> Result<(), Error> {
    let present = as_present(&export("v", "/dev/zd0", &["h1"]), 4);
    let t = Teardown {
        targets: [iqn("v")].into(),
        storage_objects: [so("v")].into(),
    };
    let tpg = "iscsi/iqn.2026-01.org.example:v/tpgt_1";
    let acl = format!("{tpg}/acls/iqn.2026-01.org.example:h1");
    assert_eq!(
        plan_teardown(&present, &t)?,
        vec![
            Step::write(format!("{tpg}/enable"), "0"),
            Step::unlink(format!("{acl}/lun_0/f3a9c01b2e")),
            Step::rmdir(format!("{acl}/lun_0")),
            Step::rmdir(acl.clone()),
            Step::unlink(format!("{tpg}/lun/lun_0/storage")),
            Step::rmdir(format!("{tpg}/lun/lun_0")),
            Step::rmdir(format!("{tpg}/np/127.0.0.1:3260")),
            Step::rmdir(tpg),
            Step::rmdir("iscsi/iqn.2026-01.org.example:v"),
            Step::rmdir("core/iblock_4/v"),
            Step::rmdir("core/iblock_4"),
        ]
    );
    let only_so = Teardown {
        storage_objects: [so("v")].into(),
        ..Default::default()
    };
    assert!(matches!(
        plan_teardown(&present, &only_so),
        Err(Error::Conflict(_))
    ));
    assert_eq!(plan_teardown(&State::default(), &t)?, Vec::new());
    Ok(())
}
