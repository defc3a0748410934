//! A read-only signature probe through libblkid (the library under
//! `blkid -p`), in-process: no `blkid` subprocess.
//!
//! The probe opens the device `O_RDONLY` (never exclusively, never for
//! writing) and looks for filesystem superblocks and partition tables, the
//! way `blkid -p -o export` does ("safe" probing: an ambiguous result is not
//! a result).
//!
//! ```no_run
//! match sys::blkid::probe("/dev/data-vg/legacy".as_ref()) {
//!     sys::blkid::Probe::Filesystem { fs_type } => println!("{fs_type}"),
//!     other => println!("{other:?}"),
//! }
//! ```
#![allow(unsafe_code)]
use std::{
    ffi::{c_char, c_int, c_void, CStr, CString},
    os::unix::ffi::OsStrExt,
    path::Path,
};

#[allow(non_camel_case_types)]
type blkid_probe = *mut c_void;

const BLKID_SUBLKS_TYPE: c_int = 1 << 5;
const BLKID_SUBLKS_USAGE: c_int = 1 << 7;

#[link(name = "blkid")]
extern "C" {
    fn blkid_new_probe_from_filename(filename: *const c_char) -> blkid_probe;
    fn blkid_free_probe(pr: blkid_probe);
    fn blkid_probe_enable_superblocks(pr: blkid_probe, enable: c_int) -> c_int;
    fn blkid_probe_set_superblocks_flags(pr: blkid_probe, flags: c_int) -> c_int;
    fn blkid_probe_enable_partitions(pr: blkid_probe, enable: c_int) -> c_int;
    fn blkid_do_safeprobe(pr: blkid_probe) -> c_int;
    fn blkid_probe_lookup_value(
        pr: blkid_probe,
        name: *const c_char,
        data: *mut *const c_char,
        len: *mut usize,
    ) -> c_int;
}

/// What the signature probe found on a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// A filesystem superblock (`TYPE` with `USAGE=filesystem`).
    Filesystem {
        /// Its type (`ext4`, `xfs`, ...).
        fs_type: String,
    },
    /// A partition table (`PTTYPE`), with no filesystem on the whole device.
    PartitionTable {
        /// Its type (`gpt`, `dos`).
        pt_type: String,
    },
    /// Another signature (swap, RAID member, LVM PV, crypto...).
    Other {
        /// `TYPE`.
        kind: String,
        /// `USAGE`, when reported.
        usage: Option<String>,
    },
    /// The probe ran and found no signature.
    Blank,
    /// The probe could not decide (open failed, read failed, ambiguous).
    Unknown(String),
}

/// Frees the probe when dropped.
struct Handle(blkid_probe);

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: self.0 came from blkid_new_probe_from_filename, is non-null
        // and is freed exactly once, here.
        unsafe { blkid_free_probe(self.0) }
    }
}

impl Handle {
    fn value(&self, name: &CStr) -> Option<String> {
        let mut data: *const c_char = std::ptr::null();
        let mut len: usize = 0;
        // SAFETY: the probe is live, name is NUL-terminated, and data/len are
        // valid out-pointers; on success data points at a NUL-terminated
        // string owned by the probe, read before the probe is freed.
        let rc = unsafe { blkid_probe_lookup_value(self.0, name.as_ptr(), &mut data, &mut len) };
        if rc != 0 || data.is_null() {
            return None;
        }
        // SAFETY: data is non-null and NUL-terminated (see above).
        let s = unsafe { CStr::from_ptr(data) };
        Some(s.to_string_lossy().into_owned())
    }
}

/// Probes the device at `path` for filesystem and partition-table
/// signatures, read-only.
pub fn probe(path: &Path) -> Probe {
    let Ok(c_path) = CString::new(path.as_os_str().as_bytes()) else {
        return Probe::Unknown(format!("{}: path contains NUL", path.display()));
    };
    // SAFETY: c_path is NUL-terminated and lives across the call.
    let raw = unsafe { blkid_new_probe_from_filename(c_path.as_ptr()) };
    if raw.is_null() {
        return Probe::Unknown(format!(
            "{}: libblkid could not open the device: {}",
            path.display(),
            std::io::Error::last_os_error()
        ));
    }
    let h = Handle(raw);
    // SAFETY: h.0 is a live probe; these only set probing options.
    let setup = unsafe {
        blkid_probe_enable_superblocks(h.0, 1) == 0
            && blkid_probe_set_superblocks_flags(h.0, BLKID_SUBLKS_TYPE | BLKID_SUBLKS_USAGE) == 0
            && blkid_probe_enable_partitions(h.0, 1) == 0
    };
    if !setup {
        return Probe::Unknown(format!(
            "{}: libblkid refused the probe options",
            path.display()
        ));
    }
    // SAFETY: h.0 is a live, configured probe.
    let rc = unsafe { blkid_do_safeprobe(h.0) };
    match rc {
        1 => Probe::Blank,
        0 => {
            let kind = h.value(c"TYPE");
            let usage = h.value(c"USAGE");
            match (kind, h.value(c"PTTYPE")) {
                (Some(fs_type), _) if usage.as_deref() == Some("filesystem") => {
                    Probe::Filesystem { fs_type }
                }
                (Some(kind), _) => Probe::Other { kind, usage },
                (None, Some(pt_type)) => Probe::PartitionTable { pt_type },
                (None, None) => Probe::Unknown(format!(
                    "{}: libblkid found a signature but reported no type",
                    path.display()
                )),
            }
        }
        -2 => Probe::Unknown(format!(
            "{}: ambiguous signatures (more than one filesystem found)",
            path.display()
        )),
        other => Probe::Unknown(format!(
            "{}: libblkid probe failed ({other}): {}",
            path.display(),
            std::io::Error::last_os_error()
        )),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::io::{Seek, SeekFrom, Write};

    #[test]
    fn a_zeroed_file_is_blank_and_a_missing_one_unknown() {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&vec![0u8; 1 << 20]).unwrap();
        assert_eq!(probe(f.path()), Probe::Blank);
        assert!(matches!(
            probe(Path::new("/nonexistent/device")),
            Probe::Unknown(_)
        ));
    }

    #[test]
    fn an_ext4_superblock_and_a_dos_table_are_recognised() {
        // An ext2/3/4 superblock: magic 0xEF53 at byte 1024 + 56. libblkid
        // also wants a sane block size and revision, so fill the minimum.
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(&vec![0u8; 4 << 20]).unwrap();
        let sb = 1024u64;
        let put = |f: &mut tempfile::NamedTempFile, at: u64, bytes: &[u8]| {
            f.seek(SeekFrom::Start(at)).unwrap();
            f.write_all(bytes).unwrap();
        };
        put(&mut f, sb, &64u32.to_le_bytes()); // inodes count
        put(&mut f, sb + 4, &4096u32.to_le_bytes()); // blocks count
        put(&mut f, sb + 24, &2u32.to_le_bytes()); // log block size: 4096
        put(&mut f, sb + 56, &0xEF53u16.to_le_bytes());
        put(&mut f, sb + 76, &1u32.to_le_bytes()); // rev level
        put(&mut f, sb + 92, &0x4u32.to_le_bytes()); // compat: has_journal (ext3)
        f.flush().unwrap();
        match probe(f.path()) {
            Probe::Filesystem { fs_type } => assert!(fs_type.starts_with("ext"), "{fs_type}"),
            other => panic!("expected a filesystem, got {other:?}"),
        }

        let mut g = tempfile::NamedTempFile::new().unwrap();
        g.write_all(&vec![0u8; 1 << 20]).unwrap();
        // One primary partition of type 0x83 from sector 2048, and the MBR magic.
        let mut entry = [0u8; 16];
        entry[4] = 0x83;
        entry[8..12].copy_from_slice(&2048u32.to_le_bytes());
        entry[12..16].copy_from_slice(&10u32.to_le_bytes());
        put(&mut g, 446, &entry);
        put(&mut g, 510, &[0x55, 0xAA]);
        g.flush().unwrap();
        assert_eq!(
            probe(g.path()),
            Probe::PartitionTable {
                pt_type: "dos".into()
            }
        );
    }
}
