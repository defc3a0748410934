//! The agent's operations, independent of gRPC: validation, fencing under
//! the volume's lock, the backend and export work, and the durable mark.
//!
//! Every mutating operation follows the same order: check the request (bad
//! input changes nothing), take the volume's lock, load its mark, admit the
//! fencing token (a refusal changes nothing), do the work on a blocking
//! thread, then write the mark. Work that fails leaves the mark as it was.
use crate::{
    backend::{Backend, BackendKind, Capacity, CreateOptions, VolumeState},
    error::AgentError,
    export::{ExportInfo, Exporter, Protocol},
    fence::{Admission, Call, Token},
    locks::VolumeLocks,
    marks::{BackendRecord, ExportRecord, FenceMark, MarkStore},
    volume::{truncate, VolumeId},
};
use std::{collections::BTreeMap, sync::Arc};
use tracing::{info, warn};

/// The agent: its backends, exporters, marks and locks.
pub struct Agent {
    backends: Vec<Arc<dyn Backend>>,
    exporters: BTreeMap<Protocol, Arc<dyn Exporter>>,
    marks: MarkStore,
    locks: VolumeLocks,
}

/// A volume recorded by the agent, for ListVolumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedVolume {
    /// The mark.
    pub mark: FenceMark,
    /// The backend's view; `None` when the volume is missing.
    pub state: Option<VolumeState>,
}

/// The outcome of re-creating exports from the marks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// Exports applied (created, repaired or already in place).
    pub applied: u32,
    /// Volumes or exports that could not be handled, with the reason.
    pub failed: Vec<String>,
}

const MAX_INITIATOR: usize = 223;

/// Where the volume lives, as recorded when this agent created it; a volume
/// ID it has no record of is not its to export or resize.
fn recorded(id: &VolumeId, mark: &FenceMark) -> Result<BackendRecord, AgentError> {
    mark.backend.clone().ok_or_else(|| {
        AgentError::FailedPrecondition(format!(
            "volume {id} was not created by this agent (it has no record of it); create it first"
        ))
    })
}

impl Agent {
    /// An agent over these backends and exporters, recording marks in `marks`.
    pub fn new(
        backends: Vec<Arc<dyn Backend>>,
        exporters: Vec<Arc<dyn Exporter>>,
        marks: MarkStore,
    ) -> Self {
        Self {
            backends,
            exporters: exporters.into_iter().map(|e| (e.protocol(), e)).collect(),
            marks,
            locks: VolumeLocks::default(),
        }
    }

    /// The configured backends.
    pub fn backends(&self) -> &[Arc<dyn Backend>] {
        &self.backends
    }

    /// The configured exporters.
    pub fn exporters(&self) -> impl Iterator<Item = &Arc<dyn Exporter>> {
        self.exporters.values()
    }

    /// The mark store.
    pub fn marks(&self) -> &MarkStore {
        &self.marks
    }

    fn backend(
        &self,
        id: &VolumeId,
        kind: Option<BackendKind>,
    ) -> Result<Arc<dyn Backend>, AgentError> {
        let found = self
            .backends
            .iter()
            .find(|b| b.pool() == id.pool())
            .ok_or_else(|| {
                AgentError::InvalidArgument(format!(
                    "volume {id}: no backend of this agent serves pool or volume group {:?}",
                    id.pool()
                ))
            })?;
        if let Some(kind) = kind {
            if found.kind() != kind {
                return Err(AgentError::InvalidArgument(format!(
                    "volume {id}: backend_type {kind:?} does not match the {:?} backend configured for {:?}",
                    found.kind(),
                    id.pool()
                )));
            }
        }
        Ok(found.clone())
    }

    fn backend_of(
        &self,
        record: &BackendRecord,
        id: &VolumeId,
    ) -> Result<Arc<dyn Backend>, AgentError> {
        let (pool, kind) = match record {
            BackendRecord::Zvol { dataset } => (
                dataset.split('/').next().unwrap_or_default(),
                BackendKind::Zvol,
            ),
            BackendRecord::Lv { vg, .. } => (vg.as_str(), BackendKind::Lvm),
        };
        self.backends
            .iter()
            .find(|b| b.pool() == pool && b.kind() == kind)
            .cloned()
            .ok_or_else(|| {
                AgentError::FailedPrecondition(format!(
                    "volume {id}: its backend {pool:?} is no longer configured"
                ))
            })
    }

    fn exporter(&self, protocol: Protocol) -> Result<Arc<dyn Exporter>, AgentError> {
        self.exporters.get(&protocol).cloned().ok_or_else(|| {
            AgentError::Unimplemented(format!(
                "protocol {} is not available on this agent",
                protocol.as_str()
            ))
        })
    }

    /// Takes the lock, loads the mark and admits the token. Returns the mark
    /// to write after the work (fence advanced) and the admission.
    async fn admit(
        &self,
        id: &VolumeId,
        token: Option<&Token>,
        call: Call,
    ) -> Result<(tokio::sync::OwnedMutexGuard<()>, FenceMark, Admission), AgentError> {
        let guard = self.locks.lock(id.as_str()).await;
        let marks = self.marks.clone();
        let key = id.as_str().to_owned();
        let mark = tokio::task::spawn_blocking(move || marks.load(&key)).await??;
        let mut mark = mark.unwrap_or_else(|| FenceMark::new(id.as_str()));
        let (fence, admission) = mark.fence.admit(id.as_str(), token, call)?;
        mark.fence = fence;
        Ok((guard, mark, admission))
    }

    async fn save(&self, mark: FenceMark) -> Result<(), AgentError> {
        let marks = self.marks.clone();
        tokio::task::spawn_blocking(move || marks.save(&mark)).await??;
        Ok(())
    }

    /// CreateVolume.
    pub async fn create_volume(
        &self,
        id: &str,
        kind: Option<BackendKind>,
        bytes: u64,
        options: CreateOptions,
        token: Option<&Token>,
    ) -> Result<VolumeState, AgentError> {
        let id = VolumeId::parse(id)?;
        if bytes == 0 {
            return Err(AgentError::InvalidArgument(format!(
                "volume {id}: capacity_bytes must be greater than 0"
            )));
        }
        let backend = self.backend(&id, kind)?;
        let at = backend.locate(&id)?;
        let (_guard, mut mark, _) = self.admit(&id, token, Call::Other).await?;
        let target = mark.backend.clone().unwrap_or(at);
        let b = backend.clone();
        let (record, state) =
            tokio::task::spawn_blocking(move || b.create(&target, bytes, &options)).await??;
        mark.backend = Some(record);
        self.save(mark).await?;
        info!(volume = %id, bytes = state.capacity_bytes, "volume created");
        Ok(state)
    }

    /// DeleteVolume: removes the exports, destroys the volume (a missing one
    /// is success) and ends the lifecycle.
    pub async fn delete_volume(
        &self,
        id: &str,
        kind: Option<BackendKind>,
        token: Option<&Token>,
    ) -> Result<(), AgentError> {
        let id = VolumeId::parse(id)?;
        let backend = self.backend(&id, kind)?;
        backend.locate(&id)?;
        let (_guard, mark, admission) = self.admit(&id, token, Call::Delete).await?;
        if admission == Admission::RepeatsDelete {
            return Ok(());
        }
        self.unexport_all(&id, &mark).await?;
        let Some(record) = mark.backend.clone() else {
            // Nothing was created under this ID by this agent: whatever
            // exists there is not ours. End the lifecycle, touch nothing.
            let mut ended = mark.clone();
            ended.fence = mark.fence.end(token.cloned());
            ended.exports.clear();
            return self.save(ended).await;
        };
        let b = backend.clone();
        let target = record.clone();
        if let Err(e) = tokio::task::spawn_blocking(move || b.destroy(&target)).await? {
            // Put the exports back: a failed delete changes nothing.
            if let Err(restore) = self.export_all(&id, &record, &mark).await {
                warn!(volume = %id, error = %restore, "could not restore exports after a failed delete");
            }
            return Err(e);
        }
        let mut ended = mark.clone();
        ended.fence = mark.fence.end(token.cloned());
        ended.exports.clear();
        ended.backend = None;
        self.save(ended).await?;
        info!(volume = %id, "volume deleted");
        Ok(())
    }

    /// ExpandVolume: grows the volume and revalidates its exports.
    pub async fn expand_volume(
        &self,
        id: &str,
        kind: Option<BackendKind>,
        bytes: u64,
        token: Option<&Token>,
    ) -> Result<u64, AgentError> {
        let id = VolumeId::parse(id)?;
        if bytes == 0 {
            return Err(AgentError::InvalidArgument(format!(
                "volume {id}: requested_bytes must be greater than 0"
            )));
        }
        let backend = self.backend(&id, kind)?;
        backend.locate(&id)?;
        let (_guard, mark, _) = self.admit(&id, token, Call::Other).await?;
        let record = recorded(&id, &mark)?;
        let b = backend.clone();
        let size = tokio::task::spawn_blocking(move || b.expand(&record, bytes)).await??;
        for protocol in mark.exports.keys().filter_map(|p| Protocol::parse(p)) {
            let exporter = self.exporter(protocol)?;
            let vid = id.clone();
            tokio::task::spawn_blocking(move || exporter.revalidate(&vid)).await??;
        }
        self.save(mark).await?;
        Ok(size)
    }

    fn check_initiators<'a>(
        &self,
        protocol: Protocol,
        initiators: impl IntoIterator<Item = &'a String>,
    ) -> Result<(), AgentError> {
        let exporter = self.exporter(protocol)?;
        for i in initiators {
            if i.len() > MAX_INITIATOR {
                return Err(AgentError::InvalidArgument(format!(
                    "initiator {:?} is {} bytes long, at most {MAX_INITIATOR} are allowed",
                    truncate(i),
                    i.len()
                )));
            }
            exporter.check_initiator(i)?;
        }
        Ok(())
    }

    async fn device_of(
        &self,
        id: &VolumeId,
        record: &BackendRecord,
    ) -> Result<VolumeState, AgentError> {
        let backend = self.backend_of(record, id)?;
        let r = record.clone();
        tokio::task::spawn_blocking(move || backend.lookup(&r))
            .await??
            .ok_or_else(|| {
                AgentError::NotFound(format!("volume {id} does not exist in its backend"))
            })
    }

    async fn apply_export(
        &self,
        id: &VolumeId,
        protocol: Protocol,
        device: &VolumeState,
        record: &ExportRecord,
    ) -> Result<ExportInfo, AgentError> {
        let exporter = self.exporter(protocol)?;
        let (vid, dev, rec) = (id.clone(), device.device_path.clone(), record.clone());
        tokio::task::spawn_blocking(move || exporter.export(&vid, &dev, &rec)).await?
    }

    /// ExportVolume.
    pub async fn export_volume(
        &self,
        id: &str,
        kind: Option<BackendKind>,
        protocol: Protocol,
        record: ExportRecord,
        token: Option<&Token>,
    ) -> Result<ExportInfo, AgentError> {
        let id = VolumeId::parse(id)?;
        self.backend(&id, kind)?.locate(&id)?;
        self.check_initiators(protocol, &record.allowed_initiators)?;
        let (_guard, mut mark, _) = self.admit(&id, token, Call::Other).await?;
        let location = recorded(&id, &mark)?;
        let device = self.device_of(&id, &location).await?;
        let info = self.apply_export(&id, protocol, &device, &record).await?;
        mark.backend = Some(location);
        mark.exports.insert(protocol.as_str().to_owned(), record);
        self.save(mark).await?;
        info!(volume = %id, protocol = protocol.as_str(), target = %info.target_id, "volume exported");
        Ok(info)
    }

    /// UnexportVolume.
    pub async fn unexport_volume(
        &self,
        id: &str,
        protocol: Protocol,
        token: Option<&Token>,
    ) -> Result<(), AgentError> {
        let id = VolumeId::parse(id)?;
        self.backend(&id, None)?;
        let exporter = self.exporter(protocol)?;
        let (_guard, mut mark, _) = self.admit(&id, token, Call::Other).await?;
        let vid = id.clone();
        tokio::task::spawn_blocking(move || exporter.unexport(&vid)).await??;
        mark.exports.remove(protocol.as_str());
        self.save(mark).await
    }

    /// AllowInitiator (`allow` true) or DenyInitiator (`allow` false).
    pub async fn set_initiator(
        &self,
        id: &str,
        protocol: Protocol,
        initiator: &str,
        allow: bool,
        token: Option<&Token>,
    ) -> Result<(), AgentError> {
        let id = VolumeId::parse(id)?;
        self.backend(&id, None)?;
        let initiator = initiator.to_owned();
        self.check_initiators(protocol, [&initiator])?;
        let (_guard, mut mark, _) = self.admit(&id, token, Call::Other).await?;
        let location = mark.backend.clone().ok_or_else(|| {
            AgentError::FailedPrecondition(format!(
                "volume {id} is not exported over {}",
                protocol.as_str()
            ))
        })?;
        let mut record = mark
            .exports
            .get(protocol.as_str())
            .cloned()
            .ok_or_else(|| {
                AgentError::FailedPrecondition(format!(
                    "volume {id} is not exported over {}",
                    protocol.as_str()
                ))
            })?;
        let changed = if allow {
            record.allowed_initiators.insert(initiator)
        } else {
            record.allowed_initiators.remove(&initiator)
        };
        let device = self.device_of(&id, &location).await?;
        self.apply_export(&id, protocol, &device, &record).await?;
        if changed {
            mark.exports.insert(protocol.as_str().to_owned(), record);
        }
        self.save(mark).await
    }

    async fn unexport_all(&self, id: &VolumeId, mark: &FenceMark) -> Result<(), AgentError> {
        for protocol in mark.exports.keys().filter_map(|p| Protocol::parse(p)) {
            let exporter = self.exporter(protocol)?;
            let vid = id.clone();
            tokio::task::spawn_blocking(move || exporter.unexport(&vid)).await??;
        }
        Ok(())
    }

    async fn export_all(
        &self,
        id: &VolumeId,
        location: &BackendRecord,
        mark: &FenceMark,
    ) -> Result<u32, AgentError> {
        if mark.exports.is_empty() {
            return Ok(0);
        }
        let device = self.device_of(id, location).await?;
        let mut applied = 0;
        for (name, record) in &mark.exports {
            let protocol = Protocol::parse(name).ok_or_else(|| {
                AgentError::Internal(format!("volume {id}: mark names unknown protocol {name:?}"))
            })?;
            self.apply_export(id, protocol, &device, record).await?;
            applied += 1;
        }
        Ok(applied)
    }

    /// ReleaseVolume: removes every export and ends the lifecycle; the backend volume stays.
    pub async fn release_volume(
        &self,
        id: &str,
        kind: Option<BackendKind>,
        token: Option<&Token>,
    ) -> Result<(), AgentError> {
        let id = VolumeId::parse(id)?;
        self.backend(&id, kind)?;
        let (_guard, mark, _) = self.admit(&id, token, Call::Other).await?;
        self.unexport_all(&id, &mark).await?;
        let mut ended = mark.clone();
        ended.fence = mark.fence.end(None);
        ended.exports.clear();
        self.save(ended).await
    }

    /// Re-creates every recorded export of live lifecycles (after a restart,
    /// and periodically). Removes nothing; a corrupt mark is reported and its
    /// volume left alone.
    pub async fn reconcile_from_marks(&self) -> Result<Reconciled, AgentError> {
        let marks = self.marks.clone();
        let ids = tokio::task::spawn_blocking(move || marks.volume_ids()).await??;
        let mut out = Reconciled::default();
        for raw in ids {
            let result = async {
                let id = VolumeId::parse(&raw)?;
                let _guard = self.locks.lock(id.as_str()).await;
                let marks = self.marks.clone();
                let key = raw.clone();
                let Some(mark) = tokio::task::spawn_blocking(move || marks.load(&key)).await??
                else {
                    return Ok(0);
                };
                match (&mark.fence.live, &mark.backend) {
                    (Some(_), Some(location)) => self.export_all(&id, location, &mark).await,
                    _ => Ok(0),
                }
            }
            .await;
            match result {
                Ok(n) => out.applied += n,
                Err(e) => {
                    warn!(volume = %raw, error = %e, "could not reconcile exports");
                    out.failed.push(format!("{raw}: {e}"));
                }
            }
        }
        Ok(out)
    }

    /// ReconcileState: the controller's desired exports, each admitted by its token.
    pub async fn reconcile_exports(
        &self,
        desired: Vec<(String, Protocol, ExportRecord, Option<Token>)>,
    ) -> Reconciled {
        let mut out = Reconciled::default();
        for (id, protocol, record, token) in desired {
            match self
                .export_volume(&id, None, protocol, record, token.as_ref())
                .await
            {
                Ok(_) => out.applied += 1,
                Err(e) => out.failed.push(format!("{}: {e}", truncate(&id))),
            }
        }
        out
    }

    /// Every recorded volume with the backend's view of it. Corrupt marks are skipped and logged.
    pub async fn list_volumes(&self) -> Result<Vec<ListedVolume>, AgentError> {
        let marks = self.marks.clone();
        let ids = tokio::task::spawn_blocking(move || marks.volume_ids()).await??;
        let mut out = Vec::new();
        for raw in ids {
            let marks = self.marks.clone();
            let key = raw.clone();
            let mark = match tokio::task::spawn_blocking(move || marks.load(&key)).await? {
                Ok(Some(m)) => m,
                Ok(None) => continue,
                Err(e) => {
                    warn!(volume = %raw, error = %e, "skipping volume");
                    continue;
                }
            };
            let state = match (&mark.backend, VolumeId::parse(&raw)) {
                (Some(location), Ok(id)) => self.device_of(&id, location).await.ok(),
                _ => None,
            };
            out.push(ListedVolume { mark, state });
        }
        Ok(out)
    }

    /// GetCapacity of the backend of `kind` named `pool` (or the only one of that kind).
    pub async fn capacity(
        &self,
        kind: Option<BackendKind>,
        pool: &str,
    ) -> Result<Capacity, AgentError> {
        let candidates: Vec<_> = self
            .backends
            .iter()
            .filter(|b| kind.is_none_or(|k| b.kind() == k) && (pool.is_empty() || b.pool() == pool))
            .cloned()
            .collect();
        let backend = match candidates.as_slice() {
            [one] => one.clone(),
            [] => {
                return Err(AgentError::NotFound(format!(
                    "no backend matches type {kind:?} and pool {:?}",
                    truncate(pool)
                )))
            }
            _ => {
                return Err(AgentError::InvalidArgument(
                    "several backends match; name the pool".into(),
                ))
            }
        };
        tokio::task::spawn_blocking(move || backend.capacity()).await?
    }
}

#[cfg(test)]
mod tests;
