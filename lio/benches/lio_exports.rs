//! Benchmark in the kernel lab: iSCSI exports of block devices through this
//! crate, as the agent makes them (one iblock storage object and one target
//! with TPG 1, LUN 0 and a portal, in demo mode: agent/src/export/iscsi.rs),
//! against their floor and the peers the way CLI drivers serve requests.
//!
//! - Floor: the same configfs objects made in-process with `std::fs` calls
//!   only (the kernel's work, no reads, no planning, no checks), for one
//!   export and one unexport, in blocks alternating with ours.
//! - Peers: one `bash` per export doing its mkdir / echo / ln (as
//!   targetcli users' scripts and drivers shelling out do), one after
//!   another and `CONCURRENT` at once, against ours from as many threads.
//!
//! Run with `make bench FILTER=lio`. Each export needs a device of its own
//! (iblock opens it exclusively): loop devices over sparse files, made
//! before and removed after the timings. Absolute times under TCG mean
//! little; the ratios are the result.
use lio::{
    Iqn, Lio, Lun, State, Step, StorageObject, StorageObjectName, Target, Teardown, Tpg,
    TpgAttributes, TpgLun, Tpgt,
};
use pillar_csi_lab::{bench, run, Lab, Result};
use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
};

/// Blocks of the floor comparison, and exports in each block.
const BLOCKS: usize = 20;
const PER_BLOCK: usize = 5;
/// Exports made at once by the concurrent peer and by ours.
const CONCURRENT: usize = 50;
const BENCH_IQN: &str = "iqn.2026-01.com.bhyoo.pillar-csi.bench:";
const PORTAL: &str = "127.0.0.1:3261";
/// The HBA index of the first bare export of each set made by steps (ours
/// takes the lowest free ones, as rtslib does).
const FLOOR_HBA: u32 = 1000;
const SHELL_HBA: u32 = 2000;

/// The exports of this bench: storage object `bench-<set>-<k>` on a loop
/// device of its own, served by target `<BENCH_IQN><set>-<k>`.
struct Exports {
    lio: Lio,
    /// Loop devices: the first half for ours, the peers and the threads,
    /// the second for the floor (present beside ours), then the anchor.
    devices: Vec<PathBuf>,
    portal: SocketAddr,
}

impl Exports {
    fn names(set: &str, k: usize) -> Result<(Iqn, StorageObjectName)> {
        Ok((
            Iqn::new(&format!("{BENCH_IQN}{set}-{k}"))?,
            StorageObjectName::new(&format!("bench-{set}-{k}"))?,
        ))
    }

    fn device(&self, set: &str, k: usize) -> Result<&Path> {
        let half = self.devices.len() / 2;
        let i = match set {
            "floor" => k + half,
            "anchor" => 2 * half + k,
            _ => k,
        };
        Ok(self.devices.get(i).ok_or("too few loop devices")?)
    }

    fn hba(set: &str, k: usize) -> Result<u32> {
        let first = match set {
            "floor" => FLOOR_HBA,
            "shell" => SHELL_HBA,
            _ => return Err(format!("set {set} is made by ours, not by steps").into()),
        };
        Ok(first + u32::try_from(k)?)
    }

    /// The state the agent applies for an export without ACL (its
    /// `desired_state`): TPG 1 in demo mode on the portal, LUN 0.
    fn desired(&self, set: &str, k: usize) -> Result<State> {
        let (iqn, object) = Self::names(set, k)?;
        let mut tpg = Tpg {
            enabled: true,
            attributes: TpgAttributes::open(),
            ..Default::default()
        };
        tpg.portals.insert(self.portal);
        tpg.luns.insert(Lun(0), TpgLun::new(object.clone()));
        let mut target = Target::default();
        target.tpgs.insert(Tpgt::new(1)?, tpg);
        let mut state = State::default();
        state.storage_objects.insert(
            object,
            StorageObject {
                udev_path: self.device(set, k)?.to_path_buf(),
                ..Default::default()
            },
        );
        state.targets.insert(iqn, target);
        Ok(state)
    }
}

impl bench::Exports for Exports {
    fn root(&self) -> &Path {
        Path::new(lio::DEFAULT_ROOT)
    }

    /// As the agent per ExportVolume: one apply that first ends the
    /// sessions of initiators losing access.
    fn export(&self, set: &str, k: usize) -> Result<()> {
        self.lio.apply_revoking(&self.desired(set, k)?)?;
        Ok(())
    }

    /// As the agent per UnexportVolume: the target and its storage object
    /// torn down together.
    fn unexport(&self, set: &str, k: usize) -> Result<()> {
        let (iqn, object) = Self::names(set, k)?;
        self.lio.teardown(&Teardown {
            targets: [iqn].into(),
            storage_objects: [object].into(),
        })?;
        Ok(())
    }

    /// The steps this crate takes for a new export, in its order.
    fn export_steps(&self, set: &str, k: usize) -> Result<Vec<Step>> {
        let (iqn, object) = Self::names(set, k)?;
        let hba = format!("core/iblock_{}", Self::hba(set, k)?);
        let so = format!("{hba}/{object}");
        let dev = self.device(set, k)?.display().to_string();
        let tpg = format!("iscsi/{iqn}/tpgt_1");
        let mut steps = vec![
            Step::mkdir(&hba),
            Step::mkdir(&so),
            Step::write(format!("{so}/control"), format!("udev_path={dev}")),
            Step::write(format!("{so}/control"), "readonly=0"),
            Step::write(format!("{so}/udev_path"), dev),
            Step::write(format!("{so}/enable"), "1"),
            Step::mkdir(format!("iscsi/{iqn}")),
            Step::mkdir(&tpg),
            Step::mkdir(format!("{tpg}/lun/lun_0")),
            Step::symlink(&so, format!("{tpg}/lun/lun_0/storage")),
            Step::mkdir(format!("{tpg}/np/{}", lio::portal_dir(&self.portal))),
        ];
        for (attr, value) in [
            ("authentication", "0"),
            ("generate_node_acls", "1"),
            ("demo_mode_write_protect", "0"),
            ("cache_dynamic_acls", "1"),
        ] {
            steps.push(Step::write(format!("{tpg}/attrib/{attr}"), value));
        }
        steps.push(Step::write(format!("{tpg}/enable"), "1"));
        Ok(steps)
    }

    /// The steps this crate's teardown takes for an export.
    fn unexport_steps(&self, set: &str, k: usize) -> Result<Vec<Step>> {
        let (iqn, object) = Self::names(set, k)?;
        let hba = format!("core/iblock_{}", Self::hba(set, k)?);
        let tpg = format!("iscsi/{iqn}/tpgt_1");
        Ok(vec![
            Step::write(format!("{tpg}/enable"), "0"),
            Step::unlink(format!("{tpg}/lun/lun_0/storage")),
            Step::rmdir(format!("{tpg}/lun/lun_0")),
            Step::rmdir(format!("{tpg}/np/{}", lio::portal_dir(&self.portal))),
            Step::rmdir(&tpg),
            Step::rmdir(format!("iscsi/{iqn}")),
            Step::rmdir(format!("{hba}/{object}")),
            Step::rmdir(hba),
        ])
    }

    fn present(&self, set: &str) -> Result<usize> {
        let state = self.lio.read()?;
        let prefix = format!("{BENCH_IQN}{set}-");
        Ok(state
            .targets
            .iter()
            .filter(|(iqn, t)| {
                iqn.as_str().starts_with(&prefix)
                    && t.tpgs.values().any(|tpg| {
                        tpg.enabled
                            && tpg.luns.get(&Lun(0)).is_some_and(|l| {
                                state
                                    .storage_objects
                                    .get(&l.storage_object)
                                    .is_some_and(|so| so.enabled)
                            })
                    })
            })
            .count())
    }
}

/// `count` loop devices over sparse files in `dir`.
fn loop_devices(dir: &Path, count: usize) -> Result<Vec<PathBuf>> {
    (0..count)
        .map(|i| {
            let file = dir.join(format!("disk{i}.img"));
            std::fs::File::create(&file)?.set_len(1 << 20)?;
            let dev = run("losetup", &["-f", "--show", &file.display().to_string()])?;
            Ok(PathBuf::from(dev.trim()))
        })
        .collect()
}

fn main() -> Result<()> {
    if !bench::selected("lio_exports") {
        return Ok(());
    }
    println!("lio_exports: {}", bench::conditions());
    let lab = Lab::get();
    let dir = tempfile::tempdir_in(&lab.work)?;
    let n = BLOCKS * PER_BLOCK;
    // Ours and the floor side by side, and the anchor (see
    // bench::floor_and_peers).
    let devices = loop_devices(dir.path(), 2 * n.max(CONCURRENT) + 1)?;
    let lio = Lio::open()?;
    // The fabric folder, made once as the first export of the agent does.
    if !lio.tree().exists("iscsi") {
        lio.tree().run(&[Step::mkdir("iscsi")])?;
    }
    let exports = Exports {
        lio,
        devices,
        portal: PORTAL.parse()?,
    };
    let figures = bench::floor_and_peers(&exports, BLOCKS, PER_BLOCK, CONCURRENT);
    // Whatever a failed run left is removed before its devices.
    let left = exports.lio.read()?;
    exports.lio.teardown(&Teardown {
        targets: left
            .targets
            .into_keys()
            .filter(|t| t.as_str().starts_with(BENCH_IQN))
            .collect(),
        storage_objects: left
            .storage_objects
            .into_keys()
            .filter(|o| o.as_str().starts_with("bench-"))
            .collect(),
    })?;
    for dev in &exports.devices {
        run("losetup", &["-d", &dev.display().to_string()])?;
    }
    let figures = figures?;
    println!(
        "lio_exports: iSCSI exports of loop devices (iblock storage object, target, TPG 1 in demo mode, LUN 0, portal {PORTAL}); {n} of ours and {n} bare, in {BLOCKS} alternating blocks"
    );
    for line in figures.lines("  ") {
        println!("{line}");
    }
    println!("lio_exports: done; {}", bench::conditions());
    Ok(())
}
