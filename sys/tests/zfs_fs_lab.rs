//! `sys::zfs` filesystems against the real ZFS of the kernel lab (`make lab
//! FILTER=zfs_fs_lab`), each result cross-checked with the `zfs` CLI and
//! the mount table (tests only; the library runs no process).
use pillar_csi_lab::{
    nfs::{fill, zget, FsParent},
    run, Lab, Result,
};
use sys::zfs::{DatasetName, DatasetType, Error, FilesystemSpec, Zfs};

const MIB: u64 = 1 << 20;

/// Whether the kernel's mount table has a zfs mount of `ds` at `at`.
fn mounted(ds: &str, at: &std::path::Path) -> Result<bool> {
    let table = std::fs::read_to_string("/proc/self/mounts")?;
    Ok(table.lines().any(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        f.len() > 2 && f[0] == ds && f[1] == at.to_string_lossy() && f[2] == "zfs"
    }))
}

#[test]
#[ignore = "needs the kernel lab"]
fn zfs_fs_lab_create_mount_quota_grow_and_destroy() -> Result<()> {
    let lab = Lab::get();
    let zfs = Zfs::open()?;
    let made = FsParent::create(&lab, "fsq")?;
    let (parent, parent_at) = (DatasetName::below_pool(&made.dataset)?, made.at.clone());
    let name = parent.child("vol1")?;
    let ds = name.to_string();
    let mut spec = FilesystemSpec::new(name.clone(), 32 * MIB);
    spec.properties.push(("compression".into(), "off".into()));
    zfs.create_filesystem(&spec)?;

    // Created with its quota, mounted where the parent puts it.
    assert_eq!(zget(&ds, "type")?, "filesystem");
    assert_eq!(zget(&ds, "refquota")?, (32 * MIB).to_string());
    assert_eq!(zget(&ds, "quota")?, "0", "quota stays unset");
    assert_eq!(zget(&ds, "compression")?, "off");
    let at = parent_at.join("vol1");
    assert!(mounted(&ds, &at)?, "{ds} mounted at {}", at.display());
    let stats = zfs.filesystem_stats(&name)?;
    assert_eq!(stats.refquota, 32 * MIB);
    assert_eq!(stats.mounted_at.as_deref(), Some(at.as_path()));
    assert_eq!(stats.guid.to_string(), zget(&ds, "guid")?);
    assert_eq!(zfs.dataset_type(&name)?, DatasetType::Filesystem);

    // The kernel enforces the quota: a write past it fails with EDQUOT.
    let err = fill(&at.join("big"), 48).expect_err("48 MiB into a 32 MiB refquota");
    assert_eq!(err.raw_os_error(), Some(122), "EDQUOT, got {err}");
    std::fs::remove_file(at.join("big"))?;

    // Grown, never shrunk; the same quota again is no change.
    zfs.set_refquota(&name, 64 * MIB)?;
    assert_eq!(zget(&ds, "refquota")?, (64 * MIB).to_string());
    zfs.set_refquota(&name, 64 * MIB)?;
    match zfs.set_refquota(&name, 16 * MIB) {
        Err(Error::Shrink { current, .. }) => assert_eq!(current, 64 * MIB),
        other => panic!("shrink must be refused, got {other:?}"),
    }
    assert_eq!(zget(&ds, "refquota")?, (64 * MIB).to_string());
    fill(&at.join("fits"), 40)?;

    // Mount again is no change; destroy of a mounted filesystem is
    // refused until it is unmounted.
    assert_eq!(zfs.mount(&name)?, at);
    assert!(zfs.destroy(&name).is_err(), "a mounted filesystem is busy");
    assert!(mounted(&ds, &at)?);
    zfs.unmount(&name)?;
    assert!(!mounted(&ds, &at)?);
    zfs.unmount(&name)?;
    zfs.destroy(&name)?;
    assert!(!zfs.exists(&ds));
    Ok(())
}

#[test]
#[ignore = "needs the kernel lab"]
fn zfs_fs_lab_bad_filesystems_are_refused_and_leave_nothing() -> Result<()> {
    let lab = Lab::get();
    let zfs = Zfs::open()?;
    let made = FsParent::create(&lab, "fsbad")?;
    let parent = DatasetName::below_pool(&made.dataset)?;
    let before = run("zfs", &["list", "-H", "-o", "name", "-r", parent.as_str()])?;
    let refused = |spec: FilesystemSpec, expect: &str| -> Result<()> {
        let err = zfs
            .create_filesystem(&spec)
            .expect_err("a bad filesystem must be refused");
        assert!(err.to_string().contains(expect), "{err} lacks {expect:?}");
        Ok(())
    };
    let child = parent.child("bad")?;
    refused(FilesystemSpec::new(child.clone(), 0), "must not be 0")?;
    for (property, expect) in [
        ("quota", "refquota"),
        ("refreservation", "refquota"),
        ("mountpoint", "inherited"),
        ("sharenfs", "exports are made by their caller"),
        ("volblocksize", "does not apply to filesystems"),
        ("compression", "is not a value of compression"),
    ] {
        let mut spec = FilesystemSpec::new(child.clone(), 8 * MIB);
        let value = if property == "compression" {
            "fast"
        } else {
            "1M"
        };
        spec.properties.push((property.into(), value.into()));
        refused(spec, expect)?;
    }
    // A parent ZFS does not mount: the child cannot be mounted, and the
    // create undoes itself.
    let unmounted = format!("{}/{}", lab.pool, lab.unique("fsnone"));
    run("zfs", &["create", "-o", "mountpoint=none", &unmounted])?;
    let orphan = DatasetName::below_pool(&format!("{unmounted}/child"))?;
    refused(FilesystemSpec::new(orphan.clone(), 8 * MIB), "mountpoint")?;
    assert!(
        !zfs.exists(orphan.as_str()),
        "the failed create left nothing"
    );
    // A volume is not a filesystem.
    let zvol = format!("{}/{}", lab.pool, lab.unique("fszvol"));
    run("zfs", &["create", "-V", "8M", &zvol])?;
    match zfs.filesystem_stats(&DatasetName::below_pool(&zvol)?) {
        Err(Error::WrongType { found, .. }) => assert_eq!(found, DatasetType::Volume),
        other => panic!("a zvol's filesystem stats must be refused, got {other:?}"),
    }
    let after = run("zfs", &["list", "-H", "-o", "name", "-r", parent.as_str()])?;
    assert_eq!(before, after, "nothing was created under {parent}");
    Ok(())
}
