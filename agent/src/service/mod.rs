//! The agent's operations, independent of gRPC: validation, fencing under
//! the volume's lock, the backend and export work, and the durable mark.
//!
//! Every mutating operation follows the same order: check the request (bad
//! input changes nothing), take the volume's lock, load its mark, admit the
//! fencing token (a refusal changes nothing), do the work on a blocking
//! thread, then write the mark. Work that fails leaves the mark as it was.
use crate::{
    adopt::{in_use, usage, OwnExports},
    backend::{Backend, BackendKind, Capacity, CreateOptions, ImportSource, VolumeState},
    error::AgentError,
    export::{ExportInfo, Exporter, Protocol},
    fence::{Admission, Call, Token},
    locks::VolumeLocks,
    marks::{AdoptedSource, BackendRecord, ExportRecord, FenceMark, MarkStore},
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

/// What InspectVolume observed.
#[derive(Debug, Clone)]
pub struct Inspection {
    /// The LVM report of the LV.
    pub lv: sys::lvm::Lv,
    /// Why this backend would not adopt it, if it would not.
    pub layout_refusal: Option<String>,
    /// Who uses the device.
    pub usage: sys::block::Usage,
    /// The signature probe.
    pub probe: sys::blkid::Probe,
    /// The agent's mark, if any.
    pub mark: Option<FenceMark>,
    /// The names of the agent's own exports of this volume.
    pub own: OwnExports,
    /// For each nvmet subsystem exporting the LV: allow_any_host and its allowed hosts.
    pub nvmet_allowed: BTreeMap<String, (bool, Vec<String>)>,
}

/// The configfs folder of nvmet subsystems.
const NVMET_SUBSYSTEMS: &str = "/sys/kernel/config/nvmet/subsystems";

/// `attr_allow_any_host` and the `allowed_hosts` of one nvmet subsystem, as
/// configfs shows them (unreadable entries read as none).
fn nvmet_allowed(nqn: &str) -> (bool, Vec<String>) {
    let dir = std::path::Path::new(NVMET_SUBSYSTEMS).join(nqn);
    let any = std::fs::read_to_string(dir.join("attr_allow_any_host"))
        .map(|s| s.trim() == "1")
        .unwrap_or(false);
    let mut hosts: Vec<String> = std::fs::read_dir(dir.join("allowed_hosts"))
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    hosts.sort();
    (any, hosts)
}

/// `vg/lv (UUIDs, policy)` or the zvol's dataset, for messages.
fn describe(pin: &AdoptedSource) -> String {
    match pin {
        AdoptedSource::Zvol { dataset } => format!("zvol {dataset}"),
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

/// The backend record of a pinned source.
fn pinned_record(pin: &AdoptedSource) -> BackendRecord {
    match pin {
        AdoptedSource::Zvol { dataset } => BackendRecord::Zvol {
            dataset: dataset.clone(),
        },
        AdoptedSource::Lv {
            vg, lv, lv_uuid, ..
        } => BackendRecord::Lv {
            vg: vg.clone(),
            lv: lv.clone(),
            lv_uuid: Some(lv_uuid.clone()),
        },
    }
}

/// Why the reported LV is not the pinned one, if it is not.
fn identity_mismatch(pin: &AdoptedSource, lv: &sys::lvm::Lv) -> Option<String> {
    let AdoptedSource::Lv {
        vg,
        lv: name,
        vg_uuid,
        lv_uuid,
        ..
    } = pin
    else {
        return None;
    };
    if lv.vg_uuid.as_str() != vg_uuid {
        return Some(format!(
            "identity: volume group {vg} has UUID {}, not the pinned {vg_uuid}; it is another volume group",
            lv.vg_uuid
        ));
    }
    if lv.uuid.as_str() != lv_uuid {
        return Some(format!(
            "identity: logical volume {vg}/{name} has UUID {}, not the pinned {lv_uuid}; it was renamed or re-created",
            lv.uuid
        ));
    }
    None
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
        let started = std::time::Instant::now();
        let id = VolumeId::parse(id)?;
        if bytes == 0 {
            return Err(AgentError::InvalidArgument(format!(
                "volume {id}: capacity_bytes must be greater than 0"
            )));
        }
        let backend = self.backend(&id, kind)?;
        let at = backend.locate(&id)?;
        let (_guard, mut mark, _) = self.admit(&id, token, Call::Other).await?;
        if let Some(pin) = mark.adopted.as_ref().filter(|p| p.preserves()) {
            return Err(AgentError::FailedPrecondition(format!(
                "volume {id} is an adopted logical volume pinned as {}; a CreateVolume without that import_lv cannot use it",
                describe(pin)
            )));
        }
        // The mark as it is on disk, put back if the create fails.
        let mut prior = None;
        let target = match mark.backend.clone() {
            Some(recorded) => recorded,
            None => {
                // A volume already there that this agent did not create is
                // not taken over by a create: that is what import is for.
                let (b, probe) = (backend.clone(), at.clone());
                if tokio::task::spawn_blocking(move || b.lookup(&probe))
                    .await??
                    .is_some()
                {
                    return Err(AgentError::AlreadyExists(format!(
                        "volume {id}: {at} already exists and was not created by this agent; import it instead"
                    )));
                }
                // Record the intent first, so a crash between the create
                // and the mark leaves a volume this agent knows it made.
                let (marks, key) = (self.marks.clone(), id.as_str().to_owned());
                prior = Some(tokio::task::spawn_blocking(move || marks.load(&key)).await??);
                mark.backend = Some(at.clone());
                self.save(mark.clone()).await?;
                at
            }
        };
        let b = backend.clone();
        let backend_started = std::time::Instant::now();
        let created =
            tokio::task::spawn_blocking(move || b.create(&target, bytes, &options)).await?;
        let backend_ms = backend_started.elapsed().as_millis();
        let (record, state) = match created {
            Ok(done) => done,
            Err(e) => {
                // A create that failed (bad options, no space) changes nothing.
                if let Some(prior) = prior {
                    let (marks, key) = (self.marks.clone(), id.as_str().to_owned());
                    tokio::task::spawn_blocking(move || match prior {
                        Some(p) => marks.save(&p),
                        None => marks.remove(&key),
                    })
                    .await??;
                }
                return Err(e);
            }
        };
        mark.backend = Some(record);
        self.save(mark).await?;
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
        if mark.adopted.as_ref().is_some_and(AdoptedSource::preserves) {
            // PreserveOriginal: the LV stays; only our records change. The
            // pin survives the lifecycle.
            let mut ended = mark.clone();
            ended.fence = mark.fence.end(token.cloned());
            ended.exports.clear();
            ended.backend = None;
            self.save(ended).await?;
            info!(volume = %id, "lifecycle of a preserved volume ended; the logical volume stays");
            return Ok(());
        }
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
        // The adopted volume is destroyed: its pin protects nothing any more.
        ended.adopted = None;
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
        if let Some(pin) = mark.adopted.as_ref().filter(|p| p.preserves()) {
            return Err(AgentError::FailedPrecondition(format!(
                "cannot expand volume {id}: it is the adopted logical volume {} kept PreserveOriginal, which is never resized; copy the data into a larger volume instead",
                describe(pin)
            )));
        }
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
        let backend = self.backend(&id, kind)?;
        let (_guard, mark, _) = self.admit(&id, token, Call::Other).await?;
        if let Some(pin) = mark.adopted.clone().filter(AdoptedSource::preserves) {
            self.verify_preserved_idle(&id, &backend, &pin, &mark)
                .await?;
        } else {
            self.unexport_all(&id, &mark).await?;
        }
        let mut ended = mark.clone();
        ended.fence = mark.fence.end(None);
        ended.exports.clear();
        self.save(ended).await
    }

    /// ReleaseVolume of a PreserveOriginal LV: checks the pinned identity and
    /// that nothing but the agent's own export uses the LV, removes the
    /// export, then proves the LV free with the exclusive-open probe. Any
    /// failure restores the exports and refuses: nothing changes.
    async fn verify_preserved_idle(
        &self,
        id: &VolumeId,
        backend: &Arc<dyn Backend>,
        pin: &AdoptedSource,
        mark: &FenceMark,
    ) -> Result<(), AgentError> {
        let refuse = |why: String| {
            AgentError::FailedPrecondition(format!("release of volume {id} refused: {why}"))
        };
        let record = pinned_record(pin);
        let b = backend.clone();
        let r = record.clone();
        let lv = tokio::task::spawn_blocking(move || b.report_lv(&r))
            .await??
            .ok_or_else(|| {
                refuse(format!(
                    "missing: logical volume {} does not exist",
                    describe(pin)
                ))
            })?;
        if let Some(why) = identity_mismatch(pin, &lv) {
            return Err(refuse(why));
        }
        let device = lv
            .path
            .clone()
            .unwrap_or_else(|| format!("/dev/{}/{}", lv.vg.as_str(), lv.name).into());
        let own = OwnExports::of(id);
        let dev = device.clone();
        let first = tokio::task::spawn_blocking(move || usage(&dev)).await??;
        if let Some(why) = in_use(&first, Some(&own), false) {
            return Err(refuse(why));
        }
        self.unexport_all(id, mark).await?;
        let dev = device.clone();
        let after = tokio::task::spawn_blocking(move || usage(&dev)).await??;
        if let Some(why) = in_use(&after, None, true) {
            if let Err(restore) = self.export_all(id, &record, mark).await {
                warn!(volume = %id, error = %restore, "could not restore exports after a refused release");
            }
            return Err(refuse(why));
        }
        Ok(())
    }

    /// CreateVolume with an import source: adopts the existing zvol or LV
    /// after read-only checks and pins it in the mark. A retry of the same
    /// import under the live lifecycle returns the volume without probing
    /// again (it may be exported by then). A refusal changes nothing.
    pub async fn import_volume(
        &self,
        id: &str,
        kind: Option<BackendKind>,
        bytes: u64,
        source: ImportSource,
        token: Option<&Token>,
    ) -> Result<VolumeState, AgentError> {
        let id = VolumeId::parse(id)?;
        if bytes == 0 {
            return Err(AgentError::InvalidArgument(format!(
                "volume {id}: capacity_bytes must be greater than 0"
            )));
        }
        let backend = self.backend(&id, kind)?;
        let wanted = match &source {
            ImportSource::Zvol { dataset } => AdoptedSource::Zvol {
                dataset: dataset.clone(),
            },
            ImportSource::Lv { identity, policy } => AdoptedSource::Lv {
                vg: identity.vg.as_str().to_owned(),
                lv: identity.lv.as_str().to_owned(),
                vg_uuid: identity.vg_uuid.as_str().to_owned(),
                lv_uuid: identity.lv_uuid.as_str().to_owned(),
                preserve_original: policy.preserves(),
            },
        };
        let (_guard, mut mark, admission) = self.admit(&id, token, Call::Other).await?;
        let continues = admission == Admission::Continues;
        let refused = |why: String| crate::adopt::refused(&id, why);
        match &mark.adopted {
            Some(pin) if pin == &wanted => {
                if let (true, Some(record)) = (continues, mark.backend.clone()) {
                    let b = backend.clone();
                    let state = tokio::task::spawn_blocking(move || b.lookup(&record))
                        .await??
                        .ok_or_else(|| {
                            refused(format!(
                                "missing: the adopted volume {} no longer exists",
                                describe(pin)
                            ))
                        })?;
                    if state.capacity_bytes < bytes {
                        return Err(refused(format!(
                            "too small: the adopted volume is {} bytes, requested capacity is {bytes} bytes; import never resizes",
                            state.capacity_bytes
                        )));
                    }
                    return Ok(state);
                }
            }
            Some(pin @ AdoptedSource::Zvol { .. }) => {
                return Err(refused(format!(
                    "already imported from {}; the import source cannot be changed",
                    describe(pin)
                )))
            }
            Some(pin @ AdoptedSource::Lv { .. }) => {
                let same_lv = matches!((pin, &wanted),
                    (AdoptedSource::Lv { vg, lv, vg_uuid, lv_uuid, .. },
                     AdoptedSource::Lv { vg: v2, lv: l2, vg_uuid: vu2, lv_uuid: lu2, .. })
                    if vg == v2 && lv == l2 && vg_uuid == vu2 && lv_uuid == lu2);
                let upgrade = same_lv && !continues && wanted.preserves();
                if !upgrade {
                    return Err(refused(format!(
                        "pinned: volume {id} is pinned to {}; a later import cannot name another LV or other UUIDs, change the policy of a lifecycle, or turn PreserveOriginal into Managed",
                        describe(pin)
                    )));
                }
            }
            None => {
                if continues && mark.backend.is_some() {
                    return Err(refused(
                        "it was already provisioned without an import; delete it and import again"
                            .into(),
                    ));
                }
            }
        }
        let b = backend.clone();
        let vid = id.clone();
        let (record, state) =
            tokio::task::spawn_blocking(move || b.import(&vid, &source, bytes)).await??;
        mark.backend = Some(record);
        mark.adopted = Some(wanted);
        self.save(mark).await?;
        info!(volume = %id, bytes = state.capacity_bytes, "existing volume adopted");
        Ok(state)
    }

    /// InspectVolume: what the storage node observes about an LV and the
    /// agent's record of it. Read-only; takes no token.
    pub async fn inspect_volume(
        &self,
        id: &str,
        kind: Option<BackendKind>,
    ) -> Result<Inspection, AgentError> {
        let id = VolumeId::parse(id)?;
        if kind == Some(BackendKind::Zvol) {
            return Err(AgentError::Unimplemented(
                "InspectVolume supports BACKEND_TYPE_LVM only".into(),
            ));
        }
        let backend = self.backend(&id, kind)?;
        if backend.kind() != BackendKind::Lvm {
            return Err(AgentError::Unimplemented(
                "InspectVolume supports BACKEND_TYPE_LVM only".into(),
            ));
        }
        let at = backend.locate(&id)?;
        let _guard = self.locks.lock(id.as_str()).await;
        let marks = self.marks.clone();
        let key = id.as_str().to_owned();
        let mark = tokio::task::spawn_blocking(move || marks.load(&key)).await??;
        let b = backend.clone();
        let lv = tokio::task::spawn_blocking(move || b.report_lv(&at))
            .await??
            .ok_or_else(|| {
                AgentError::FailedPrecondition(format!(
                    "volume {id}: logical volume {id} is missing"
                ))
            })?;
        let layout_refusal = backend.layout_refusal(&lv);
        let device = lv
            .path
            .clone()
            .unwrap_or_else(|| format!("/dev/{}/{}", lv.vg.as_str(), lv.name).into());
        let own = OwnExports::of(&id);
        let (usage, probe, allowed) = tokio::task::spawn_blocking(move || {
            let u = usage(&device)?;
            let p = sys::blkid::probe(&device);
            let allowed: BTreeMap<String, (bool, Vec<String>)> = u
                .nvmet
                .iter()
                .map(|n| (n.subsystem.clone(), nvmet_allowed(&n.subsystem)))
                .collect();
            Ok::<_, AgentError>((u, p, allowed))
        })
        .await??;
        Ok(Inspection {
            lv,
            layout_refusal,
            usage,
            probe,
            mark,
            own,
            nvmet_allowed: allowed,
        })
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
