//! The storage node's invariants, checked over what was read of it: the
//! state folder's marks, the pool's or volume group's volumes, and the
//! nvmet and LIO configfs trees.
//!
//! [`check`] is pure over an [`Observed`] (the caller reads the machine, or
//! builds one in a test) and reports every [`Violation`]: a volume with no
//! mark, a mark with no volume (other than a recorded intent), an export no
//! mark records or a recorded export missing, a mark that does not parse,
//! an orphaned nvmet port, subsystem or host or LIO HBA or backstore, a
//! wrong device behind a namespace or LUN, two volumes on one device.
use crate::{
    export::{LioExporter, NvmetExporter, IQN_PREFIX, NQN_PREFIX},
    marks::{decode, BackendRecord, FenceMark, SUFFIX},
    volume::VolumeId,
};
use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

/// The prefix of every LIO storage object this agent makes.
const OBJECT_PREFIX: &str = "pillar-";

/// One volume of a pool or volume group, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedVolume {
    /// `pool/.../name` of a zvol or `vg/lv` of a logical volume.
    pub name: String,
    /// Its block device, resolved (for example `/dev/zd16`, `/dev/dm-3`).
    pub device: PathBuf,
}

/// What was read of a storage node.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// Every file of the state folder: name and bytes.
    pub files: Vec<(String, Vec<u8>)>,
    /// Every volume of the agent's pools and volume groups (not thin pools).
    pub volumes: Vec<ListedVolume>,
    /// The nvmet tree.
    pub nvmet: nvmet::State,
    /// The agent's own nvmet port, which stays when no subsystem is linked.
    pub agent_port: Option<nvmet::PortId>,
    /// The LIO tree.
    pub lio: lio::State,
    /// The index of every iblock HBA folder.
    pub lio_hbas: BTreeSet<u32>,
    /// Device paths named in configfs, resolved (a path missing here is
    /// compared as written).
    pub resolved: BTreeMap<PathBuf, PathBuf>,
    /// Whether reconciliation has run since the last change, so every
    /// recorded export must be in place.
    pub reconciled: bool,
}

/// One broken invariant.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Violation {
    /// A file of the state folder that is not a readable mark of its volume.
    CorruptMark {
        /// The file.
        file: String,
        /// Why.
        why: String,
    },
    /// A volume of the pool that no mark records.
    UnrecordedVolume(String),
    /// A mark whose committed volume (identity pinned) does not exist.
    MissingVolume {
        /// The volume ID.
        volume: String,
        /// The backend volume it records.
        backend: String,
    },
    /// Two marks recording one backend volume.
    SharedVolume {
        /// The backend volume.
        backend: String,
        /// The volume IDs.
        volumes: Vec<String>,
    },
    /// An export of this agent in configfs that no live mark records.
    UnrecordedExport(String),
    /// A recorded export missing after reconciliation.
    MissingExport {
        /// The volume ID.
        volume: String,
        /// The protocol.
        protocol: String,
    },
    /// A recorded export whose access differs from its record.
    ExportDiffers {
        /// The volume ID.
        volume: String,
        /// What differs.
        why: String,
    },
    /// A namespace or LUN serving another device than its volume's.
    WrongDevice {
        /// The export (subsystem NQN or storage object).
        export: String,
        /// The device it serves.
        serves: PathBuf,
        /// The volume's device.
        expected: PathBuf,
    },
    /// Two exports of different volumes serving one device.
    SharedDevice {
        /// The device.
        device: PathBuf,
        /// The exports.
        exports: Vec<String>,
    },
    /// An nvmet port linking no subsystem (other than the agent's own).
    OrphanPort(u16),
    /// An nvmet subsystem of this agent linked to no port.
    OrphanSubsystem(String),
    /// An nvmet host no subsystem allows.
    OrphanHost(String),
    /// An iblock HBA holding no storage object.
    OrphanHba(u32),
    /// A storage object of this agent no LUN serves.
    OrphanBackstore(String),
}

/// The backend volume a record names (`pool/.../name` or `vg/lv`) and
/// whether its identity is pinned (a committed create or import; an intent
/// written before the backend call has none).
fn backend_name(record: &BackendRecord) -> (String, bool) {
    match record {
        BackendRecord::Zvol { dataset, guid } | BackendRecord::Dataset { dataset, guid } => {
            (dataset.clone(), guid.is_some())
        }
        BackendRecord::Directory { path, inode, .. } => (path.clone(), inode.is_some()),
        BackendRecord::Lv { vg, lv, lv_uuid } => (format!("{vg}/{lv}"), lv_uuid.is_some()),
    }
}

/// Parses one state-folder file as a mark.
fn parse(file: &str, bytes: &[u8]) -> Result<FenceMark, String> {
    let id = file
        .strip_suffix(SUFFIX)
        .and_then(decode)
        .ok_or("not a mark file name")?;
    let mark = crate::marks::parse(&id, bytes)?;
    VolumeId::parse(&id).map_err(|e| e.to_string())?;
    Ok(mark)
}

/// Every violation in `seen`, sorted.
pub fn check(seen: &Observed) -> Vec<Violation> {
    let mut out = Vec::new();
    let marks = marks(seen, &mut out);
    volumes(seen, &marks, &mut out);
    exports(seen, &marks, &mut out);
    orphans(seen, &mut out);
    out.sort();
    out.dedup();
    out
}

/// The parsed marks by volume ID; the others reported.
fn marks(seen: &Observed, out: &mut Vec<Violation>) -> BTreeMap<String, FenceMark> {
    let mut marks = BTreeMap::new();
    for (file, bytes) in &seen.files {
        match parse(file, bytes) {
            Ok(mark) => {
                marks.insert(mark.volume_id.clone(), mark);
            }
            Err(why) => out.push(Violation::CorruptMark {
                file: file.clone(),
                why,
            }),
        }
    }
    marks
}

fn volumes(seen: &Observed, marks: &BTreeMap<String, FenceMark>, out: &mut Vec<Violation>) {
    let listed: BTreeSet<&str> = seen.volumes.iter().map(|v| v.name.as_str()).collect();
    let mut owners: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (id, mark) in marks {
        let Some(record) = &mark.backend else {
            continue;
        };
        let (name, pinned) = backend_name(record);
        if pinned && !listed.contains(name.as_str()) {
            out.push(Violation::MissingVolume {
                volume: id.clone(),
                backend: name.clone(),
            });
        }
        owners.entry(name).or_default().push(id.clone());
    }
    for v in &seen.volumes {
        let adopted = marks.values().any(|m| {
            m.adopted
                .as_ref()
                .is_some_and(|a| backend_name(&crate::service::pinned(a)).0 == v.name)
        });
        if !owners.contains_key(&v.name) && !adopted {
            out.push(Violation::UnrecordedVolume(v.name.clone()));
        }
    }
    for (backend, volumes) in owners {
        if volumes.len() > 1 {
            out.push(Violation::SharedVolume { backend, volumes });
        }
    }
}

fn resolved<'a>(seen: &'a Observed, path: &'a Path) -> &'a Path {
    seen.resolved.get(path).map_or(path, PathBuf::as_path)
}

/// Recorded exports against configfs, and the device behind each.
fn exports(seen: &Observed, marks: &BTreeMap<String, FenceMark>, out: &mut Vec<Violation>) {
    let devices: BTreeMap<&str, &Path> = seen
        .volumes
        .iter()
        .map(|v| (v.name.as_str(), v.device.as_path()))
        .collect();
    let mut expected_nqns = BTreeSet::new();
    let mut expected_iqns = BTreeSet::new();
    let mut expected_objects = BTreeSet::new();
    // Which volume's export serves each device.
    let mut served: BTreeMap<PathBuf, BTreeSet<String>> = BTreeMap::new();
    for (id, mark) in marks {
        let (Some(_), Some(record)) = (&mark.fence.live, &mark.backend) else {
            continue;
        };
        let Ok(vid) = VolumeId::parse(id) else {
            continue;
        };
        let device = devices.get(backend_name(record).0.as_str()).copied();
        for (protocol, export) in &mark.exports {
            match protocol.as_str() {
                "nvmeof-tcp" => {
                    let Ok(nqn) = NvmetExporter::nqn_of(&vid, export) else {
                        continue;
                    };
                    expected_nqns.insert(nqn.to_string());
                    let Some(sub) = seen.nvmet.subsystems.get(&nqn) else {
                        if seen.reconciled {
                            out.push(Violation::MissingExport {
                                volume: id.clone(),
                                protocol: protocol.clone(),
                            });
                        }
                        continue;
                    };
                    let hosts: BTreeSet<String> =
                        sub.allowed_hosts.iter().map(|h| h.to_string()).collect();
                    let want: BTreeSet<String> = if export.acl {
                        export.allowed_initiators.clone()
                    } else {
                        BTreeSet::new()
                    };
                    if sub.allow_any_host == export.acl || hosts != want {
                        out.push(Violation::ExportDiffers {
                            volume: id.clone(),
                            why: format!(
                                "nvmet allows any host: {}, hosts {hosts:?}; recorded ACL {}, {want:?}",
                                sub.allow_any_host, export.acl
                            ),
                        });
                    }
                    for ns in sub.namespaces.values() {
                        let serves = resolved(seen, &ns.device_path);
                        compare(nqn.as_str(), serves, device, out);
                        served
                            .entry(serves.to_path_buf())
                            .or_default()
                            .insert(id.clone());
                    }
                }
                "iscsi" => {
                    let (Ok(iqn), Ok(object)) =
                        (LioExporter::iqn_of(&vid, export), LioExporter::object(&vid))
                    else {
                        continue;
                    };
                    expected_iqns.insert(iqn.to_string());
                    expected_objects.insert(object.to_string());
                    let (Some(target), Some(so)) = (
                        seen.lio.targets.get(&iqn),
                        seen.lio.storage_objects.get(&object),
                    ) else {
                        if seen.reconciled {
                            out.push(Violation::MissingExport {
                                volume: id.clone(),
                                protocol: protocol.clone(),
                            });
                        }
                        continue;
                    };
                    let acls: BTreeSet<String> = target
                        .tpgs
                        .values()
                        .flat_map(|t| t.acls.keys().map(|a| a.to_string()))
                        .collect();
                    let want: BTreeSet<String> = if export.acl {
                        export.allowed_initiators.clone()
                    } else {
                        BTreeSet::new()
                    };
                    if acls != want {
                        out.push(Violation::ExportDiffers {
                            volume: id.clone(),
                            why: format!("LIO node ACLs {acls:?}, recorded {want:?}"),
                        });
                    }
                    let serves = resolved(seen, &so.udev_path);
                    compare(object.as_str(), serves, device, out);
                    served
                        .entry(serves.to_path_buf())
                        .or_default()
                        .insert(id.clone());
                }
                _ => out.push(Violation::CorruptMark {
                    file: format!("{}{SUFFIX}", crate::marks::encode(id)),
                    why: format!("unknown protocol {protocol:?}"),
                }),
            }
        }
    }
    for nqn in seen.nvmet.subsystems.keys() {
        if nqn.as_str().starts_with(NQN_PREFIX) && !expected_nqns.contains(nqn.as_str()) {
            out.push(Violation::UnrecordedExport(nqn.to_string()));
        }
    }
    for iqn in seen.lio.targets.keys() {
        if iqn.as_str().starts_with(IQN_PREFIX) && !expected_iqns.contains(iqn.as_str()) {
            out.push(Violation::UnrecordedExport(iqn.to_string()));
        }
    }
    for object in seen.lio.storage_objects.keys() {
        let name = object.to_string();
        if name.starts_with(OBJECT_PREFIX) && !expected_objects.contains(&name) {
            out.push(Violation::UnrecordedExport(name));
        }
    }
    for (device, volumes) in served {
        if volumes.len() > 1 {
            out.push(Violation::SharedDevice {
                device,
                exports: volumes.into_iter().collect(),
            });
        }
    }
}

fn compare(export: &str, serves: &Path, expected: Option<&Path>, out: &mut Vec<Violation>) {
    // A volume that is not listed is reported as missing already.
    if let Some(expected) = expected.filter(|e| *e != serves) {
        out.push(Violation::WrongDevice {
            export: export.to_owned(),
            serves: serves.to_path_buf(),
            expected: expected.to_path_buf(),
        });
    }
}

/// Objects that hang on nothing.
fn orphans(seen: &Observed, out: &mut Vec<Violation>) {
    let linked: BTreeSet<&nvmet::Nqn> = seen
        .nvmet
        .ports
        .values()
        .flat_map(|p| p.subsystems.iter())
        .collect();
    for (id, port) in &seen.nvmet.ports {
        if port.subsystems.is_empty() && Some(*id) != seen.agent_port {
            out.push(Violation::OrphanPort(id.0));
        }
    }
    for nqn in seen.nvmet.subsystems.keys() {
        if nqn.as_str().starts_with(NQN_PREFIX) && !linked.contains(nqn) {
            out.push(Violation::OrphanSubsystem(nqn.to_string()));
        }
    }
    let allowed: BTreeSet<&nvmet::Nqn> = seen
        .nvmet
        .subsystems
        .values()
        .flat_map(|s| s.allowed_hosts.iter())
        .collect();
    for host in &seen.nvmet.hosts {
        if !allowed.contains(host) {
            out.push(Violation::OrphanHost(host.to_string()));
        }
    }
    let used: BTreeSet<u32> = seen
        .lio
        .storage_objects
        .values()
        .filter_map(|so| so.hba)
        .collect();
    for hba in seen.lio_hbas.difference(&used) {
        out.push(Violation::OrphanHba(*hba));
    }
    let served: BTreeSet<&lio::StorageObjectName> = seen
        .lio
        .targets
        .values()
        .flat_map(|t| t.tpgs.values())
        .flat_map(|tpg| tpg.luns.values().map(|l| &l.storage_object))
        .collect();
    for object in seen.lio.storage_objects.keys() {
        if object.as_str().starts_with(OBJECT_PREFIX) && !served.contains(object) {
            out.push(Violation::OrphanBackstore(object.to_string()));
        }
    }
}

#[cfg(test)]
#[path = "invariants_tests.rs"]
mod tests;
