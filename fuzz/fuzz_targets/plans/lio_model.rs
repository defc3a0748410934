//! An in-memory LIO configfs: applies the steps of a plan to a
//! [`lio::State`] as the kernel would, refusing what the kernel refuses
//! (a folder made twice, or removed while it holds folders or links or is
//! linked to; a storage object's device set after `enable`, or exported
//! before it; a unit serial changed while exported; a mapped LUN linked to
//! a LUN folder without a storage object; a link where none is expected).
//! A new TPG has the kernel's attributes (`authentication=1`), not the
//! crate's defaults. Test scaffolding for the `plans` target, like
//! [`super::nvmet_model`]; no such model existed.
use lio::{Acl, Chap, Iqn, Lun, MappedLun, State, Step, StorageObject, StorageObjectName, Target};
use lio::{Tpg, TpgAttributes, TpgLun, Tpgt};
use std::collections::{BTreeMap, BTreeSet};

/// The state, the HBA folders, and each storage object's `control` device.
#[derive(Debug, Clone, Default)]
pub struct Model {
    pub state: State,
    pub hbas: BTreeSet<u32>,
    control: BTreeMap<StorageObjectName, String>,
}

fn iqn(s: &str) -> Result<Iqn, String> {
    Iqn::new(s).map_err(|e| e.to_string())
}

fn so_name(s: &str) -> Result<StorageObjectName, String> {
    StorageObjectName::new(s).map_err(|e| e.to_string())
}

fn hba(s: &str) -> Result<u32, String> {
    s.strip_prefix("iblock_")
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| format!("{s:?} is not an iblock HBA"))
}

fn tpgt(s: &str) -> Result<Tpgt, String> {
    s.strip_prefix("tpgt_")
        .and_then(|n| n.parse().ok())
        .and_then(|n| Tpgt::new(n).ok())
        .ok_or_else(|| format!("{s:?} is not a TPG"))
}

fn lun(s: &str) -> Result<Lun, String> {
    s.strip_prefix("lun_")
        .and_then(|n| n.parse().ok())
        .map(Lun)
        .ok_or_else(|| format!("{s:?} is not a LUN"))
}

fn flag(v: &str) -> Result<bool, String> {
    match v {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => Err(format!("{v:?} is not 0 or 1")),
    }
}

/// The kernel's attributes of a new TPG.
fn kernel_defaults() -> TpgAttributes {
    TpgAttributes {
        authentication: true,
        generate_node_acls: false,
        demo_mode_write_protect: true,
        cache_dynamic_acls: false,
    }
}

impl Model {
    /// Runs `steps` in order; the first refusal stops them.
    pub fn run(&mut self, steps: &[Step]) -> Result<(), String> {
        for step in steps {
            self.step(step).map_err(|e| format!("{step:?}: {e}"))?;
        }
        Ok(())
    }

    fn exported(&self, name: &StorageObjectName) -> bool {
        self.state
            .targets
            .values()
            .flat_map(|t| t.tpgs.values())
            .flat_map(|t| t.luns.values())
            .any(|l| &l.storage_object == name)
    }

    fn so(&mut self, h: &str, name: &str) -> Result<&mut StorageObject, String> {
        let (h, name) = (hba(h)?, so_name(name)?);
        self.state
            .storage_objects
            .get_mut(&name)
            .filter(|so| so.hba == Some(h))
            .ok_or_else(|| "no such storage object".into())
    }

    fn target(&mut self, name: &str) -> Result<&mut Target, String> {
        let name = iqn(name)?;
        self.state
            .targets
            .get_mut(&name)
            .ok_or_else(|| "no such target".into())
    }

    fn tpg(&mut self, t: &str, tag: &str) -> Result<&mut Tpg, String> {
        let tag = tpgt(tag)?;
        self.target(t)?
            .tpgs
            .get_mut(&tag)
            .ok_or_else(|| "no such TPG".into())
    }

    fn acl(&mut self, t: &str, tag: &str, i: &str) -> Result<&mut Acl, String> {
        let i = iqn(i)?;
        self.tpg(t, tag)?
            .acls
            .get_mut(&i)
            .ok_or_else(|| "no such ACL".into())
    }

    fn step(&mut self, step: &Step) -> Result<(), String> {
        match step {
            Step::Mkdir(path) => self.mkdir(&path.split('/').collect::<Vec<_>>()),
            Step::Rmdir(path) => self.rmdir(&path.split('/').collect::<Vec<_>>()),
            Step::Write { path, value } => self.write(&path.split('/').collect::<Vec<_>>(), value),
            Step::Symlink { target, link } => self.symlink(
                &target.split('/').collect::<Vec<_>>(),
                &link.split('/').collect::<Vec<_>>(),
            ),
            Step::Unlink(path) => self.unlink(&path.split('/').collect::<Vec<_>>()),
        }
    }

    fn mkdir(&mut self, p: &[&str]) -> Result<(), String> {
        let fresh = match p {
            ["core", h] => self.hbas.insert(hba(h)?),
            ["core", h, name] => {
                let (h, name) = (hba(h)?, so_name(name)?);
                if !self.hbas.contains(&h) {
                    return Err("no such HBA".into());
                }
                let fresh = !self.state.storage_objects.contains_key(&name);
                if fresh {
                    let so = StorageObject {
                        hba: Some(h),
                        ..Default::default()
                    };
                    self.state.storage_objects.insert(name, so);
                }
                fresh
            }
            ["iscsi", t] => {
                let t = iqn(t)?;
                let fresh = !self.state.targets.contains_key(&t);
                self.state.targets.entry(t).or_default();
                fresh
            }
            ["iscsi", t, tag] => {
                let tag = tpgt(tag)?;
                let target = self.target(t)?;
                let fresh = !target.tpgs.contains_key(&tag);
                target.tpgs.entry(tag).or_insert_with(|| Tpg {
                    attributes: kernel_defaults(),
                    ..Default::default()
                });
                fresh
            }
            ["iscsi", t, tag, "lun", l] => {
                let l = lun(l)?;
                let tpg = self.tpg(t, tag)?;
                !tpg.luns.contains_key(&l) && tpg.unlinked_luns.insert(l)
            }
            ["iscsi", t, tag, "np", portal] => {
                let portal = portal.parse().map_err(|e| format!("{portal:?}: {e}"))?;
                self.tpg(t, tag)?.portals.insert(portal)
            }
            ["iscsi", t, tag, "acls", i] => {
                let i = iqn(i)?;
                let tpg = self.tpg(t, tag)?;
                let fresh = !tpg.acls.contains_key(&i);
                tpg.acls.entry(i).or_default();
                fresh
            }
            ["iscsi", t, tag, "acls", i, m] => {
                let m = lun(m)?;
                let acl = self.acl(t, tag, i)?;
                !acl.mapped_luns.contains_key(&m) && acl.unlinked_mapped_luns.insert(m)
            }
            _ => return Err("not a folder the kernel makes".into()),
        };
        fresh.then_some(()).ok_or_else(|| "exists".into())
    }

    fn rmdir(&mut self, p: &[&str]) -> Result<(), String> {
        match p {
            ["core", h] => {
                let h = hba(h)?;
                if self
                    .state
                    .storage_objects
                    .values()
                    .any(|so| so.hba == Some(h))
                {
                    return Err("not empty".into());
                }
                self.hbas.remove(&h).then_some(()).ok_or("absent")?;
            }
            ["core", h, name] => {
                self.so(h, name)?;
                let name = so_name(name)?;
                if self.exported(&name) {
                    return Err("a LUN links the storage object".into());
                }
                self.state.storage_objects.remove(&name);
                self.control.remove(&name);
            }
            ["iscsi", t] => {
                if !self.target(t)?.tpgs.is_empty() {
                    return Err("not empty".into());
                }
                self.state.targets.remove(&iqn(t)?);
            }
            ["iscsi", t, tag] => {
                let tpg = self.tpg(t, tag)?;
                let busy = !tpg.luns.is_empty()
                    || !tpg.unlinked_luns.is_empty()
                    || !tpg.acls.is_empty()
                    || !tpg.portals.is_empty();
                if busy {
                    return Err("not empty".into());
                }
                let tag = tpgt(tag)?;
                self.target(t)?.tpgs.remove(&tag);
            }
            ["iscsi", t, tag, "lun", l] => {
                let l = lun(l)?;
                let tpg = self.tpg(t, tag)?;
                if tpg.luns.contains_key(&l) {
                    return Err("the LUN still links its storage object".into());
                }
                tpg.unlinked_luns.remove(&l).then_some(()).ok_or("absent")?;
            }
            ["iscsi", t, tag, "np", portal] => {
                let portal = portal.parse().map_err(|e| format!("{portal:?}: {e}"))?;
                self.tpg(t, tag)?
                    .portals
                    .remove(&portal)
                    .then_some(())
                    .ok_or("absent")?;
            }
            ["iscsi", t, tag, "acls", i] => {
                let acl = self.acl(t, tag, i)?;
                if !acl.mapped_luns.is_empty() || !acl.unlinked_mapped_luns.is_empty() {
                    return Err("not empty".into());
                }
                let i = iqn(i)?;
                self.tpg(t, tag)?.acls.remove(&i);
            }
            ["iscsi", t, tag, "acls", i, m] => {
                let m = lun(m)?;
                let acl = self.acl(t, tag, i)?;
                if acl.mapped_luns.contains_key(&m) {
                    return Err("the mapped LUN still links its LUN".into());
                }
                acl.unlinked_mapped_luns
                    .remove(&m)
                    .then_some(())
                    .ok_or("absent")?;
            }
            _ => return Err("not a folder the kernel removes".into()),
        }
        Ok(())
    }

    fn write(&mut self, p: &[&str], value: &str) -> Result<(), String> {
        match p {
            ["core", h, name, attr @ ..] => {
                let so_key = so_name(name)?;
                let exported = self.exported(&so_key);
                let pending = self.control.get(&so_key).cloned();
                let so = self.so(h, name)?;
                match attr {
                    ["control"] => {
                        if so.enabled {
                            return Err("the device is configured".into());
                        }
                        if let Some(dev) = value.strip_prefix("udev_path=") {
                            self.control.insert(so_key, dev.to_owned());
                        } else if let Some(ro) = value.strip_prefix("readonly=") {
                            so.readonly = flag(ro)?;
                        } else {
                            return Err("not a control option".into());
                        }
                    }
                    ["udev_path"] => so.udev_path = value.into(),
                    ["enable"] => {
                        if !flag(value)? || so.enabled || pending.is_none() {
                            return Err("cannot enable".into());
                        }
                        so.enabled = true;
                    }
                    ["wwn", "vpd_unit_serial"] => {
                        if exported {
                            return Err("exported: the serial cannot change".into());
                        }
                        so.unit_serial = Some(value.into());
                    }
                    _ => return Err("no such attribute".into()),
                }
            }
            ["iscsi", t, tag, "enable"] => self.tpg(t, tag)?.enabled = flag(value)?,
            ["iscsi", t, tag, "attrib", attr] => {
                let on = flag(value)?;
                let a = &mut self.tpg(t, tag)?.attributes;
                match *attr {
                    "authentication" => a.authentication = on,
                    "generate_node_acls" => a.generate_node_acls = on,
                    "demo_mode_write_protect" => a.demo_mode_write_protect = on,
                    "cache_dynamic_acls" => a.cache_dynamic_acls = on,
                    _ => return Err("no such attribute".into()),
                }
            }
            ["iscsi", t, tag, "acls", i, "auth", which] => {
                let acl = self.acl(t, tag, i)?;
                let chap = acl.chap.get_or_insert(Chap {
                    userid: String::new(),
                    password: String::new(),
                });
                match *which {
                    "userid" => chap.userid = value.into(),
                    "password" => chap.password = value.into(),
                    _ => return Err("no such attribute".into()),
                }
            }
            ["iscsi", t, tag, "acls", i, m, "write_protect"] => {
                let m = lun(m)?;
                let on = flag(value)?;
                self.acl(t, tag, i)?
                    .mapped_luns
                    .get_mut(&m)
                    .ok_or("no such mapped LUN")?
                    .write_protect = on;
            }
            _ => return Err("no such attribute".into()),
        }
        Ok(())
    }

    fn symlink(&mut self, target: &[&str], link: &[&str]) -> Result<(), String> {
        match (target, link) {
            (["core", h, name], ["iscsi", t, tag, "lun", l, link_name]) => {
                if !self.so(h, name)?.enabled {
                    return Err("the storage object is not configured".into());
                }
                let (so, l) = (so_name(name)?, lun(l)?);
                let tpg = self.tpg(t, tag)?;
                if !tpg.unlinked_luns.remove(&l) {
                    return Err("no empty LUN folder".into());
                }
                let mut lun = TpgLun::new(so);
                lun.link = Some((*link_name).to_owned());
                tpg.luns.insert(l, lun);
                Ok(())
            }
            (["iscsi", t1, tag1, "lun", l], ["iscsi", t, tag, "acls", i, m, link_name])
                if t1 == t && tag1 == tag =>
            {
                let (l, m) = (lun(l)?, lun(m)?);
                if !self.tpg(t, tag)?.luns.contains_key(&l) {
                    return Err("the LUN serves nothing".into());
                }
                let acl = self.acl(t, tag, i)?;
                if !acl.unlinked_mapped_luns.remove(&m) {
                    return Err("no empty mapped LUN folder".into());
                }
                let mut mapped = MappedLun::new(l);
                mapped.link = Some((*link_name).to_owned());
                acl.mapped_luns.insert(m, mapped);
                Ok(())
            }
            _ => Err("not a link the kernel takes".into()),
        }
    }

    fn unlink(&mut self, p: &[&str]) -> Result<(), String> {
        match p {
            ["iscsi", t, tag, "lun", l, link_name] => {
                let l = lun(l)?;
                let tpg = self.tpg(t, tag)?;
                let mapped = tpg
                    .acls
                    .values()
                    .flat_map(|a| a.mapped_luns.values())
                    .any(|m| m.tpg_lun == l);
                if mapped {
                    return Err("a mapped LUN shows the LUN".into());
                }
                match tpg.luns.get(&l) {
                    Some(x) if x.link.as_deref() == Some(*link_name) => {}
                    _ => return Err("no such link".into()),
                }
                tpg.luns.remove(&l);
                tpg.unlinked_luns.insert(l);
            }
            ["iscsi", t, tag, "acls", i, m, link_name] => {
                let m = lun(m)?;
                let acl = self.acl(t, tag, i)?;
                match acl.mapped_luns.get(&m) {
                    Some(x) if x.link.as_deref() == Some(*link_name) => {}
                    _ => return Err("no such link".into()),
                }
                acl.mapped_luns.remove(&m);
                acl.unlinked_mapped_luns.insert(m);
            }
            _ => return Err("not a link".into()),
        }
        Ok(())
    }
}
