//! Filesystems made and mounted on a test's block device.
use crate::{run, Result};
use std::{
    fs,
    path::{Path, PathBuf},
};

/// An ext4 filesystem mounted for a test; unmounted (lazily) when dropped
/// unless [`Mounted::unmount`] ran.
#[derive(Debug)]
pub struct Mounted {
    /// The mount point.
    pub dir: PathBuf,
    mounted: bool,
}

impl Mounted {
    /// Makes an ext4 filesystem of `size` (an `mkfs.ext4` size such as
    /// `32M`, so the rest of the device stays free) on `dev`.
    pub fn mkfs(dev: &Path, size: &str) -> Result<()> {
        run("mkfs.ext4", &["-q", "-F", &dev.to_string_lossy(), size])?;
        Ok(())
    }

    /// Mounts the ext4 filesystem of `dev` on `dir` (created if missing)
    /// with mount `options` (`rw`, `ro`, ...).
    pub fn mount(dev: &Path, dir: PathBuf, options: &str) -> Result<Self> {
        fs::create_dir_all(&dir)?;
        run(
            "mount",
            &[
                "-t",
                "ext4",
                "-o",
                options,
                &dev.to_string_lossy(),
                &dir.to_string_lossy(),
            ],
        )?;
        Ok(Self { dir, mounted: true })
    }

    /// Unmounts it.
    pub fn unmount(mut self) -> Result<()> {
        self.mounted = false;
        run("umount", &[&self.dir.to_string_lossy()])?;
        Ok(())
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if self.mounted {
            let _ = run("umount", &["-l", &self.dir.to_string_lossy()]);
        }
    }
}
