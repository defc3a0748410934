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
#[path = "plan_tests.rs"]
mod tests;
