//! `BLKZNAME`: the dataset a zvol's block device serves, asked of the
//! device itself (the question udev's `zvol_id` asks).
use super::*;
use std::os::fd::AsFd;

/// `ZFS_MAX_DATASET_NAME_LEN`, the size of the name the kernel copies out.
const NAME_LEN: usize = 256;

/// `BLKZNAME`, `_IOR(0x12, 125, char[ZFS_MAX_DATASET_NAME_LEN])`
/// (include/sys/fs/zfs.h).
const BLKZNAME: rustix::ioctl::Opcode = rustix::ioctl::opcode::read::<[u8; NAME_LEN]>(0x12, 125);

/// The dataset name of the zvol whose block device is open at `fd`; the
/// kernel's errno otherwise (`ENOTTY` for a device that is not a zvol).
pub(crate) fn zvol_name(fd: impl AsFd) -> Result<String, c_int> {
    // SAFETY: BLKZNAME is a read ioctl whose argument is a buffer of
    // exactly NAME_LEN bytes, which the Getter provides and the kernel
    // fills (zvol_ioctl copies ZFS_MAX_DATASET_NAME_LEN bytes out).
    let getter = unsafe { rustix::ioctl::Getter::<BLKZNAME, [u8; NAME_LEN]>::new() };
    // SAFETY: the opcode and the buffer type agree, as above.
    let raw = unsafe { rustix::ioctl::ioctl(fd, getter) }.map_err(|e| e.raw_os_error())?;
    let end = raw.iter().position(|&b| b == 0).unwrap_or(NAME_LEN);
    Ok(String::from_utf8_lossy(&raw[..end]).into_owned())
}
