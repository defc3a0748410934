//! The Linux kernel LIO SCSI target as typed configfs objects.
//!
//! The tree under `/sys/kernel/config/target` is modelled as a [`State`]:
//! iblock storage objects (one block device each, under
//! `core/iblock_N/<name>`) and iSCSI targets with their target portal
//! groups, network portals, LUNs and node ACLs with mapped LUNs.
//! [`Lio::read`] reads back what is present; [`Lio::apply`] makes only the
//! changes needed for a desired state, in the order the kernel requires, and
//! is idempotent; [`Lio::teardown`] removes objects with everything hanging
//! off them (mapped LUNs, ACLs, LUNs, portals, TPG, target, storage object).
//! Every name is a checked type ([`Iqn`], [`StorageObjectName`], [`Tpgt`],
//! [`Lun`]), so nothing a caller passes can escape or confuse configfs.
//!
//! The state written is the state rtslib-fb (the library under targetcli)
//! writes, so targetcli and rtslib read it back: a storage object's device is
//! written to `control` and to its `udev_path` attribute, and a new object's
//! HBA index is allocated under rtslib's lock file
//! (`/var/run/rtslib_backstore.lock`), so two writers never pick the same
//! `iblock_N`.
//!
//! Scope: iblock storage objects and the iSCSI fabric. Other backstores
//! (fileio, ramdisk, pscsi, user) are left alone and not read back, except
//! that their HBA indexes are avoided; a LUN that serves one reads back with
//! that object's folder name. Discovery authentication, mutual CHAP, portal
//! iSER/offload and persistent-reservation files are not modelled.
//!
//! The crate knows nothing of volumes: it is a library any Rust tool that
//! drives the kernel target can link. It is synchronous; callers serialise
//! changes to the objects they own.
//!
//! # Host
//!
//! configfs mounted at `/sys/kernel/config`, the `target_core_mod`,
//! `target_core_iblock` and `iscsi_target_mod` modules loaded, root. No C
//! library and no async runtime. The package is `pillar-csi-lio`; the crate
//! is `lio`. A fuller walk-through, with teardown, is
//! `examples/lio_export.rs`.
//!
//! ```no_run
//! use lio::{Acl, Iqn, Lio, Lun, MappedLun, State, StorageObject, StorageObjectName, Target, Tpg, TpgLun, Tpgt};
//!
//! let lio = Lio::open()?;
//! let name = StorageObjectName::new("tank.pvc-1")?;
//! let mut desired = State::default();
//! desired.storage_objects.insert(name.clone(), StorageObject {
//!     udev_path: "/dev/zvol/tank/pvc-1".into(),
//!     unit_serial: Some("pillar-pvc-1".into()),
//!     ..Default::default()
//! });
//! let mut tpg = Tpg { enabled: true, ..Default::default() };
//! tpg.portals.insert("0.0.0.0:3260".parse()?);
//! tpg.luns.insert(Lun(0), TpgLun::new(name));
//! let mut acl = Acl::default();
//! acl.mapped_luns.insert(Lun(0), MappedLun::new(Lun(0)));
//! tpg.acls.insert(Iqn::new("iqn.1993-08.org.debian:01:worker-1")?, acl);
//! let mut target = Target::default();
//! target.tpgs.insert(Tpgt::new(1)?, tpg);
//! desired.targets.insert(Iqn::new("iqn.2026-01.com.bhyoo.pillar-csi:tank.pvc-1")?, target);
//! let steps = lio.apply(&desired)?;
//! println!("{} changes; a second apply makes none: {:?}", steps.len(), lio.apply(&desired)?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod error;
mod listings;
mod lock;
mod model;
mod names;
mod plan;
mod read;
mod revoke;

pub use configfs::Step;
pub use error::Error;
pub use model::{
    Acl, Chap, MappedLun, State, StorageObject, Target, Teardown, Tpg, TpgAttributes, TpgLun,
};
pub use names::{
    portal_dir, InvalidName, Iqn, Lun, StorageObjectName, Tpgt, IQN_MAX_LEN, STORAGE_OBJECT_MAX_LEN,
};
pub use plan::{plan_apply, plan_teardown};
pub use revoke::{leaves_demo_mode, targets_leaving_demo_mode, Revoked};

use configfs::{StepKind, Tree};
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

/// The default root of the LIO configfs tree.
pub const DEFAULT_ROOT: &str = "/sys/kernel/config/target";

/// The lock file rtslib-fb takes while it allocates a backstore index.
pub const DEFAULT_LOCK_FILE: &str = "/var/run/rtslib_backstore.lock";

/// The highest HBA index rtslib-fb allocates (it scans `0..1048576`).
const MAX_HBA_INDEX: u32 = 1_048_575;

/// A handle on the LIO configfs tree.
#[derive(Debug, Clone)]
pub struct Lio {
    tree: Tree,
    /// The backstore lock file, kept open; shared by the handle's clones,
    /// which write the same tree.
    lock_file: std::sync::Arc<lock::LockFile>,
    /// What each HBA folder held when last listed; shared likewise.
    listings: std::sync::Arc<listings::Listings>,
}

impl Lio {
    /// Opens `/sys/kernel/config/target`; fails clearly when configfs is not
    /// mounted or the `target_core_mod` module is not loaded.
    pub fn open() -> Result<Self, Error> {
        Self::open_at(DEFAULT_ROOT)
    }

    /// Opens the LIO tree at another root (a configfs mounted elsewhere).
    pub fn open_at(root: impl Into<PathBuf>) -> Result<Self, Error> {
        Ok(Self::with_tree(Tree::open(root)?))
    }

    /// A handle on an already opened tree (for example [`Tree::at`] a copy).
    pub fn with_tree(tree: Tree) -> Self {
        Self {
            tree,
            lock_file: std::sync::Arc::new(lock::LockFile::new(DEFAULT_LOCK_FILE)),
            listings: Default::default(),
        }
    }

    /// Uses another lock file for backstore index allocation (the default is
    /// rtslib-fb's, [`DEFAULT_LOCK_FILE`]).
    pub fn with_lock_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.lock_file = std::sync::Arc::new(lock::LockFile::new(path));
        self
    }

    /// The index of every iblock HBA folder (`core/iblock_<n>`), holding a
    /// storage object or not.
    pub fn hbas(&self) -> Result<std::collections::BTreeSet<u32>, Error> {
        read::used_hba_indexes(&self.tree)
    }

    /// The handle calling `hook` after every configfs step it runs.
    pub fn with_step_hook(mut self, hook: configfs::StepHook) -> Self {
        self.tree = self.tree.with_step_hook(hook);
        self
    }

    /// The configfs tree this handle writes.
    pub fn tree(&self) -> &Tree {
        &self.tree
    }

    /// Reads back every iblock storage object and iSCSI target present.
    pub fn read(&self) -> Result<State, Error> {
        read::read_all(&self.tree)
    }

    /// Reads back the storage objects and targets `desired` names, and the
    /// storage objects its LUNs serve; others are left out.
    pub fn read_scoped(&self, desired: &State) -> Result<State, Error> {
        read::read_scoped(&self.tree, desired)
    }

    /// Makes the objects named in `desired` match it, changing only what
    /// differs, and returns the steps taken (none when already in place).
    /// Objects `desired` does not name are left alone.
    ///
    /// A new storage object gets the lowest HBA index no backstore uses,
    /// chosen and created while holding the backstore lock file; if a writer
    /// that ignores the lock takes the same index first, the apply is
    /// planned again. A new storage object the kernel refuses to configure
    /// (its device is missing or busy) is removed again.
    ///
    /// The handle (and its clones) keeps what each HBA folder held when it
    /// last listed it, and lists a folder again only when configfs made it
    /// again (a new inode) or the handle's own steps touched it: with one
    /// storage object per HBA folder, as rtslib and this crate make them, an
    /// export does not list every HBA folder. [`Lio::read`] lists them all.
    pub fn apply(&self, desired: &State) -> Result<Vec<Step>, Error> {
        // Whether a desired storage object is new is known from the listing
        // of the HBA folders, which the index allocation needs too: it is
        // made once, holding the lock, so that no writer taking the lock is
        // between the listing and the creation of a new index.
        let _lock = if desired.storage_objects.is_empty() {
            None
        } else {
            Some(self.lock_file.take()?)
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (present, scan) =
                read::read_scoped_scan(&self.tree, desired, Some(&self.listings))?;
            let creates = desired
                .storage_objects
                .keys()
                .any(|n| !present.storage_objects.contains_key(n));
            let mut used = scan.used;
            if creates && attempt == 1 {
                self.remove_empty_hbas(&scan.empty, &mut used)?;
            }
            let new_hbas = allocate(&present, desired, used)?;
            let mut steps = plan_apply(&present, desired, &new_hbas)?;
            if !desired.targets.is_empty() && !self.tree.exists("iscsi") {
                // Creating the fabric folder loads iscsi_target_mod's tree.
                steps.insert(0, Step::mkdir("iscsi"));
            }
            match self.run(&steps) {
                Ok(()) => return Ok(steps),
                Err(e) if attempt < 3 && lost_hba_race(&e) => {}
                Err(e) => {
                    self.undo_unconfigured(&new_hbas);
                    return Err(e.into());
                }
            }
        }
    }

    /// Runs `steps`, then forgets the listings of the HBA folders they
    /// touch, whether they all ran or not.
    fn run(&self, steps: &[Step]) -> Result<(), configfs::Error> {
        let ran = self.tree.run(steps);
        self.listings.forget_touched(steps);
        ran
    }

    /// Removes the iblock HBA folders `empty` that hold no storage object:
    /// a creation interrupted between the HBA and its object (the process
    /// killed) leaves one, which nothing else would remove and whose index
    /// stays taken. Called with the backstore lock held, so no writer that
    /// takes the lock is between those two steps.
    fn remove_empty_hbas(
        &self,
        empty: &[u32],
        used: &mut std::collections::BTreeSet<u32>,
    ) -> Result<(), Error> {
        for hba in empty {
            self.run(&[Step::rmdir(plan::hba_dir(*hba))])?;
            used.remove(hba);
        }
        Ok(())
    }

    /// Removes storage objects this apply created but the kernel did not
    /// enable, so a refused device leaves nothing behind. Best effort: the
    /// original error is what the caller needs.
    fn undo_unconfigured(&self, new_hbas: &BTreeMap<StorageObjectName, u32>) {
        for (name, hba) in new_hbas {
            let dir = plan::so_dir(*hba, name);
            let enabled = self
                .tree
                .read_attr(&format!("{dir}/enable"))
                .is_ok_and(|v| v.trim() == "1");
            if self.tree.exists(&dir) && !enabled {
                let _ = self.run(&[Step::rmdir(dir)]);
            }
            let hba_dir = plan::hba_dir(*hba);
            if self.tree.exists(&hba_dir)
                && self.tree.children(&hba_dir).is_ok_and(|c| c.is_empty())
            {
                let _ = self.run(&[Step::rmdir(hba_dir)]);
            }
        }
    }

    /// Removes the named objects and what hangs off them, in the kernel's
    /// order; absent objects are skipped. Returns the steps taken.
    pub fn teardown(&self, teardown: &Teardown) -> Result<Vec<Step>, Error> {
        let mut present = State {
            storage_objects: BTreeMap::new(),
            targets: read::read_targets_named(&self.tree, &teardown.targets)?,
        };
        if !teardown.storage_objects.is_empty() {
            let only = teardown.storage_objects.iter().collect();
            let scan = read::scan(&self.tree, Some(&only), Some(&self.listings))?;
            // A storage object is not removed while a LUN of a target not
            // torn down serves it. The kernel counts the LUNs serving each
            // (of any fabric): only when it counts more than the targets
            // torn down hold is every target read, for the plan to name
            // the LUN (or, if none of them is an iSCSI one, the count).
            let mut elsewhere = Vec::new();
            for (name, so) in &scan.objects {
                let own = present
                    .targets
                    .values()
                    .flat_map(|t| t.tpgs.values())
                    .flat_map(|tpg| tpg.luns.values())
                    .filter(|l| &l.storage_object == name)
                    .count();
                let hba = so.hba.unwrap_or_default();
                match read::export_count(&self.tree, hba, name)? {
                    Some(count) if u64::from(count) <= own as u64 => {}
                    count => elsewhere.push((name.clone(), count, own)),
                }
            }
            // The other objects count only towards emptying their HBA.
            present.storage_objects = scan
                .hba_of
                .into_iter()
                .map(|(name, hba)| {
                    let so = StorageObject {
                        hba: Some(hba),
                        ..Default::default()
                    };
                    (name, so)
                })
                .collect();
            present.storage_objects.extend(scan.objects);
            if !elsewhere.is_empty() {
                present.targets = read::read_targets(&self.tree)?;
                plan_teardown(&present, teardown)?;
                if let Some((name, Some(count), own)) =
                    elsewhere.into_iter().find(|(_, c, _)| c.is_some())
                {
                    return Err(Error::Conflict(format!(
                        "storage object {name} is served by {count} LUNs (the kernel's count), the targets torn down hold {own}, and no other iSCSI target serves it: a LUN of another fabric does"
                    )));
                }
            }
        }
        let steps = plan_teardown(&present, teardown)?;
        self.run(&steps)?;
        Ok(steps)
    }
}

/// The lowest free HBA indexes (not in `used`) for the desired storage
/// objects that are not present.
fn allocate(
    present: &State,
    desired: &State,
    mut used: std::collections::BTreeSet<u32>,
) -> Result<BTreeMap<StorageObjectName, u32>, Error> {
    let mut out = BTreeMap::new();
    for name in desired.storage_objects.keys() {
        if present.storage_objects.contains_key(name) {
            continue;
        }
        let index = (0..=MAX_HBA_INDEX)
            .find(|i| !used.contains(i))
            .ok_or_else(|| Error::Conflict("no free backstore HBA index".into()))?;
        used.insert(index);
        out.insert(name.clone(), index);
    }
    Ok(out)
}

/// Whether `e` is a mkdir of a new `core/<plugin>_N` folder that another
/// writer created first.
fn lost_hba_race(e: &configfs::Error) -> bool {
    let is_hba = e.step().is_some_and(|(kind, path)| {
        kind == StepKind::Mkdir
            && path
                .parent()
                .and_then(Path::file_name)
                .is_some_and(|p| p == "core")
    });
    is_hba && e.errno() == Some(17)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn apply_allocates_the_lowest_free_index_and_undoes_a_refused_object(
    ) -> Result<(), Box<dyn std::error::Error>> {
        // A plain folder stands in for configfs: it checks paths, ordering
        // and index allocation only (the kernel proves behaviour in the lab).
        let dir = tempfile::tempdir()?;
        let root = dir.path().join("target");
        fs::create_dir_all(root.join("core/iblock_0/theirs"))?;
        fs::create_dir_all(root.join("core/fileio_1/other"))?;
        fs::write(root.join("core/iblock_0/theirs/udev_path"), "/dev/sdz\n")?;
        fs::write(root.join("core/iblock_0/theirs/enable"), "1\n")?;
        let lio = Lio::with_tree(Tree::at(&root)).with_lock_file(dir.path().join("lock"));
        let name = StorageObjectName::new("mine")?;
        let mut desired = State::default();
        desired.storage_objects.insert(
            name.clone(),
            StorageObject {
                udev_path: "/dev/zd0".into(),
                ..Default::default()
            },
        );
        // A plain folder has no attribute files, so the first write fails:
        // the object gets the lowest index free of every backstore type (2),
        // and the refused object is removed again.
        let err = lio
            .apply(&desired)
            .err()
            .ok_or("write into a missing file succeeded")?;
        assert!(
            err.to_string().contains("core/iblock_2/mine/control"),
            "{err}"
        );
        assert!(
            !root.join("core/iblock_2").exists(),
            "the refused new object was removed again"
        );
        assert!(dir.path().join("lock").exists());
        Ok(())
    }

    #[test]
    fn an_empty_iblock_hba_left_by_a_crash_is_removed_and_its_index_reused(
    ) -> Result<(), Box<dyn std::error::Error>> {
        // A crash between `mkdir core/iblock_1` and its storage object left
        // the HBA empty; the next creation removes it (holding the lock) and
        // takes the lowest free index again, 1, not 2. Other HBAs stay.
        let dir = tempfile::tempdir()?;
        let root = dir.path().join("target");
        fs::create_dir_all(root.join("core/iblock_0/theirs"))?;
        fs::create_dir_all(root.join("core/iblock_1"))?;
        fs::create_dir_all(root.join("core/fileio_3"))?;
        let lio = Lio::with_tree(Tree::at(&root)).with_lock_file(dir.path().join("lock"));
        let mut desired = State::default();
        desired.storage_objects.insert(
            StorageObjectName::new("mine")?,
            StorageObject {
                udev_path: "/dev/zd0".into(),
                ..Default::default()
            },
        );
        let err = lio
            .apply(&desired)
            .err()
            .ok_or("write into a missing file succeeded")?;
        assert!(
            err.to_string().contains("core/iblock_1/mine/control"),
            "{err}"
        );
        assert!(!root.join("core/iblock_1").exists(), "{err}");
        assert!(root.join("core/iblock_0/theirs").exists());
        assert!(root.join("core/fileio_3").exists(), "only iblock HBAs");
        Ok(())
    }

    /// A target `t` in a plain folder: TPG 1 whose LUN 0 links
    /// `core/iblock_0/vol`.
    fn target_serving_vol(root: &Path, t: &str) -> std::io::Result<()> {
        let tpg = root.join(format!("iscsi/iqn.2026-01.org.example:{t}/tpgt_1"));
        for dir in ["attrib", "np", "acls", "lun/lun_0"] {
            fs::create_dir_all(tpg.join(dir))?;
        }
        for a in [
            "authentication",
            "generate_node_acls",
            "demo_mode_write_protect",
            "cache_dynamic_acls",
        ] {
            fs::write(tpg.join(format!("attrib/{a}")), "0\n")?;
        }
        fs::write(tpg.join("enable"), "1\n")?;
        std::os::unix::fs::symlink(
            root.join("core/iblock_0/vol"),
            tpg.join("lun/lun_0/storage"),
        )
    }

    #[test]
    fn a_storage_object_served_elsewhere_is_not_torn_down() -> Result<(), Box<dyn std::error::Error>>
    {
        // The kernel counts 2 LUNs serving `vol` (statistics/scsi_dev/ports);
        // the target torn down holds one. Another iSCSI target holding the
        // other is named; when none does, the count is.
        let dir = tempfile::tempdir()?;
        let root = dir.path();
        fs::create_dir_all(root.join("core/iblock_0/vol/statistics/scsi_dev"))?;
        fs::write(
            root.join("core/iblock_0/vol/statistics/scsi_dev/ports"),
            "2\n",
        )?;
        target_serving_vol(root, "a")?;
        let lio = Lio::with_tree(Tree::at(root));
        let down = Teardown {
            targets: [Iqn::new("iqn.2026-01.org.example:a")?].into(),
            storage_objects: [StorageObjectName::new("vol")?].into(),
        };
        let err = lio.teardown(&down).err().ok_or("teardown went ahead")?;
        assert!(err.to_string().contains("another fabric"), "{err}");
        target_serving_vol(root, "b")?;
        let err = lio.teardown(&down).err().ok_or("teardown went ahead")?;
        assert!(
            err.to_string().contains("iqn.2026-01.org.example:b"),
            "{err}"
        );
        assert!(root.join("core/iblock_0/vol").exists());
        assert!(root.join("iscsi/iqn.2026-01.org.example:a/tpgt_1").exists());
        Ok(())
    }

    #[test]
    fn a_lost_hba_race_is_recognised() {
        let e = configfs::Error::Io {
            kind: StepKind::Mkdir,
            path: "/sys/kernel/config/target/core/iblock_3".into(),
            source: std::io::Error::from_raw_os_error(17),
        };
        assert!(lost_hba_race(&e));
        let e = configfs::Error::Io {
            kind: StepKind::Mkdir,
            path: "/sys/kernel/config/target/core/iblock_3/x".into(),
            source: std::io::Error::from_raw_os_error(17),
        };
        assert!(!lost_hba_race(&e));
    }
}
