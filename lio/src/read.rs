//! Reading the present LIO state back from configfs.
use crate::{
    error::Error,
    listings::Listings,
    model::{Acl, Chap, MappedLun, State, StorageObject, Target, Tpg, TpgAttributes, TpgLun},
    names::{parse_portal, Iqn, Lun, StorageObjectName, Tpgt},
    plan::{so_dir, target_dir, tpg_dir},
};
use configfs::{StepKind, Tree};
use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::PathBuf,
};

/// Every `<plugin>_<N>` HBA index in `core`, of any backstore type: rtslib
/// keeps indexes unique across types, so a new one avoids all of them.
pub(crate) fn used_hba_indexes(tree: &Tree) -> Result<BTreeSet<u32>, Error> {
    Ok(tree
        .children("core")?
        .iter()
        .filter_map(|hba| hba.rsplit_once('_').and_then(|(_, n)| n.parse().ok()))
        .collect())
}

/// Every iblock storage object; a name under two HBAs is an error, since
/// rtslib and this crate identify an iblock object by its name.
pub(crate) fn read_storage_objects(
    tree: &Tree,
) -> Result<BTreeMap<StorageObjectName, StorageObject>, Error> {
    read_storage_objects_of(tree, None)
}

/// The iblock storage objects named in `only` (all when `None`). Every HBA
/// folder is still listed, so a name under two HBAs is found either way;
/// only the named objects' attributes are read.
pub(crate) fn read_storage_objects_of(
    tree: &Tree,
    only: Option<&BTreeSet<&StorageObjectName>>,
) -> Result<BTreeMap<StorageObjectName, StorageObject>, Error> {
    Ok(scan(tree, only, None)?.objects)
}

/// What one listing of the HBA folders finds.
#[derive(Debug, Default)]
pub(crate) struct Scan {
    /// The iblock storage objects asked for, read whole.
    pub objects: BTreeMap<StorageObjectName, StorageObject>,
    /// The HBA index of every iblock storage object.
    pub hba_of: BTreeMap<StorageObjectName, u32>,
    /// Every `<plugin>_<N>` HBA index, of any backstore type.
    pub used: BTreeSet<u32>,
    /// The iblock HBA indexes whose folder holds no storage object.
    pub empty: Vec<u32>,
}

/// Lists `core` and every iblock HBA folder once: the storage objects named
/// in `only` (all when `None`) read whole, every object's HBA, the indexes
/// in use and the empty iblock HBAs. A name under two HBAs is an error,
/// since rtslib and this crate identify an iblock object by its name.
///
/// With `listings`, an HBA folder listed before and not made again since is
/// not listed again (see [`Listings`]); a scan that fails forgets every
/// listing, so that one gone stale (another writer's change inside a folder
/// it did not make again) is not met twice.
pub(crate) fn scan(
    tree: &Tree,
    only: Option<&BTreeSet<&StorageObjectName>>,
    listings: Option<&Listings>,
) -> Result<Scan, Error> {
    let scanned = scan_listed(tree, only, listings);
    if let (Err(_), Some(listings)) = (&scanned, listings) {
        listings.forget_all();
    }
    scanned
}

fn scan_listed(
    tree: &Tree,
    only: Option<&BTreeSet<&StorageObjectName>>,
    listings: Option<&Listings>,
) -> Result<Scan, Error> {
    let mut out = Scan::default();
    let Some(core) = tree.folder("core")? else {
        return Ok(out);
    };
    let hbas = core.list_with_inodes()?;
    if let Some(listings) = listings {
        listings.keep_only(&hbas);
    }
    for (hba_name, ino) in hbas {
        if let Some(n) = hba_name.rsplit_once('_').and_then(|(_, n)| n.parse().ok()) {
            out.used.insert(n);
        }
        let Some(hba) = hba_name
            .strip_prefix("iblock_")
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        // Listed through the open `core` folder: a short lookup per HBA.
        let names = match listings {
            Some(listings) => listings.children(&core, &hba_name, ino)?,
            None => core.children(&hba_name)?,
        };
        if names.is_empty() {
            out.empty.push(hba);
        }
        for name in names {
            let name = StorageObjectName::new(&name)?;
            if let Some(other) = out.hba_of.insert(name.clone(), hba) {
                return Err(Error::Conflict(format!(
                    "storage object name {name} is used under iblock_{other} and iblock_{hba}"
                )));
            }
            if only.is_none_or(|o| o.contains(&name)) {
                let so = read_storage_object(tree, hba, &name)?;
                out.objects.insert(name, so);
            }
        }
    }
    Ok(out)
}

/// How many LUNs of any fabric the kernel counts serving the storage
/// object (`statistics/scsi_dev/ports`, the device's export count); `None`
/// where the attribute is missing (not a kernel tree).
pub(crate) fn export_count(
    tree: &Tree,
    hba: u32,
    name: &StorageObjectName,
) -> Result<Option<u32>, Error> {
    let rel = format!("{}/statistics/scsi_dev/ports", so_dir(hba, name));
    let Some(value) = tree.read_attr_opt(&rel)? else {
        return Ok(None);
    };
    value.trim().parse().map(Some).map_err(|_| {
        configfs::Error::Parse {
            path: tree.root().join(&rel),
            value,
            why: "expected a number".into(),
        }
        .into()
    })
}

/// One value of the `info` attribute, which reads like
/// `Status: ACTIVATED ... iBlock device: dm-3  UDEV PATH: /dev/x  readonly: 0 ...`.
pub(crate) fn info_value<'a>(info: &'a str, key: &str) -> Option<&'a str> {
    let at = info.find(&format!("{key}: "))? + key.len() + 2;
    info[at..].split_whitespace().next()
}

fn read_storage_object(
    tree: &Tree,
    hba: u32,
    name: &StorageObjectName,
) -> Result<StorageObject, Error> {
    let dir = so_dir(hba, name);
    let info = tree
        .read_attr_opt(&format!("{dir}/info"))?
        .unwrap_or_default();
    let mut udev_path = tree
        .read_attr_opt(&format!("{dir}/udev_path"))?
        .unwrap_or_default();
    if udev_path.trim().is_empty() {
        // Another writer may have set only control's udev_path.
        udev_path = info_value(&info, "UDEV PATH")
            .unwrap_or_default()
            .to_owned();
    }
    let serial = tree
        .read_attr_opt(&format!("{dir}/wwn/vpd_unit_serial"))?
        .unwrap_or_default();
    let serial = serial.split_once(':').map_or("", |(_, s)| s).trim();
    Ok(StorageObject {
        udev_path: PathBuf::from(udev_path.trim()),
        readonly: info_value(&info, "readonly") == Some("1"),
        unit_serial: (!serial.is_empty()).then(|| serial.to_owned()),
        hba: Some(hba),
        enabled: tree
            .read_attr_opt(&format!("{dir}/enable"))?
            .is_some_and(|v| v.trim() == "1"),
    })
}

fn flag(tree: &Tree, path: &str) -> Result<bool, Error> {
    Ok(tree.parse_attr(path, "0 or 1", |v| match v {
        "0" => Some(false),
        "1" => Some(true),
        _ => None,
    })?)
}

/// The symlinks in a folder, with their targets relative to the tree's root.
fn links(tree: &Tree, dir: &str) -> Result<Vec<(String, PathBuf)>, Error> {
    let full = tree.path(dir)?;
    let mut out = Vec::new();
    for name in tree.children(dir)? {
        let is_link = fs::symlink_metadata(full.join(&name))
            .map_err(|source| configfs::Error::Io {
                kind: StepKind::Read,
                path: full.join(&name),
                source,
            })?
            .file_type()
            .is_symlink();
        if is_link {
            let target = tree.link_target(&format!("{dir}/{name}"))?;
            out.push((name, target));
        }
    }
    Ok(out)
}

/// Every iSCSI target present.
pub(crate) fn read_targets(tree: &Tree) -> Result<BTreeMap<Iqn, Target>, Error> {
    let mut out = BTreeMap::new();
    for name in tree.children("iscsi")? {
        if name == "discovery_auth" {
            continue;
        }
        let iqn = Iqn::from_kernel(&name)?;
        if let Some(t) = read_target(tree, &iqn)? {
            out.insert(iqn, t);
        }
    }
    Ok(out)
}

pub(crate) fn read_target(tree: &Tree, iqn: &Iqn) -> Result<Option<Target>, Error> {
    let dir = target_dir(iqn);
    if !tree.exists(&dir) {
        return Ok(None);
    }
    let mut tpgs = BTreeMap::new();
    for name in tree.children(&dir)? {
        if !name.starts_with("tpgt_") {
            continue; // fabric_statistics
        }
        let tpgt = Tpgt::from_dir(&name)?;
        tpgs.insert(tpgt, read_tpg(tree, iqn, tpgt)?);
    }
    Ok(Some(Target { tpgs }))
}

fn read_tpg(tree: &Tree, iqn: &Iqn, tpgt: Tpgt) -> Result<Tpg, Error> {
    let dir = tpg_dir(iqn, tpgt);
    let attr = |a: &str| flag(tree, &format!("{dir}/attrib/{a}"));
    let attributes = TpgAttributes {
        authentication: attr("authentication")?,
        generate_node_acls: attr("generate_node_acls")?,
        demo_mode_write_protect: attr("demo_mode_write_protect")?,
        cache_dynamic_acls: attr("cache_dynamic_acls")?,
    };
    let mut portals = BTreeSet::new();
    for name in tree.children(&format!("{dir}/np"))? {
        portals.insert(parse_portal(&name)?);
    }
    let mut luns = BTreeMap::new();
    let mut unlinked_luns = BTreeSet::new();
    for name in tree.children(&format!("{dir}/lun"))? {
        let lun = Lun::from_dir(&name)?;
        let Some((link, target)) = links(tree, &format!("{dir}/lun/{name}"))?
            .into_iter()
            .next()
        else {
            // Half-made or half-removed: a folder serving nothing.
            unlinked_luns.insert(lun);
            continue;
        };
        {
            let so = target
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            luns.insert(
                lun,
                TpgLun {
                    storage_object: StorageObjectName::new(&so)?,
                    link: Some(link),
                },
            );
        }
    }
    let mut acls = BTreeMap::new();
    for name in tree.children(&format!("{dir}/acls"))? {
        let initiator = Iqn::from_kernel(&name)?;
        acls.insert(initiator, read_acl(tree, &format!("{dir}/acls/{name}"))?);
    }
    Ok(Tpg {
        enabled: flag(tree, &format!("{dir}/enable"))?,
        attributes,
        portals,
        luns,
        acls,
        unlinked_luns,
    })
}

fn read_acl(tree: &Tree, dir: &str) -> Result<Acl, Error> {
    let mut mapped_luns = BTreeMap::new();
    let mut unlinked_mapped_luns = BTreeSet::new();
    for name in tree.children(dir)? {
        if !name.starts_with("lun_") {
            continue; // attrib, auth, param, fabric_statistics
        }
        let mapped = Lun::from_dir(&name)?;
        let m_dir = format!("{dir}/{name}");
        let Some((link, target)) = links(tree, &m_dir)?.into_iter().next() else {
            unlinked_mapped_luns.insert(mapped);
            continue;
        };
        {
            let tpg_lun = target
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            mapped_luns.insert(
                mapped,
                MappedLun {
                    tpg_lun: Lun::from_dir(&tpg_lun)?,
                    write_protect: flag(tree, &format!("{m_dir}/write_protect"))?,
                    link: Some(link),
                },
            );
        }
    }
    let userid = tree
        .read_attr_opt(&format!("{dir}/auth/userid"))?
        .unwrap_or_default();
    let password = tree
        .read_attr_opt(&format!("{dir}/auth/password"))?
        .unwrap_or_default();
    let chap = (!userid.is_empty() || !password.is_empty()).then_some(Chap { userid, password });
    Ok(Acl {
        mapped_luns,
        chap,
        unlinked_mapped_luns,
    })
}

pub(crate) fn read_all(tree: &Tree) -> Result<State, Error> {
    Ok(State {
        storage_objects: read_storage_objects(tree)?,
        targets: read_targets(tree)?,
    })
}

/// The storage objects and targets `desired` names, and the storage
/// objects its LUNs serve: the cost does not grow with unrelated objects
/// beyond listing the HBA folders.
pub(crate) fn read_scoped(tree: &Tree, desired: &State) -> Result<State, Error> {
    Ok(read_scoped_scan(tree, desired, None)?.0)
}

/// The targets named in `iqns` that are present.
pub(crate) fn read_targets_named<'a>(
    tree: &Tree,
    iqns: impl IntoIterator<Item = &'a Iqn>,
) -> Result<BTreeMap<Iqn, Target>, Error> {
    let mut targets = BTreeMap::new();
    for iqn in iqns {
        if let Some(t) = read_target(tree, iqn)? {
            targets.insert(iqn.clone(), t);
        }
    }
    Ok(targets)
}

/// [`read_scoped`], with the [`Scan`] of the HBA folders it made.
pub(crate) fn read_scoped_scan(
    tree: &Tree,
    desired: &State,
    listings: Option<&Listings>,
) -> Result<(State, Scan), Error> {
    let targets = read_targets_named(tree, desired.targets.keys())?;
    let served = desired
        .targets
        .values()
        .flat_map(|t| t.tpgs.values())
        .flat_map(|tpg| tpg.luns.values())
        .map(|l| &l.storage_object);
    let wanted: BTreeSet<&StorageObjectName> =
        desired.storage_objects.keys().chain(served).collect();
    let mut scan = scan(tree, Some(&wanted), listings)?;
    let state = State {
        storage_objects: std::mem::take(&mut scan.objects),
        targets,
    };
    Ok((state, scan))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_values_are_found_by_key() {
        let info = "Status: ACTIVATED  Max Queue Depth: 128  SectorSize: 512  HwMaxSectors: 256\n\
                    iBlock device: dm-3  UDEV PATH: /dev/labvg/lv1  readonly: 1\n        \
                    Major: 253 Minor: 3  CLAIMED: IBLOCK\n";
        assert_eq!(info_value(info, "UDEV PATH"), Some("/dev/labvg/lv1"));
        assert_eq!(info_value(info, "readonly"), Some("1"));
        assert_eq!(info_value(info, "Major"), Some("253"));
        assert_eq!(info_value(info, "Minor"), Some("3"));
        assert_eq!(info_value(info, "Nope"), None);
    }

    #[test]
    fn reads_a_tree_shaped_like_the_kernel() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let root = dir.path();
        let mk = |p: &str| fs::create_dir_all(root.join(p));
        let put = |p: &str, v: &str| fs::write(root.join(p), v);
        mk("core/iblock_2/vol")?;
        mk("core/fileio_0/other")?;
        mk("core/alua")?;
        put("core/iblock_2/vol/udev_path", "\n")?;
        put(
            "core/iblock_2/vol/info",
            "Status: ACTIVATED\niBlock device: zd0  UDEV PATH: /dev/zd0  readonly: 0\n",
        )?;
        put("core/iblock_2/vol/enable", "1\n")?;
        mk("core/iblock_2/vol/wwn")?;
        put(
            "core/iblock_2/vol/wwn/vpd_unit_serial",
            "T10 VPD Unit Serial Number: abc\n",
        )?;
        let tpg = "iscsi/iqn.2026-01.org.example:t/tpgt_1";
        mk("iscsi/discovery_auth")?;
        mk("iscsi/iqn.2026-01.org.example:t/fabric_statistics")?;
        mk(&format!("{tpg}/attrib"))?;
        for (a, v) in [
            ("authentication", "0"),
            ("generate_node_acls", "0"),
            ("demo_mode_write_protect", "1"),
            ("cache_dynamic_acls", "0"),
        ] {
            put(&format!("{tpg}/attrib/{a}"), v)?;
        }
        put(&format!("{tpg}/enable"), "1\n")?;
        mk(&format!("{tpg}/np/[::1]:3260"))?;
        mk(&format!("{tpg}/lun/lun_0/statistics"))?;
        std::os::unix::fs::symlink(
            root.join("core/iblock_2/vol"),
            root.join(format!("{tpg}/lun/lun_0/abc123")),
        )?;
        let acl = format!("{tpg}/acls/iqn.2026-01.org.example:h");
        mk(&format!("{acl}/lun_5"))?;
        mk(&format!("{acl}/auth"))?;
        put(&format!("{acl}/auth/userid"), "")?;
        put(&format!("{acl}/auth/password"), "")?;
        put(&format!("{acl}/lun_5/write_protect"), "1")?;
        std::os::unix::fs::symlink("../../../lun/lun_0", root.join(format!("{acl}/lun_5/x")))?;

        let tree = Tree::at(root);
        let state = read_all(&tree)?;
        let vol = StorageObjectName::new("vol")?;
        let so = &state.storage_objects[&vol];
        assert_eq!(so.udev_path, PathBuf::from("/dev/zd0"));
        assert_eq!((so.hba, so.enabled, so.readonly), (Some(2), true, false));
        assert_eq!(so.unit_serial.as_deref(), Some("abc"));
        assert_eq!(
            state.storage_objects.len(),
            1,
            "fileio objects are not modelled"
        );
        assert_eq!(used_hba_indexes(&tree)?, [0, 2].into());
        let t = &state.targets[&Iqn::new("iqn.2026-01.org.example:t")?];
        let tpg = &t.tpgs[&Tpgt::new(1)?];
        assert!(tpg.enabled);
        assert_eq!(tpg.attributes, TpgAttributes::default());
        assert_eq!(tpg.portals, ["[::1]:3260".parse()?].into());
        assert_eq!(tpg.luns[&Lun(0)].storage_object, vol);
        assert_eq!(tpg.luns[&Lun(0)].link.as_deref(), Some("abc123"));
        let acl = &tpg.acls[&Iqn::new("iqn.2026-01.org.example:h")?];
        assert_eq!(acl.chap, None);
        let m = &acl.mapped_luns[&Lun(5)];
        assert_eq!(
            (m.tpg_lun, m.write_protect, m.link.as_deref()),
            (Lun(0), true, Some("x"))
        );

        mk("core/iblock_7/vol")?;
        assert!(matches!(read_all(&tree), Err(Error::Conflict(_))));
        Ok(())
    }
}
