//! Filesystems on staged devices: a libblkid probe decides; only a device
//! with no signature at all is formatted. A device holding a filesystem of
//! another type, a partition table or anything else is refused, never
//! formatted.
//!
//! mkfs runs as a program: the filesystems' creation code lives only in
//! their tools (e2fsprogs, xfsprogs), there is no library to call.
use super::command::run_ok;
use super::error::{Error, Result};
use crate::volume_context::Origin;
use std::{path::Path, time::Duration};
use sys::blkid::Probe;
use sys::block::Host;

/// The filesystem used when a volume capability names none.
pub const DEFAULT_FS_TYPE: &str = "ext4";
/// The filesystems the node formats and grows.
pub const SUPPORTED: [&str; 2] = ["ext4", "xfs"];
/// How long one mkfs may take.
const MKFS_LIMIT: Duration = Duration::from_secs(600);

/// The filesystem type a capability asks for (empty: the default), refused
/// when unsupported.
pub fn requested_fs_type(fs_type: &str) -> Result<&str> {
    match fs_type {
        "" => Ok(DEFAULT_FS_TYPE),
        t if SUPPORTED.contains(&t) => Ok(t),
        t => Err(Error::invalid(format!(
            "fsType {t:?} is not supported (supported: {})",
            SUPPORTED.join(", ")
        ))),
    }
}

/// What [`ensure_filesystem`] found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The device was blank and now holds a new filesystem.
    Formatted,
    /// The device already held a filesystem of the requested type.
    Reused,
}

/// Whether a probe result may be formatted as `fs_type` or reused; `Err`
/// names what was found. `existing_data` is the volume context's origin of
/// a volume that held data before pillar-csi served it (an import, an
/// adoption, a recovery): such a volume is never formatted, blank or not,
/// since raw application data, a wiped or damaged superblock and a
/// signature newer than this libblkid all probe blank.
pub fn decide(
    device: &Path,
    probe: &Probe,
    fs_type: &str,
    existing_data: Option<&str>,
) -> Result<Option<Outcome>> {
    let dev = device.display();
    let refuse = |found: String| {
        Err(Error::precondition(format!(
            "{dev} holds {found}, not a {fs_type} filesystem: refusing to format a device that is not blank"
        )))
    };
    match probe {
        Probe::Blank => match existing_data {
            None => Ok(None),
            Some(origin) => Err(Error::precondition(format!(
                "{dev} has no filesystem signature libblkid knows, but the volume holds existing data (existingData: {origin}): refusing to make a {fs_type} filesystem on it. Use volumeMode: Block for raw data, or make the filesystem yourself if the device is meant to be empty"
            ))),
        },
        Probe::Filesystem { fs_type: found } if found == fs_type => Ok(Some(Outcome::Reused)),
        Probe::Filesystem { fs_type: found } => refuse(format!("a {found} filesystem")),
        Probe::PartitionTable { pt_type } => refuse(format!("a {pt_type} partition table")),
        Probe::Other { kind, usage } => refuse(format!(
            "a {kind} signature{}",
            usage
                .as_ref()
                .map(|u| format!(" ({u})"))
                .unwrap_or_default()
        )),
        Probe::Unknown(why) => Err(Error::precondition(format!(
            "{dev} could not be probed ({why}): refusing to format it"
        ))),
    }
}

/// The options of `mkfs.<fs_type>` for a blank volume (the node benchmark's
/// process pipeline uses the same):
///
/// - ext4: `-q -m0 -E nodiscard`: no blocks reserved for root (a volume
///   serves one workload, as Kubernetes' own formatter does with `-m0`),
///   and no discard (the device is blank already; discarding a large thin
///   volume only costs time). No `-F`: mke2fs keeps its own refusal of a
///   device in use.
/// - xfs: `-q -K` (no discard). No `-f`: mkfs.xfs itself refuses a device
///   with a signature, a second guard should one appear after the probe.
pub fn mkfs_args<'a>(fs_type: &str, device: &'a str) -> Result<Vec<&'a str>> {
    match fs_type {
        "ext4" => Ok(vec!["-q", "-m0", "-E", "nodiscard", device]),
        "xfs" => Ok(vec!["-q", "-K", device]),
        other => Err(requested_fs_type(other)
            .err()
            .unwrap_or_else(|| Error::internal(format!("no mkfs for {other}")))),
    }
}

/// Makes sure `device` holds a `fs_type` filesystem: probes it, formats it
/// only when blank and not holding existing data ([`decide`]), refuses
/// anything else.
pub fn ensure_filesystem(
    device: &Path,
    fs_type: &str,
    existing_data: Option<&str>,
) -> Result<Outcome> {
    let probe = super::timed("probe", || sys::blkid::probe(device));
    if let Some(outcome) = decide(device, &probe, fs_type, existing_data)? {
        return Ok(outcome);
    }
    let dev = device.to_string_lossy();
    let args = mkfs_args(fs_type, &dev)?;
    super::timed("mkfs", || {
        run_ok(&format!("mkfs.{fs_type}"), &args, MKFS_LIMIT)
    })?;
    Ok(Outcome::Formatted)
}

/// The size of block device `device` in bytes.
pub fn device_size(device: &Path) -> Result<u64> {
    let host = Host::default();
    host.device(device)
        .and_then(|d| host.size_bytes(&d))
        .map_err(|e| Error::internal(e.to_string()))
}

/// Whether a volume of origin `existing_data` holds a copy of another
/// volume's filesystem (restored from a snapshot or cloned), made at the
/// source's size: such a filesystem is grown to its device when staged, so
/// a claim larger than its source gets the space it asked for.
pub fn grows_when_staged(existing_data: Option<&str>) -> bool {
    existing_data.is_some_and(|o| o == Origin::Snapshot.as_str() || o == Origin::Clone.as_str())
}

/// Grows the `fs_type` filesystem mounted at `mount_point` online to fill
/// `size` bytes; one that fills them already is left as it is.
pub fn grow(mount_point: &Path, fs_type: &str, size: u64) -> Result<()> {
    let grown = super::timed("grow", || sys::fsgrow::grow(mount_point, fs_type, size))
        .map_err(|e| Error::internal(e.to_string()))?;
    tracing::info!(size, grown, fs_type = %fs_type, "filesystem grown");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_blank_devices_are_formatted_and_the_rest_named() {
        let dev = Path::new("/dev/nvme0n1");
        assert_eq!(decide(dev, &Probe::Blank, "ext4", None), Ok(None));
        let ext4 = Probe::Filesystem {
            fs_type: "ext4".into(),
        };
        assert_eq!(decide(dev, &ext4, "ext4", None), Ok(Some(Outcome::Reused)));
        assert_eq!(
            decide(dev, &ext4, "ext4", Some("import-zvol")),
            Ok(Some(Outcome::Reused)),
            "an import's own filesystem is mounted"
        );
        let cases = [
            (ext4, "a ext4 filesystem"),
            (
                Probe::PartitionTable {
                    pt_type: "gpt".into(),
                },
                "a gpt partition table",
            ),
            (
                Probe::Other {
                    kind: "LVM2_member".into(),
                    usage: Some("raid".into()),
                },
                "LVM2_member",
            ),
            (Probe::Unknown("ambiguous".into()), "ambiguous"),
        ];
        for (probe, found) in cases {
            let e = decide(dev, &probe, "xfs", None).expect_err("refused");
            assert_eq!(e.kind, super::super::error::Kind::FailedPrecondition);
            assert!(
                e.message.contains(found) && e.message.contains("/dev/nvme0n1"),
                "{e}"
            );
        }
    }

    #[test]
    fn a_blank_probe_of_a_volume_holding_data_is_refused_not_formatted() {
        let dev = Path::new("/dev/nvme0n1");
        for origin in ["import-zvol", "import-lv", "recovery"] {
            let e = decide(dev, &Probe::Blank, "ext4", Some(origin)).expect_err("refused");
            assert_eq!(e.kind, super::super::error::Kind::FailedPrecondition);
            for part in ["/dev/nvme0n1", origin, "volumeMode: Block", "refusing"] {
                assert!(e.message.contains(part), "{part}: {e}");
            }
        }
    }

    #[test]
    fn only_copies_of_other_volumes_grow_when_staged() {
        assert!(grows_when_staged(Some("snapshot")));
        assert!(grows_when_staged(Some("clone")));
        for origin in [
            None,
            Some("import-zvol"),
            Some("import-lv"),
            Some("recovery"),
            Some("x"),
        ] {
            assert!(!grows_when_staged(origin), "{origin:?}");
        }
    }

    #[test]
    fn mkfs_options_are_one_set_per_filesystem() {
        assert_eq!(
            mkfs_args("ext4", "/dev/x"),
            Ok(vec!["-q", "-m0", "-E", "nodiscard", "/dev/x"])
        );
        assert_eq!(mkfs_args("xfs", "/dev/x"), Ok(vec!["-q", "-K", "/dev/x"]));
        let e = mkfs_args("btrfs", "/dev/x").expect_err("unsupported");
        assert!(e.message.contains("btrfs"), "{e}");
    }

    #[test]
    fn fs_types_default_and_unknown_ones_are_refused() {
        assert_eq!(requested_fs_type(""), Ok("ext4"));
        assert_eq!(requested_fs_type("xfs"), Ok("xfs"));
        let e = requested_fs_type("btrfs").expect_err("unsupported");
        assert!(e.message.contains("btrfs"), "{e}");
    }
}
