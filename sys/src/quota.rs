//! Project quotas on XFS and ext4, in-process, through the kernel's
//! interfaces (what `xfs_quota` and `setquota -P` call):
//!
//! - a directory's project: `FS_IOC_FSGETXATTR`/`FS_IOC_FSSETXATTR`
//!   (`struct fsxattr`'s `fsx_projid`, and `FS_XFLAG_PROJINHERIT` so that
//!   what is made inside joins the project);
//! - a project's limit and usage: `quotactl_fd(2)` (Linux 5.14) with
//!   `Q_GETQUOTA`/`Q_SETQUOTA` of type `PRJQUOTA`, on a descriptor of any
//!   directory of the filesystem, so no device path is needed (a loop
//!   device, a mount namespace of its own).
//!
//! The filesystem must enforce project quotas: XFS mounted with `prjquota`
//! (or `pquota`), ext4 made with `-O quota,project` and mounted with
//! `prjquota`. Both then report a directory of the project, to `statfs` and
//! to NFS clients, as a filesystem of the limit's size, and a write past the
//! limit fails with `EDQUOT`.
//!
//! ```no_run
//! use sys::quota;
//! let dir = std::path::Path::new("/srv/xfs/vol1");
//! std::fs::create_dir(dir)?;
//! quota::assign(dir, 4242)?;
//! quota::set_limit(dir, 4242, 64 << 20)?;
//! assert_eq!(quota::usage(dir, 4242)?.limit_bytes, 64 << 20);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![allow(unsafe_code)]
use rustix::{
    fd::{AsRawFd, OwnedFd},
    fs::{open, Mode, OFlags},
    io::Errno,
    ioctl::{ioctl, opcode, Getter, Setter},
};
use std::path::{Path, PathBuf};

/// The unit of `struct if_dqblk`'s block limits (`QIF_DQBLKSIZE`).
pub const LIMIT_UNIT: u64 = 1024;

/// A project quota call that failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The filesystem keeps no project quotas (not mounted with
    /// `prjquota`, or a filesystem without them).
    #[error("{} is on a filesystem that does not enforce project quotas (XFS or ext4 mounted with prjquota): {source}", path.display())]
    NotEnforced {
        /// The path asked about.
        path: PathBuf,
        /// The kernel's answer.
        #[source]
        source: std::io::Error,
    },
    /// A limit the kernel cannot hold exactly.
    #[error(
        "a project quota limit of {bytes} bytes is not a whole number of {LIMIT_UNIT}-byte units"
    )]
    UnalignedLimit {
        /// The limit asked for.
        bytes: u64,
    },
    /// A system call on the path failed.
    #[error("{what} on {}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The call (`open`, `FS_IOC_FSSETXATTR`, `Q_SETQUOTA`, ...).
        what: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// A directory's project.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Project {
    /// The project ID (0: none).
    pub id: u32,
    /// Whether files and directories made inside get the same ID
    /// (`FS_XFLAG_PROJINHERIT`).
    pub inherit: bool,
}

/// A project's limit and what it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// The hard limit on space in bytes (0: no limit).
    pub limit_bytes: u64,
    /// The space its files use, in bytes.
    pub used_bytes: u64,
    /// How many files and directories it holds.
    pub used_inodes: u64,
}

/// `struct fsxattr` of `linux/fs.h`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct FsXattr {
    xflags: u32,
    extsize: u32,
    nextents: u32,
    projid: u32,
    cowextsize: u32,
    pad: [u8; 8],
}

/// `struct if_dqblk` of `linux/quota.h`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct IfDqblk {
    bhardlimit: u64,
    bsoftlimit: u64,
    curspace: u64,
    ihardlimit: u64,
    isoftlimit: u64,
    curinodes: u64,
    btime: u64,
    itime: u64,
    valid: u32,
}

const FS_IOC_FSGETXATTR: rustix::ioctl::Opcode = opcode::read::<FsXattr>(b'X', 31);
const FS_IOC_FSSETXATTR: rustix::ioctl::Opcode = opcode::write::<FsXattr>(b'X', 32);
const FS_XFLAG_PROJINHERIT: u32 = 0x0000_0200;
const PRJQUOTA: u32 = 2;
const Q_GETQUOTA: u32 = 0x80_0007;
const Q_SETQUOTA: u32 = 0x80_0008;
/// `QIF_BLIMITS`: the block limits of an `if_dqblk` are set.
const QIF_BLIMITS: u32 = 1;

/// `QCMD(cmd, type)` of `linux/quota.h`.
const fn qcmd(cmd: u32, kind: u32) -> u32 {
    (cmd << 8) | (kind & 0xff)
}

fn io_error<'a>(path: &'a Path, what: &'static str) -> impl Fn(Errno) -> Error + 'a {
    move |e| Error::Io {
        path: path.to_owned(),
        what,
        source: e.into(),
    }
}

fn open_dir(path: &Path) -> Result<OwnedFd, Error> {
    open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(io_error(path, "open"))
}

fn get_xattr(dir: &OwnedFd, path: &Path) -> Result<FsXattr, Error> {
    // SAFETY: FS_IOC_FSGETXATTR writes one struct fsxattr, whose layout
    // FsXattr mirrors (repr(C)), into the buffer Getter provides.
    unsafe { ioctl(dir, Getter::<FS_IOC_FSGETXATTR, FsXattr>::new()) }
        .map_err(io_error(path, "FS_IOC_FSGETXATTR"))
}

/// The project of the directory (or file) at `path`.
pub fn project(path: &Path) -> Result<Project, Error> {
    let fd = open(path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())
        .map_err(io_error(path, "open"))?;
    let x = get_xattr(&fd, path)?;
    Ok(Project {
        id: x.projid,
        inherit: x.xflags & FS_XFLAG_PROJINHERIT != 0,
    })
}

/// Puts the directory `dir` in project `id` and has what is made inside
/// inherit it. Files already inside keep their project: a directory that
/// holds data is put in a project by a tool that walks it (`xfs_quota -x -c
/// 'project -s'`), never by this call.
pub fn assign(dir: &Path, id: u32) -> Result<(), Error> {
    let fd = open_dir(dir)?;
    let mut x = get_xattr(&fd, dir)?;
    if x.projid == id && x.xflags & FS_XFLAG_PROJINHERIT != 0 {
        return Ok(());
    }
    x.projid = id;
    x.xflags |= FS_XFLAG_PROJINHERIT;
    // SAFETY: FS_IOC_FSSETXATTR reads one struct fsxattr, whose layout
    // FsXattr mirrors (repr(C)), from the pointer Setter passes.
    unsafe { ioctl(&fd, Setter::<FS_IOC_FSSETXATTR, FsXattr>::new(x)) }
        .map_err(io_error(dir, "FS_IOC_FSSETXATTR"))
}

/// `quotactl_fd(fd, QCMD(cmd, PRJQUOTA), id, block)`.
fn quotactl(on: &Path, cmd: u32, id: u32, block: &mut IfDqblk) -> Result<(), Errno> {
    let fd = open(on, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())?;
    // SAFETY: quotactl_fd takes a descriptor (open for the whole call), a
    // command, an ID and, for Q_GETQUOTA and Q_SETQUOTA, a pointer to one
    // struct if_dqblk, whose layout IfDqblk mirrors (repr(C)); `block` is
    // a valid, exclusive reference for the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_quotactl_fd,
            fd.as_raw_fd(),
            qcmd(cmd, PRJQUOTA),
            id,
            block as *mut IfDqblk,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        let os = std::io::Error::last_os_error().raw_os_error();
        Err(Errno::from_raw_os_error(os.unwrap_or(libc::EIO)))
    }
}

/// Maps the errors that mean "no project quotas here" to
/// [`Error::NotEnforced`].
fn quota_error<'a>(on: &'a Path, what: &'static str) -> impl Fn(Errno) -> Error + 'a {
    move |e| match e {
        // ESRCH: project quotas are off; EINVAL: the filesystem has no
        // project quotas (tmpfs has user and group ones); ENOSYS,
        // EOPNOTSUPP, ENOTTY: it has no quotas.
        Errno::SRCH | Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP | Errno::NOTTY => {
            Error::NotEnforced {
                path: on.to_owned(),
                source: e.into(),
            }
        }
        _ => io_error(on, what)(e),
    }
}

/// Project `id`'s limit and usage on the filesystem that holds `on`.
pub fn usage(on: &Path, id: u32) -> Result<Usage, Error> {
    let mut block = IfDqblk::default();
    match quotactl(on, Q_GETQUOTA, id, &mut block) {
        Ok(()) => Ok(Usage {
            limit_bytes: block.bhardlimit * LIMIT_UNIT,
            used_bytes: block.curspace,
            used_inodes: block.curinodes,
        }),
        // XFS: a project that never had a limit nor a file has no record.
        Err(Errno::NOENT) => Ok(Usage::default()),
        Err(e) => Err(quota_error(on, "Q_GETQUOTA")(e)),
    }
}

/// Sets project `id`'s hard limit on space, on the filesystem that holds
/// `on`, to `bytes` (0 removes it); the soft limit is set to the same.
pub fn set_limit(on: &Path, id: u32, bytes: u64) -> Result<(), Error> {
    if !bytes.is_multiple_of(LIMIT_UNIT) {
        return Err(Error::UnalignedLimit { bytes });
    }
    let mut block = IfDqblk {
        bhardlimit: bytes / LIMIT_UNIT,
        bsoftlimit: bytes / LIMIT_UNIT,
        valid: QIF_BLIMITS,
        ..IfDqblk::default()
    };
    quotactl(on, Q_SETQUOTA, id, &mut block).map_err(quota_error(on, "Q_SETQUOTA"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_numbers_are_the_kernels() {
        // From linux/fs.h and linux/quota.h on x86_64.
        assert_eq!(std::mem::size_of::<FsXattr>(), 28);
        assert_eq!(std::mem::size_of::<IfDqblk>(), 72);
        assert_eq!(FS_IOC_FSGETXATTR, 0x801c_581f);
        assert_eq!(FS_IOC_FSSETXATTR, 0x401c_5820);
        assert_eq!(qcmd(Q_SETQUOTA, PRJQUOTA), 0x8000_0802);
        assert_eq!(libc::SYS_quotactl_fd, 443);
    }

    #[test]
    fn a_limit_that_is_not_whole_kibibytes_is_refused_before_any_call() {
        let err = set_limit(Path::new("/nonexistent"), 7, 1000).expect_err("unaligned");
        assert!(
            matches!(err, Error::UnalignedLimit { bytes: 1000 }),
            "{err}"
        );
        assert!(err.to_string().contains("1024-byte"), "{err}");
    }

    #[test]
    fn a_filesystem_without_project_quotas_says_so() {
        // The test's temporary folder: tmpfs or a filesystem mounted
        // without prjquota in every environment the tests run in.
        let dir = tempfile::tempdir().expect("tempdir");
        match usage(dir.path(), 1) {
            Err(Error::NotEnforced { path, .. }) => assert_eq!(path, dir.path()),
            other => panic!("{other:?}"),
        }
    }
}
