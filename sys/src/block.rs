//! Block devices: identity, size, partitions, and who uses them.
//!
//! [`Host::usage`] answers "is anyone using this device?" in one [`Usage`]
//! report, gathered from five independent sources:
//!
//! - **mounts**: `/proc/self/mountinfo` entries whose device number is the
//!   device's or one of its partitions'. Only this mount namespace is
//!   visible; a mount elsewhere still shows in the exclusive probe.
//! - **holders**: `/sys/dev/block/M:m/holders` of the device and of its
//!   partitions (device-mapper maps, md, bcache...).
//! - **exclusive probe**: an `open(O_RDONLY | O_EXCL)` of the device node,
//!   which the kernel refuses with `EBUSY` while anyone claims the device
//!   (a mounted filesystem, a holder, LIO iblock, another `O_EXCL` opener).
//!   nvmet does *not* claim the device, so its users are found only by the
//!   scan below.
//! - **LIO storage objects** whose `udev_path` (or, when another writer set
//!   only `control`, the `UDEV PATH` in `info`, or the `Major`/`Minor` the
//!   kernel opened) is the device or a partition of it.
//! - **nvmet namespaces** whose `device_path` is the device or a partition.
//!
//! Paths are compared by device number, so `/dev/zvol/tank/v`, `/dev/zd16`,
//! `/dev/vg/lv` and `/dev/dm-3` all match the device they point at.
//!
//! **The report is a moment's truth.** Each source is read once, one after
//! another; a mount, a holder, an export or an opener may appear or go away
//! between two reads and right after the last. A caller that must act on an
//! idle device (adopt it, format it) re-checks under its own lock and keeps
//! the race window short, or holds its own `O_EXCL` open across the action.
//!
//! ```no_run
//! use sys::block::Host;
//!
//! let host = Host::default();
//! let usage = host.usage("/dev/zvol/tank/pvc-1")?;
//! if usage.is_idle() {
//!     println!("{} ({} bytes) is idle", usage.device.name, host.size_bytes(&usage.device)?);
//! } else {
//!     for reason in usage.reasons() {
//!         println!("in use: {reason}");
//!     }
//! }
//! # Ok::<(), sys::block::Error>(())
//! ```
use std::{
    fmt, fs, io,
    os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt},
    path::{Path, PathBuf},
    str::FromStr,
};

/// An error from inspecting a block device.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The device path could not be looked up.
    #[error("block device {path}: {source}")]
    Stat {
        /// The path asked about.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The path exists but is not a block device.
    #[error("{path} is not a block device")]
    NotBlockDevice {
        /// The path asked about.
        path: PathBuf,
    },
    /// A sysfs, procfs or configfs file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file or folder.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A file held text that is not what the kernel writes there.
    #[error("{path} holds {value:?}: {why}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What it held.
        value: String,
        /// What was expected.
        why: String,
    },
}

/// A device number, `major:minor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DevNum {
    /// The major number (the driver).
    pub major: u32,
    /// The minor number (the device of that driver).
    pub minor: u32,
}

impl DevNum {
    /// Decodes a Linux `dev_t` (`st_rdev`), as glibc's `major()`/`minor()` do.
    pub fn from_rdev(rdev: u64) -> Self {
        Self {
            major: (((rdev >> 32) & 0xffff_f000) | ((rdev >> 8) & 0x0fff)) as u32,
            minor: (((rdev >> 12) & 0xffff_ff00) | (rdev & 0x00ff)) as u32,
        }
    }
}

impl fmt::Display for DevNum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

impl FromStr for DevNum {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (major, minor) = s
            .trim()
            .split_once(':')
            .ok_or_else(|| format!("{s:?} is not major:minor"))?;
        Ok(Self {
            major: major.parse().map_err(|_| format!("bad major in {s:?}"))?,
            minor: minor.parse().map_err(|_| format!("bad minor in {s:?}"))?,
        })
    }
}

/// A block device, found by a path that may be a symlink to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockDevice {
    /// The path it was looked up by (for example `/dev/zvol/tank/v`).
    pub path: PathBuf,
    /// Its device number.
    pub devnum: DevNum,
    /// The kernel's name for it (`zd16`, `dm-3`, `sda1`), from sysfs.
    pub name: String,
}

/// Whether the device can be claimed exclusively right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exclusive {
    /// `open(O_RDONLY | O_EXCL)` succeeded (and the descriptor was closed).
    Free,
    /// The kernel answered `EBUSY`: something claims the device.
    Busy,
    /// The probe failed for another reason (the text says which).
    Unknown(String),
}

/// A mount of the device or of one of its partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The kernel name of the mounted device (the device or a partition).
    pub device: String,
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// The filesystem type.
    pub fs_type: String,
}

/// A device stacked on the device or one of its partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The kernel name of the held device (the device or a partition).
    pub of: String,
    /// The holder's kernel name (`dm-3`, `md0`).
    pub holder: String,
    /// The device-mapper name of the holder, when it is a dm device.
    pub dm_name: Option<String>,
}

/// A LIO storage object that serves the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LioUser {
    /// The backstore (HBA) folder, `iblock_0`.
    pub backstore: String,
    /// The storage object's name.
    pub name: String,
    /// Its udev_path, as written there.
    pub udev_path: PathBuf,
}

/// An nvmet namespace that exports the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmetUser {
    /// The subsystem NQN.
    pub subsystem: String,
    /// The namespace ID.
    pub nsid: String,
    /// Its device_path, as written there.
    pub device_path: PathBuf,
}

/// Who uses a block device: the one report both import and inspection use.
///
/// A moment's truth: see the [module documentation](self).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    /// The device asked about.
    pub device: BlockDevice,
    /// Its partitions, whose users count as the device's.
    pub partitions: Vec<BlockDevice>,
    /// Mounts of the device or its partitions in this mount namespace.
    pub mounts: Vec<Mount>,
    /// Devices stacked on it or its partitions.
    pub holders: Vec<Holder>,
    /// The exclusive-open probe of the device.
    pub exclusive: Exclusive,
    /// LIO storage objects serving it.
    pub lio: Vec<LioUser>,
    /// nvmet namespaces exporting it.
    pub nvmet: Vec<NvmetUser>,
}

impl Usage {
    /// Idle: no mount, holder, LIO or nvmet user, and the exclusive probe
    /// succeeded. An [`Exclusive::Unknown`] probe is not idle.
    pub fn is_idle(&self) -> bool {
        self.mounts.is_empty()
            && self.holders.is_empty()
            && self.lio.is_empty()
            && self.nvmet.is_empty()
            && self.exclusive == Exclusive::Free
    }

    /// One sentence per user, for refusal messages.
    pub fn reasons(&self) -> Vec<String> {
        let dev = self.device.path.display();
        let mut out = Vec::new();
        for u in &self.lio {
            out.push(format!(
                "LIO backstore {}/{} still points at {}",
                u.backstore,
                u.name,
                u.udev_path.display()
            ));
        }
        for u in &self.nvmet {
            out.push(format!(
                "nvmet subsystem {} namespace {} still exports {}",
                u.subsystem,
                u.nsid,
                u.device_path.display()
            ));
        }
        for m in &self.mounts {
            out.push(format!(
                "device {dev} is mounted at {} ({} on {})",
                m.mount_point.display(),
                m.fs_type,
                m.device
            ));
        }
        if !self.holders.is_empty() {
            let names: Vec<String> = self
                .holders
                .iter()
                .map(|h| match &h.dm_name {
                    Some(n) => format!("{} ({n}) on {}", h.holder, h.of),
                    None => format!("{} on {}", h.holder, h.of),
                })
                .collect();
            out.push(format!(
                "device {dev} has device-mapper holders in sysfs: {}",
                names.join(", ")
            ));
        }
        match &self.exclusive {
            Exclusive::Free => {}
            Exclusive::Busy => out.push(format!(
                "device {dev} is held exclusively (mounted, exported, or opened by another consumer)"
            )),
            Exclusive::Unknown(why) => {
                out.push(format!("device {dev}: the exclusive-open probe failed: {why}"))
            }
        }
        out
    }
}

/// Where the host's kernel interfaces are; [`Host::default`] is the real
/// host, other roots serve tests and tools that inspect a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// sysfs (`/sys`).
    pub sys: PathBuf,
    /// The mount table (`/proc/self/mountinfo`).
    pub mountinfo: PathBuf,
    /// LIO's storage objects (`/sys/kernel/config/target/core`).
    pub lio_core: PathBuf,
    /// nvmet's subsystems (`/sys/kernel/config/nvmet/subsystems`).
    pub nvmet_subsystems: PathBuf,
}

impl Default for Host {
    fn default() -> Self {
        Self {
            sys: "/sys".into(),
            mountinfo: "/proc/self/mountinfo".into(),
            lio_core: "/sys/kernel/config/target/core".into(),
            nvmet_subsystems: "/sys/kernel/config/nvmet/subsystems".into(),
        }
    }
}

/// The device number of the block device at `path` (symlinks followed), or
/// `None` when it is missing or not a block device.
fn devnum_of(path: &Path) -> Option<DevNum> {
    let meta = fs::metadata(path).ok()?;
    meta.file_type()
        .is_block_device()
        .then(|| DevNum::from_rdev(meta.rdev()))
}

fn read_text(path: &Path) -> Result<String, Error> {
    fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_owned(),
        source,
    })
}

/// Names in a folder; an absent folder has none.
fn list(dir: &Path) -> Result<Vec<String>, Error> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(Error::Read {
                path: dir.to_owned(),
                source,
            })
        }
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| Error::Read {
            path: dir.to_owned(),
            source,
        })?;
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    Ok(names)
}

impl Host {
    /// Looks up the block device at `path` (symlinks such as `/dev/zvol/...`
    /// or `/dev/<vg>/<lv>` followed).
    pub fn device(&self, path: impl AsRef<Path>) -> Result<BlockDevice, Error> {
        let path = path.as_ref();
        let meta = fs::metadata(path).map_err(|source| Error::Stat {
            path: path.to_owned(),
            source,
        })?;
        if !meta.file_type().is_block_device() {
            return Err(Error::NotBlockDevice {
                path: path.to_owned(),
            });
        }
        let devnum = DevNum::from_rdev(meta.rdev());
        Ok(BlockDevice {
            path: path.to_owned(),
            devnum,
            name: self.kernel_name(devnum)?,
        })
    }

    fn sysfs_dir(&self, devnum: DevNum) -> PathBuf {
        self.sys.join("dev/block").join(devnum.to_string())
    }

    /// The kernel's name of a device, from the sysfs link `dev/block/M:m`.
    fn kernel_name(&self, devnum: DevNum) -> Result<String, Error> {
        let link = self.sysfs_dir(devnum);
        let target = fs::read_link(&link).map_err(|source| Error::Read {
            path: link.clone(),
            source,
        })?;
        target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| Error::Parse {
                path: link,
                value: target.display().to_string(),
                why: "expected a link to the device's sysfs folder".into(),
            })
    }

    /// The device's size in bytes (sysfs `size` counts 512-byte sectors,
    /// whatever the device's logical block size).
    pub fn size_bytes(&self, dev: &BlockDevice) -> Result<u64, Error> {
        let path = self.sysfs_dir(dev.devnum).join("size");
        let text = read_text(&path)?;
        text.trim()
            .parse::<u64>()
            .ok()
            .and_then(|s| s.checked_mul(512))
            .ok_or_else(|| Error::Parse {
                path,
                value: text.clone(),
                why: "expected a number of 512-byte sectors".into(),
            })
    }

    /// The device's partitions (none for a partition or an unpartitioned
    /// device), each with its `/dev/<name>` path.
    pub fn partitions(&self, dev: &BlockDevice) -> Result<Vec<BlockDevice>, Error> {
        let dir = self.sysfs_dir(dev.devnum);
        let mut out = Vec::new();
        for name in list(&dir)? {
            let part = dir.join(&name);
            if !part.join("partition").is_file() {
                continue;
            }
            let dev_file = part.join("dev");
            let text = read_text(&dev_file)?;
            let devnum = text.parse().map_err(|why| Error::Parse {
                path: dev_file,
                value: text.clone(),
                why,
            })?;
            out.push(BlockDevice {
                path: PathBuf::from("/dev").join(&name),
                devnum,
                name,
            });
        }
        Ok(out)
    }

    /// Devices stacked on `dev` (its sysfs `holders`).
    fn holders_of(&self, dev: &BlockDevice) -> Result<Vec<Holder>, Error> {
        let mut out = Vec::new();
        for holder in list(&self.sysfs_dir(dev.devnum).join("holders"))? {
            let dm_name =
                fs::read_to_string(self.sys.join("class/block").join(&holder).join("dm/name"))
                    .ok()
                    .map(|n| n.trim().to_owned());
            out.push(Holder {
                of: dev.name.clone(),
                holder,
                dm_name,
            });
        }
        Ok(out)
    }

    /// Who uses the device at `path`: see [`Usage`] and the module
    /// documentation for what each source can and cannot see.
    pub fn usage(&self, path: impl AsRef<Path>) -> Result<Usage, Error> {
        let device = self.device(path)?;
        let partitions = self.partitions(&device)?;
        let all: Vec<&BlockDevice> = std::iter::once(&device).chain(&partitions).collect();
        let mut holders = Vec::new();
        for d in &all {
            holders.extend(self.holders_of(d)?);
        }
        let mounts = mounts_of(&read_text(&self.mountinfo)?, &all);
        let lio = lio_users(&self.lio_core, &all, &devnum_of)?;
        let nvmet = nvmet_users(&self.nvmet_subsystems, &all, &devnum_of)?;
        let exclusive = probe_exclusive(&device.path);
        Ok(Usage {
            device,
            partitions,
            mounts,
            holders,
            exclusive,
            lio,
            nvmet,
        })
    }
}

/// Opens the device `O_RDONLY | O_EXCL` and closes it at once.
///
/// For a block device, `O_EXCL` without `O_CREAT` asks the kernel for an
/// exclusive claim: it fails with `EBUSY` while a filesystem, a holder, a
/// target or another exclusive opener has one. The answer holds only for
/// the instant of the call.
pub fn probe_exclusive(path: &Path) -> Exclusive {
    let excl = rustix::fs::OFlags::EXCL.bits() as i32;
    match fs::OpenOptions::new()
        .read(true)
        .custom_flags(excl)
        .open(path)
    {
        Ok(_closed_on_drop) => Exclusive::Free,
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::BUSY.raw_os_error()) => {
            Exclusive::Busy
        }
        Err(e) => Exclusive::Unknown(e.to_string()),
    }
}

/// Undoes mountinfo's octal escapes (`\040` for a space, and so on).
pub fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match octal {
            Some(d) => {
                out.push(
                    d.iter()
                        .fold(0u8, |acc, b| acc.wrapping_mul(8).wrapping_add(b - b'0')),
                );
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mounts in mountinfo text of any of `devices`.
fn mounts_of(mountinfo: &str, devices: &[&BlockDevice]) -> Vec<Mount> {
    let mut out = Vec::new();
    for line in mountinfo.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let (Some(devnum), Some(point)) = (fields.get(2), fields.get(4)) else {
            continue;
        };
        let Ok(devnum) = devnum.parse::<DevNum>() else {
            continue;
        };
        let Some(dev) = devices.iter().find(|d| d.devnum == devnum) else {
            continue;
        };
        let fs_type = fields
            .iter()
            .position(|f| *f == "-")
            .and_then(|i| fields.get(i + 1))
            .map(|s| (*s).to_owned())
            .unwrap_or_default();
        out.push(Mount {
            device: dev.name.clone(),
            mount_point: unescape(point).into(),
            fs_type,
        });
    }
    out
}

/// The value after `key: ` in a LIO `info` attribute.
fn info_value<'a>(info: &'a str, key: &str) -> Option<&'a str> {
    let at = info.find(&format!("{key}: "))? + key.len() + 2;
    info[at..].split_whitespace().next()
}

/// LIO storage objects (of any backstore type under `core`) that serve one
/// of `devices`.
fn lio_users(
    core: &Path,
    devices: &[&BlockDevice],
    resolve: &dyn Fn(&Path) -> Option<DevNum>,
) -> Result<Vec<LioUser>, Error> {
    let mut out = Vec::new();
    for backstore in list(core)? {
        if !backstore.contains('_') {
            continue; // alua and other non-HBA folders
        }
        let hba = core.join(&backstore);
        if !hba.is_dir() {
            continue;
        }
        for name in list(&hba)? {
            let so = hba.join(&name);
            if !so.is_dir() {
                continue;
            }
            let info = fs::read_to_string(so.join("info")).unwrap_or_default();
            let mut udev_path = fs::read_to_string(so.join("udev_path"))
                .unwrap_or_default()
                .trim()
                .to_owned();
            if udev_path.is_empty() {
                udev_path = info_value(&info, "UDEV PATH")
                    .unwrap_or_default()
                    .to_owned();
            }
            let opened = match (info_value(&info, "Major"), info_value(&info, "Minor")) {
                (Some(ma), Some(mi)) => format!("{ma}:{mi}").parse::<DevNum>().ok(),
                _ => None,
            }
            .filter(|d| d.major != 0);
            let named = (!udev_path.is_empty())
                .then(|| resolve(Path::new(&udev_path)))
                .flatten();
            let serves = devices
                .iter()
                .any(|d| Some(d.devnum) == named || Some(d.devnum) == opened);
            if serves {
                out.push(LioUser {
                    backstore: backstore.clone(),
                    name,
                    udev_path: udev_path.into(),
                });
            }
        }
    }
    Ok(out)
}

/// nvmet namespaces whose device_path is one of `devices`.
fn nvmet_users(
    subsystems: &Path,
    devices: &[&BlockDevice],
    resolve: &dyn Fn(&Path) -> Option<DevNum>,
) -> Result<Vec<NvmetUser>, Error> {
    let mut out = Vec::new();
    for subsystem in list(subsystems)? {
        let namespaces = subsystems.join(&subsystem).join("namespaces");
        for nsid in list(&namespaces)? {
            let path = fs::read_to_string(namespaces.join(&nsid).join("device_path"))
                .unwrap_or_default()
                .trim()
                .to_owned();
            if path.is_empty() {
                continue;
            }
            let target = resolve(Path::new(&path));
            if devices.iter().any(|d| Some(d.devnum) == target) {
                out.push(NvmetUser {
                    subsystem: subsystem.clone(),
                    nsid,
                    device_path: path.into(),
                });
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn dev(name: &str, major: u32, minor: u32) -> BlockDevice {
        BlockDevice {
            path: PathBuf::from("/dev").join(name),
            devnum: DevNum { major, minor },
            name: name.into(),
        }
    }

    #[test]
    fn decodes_dev_t_like_glibc() {
        // makedev(253, 3) and makedev(259, 1048577) in glibc's encoding.
        assert_eq!(
            DevNum::from_rdev(0xfd03),
            DevNum {
                major: 253,
                minor: 3
            }
        );
        let big = (259u64 & 0xfff) << 8 | (1_048_577u64 & 0xff) | (1_048_577u64 & !0xff) << 12;
        assert_eq!(
            DevNum::from_rdev(big),
            DevNum {
                major: 259,
                minor: 1_048_577
            }
        );
        assert_eq!(
            "8:17".parse::<DevNum>(),
            Ok(DevNum {
                major: 8,
                minor: 17
            })
        );
        assert!("8".parse::<DevNum>().is_err());
    }

    #[test]
    fn mounts_of_the_device_and_its_partitions_are_found() {
        let info = "\
22 1 8:2 / / rw,relatime shared:1 - ext4 /dev/sda2 rw
30 22 230:16 / /mnt/with\\040space rw - ext4 /dev/zd16 rw
31 22 230:17 / /mnt/part rw shared:5 - xfs /dev/zd16p1 rw
32 22 0:45 / /proc rw - proc proc rw
";
        let whole = dev("zd16", 230, 16);
        let part = dev("zd16p1", 230, 17);
        let m = mounts_of(info, &[&whole, &part]);
        assert_eq!(
            m,
            vec![
                Mount {
                    device: "zd16".into(),
                    mount_point: "/mnt/with space".into(),
                    fs_type: "ext4".into()
                },
                Mount {
                    device: "zd16p1".into(),
                    mount_point: "/mnt/part".into(),
                    fs_type: "xfs".into()
                },
            ]
        );
        assert!(mounts_of(info, &[&dev("sdb", 8, 16)]).is_empty());
    }

    #[test]
    fn lio_and_nvmet_users_are_matched_by_device_number() -> Result<(), Box<dyn std::error::Error>>
    {
        let dir = tempfile::tempdir()?;
        let core = dir.path().join("core");
        let subs = dir.path().join("subsystems");
        // Ours by udev_path through a symlink name, another by info only,
        // one of another device, one unconfigured.
        fs::create_dir_all(core.join("iblock_0/by-link"))?;
        fs::write(
            core.join("iblock_0/by-link/udev_path"),
            "/dev/zvol/tank/v\n",
        )?;
        fs::create_dir_all(core.join("iblock_1/by-info"))?;
        fs::write(core.join("iblock_1/by-info/udev_path"), "")?;
        fs::write(
            core.join("iblock_1/by-info/info"),
            "Status: ACTIVATED\niBlock device: zd16  UDEV PATH: /gone  readonly: 0\n        Major: 230 Minor: 16  CLAIMED: IBLOCK\n",
        )?;
        fs::create_dir_all(core.join("iblock_2/other"))?;
        fs::write(core.join("iblock_2/other/udev_path"), "/dev/sdb\n")?;
        fs::create_dir_all(core.join("fileio_3/blank"))?;
        fs::create_dir_all(core.join("alua/default_lu_gp"))?;
        for (sub, ns, path) in [
            ("nqn.a", "1", "/dev/zd16"),
            ("nqn.a", "2", "/dev/sdb"),
            ("nqn.b", "7", "/dev/zd16p1"),
            ("nqn.c", "1", ""),
        ] {
            let d = subs.join(sub).join("namespaces").join(ns);
            fs::create_dir_all(&d)?;
            fs::write(d.join("device_path"), format!("{path}\n"))?;
        }
        let table: BTreeMap<&str, DevNum> = [
            (
                "/dev/zvol/tank/v",
                DevNum {
                    major: 230,
                    minor: 16,
                },
            ),
            (
                "/dev/zd16",
                DevNum {
                    major: 230,
                    minor: 16,
                },
            ),
            (
                "/dev/zd16p1",
                DevNum {
                    major: 230,
                    minor: 17,
                },
            ),
            (
                "/dev/sdb",
                DevNum {
                    major: 8,
                    minor: 16,
                },
            ),
        ]
        .into();
        let resolve = |p: &Path| table.get(p.to_str()?).copied();
        let whole = dev("zd16", 230, 16);
        let part = dev("zd16p1", 230, 17);
        let lio = lio_users(&core, &[&whole, &part], &resolve)?;
        let names: Vec<&str> = lio.iter().map(|u| u.name.as_str()).collect();
        assert_eq!(names, vec!["by-link", "by-info"]);
        assert_eq!(lio[1].udev_path, PathBuf::from("/gone"));
        let nvmet = nvmet_users(&subs, &[&whole, &part], &resolve)?;
        let found: Vec<(&str, &str)> = nvmet
            .iter()
            .map(|u| (u.subsystem.as_str(), u.nsid.as_str()))
            .collect();
        assert_eq!(found, vec![("nqn.a", "1"), ("nqn.b", "7")]);
        assert!(lio_users(&dir.path().join("absent"), &[&whole], &resolve)?.is_empty());
        Ok(())
    }

    #[test]
    fn sysfs_gives_name_size_partitions_and_holders() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let sys = dir.path();
        let disk = sys.join("devices/virtual/block/zd16");
        fs::create_dir_all(disk.join("zd16p1/holders/dm-4"))?;
        fs::create_dir_all(disk.join("holders/dm-3"))?;
        fs::write(disk.join("size"), "131072\n")?;
        fs::write(disk.join("zd16p1/partition"), "1\n")?;
        fs::write(disk.join("zd16p1/dev"), "230:17\n")?;
        fs::create_dir_all(sys.join("class/block/dm-3/dm"))?;
        fs::write(sys.join("class/block/dm-3/dm/name"), "labvg-x\n")?;
        fs::create_dir_all(sys.join("dev/block"))?;
        std::os::unix::fs::symlink(&disk, sys.join("dev/block/230:16"))?;
        std::os::unix::fs::symlink(disk.join("zd16p1"), sys.join("dev/block/230:17"))?;
        let host = Host {
            sys: sys.to_owned(),
            ..Host::default()
        };
        let whole = BlockDevice {
            name: host.kernel_name(DevNum {
                major: 230,
                minor: 16,
            })?,
            ..dev("zvol/tank/v", 230, 16)
        };
        assert_eq!(whole.name, "zd16");
        assert_eq!(host.size_bytes(&whole)?, 64 << 20);
        let parts = host.partitions(&whole)?;
        assert_eq!(parts, vec![dev("zd16p1", 230, 17)]);
        assert_eq!(
            host.holders_of(&whole)?,
            vec![Holder {
                of: "zd16".into(),
                holder: "dm-3".into(),
                dm_name: Some("labvg-x".into())
            }]
        );
        assert_eq!(host.holders_of(&parts[0])?[0].holder, "dm-4");
        Ok(())
    }

    #[test]
    fn reasons_name_each_user_and_idle_needs_a_free_probe() {
        let mut u = Usage {
            device: dev("zd16", 230, 16),
            partitions: Vec::new(),
            mounts: Vec::new(),
            holders: Vec::new(),
            exclusive: Exclusive::Free,
            lio: Vec::new(),
            nvmet: Vec::new(),
        };
        assert!(u.is_idle() && u.reasons().is_empty());
        u.exclusive = Exclusive::Unknown("EACCES".into());
        assert!(!u.is_idle());
        u.exclusive = Exclusive::Busy;
        u.lio.push(LioUser {
            backstore: "iblock_0".into(),
            name: "v".into(),
            udev_path: "/dev/zvol/tank/v".into(),
        });
        let r = u.reasons();
        assert_eq!(r.len(), 2);
        assert!(r[0].contains("LIO backstore iblock_0/v still points at /dev/zvol/tank/v"));
        assert!(r[1].contains("held exclusively"));
    }

    #[test]
    fn a_missing_path_or_a_regular_file_is_a_clear_error() -> Result<(), Box<dyn std::error::Error>>
    {
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("plain");
        fs::write(&file, "x")?;
        let host = Host::default();
        assert!(matches!(
            host.device(&file),
            Err(Error::NotBlockDevice { .. })
        ));
        let err = host
            .device(dir.path().join("absent"))
            .err()
            .ok_or("found")?;
        assert!(err.to_string().contains("absent"), "{err}");
        assert_eq!(
            probe_exclusive(&dir.path().join("absent")),
            Exclusive::Unknown(io::Error::from_raw_os_error(2).to_string())
        );
        Ok(())
    }
}
