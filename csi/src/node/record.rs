//! Staging records: one JSON file per staged volume under the plugin's state
//! folder, saying what was connected, which device and which filesystem, so
//! that Unstage (and a repeated Stage) after a restart of the plugin knows
//! what to undo. Written atomically: a temporary file, fsync, rename, fsync
//! of the folder; a reader sees the old record or the new one.
use super::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::{
    fs,
    io::Write,
    path::{Path, PathBuf},
};

/// How far a Stage got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Phase {
    /// Written before connecting: a connection may exist.
    Attaching,
    /// Connected; the device is known; not yet formatted or mounted.
    Attached,
    /// Stage finished.
    Staged,
}

/// What one staged volume holds on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StagingRecord {
    /// The CSI volume ID.
    pub volume_id: String,
    /// The staging path kubelet gave.
    pub staging_path: PathBuf,
    /// The publish context, as CSI's map (protocol, address, port, target,
    /// lun; CHAP is not kept).
    pub protocol: String,
    /// The target's address.
    pub address: String,
    /// The target's port.
    pub port: u16,
    /// The subsystem NQN or target IQN.
    pub target: String,
    /// The namespace ID or LUN.
    pub lun: u32,
    /// `None` for a block volume, else the filesystem type.
    pub fs_type: Option<String>,
    /// The mount flags asked for.
    pub mount_flags: Vec<String>,
    /// The device node, once known (`/dev/nvme0n1`).
    pub device: Option<PathBuf>,
    /// The disk's identity when Stage found it (its sysfs `wwid`: an NVMe
    /// namespace's UUID, NGUID or EUI, a SCSI LUN's NAA or T10 name), checked
    /// before every later use of `device`: the kernel gives a lost disk's
    /// name to the next disk that comes. `None` in records written before
    /// it was kept, or for a disk that shows none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_id: Option<String>,
    /// How far Stage got.
    pub phase: Phase,
}

impl StagingRecord {
    /// Whether another record uses the same connection (the same NVMe
    /// subsystem, or the same iSCSI target at the same portal).
    pub fn shares_connection(&self, other: &StagingRecord) -> bool {
        self.protocol == other.protocol
            && self.target == other.target
            && self.address == other.address
            && self.port == other.port
    }
}

/// The folder of staging records.
#[derive(Debug, Clone)]
pub struct Records {
    dir: PathBuf,
}

/// A volume ID as a file name: `/` and `%` escaped, nothing else changed.
fn file_name(volume_id: &str) -> String {
    let escaped = volume_id.replace('%', "%25").replace('/', "%2F");
    format!("{escaped}.json")
}

impl Records {
    /// Records under `dir` (created if missing).
    pub fn open(dir: &Path) -> Result<Self> {
        fs::create_dir_all(dir).map_err(|e| Error::io(dir.display(), e))?;
        Ok(Self {
            dir: dir.to_owned(),
        })
    }

    fn path(&self, volume_id: &str) -> PathBuf {
        self.dir.join(file_name(volume_id))
    }

    /// The record of `volume_id`, if any.
    pub fn load(&self, volume_id: &str) -> Result<Option<StagingRecord>> {
        let path = self.path(volume_id);
        match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| Error::internal(format!("staging record {}: {e}", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(path.display(), e)),
        }
    }

    /// Every record (a file that does not parse is an error naming it).
    pub fn all(&self) -> Result<Vec<StagingRecord>> {
        let mut out = Vec::new();
        let entries = fs::read_dir(&self.dir).map_err(|e| Error::io(self.dir.display(), e))?;
        for entry in entries {
            let path = entry.map_err(|e| Error::io(self.dir.display(), e))?.path();
            if path.extension().is_some_and(|e| e == "json") {
                let bytes = fs::read(&path).map_err(|e| Error::io(path.display(), e))?;
                out.push(serde_json::from_slice(&bytes).map_err(|e| {
                    Error::internal(format!("staging record {}: {e}", path.display()))
                })?);
            }
        }
        Ok(out)
    }

    /// Writes `record` atomically.
    pub fn save(&self, record: &StagingRecord) -> Result<()> {
        let path = self.path(&record.volume_id);
        let tmp = path.with_extension("json.tmp");
        let bytes = serde_json::to_vec_pretty(record)
            .map_err(|e| Error::internal(format!("encoding {}: {e}", path.display())))?;
        let write = || -> std::io::Result<()> {
            let mut f = fs::File::create(&tmp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
            fs::rename(&tmp, &path)?;
            fs::File::open(&self.dir)?.sync_all()
        };
        write().map_err(|e| Error::io(path.display(), e))
    }

    /// Deletes the record of `volume_id` (none is fine), durably.
    pub fn remove(&self, volume_id: &str) -> Result<()> {
        let path = self.path(volume_id);
        match fs::remove_file(&path) {
            Ok(()) => fs::File::open(&self.dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| Error::io(self.dir.display(), e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(path.display(), e)),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn record(id: &str, target: &str) -> StagingRecord {
        StagingRecord {
            volume_id: id.into(),
            staging_path: "/staging/a".into(),
            protocol: "nvmeof-tcp".into(),
            address: "127.0.0.1".into(),
            port: 4420,
            target: target.into(),
            lun: 1,
            fs_type: Some("ext4".into()),
            mount_flags: vec![],
            device: None,
            device_id: None,
            phase: Phase::Attaching,
        }
    }

    #[test]
    fn records_round_trip_list_and_go() {
        let dir = tempfile::tempdir().unwrap();
        let r = Records::open(&dir.path().join("node")).unwrap();
        let a = record("storage-1/nvmeof-tcp/zfs-zvol/tank/a%b", "nqn.a");
        assert_eq!(r.load(&a.volume_id).unwrap(), None);
        r.save(&a).unwrap();
        let mut b = record("storage-1/nvmeof-tcp/zfs-zvol/tank/b", "nqn.a");
        b.phase = Phase::Staged;
        r.save(&b).unwrap();
        assert_eq!(r.load(&a.volume_id).unwrap(), Some(a.clone()));
        assert_eq!(r.all().unwrap().len(), 2);
        assert!(a.shares_connection(&b));
        assert!(!a.shares_connection(&record("x", "nqn.b")));
        r.remove(&a.volume_id).unwrap();
        r.remove(&a.volume_id).unwrap();
        assert_eq!(r.all().unwrap(), vec![b]);
        let names: Vec<_> = fs::read_dir(dir.path().join("node"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(
            names,
            vec!["storage-1%2Fnvmeof-tcp%2Fzfs-zvol%2Ftank%2Fb.json"]
        );
    }
}
