//! Adoption helpers shared by the backends and the service: the refusal
//! messages of `spec/import-zvol.md` and `spec/adopt-lvm-lv.md`, and the
//! read-only "who uses this device" check.
//!
//! Refusals of an import read `import of volume <id> refused: <reason>: ...`
//! and are FAILED_PRECONDITION: the request was well formed, the storage
//! node is not in a state that allows it, and nothing was changed.
use crate::{error::AgentError, volume::VolumeId};
use std::path::Path;
use sys::block::{Exclusive, Host, Usage};

/// An import refusal: `import of volume <id> refused: <reason>`.
pub fn refused(id: &VolumeId, reason: impl std::fmt::Display) -> AgentError {
    AgentError::FailedPrecondition(format!("import of volume {id} refused: {reason}"))
}

/// The kernel target objects the agent itself may have made for a volume
/// (its subsystem NQNs, target IQNs and LIO storage object, from
/// `crate::export::Exporter::own_names`): they are not foreign users of
/// the device.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OwnExports {
    /// The objects' names.
    pub names: std::collections::BTreeSet<String>,
}

impl OwnExports {
    /// Whether the object called `name` is the agent's own.
    pub fn contains(&self, name: &str) -> bool {
        self.names.contains(name)
    }
}

/// Reads who uses the device at `path` (mounts, holders, LIO, nvmet, the
/// exclusive-open probe). Read-only.
pub fn usage(path: &Path) -> Result<Usage, AgentError> {
    Host::default().usage(path).map_err(|e| {
        AgentError::Internal(format!("could not read who uses {}: {e}", path.display()))
    })
}

/// The first reason the device is not idle, in the spec's words (`in use:
/// ...`), or `None` when it is idle. The agent's own exports (`own`) are not
/// users; with `exclusive` false the exclusive-open probe is ignored (it
/// cannot tell the agent's own LIO claim from another).
pub fn in_use(usage: &Usage, own: Option<&OwnExports>, exclusive: bool) -> Option<String> {
    let dev = usage.device.path.display();
    let foreign_lio = usage
        .lio
        .iter()
        .find(|u| own.is_none_or(|o| !o.contains(&u.name)));
    if let Some(u) = foreign_lio {
        return Some(format!(
            "in use: LIO backstore {}/{} still points at {}; remove the old driver's export (targetcli delete) first",
            u.backstore,
            u.name,
            u.udev_path.display()
        ));
    }
    let foreign_nvmet = usage
        .nvmet
        .iter()
        .find(|u| own.is_none_or(|o| !o.contains(&u.subsystem)));
    if let Some(u) = foreign_nvmet {
        return Some(format!(
            "in use: nvmet subsystem {} namespace {} still exports {}; remove the export first",
            u.subsystem,
            u.nsid,
            u.device_path.display()
        ));
    }
    if let Some(m) = usage.mounts.first() {
        let what = if m.device == usage.device.name {
            format!("device {dev}")
        } else {
            format!("device {dev} (partition {})", m.device)
        };
        return Some(format!(
            "in use: {what} is mounted at {}; unmount it first",
            m.mount_point.display()
        ));
    }
    if !usage.holders.is_empty() {
        return Some(format!(
            "in use: device {dev} has device-mapper holders in sysfs; release the holding device first"
        ));
    }
    if exclusive {
        match &usage.exclusive {
            Exclusive::Free => {}
            Exclusive::Busy => {
                return Some(format!(
                "in use: device {dev} is held exclusively on the storage node (mounted, exported, or opened by another consumer)"
            ))
            }
            Exclusive::Unknown(why) => {
                return Some(format!(
                    "in use: device {dev} could not be probed for exclusive use ({why}); refusing rather than guessing"
                ))
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;
    use sys::block::{BlockDevice, DevNum, Holder, LioUser, Mount, NvmetUser};

    fn idle() -> Usage {
        Usage {
            device: BlockDevice {
                path: PathBuf::from("/dev/zvol/tank/k8s/v"),
                devnum: DevNum::from_rdev(0),
                name: "zd0".into(),
            },
            partitions: vec![],
            mounts: vec![],
            holders: vec![],
            exclusive: Exclusive::Free,
            lio: vec![],
            nvmet: vec![],
        }
    }

    #[test]
    fn each_user_gets_the_spec_sentence() {
        assert_eq!(in_use(&idle(), None, true), None);
        let mut u = idle();
        u.lio.push(LioUser {
            backstore: "iblock_0".into(),
            name: "old".into(),
            udev_path: "/dev/zvol/tank/k8s/v".into(),
        });
        assert_eq!(
            in_use(&u, None, true).as_deref(),
            Some("in use: LIO backstore iblock_0/old still points at /dev/zvol/tank/k8s/v; remove the old driver's export (targetcli delete) first")
        );
        let mut u = idle();
        u.nvmet.push(NvmetUser {
            subsystem: "nqn.x:old".into(),
            nsid: "1".into(),
            device_path: "/dev/zvol/tank/k8s/v".into(),
        });
        assert_eq!(
            in_use(&u, None, true).as_deref(),
            Some("in use: nvmet subsystem nqn.x:old namespace 1 still exports /dev/zvol/tank/k8s/v; remove the export first")
        );
        let mut u = idle();
        u.mounts.push(Mount {
            device: "zd0p1".into(),
            mount_point: "/mnt/x".into(),
            fs_type: "ext4".into(),
        });
        assert_eq!(
            in_use(&u, None, true).as_deref(),
            Some("in use: device /dev/zvol/tank/k8s/v (partition zd0p1) is mounted at /mnt/x; unmount it first")
        );
        let mut u = idle();
        u.holders.push(Holder {
            of: "zd0".into(),
            holder: "dm-3".into(),
            dm_name: Some("x".into()),
        });
        assert_eq!(
            in_use(&u, None, true).as_deref(),
            Some("in use: device /dev/zvol/tank/k8s/v has device-mapper holders in sysfs; release the holding device first")
        );
        let mut u = idle();
        u.exclusive = Exclusive::Busy;
        assert_eq!(
            in_use(&u, None, true).as_deref(),
            Some("in use: device /dev/zvol/tank/k8s/v is held exclusively on the storage node (mounted, exported, or opened by another consumer)")
        );
        assert_eq!(in_use(&u, None, false), None, "probe ignored on request");
    }

    #[test]
    fn the_agents_own_exports_are_not_users() -> Result<(), AgentError> {
        let own = OwnExports {
            names: ["nqn.2026-01.org.example:lv".into(), "pillar-lv".into()].into(),
        };
        let mut u = idle();
        u.nvmet.push(NvmetUser {
            subsystem: "nqn.2026-01.org.example:lv".into(),
            nsid: "1".into(),
            device_path: "/dev/vg/lv".into(),
        });
        u.lio.push(LioUser {
            backstore: "iblock_0".into(),
            name: "pillar-lv".into(),
            udev_path: "/dev/vg/lv".into(),
        });
        assert_eq!(in_use(&u, Some(&own), true), None);
        assert!(in_use(&u, None, true).is_some());
        Ok(())
    }
}
