//! The difference between a present and a desired state, as ordered configfs steps.
//!
//! The order follows the kernel's rules: a storage object gets its device
//! (`control` and the `udev_path` attribute), then `enable`, then its unit
//! serial, all before a LUN links it (the serial cannot change while it is
//! exported); a TPG's attributes are written before it is enabled (enabling
//! fixes the login's AuthMethod); mapped LUNs go before the LUNs they show,
//! LUNs before the storage objects they serve; a TPG is disabled before
//! anything under it is removed.
use crate::{
    error::Error,
    model::{Acl, MappedLun, State, StorageObject, Target, Teardown, Tpg, TpgLun},
    names::{portal_dir, Iqn, Lun, StorageObjectName, Tpgt},
};
use configfs::Step;
use std::collections::{BTreeMap, BTreeSet};

/// The name of the link this crate makes in a LUN folder.
pub(crate) const LUN_LINK: &str = "storage";
/// The name of the link this crate makes in a mapped LUN folder.
pub(crate) const MAPPED_LUN_LINK: &str = "tpg_lun";
/// The longest udev_path the kernel stores (`SE_UDEV_PATH_LEN`).
const UDEV_PATH_MAX: usize = 511;

pub(crate) fn hba_dir(hba: u32) -> String {
    format!("core/iblock_{hba}")
}

pub(crate) fn so_dir(hba: u32, name: &StorageObjectName) -> String {
    format!("core/iblock_{hba}/{name}")
}

pub(crate) fn target_dir(iqn: &Iqn) -> String {
    format!("iscsi/{iqn}")
}

pub(crate) fn tpg_dir(iqn: &Iqn, tpgt: Tpgt) -> String {
    format!("iscsi/{iqn}/tpgt_{tpgt}")
}

/// The steps that turn `present` into `desired` for the objects `desired`
/// names. `new_hbas` gives the HBA index for each desired storage object
/// that is not present yet (see [`Lio::apply`](crate::Lio::apply), which
/// allocates them under the backstore lock); a missing one is an error.
pub fn plan_apply(
    present: &State,
    desired: &State,
    new_hbas: &BTreeMap<StorageObjectName, u32>,
) -> Result<Vec<Step>, Error> {
    validate(present, desired)?;
    let mut steps = Vec::new();
    for (name, want) in &desired.storage_objects {
        plan_storage_object(
            name,
            present.storage_objects.get(name),
            want,
            new_hbas,
            &mut steps,
        )?;
    }
    let hba_of = |name: &StorageObjectName| -> Result<u32, Error> {
        present
            .storage_objects
            .get(name)
            .and_then(|so| so.hba)
            .or_else(|| new_hbas.get(name).copied())
            .ok_or_else(|| Error::Conflict(format!("storage object {name} has no HBA index")))
    };
    for (iqn, want) in &desired.targets {
        let have = present.targets.get(iqn);
        if have.is_none() {
            steps.push(Step::mkdir(target_dir(iqn)));
        }
        let empty = Target::default();
        let have = have.unwrap_or(&empty);
        for (tpgt, tpg) in &have.tpgs {
            if !want.tpgs.contains_key(tpgt) {
                remove_tpg(iqn, *tpgt, tpg, &mut steps);
            }
        }
        for (tpgt, tpg) in &want.tpgs {
            plan_tpg(iqn, *tpgt, have.tpgs.get(tpgt), tpg, &hba_of, &mut steps)?;
        }
    }
    Ok(steps)
}

fn plan_storage_object(
    name: &StorageObjectName,
    have: Option<&StorageObject>,
    want: &StorageObject,
    new_hbas: &BTreeMap<StorageObjectName, u32>,
    steps: &mut Vec<Step>,
) -> Result<(), Error> {
    let (dir, have) = match have {
        Some(h) => {
            let hba = h.hba.ok_or_else(|| {
                Error::Conflict(format!("present storage object {name} has no HBA index"))
            })?;
            (so_dir(hba, name), Some(h))
        }
        None => {
            let hba = *new_hbas.get(name).ok_or_else(|| {
                Error::Conflict(format!(
                    "no HBA index was allocated for new storage object {name}"
                ))
            })?;
            steps.push(Step::mkdir(hba_dir(hba)));
            steps.push(Step::mkdir(so_dir(hba, name)));
            (so_dir(hba, name), None)
        }
    };
    let path = want.udev_path.to_string_lossy();
    let configured = have.is_some_and(|h| !h.udev_path.as_os_str().is_empty() || h.enabled);
    if let Some(h) = have.filter(|_| configured) {
        if h.udev_path != want.udev_path || h.readonly != want.readonly {
            return Err(Error::Conflict(format!(
                "storage object {name} serves {} (readonly {}), not {} (readonly {}): the kernel cannot change the device of a configured storage object; tear it down first",
                h.udev_path.display(),
                h.readonly,
                want.udev_path.display(),
                want.readonly
            )));
        }
    } else {
        // rtslib-fb reads the separate udev_path attribute; the kernel opens
        // the device named in control. Both are written, as rtslib does.
        steps.push(Step::write(
            format!("{dir}/control"),
            format!("udev_path={path}"),
        ));
        steps.push(Step::write(
            format!("{dir}/control"),
            format!("readonly={}", u8::from(want.readonly)),
        ));
        steps.push(Step::write(format!("{dir}/udev_path"), path.as_ref()));
    }
    if !have.is_some_and(|h| h.enabled) {
        steps.push(Step::write(format!("{dir}/enable"), "1"));
    }
    if let Some(serial) = &want.unit_serial {
        if have.and_then(|h| h.unit_serial.as_ref()) != Some(serial) {
            steps.push(Step::write(
                format!("{dir}/wwn/vpd_unit_serial"),
                serial.as_str(),
            ));
        }
    }
    Ok(())
}

fn plan_tpg(
    iqn: &Iqn,
    tpgt: Tpgt,
    have: Option<&Tpg>,
    want: &Tpg,
    hba_of: &dyn Fn(&StorageObjectName) -> Result<u32, Error>,
    steps: &mut Vec<Step>,
) -> Result<(), Error> {
    let dir = tpg_dir(iqn, tpgt);
    let fresh = have.is_none();
    let empty = Tpg::default();
    if fresh {
        steps.push(Step::mkdir(&dir));
    }
    let have = have.unwrap_or(&empty);
    if have.enabled && !want.enabled {
        steps.push(Step::write(format!("{dir}/enable"), "0"));
    }
    // A LUN is re-made when it is removed or serves another object; the
    // mapped LUNs that show it go first.
    let remade: BTreeSet<Lun> = have
        .luns
        .iter()
        .filter(|(lun, l)| {
            want.luns
                .get(lun)
                .is_none_or(|w| w.storage_object != l.storage_object)
        })
        .map(|(lun, _)| *lun)
        .collect();
    for (initiator, acl) in &have.acls {
        let acl_dir = format!("{dir}/acls/{initiator}");
        match want.acls.get(initiator) {
            None => remove_acl(&acl_dir, acl, steps),
            Some(w) => {
                for (mapped, m) in &acl.mapped_luns {
                    let keep = w
                        .mapped_luns
                        .get(mapped)
                        .is_some_and(|wm| wm.tpg_lun == m.tpg_lun && !remade.contains(&m.tpg_lun));
                    if !keep {
                        remove_mapped_lun(&acl_dir, *mapped, m, steps);
                    }
                }
                for mapped in &acl.unlinked_mapped_luns {
                    if !w.mapped_luns.contains_key(mapped) {
                        steps.push(Step::rmdir(format!("{acl_dir}/{}", mapped.dir())));
                    }
                }
            }
        }
    }
    for lun in &remade {
        if let Some(l) = have.luns.get(lun) {
            remove_lun(&dir, *lun, l, steps);
        }
    }
    for lun in have
        .unlinked_luns
        .difference(&want.luns.keys().copied().collect())
    {
        steps.push(Step::rmdir(format!("{dir}/lun/{}", lun.dir())));
    }
    for (lun, l) in &want.luns {
        if have.luns.contains_key(lun) && !remade.contains(lun) {
            continue;
        }
        let lun_dir = format!("{dir}/lun/{}", lun.dir());
        if !have.unlinked_luns.contains(lun) {
            steps.push(Step::mkdir(&lun_dir));
        }
        steps.push(Step::symlink(
            so_dir(hba_of(&l.storage_object)?, &l.storage_object),
            format!("{lun_dir}/{LUN_LINK}"),
        ));
    }
    for portal in have.portals.difference(&want.portals) {
        steps.push(Step::rmdir(format!("{dir}/np/{}", portal_dir(portal))));
    }
    for portal in want.portals.difference(&have.portals) {
        steps.push(Step::mkdir(format!("{dir}/np/{}", portal_dir(portal))));
    }
    for (initiator, acl) in &want.acls {
        let acl_dir = format!("{dir}/acls/{initiator}");
        let have_acl = have.acls.get(initiator);
        if have_acl.is_none() {
            steps.push(Step::mkdir(&acl_dir));
        }
        if let Some(chap) = &acl.chap {
            let present = have_acl.and_then(|a| a.chap.as_ref());
            if present.map(|c| &c.userid) != Some(&chap.userid) {
                steps.push(Step::write(
                    format!("{acl_dir}/auth/userid"),
                    chap.userid.as_str(),
                ));
            }
            if present.map(|c| &c.password) != Some(&chap.password) {
                steps.push(Step::write(
                    format!("{acl_dir}/auth/password"),
                    chap.password.as_str(),
                ));
            }
        }
        for (mapped, m) in &acl.mapped_luns {
            let kept = have_acl
                .and_then(|a| a.mapped_luns.get(mapped))
                .filter(|hm| hm.tpg_lun == m.tpg_lun && !remade.contains(&m.tpg_lun));
            let m_dir = format!("{acl_dir}/{}", mapped.dir());
            match kept {
                Some(hm) => {
                    if hm.write_protect != m.write_protect {
                        steps.push(Step::write(
                            format!("{m_dir}/write_protect"),
                            if m.write_protect { "1" } else { "0" },
                        ));
                    }
                }
                None => {
                    let half_made =
                        have_acl.is_some_and(|a| a.unlinked_mapped_luns.contains(mapped));
                    if !half_made {
                        steps.push(Step::mkdir(&m_dir));
                    }
                    steps.push(Step::symlink(
                        format!("{dir}/lun/{}", m.tpg_lun.dir()),
                        format!("{m_dir}/{MAPPED_LUN_LINK}"),
                    ));
                    // The kernel maps an explicit mapped LUN writable.
                    if m.write_protect {
                        steps.push(Step::write(format!("{m_dir}/write_protect"), "1"));
                    }
                }
            }
        }
    }
    for ((attr, wanted), (_, present)) in want
        .attributes
        .entries()
        .iter()
        .zip(have.attributes.entries())
    {
        // A fresh TPG has the kernel's defaults, which are not ours: write all.
        if fresh || *wanted != present {
            steps.push(Step::write(
                format!("{dir}/attrib/{attr}"),
                if *wanted { "1" } else { "0" },
            ));
        }
    }
    if want.enabled && !have.enabled {
        steps.push(Step::write(format!("{dir}/enable"), "1"));
    }
    Ok(())
}

fn remove_mapped_lun(acl_dir: &str, mapped: Lun, m: &MappedLun, steps: &mut Vec<Step>) {
    let m_dir = format!("{acl_dir}/{}", mapped.dir());
    if let Some(link) = &m.link {
        steps.push(Step::unlink(format!("{m_dir}/{link}")));
    }
    steps.push(Step::rmdir(m_dir));
}

fn remove_acl(acl_dir: &str, acl: &Acl, steps: &mut Vec<Step>) {
    for (mapped, m) in &acl.mapped_luns {
        remove_mapped_lun(acl_dir, *mapped, m, steps);
    }
    for mapped in &acl.unlinked_mapped_luns {
        steps.push(Step::rmdir(format!("{acl_dir}/{}", mapped.dir())));
    }
    steps.push(Step::rmdir(acl_dir));
}

fn remove_lun(dir: &str, lun: Lun, l: &TpgLun, steps: &mut Vec<Step>) {
    let lun_dir = format!("{dir}/lun/{}", lun.dir());
    if let Some(link) = &l.link {
        steps.push(Step::unlink(format!("{lun_dir}/{link}")));
    }
    steps.push(Step::rmdir(lun_dir));
}

fn remove_tpg(iqn: &Iqn, tpgt: Tpgt, tpg: &Tpg, steps: &mut Vec<Step>) {
    let dir = tpg_dir(iqn, tpgt);
    if tpg.enabled {
        steps.push(Step::write(format!("{dir}/enable"), "0"));
    }
    for (initiator, acl) in &tpg.acls {
        remove_acl(&format!("{dir}/acls/{initiator}"), acl, steps);
    }
    for (lun, l) in &tpg.luns {
        remove_lun(&dir, *lun, l, steps);
    }
    for lun in &tpg.unlinked_luns {
        steps.push(Step::rmdir(format!("{dir}/lun/{}", lun.dir())));
    }
    for portal in &tpg.portals {
        steps.push(Step::rmdir(format!("{dir}/np/{}", portal_dir(portal))));
    }
    steps.push(Step::rmdir(dir));
}

/// The steps that remove the objects `teardown` names, in the kernel's
/// order: per TPG, disable, mapped LUNs, ACLs, LUNs, portals, the TPG; then
/// the target; then the storage objects (and their HBA folders once empty).
pub fn plan_teardown(present: &State, teardown: &Teardown) -> Result<Vec<Step>, Error> {
    for name in &teardown.storage_objects {
        for (iqn, target) in &present.targets {
            if teardown.targets.contains(iqn) {
                continue;
            }
            for (tpgt, tpg) in &target.tpgs {
                if let Some((lun, _)) = tpg.luns.iter().find(|(_, l)| &l.storage_object == name) {
                    return Err(Error::Conflict(format!(
                        "storage object {name} is still served by LUN {lun} of {iqn} TPG {tpgt}"
                    )));
                }
            }
        }
    }
    let mut steps = Vec::new();
    for iqn in &teardown.targets {
        let Some(target) = present.targets.get(iqn) else {
            continue;
        };
        for (tpgt, tpg) in &target.tpgs {
            remove_tpg(iqn, *tpgt, tpg, &mut steps);
        }
        steps.push(Step::rmdir(target_dir(iqn)));
    }
    let mut emptied: BTreeMap<u32, usize> = BTreeMap::new();
    for so in present.storage_objects.values() {
        if let Some(hba) = so.hba {
            *emptied.entry(hba).or_default() += 1;
        }
    }
    for name in &teardown.storage_objects {
        let Some(so) = present.storage_objects.get(name) else {
            continue;
        };
        let Some(hba) = so.hba else {
            continue;
        };
        steps.push(Step::rmdir(so_dir(hba, name)));
        let left = emptied.entry(hba).or_default();
        *left = left.saturating_sub(1);
        if *left == 0 {
            steps.push(Step::rmdir(hba_dir(hba)));
        }
    }
    Ok(steps)
}

fn text_ok(v: &str, max: usize, allow_space: bool) -> bool {
    !v.is_empty()
        && v.len() <= max
        && v.bytes()
            .all(|b| b.is_ascii_graphic() || (allow_space && b == b' '))
}

/// The first LUN of `present` serving storage object `name`, for messages.
fn exported_by(present: &State, name: &StorageObjectName) -> Option<String> {
    present.targets.iter().find_map(|(iqn, target)| {
        target.tpgs.iter().find_map(|(tpgt, tpg)| {
            tpg.luns
                .iter()
                .find(|(_, l)| &l.storage_object == name)
                .map(|(lun, _)| format!("LUN {lun} of {iqn} TPG {tpgt}"))
        })
    })
}

/// Refuses a desired state the kernel cannot hold, before any step.
fn validate(present: &State, desired: &State) -> Result<(), Error> {
    for (name, so) in &desired.storage_objects {
        let path = so.udev_path.to_string_lossy();
        if !so.udev_path.is_absolute()
            || path.len() > UDEV_PATH_MAX
            || !text_ok(&path, UDEV_PATH_MAX, false)
            || path.contains(',')
        {
            return Err(Error::InvalidValue {
                what: format!("udev_path of storage object {name}"),
                why: format!(
                    "{path:?} must be an absolute path of at most {UDEV_PATH_MAX} printable ASCII characters without spaces or commas (the kernel splits control options on them)"
                ),
            });
        }
        if let Some(serial) = &so.unit_serial {
            if !text_ok(serial, 253, false) {
                return Err(Error::InvalidValue {
                    what: format!("unit serial of storage object {name}"),
                    why: format!(
                        "{serial:?} must be 1 to 253 printable ASCII characters without spaces"
                    ),
                });
            }
            // The kernel refuses the write while a LUN exports the object,
            // and storage objects are planned before any LUN is removed:
            // refuse before a step rather than fail half-way.
            let changes = present
                .storage_objects
                .get(name)
                .is_some_and(|have| have.unit_serial.as_ref() != Some(serial));
            if let Some(lun) = exported_by(present, name).filter(|_| changes) {
                return Err(Error::Conflict(format!(
                    "storage object {name} is exported by {lun}; its unit serial cannot change while it is exported (tear its LUNs down first)"
                )));
            }
        }
    }
    for (iqn, target) in &desired.targets {
        for (tpgt, tpg) in &target.tpgs {
            for (lun, l) in &tpg.luns {
                let known = desired.storage_objects.contains_key(&l.storage_object)
                    || present.storage_objects.contains_key(&l.storage_object);
                if !known {
                    return Err(Error::Conflict(format!(
                        "LUN {lun} of {iqn} TPG {tpgt} serves storage object {}, which neither exists nor is desired",
                        l.storage_object
                    )));
                }
            }
            for (initiator, acl) in &tpg.acls {
                for (mapped, m) in &acl.mapped_luns {
                    if !tpg.luns.contains_key(&m.tpg_lun) {
                        return Err(Error::Conflict(format!(
                            "mapped LUN {mapped} of ACL {initiator} in {iqn} TPG {tpgt} shows LUN {}, which the TPG does not have",
                            m.tpg_lun
                        )));
                    }
                }
                if let Some(chap) = &acl.chap {
                    if !text_ok(&chap.userid, 255, false) || !text_ok(&chap.password, 255, false) {
                        return Err(Error::InvalidValue {
                            what: format!("CHAP credentials of ACL {initiator} in {iqn} TPG {tpgt}"),
                            why: "user ID and password must be 1 to 255 printable ASCII characters without spaces".into(),
                        });
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
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
}
