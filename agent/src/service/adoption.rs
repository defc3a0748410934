//! CreateVolume with an import source (adopting an existing zvol or LV) and
//! ReleaseVolume.
use super::{blocking, describe, sized, Agent};
use crate::{
    adopt::in_use,
    backend::{Backend, BackendKind, ImportSource, VolumeState},
    error::AgentError,
    fence::{Admission, Call, Token},
    marks::{AdoptedSource, BackendRecord, FenceMark, ProbeRecord},
    volume::VolumeId,
};
use std::sync::Arc;
use tracing::{info, warn};

/// The backend record of a pinned source.
pub(crate) fn pinned_record(pin: &AdoptedSource) -> BackendRecord {
    match pin {
        AdoptedSource::Zvol { dataset } => BackendRecord::Zvol {
            dataset: dataset.clone(),
            guid: None,
        },
        AdoptedSource::Dataset { dataset } => BackendRecord::Dataset {
            dataset: dataset.clone(),
            guid: None,
        },
        AdoptedSource::Directory { path } => BackendRecord::Directory {
            path: path.clone(),
            inode: None,
            project: None,
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
pub(super) fn identity_mismatch(pin: &AdoptedSource, lv: &sys::lvm::Lv) -> Option<String> {
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

/// The pin an import of `source` asks for.
fn wanted_pin(source: &ImportSource) -> AdoptedSource {
    match source {
        ImportSource::Zvol { dataset, .. } => AdoptedSource::Zvol {
            dataset: dataset.clone(),
        },
        ImportSource::Dataset { dataset } => AdoptedSource::Dataset {
            dataset: dataset.clone(),
        },
        ImportSource::Directory { path } => AdoptedSource::Directory { path: path.clone() },
        ImportSource::Lv { identity, policy } => AdoptedSource::Lv {
            vg: identity.vg.as_str().to_owned(),
            lv: identity.lv.as_str().to_owned(),
            vg_uuid: identity.vg_uuid.as_str().to_owned(),
            lv_uuid: identity.lv_uuid.as_str().to_owned(),
            preserve_original: policy.preserves(),
        },
    }
}

impl Agent {
    /// ReleaseVolume: removes every export and ends the lifecycle; the
    /// backend volume stays. An adopted volume is no longer recorded as
    /// served: the next lifecycle must import it again, with every check.
    pub async fn release_volume(
        self: &Arc<Self>,
        id: &str,
        kind: Option<BackendKind>,
        token: Option<&Token>,
    ) -> Result<(), AgentError> {
        let id = VolumeId::parse(id)?;
        let backend = self.backend(&id, kind)?;
        let token = token.cloned();
        self.detached(move |agent| async move {
            let mut txn = agent.begin(&id, token.as_ref(), Call::Release).await?;
            if txn.admission == Admission::RepeatsRelease {
                // The release whose reply was lost: it is done.
                return Ok(());
            }
            if let (Some(true), Some(record)) = (
                txn.mark.adopted.as_ref().map(AdoptedSource::is_filesystem),
                txn.mark.backend.clone(),
            ) {
                // The pinned filesystem or directory (its GUID, or inode
                // and project, checked), then its exports removed; it
                // stays as it is.
                let b = backend.clone();
                blocking(move || b.lookup(&record)).await?;
                agent.unexport_all(&id, &txn.mark).await?;
            } else if let Some(pin) = txn.mark.adopted.clone().filter(AdoptedSource::preserves) {
                agent
                    .verify_preserved_idle(&id, &backend, &pin, &txn.mark)
                    .await?;
            } else {
                agent.unexport_all(&id, &txn.mark).await?;
            }
            crate::crash::point("release-unexported");
            txn.mark.fence = txn.mark.fence.end_released(token);
            txn.mark.exports.clear();
            if txn.mark.adopted.is_some() {
                txn.mark.backend = None;
            }
            txn.commit().await
        })
        .await
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
        let (b, r) = (backend.clone(), record.clone());
        let lv = blocking(move || b.report_lv(&r)).await?.ok_or_else(|| {
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
        let own = self.own_exports(id);
        let (b, dev) = (backend.clone(), device.clone());
        let first = blocking(move || b.device_usage(&dev)).await?;
        if let Some(why) = in_use(&first, Some(&own), false) {
            return Err(refuse(why));
        }
        self.unexport_all(id, mark).await?;
        let (b, dev) = (backend.clone(), device.clone());
        let after = blocking(move || b.device_usage(&dev)).await?;
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
        self: &Arc<Self>,
        id: &str,
        kind: Option<BackendKind>,
        bytes: u64,
        source: ImportSource,
        token: Option<&Token>,
    ) -> Result<VolumeState, AgentError> {
        let id = sized(id, bytes, "capacity_bytes")?;
        let backend = self.backend(&id, kind)?;
        let token = token.cloned();
        self.detached(move |agent| async move {
            agent
                .import_admitted(id, backend, bytes, source, token)
                .await
        })
        .await
    }

    async fn import_admitted(
        &self,
        id: VolumeId,
        backend: Arc<dyn Backend>,
        bytes: u64,
        source: ImportSource,
        token: Option<Token>,
    ) -> Result<VolumeState, AgentError> {
        let wanted = wanted_pin(&source);
        let mut txn = self.begin(&id, token.as_ref(), Call::Other).await?;
        let continues = txn.admission == Admission::Continues;
        let refused = |why: String| crate::adopt::refused(&id, why);
        match &txn.mark.adopted {
            Some(pin) if pin == &wanted => {
                if let (true, Some(record)) = (continues, txn.mark.backend.clone()) {
                    let b = backend.clone();
                    let state = blocking(move || b.lookup(&record)).await?.ok_or_else(|| {
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
                    // The retry may carry a newer generation: record it.
                    txn.commit().await?;
                    return Ok(state);
                }
            }
            Some(
                pin @ (AdoptedSource::Zvol { .. }
                | AdoptedSource::Dataset { .. }
                | AdoptedSource::Directory { .. }),
            ) => {
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
                if continues && txn.mark.backend.is_some() {
                    return Err(refused(
                        "it was already provisioned without an import; delete it and import again"
                            .into(),
                    ));
                }
            }
        }
        let vid = id.clone();
        let (record, state) = blocking(move || backend.import(&vid, &source, bytes)).await?;
        crate::crash::point("import-backend-done");
        // The spec's `blkid -p` signature probe, read-only and in-process.
        // It refuses nothing: what it found is recorded with the pin. A
        // filesystem (a mounted directory) has no device to probe.
        let probe = if record.is_filesystem() {
            None
        } else {
            let device = state.device_path.clone();
            Some(blocking(move || Ok(ProbeRecord::from(&sys::blkid::probe(&device)))).await?)
        };
        txn.mark.backend = Some(record);
        txn.mark.adopted = Some(wanted);
        txn.mark.import_probe = probe.clone();
        txn.commit().await?;
        info!(volume = %id, bytes = state.capacity_bytes, probe = ?probe, "existing volume adopted");
        Ok(state)
    }
}
