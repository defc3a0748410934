//! Growing a mounted ext4 or XFS filesystem online, in-process, through the
//! kernel's resize ioctls (what `resize2fs` and `xfs_growfs` call):
//!
//! - ext4: `EXT4_IOC_RESIZE_FS` (`_IOW('f', 16, __u64)`) with the new block
//!   count, on any file descriptor of the mounted filesystem;
//! - XFS: `XFS_IOC_FSGEOMETRY_V1` (`_IOR('X', 100, ...)`) for the block size
//!   and `imaxpct`, then `XFS_IOC_FSGROWFSDATA` (`_IOW('X', 110, ...)`) with
//!   the new data block count and the unchanged `imaxpct`.
//!
//! Both grow to fill `new_size_bytes` (rounded down to whole blocks);
//! asking for the current size or less changes nothing.
//!
//! ```no_run
//! sys::fsgrow::grow("/mnt/data".as_ref(), "ext4", 2 << 30)?;
//! # Ok::<(), sys::fsgrow::Error>(())
//! ```
#![allow(unsafe_code)]
use rustix::{
    fs::{open, statvfs, Mode, OFlags},
    ioctl::{ioctl, opcode, Getter, Setter},
};
use std::path::{Path, PathBuf};

/// A filesystem that could not be grown.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The filesystem type has no online grow here.
    #[error("growing {fs_type:?} online is not supported (ext4 and xfs are)")]
    Unsupported {
        /// The type asked for.
        fs_type: String,
    },
    /// A system call on the mount point failed.
    #[error("{what} on {}: {source}", mount_point.display())]
    Io {
        /// The mount point.
        mount_point: PathBuf,
        /// The call (`open`, `statvfs`, `EXT4_IOC_RESIZE_FS`, ...).
        what: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// `struct xfs_fsop_geom_v1` of `xfs_fs.h`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct XfsGeometryV1 {
    blocksize: u32,
    rtextsize: u32,
    agblocks: u32,
    agcount: u32,
    logblocks: u32,
    sectsize: u32,
    inodesize: u32,
    imaxpct: u32,
    datablocks: u64,
    rtblocks: u64,
    rtextents: u64,
    logstart: u64,
    uuid: [u8; 16],
    sunit: u32,
    swidth: u32,
    version: i32,
    flags: u32,
    logsectsize: u32,
    rtsectsize: u32,
    dirblocksize: u32,
}

/// `struct xfs_growfs_data` of `xfs_fs.h`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct XfsGrowfsData {
    newblocks: u64,
    imaxpct: u32,
}

const EXT4_IOC_RESIZE_FS: rustix::ioctl::Opcode = opcode::write::<u64>(b'f', 16);
const XFS_IOC_FSGEOMETRY_V1: rustix::ioctl::Opcode = opcode::read::<XfsGeometryV1>(b'X', 100);
const XFS_IOC_FSGROWFSDATA: rustix::ioctl::Opcode = opcode::write::<XfsGrowfsData>(b'X', 110);

/// Grows the `fs_type` filesystem mounted at `mount_point` to fill
/// `new_size_bytes`; returns the filesystem's new size in bytes.
pub fn grow(mount_point: &Path, fs_type: &str, new_size_bytes: u64) -> Result<u64, Error> {
    let io = |what: &'static str| {
        move |e: rustix::io::Errno| Error::Io {
            mount_point: mount_point.to_owned(),
            what,
            source: e.into(),
        }
    };
    let dir = open(
        mount_point,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(io("open"))?;
    match fs_type {
        "ext4" => {
            let block = statvfs(mount_point).map_err(io("statvfs"))?.f_bsize;
            let blocks = new_size_bytes / block.max(1);
            // SAFETY: EXT4_IOC_RESIZE_FS reads one __u64 (the new block
            // count) from the pointer Setter passes; `dir` is an open
            // descriptor of the mounted filesystem.
            unsafe { ioctl(&dir, Setter::<EXT4_IOC_RESIZE_FS, u64>::new(blocks)) }
                .map_err(io("EXT4_IOC_RESIZE_FS"))?;
            Ok(blocks * block)
        }
        "xfs" => {
            // SAFETY: XFS_IOC_FSGEOMETRY_V1 writes one xfs_fsop_geom_v1,
            // whose layout XfsGeometryV1 mirrors (repr(C)), into the buffer
            // Getter provides.
            let geometry =
                unsafe { ioctl(&dir, Getter::<XFS_IOC_FSGEOMETRY_V1, XfsGeometryV1>::new()) }
                    .map_err(io("XFS_IOC_FSGEOMETRY_V1"))?;
            let block = u64::from(geometry.blocksize.max(1));
            let blocks = new_size_bytes / block;
            if blocks > geometry.datablocks {
                let request = XfsGrowfsData {
                    newblocks: blocks,
                    imaxpct: geometry.imaxpct,
                };
                // SAFETY: XFS_IOC_FSGROWFSDATA reads one xfs_growfs_data,
                // whose layout XfsGrowfsData mirrors (repr(C)).
                unsafe {
                    ioctl(
                        &dir,
                        Setter::<XFS_IOC_FSGROWFSDATA, XfsGrowfsData>::new(request),
                    )
                }
                .map_err(io("XFS_IOC_FSGROWFSDATA"))?;
            }
            Ok(blocks.max(geometry.datablocks) * block)
        }
        other => Err(Error::Unsupported {
            fs_type: other.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ioctl_numbers_are_the_kernels() {
        // From linux/fs/ext4/ext4.h and xfs/libxfs/xfs_fs.h on x86_64.
        assert_eq!(EXT4_IOC_RESIZE_FS, 0x4008_6610);
        assert_eq!(std::mem::size_of::<XfsGeometryV1>(), 112);
        assert_eq!(XFS_IOC_FSGEOMETRY_V1, 0x8070_5864);
        assert_eq!(std::mem::size_of::<XfsGrowfsData>(), 16);
        assert_eq!(XFS_IOC_FSGROWFSDATA, 0x4010_586e);
    }

    #[test]
    fn another_filesystem_type_is_refused_by_name() {
        let e = grow(Path::new("/"), "btrfs", 1 << 30).expect_err("unsupported");
        assert!(e.to_string().contains("\"btrfs\""), "{e}");
    }
}
