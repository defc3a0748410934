//! CreateSnapshot, DeleteSnapshot and ListSnapshots, and the collection of
//! volumes kept for their snapshots.
//!
//! A snapshot is recorded in its source volume's mark and handled under the
//! source's lock. Lock order: a clone's lock before its source's (a
//! CreateVolume from a source holds both); the collection holds one lock at
//! a time.
use super::{blocking, recorded, Agent};
use crate::{
    backend::{Backend, BackendKind, Snapshots},
    error::AgentError,
    fence::{Call, Token},
    marks::SnapshotRecord,
    snapshot_id::{SnapshotId, SNAPSHOT_PREFIX},
    volume::VolumeId,
};
use std::sync::Arc;
use tracing::{info, warn};

/// A snapshot the agent took, as the RPCs report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// Its ID.
    pub id: SnapshotId,
    /// The source's size when it was taken.
    pub size_bytes: u64,
    /// When it was taken, seconds since the Unix epoch.
    pub creation: u64,
}

/// The snapshots of a backend, or UNIMPLEMENTED naming it.
pub(crate) fn snapshots_of(backend: &dyn Backend) -> Result<&dyn Snapshots, AgentError> {
    backend.snapshots().ok_or_else(|| {
        AgentError::Unimplemented(format!(
            "the {:?} backend of {:?} takes no snapshots; snapshots and clones are served on ZFS backends",
            backend.kind(),
            backend.pool()
        ))
    })
}

impl Agent {
    /// The backend of `id`, refused when it takes no snapshots.
    fn snapshot_backend(
        &self,
        id: &VolumeId,
        kind: Option<BackendKind>,
    ) -> Result<Arc<dyn Backend>, AgentError> {
        let backend = self.backend(id, kind)?;
        backend.locate(id)?;
        snapshots_of(&*backend)?;
        Ok(backend)
    }

    /// CreateSnapshot.
    pub async fn create_snapshot(
        self: &Arc<Self>,
        source: &str,
        kind: Option<BackendKind>,
        uid: &str,
        token: Option<&Token>,
    ) -> Result<SnapshotInfo, AgentError> {
        let snap = SnapshotId::new(VolumeId::parse(source)?, uid)?;
        let backend = self.snapshot_backend(snap.volume(), kind)?;
        let token = token.cloned();
        self.detached(
            move |agent| async move { agent.snapshot_admitted(snap, backend, token).await },
        )
        .await
    }

    async fn snapshot_admitted(
        &self,
        snap: SnapshotId,
        backend: Arc<dyn Backend>,
        token: Option<Token>,
    ) -> Result<SnapshotInfo, AgentError> {
        let mut txn = self
            .begin(snap.volume(), token.as_ref(), Call::Other)
            .await?;
        let at = recorded(&txn.id, &txn.mark)?;
        let name = snap.name();
        if let Some(known) = txn.mark.snapshots.get(&name) {
            if known.deleted {
                return Err(AgentError::FailedPrecondition(format!(
                    "snapshot {snap} was deleted; a snapshot_uid is never used twice"
                )));
            }
            return Ok(info(snap, known));
        }
        // Taken before it is recorded: a crash in between leaves a
        // snapshot of the reserved name that only this request's retry
        // (which the source's token authorizes) records.
        let n = name.clone();
        let state = blocking(move || snapshots_of(&*backend)?.take(&at, &n)).await?;
        crate::crash::point("snapshot-taken");
        let record = SnapshotRecord {
            uid: snap.uid().to_owned(),
            guid: state.guid,
            size_bytes: state.size_bytes,
            creation: state.creation,
            deleted: false,
        };
        let out = info(snap, &record);
        txn.mark.snapshots.insert(name, record);
        txn.commit().await?;
        info!(snapshot = %out.id, bytes = out.size_bytes, "snapshot taken");
        Ok(out)
    }

    /// DeleteSnapshot: a missing snapshot is success; one with clones is
    /// hidden and goes with the last of them.
    pub async fn delete_snapshot(
        self: &Arc<Self>,
        snapshot_id: &str,
        kind: Option<BackendKind>,
    ) -> Result<(), AgentError> {
        let snap = SnapshotId::parse(snapshot_id)?;
        let backend = self.snapshot_backend(snap.volume(), kind)?;
        self.detached(move |agent| async move {
            agent.delete_snapshot_held(&snap, backend).await?;
            agent.collect(snap.volume().clone()).await
        })
        .await
    }

    async fn delete_snapshot_held(
        &self,
        snap: &SnapshotId,
        backend: Arc<dyn Backend>,
    ) -> Result<(), AgentError> {
        let mut txn = self.hold(snap.volume()).await?;
        let name = snap.name();
        let at = match &txn.mark.backend {
            Some(at) => at.clone(),
            None => backend.locate(snap.volume())?,
        };
        let (b, a, n) = (backend.clone(), at.clone(), name.clone());
        let found = blocking(move || snapshots_of(&*b)?.find(&a, &n)).await?;
        let Some(known) = txn.mark.snapshots.get(&name).cloned() else {
            if found.is_some() {
                return Err(AgentError::FailedPrecondition(format!(
                    "snapshot {snap} was not taken by this agent (it has no record of it); it is left alone"
                )));
            }
            return Ok(());
        };
        match found {
            None => {
                txn.mark.snapshots.remove(&name);
                return txn.commit().await;
            }
            Some(state) if state.guid != known.guid => {
                return Err(AgentError::FailedPrecondition(format!(
                    "snapshot {snap} has GUID {}, not the pinned {}; it was re-created by someone else and is left alone",
                    state.guid, known.guid
                )));
            }
            Some(_) => {}
        }
        let n = name.clone();
        let gone = blocking(move || snapshots_of(&*backend)?.delete(&at, &n)).await?;
        crate::crash::point("snapshot-deleted");
        if gone {
            txn.mark.snapshots.remove(&name);
            info!(snapshot = %snap, "snapshot deleted");
        } else if let Some(record) = txn.mark.snapshots.get_mut(&name) {
            record.deleted = true;
            info!(snapshot = %snap, "snapshot deleted; kept hidden until the last volume cloned from it goes");
        }
        txn.commit().await
    }

    /// ListSnapshots: the snapshots taken and not deleted, of one volume or
    /// of all.
    pub async fn list_snapshots(
        &self,
        source: Option<&str>,
    ) -> Result<Vec<SnapshotInfo>, AgentError> {
        let marks = match source {
            Some(raw) => {
                let (marks, key) = (self.marks.clone(), VolumeId::parse(raw)?.to_string());
                blocking(move || Ok(marks.load(&key)?))
                    .await?
                    .into_iter()
                    .collect()
            }
            None => self.all_marks().await?,
        };
        let mut out = Vec::new();
        for mark in marks {
            let Ok(volume) = VolumeId::parse(&mark.volume_id) else {
                continue;
            };
            for (name, record) in mark.snapshots.iter().filter(|(_, r)| !r.deleted) {
                if let Some(uid) = name.strip_prefix(SNAPSHOT_PREFIX) {
                    out.push(info(SnapshotId::new(volume.clone(), uid)?, record));
                }
            }
        }
        Ok(out)
    }

    /// The collection (see `collect`) of every volume whose mark says it is kept for
    /// its snapshots or holds a deleted snapshot: at start and with every
    /// resync, so that a volume whose last snapshot went while the agent
    /// was down (or by hand) is destroyed then. Returns the volumes it
    /// could not collect, with why.
    pub async fn collect_all(&self) -> Result<Vec<String>, AgentError> {
        let mut failed = Vec::new();
        for mark in self.all_marks().await? {
            let raw = mark.volume_id;
            let waiting = mark.retained || mark.snapshots.values().any(|r| r.deleted);
            if !waiting {
                continue;
            }
            let collected = match VolumeId::parse(&raw) {
                Ok(id) => self.collect(id).await,
                Err(e) => Err(e),
            };
            if let Err(e) = collected {
                warn!(volume = %raw, error = %e, "could not collect a volume kept for its snapshots");
                failed.push(format!("{raw}: {e}"));
            }
        }
        Ok(failed)
    }

    /// Forgets the records of snapshots that are gone, finishes deferred
    /// deletions (a crash can leave one undone), and destroys a volume kept
    /// for its snapshots once none is left, then collects the volume it
    /// was cloned from in turn.
    pub(crate) async fn collect(&self, mut id: VolumeId) -> Result<(), AgentError> {
        loop {
            let mut txn = self.hold(&id).await?;
            let Some(at) = txn.mark.backend.clone() else {
                return Ok(());
            };
            if txn.mark.snapshots.is_empty() && !txn.mark.retained {
                return Ok(());
            }
            let backend = self.backend_of(&at, &id)?;
            let (b, a) = (backend.clone(), at.clone());
            let recorded: Vec<(String, bool)> = txn
                .mark
                .snapshots
                .iter()
                .map(|(n, r)| (n.clone(), r.deleted))
                .collect();
            let (dependents, gone) = blocking(move || {
                let snaps = snapshots_of(&*b)?;
                let mut gone = Vec::new();
                for (name, deleted) in &recorded {
                    if *deleted {
                        snaps.delete(&a, name)?;
                    }
                    if snaps.find(&a, name)?.is_none() {
                        gone.push(name.clone());
                    }
                }
                Ok((snaps.dependents(&a)?, gone))
            })
            .await?;
            let before = txn.mark.snapshots.len();
            txn.mark.snapshots.retain(|name, _| !gone.contains(name));
            if !txn.mark.retained || !dependents.is_empty() {
                if txn.mark.snapshots.len() != before {
                    txn.commit().await?;
                }
                return Ok(());
            }
            blocking(move || backend.destroy(&at)).await?;
            crate::crash::point("retained-destroyed");
            txn.mark.backend = None;
            txn.mark.retained = false;
            let origin = txn.mark.origin.take();
            txn.commit().await?;
            info!(volume = %id, "volume kept for its snapshots destroyed: the last of them is gone");
            match origin {
                Some(origin) => id = VolumeId::parse(&origin.volume_id)?,
                None => return Ok(()),
            }
        }
    }
}

fn info(id: SnapshotId, record: &SnapshotRecord) -> SnapshotInfo {
    SnapshotInfo {
        id,
        size_bytes: record.size_bytes,
        creation: record.creation,
    }
}
