//! `sys::quota` against the kernel lab's XFS and ext4 (`make lab
//! FILTER=quota_lab`): a directory put in a project with a limit is a
//! filesystem of the limit's size to statfs, a write past the limit fails
//! (XFS: ENOSPC for anyone; ext4: EDQUOT, but only for a writer without
//! CAP_SYS_RESOURCE), a raised limit lets it go on; each limit
//! cross-checked with `xfs_quota` on XFS (tests only; the library runs no
//! process).
use pillar_csi_lab::{project_fs::ProjectFs, Lab, Result};
use std::process::Command;
use std::{fs, io::Write, path::Path};
use sys::quota::{self, Error, Project, Usage};

const MIB: u64 = 1 << 20;

/// Writes `mib` MiB to `path` (synced); the error of the first write or
/// sync that fails.
fn write_mib(path: &Path, mib: u64) -> std::io::Result<()> {
    let mut f = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    let block = vec![0x5au8; MIB as usize];
    for _ in 0..mib {
        f.write_all(&block)?;
    }
    f.sync_all()
}

/// The total size statfs reports for `dir`, in bytes.
fn statfs_total(dir: &Path) -> Result<u64> {
    let st = rustix::fs::statvfs(dir)?;
    Ok(st.f_blocks * st.f_frsize)
}

/// Writes 32 MiB to `file` as root; the write must fail with ENOSPC (what
/// XFS answers for a project's limit, as EDQUOT for its other limits).
fn root_is_stopped_with_enospc(file: &Path) -> Result<()> {
    let err = write_mib(file, 32).expect_err("a write past the limit fails");
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    Ok(())
}

/// Writes 32 MiB to `file` as the user nobody (`setpriv`, no capability):
/// `dd` must stop at EDQUOT.
fn nobody_is_stopped_with_edquot(file: &Path) -> Result<()> {
    let dir = file.parent().ok_or("a file in a directory")?;
    fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o777))?;
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "dd"])
        .arg("if=/dev/zero")
        .arg(format!("of={}", file.display()))
        .args(["bs=1M", "count=32", "conv=fsync"])
        .env("LC_ALL", "C")
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "dd past the limit: {stderr}");
    assert!(stderr.contains("Disk quota exceeded"), "{stderr}");
    Ok(())
}

/// The whole life of a project directory on one filesystem: assigned,
/// bounded, filled until `overflow` sees its write refused, raised,
/// unbounded.
fn project_life(
    at: &Path,
    id: u32,
    overflow: &dyn Fn(&Path) -> Result<()>,
    cross_check: &dyn Fn(u32) -> Result<u64>,
) -> Result<()> {
    let dir = at.join("vol1");
    fs::create_dir(&dir)?;
    assert_eq!(
        quota::project(&dir)?,
        Project {
            id: 0,
            inherit: false
        }
    );
    assert_eq!(
        quota::usage(&dir, id)?.limit_bytes,
        0,
        "a new project has no limit"
    );

    quota::assign(&dir, id)?;
    quota::assign(&dir, id)?; // a second time changes nothing
    assert_eq!(quota::project(&dir)?, Project { id, inherit: true });
    fs::create_dir(dir.join("sub"))?;
    assert_eq!(
        quota::project(&dir.join("sub"))?,
        Project { id, inherit: true },
        "what is made inside joins the project"
    );

    quota::set_limit(&dir, id, 24 * MIB)?;
    assert_eq!(quota::usage(&dir, id)?.limit_bytes, 24 * MIB);
    assert_eq!(cross_check(id)?, 24 * MIB);
    assert_eq!(
        statfs_total(&dir)?,
        24 * MIB,
        "statfs of a project directory reports its limit"
    );

    // Past the limit: the write fails, and the usage stays within it.
    let file = dir.join("sub/data");
    overflow(&file)?;
    let Usage {
        used_bytes,
        used_inodes,
        ..
    } = quota::usage(&dir, id)?;
    assert!(
        (16 * MIB..=24 * MIB).contains(&used_bytes),
        "usage {used_bytes} within the limit and near it"
    );
    assert!(used_inodes >= 3, "vol1, sub and data: {used_inodes}");

    // A raised limit: the writer goes on.
    quota::set_limit(&dir, id, 48 * MIB)?;
    assert_eq!(quota::usage(&dir, id)?.limit_bytes, 48 * MIB);
    assert_eq!(cross_check(id)?, 48 * MIB);
    write_mib(&dir.join("more"), 8)?;
    assert_eq!(statfs_total(&dir)?, 48 * MIB);

    // Removed: no limit, the data stays.
    quota::set_limit(&dir, id, 0)?;
    assert_eq!(quota::usage(&dir, id)?.limit_bytes, 0);
    assert!(fs::metadata(&file)?.len() > 0);
    Ok(())
}

#[test]
#[ignore = "needs the kernel lab"]
fn quota_lab_xfs_project_is_bounded_and_raised() -> Result<()> {
    let lab = Lab::get();
    let fs = ProjectFs::xfs(&lab, "qxfs", "prjquota")?;
    project_life(&fs.at, 4242, &root_is_stopped_with_enospc, &|id| {
        fs.xfs_limit(id)
    })
}

#[test]
#[ignore = "needs the kernel lab"]
fn quota_lab_ext4_project_is_bounded_and_raised() -> Result<()> {
    let lab = Lab::get();
    let fs = ProjectFs::new(
        &lab,
        "qext4",
        &["mkfs.ext4", "-q", "-F", "-O", "quota,project"],
        "prjquota",
    )?;
    // No independent reader of ext4 project limits in the lab (quota's
    // repquota is not installed): the usage call and statfs stand for it.
    let at = fs.at.clone();
    project_life(&fs.at, 4243, &nobody_is_stopped_with_edquot, &|id| {
        Ok(quota::usage(&at, id)?.limit_bytes)
    })?;
    // Root passes an ext4 project's limit (the kernel's quota code lets
    // CAP_SYS_RESOURCE past hard limits; XFS does not): why directory
    // volumes, exported with no_root_squash, are served from XFS only.
    let dir = fs.at.join("vol2");
    fs::create_dir(&dir)?;
    quota::assign(&dir, 4244)?;
    quota::set_limit(&dir, 4244, 4 * MIB)?;
    write_mib(&dir.join("data"), 8)?;
    assert!(quota::usage(&dir, 4244)?.used_bytes >= 8 * MIB);
    Ok(())
}

#[test]
#[ignore = "needs the kernel lab"]
fn quota_lab_a_filesystem_mounted_without_prjquota_is_refused() -> Result<()> {
    let lab = Lab::get();
    let fs = ProjectFs::xfs(&lab, "qoff", "defaults")?;
    let err = quota::set_limit(&fs.at, 7, MIB).expect_err("no project quotas");
    assert!(matches!(err, Error::NotEnforced { .. }), "{err:?}");
    assert!(err.to_string().contains("prjquota"), "{err}");
    assert!(matches!(
        quota::usage(&fs.at, 7),
        Err(Error::NotEnforced { .. })
    ));
    Ok(())
}
