//! NodeExpandVolume and NodeGetVolumeStats: a staged volume's size, growth
//! and health.
use super::error::{Error, Kind, Result};
use super::format::{device_size, grow};
use super::mounts::mount_at;
use super::record::{Phase, StagingRecord};
use super::share::{is_share, share_at};
use super::stage::devnum;
use super::Node;
use std::{
    path::Path,
    time::{Duration, Instant},
};

/// How long NodeExpandVolume waits for the device to show its new size.
pub const SIZE_WAIT: Duration = Duration::from_secs(60);
/// How often the size is read while waiting (a rescan is asked every
/// [`RESCAN_EVERY`]).
const SIZE_POLL: Duration = Duration::from_millis(100);
/// How often the kernel is asked to read the size again while waiting.
const RESCAN_EVERY: Duration = Duration::from_secs(2);

/// Bytes and inodes of a mounted filesystem, or the size of a block volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    /// `(total, available, used)` bytes.
    pub bytes: (u64, u64, u64),
    /// `(total, available, used)` inodes; `None` for a block volume.
    pub inodes: Option<(u64, u64, u64)>,
}

/// What NodeGetVolumeStats reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stats {
    /// The usage, when the volume is healthy enough to read it.
    pub usage: Option<Usage>,
    /// Why the volume is abnormal, `None` when it is not.
    pub abnormal: Option<String>,
}

/// Why `path` does not hold the filesystem of staged volume `r` (its
/// device's), `None` when it does: the staging mount lost (unmounted by
/// hand, an Unstage that failed half-way) leaves an empty folder on the
/// node's own disk, which no pod may write into and no resize may grow.
pub(super) fn not_holding(r: &StagingRecord, path: &Path) -> Result<Option<String>> {
    let device = r.device.clone().ok_or_else(|| {
        Error::internal(format!("staging record of {} has no device", r.volume_id))
    })?;
    let dev = devnum(&device)?;
    Ok(match mount_at(path)? {
        Some(m) if m.devnum == dev => None,
        Some(m) => Some(format!(
            "{} has {} ({}) mounted, not {} of volume {}",
            path.display(),
            m.source,
            m.fs_type,
            device.display(),
            r.volume_id
        )),
        None => Some(format!(
            "nothing is mounted at {}, where volume {} ({}) should be",
            path.display(),
            r.volume_id,
            device.display()
        )),
    })
}

/// Why the staged filesystem of `r` is read-only though its Stage did not
/// ask for it (the kernel remounted it after an I/O or journal error: every
/// write of the pod fails), `None` otherwise.
pub(super) fn read_only_unasked(r: &StagingRecord) -> Result<Option<String>> {
    if r.mount_flags.iter().any(|f| f == "ro") {
        return Ok(None);
    }
    Ok(mount_at(&r.staging_path)?
        .filter(|m| m.fs_read_only)
        .map(|m| {
            format!(
                "the {} filesystem on {} is read-only though staged read-write: the kernel remounts it so after an I/O or journal error (see the node's kernel log)",
                m.fs_type, m.source
            )
        }))
}

/// Refuses work on a filesystem volume whose staging path does not hold
/// its filesystem ([`not_holding`]).
pub(super) fn check_staging_mount(r: &StagingRecord) -> Result<()> {
    if r.fs_type.is_none() {
        return Ok(());
    }
    match not_holding(r, &r.staging_path)? {
        None => Ok(()),
        Some(why) => Err(Error::precondition(format!(
            "{why}: the staging mount is gone; NodeUnstageVolume and NodeStageVolume the volume again"
        ))),
    }
}

impl Node {
    fn staged(&self, volume_id: &str) -> Result<StagingRecord> {
        self.records
            .load(volume_id)?
            .filter(|r| r.phase == Phase::Staged)
            .ok_or_else(|| {
                Error::new(
                    Kind::NotFound,
                    format!("volume {volume_id} is not staged on this node"),
                )
            })
    }

    /// NodeExpandVolume: waits (rescanning) until the device is at least
    /// `required_bytes`, then grows its filesystem online; returns the
    /// device's size.
    pub fn expand(&self, volume_id: &str, required_bytes: u64) -> Result<u64> {
        self.volume_locks.with(volume_id, || {
            let record = self.staged(volume_id)?;
            if is_share(&record) {
                return Err(Error::invalid(format!(
                    "volume {volume_id} is a filesystem volume ({}): it grows on the storage node (ControllerExpandVolume), and its nodes have nothing to grow",
                    record.protocol
                )));
            }
            let device = self.attacher.verified_device(&record)?;
            check_staging_mount(&record)?;
            let disk = device
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let start = Instant::now();
            let mut rescanned: Option<Instant> = None;
            let size = loop {
                let size = device_size(&device)?;
                if size >= required_bytes {
                    break size;
                }
                if start.elapsed() >= SIZE_WAIT {
                    return Err(Error::new(
                        Kind::Timeout,
                        format!(
                            "{} is {size} bytes, still less than {required_bytes} after {SIZE_WAIT:?}",
                            device.display()
                        ),
                    ));
                }
                if rescanned.is_none_or(|t| t.elapsed() >= RESCAN_EVERY) {
                    self.attacher.rescan(&record, &disk)?;
                    rescanned = Some(Instant::now());
                }
                std::thread::sleep(SIZE_POLL);
            };
            if let Some(fs_type) = &record.fs_type {
                grow(&record.staging_path, fs_type, size)?;
            }
            Ok(size)
        })
    }

    /// NodeGetVolumeStats for the volume published or staged at
    /// `volume_path`.
    pub fn stats(&self, volume_id: &str, volume_path: &Path) -> Result<Stats> {
        let record = self.staged(volume_id)?;
        if !volume_path.exists() {
            return Err(Error::new(
                Kind::NotFound,
                format!("{} does not exist", volume_path.display()),
            ));
        }
        let abnormal = match self.attacher.verified_device(&record) {
            _ if is_share(&record) => share_at(&record, volume_path)?.err(),
            Err(e) => Some(e.message),
            Ok(_) => match self.attacher.abnormal(&record) {
                Some(why) => Some(why),
                None if record.fs_type.is_some() => match not_holding(&record, volume_path)? {
                    Some(why) => Some(why),
                    None => read_only_unasked(&record)?,
                },
                None => None,
            },
        };
        if abnormal.is_some() {
            return Ok(Stats {
                usage: None,
                abnormal,
            });
        }
        let usage = match &record.fs_type {
            None => {
                let size = device_size(&self.attacher.verified_device(&record)?)?;
                Usage {
                    bytes: (size, 0, size),
                    inodes: None,
                }
            }
            Some(_) => {
                let s = rustix::fs::statvfs(volume_path)
                    .map_err(|e| Error::io(format!("statvfs {}", volume_path.display()), e))?;
                let block = s.f_frsize;
                Usage {
                    bytes: (
                        s.f_blocks * block,
                        s.f_bavail * block,
                        (s.f_blocks - s.f_bfree) * block,
                    ),
                    inodes: Some((s.f_files, s.f_ffree, s.f_files - s.f_ffree)),
                }
            }
        };
        Ok(Stats {
            usage: Some(usage),
            abnormal: None,
        })
    }
}
