//! sys::block against the real kernel: each kind of user of a device is
//! made with independent tools (mkfs + mount, dmsetup, an O_EXCL opener) or
//! with the lio and nvmet crates, and the usage report must name it. Run by
//! the lab runner (`tests/lab/run tests -- block_`).
use pillar_csi_lab::{block::wait_for, run, Lab, Result};
use std::{
    fs,
    io::{Seek, SeekFrom, Write},
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
    sync::mpsc,
    time::Duration,
};
use sys::block::{Exclusive, Host};

/// A 64 MiB thin LV (set-up with the CLI); removed when dropped.
struct ThinLv {
    vg_lv: String,
    dev: PathBuf,
}

impl ThinLv {
    fn new(lab: &Lab, prefix: &str) -> Result<Self> {
        let name = lab.unique(prefix);
        let pool = format!("{}/{}", lab.vg, lab.thin_pool);
        run(
            "lvcreate",
            &["-q", "-y", "-V", "64M", "-T", &pool, "-n", &name],
        )?;
        let dev = PathBuf::from(format!("/dev/{}/{name}", lab.vg));
        wait_for(&dev, Duration::from_secs(20))?;
        Ok(Self {
            vg_lv: format!("{}/{name}", lab.vg),
            dev,
        })
    }
}

impl Drop for ThinLv {
    fn drop(&mut self) {
        let _ = run("lvremove", &["-q", "-y", &self.vg_lv]);
    }
}

/// A 64 MiB zvol (set-up with the CLI); destroyed when dropped.
struct Zvol {
    dataset: String,
    dev: PathBuf,
}

impl Zvol {
    fn new(lab: &Lab, prefix: &str) -> Result<Self> {
        let dataset = format!("{}/{}", lab.pool, lab.unique(prefix));
        run("zfs", &["create", "-V", "64M", &dataset])?;
        let dev = PathBuf::from(format!("/dev/zvol/{dataset}"));
        wait_for(&dev, Duration::from_secs(20))?;
        Ok(Self { dataset, dev })
    }
}

impl Drop for Zvol {
    fn drop(&mut self) {
        let _ = run("zfs", &["destroy", &self.dataset]);
    }
}

/// A mount made with mount(8); unmounted when dropped.
struct Mounted(PathBuf);

impl Mounted {
    fn new(lab: &Lab, dev: &Path) -> Result<Self> {
        run("mkfs.ext4", &["-q", "-F", &dev.to_string_lossy()])?;
        let point = PathBuf::from("/tmp").join(lab.unique("mnt"));
        fs::create_dir_all(&point)?;
        run("mount", &[&dev.to_string_lossy(), &point.to_string_lossy()])?;
        Ok(Self(point))
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = run("umount", &[&self.0.to_string_lossy()]);
    }
}

#[test]
#[ignore = "needs the kernel lab"]
fn block_idle_device_is_idle_with_its_size() -> Result<()> {
    let lab = Lab::get();
    let host = Host::default();
    let lv = ThinLv::new(&lab, "blk-idle")?;
    let zv = Zvol::new(&lab, "blk-idle")?;
    for dev in [&lv.dev, &zv.dev] {
        let usage = host.usage(dev)?;
        assert!(usage.is_idle(), "{}: {:?}", dev.display(), usage.reasons());
        assert_eq!(usage.exclusive, Exclusive::Free);
        assert_eq!(host.size_bytes(&usage.device)?, 64 << 20);
        let canonical = fs::canonicalize(dev)?;
        assert_eq!(
            Path::new("/dev").join(&usage.device.name),
            canonical,
            "the kernel name is the node the symlink points at"
        );
    }
    Ok(())
}

#[test]
#[ignore = "needs the kernel lab"]
fn block_mount_of_the_device_is_reported() -> Result<()> {
    let lab = Lab::get();
    let lv = ThinLv::new(&lab, "blk-mnt")?;
    let mounted = Mounted::new(&lab, &lv.dev)?;
    let usage = Host::default().usage(&lv.dev)?;
    assert_eq!(usage.mounts.len(), 1, "{usage:#?}");
    assert_eq!(usage.mounts[0].mount_point, mounted.0);
    assert_eq!(usage.mounts[0].fs_type, "ext4");
    assert_eq!(usage.exclusive, Exclusive::Busy);
    assert!(usage.holders.is_empty() && usage.lio.is_empty() && usage.nvmet.is_empty());
    assert!(usage.reasons().iter().any(|r| r.contains("is mounted at")));
    drop(mounted);
    assert!(
        Host::default().usage(&lv.dev)?.is_idle(),
        "idle again after umount"
    );
    Ok(())
}

/// Writes a DOS partition table with one partition from 1 MiB to 33 MiB,
/// and has the kernel read it.
fn partition(dev: &Path) -> Result<()> {
    let mut mbr = [0u8; 512];
    let entry = &mut mbr[446..462];
    entry[4] = 0x83;
    entry[8..12].copy_from_slice(&2048u32.to_le_bytes());
    entry[12..16].copy_from_slice(&65536u32.to_le_bytes());
    mbr[510] = 0x55;
    mbr[511] = 0xAA;
    let mut f = fs::OpenOptions::new().write(true).open(dev)?;
    f.seek(SeekFrom::Start(0))?;
    f.write_all(&mbr)?;
    f.sync_all()?;
    drop(f);
    run("blockdev", &["--rereadpt", &dev.to_string_lossy()])?;
    Ok(())
}

#[test]
#[ignore = "needs the kernel lab"]
fn block_mount_of_a_partition_is_reported_for_the_whole_device() -> Result<()> {
    let lab = Lab::get();
    let zv = Zvol::new(&lab, "blk-part")?;
    partition(&zv.dev)?;
    let host = Host::default();
    let whole = host.device(&zv.dev)?;
    let mut parts = Vec::new();
    for _ in 0..100 {
        parts = host.partitions(&whole)?;
        if !parts.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        parts.len(),
        1,
        "the kernel saw one partition of {}",
        whole.name
    );
    wait_for(&parts[0].path, Duration::from_secs(20))?;
    assert_eq!(host.size_bytes(&parts[0])?, 32 << 20);
    let mounted = Mounted::new(&lab, &parts[0].path)?;
    let usage = host.usage(&zv.dev)?;
    assert_eq!(usage.mounts.len(), 1, "{usage:#?}");
    assert_eq!(usage.mounts[0].device, parts[0].name);
    assert_eq!(usage.mounts[0].mount_point, mounted.0);
    assert!(!usage.is_idle());
    assert_eq!(
        usage.exclusive,
        Exclusive::Busy,
        "a mounted partition claims the disk"
    );
    Ok(())
}

#[test]
#[ignore = "needs the kernel lab"]
fn block_device_mapper_holder_is_reported() -> Result<()> {
    let lab = Lab::get();
    let zv = Zvol::new(&lab, "blk-dm")?;
    let name = lab.unique("pillar-dm");
    let table = format!("0 {} linear {} 0", 64 * 2048, zv.dev.display());
    run("dmsetup", &["create", &name, "--table", &table])?;
    let usage = Host::default().usage(&zv.dev);
    let _ = run("dmsetup", &["remove", &name]);
    let usage = usage?;
    assert_eq!(usage.holders.len(), 1, "{usage:#?}");
    assert_eq!(usage.holders[0].dm_name.as_deref(), Some(name.as_str()));
    assert!(usage.holders[0].holder.starts_with("dm-"));
    assert_eq!(usage.exclusive, Exclusive::Busy);
    assert!(usage.mounts.is_empty() && usage.lio.is_empty() && usage.nvmet.is_empty());
    assert!(usage
        .reasons()
        .iter()
        .any(|r| r.contains("device-mapper holders")));
    assert!(
        Host::default().usage(&zv.dev)?.is_idle(),
        "idle after dmsetup remove"
    );
    Ok(())
}

#[test]
#[ignore = "needs the kernel lab"]
fn block_lio_storage_object_is_reported_by_any_name_of_the_device() -> Result<()> {
    let lab = Lab::get();
    let zv = Zvol::new(&lab, "blk-lio")?;
    let target = lio::Lio::open()?;
    let name = lio::StorageObjectName::new(&lab.unique("blk-lio"))?;
    let mut desired = lio::State::default();
    desired.storage_objects.insert(
        name.clone(),
        lio::StorageObject {
            udev_path: zv.dev.clone(),
            ..Default::default()
        },
    );
    target.apply(&desired)?;
    let canonical = fs::canonicalize(&zv.dev)?;
    let by_link = Host::default().usage(&zv.dev);
    let by_node = Host::default().usage(&canonical);
    target.teardown(&lio::Teardown {
        storage_objects: [name.clone()].into(),
        ..Default::default()
    })?;
    for usage in [by_link?, by_node?] {
        assert_eq!(usage.lio.len(), 1, "{usage:#?}");
        assert_eq!(usage.lio[0].name, name.as_str());
        assert_eq!(usage.lio[0].udev_path, zv.dev);
        assert!(usage.lio[0].backstore.starts_with("iblock_"));
        assert_eq!(
            usage.exclusive,
            Exclusive::Busy,
            "LIO iblock claims the device"
        );
        assert!(usage.mounts.is_empty() && usage.holders.is_empty() && usage.nvmet.is_empty());
    }
    assert!(
        Host::default().usage(&zv.dev)?.is_idle(),
        "idle after teardown"
    );
    Ok(())
}

#[test]
#[ignore = "needs the kernel lab"]
fn block_nvmet_namespace_is_reported_though_nvmet_does_not_claim() -> Result<()> {
    let lab = Lab::get();
    let lv = ThinLv::new(&lab, "blk-nvmet")?;
    let target = nvmet::Nvmet::open()?;
    let nqn = nvmet::Nqn::new(&format!(
        "nqn.2026-01.com.bhyoo.pillar-csi.lab:{}",
        lab.unique("blk")
    ))?;
    let mut sub = nvmet::Subsystem {
        allow_any_host: true,
        ..Default::default()
    };
    sub.namespaces.insert(
        nvmet::Nsid::new(3)?,
        nvmet::Namespace {
            device_path: lv.dev.clone(),
            enabled: true,
            ..Default::default()
        },
    );
    let mut desired = nvmet::State::default();
    desired.subsystems.insert(nqn.clone(), sub);
    target.apply(&desired)?;
    // The LV's /dev/<vg>/<lv> link and its /dev/dm-N node are one device.
    let usage = Host::default().usage(fs::canonicalize(&lv.dev)?);
    target.teardown(&nvmet::Teardown {
        subsystems: [nqn.clone()].into(),
        ..Default::default()
    })?;
    let usage = usage?;
    assert_eq!(usage.nvmet.len(), 1, "{usage:#?}");
    assert_eq!(usage.nvmet[0].subsystem, nqn.as_str());
    assert_eq!(usage.nvmet[0].nsid, "3");
    assert_eq!(usage.nvmet[0].device_path, lv.dev);
    assert_eq!(
        usage.exclusive,
        Exclusive::Free,
        "nvmet does not claim the device: only the scan finds it"
    );
    assert!(!usage.is_idle());
    assert!(usage.reasons().iter().any(|r| r.contains("still exports")));
    Ok(())
}

#[test]
#[ignore = "needs the kernel lab"]
fn block_exclusive_opener_is_reported_and_released() -> Result<()> {
    let lab = Lab::get();
    let lv = ThinLv::new(&lab, "blk-excl")?;
    let (opened_tx, opened_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let dev = lv.dev.clone();
    let holder = std::thread::spawn(move || -> std::io::Result<()> {
        let f = fs::OpenOptions::new()
            .read(true)
            .custom_flags(0o200) // O_EXCL
            .open(&dev)?;
        let _ = opened_tx.send(());
        let _ = release_rx.recv();
        drop(f);
        Ok(())
    });
    opened_rx.recv_timeout(Duration::from_secs(10))?;
    let usage = Host::default().usage(&lv.dev);
    let _ = release_tx.send(());
    holder.join().map_err(|_| "holder thread panicked")??;
    let usage = usage?;
    assert_eq!(usage.exclusive, Exclusive::Busy, "{usage:#?}");
    assert!(
        usage.mounts.is_empty()
            && usage.holders.is_empty()
            && usage.lio.is_empty()
            && usage.nvmet.is_empty(),
        "only the probe sees an opener: {usage:#?}"
    );
    assert!(
        Host::default().usage(&lv.dev)?.is_idle(),
        "free once closed"
    );
    Ok(())
}
