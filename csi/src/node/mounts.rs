//! Mounts through mount(2) and umount(2) (rustix; no `mount` program), and
//! the mount table (`/proc/self/mountinfo`) as the truth of what is mounted
//! where: every mount call is preceded by a look at it, which is what makes
//! Stage and Publish idempotent.
use super::error::{Error, Result};
use rustix::mount::{mount, mount_bind, mount_remount, unmount, MountFlags, UnmountFlags};
use std::{
    ffi::CString,
    path::{Path, PathBuf},
};
use sys::block::{unescape, DevNum};

/// One line of the mount table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// The mounted device's number (`major:minor`; for a bind mount of a
    /// device node, the number of the filesystem holding the node).
    pub devnum: DevNum,
    /// The path inside the filesystem that is mounted (`/` for a whole
    /// filesystem, else the bound subtree or file).
    pub root: PathBuf,
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// Whether this mount is read-only.
    pub read_only: bool,
    /// Whether the filesystem itself is read-only (its super options): the
    /// kernel remounts ext4 so after an I/O or journal error, whatever the
    /// mounts' own flags say.
    pub fs_read_only: bool,
    /// The filesystem type.
    pub fs_type: String,
    /// The mount source (`/dev/nvme0n1`, `udev`, ...).
    pub source: String,
}

/// Parses mountinfo text (see proc(5)).
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let f: Vec<&str> = left.split(' ').collect();
            let r: Vec<&str> = right.split(' ').collect();
            Some(MountEntry {
                devnum: f.get(2)?.parse().ok()?,
                root: unescape(f.get(3)?).into(),
                mount_point: unescape(f.get(4)?).into(),
                read_only: f.get(5)?.split(',').any(|o| o == "ro"),
                fs_read_only: r.get(2).is_some_and(|o| o.split(',').any(|o| o == "ro")),
                fs_type: (*r.first()?).to_owned(),
                source: unescape(r.get(1)?),
            })
        })
        .collect()
}

/// The mount table of this process.
pub fn mount_table() -> Result<Vec<MountEntry>> {
    let path = "/proc/self/mountinfo";
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    Ok(parse_mountinfo(&text))
}

/// The topmost mount at `path` (the last one listed wins, as the kernel
/// resolves stacked mounts), if any. The path is resolved first (symbolic
/// links, `.`/`..`, a trailing `/`), as the kernel lists mount points; a
/// path that does not resolve is compared as given.
pub fn mount_at(path: &Path) -> Result<Option<MountEntry>> {
    let resolved = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
    Ok(mount_table()?
        .into_iter()
        .rev()
        .find(|m| m.mount_point == resolved))
}

/// Mount options split into mount(2) flags and the filesystem's data string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// The flags (`ro`, `noatime`, ...).
    pub flags: MountFlags,
    /// What the filesystem parses itself (`discard`, `nouuid`, ...),
    /// comma-separated.
    pub data: String,
}

/// Splits CSI mount flags (`["noatime", "discard"]`) into flags and data.
/// Flags that clear a default (`rw`, `atime`, `defaults`...) are dropped.
pub fn split_options(options: &[String]) -> Result<Options> {
    let mut flags = MountFlags::empty();
    let mut data = Vec::new();
    for option in options.iter().flat_map(|o| o.split(',')) {
        let flag = match option.trim() {
            "" | "defaults" | "rw" | "atime" | "suid" | "dev" | "exec" | "async" => continue,
            "ro" => MountFlags::RDONLY,
            "noatime" => MountFlags::NOATIME,
            "nodiratime" => MountFlags::NODIRATIME,
            "relatime" => MountFlags::RELATIME,
            "strictatime" => MountFlags::STRICTATIME,
            "lazytime" => MountFlags::LAZYTIME,
            "nosuid" => MountFlags::NOSUID,
            "nodev" => MountFlags::NODEV,
            "noexec" => MountFlags::NOEXEC,
            "sync" => MountFlags::SYNCHRONOUS,
            "dirsync" => MountFlags::DIRSYNC,
            "bind" | "rbind" | "remount" | "move" => {
                return Err(Error::invalid(format!(
                    "mount flag {option:?} is not allowed in a volume capability"
                )))
            }
            other => {
                data.push(other.to_owned());
                continue;
            }
        };
        flags |= flag;
    }
    Ok(Options {
        flags,
        data: data.join(","),
    })
}

impl Options {
    /// These options with filesystem option `option` added, unless given.
    pub fn with_data(mut self, option: &str) -> Self {
        if !self.data.split(',').any(|o| o == option) {
            if !self.data.is_empty() {
                self.data.push(',');
            }
            self.data.push_str(option);
        }
        self
    }
}

fn io(what: &str, path: &Path) -> impl FnOnce(rustix::io::Errno) -> Error {
    let what = format!("{what} {}", path.display());
    move |e| Error::io(what, std::io::Error::from(e))
}

/// Mounts the `fs_type` filesystem of `device` at `target`.
pub fn mount_filesystem(
    device: &Path,
    target: &Path,
    fs_type: &str,
    options: &Options,
) -> Result<()> {
    let data = CString::new(options.data.as_str())
        .map_err(|_| Error::invalid("a mount flag contains a NUL byte"))?;
    let data = (!options.data.is_empty()).then_some(data.as_c_str());
    mount(device, target, fs_type, options.flags, data).map_err(io(
        &format!("mounting {} ({fs_type}) at", device.display()),
        target,
    ))
}

/// Bind-mounts `source` (a folder, or a device node) onto `target`,
/// read-only when asked (a bind mount takes `ro` only on a remount).
pub fn bind(source: &Path, target: &Path, read_only: bool) -> Result<()> {
    mount_bind(source, target).map_err(io(
        &format!("bind-mounting {} onto", source.display()),
        target,
    ))?;
    if read_only {
        if let Err(e) = mount_remount(target, MountFlags::BIND | MountFlags::RDONLY, "") {
            let _ = unmount(target, UnmountFlags::empty());
            return Err(io("remounting read-only", target)(e));
        }
    }
    Ok(())
}

/// Unmounts `target`; `lazy` detaches it at once even while busy
/// (`MNT_DETACH`).
pub fn unmount_path(target: &Path, lazy: bool) -> Result<()> {
    let flags = if lazy {
        UnmountFlags::DETACH
    } else {
        UnmountFlags::empty()
    };
    unmount(target, flags).map_err(io("unmounting", target))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_mount_is_found_by_any_spelling_of_its_path() {
        // /proc is a mount point wherever these tests run.
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("proc-link");
        std::os::unix::fs::symlink("/proc", &link).unwrap();
        for spelling in [
            Path::new("/proc"),
            Path::new("/proc/"),
            Path::new("/proc/self/.."),
            &link,
        ] {
            let m = mount_at(spelling).unwrap();
            assert_eq!(
                m.map(|m| m.fs_type).as_deref(),
                Some("proc"),
                "{}",
                spelling.display()
            );
        }
        assert_eq!(mount_at(dir.path()).unwrap(), None);
    }

    #[test]
    fn a_filesystem_option_is_added_once() {
        let none = split_options(&[]).unwrap().with_data("nouuid");
        assert_eq!(none.data, "nouuid");
        let some = split_options(&["noatime".into(), "discard".into()])
            .unwrap()
            .with_data("nouuid");
        assert_eq!(
            (some.flags, some.data.as_str()),
            (MountFlags::NOATIME, "discard,nouuid")
        );
        let given = split_options(&["nouuid".into()])
            .unwrap()
            .with_data("nouuid");
        assert_eq!(given.data, "nouuid");
    }

    const TABLE: &str = "\
22 1 259:0 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
95 22 259:3 / /var/lib/kubelet/plugins/staging/pv\\0401 rw,noatime shared:50 - xfs /dev/nvme0n1 rw,attr2
96 22 259:3 / /var/lib/kubelet/pods/a/volumes/pv1/mount ro,noatime shared:50 - xfs /dev/nvme0n1 rw,attr2
97 22 0:5 /nvme1n1 /var/lib/kubelet/pods/b/volumeDevices/pv2 rw,nosuid shared:2 - devtmpfs udev rw,size=1k
98 22 259:4 / /var/lib/kubelet/plugins/staging/pv3 rw,noatime shared:51 - ext4 /dev/nvme2n1 ro,errors=remount-ro
";

    #[test]
    fn mountinfo_lines_are_read_with_escapes_and_bind_roots() {
        let t = parse_mountinfo(TABLE);
        assert_eq!(t.len(), 5);
        assert!(!t[1].fs_read_only);
        assert!(
            t[4].fs_read_only && !t[4].read_only,
            "remounted after an error"
        );
        assert_eq!(
            t[1].mount_point,
            Path::new("/var/lib/kubelet/plugins/staging/pv 1")
        );
        assert_eq!(
            t[1].devnum,
            DevNum {
                major: 259,
                minor: 3
            }
        );
        assert_eq!((t[1].fs_type.as_str(), t[1].read_only), ("xfs", false));
        assert!(t[2].read_only);
        assert_eq!(t[3].root, Path::new("/nvme1n1"));
        assert_eq!(t[3].source, "udev");
    }

    #[test]
    fn csi_mount_flags_split_into_flags_and_data() {
        let o = split_options(&[
            "noatime,ro".into(),
            "discard".into(),
            "nouuid".into(),
            "rw".into(),
        ])
        .unwrap();
        assert_eq!(o.flags, MountFlags::NOATIME | MountFlags::RDONLY);
        assert_eq!(o.data, "discard,nouuid");
        let e = split_options(&["bind".into()]).unwrap_err();
        assert!(e.message.contains("\"bind\""), "{e}");
    }
}
