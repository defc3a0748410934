//! Filesystems with project quotas for the lab's directory volumes: XFS
//! or ext4 on a loop device over a sparse file in the work folder, made
//! and mounted with the CLI (tests only), and `xfs_quota` as the
//! independent reader of a project's limit.
use crate::{run, Lab, Result};
use std::{
    fs,
    path::{Path, PathBuf},
};

const MIB: u64 = 1 << 20;

/// A filesystem on a loop device, mounted; unmounted and detached when
/// dropped.
#[derive(Debug)]
pub struct ProjectFs {
    dev: String,
    /// Where it is mounted.
    pub at: PathBuf,
    image: PathBuf,
    options: String,
}

impl ProjectFs {
    /// Makes a 320 MiB filesystem with `mkfs` (the program and its flags,
    /// the device is added) and mounts it with mount `options`.
    pub fn new(lab: &Lab, prefix: &str, mkfs: &[&str], options: &str) -> Result<Self> {
        let name = lab.unique(prefix);
        let image = lab.work.join(format!("{name}.img"));
        // mkfs.xfs makes nothing under 300 MiB.
        fs::File::create(&image)?.set_len(320 * MIB)?;
        let dev = run("losetup", &["-f", "--show", &image.to_string_lossy()])?
            .trim()
            .to_owned();
        let made = Self {
            dev,
            at: std::env::temp_dir().join(&name),
            image,
            options: options.to_owned(),
        };
        let mut args = mkfs[1..].to_vec();
        args.push(&made.dev);
        run(mkfs[0], &args)?;
        fs::create_dir_all(&made.at)?;
        made.mount()?;
        Ok(made)
    }

    /// Mounts it at [`ProjectFs::at`] with its options (again, after
    /// [`ProjectFs::unmount`]: what a storage node's boot does).
    pub fn mount(&self) -> Result<()> {
        run(
            "mount",
            &["-o", &self.options, &self.dev, &self.at.to_string_lossy()],
        )?;
        Ok(())
    }

    /// Unmounts it (what a storage node's power cycle leaves).
    pub fn unmount(&self) -> Result<()> {
        run("umount", &[&self.at.to_string_lossy()])?;
        Ok(())
    }

    /// An XFS mounted with `options` (`prjquota` to enforce project
    /// quotas).
    pub fn xfs(lab: &Lab, prefix: &str, options: &str) -> Result<Self> {
        Self::new(lab, prefix, &["mkfs.xfs", "-q", "-f"], options)
    }

    /// Project `id`'s hard block limit as `xfs_quota` reports it, in bytes
    /// (XFS only).
    pub fn xfs_limit(&self, id: u32) -> Result<u64> {
        xfs_quota_limit(&self.at, id)
    }

    /// What an operator does before adopting directory `dir` (XFS only):
    /// puts its tree in project `id` with the inherit flag (`xfs_quota
    /// project -s`) and sets the project's hard limit to `mib` MiB.
    pub fn xfs_project(&self, dir: &Path, id: u32, mib: u64) -> Result<()> {
        let at = self.at.to_string_lossy();
        let setup = format!("project -s -p {} {id}", dir.display());
        run("xfs_quota", &["-x", "-c", &setup, &at])?;
        let limit = format!("limit -p bhard={mib}m {id}");
        run("xfs_quota", &["-x", "-c", &limit, &at])?;
        Ok(())
    }
}

/// Project `id`'s hard block limit on the XFS mounted at `at`, as
/// `xfs_quota` reports it, in bytes.
pub fn xfs_quota_limit(at: &Path, id: u32) -> Result<u64> {
    let out = run(
        "xfs_quota",
        &["-x", "-c", "report -p -b -N -n", &at.to_string_lossy()],
    )?;
    // `#<id> <used> <soft> <hard> <warn/grace>` in KiB, one line for each
    // project with a limit or a file.
    let wanted = format!("#{id}");
    let Some(line) = out
        .lines()
        .find(|l| l.split_whitespace().next() == Some(wanted.as_str()))
    else {
        return Ok(0);
    };
    let hard: u64 = line
        .split_whitespace()
        .nth(3)
        .and_then(|f| f.parse().ok())
        .ok_or_else(|| format!("no hard limit in xfs_quota's {line:?}"))?;
    Ok(hard * 1024)
}

/// The project ID of `path` as `xfs_io` reads it (`lsproj`).
pub fn project_of(path: &Path) -> Result<u32> {
    let out = run("xfs_io", &["-r", "-c", "lsproj", &path.to_string_lossy()])?;
    // `projid = 1234`
    Ok(out
        .rsplit('=')
        .next()
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| format!("no project ID in xfs_io's {out:?}"))?)
}

impl Drop for ProjectFs {
    fn drop(&mut self) {
        let _ = run("umount", &[&self.at.to_string_lossy()]);
        let _ = run("losetup", &["-d", &self.dev]);
        let _ = fs::remove_file(&self.image);
        let _ = fs::remove_dir(&self.at);
    }
}
