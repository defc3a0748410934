//! The bare kernel calls under [`Zfs`](super::Zfs)'s operations, for
//! benchmarks that time how close each operation comes to the kernel's own
//! cost ("the floor").
//!
//! Nothing here checks a name, translates a property, computes a
//! reservation, maps an error or takes a lock: each call is one libzfs_core
//! call or one ioctl. That is the point, and also why it is for measuring
//! only; a create through [`BareCalls`] skips every check
//! [`Zfs::create_zvol`](super::Zfs::create_zvol) makes.
use super::ffi::{cstring, Lzc, NvList};
use std::{ffi::CString, io};

/// libzfs_core and a `/dev/zfs` descriptor, with no libzfs handle.
#[derive(Debug)]
pub struct BareCalls {
    lzc: Lzc,
}

fn os(e: std::ffi::c_int) -> io::Error {
    io::Error::from_raw_os_error(e)
}

fn name(s: &str) -> io::Result<CString> {
    cstring(s).map_err(os)
}

impl BareCalls {
    /// Opens libzfs_core (`libzfs_core_init`) and `/dev/zfs`.
    pub fn open() -> io::Result<Self> {
        Ok(Self {
            lzc: Lzc::init().map_err(os)?,
        })
    }

    /// `lzc_create` of a volume with `volsize` and, for a thick volume,
    /// the `refreservation` given (not computed).
    pub fn create_zvol(
        &self,
        dataset: &str,
        volsize: u64,
        refreservation: Option<u64>,
    ) -> io::Result<()> {
        let mut props = NvList::new().map_err(os)?;
        props.add_u64("volsize", volsize).map_err(os)?;
        if let Some(r) = refreservation {
            props.add_u64("refreservation", r).map_err(os)?;
        }
        self.lzc
            .create(&name(dataset)?, true, &props, None)
            .map_err(os)
    }

    /// `lzc_destroy`, once (a busy volume is an error, not retried).
    pub fn destroy(&self, dataset: &str) -> io::Result<()> {
        self.lzc.destroy(&name(dataset)?).map_err(os)
    }

    /// The statistics ioctl with the property list copied into `buffer`,
    /// not unpacked; the packed length.
    pub fn stats(&self, dataset: &str, buffer: &mut Vec<u8>) -> io::Result<usize> {
        self.lzc.stats_packed(&name(dataset)?, buffer).map_err(os)
    }

    /// The statistics ioctl without a property list; the GUID it reports.
    pub fn fast_stats(&self, dataset: &str) -> io::Result<u64> {
        self.lzc
            .fast_stats(&name(dataset)?)
            .map(|s| s.guid)
            .map_err(os)
    }
}
