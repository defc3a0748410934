//! Agent volume IDs and the CSI volume handle.
//!
//! - An agent volume ID names a volume on one agent: `<pool>/<name>` for a
//!   zvol or a ZFS filesystem (the agent places it under the pool's
//!   parentDataset: `<pool>[/<parentDataset>]/<name>`), `<vg>/<lv>` for an
//!   LV, `<backend>/<name>` for a directory of the agent's directory backend
//!   `<backend>` ([`AgentVolumeId`]).
//! - The volume handle, what CSI calls the volume ID and the PV carries in
//!   `spec.csi.volumeHandle`, is `<agent>/<protocol>/<backend>/<agent volume
//!   ID>`, e.g. `storage-1/nvmeof-tcp/lvm-lv/data-vg/legacy`
//!   ([`VolumeHandle`]). The first three parts contain no `/`; the rest is
//!   the agent volume ID, checked by the backend's name rules.

use crate::names::{lvm, zfs};
use crate::tokens::{Backend, Protocol};
use std::fmt;

/// A volume's name on its agent, checked by its backend's rules.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum AgentVolumeId {
    /// A zvol: `<pool>/<name>`, both ZFS name components.
    Zvol(zfs::DatasetName),
    /// A ZFS filesystem: `<pool>/<name>`, both ZFS name components.
    Dataset(zfs::DatasetName),
    /// A directory of an agent's directory backend.
    Directory {
        /// The backend's name (the agent's `directory.name`).
        backend: String,
        /// The directory's name under the backend's path.
        name: String,
    },
    /// A logical volume of a volume group.
    Lv {
        /// The volume group.
        vg: lvm::VgName,
        /// The logical volume.
        lv: lvm::LvName,
    },
}

/// A volume handle or agent volume ID that cannot be parsed; the message
/// names the value and the part at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {value:?}: {reason}")]
pub struct InvalidHandle {
    /// `volume handle` or `agent volume ID`.
    pub what: &'static str,
    /// The rejected text.
    pub value: String,
    /// What is wrong with it.
    pub reason: String,
}

impl AgentVolumeId {
    /// Parses `value` as a volume of `backend`.
    pub fn parse(backend: Backend, value: &str) -> Result<Self, InvalidHandle> {
        let bad = |reason: String| InvalidHandle {
            what: "agent volume ID",
            value: value.to_owned(),
            reason,
        };
        match backend {
            Backend::ZfsZvol | Backend::ZfsDataset => {
                let ds = zfs::DatasetName::below_pool(value).map_err(|e| bad(e.to_string()))?;
                if value.matches('/').count() != 1 {
                    return Err(bad("expected <pool>/<name>".into()));
                }
                Ok(if backend == Backend::ZfsDataset {
                    AgentVolumeId::Dataset(ds)
                } else {
                    AgentVolumeId::Zvol(ds)
                })
            }
            Backend::Directory => {
                let (backend, name) = value
                    .split_once('/')
                    .ok_or_else(|| bad("expected <backend>/<name>".into()))?;
                for part in [backend, name] {
                    check_directory_component(part).map_err(&bad)?;
                }
                Ok(AgentVolumeId::Directory {
                    backend: backend.to_owned(),
                    name: name.to_owned(),
                })
            }
            Backend::LvmLv => {
                let (vg, lv) = value
                    .split_once('/')
                    .ok_or_else(|| bad("expected <vg>/<lv>".into()))?;
                Ok(AgentVolumeId::Lv {
                    vg: lvm::VgName::new(vg).map_err(|e| bad(e.to_string()))?,
                    lv: lvm::LvName::new(lv).map_err(|e| bad(e.to_string()))?,
                })
            }
        }
    }

    /// The backend this ID belongs to.
    pub fn backend(&self) -> Backend {
        match self {
            AgentVolumeId::Zvol(_) => Backend::ZfsZvol,
            AgentVolumeId::Dataset(_) => Backend::ZfsDataset,
            AgentVolumeId::Directory { .. } => Backend::Directory,
            AgentVolumeId::Lv { .. } => Backend::LvmLv,
        }
    }

    /// The pool (zvol), volume group (LV) or directory backend that holds
    /// the volume: what the agent's GetCapacity and backend entries are
    /// keyed by.
    pub fn pool(&self) -> &str {
        match self {
            AgentVolumeId::Zvol(ds) | AgentVolumeId::Dataset(ds) => ds.pool(),
            AgentVolumeId::Directory { backend, .. } => backend,
            AgentVolumeId::Lv { vg, .. } => vg.as_str(),
        }
    }
}

impl fmt::Display for AgentVolumeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AgentVolumeId::Zvol(ds) | AgentVolumeId::Dataset(ds) => write!(f, "{ds}"),
            AgentVolumeId::Directory { backend, name } => write!(f, "{backend}/{name}"),
            AgentVolumeId::Lv { vg, lv } => write!(f, "{vg}/{lv}"),
        }
    }
}

/// Checks one component of a directory volume's ID: 1 to 127 ASCII
/// letters, digits, `-`, `_`, `.` and `:` (the agent's rule), not `.` nor
/// `..`, not starting with `-`.
fn check_directory_component(part: &str) -> Result<(), String> {
    if part.is_empty() || part.len() > 127 {
        return Err(format!("{part:?} must have 1 to 127 characters"));
    }
    if part == "." || part == ".." || part.starts_with('-') {
        return Err(format!("{part:?} is not a name"));
    }
    match part
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':')))
    {
        Some(c) => Err(format!("{part:?} contains {c:?}")),
        None => Ok(()),
    }
}

/// The most bytes of a PillarAgent name (a Kubernetes DNS subdomain).
pub const MAX_AGENT_NAME_LEN: usize = 253;

/// Checks a PillarAgent name: a DNS subdomain (RFC 1123: lower-case
/// letters, digits, `-` and `.`, starting and ending with a letter or digit).
pub fn check_agent_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("the agent name is empty".into());
    }
    if name.len() > MAX_AGENT_NAME_LEN {
        return Err(format!(
            "the agent name has {} bytes, at most {MAX_AGENT_NAME_LEN} are allowed",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.')))
    {
        return Err(format!("the agent name contains {c:?}"));
    }
    let edge_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !edge_ok(name.chars().next()) || !edge_ok(name.chars().last()) {
        return Err("the agent name must start and end with a letter or digit".into());
    }
    Ok(())
}

/// The CSI volume handle `<agent>/<protocol>/<backend>/<agent volume ID>`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct VolumeHandle {
    agent: String,
    protocol: Protocol,
    volume: AgentVolumeId,
}

impl VolumeHandle {
    /// Builds a handle, checking the agent name.
    pub fn new(
        agent: &str,
        protocol: Protocol,
        volume: AgentVolumeId,
    ) -> Result<Self, InvalidHandle> {
        let handle = VolumeHandle {
            agent: agent.to_owned(),
            protocol,
            volume,
        };
        check_agent_name(agent).map_err(|reason| InvalidHandle {
            what: "volume handle",
            value: handle.to_string(),
            reason,
        })?;
        Ok(handle)
    }

    /// Parses what [`VolumeHandle`]'s `Display` wrote.
    pub fn parse(value: &str) -> Result<Self, InvalidHandle> {
        let bad = |reason: String| InvalidHandle {
            what: "volume handle",
            value: value.to_owned(),
            reason,
        };
        let mut parts = value.splitn(4, '/');
        let (Some(agent), Some(protocol), Some(backend), Some(id)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad(
                "expected <agent>/<protocol>/<backend>/<agent volume ID>".into(),
            ));
        };
        check_agent_name(agent).map_err(bad)?;
        let protocol = Protocol::parse(protocol).ok_or_else(|| {
            bad(format!(
                "unknown protocol {protocol:?} (expected \"nvmeof-tcp\", \"iscsi\" or \"nfs\")"
            ))
        })?;
        let backend = Backend::parse(backend).ok_or_else(|| {
            bad(format!(
                "unknown backend {backend:?} (expected \"zfs-zvol\", \"lvm-lv\", \"zfs-dataset\" or \"directory\")"
            ))
        })?;
        let volume = AgentVolumeId::parse(backend, id).map_err(|e| bad(e.to_string()))?;
        Ok(VolumeHandle {
            agent: agent.to_owned(),
            protocol,
            volume,
        })
    }

    /// The PillarAgent's name.
    pub fn agent(&self) -> &str {
        &self.agent
    }

    /// How nodes reach the volume.
    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// The backend holding the volume.
    pub fn backend(&self) -> Backend {
        self.volume.backend()
    }

    /// The volume's name on its agent.
    pub fn volume(&self) -> &AgentVolumeId {
        &self.volume
    }
}

impl fmt::Display for VolumeHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{}/{}",
            self.agent,
            self.protocol,
            self.volume.backend(),
            self.volume
        )
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_volume_handle_round_trips_and_bad_names_are_refused() {
        let text = "storage-1/nfs/directory/dirs/pvc-1";
        let h = VolumeHandle::parse(text).expect("valid");
        assert_eq!(
            h.volume(),
            &AgentVolumeId::Directory {
                backend: "dirs".into(),
                name: "pvc-1".into()
            }
        );
        assert_eq!(h.volume().pool(), "dirs");
        assert!(h.volume().backend().is_filesystem());
        assert_eq!(h.to_string(), text);
        for (bad, why) in [
            ("storage-1/nfs/directory/dirs", "expected <backend>/<name>"),
            ("storage-1/nfs/directory/dirs/../x", "contains '/'"),
            ("storage-1/nfs/directory/dirs/..", "is not a name"),
            ("storage-1/nfs/directory/dirs/a b", "contains ' '"),
        ] {
            let err = VolumeHandle::parse(bad).expect_err(bad);
            assert!(err.to_string().contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn the_spec_example_round_trips() {
        let text = "storage-1/nvmeof-tcp/lvm-lv/data-vg/legacy";
        let h = VolumeHandle::parse(text).unwrap();
        assert_eq!(h.agent(), "storage-1");
        assert_eq!(h.protocol(), Protocol::NvmeofTcp);
        assert_eq!(h.backend(), Backend::LvmLv);
        assert_eq!(h.volume().pool(), "data-vg");
        assert_eq!(h.volume().to_string(), "data-vg/legacy");
        assert_eq!(h.to_string(), text);
    }

    #[test]
    fn a_zvol_handle_names_pool_and_zvol() {
        let text = "storage-1.lab/iscsi/zfs-zvol/hot-data/pvc-0d52";
        let h = VolumeHandle::parse(text).unwrap();
        assert_eq!(h.volume().pool(), "hot-data");
        assert_eq!(h.volume().to_string(), "hot-data/pvc-0d52");
        assert_eq!(h.to_string(), text);
        let built = VolumeHandle::new(
            "storage-1.lab",
            Protocol::Iscsi,
            AgentVolumeId::parse(Backend::ZfsZvol, "hot-data/pvc-0d52").unwrap(),
        )
        .unwrap();
        assert_eq!(built, h);
    }

    #[test]
    fn bad_handles_are_refused_naming_the_part() {
        let cases = [
            ("storage-1/nvmeof-tcp/lvm-lv", "expected <agent>"),
            ("Storage/nvmeof-tcp/lvm-lv/vg/lv", "contains 'S'"),
            ("/nvmeof-tcp/lvm-lv/vg/lv", "agent name is empty"),
            ("s1/nvme/lvm-lv/vg/lv", "unknown protocol \"nvme\""),
            ("s1/iscsi/lvm/vg/lv", "unknown backend \"lvm\""),
            ("s1/iscsi/lvm-lv/vg", "expected <vg>/<lv>"),
            ("s1/iscsi/lvm-lv/vg/a/b", "invalid LV name \"a/b\""),
            ("s1/iscsi/zfs-zvol/tank", "tank"),
            ("s1/iscsi/zfs-zvol/tank/k8s/x", "expected <pool>/<name>"),
            ("s1/iscsi/zfs-zvol/tank/x@snap", "invalid character '@'"),
        ];
        for (value, reason) in cases {
            let e = VolumeHandle::parse(value).unwrap_err();
            assert_eq!(e.what, "volume handle");
            assert!(e.to_string().contains(reason), "{value}: {e}");
        }
        let e = VolumeHandle::new(
            "-s1",
            Protocol::Iscsi,
            AgentVolumeId::parse(Backend::LvmLv, "vg/lv").unwrap(),
        )
        .unwrap_err();
        assert!(e.reason.contains("start and end"), "{e}");
    }
}
