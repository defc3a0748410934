//! ExportVolume, UnexportVolume, AllowInitiator and DenyInitiator, and the
//! export steps other operations share.
use super::{blocking, recorded, Agent};
use crate::{
    backend::{BackendKind, VolumeState},
    error::AgentError,
    export::{ExportInfo, Protocol},
    fence::{Call, Token},
    marks::{BackendRecord, ExportRecord, FenceMark},
    volume::{truncate, VolumeId},
};
use std::sync::Arc;
use tracing::{info, warn};

/// The longest initiator name accepted (an NQN's limit).
const MAX_INITIATOR: usize = 223;

impl Agent {
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

    async fn apply_export(
        &self,
        id: &VolumeId,
        protocol: Protocol,
        device: &VolumeState,
        record: &ExportRecord,
    ) -> Result<ExportInfo, AgentError> {
        let exporter = self.exporter(protocol)?;
        let (vid, dev, rec) = (id.clone(), device.device_path.clone(), record.clone());
        blocking(move || exporter.export(&vid, &dev, &rec)).await
    }

    /// Applies `record`; when that fails, puts back `previous` (the recorded
    /// export) or removes what the failed apply left half-made, so a failed
    /// request leaves the kernel as its record says.
    async fn apply_or_undo(
        &self,
        id: &VolumeId,
        protocol: Protocol,
        device: &VolumeState,
        record: &ExportRecord,
        previous: Option<&ExportRecord>,
    ) -> Result<ExportInfo, AgentError> {
        let failed = match self.apply_export(id, protocol, device, record).await {
            Ok(info) => return Ok(info),
            Err(e) => e,
        };
        let undone = match previous {
            Some(previous) => self
                .apply_export(id, protocol, device, previous)
                .await
                .map(|_| ()),
            None => {
                let (exporter, vid) = (self.exporter(protocol)?, id.clone());
                blocking(move || exporter.unexport(&vid)).await
            }
        };
        if let Err(undo) = undone {
            // DeleteVolume and ReleaseVolume remove the agent's exports
            // whatever the mark says, so nothing stays behind for good.
            warn!(volume = %id, error = %undo, "could not undo a failed export");
        }
        Err(failed)
    }

    /// Removes every export of `id` that this agent's exporters could have
    /// made, recorded or not: an export interrupted before its mark was
    /// written is removed too.
    pub(super) async fn unexport_all(&self, id: &VolumeId) -> Result<(), AgentError> {
        for exporter in self.exporters.values() {
            let (exporter, vid) = (exporter.clone(), id.clone());
            blocking(move || exporter.unexport(&vid)).await?;
        }
        Ok(())
    }

    /// Applies every export `mark` records for the volume at `location`.
    pub(super) async fn export_all(
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

    /// ExportVolume.
    pub async fn export_volume(
        self: &Arc<Self>,
        id: &str,
        kind: Option<BackendKind>,
        protocol: Protocol,
        record: ExportRecord,
        token: Option<&Token>,
    ) -> Result<ExportInfo, AgentError> {
        let id = VolumeId::parse(id)?;
        self.backend(&id, kind)?.locate(&id)?;
        self.check_initiators(protocol, &record.allowed_initiators)?;
        let token = token.cloned();
        self.detached(move |agent| async move {
            agent.export_admitted(id, protocol, record, token).await
        })
        .await
    }

    async fn export_admitted(
        &self,
        id: VolumeId,
        protocol: Protocol,
        record: ExportRecord,
        token: Option<Token>,
    ) -> Result<ExportInfo, AgentError> {
        let mut txn = self.begin(&id, token.as_ref(), Call::Other).await?;
        let location = recorded(&id, &txn.mark)?;
        let device = self.device_of(&id, &location).await?;
        let previous = txn.mark.exports.get(protocol.as_str()).cloned();
        let info = self
            .apply_or_undo(&id, protocol, &device, &record, previous.as_ref())
            .await?;
        txn.mark
            .exports
            .insert(protocol.as_str().to_owned(), record);
        txn.commit().await?;
        info!(volume = %id, protocol = protocol.as_str(), target = %info.target_id, "volume exported");
        Ok(info)
    }

    /// UnexportVolume.
    pub async fn unexport_volume(
        self: &Arc<Self>,
        id: &str,
        protocol: Protocol,
        token: Option<&Token>,
    ) -> Result<(), AgentError> {
        let id = VolumeId::parse(id)?;
        self.backend(&id, None)?;
        let exporter = self.exporter(protocol)?;
        let token = token.cloned();
        self.detached(move |agent| async move {
            let mut txn = agent.begin(&id, token.as_ref(), Call::Other).await?;
            let vid = id.clone();
            blocking(move || exporter.unexport(&vid)).await?;
            txn.mark.exports.remove(protocol.as_str());
            txn.commit().await
        })
        .await
    }

    /// AllowInitiator (`allow` true) or DenyInitiator (`allow` false).
    pub async fn set_initiator(
        self: &Arc<Self>,
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
        let token = token.cloned();
        self.detached(move |agent| async move {
            agent
                .set_initiator_admitted(id, protocol, initiator, allow, token)
                .await
        })
        .await
    }

    async fn set_initiator_admitted(
        &self,
        id: VolumeId,
        protocol: Protocol,
        initiator: String,
        allow: bool,
        token: Option<Token>,
    ) -> Result<(), AgentError> {
        let mut txn = self.begin(&id, token.as_ref(), Call::Other).await?;
        let not_exported = || {
            AgentError::FailedPrecondition(format!(
                "volume {id} is not exported over {}",
                protocol.as_str()
            ))
        };
        let location = txn.mark.backend.clone().ok_or_else(not_exported)?;
        let previous = txn
            .mark
            .exports
            .get(protocol.as_str())
            .cloned()
            .ok_or_else(not_exported)?;
        let mut record = previous.clone();
        if allow {
            record.allowed_initiators.insert(initiator);
        } else {
            record.allowed_initiators.remove(&initiator);
        }
        let device = self.device_of(&id, &location).await?;
        self.apply_or_undo(&id, protocol, &device, &record, Some(&previous))
            .await?;
        txn.mark
            .exports
            .insert(protocol.as_str().to_owned(), record);
        txn.commit().await
    }
}
