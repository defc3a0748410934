//! NodePublishVolume and NodeUnpublishVolume: bind mounts from the staging
//! path (a filesystem) or the device node (a block volume) onto the pod's
//! target path, which the plugin creates and removes.
use super::error::{Error, Kind, Result};
use super::mounts::{bind, mount_at, unmount_path};
use super::record::Phase;
use super::share::{is_share, staged_share};
use super::stage::devnum;
use super::volume::check_staging_mount;
use super::Node;
use std::{
    fs,
    path::{Path, PathBuf},
};

/// One NodePublishVolume call, checked.
#[derive(Debug, Clone)]
pub struct PublishRequest<'a> {
    /// The CSI volume ID.
    pub volume_id: &'a str,
    /// The staging path it was staged at.
    pub staging_path: &'a Path,
    /// The pod's path.
    pub target_path: &'a Path,
    /// Whether the volume is published as a block device.
    pub block: bool,
    /// Read-only.
    pub read_only: bool,
}

impl Node {
    /// NodePublishVolume.
    pub fn publish(&self, req: &PublishRequest<'_>) -> Result<()> {
        self.volume_locks.with(req.volume_id, || {
            let record = self
                .records
                .load(req.volume_id)?
                .filter(|r| r.phase == Phase::Staged)
                .ok_or_else(|| {
                    Error::precondition(format!(
                        "volume {} is not staged on this node: NodeStageVolume first",
                        req.volume_id
                    ))
                })?;
            if record.staging_path != req.staging_path {
                return Err(Error::invalid(format!(
                    "volume {} is staged at {}, not {}",
                    req.volume_id,
                    record.staging_path.display(),
                    req.staging_path.display()
                )));
            }
            if record.fs_type.is_none() != req.block {
                return Err(Error::invalid(format!(
                    "volume {} was staged as {}; it cannot be published as {}",
                    req.volume_id,
                    if req.block {
                        "a filesystem"
                    } else {
                        "a block device"
                    },
                    if req.block {
                        "a block device"
                    } else {
                        "a filesystem"
                    },
                )));
            }
            // What a bind mount of ours looks like in the mount table: the
            // staged filesystem's root, or the device node inside devtmpfs.
            let (source, expect_dev, expect_root): (PathBuf, _, PathBuf) = if is_share(&record) {
                let staged = staged_share(&record)?;
                (record.staging_path.clone(), staged.devnum, staged.root)
            } else {
                check_staging_mount(&record)?;
                let device = self.attacher.verified_device(&record)?;
                if req.block {
                    let node_fs = devnum_of_node_fs(&device)?;
                    let name = device.file_name().map(|n| n.to_string_lossy().into_owned());
                    (
                        device.clone(),
                        node_fs,
                        format!("/{}", name.unwrap_or_default()).into(),
                    )
                } else {
                    (record.staging_path.clone(), devnum(&device)?, "/".into())
                }
            };
            if let Some(m) = mount_at(req.target_path)? {
                if m.devnum == expect_dev && m.root == expect_root && m.read_only == req.read_only {
                    return Ok(());
                }
                return Err(Error::exists(format!(
                    "{} already has {} mounted ({}), not volume {} ({})",
                    req.target_path.display(),
                    m.source,
                    if m.read_only {
                        "read-only"
                    } else {
                        "read-write"
                    },
                    req.volume_id,
                    if req.read_only {
                        "read-only"
                    } else {
                        "read-write"
                    },
                )));
            }
            create_target(req.target_path, req.block)?;
            super::timed("bind", || bind(&source, req.target_path, req.read_only))
        })
    }

    /// NodeUnpublishVolume: unmounts the target path and removes it; a
    /// target that is not there is fine.
    pub fn unpublish(&self, volume_id: &str, target_path: &Path) -> Result<()> {
        self.volume_locks.with(volume_id, || {
            while mount_at(target_path)?.is_some() {
                unmount_path(target_path, false)?;
            }
            let removed = match fs::symlink_metadata(target_path) {
                Ok(m) if m.is_dir() => fs::remove_dir(target_path),
                Ok(_) => fs::remove_file(target_path),
                Err(e) => Err(e),
            };
            match removed {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(Error::io(format!("removing {}", target_path.display()), e)),
            }
        })
    }
}

/// The device number of the filesystem holding a device node (devtmpfs):
/// what the mount table shows for a bind mount of the node.
fn devnum_of_node_fs(device: &Path) -> Result<sys::block::DevNum> {
    use std::os::unix::fs::MetadataExt;
    let meta = fs::metadata(device).map_err(|e| Error::io(device.display(), e))?;
    Ok(sys::block::DevNum::from_rdev(meta.dev()))
}

/// Creates the target: a folder for a filesystem, an empty file for a block
/// device (a bind mount needs the same kind of object on both sides).
fn create_target(target: &Path, block: bool) -> Result<()> {
    let made = if block {
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent).map_err(|e| Error::io(parent.display(), e))?;
        }
        fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(target)
            .map(drop)
    } else {
        fs::create_dir_all(target)
    };
    made.map_err(|e| {
        Error::new(
            Kind::Internal,
            format!("creating {}: {e}", target.display()),
        )
    })
}
