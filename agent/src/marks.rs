//! Durable fence marks: one file per volume ID under the state directory.
//!
//! A mark holds the volume's fence (lifecycle, generation, ended UIDs), its
//! backend identity and every export with its allowed initiators: enough to
//! re-create the volatile configfs state after a reboot. Files are written
//! atomically (temporary file, fsync, rename, fsync of the folder) and never
//! edited by hand. The file name is a reversible encoding of the volume ID
//! (every byte outside `[A-Za-z0-9_-]` as `%XX`), so no ID can name a path
//! outside the folder.
use crate::durable::{self, DurableError};
use crate::fence::Fence;
use serde::{Deserialize, Serialize};
use std::{
    collections::BTreeMap,
    fs, io,
    path::{Path, PathBuf},
};

/// The format version written in every mark.
pub const MARK_VERSION: u32 = 1;
/// The file name suffix of a mark (`<encoded volume ID>.mark.json`).
pub const SUFFIX: &str = ".mark.json";
/// The longest encoded file name (stays under the usual 255-byte limit).
const MAX_FILE_NAME: usize = 250;

/// How a volume is exported over one protocol.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportRecord {
    /// Only `allowed_initiators` may connect.
    pub acl: bool,
    /// Host NQNs or initiator IQNs.
    pub allowed_initiators: std::collections::BTreeSet<String>,
    /// iSCSI CHAP every allowed initiator must present; `None`: no CHAP.
    /// Kept in the mark (the state folder is the agent's, root only) so a
    /// restart or resync re-applies it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chap: Option<ChapRecord>,
    /// The target name (subsystem NQN or target IQN) the export was made
    /// under; `None`: the legacy name of exports made before names carried
    /// the agent (see `crate::export::TargetNames`), kept until the export
    /// is removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

/// One-way iSCSI CHAP credentials of an export. `Debug` hides the password.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChapRecord {
    /// The user name the initiator presents.
    pub username: String,
    /// The secret.
    pub password: String,
}

impl std::fmt::Debug for ChapRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChapRecord")
            .field("username", &self.username)
            .field("password", &"<hidden>")
            .finish()
    }
}

/// Where the volume lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum BackendRecord {
    /// A zvol.
    Zvol {
        /// Its full dataset name.
        dataset: String,
        /// The zvol's GUID (the `guid` property), pinned at creation or
        /// import: an export, resize or removal checks it, so a zvol renamed
        /// away and re-created under the same name is never touched. Marks
        /// written before the pin existed have none and are not checked.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        guid: Option<String>,
    },
    /// A ZFS filesystem (a filesystem volume, exported over NFS).
    Dataset {
        /// Its full dataset name.
        dataset: String,
        /// The filesystem's GUID, pinned at creation: an export, resize or
        /// removal checks it, so a filesystem renamed away and re-created
        /// under the same name is never touched.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        guid: Option<String>,
    },
    /// A directory bounded by a project quota (a filesystem volume,
    /// exported over NFS).
    Directory {
        /// Its absolute path.
        path: String,
        /// The directory's inode, pinned at creation.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        inode: Option<u64>,
        /// Its project ID, pinned at creation: with the inode, what an
        /// export, resize or removal checks, so a directory removed and
        /// made again under the same path is never touched.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        project: Option<u32>,
    },
    /// A logical volume.
    Lv {
        /// Volume group.
        vg: String,
        /// Logical volume.
        lv: String,
        /// The LV's UUID, pinned at creation: a removal or export checks it,
        /// so a renamed or re-created LV under the same name is never touched.
        #[serde(default, rename = "lvUuid", skip_serializing_if = "Option::is_none")]
        lv_uuid: Option<String>,
    },
}

/// An existing volume the agent adopted instead of creating: the pin a later
/// import of the same volume ID is checked against.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum AdoptedSource {
    /// An imported zvol (an ordinary volume after the import: a successful
    /// DeleteVolume destroys it and drops this record).
    #[serde(rename_all = "camelCase")]
    Zvol {
        /// The dataset that was named in the import.
        dataset: String,
    },
    /// An adopted ZFS filesystem, always preserved: the pin outlives
    /// every lifecycle (the filesystem's GUID is pinned in the backend
    /// record of each).
    #[serde(rename_all = "camelCase")]
    Dataset {
        /// The filesystem that was named in the import.
        dataset: String,
    },
    /// An adopted directory, always preserved: the pin outlives every
    /// lifecycle (its inode and project are pinned in the backend record
    /// of each).
    #[serde(rename_all = "camelCase")]
    Directory {
        /// The directory that was named in the import.
        path: String,
    },
    /// An adopted LV, its identity and policy pinned. The pin of a
    /// PreserveOriginal LV outlives every lifecycle.
    #[serde(rename_all = "camelCase")]
    Lv {
        /// Volume group.
        vg: String,
        /// Logical volume.
        lv: String,
        /// The VG's UUID.
        vg_uuid: String,
        /// The LV's UUID.
        lv_uuid: String,
        /// PreserveOriginal (true) or Managed (false).
        preserve_original: bool,
    },
}

impl AdoptedSource {
    /// Whether the original must be preserved (a PreserveOriginal LV, an
    /// adopted filesystem or directory).
    pub fn preserves(&self) -> bool {
        self.is_filesystem()
            || matches!(
                self,
                AdoptedSource::Lv {
                    preserve_original: true,
                    ..
                }
            )
    }

    /// Whether the source is a filesystem served over NFS (a ZFS
    /// filesystem or a directory): kept as it is, its identity checked by
    /// the backend's lookup.
    pub fn is_filesystem(&self) -> bool {
        matches!(
            self,
            AdoptedSource::Dataset { .. } | AdoptedSource::Directory { .. }
        )
    }
}

/// What the libblkid signature probe (`blkid -p`, in-process) found on an
/// adopted volume's device when it was imported. A record for operators and
/// for the node's format-only-blank rule; never a reason to refuse.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "camelCase")]
pub enum ProbeRecord {
    /// A filesystem superblock.
    #[serde(rename_all = "camelCase")]
    Filesystem {
        /// Its type (`ext4`, `xfs`, ...).
        filesystem_type: String,
    },
    /// A partition table and no filesystem on the whole device.
    #[serde(rename_all = "camelCase")]
    PartitionTable {
        /// Its type (`gpt`, `dos`).
        partition_table_type: String,
    },
    /// Another signature (swap, RAID member, LVM PV, crypto, ...).
    #[serde(rename_all = "camelCase")]
    Other {
        /// libblkid's `TYPE`.
        signature_type: String,
        /// libblkid's `USAGE`, when reported.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        usage: Option<String>,
    },
    /// The probe ran and found no signature.
    Blank,
    /// The probe could not decide (open or read failed, ambiguous result).
    Unknown {
        /// Why.
        reason: String,
    },
}

impl From<&sys::blkid::Probe> for ProbeRecord {
    fn from(p: &sys::blkid::Probe) -> Self {
        use sys::blkid::Probe;
        match p {
            Probe::Filesystem { fs_type } => ProbeRecord::Filesystem {
                filesystem_type: fs_type.clone(),
            },
            Probe::PartitionTable { pt_type } => ProbeRecord::PartitionTable {
                partition_table_type: pt_type.clone(),
            },
            Probe::Other { kind, usage } => ProbeRecord::Other {
                signature_type: kind.clone(),
                usage: usage.clone(),
            },
            Probe::Blank => ProbeRecord::Blank,
            Probe::Unknown(why) => ProbeRecord::Unknown {
                reason: why.clone(),
            },
        }
    }
}

impl BackendRecord {
    /// Whether the volume is a filesystem (a ZFS filesystem or a
    /// directory, exported over NFS) rather than a block device.
    pub fn is_filesystem(&self) -> bool {
        matches!(
            self,
            BackendRecord::Dataset { .. } | BackendRecord::Directory { .. }
        )
    }
}

impl std::fmt::Display for BackendRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackendRecord::Zvol { dataset, .. } => write!(f, "zvol {dataset}"),
            BackendRecord::Dataset { dataset, .. } => write!(f, "filesystem {dataset}"),
            BackendRecord::Directory { path, .. } => write!(f, "directory {path}"),
            BackendRecord::Lv { vg, lv, .. } => write!(f, "logical volume {vg}/{lv}"),
        }
    }
}

/// Everything the agent records about one volume ID.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FenceMark {
    /// Format version ([`MARK_VERSION`]).
    pub version: u32,
    /// The agent volume ID.
    pub volume_id: String,
    /// Fencing state.
    pub fence: Fence,
    /// The backend volume, once created.
    pub backend: Option<BackendRecord>,
    /// Exports by protocol name (`nvmeof-tcp`, `iscsi`).
    pub exports: BTreeMap<String, ExportRecord>,
    /// The adopted source, when the volume was imported rather than created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adopted: Option<AdoptedSource>,
    /// What the signature probe found on the device at the last import that
    /// adopted it (kept with `adopted`, dropped with it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub import_probe: Option<ProbeRecord>,
    /// The metadata-loss recovery that moved the volume to its live
    /// lifecycle, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovered: Option<RecoveryRecord>,
    /// The snapshots of the volume this agent took, by snapshot name (the
    /// part after `@`): the only ones it may ever destroy.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub snapshots: BTreeMap<String, SnapshotRecord>,
    /// The volume was deleted while snapshots of it remained: it is kept
    /// hidden until the last of them is gone, then destroyed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retained: bool,
    /// The snapshot the volume was cloned from, when it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<OriginRecord>,
}

/// A snapshot the agent took.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotRecord {
    /// Its owner's UID (a CreateSnapshot's `snapshot_uid`, or for the
    /// internal snapshot of a clone-from-volume the clone's volume UID).
    pub uid: String,
    /// Its GUID, pinned when it was taken: a snapshot of the same name
    /// with another GUID is not this agent's.
    pub guid: String,
    /// The source's size when it was taken.
    pub size_bytes: u64,
    /// When it was taken, seconds since the Unix epoch.
    pub creation: u64,
    /// DeleteSnapshot was called (or the snapshot is the internal one of
    /// a clone-from-volume): it is no longer listed, and lives only while
    /// clones need it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleted: bool,
}

/// Where a cloned volume came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OriginRecord {
    /// The source volume's ID.
    pub volume_id: String,
    /// The snapshot's name (after `@`).
    pub snapshot: String,
}

/// A committed TransferVolumeOwnership: the grant and the lifecycle it ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecoveryRecord {
    /// Hex SHA-256 of the authorization, signature cleared.
    pub authorization_digest: String,
    /// The lifecycle the grant retired.
    pub old_volume_uid: String,
    /// Its generation.
    pub old_generation: u64,
}

impl FenceMark {
    /// An empty mark for `volume_id`.
    pub fn new(volume_id: &str) -> Self {
        Self {
            version: MARK_VERSION,
            volume_id: volume_id.to_owned(),
            fence: Fence::default(),
            backend: None,
            exports: BTreeMap::new(),
            adopted: None,
            import_probe: None,
            recovered: None,
            snapshots: BTreeMap::new(),
            retained: false,
            origin: None,
        }
    }
}

/// A failure of the mark store.
#[derive(Debug, thiserror::Error)]
pub enum MarkError {
    /// The mark exists but cannot be read as a mark.
    #[error(
        "fence mark of volume {volume_id} at {path} is corrupt: {why}; the volume is left alone"
    )]
    Corrupt {
        /// The volume.
        volume_id: String,
        /// The file.
        path: PathBuf,
        /// The parse error.
        why: String,
    },
    /// The volume ID cannot be a file name.
    #[error("volume ID {0:?} is too long to record")]
    TooLong(String),
    /// The new mark was renamed into place, but the folder could not be
    /// made durable: whether it survives a crash is unknown.
    #[error("fence mark {path} was renamed into place but not made durable: {source}")]
    Unsynced {
        /// The folder.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The file system refused.
    #[error("fence mark store {path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> MarkError + '_ {
    move |source| MarkError::Io {
        path: path.to_owned(),
        source,
    }
}

impl From<DurableError> for MarkError {
    fn from(e: DurableError) -> Self {
        match e {
            DurableError::Io { path, source } => MarkError::Io { path, source },
            DurableError::Unsynced { path, source } => MarkError::Unsynced { path, source },
        }
    }
}

/// Encodes a volume ID as a file name stem.
pub fn encode(volume_id: &str) -> String {
    let mut out = String::with_capacity(volume_id.len());
    for b in volume_id.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Decodes a file name stem made by [`encode`].
pub fn decode(stem: &str) -> Option<String> {
    let bytes = stem.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = stem.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Reads the contents of a mark file as the mark of `volume_id`: the one
/// parser of marks read from disk ([`MarkStore::load`] and the invariant
/// checker use it). Refuses, with the reason, anything that is not a mark
/// of this format for exactly this volume ID.
pub fn parse(volume_id: &str, bytes: &[u8]) -> Result<FenceMark, String> {
    let mark: FenceMark = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    if mark.volume_id != volume_id || mark.version != MARK_VERSION {
        return Err(format!(
            "records volume {:?} in format {}, expected {volume_id:?} in format {MARK_VERSION}",
            mark.volume_id, mark.version
        ));
    }
    Ok(mark)
}

/// The contents of the file [`MarkStore::save`] writes for `mark`; [`parse`]
/// reads them back as the same mark.
pub fn render(mark: &FenceMark) -> Result<Vec<u8>, serde_json::Error> {
    serde_json::to_vec_pretty(mark)
}

/// The folder of marks.
#[derive(Debug, Clone)]
pub struct MarkStore {
    dir: PathBuf,
}

impl MarkStore {
    /// Opens (creating if needed, mode 0700) the folder of marks. A folder
    /// it creates is made durable in its parent before any mark is written.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, MarkError> {
        let dir = dir.into();
        durable::create_private_dir(&dir)?;
        // Temporary files of writes a killed process never renamed into
        // place are no marks, and nothing else would ever remove them.
        durable::remove_stale_temporaries(&dir)?;
        Ok(Self { dir })
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, volume_id: &str) -> Result<PathBuf, MarkError> {
        let name = format!("{}{SUFFIX}", encode(volume_id));
        if name.len() > MAX_FILE_NAME {
            return Err(MarkError::TooLong(volume_id.to_owned()));
        }
        Ok(self.dir.join(name))
    }

    /// Reads the mark of `volume_id`; `None` when there is none.
    pub fn load(&self, volume_id: &str) -> Result<Option<FenceMark>, MarkError> {
        let path = self.path(volume_id)?;
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err(&path)(e)),
        };
        parse(volume_id, &bytes)
            .map(Some)
            .map_err(|why| MarkError::Corrupt {
                volume_id: volume_id.to_owned(),
                path,
                why,
            })
    }

    /// Writes `mark` atomically and durably. Each write has a temporary
    /// file of its own, so two writes at once never share one.
    pub fn save(&self, mark: &FenceMark) -> Result<(), MarkError> {
        let path = self.path(&mark.volume_id)?;
        let body = render(mark).map_err(|e| MarkError::Io {
            path: path.clone(),
            source: io::Error::other(e),
        })?;
        Ok(durable::replace(&self.dir, &path, &body, || {
            crate::crash::point("mark-written-unrenamed")
        })?)
    }

    /// Removes the mark of `volume_id` (only to undo an intent this agent
    /// just wrote); absent is fine.
    pub fn remove(&self, volume_id: &str) -> Result<(), MarkError> {
        let path = self.path(volume_id)?;
        Ok(durable::remove(&self.dir, &path)?)
    }

    /// Every volume ID with a mark file, sorted.
    pub fn volume_ids(&self) -> Result<Vec<String>, MarkError> {
        let mut ids = Vec::new();
        for entry in fs::read_dir(&self.dir).map_err(io_err(&self.dir))? {
            let entry = entry.map_err(io_err(&self.dir))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(id) = name.strip_suffix(SUFFIX).and_then(decode) {
                ids.push(id);
            }
        }
        ids.sort();
        Ok(ids)
    }
}

#[cfg(test)]
#[path = "marks_tests.rs"]
mod tests;
