//! What the kernel and the API server show about one claim's volume, read
//! independently of pillar-csi: the storage CLIs (`zfs`, `lvs`), the
//! configfs trees of nvmet and LIO, and the PillarVolumeState as the admin
//! reads it. The claim tests assert on these and the demo prints them.
use crate::{run, Result};
use api::crd::{PillarVolumeState, VolumePhase};
use api::handle::{AgentVolumeId, VolumeHandle};
use api::tokens::Protocol;
use kube::api::Api;
use std::{fmt, fs, path::PathBuf};

/// The storage side of a volume: its zvol dataset or LV.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Storage {
    /// A zvol, by full dataset name.
    Zvol(String),
    /// A ZFS filesystem (a filesystem volume), by full dataset name.
    Filesystem(String),
    /// An LV, as `<vg>/<lv>`.
    Lv(String),
}

impl Storage {
    /// The storage of volume handle `handle`; a zvol's agent volume ID
    /// `<pool>/<name>` lives at `<parent dataset>/<name>`.
    pub fn of(handle: &str, parent_dataset: &str) -> Result<Self> {
        let handle = VolumeHandle::parse(handle)?;
        Ok(match handle.volume() {
            AgentVolumeId::Zvol(ds) | AgentVolumeId::Dataset(ds) => {
                let name = ds.to_string();
                let name = name.rsplit('/').next().unwrap_or_default();
                let full = format!("{parent_dataset}/{name}");
                match handle.volume() {
                    AgentVolumeId::Dataset(_) => Storage::Filesystem(full),
                    _ => Storage::Zvol(full),
                }
            }
            id @ AgentVolumeId::Lv { .. } => Storage::Lv(id.to_string()),
            AgentVolumeId::Directory { .. } => {
                return Err(
                    format!("{handle}: the claim witness reads no directory volumes").into(),
                )
            }
        })
    }

    /// Its size in bytes (`zfs get volsize` or `lvs`), or `None` when it
    /// does not exist.
    pub fn size(&self) -> Result<Option<u64>> {
        let out = match self {
            Storage::Zvol(ds) => run("zfs", &["get", "-Hp", "-o", "value", "volsize", ds]),
            Storage::Filesystem(ds) => run("zfs", &["get", "-Hp", "-o", "value", "refquota", ds]),
            Storage::Lv(lv) => run(
                "lvs",
                &[
                    "--noheadings",
                    "--units",
                    "b",
                    "--nosuffix",
                    "-o",
                    "lv_size",
                    lv,
                ],
            ),
        };
        match out {
            Ok(text) => Ok(Some(text.trim().parse()?)),
            Err(e) if self.absent(&e.to_string()) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    fn absent(&self, message: &str) -> bool {
        match self {
            Storage::Zvol(_) | Storage::Filesystem(_) => message.contains("does not exist"),
            Storage::Lv(_) => message.contains("Failed to find") || message.contains("not found"),
        }
    }
}

impl fmt::Display for Storage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Storage::Zvol(ds) => write!(f, "zvol {ds}"),
            Storage::Filesystem(ds) => write!(f, "filesystem {ds}"),
            Storage::Lv(lv) => write!(f, "LV {lv}"),
        }
    }
}

/// A volume's export: in configfs, the nvmet subsystem or LIO target named
/// by the publish context's `target`; over NFS, the kernel's export table
/// (`exportfs -v`) for the path the `target` names.
#[derive(Debug, Clone)]
pub struct Export {
    /// The protocol.
    pub protocol: Protocol,
    /// The subsystem NQN, target IQN or exported path.
    pub target: String,
}

impl Export {
    /// The export's configfs folder.
    pub fn dir(&self) -> PathBuf {
        match self.protocol {
            Protocol::NvmeofTcp => {
                PathBuf::from("/sys/kernel/config/nvmet/subsystems").join(&self.target)
            }
            Protocol::Iscsi => PathBuf::from("/sys/kernel/config/target/iscsi").join(&self.target),
            Protocol::Nfs | Protocol::Local => PathBuf::from(&self.target),
        }
    }

    /// The initiators the export admits (the subsystem's `allowed_hosts`,
    /// or the node ACLs of TPG 1), or `None` when the export is gone.
    pub fn admitted(&self) -> Result<Option<Vec<String>>> {
        let dir = self.dir();
        if self.protocol == Protocol::Nfs {
            let table = crate::nfs::exported()?;
            let mut clients: Vec<String> = table
                .lines()
                .filter_map(|l| {
                    let mut words = l.split_whitespace();
                    (words.next() == Some(self.target.as_str()))
                        .then(|| words.next())
                        .flatten()
                        .map(|c| c.split('(').next().unwrap_or_default().to_owned())
                })
                .collect();
            clients.sort();
            return Ok((!clients.is_empty()).then_some(clients));
        }
        if !dir.exists() {
            return Ok(None);
        }
        let list = match self.protocol {
            Protocol::NvmeofTcp | Protocol::Nfs | Protocol::Local => dir.join("allowed_hosts"),
            Protocol::Iscsi => dir.join("tpgt_1/acls"),
        };
        let mut names: Vec<String> = fs::read_dir(&list)?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        Ok(Some(names))
    }

    /// One line for people: where it is and whom it admits.
    pub fn describe(&self) -> Result<String> {
        Ok(match self.admitted()? {
            None => format!("{} is gone", self.dir().display()),
            Some(names) if names.is_empty() => {
                format!("{} exists, admits no initiator", self.dir().display())
            }
            Some(names) => format!("{} admits {}", self.dir().display(), names.join(", ")),
        })
    }
}

/// The PillarVolumeState named `name` as the admin reads it.
pub async fn record(admin: &kube::Client, name: &str) -> Result<Option<PillarVolumeState>> {
    Ok(Api::<PillarVolumeState>::all(admin.clone())
        .get_opt(name)
        .await?)
}

/// The record's phase and published nodes.
pub fn phase_and_nodes(record: &PillarVolumeState) -> (Option<VolumePhase>, Vec<String>) {
    let status = record.status.clone().unwrap_or_default();
    (
        status.phase,
        status
            .published_nodes
            .into_iter()
            .map(|n| n.node_id)
            .collect(),
    )
}

/// One line for people: the record's phase, published nodes and capacity.
pub fn describe_record(name: &str, record: Option<&PillarVolumeState>) -> String {
    match record {
        None => format!("PillarVolumeState {name} is gone"),
        Some(r) => {
            let (phase, nodes) = phase_and_nodes(r);
            let phase = phase.map_or("-".to_owned(), |p| format!("{p:?}"));
            let nodes = if nodes.is_empty() {
                "none".to_owned()
            } else {
                nodes
                    .iter()
                    .map(|n| n.split('/').next().unwrap_or_default())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            format!(
                "PillarVolumeState {name}: phase {phase}, publishedNodes {nodes}, capacityBytes {}",
                r.spec.capacity_bytes
            )
        }
    }
}
