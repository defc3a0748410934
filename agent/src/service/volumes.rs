//! CreateVolume, DeleteVolume and ExpandVolume.
use super::{blocking, describe, recorded, sized, sources::ContentSource, txn::Txn, Agent};
use crate::{
    backend::{Backend, BackendKind, CreateOptions, VolumeState},
    error::AgentError,
    export::Protocol,
    fence::{Admission, Call, FenceError, Token},
    marks::{AdoptedSource, BackendRecord},
    volume::VolumeId,
};
use std::{sync::Arc, time::Instant};
use tracing::{info, warn};

impl Agent {
    /// CreateVolume of an empty volume.
    pub async fn create_volume(
        self: &Arc<Self>,
        id: &str,
        kind: Option<BackendKind>,
        bytes: u64,
        options: CreateOptions,
        token: Option<&Token>,
    ) -> Result<VolumeState, AgentError> {
        self.create_volume_from(id, kind, bytes, options, None, token)
            .await
    }

    /// CreateVolume, of a clone of `source` when it names one.
    pub async fn create_volume_from(
        self: &Arc<Self>,
        id: &str,
        kind: Option<BackendKind>,
        bytes: u64,
        options: CreateOptions,
        source: Option<ContentSource>,
        token: Option<&Token>,
    ) -> Result<VolumeState, AgentError> {
        let id = sized(id, bytes, "capacity_bytes")?;
        let backend = self.backend(&id, kind)?;
        let at = backend.locate(&id)?;
        if let Some(source) = &source {
            super::snapshots::snapshots_of(&*backend)?;
            if source.volume().pool() != id.pool() {
                return Err(AgentError::InvalidArgument(format!(
                    "volume {id}: source {source} is on {:?}; a clone is made on its source's pool",
                    source.volume().pool()
                )));
            }
        }
        let token = token.cloned();
        self.detached(move |agent| async move {
            agent
                .create_admitted(id, backend, at, bytes, options, source, token)
                .await
        })
        .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn create_admitted(
        &self,
        id: VolumeId,
        backend: Arc<dyn Backend>,
        at: BackendRecord,
        bytes: u64,
        options: CreateOptions,
        source: Option<ContentSource>,
        token: Option<Token>,
    ) -> Result<VolumeState, AgentError> {
        let started = Instant::now();
        let mut txn = self.begin(&id, token.as_ref(), Call::Other).await?;
        if let Some(pin) = txn.mark.adopted.as_ref().filter(|p| p.is_filesystem()) {
            return Err(AgentError::FailedPrecondition(format!(
                "volume {id} is the adopted {}, always kept as it is; a CreateVolume without that import cannot use it",
                describe(pin)
            )));
        }
        if let Some(pin) = txn.mark.adopted.as_ref().filter(|p| p.preserves()) {
            return Err(AgentError::FailedPrecondition(format!(
                "volume {id} is an adopted logical volume pinned as {}; a CreateVolume without that import_lv cannot use it",
                describe(pin)
            )));
        }
        if txn.mark.retained {
            return Err(AgentError::FailedPrecondition(format!(
                "volume {id} was deleted and is kept hidden until its last snapshot is gone; its ID cannot be used again before then"
            )));
        }
        let uid = token
            .as_ref()
            .map(|t| t.volume_uid.clone())
            .unwrap_or_default();
        let origin = source.as_ref().map(|s| s.origin(&uid));
        if txn.mark.backend.is_some() && txn.mark.origin != origin {
            return Err(AgentError::AlreadyExists(format!(
                "volume {id} exists {}; the request asks for {}",
                match &txn.mark.origin {
                    Some(o) => format!("as a clone of {}@{}", o.volume_id, o.snapshot),
                    None => "without a content source".into(),
                },
                match &source {
                    Some(s) => format!("a clone of {s}"),
                    None => "no content source".into(),
                }
            )));
        }
        let made = txn.mark.backend.is_some();
        // The mark as it was before this call wrote an intent, if it did.
        let mut before_intent = None;
        let target = match txn.mark.backend.clone() {
            Some(recorded) => recorded,
            None => {
                // A volume already there that this agent did not create is
                // not taken over by a create: that is what import is for.
                let (b, probe) = (backend.clone(), at.clone());
                if blocking(move || b.device(&probe)).await?.is_some() {
                    return Err(AgentError::AlreadyExists(format!(
                        "volume {id}: {at} already exists and was not created by this agent; import it instead"
                    )));
                }
                // Record the intent first, so a crash between the create
                // and the mark leaves a volume this agent knows it made.
                before_intent = Some(txn.on_disk.clone());
                txn.mark.backend = Some(at.clone());
                txn.mark.origin = origin.clone();
                txn.save().await?;
                at.clone()
            }
        };
        let b = backend.clone();
        let backend_started = Instant::now();
        let created = match (&source, &origin) {
            (Some(source), Some(o)) => {
                match self.hold_origin(source, o, &backend, made).await {
                    Ok(from) if !made && bytes < from.size_bytes => Err(AgentError::OutOfRange(format!(
                        "volume {id}: capacity_bytes {bytes} is less than the {} bytes of source {source}",
                        from.size_bytes
                    ))),
                    Ok(from) => {
                        blocking(move || {
                            super::snapshots::snapshots_of(&*b)?.clone_volume(
                                &from.at,
                                &from.snapshot,
                                &target,
                                bytes,
                                &options,
                            )
                        })
                        .await
                    }
                    Err(e) => Err(e),
                }
            }
            _ => blocking(move || b.create(&target, bytes, &options)).await,
        };
        let backend_ms = backend_started.elapsed().as_millis();
        let (record, state) = match created {
            Ok(done) => {
                crate::crash::point("create-backend-done");
                done
            }
            Err(e) => {
                if let (Some(ContentSource::Volume(_)), Some(o)) = (&source, &origin) {
                    if let Err(release) = self.release_origin(o, &backend).await {
                        warn!(volume = %id, error = %release, "the snapshot of the source of a failed clone is left for the collection");
                    }
                }
                if let Some(before) = before_intent {
                    // The intent is undone only when the backend shows no
                    // volume: a create that made the volume and then failed
                    // (a report after lvcreate, say) keeps it recorded, so
                    // a retry finishes it instead of calling it foreign.
                    let (b, probe) = (backend.clone(), at.clone());
                    match blocking(move || b.device(&probe)).await {
                        Ok(None) => txn.restore(before).await?,
                        Ok(Some(_)) => {
                            warn!(volume = %id, error = %e, "create failed after the volume appeared; its intent stays recorded")
                        }
                        Err(lookup) => {
                            warn!(volume = %id, error = %e, lookup = %lookup, "create failed and the backend could not be read; the intent stays recorded")
                        }
                    }
                }
                return Err(e);
            }
        };
        txn.mark.backend = Some(record);
        txn.commit().await?;
        if let (Some(ContentSource::Volume(_)), Some(o)) = (&source, &origin) {
            self.release_origin(o, &backend).await?;
        }
        info!(
            volume = %id,
            bytes = state.capacity_bytes,
            backend_ms,
            total_ms = started.elapsed().as_millis(),
            "volume created"
        );
        Ok(state)
    }

    /// DeleteVolume: removes the exports, destroys the volume (a missing one
    /// is success) and ends the lifecycle.
    pub async fn delete_volume(
        self: &Arc<Self>,
        id: &str,
        kind: Option<BackendKind>,
        token: Option<&Token>,
    ) -> Result<(), AgentError> {
        let id = VolumeId::parse(id)?;
        let backend = self.backend(&id, kind)?;
        backend.locate(&id)?;
        let token = token.cloned();
        self.detached(move |agent| async move { agent.delete_admitted(id, backend, token).await })
            .await
    }

    async fn delete_admitted(
        &self,
        id: VolumeId,
        backend: Arc<dyn Backend>,
        token: Option<Token>,
    ) -> Result<(), AgentError> {
        let txn = self.begin(&id, token.as_ref(), Call::Delete).await?;
        if txn.admission == Admission::RepeatsDelete {
            if txn
                .mark
                .adopted
                .as_ref()
                .is_some_and(AdoptedSource::preserves)
            {
                // A mark written before the exception was narrowed may record
                // the DeleteVolume that ended a preserved LV's lifecycle; that
                // delete destroyed nothing, so its retry is refused like any
                // other request with an ended token.
                return Err(FenceError::Ended {
                    volume_id: id.to_string(),
                    volume_uid: token.map(|t| t.volume_uid).unwrap_or_default(),
                }
                .into());
            }
            return Ok(());
        }
        self.delete_live(txn, backend, token).await
    }

    /// DeleteVolume of an admitted live lifecycle. A delete that destroys
    /// the volume (one this agent created, an imported zvol, a Managed LV)
    /// or finds none of this agent's records its token for identical
    /// retries; the delete of a PreserveOriginal LV, which ends the lifecycle
    /// and keeps the LV, does not, so a retry of it is refused like any
    /// other request with an ended token.
    async fn delete_live(
        &self,
        mut txn: Txn,
        backend: Arc<dyn Backend>,
        token: Option<Token>,
    ) -> Result<(), AgentError> {
        let id = txn.id.clone();
        let mark = txn.mark.clone();
        self.unexport_all(&id, &mark).await?;
        crate::crash::point("delete-unexported");
        txn.mark.exports.clear();
        if mark.adopted.as_ref().is_some_and(AdoptedSource::preserves) {
            // PreserveOriginal: the LV stays; only our records change. The
            // pin survives the lifecycle.
            txn.mark.fence = mark.fence.end(None);
            txn.mark.backend = None;
            txn.commit().await?;
            info!(volume = %id, "lifecycle of a preserved volume ended; the volume stays");
            return Ok(());
        }
        let Some(record) = mark.backend.clone() else {
            // Nothing was created under this ID by this agent: whatever
            // exists there is not ours. End the lifecycle, touch nothing.
            // As for a missing volume, the delete succeeded: its identical
            // retry succeeds too (a controller forgetting a refused import).
            txn.mark.fence = mark.fence.end(token);
            return txn.commit().await;
        };
        txn.mark.fence = mark.fence.end(token);
        if self.retains(&id, &backend, &record, &mark).await? {
            txn.mark.retained = true;
            txn.commit().await?;
            info!(volume = %id, "volume deleted; kept hidden until its last snapshot is gone");
            return Ok(());
        }
        let target = record.clone();
        if let Err(e) = blocking(move || backend.destroy(&target)).await {
            // Put the exports back: a failed delete changes nothing.
            if let Err(restore) = self.export_all(&id, &record, &mark).await {
                warn!(volume = %id, error = %restore, "could not restore exports after a failed delete");
            }
            return Err(e);
        }
        crate::crash::point("delete-backend-done");
        txn.mark.backend = None;
        // The adopted volume is destroyed: its pin protects nothing any more.
        txn.mark.adopted = None;
        txn.mark.import_probe = None;
        let origin = txn.mark.origin.take();
        txn.commit().await?;
        info!(volume = %id, "volume deleted");
        if let Some(origin) = origin {
            // The clone is gone, and with it perhaps the last user of a
            // deleted snapshot; its source may go now. The delete stands
            // either way: a later collection finishes what this one cannot.
            let source = VolumeId::parse(&origin.volume_id)?;
            if let Err(e) = self.collect(source).await {
                warn!(volume = %id, source = %origin.volume_id, error = %e, "could not collect the source of a deleted clone");
            }
        }
        Ok(())
    }

    /// Whether a deleted volume is kept for its snapshots: it has some, and
    /// every one is this agent's (a snapshot the agent did not take keeps
    /// the refusal of the destroy, which names it). A kept volume is hidden
    /// (unexported already, no device node, no reservation).
    async fn retains(
        &self,
        id: &VolumeId,
        backend: &Arc<dyn Backend>,
        record: &BackendRecord,
        mark: &crate::marks::FenceMark,
    ) -> Result<bool, AgentError> {
        if backend.snapshots().is_none() {
            return Ok(false);
        }
        let (b, at, recorded) = (backend.clone(), record.clone(), mark.snapshots.clone());
        let kept = blocking(move || {
            let snaps = super::snapshots::snapshots_of(&*b)?;
            let names = snaps.dependents(&at)?;
            if names.is_empty() || names.iter().any(|n| !recorded.contains_key(n)) {
                return Ok(false);
            }
            snaps.retain(&at).map(|()| true)
        })
        .await;
        if kept.is_err() {
            // Put the exports back: a failed delete changes nothing.
            if let Err(restore) = self.export_all(id, record, mark).await {
                warn!(volume = %id, error = %restore, "could not restore exports after a failed delete");
            }
        }
        kept
    }

    /// ExpandVolume: grows the volume and revalidates its exports.
    pub async fn expand_volume(
        self: &Arc<Self>,
        id: &str,
        kind: Option<BackendKind>,
        bytes: u64,
        token: Option<&Token>,
    ) -> Result<u64, AgentError> {
        let id = sized(id, bytes, "requested_bytes")?;
        let backend = self.backend(&id, kind)?;
        backend.locate(&id)?;
        let token = token.cloned();
        self.detached(
            move |agent| async move { agent.expand_admitted(id, backend, bytes, token).await },
        )
        .await
    }

    async fn expand_admitted(
        &self,
        id: VolumeId,
        backend: Arc<dyn Backend>,
        bytes: u64,
        token: Option<Token>,
    ) -> Result<u64, AgentError> {
        let txn = self.begin(&id, token.as_ref(), Call::Other).await?;
        if let Some(pin) = txn.mark.adopted.as_ref().filter(|p| p.is_filesystem()) {
            let quota = match pin {
                AdoptedSource::Directory { .. } => "its project's hard limit",
                _ => "its refquota",
            };
            return Err(AgentError::FailedPrecondition(format!(
                "cannot expand volume {id}: it is the adopted {}, which is never resized; raise {quota} yourself and import it again, or copy the data into a larger volume",
                describe(pin)
            )));
        }
        if let Some(pin) = txn.mark.adopted.as_ref().filter(|p| p.preserves()) {
            return Err(AgentError::FailedPrecondition(format!(
                "cannot expand volume {id}: it is the adopted logical volume {} kept PreserveOriginal, which is never resized; copy the data into a larger volume instead",
                describe(pin)
            )));
        }
        let record = recorded(&id, &txn.mark)?;
        let size = blocking(move || backend.expand(&record, bytes)).await?;
        crate::crash::point("expand-backend-done");
        for (name, record) in &txn.mark.exports {
            let Some(protocol) = Protocol::parse(name) else {
                continue;
            };
            let exporter = self.exporter(protocol)?;
            let (vid, record) = (id.clone(), record.clone());
            blocking(move || exporter.revalidate(&vid, &record)).await?;
        }
        txn.commit().await?;
        Ok(size)
    }
}
