//! The identity a disk shows, as the export that serves it sets it: an
//! NVMe namespace's UUID (sysfs `uuid`), a SCSI disk's T10 unit serial
//! number (VPD page 0x80, sysfs `device/vpd_pg80`). The agent tells the
//! identity of each export (the publish context's `deviceIdentity`); a disk
//! that shows another is some other volume's, reached under the same target
//! name (two storage nodes with one NQN: the host joins their controllers
//! into one subsystem) and is never formatted or mounted for this one.
use crate::publish_context::Protocol;
use std::{fs, path::Path};

/// The identity disk `disk` (a name under `<sys>/class/block`) shows over
/// `protocol`, if it shows one.
pub fn of(sys: &Path, protocol: Protocol, disk: &str) -> Option<String> {
    let dir = sys.join("class/block").join(disk);
    match protocol {
        Protocol::NvmeofTcp => fs::read_to_string(dir.join("uuid"))
            .ok()
            .map(|u| u.trim().to_owned()),
        Protocol::Iscsi => fs::read(dir.join("device/vpd_pg80"))
            .ok()
            .and_then(|page| unit_serial(&page)),
        Protocol::Nfs | Protocol::Local => None,
    }
    .filter(|i| !i.is_empty())
}

/// The unit serial number in a VPD page 0x80 (SPC-4 7.8.15: a 4-byte
/// header whose last byte is the length, then the serial, which LIO ends
/// with a NUL).
fn unit_serial(page: &[u8]) -> Option<String> {
    if page.get(1) != Some(&0x80) {
        return None;
    }
    let len = usize::from(*page.get(3)?);
    let serial = page.get(4..4 + len).or_else(|| page.get(4..))?;
    let text = String::from_utf8_lossy(serial);
    Some(
        text.trim_matches(|c: char| c == '\0' || c.is_whitespace())
            .to_owned(),
    )
}

/// Whether `have` (what the disk shows) is `want` (what the export told):
/// hexadecimal identities compare without case.
pub fn matches(have: &str, want: &str) -> bool {
    have.eq_ignore_ascii_case(want)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_identity_is_read_as_each_protocol_shows_it() {
        let root = tempfile::tempdir().unwrap();
        let sys = root.path();
        let nvme = sys.join("class/block/nvme1n1");
        fs::create_dir_all(&nvme).unwrap();
        fs::write(nvme.join("uuid"), "8d1e6a1c-0c4f-8e2a-9b1d-2f0c3a4b5c6d\n").unwrap();
        assert_eq!(
            of(sys, Protocol::NvmeofTcp, "nvme1n1").as_deref(),
            Some("8d1e6a1c-0c4f-8e2a-9b1d-2f0c3a4b5c6d")
        );
        let sd = sys.join("class/block/sdb/device");
        fs::create_dir_all(&sd).unwrap();
        let serial = b"5b2c1f3e-9a8d-8c7b-a6f5-e4d3c2b1a090\0";
        let mut page = vec![0x00, 0x80, 0x00, serial.len() as u8];
        page.extend_from_slice(serial);
        fs::write(sd.join("vpd_pg80"), &page).unwrap();
        assert_eq!(
            of(sys, Protocol::Iscsi, "sdb").as_deref(),
            Some("5b2c1f3e-9a8d-8c7b-a6f5-e4d3c2b1a090")
        );
        // Another page, or none: no identity.
        page[1] = 0x83;
        fs::write(sd.join("vpd_pg80"), &page).unwrap();
        assert_eq!(of(sys, Protocol::Iscsi, "sdb"), None);
        assert_eq!(of(sys, Protocol::Iscsi, "sdc"), None);
        assert!(matches("ABCDEF01", "abcdef01") && !matches("abcdef01", "abcdef02"));
    }
}
