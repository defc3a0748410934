//! The source of a CreateVolume that clones: checked and held under the
//! source's lock, which the clone's lock comes before.
use super::{blocking, snapshots::snapshots_of, Agent};
use crate::{
    backend::Backend,
    error::AgentError,
    marks::{BackendRecord, OriginRecord, SnapshotRecord},
    snapshot_id::{SnapshotId, CLONE_PREFIX},
    volume::VolumeId,
};
use std::sync::Arc;

/// What a new volume is cloned from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContentSource {
    /// A snapshot CreateSnapshot took.
    Snapshot(SnapshotId),
    /// A live volume, as it is now.
    Volume(VolumeId),
}

impl ContentSource {
    /// The source volume.
    pub fn volume(&self) -> &VolumeId {
        match self {
            ContentSource::Snapshot(s) => s.volume(),
            ContentSource::Volume(v) => v,
        }
    }

    /// The origin a clone of it records: the snapshot's name, or for a
    /// volume the snapshot of it that the clone `clone_uid` takes.
    pub(crate) fn origin(&self, clone_uid: &str) -> OriginRecord {
        OriginRecord {
            volume_id: self.volume().to_string(),
            snapshot: match self {
                ContentSource::Snapshot(s) => s.name(),
                ContentSource::Volume(_) => format!("{CLONE_PREFIX}{clone_uid}"),
            },
        }
    }
}

impl std::fmt::Display for ContentSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ContentSource::Snapshot(s) => write!(f, "snapshot {s}"),
            ContentSource::Volume(v) => write!(f, "volume {v}"),
        }
    }
}

/// An origin ready to clone: the source volume's record and the snapshot's
/// name and size.
pub(crate) struct Origin {
    pub at: BackendRecord,
    pub snapshot: String,
    pub size_bytes: u64,
}

impl Agent {
    /// Checks the source under its lock and returns the snapshot to clone.
    /// A volume source gets its snapshot now, recorded as deleted so it
    /// goes with the clone (see [`Agent::release_origin`]). `made` says the
    /// clone exists already (a retry): then a snapshot deleted since still
    /// names its origin.
    pub(crate) async fn hold_origin(
        &self,
        source: &ContentSource,
        origin: &OriginRecord,
        backend: &Arc<dyn Backend>,
        made: bool,
    ) -> Result<Origin, AgentError> {
        let mut txn = self.hold(source.volume()).await?;
        let missing =
            || AgentError::NotFound(format!("source {source} does not exist on this agent"));
        let at = txn.mark.backend.clone().ok_or_else(missing)?;
        let known = txn.mark.snapshots.get(&origin.snapshot).cloned();
        match (source, known) {
            (ContentSource::Snapshot(_), Some(record)) if made || !record.deleted => Ok(Origin {
                at,
                snapshot: origin.snapshot.clone(),
                size_bytes: record.size_bytes,
            }),
            (ContentSource::Snapshot(_), _) => Err(missing()),
            // A retry of the same clone finds its snapshot recorded.
            (ContentSource::Volume(_), Some(record)) => Ok(Origin {
                at,
                snapshot: origin.snapshot.clone(),
                size_bytes: record.size_bytes,
            }),
            (ContentSource::Volume(_), None) => {
                if txn.mark.retained || txn.mark.fence.live.is_none() {
                    return Err(missing());
                }
                let (b, a, n) = (backend.clone(), at.clone(), origin.snapshot.clone());
                let state = blocking(move || snapshots_of(&*b)?.take(&a, &n)).await?;
                let size_bytes = state.size_bytes;
                txn.mark.snapshots.insert(
                    origin.snapshot.clone(),
                    SnapshotRecord {
                        uid: origin.snapshot.trim_start_matches(CLONE_PREFIX).to_owned(),
                        guid: state.guid,
                        size_bytes,
                        creation: state.creation,
                        deleted: true,
                    },
                );
                txn.commit().await?;
                Ok(Origin {
                    at,
                    snapshot: origin.snapshot.clone(),
                    size_bytes,
                })
            }
        }
    }

    /// After a clone from a volume: marks the source's snapshot to go with
    /// the clone (a crash before this is finished by [`Agent::collect`]).
    pub(crate) async fn release_origin(
        &self,
        origin: &OriginRecord,
        backend: &Arc<dyn Backend>,
    ) -> Result<(), AgentError> {
        let id = VolumeId::parse(&origin.volume_id)?;
        let txn = self.hold(&id).await?;
        let Some(at) = txn.mark.backend.clone() else {
            return Ok(());
        };
        let (b, n) = (backend.clone(), origin.snapshot.clone());
        blocking(move || snapshots_of(&*b)?.delete(&at, &n).map(|_| ())).await
    }
}
