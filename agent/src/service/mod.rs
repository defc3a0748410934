//! The agent's operations, independent of gRPC: validation, fencing under
//! the volume's lock, the backend and export work, and the durable mark.
//!
//! Every mutating operation follows the same order, owned by `txn`: check
//! the request (bad input changes nothing), take the volume's lock, load its
//! mark, admit the fencing token (a refusal changes nothing), do the work on
//! blocking threads, then write the mark. The whole operation runs in a task
//! of its own, so a caller that goes away cannot leave work running without
//! its lock or its mark.
//!
//! | file | operations |
//! | --- | --- |
//! | `txn.rs` | the guarded mutation: lock, load, admit, work, commit or restore |
//! | `volumes.rs` | CreateVolume, DeleteVolume, ExpandVolume |
//! | `exports.rs` | ExportVolume, UnexportVolume, Allow/DenyInitiator |
//! | `adoption.rs` | CreateVolume with an import, ReleaseVolume |
//! | `inspect.rs` | InspectVolume |
//! | `reconcile.rs` | restart and periodic reconciliation, ReconcileState |
//! | `recovery.rs` | TransferVolumeOwnership (metadata-loss recovery) |
use crate::{
    backend::{Backend, BackendKind, Capacity, VolumeState},
    error::AgentError,
    export::{Exporter, Protocol},
    locks::VolumeLocks,
    marks::{AdoptedSource, BackendRecord, FenceMark, MarkStore},
    volume::{truncate, VolumeId},
};
use std::{collections::BTreeMap, path::PathBuf, sync::Arc};
use tracing::warn;

mod adoption;
mod exports;
mod inspect;
mod reconcile;
mod recovery;
mod snapshots;
mod sources;
mod txn;
mod volumes;

pub(crate) use adoption::pinned_record as pinned;
pub use inspect::{Inspection, ObservedExport};
pub use reconcile::Reconciled;
pub use recovery::Transfer;
pub use snapshots::SnapshotInfo;
pub use sources::ContentSource;
use txn::blocking;

/// The agent: its backends, exporters, marks and locks.
pub struct Agent {
    backends: Vec<Arc<dyn Backend>>,
    exporters: BTreeMap<Protocol, Arc<dyn Exporter>>,
    marks: MarkStore,
    locks: VolumeLocks,
    recovery: Option<Arc<crate::recovery::Recovery>>,
}

/// A volume recorded by the agent, for ListVolumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedVolume {
    /// The mark.
    pub mark: FenceMark,
    /// The backend's view; `None` when the volume is missing.
    pub state: Option<VolumeState>,
}

/// Where the volume lives, as recorded when this agent created or imported
/// it; a volume ID it has no record of is not its to export or resize.
fn recorded(id: &VolumeId, mark: &FenceMark) -> Result<BackendRecord, AgentError> {
    if let Some(record) = mark.backend.clone() {
        return Ok(record);
    }
    Err(AgentError::FailedPrecondition(match &mark.adopted {
        Some(pin) => format!(
            "volume {id} is adopted from {} and no live lifecycle has imported it; import it again (CreateVolume with its import source), which checks that it is idle",
            describe(pin)
        ),
        None => format!(
            "volume {id} was not created by this agent (it has no record of it); create it first"
        ),
    }))
}

/// The volume ID and the size in `field` a request names, checked before
/// anything else (bad input changes nothing).
fn sized(id: &str, bytes: u64, field: &str) -> Result<VolumeId, AgentError> {
    let id = VolumeId::parse(id)?;
    if bytes == 0 {
        return Err(AgentError::InvalidArgument(format!(
            "volume {id}: {field} must be greater than 0"
        )));
    }
    Ok(id)
}

/// `vg/lv (UUIDs, policy)` or the zvol's dataset, for messages.
fn describe(pin: &AdoptedSource) -> String {
    match pin {
        AdoptedSource::Zvol { dataset } => format!("zvol {dataset}"),
        AdoptedSource::Dataset { dataset } => format!("filesystem {dataset}"),
        AdoptedSource::Directory { path } => format!("directory {path}"),
        AdoptedSource::Lv {
            vg,
            lv,
            vg_uuid,
            lv_uuid,
            preserve_original,
        } => format!(
            "{vg}/{lv}:{vg_uuid}:{lv_uuid} ({})",
            if *preserve_original {
                "PreserveOriginal"
            } else {
                "Managed"
            }
        ),
    }
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
            recovery: None,
        }
    }

    /// The agent with metadata-loss recovery configured (its trust anchor
    /// and snapshot signer, read at start).
    pub fn with_recovery(mut self, recovery: crate::recovery::Recovery) -> Self {
        self.recovery = Some(Arc::new(recovery));
        self
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

    /// The backend serving `id`'s pool (of `kind`, when given).
    fn backend(
        &self,
        id: &VolumeId,
        kind: Option<BackendKind>,
    ) -> Result<Arc<dyn Backend>, AgentError> {
        // A pool may serve zvols and filesystems, each through a backend of
        // its own: the kind asked for picks between them.
        let serving = || self.backends.iter().filter(|b| b.pool() == id.pool());
        let found = serving()
            .find(|b| kind.is_none_or(|k| b.kind() == k))
            .or_else(|| serving().next())
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

    /// The backend holding a recorded volume.
    fn backend_of(
        &self,
        record: &BackendRecord,
        id: &VolumeId,
    ) -> Result<Arc<dyn Backend>, AgentError> {
        let (pool, kind) = match record {
            BackendRecord::Zvol { dataset, .. } => (
                dataset.split('/').next().unwrap_or_default(),
                BackendKind::Zvol,
            ),
            BackendRecord::Dataset { dataset, .. } => (
                dataset.split('/').next().unwrap_or_default(),
                BackendKind::Dataset,
            ),
            BackendRecord::Directory { .. } => (id.pool(), BackendKind::Directory),
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

    /// The recorded volume as its backend sees it (identity checked by the backend).
    async fn device_of(
        &self,
        id: &VolumeId,
        record: &BackendRecord,
    ) -> Result<VolumeState, AgentError> {
        self.read_existing(id, record, |b, r| b.lookup(r)).await
    }

    /// The device node of the volume at `record`, for an export.
    async fn device_path_of(
        &self,
        id: &VolumeId,
        record: &BackendRecord,
    ) -> Result<PathBuf, AgentError> {
        self.read_existing(id, record, |b, r| b.device(r)).await
    }

    /// `read` of the volume at `record` on its backend, on a blocking
    /// thread; NOT_FOUND when the backend has no such volume.
    async fn read_existing<T: Send + 'static>(
        &self,
        id: &VolumeId,
        record: &BackendRecord,
        read: impl FnOnce(&dyn Backend, &BackendRecord) -> Result<Option<T>, AgentError>
            + Send
            + 'static,
    ) -> Result<T, AgentError> {
        let backend = self.backend_of(record, id)?;
        let r = record.clone();
        blocking(move || read(backend.as_ref(), &r))
            .await?
            .ok_or_else(|| {
                AgentError::NotFound(format!("volume {id} does not exist in its backend"))
            })
    }

    /// Every fence mark of the state folder; a corrupt one is skipped and
    /// logged.
    pub(crate) async fn all_marks(&self) -> Result<Vec<FenceMark>, AgentError> {
        let marks = self.marks.clone();
        let ids = blocking(move || Ok(marks.volume_ids()?)).await?;
        let mut out = Vec::new();
        for raw in ids {
            let (marks, key) = (self.marks.clone(), raw.clone());
            match blocking(move || Ok(marks.load(&key)?)).await {
                Ok(Some(m)) => out.push(m),
                Ok(None) => {}
                Err(e) => warn!(volume = %raw, error = %e, "skipping the mark of a volume"),
            }
        }
        Ok(out)
    }

    /// Every recorded volume with the backend's view of it. Corrupt marks are skipped and logged.
    pub async fn list_volumes(&self) -> Result<Vec<ListedVolume>, AgentError> {
        let mut out = Vec::new();
        for mark in self.all_marks().await? {
            let state = match (&mark.backend, VolumeId::parse(&mark.volume_id)) {
                // A volume kept for its snapshots has no device node.
                _ if mark.retained => None,
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
        blocking(move || backend.capacity()).await
    }
}

#[cfg(test)]
mod adoption_tests;
#[cfg(test)]
mod holes_tests;
#[cfg(test)]
mod recovery_tests;
/// The simulated backend and exporter, for tests of this crate and of the
/// layers above it (feature `sim`).
#[cfg(any(test, feature = "sim"))]
pub mod sim;
/// The simulator's LVM volume group (feature `sim`).
#[cfg(any(test, feature = "sim"))]
pub mod sim_lvm;
#[cfg(test)]
mod tests;
