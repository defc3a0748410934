//! The gRPC face of the agent: requests checked and translated, replies built.
//! Errors become status codes in one place ([`crate::error`]).
//!
//! | file | job |
//! | --- | --- |
//! | `mod.rs` | the `AgentService` implementation: one method per RPC |
//! | `convert.rs` | wire enums, tokens and import sources to the agent's types |
//! | `inspect.rs` | the wire form of an inspection |
//! | `recovery.rs` | the recovery snapshot of InspectVolume, TransferVolumeOwnership |
//! | `snapshots.rs` | content sources and snapshot infos |
use crate::{
    backend::{BackendKind, CreateOptions},
    error::AgentError,
    export::Protocol,
    service::Agent,
};
use convert::{
    backend_kind, backend_type, export_record, import_source, protocol, protocol_type, token,
};
use pillar_csi_proto::agent::v1::{self as pb, agent_service_server::AgentService};
use std::{sync::Arc, time::SystemTime};
use tonic::{Request, Response, Status};
use tracing::instrument;

mod convert;
mod inspect;
mod recovery;
mod snapshots;

/// The tonic service over an [`Agent`].
#[derive(Clone)]
pub struct AgentGrpc {
    agent: Arc<Agent>,
    version: String,
}

impl AgentGrpc {
    /// Serves `agent`, reporting `version` in GetCapabilities.
    pub fn new(agent: Arc<Agent>, version: impl Into<String>) -> Self {
        Self {
            agent,
            version: version.into(),
        }
    }
}

type Reply<T> = Result<Response<T>, Status>;

/// The RPCs this agent serves, in the order `AgentService` declares them
/// (GetCapabilitiesResponse.rpcs).
pub const SERVED_RPCS: [&str; 18] = [
    "GetCapabilities",
    "GetCapacity",
    "ListVolumes",
    "HealthCheck",
    "CreateVolume",
    "DeleteVolume",
    "ExpandVolume",
    "ExportVolume",
    "UnexportVolume",
    "AllowInitiator",
    "DenyInitiator",
    "ReleaseVolume",
    "InspectVolume",
    "TransferVolumeOwnership",
    "ReconcileState",
    "CreateSnapshot",
    "DeleteSnapshot",
    "ListSnapshots",
];

#[tonic::async_trait]
impl AgentService for AgentGrpc {
    #[instrument(skip_all)]
    async fn get_capabilities(
        &self,
        _: Request<pb::GetCapabilitiesRequest>,
    ) -> Reply<pb::GetCapabilitiesResponse> {
        let mut backend_types: Vec<i32> = self
            .agent
            .backends()
            .iter()
            .map(|b| backend_type(b.kind()) as i32)
            .collect();
        backend_types.sort_unstable();
        backend_types.dedup();
        Ok(Response::new(pb::GetCapabilitiesResponse {
            backend_types,
            protocol_types: self
                .agent
                .exporters()
                .map(|e| protocol_type(e.protocol()) as i32)
                .collect(),
            agent_version: self.version.clone(),
            rpcs: SERVED_RPCS.iter().map(|r| (*r).to_owned()).collect(),
        }))
    }

    #[instrument(skip_all)]
    async fn get_capacity(
        &self,
        request: Request<pb::GetCapacityRequest>,
    ) -> Reply<pb::GetCapacityResponse> {
        let r = request.into_inner();
        let c = self
            .agent
            .capacity(backend_kind(r.backend_type)?, &r.pool)
            .await?;
        Ok(Response::new(pb::GetCapacityResponse {
            total_bytes: c.total_bytes,
            available_bytes: c.available_bytes,
            used_bytes: c.used_bytes,
        }))
    }

    #[instrument(skip_all)]
    async fn list_volumes(
        &self,
        _: Request<pb::ListVolumesRequest>,
    ) -> Reply<pb::ListVolumesResponse> {
        let volumes = self
            .agent
            .list_volumes()
            .await?
            .into_iter()
            .map(|v| {
                let kind = match &v.mark.backend {
                    Some(crate::marks::BackendRecord::Zvol { .. }) => pb::BackendType::ZfsZvol,
                    Some(crate::marks::BackendRecord::Dataset { .. }) => {
                        pb::BackendType::ZfsDataset
                    }
                    Some(crate::marks::BackendRecord::Directory { .. }) => {
                        pb::BackendType::Directory
                    }
                    Some(crate::marks::BackendRecord::Lv { .. }) => pb::BackendType::Lvm,
                    None => pb::BackendType::Unspecified,
                };
                pb::VolumeInfo {
                    volume_id: v.mark.volume_id.clone(),
                    backend_type: kind as i32,
                    capacity_bytes: v.state.as_ref().map_or(0, |s| s.capacity_bytes),
                    device_path: v
                        .state
                        .as_ref()
                        .map(|s| s.device_path.display().to_string())
                        .unwrap_or_default(),
                    fence: v.mark.fence.live.as_ref().map(|l| pb::FenceToken {
                        volume_uid: l.volume_uid.clone(),
                        generation: l.generation,
                    }),
                    ended: v.mark.fence.live.is_none(),
                    exports: v
                        .mark
                        .exports
                        .keys()
                        .filter_map(|p| Protocol::parse(p))
                        .map(|p| protocol_type(p) as i32)
                        .collect(),
                }
            })
            .collect();
        Ok(Response::new(pb::ListVolumesResponse { volumes }))
    }

    #[instrument(skip_all)]
    async fn health_check(
        &self,
        _: Request<pb::HealthCheckRequest>,
    ) -> Reply<pb::HealthCheckResponse> {
        let mut components = Vec::new();
        let mut push = |name: String, result: Result<(), AgentError>| {
            components.push(pb::ComponentHealth {
                name,
                healthy: result.is_ok(),
                message: result.err().map(|e| e.to_string()).unwrap_or_default(),
            })
        };
        for e in self.agent.exporters() {
            let name = match e.protocol() {
                Protocol::NvmeofTcp => "nvmet",
                Protocol::Iscsi => "lio",
                Protocol::Nfs => "nfsd",
                Protocol::Local => "local",
            };
            let e = e.clone();
            push(
                name.into(),
                tokio::task::spawn_blocking(move || e.health())
                    .await
                    .map_err(AgentError::from)
                    .and_then(|r| r),
            );
        }
        for b in self.agent.backends() {
            let prefix = match b.kind() {
                BackendKind::Zvol => "zfs",
                BackendKind::Lvm => "lvm",
                BackendKind::Dataset => "zfs-dataset",
                BackendKind::Directory => "directory",
            };
            let name = format!("{prefix}:{}", b.pool());
            let b = b.clone();
            let r = tokio::task::spawn_blocking(move || b.capacity().map(|_| ()))
                .await
                .map_err(AgentError::from)
                .and_then(|r| r);
            push(name, r);
        }
        let dir = self.agent.marks().dir().to_path_buf();
        push(
            "state".into(),
            std::fs::metadata(&dir).map(|_| ()).map_err(|e| {
                AgentError::Unavailable(format!("state directory {}: {e}", dir.display()))
            }),
        );
        Ok(Response::new(pb::HealthCheckResponse {
            healthy: components.iter().all(|c| c.healthy),
            components,
            checked_at: Some(prost_types::Timestamp::from(SystemTime::now())),
        }))
    }

    #[instrument(skip_all, fields(volume = %request.get_ref().volume_id))]
    async fn create_volume(
        &self,
        request: Request<pb::CreateVolumeRequest>,
    ) -> Reply<pb::CreateVolumeResponse> {
        let r = request.into_inner();
        let import = import_source(&r)?;
        let source = snapshots::content_source(&r)?;
        if let Some(property) = crate::sealed_key::PROPERTIES
            .into_iter()
            .find(|p| r.zfs_properties.contains_key(*p))
        {
            return Err(AgentError::InvalidArgument(format!(
                "zfs property {property}: it holds the agent's sealed key of an encrypted zvol and cannot be set"
            ))
            .into());
        }
        if r.encrypted && import.is_some() {
            return Err(AgentError::InvalidArgument(
                "encrypted is for new volumes: an imported zvol keeps the encryption it has".into(),
            )
            .into());
        }
        let options = CreateOptions {
            encrypted: r.encrypted,
            zfs_properties: r.zfs_properties.into_iter().collect(),
            thin: match pb::LvmProvisioning::try_from(r.lvm_provisioning) {
                Ok(pb::LvmProvisioning::Unspecified) => None,
                Ok(pb::LvmProvisioning::Linear) => Some(false),
                Ok(pb::LvmProvisioning::Thin) => Some(true),
                Err(_) => {
                    return Err(AgentError::InvalidArgument(format!(
                        "lvm_provisioning {} is not known",
                        r.lvm_provisioning
                    ))
                    .into())
                }
            },
        };
        let kind = backend_kind(r.backend_type)?;
        let state = match import {
            Some(source) => {
                self.agent
                    .import_volume(
                        &r.volume_id,
                        kind,
                        r.capacity_bytes,
                        source,
                        token(r.fence).as_ref(),
                    )
                    .await?
            }
            None => {
                self.agent
                    .create_volume_from(
                        &r.volume_id,
                        kind,
                        r.capacity_bytes,
                        options,
                        source,
                        token(r.fence).as_ref(),
                    )
                    .await?
            }
        };
        Ok(Response::new(pb::CreateVolumeResponse {
            volume_id: r.volume_id,
            capacity_bytes: state.capacity_bytes,
            device_path: state.device_path.display().to_string(),
        }))
    }

    #[instrument(skip_all, fields(volume = %request.get_ref().source_volume_id))]
    async fn create_snapshot(
        &self,
        request: Request<pb::CreateSnapshotRequest>,
    ) -> Reply<pb::CreateSnapshotResponse> {
        let r = request.into_inner();
        let snapshot = self
            .agent
            .create_snapshot(
                &r.source_volume_id,
                backend_kind(r.backend_type)?,
                &r.snapshot_uid,
                token(r.fence).as_ref(),
            )
            .await?;
        Ok(Response::new(pb::CreateSnapshotResponse {
            snapshot: Some(snapshots::snapshot_info(snapshot)),
        }))
    }

    #[instrument(skip_all, fields(snapshot = %request.get_ref().snapshot_id))]
    async fn delete_snapshot(
        &self,
        request: Request<pb::DeleteSnapshotRequest>,
    ) -> Reply<pb::DeleteSnapshotResponse> {
        let r = request.into_inner();
        self.agent
            .delete_snapshot(&r.snapshot_id, backend_kind(r.backend_type)?)
            .await?;
        Ok(Response::new(pb::DeleteSnapshotResponse {}))
    }

    #[instrument(skip_all)]
    async fn list_snapshots(
        &self,
        request: Request<pb::ListSnapshotsRequest>,
    ) -> Reply<pb::ListSnapshotsResponse> {
        let r = request.into_inner();
        let source = Some(r.source_volume_id.as_str()).filter(|s| !s.is_empty());
        let snapshots = self.agent.list_snapshots(source).await?;
        Ok(Response::new(pb::ListSnapshotsResponse {
            snapshots: snapshots
                .into_iter()
                .map(snapshots::snapshot_info)
                .collect(),
        }))
    }

    #[instrument(skip_all, fields(volume = %request.get_ref().volume_id))]
    async fn inspect_volume(
        &self,
        request: Request<pb::InspectVolumeRequest>,
    ) -> Reply<pb::InspectVolumeResponse> {
        let verified = recovery::verified_caller(&request);
        let reply = inspect_answer(
            &self.agent,
            request.into_inner(),
            verified,
            SystemTime::now(),
        )
        .await?;
        Ok(Response::new(reply))
    }

    #[instrument(skip_all, fields(volume = %request.get_ref().volume_id))]
    async fn transfer_volume_ownership(
        &self,
        request: Request<pb::TransferVolumeOwnershipRequest>,
    ) -> Reply<pb::TransferVolumeOwnershipResponse> {
        let verified = recovery::verified_caller(&request);
        let r = request.into_inner();
        let digest = r
            .authorization
            .as_ref()
            .map(|a| crate::recovery::hex(&crate::recovery::authorization_digest(a)))
            .unwrap_or_default();
        let transfer = self
            .agent
            .transfer_volume_ownership(r, verified, SystemTime::now())
            .await?;
        Ok(Response::new(recovery::transfer_reply(transfer, digest)))
    }

    #[instrument(skip_all, fields(volume = %request.get_ref().volume_id))]
    async fn delete_volume(
        &self,
        request: Request<pb::DeleteVolumeRequest>,
    ) -> Reply<pb::DeleteVolumeResponse> {
        let r = request.into_inner();
        self.agent
            .delete_volume(
                &r.volume_id,
                backend_kind(r.backend_type)?,
                token(r.fence).as_ref(),
            )
            .await?;
        Ok(Response::new(pb::DeleteVolumeResponse {}))
    }

    #[instrument(skip_all, fields(volume = %request.get_ref().volume_id))]
    async fn expand_volume(
        &self,
        request: Request<pb::ExpandVolumeRequest>,
    ) -> Reply<pb::ExpandVolumeResponse> {
        let r = request.into_inner();
        let capacity_bytes = self
            .agent
            .expand_volume(
                &r.volume_id,
                backend_kind(r.backend_type)?,
                r.requested_bytes,
                token(r.fence).as_ref(),
            )
            .await?;
        Ok(Response::new(pb::ExpandVolumeResponse { capacity_bytes }))
    }

    #[instrument(skip_all, fields(volume = %request.get_ref().volume_id))]
    async fn export_volume(
        &self,
        request: Request<pb::ExportVolumeRequest>,
    ) -> Reply<pb::ExportVolumeResponse> {
        let r = request.into_inner();
        let info = self
            .agent
            .export_volume(
                &r.volume_id,
                backend_kind(r.backend_type)?,
                protocol(r.protocol_type)?,
                export_record(r.acl_enabled, r.allowed_initiators, r.chap),
                token(r.fence).as_ref(),
            )
            .await?;
        Ok(Response::new(pb::ExportVolumeResponse {
            target_id: info.target_id,
            address: info.listener.address.to_string(),
            port: u32::from(info.listener.port),
            lun: info.lun,
            device_identity: info.device_identity,
        }))
    }

    #[instrument(skip_all, fields(volume = %request.get_ref().volume_id))]
    async fn unexport_volume(
        &self,
        request: Request<pb::UnexportVolumeRequest>,
    ) -> Reply<pb::UnexportVolumeResponse> {
        let r = request.into_inner();
        self.agent
            .unexport_volume(
                &r.volume_id,
                protocol(r.protocol_type)?,
                token(r.fence).as_ref(),
            )
            .await?;
        Ok(Response::new(pb::UnexportVolumeResponse {}))
    }

    #[instrument(skip_all, fields(volume = %request.get_ref().volume_id))]
    async fn allow_initiator(
        &self,
        request: Request<pb::AllowInitiatorRequest>,
    ) -> Reply<pb::AllowInitiatorResponse> {
        let r = request.into_inner();
        self.agent
            .set_initiator(
                &r.volume_id,
                protocol(r.protocol_type)?,
                &r.initiator_id,
                true,
                token(r.fence).as_ref(),
            )
            .await?;
        Ok(Response::new(pb::AllowInitiatorResponse {}))
    }

    #[instrument(skip_all, fields(volume = %request.get_ref().volume_id))]
    async fn deny_initiator(
        &self,
        request: Request<pb::DenyInitiatorRequest>,
    ) -> Reply<pb::DenyInitiatorResponse> {
        let r = request.into_inner();
        self.agent
            .set_initiator(
                &r.volume_id,
                protocol(r.protocol_type)?,
                &r.initiator_id,
                false,
                token(r.fence).as_ref(),
            )
            .await?;
        Ok(Response::new(pb::DenyInitiatorResponse {}))
    }

    #[instrument(skip_all, fields(volume = %request.get_ref().volume_id))]
    async fn release_volume(
        &self,
        request: Request<pb::ReleaseVolumeRequest>,
    ) -> Reply<pb::ReleaseVolumeResponse> {
        let r = request.into_inner();
        self.agent
            .release_volume(
                &r.volume_id,
                backend_kind(r.backend_type)?,
                token(r.fence).as_ref(),
            )
            .await?;
        Ok(Response::new(pb::ReleaseVolumeResponse {}))
    }

    #[instrument(skip_all)]
    async fn reconcile_state(
        &self,
        request: Request<pb::ReconcileStateRequest>,
    ) -> Reply<pb::ReconcileStateResponse> {
        let mut desired = Vec::new();
        for e in request.into_inner().exports {
            desired.push((
                e.volume_id,
                protocol(e.protocol_type)?,
                export_record(e.acl_enabled, e.allowed_initiators, e.chap),
                token(e.fence),
            ));
        }
        let out = self.agent.reconcile_exports(desired).await;
        Ok(Response::new(pb::ReconcileStateResponse {
            repaired: out.applied,
            refused: out.failed,
            refusals: out
                .refusals
                .into_iter()
                .map(|(volume_id, message)| pb::RefusedExport { volume_id, message })
                .collect(),
        }))
    }
}

/// InspectVolume's answer: the inspection, with the signed recovery
/// snapshot when the caller's client certificate was verified (`verified`)
/// and the agent has recovery configured.
pub(crate) async fn inspect_answer(
    agent: &Agent,
    r: pb::InspectVolumeRequest,
    verified: bool,
    now: SystemTime,
) -> Result<pb::InspectVolumeResponse, AgentError> {
    let i = agent
        .inspect_volume(&r.volume_id, backend_kind(r.backend_type)?)
        .await?;
    let mut reply = inspect::inspection(r.volume_id, &i);
    if let (true, Some(config)) = (verified, agent.recovery()) {
        reply.snapshot = recovery::snapshot(config, &reply, now)
            .map_err(|why| AgentError::Internal(format!("signing the recovery snapshot: {why}")))?;
    }
    Ok(reply)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// GetCapabilities lists every RPC `agent.proto` declares, in its order:
    /// an RPC added to the contract and not to the list fails here.
    #[tokio::test]
    async fn get_capabilities_lists_the_rpcs_the_proto_declares() -> Result<(), AgentError> {
        let declared: Vec<&str> = include_str!("../../../proto/pillar_csi/agent/v1/agent.proto")
            .lines()
            .filter_map(|l| l.trim_start().strip_prefix("rpc "))
            .filter_map(|l| l.split('(').next())
            .map(str::trim)
            .collect();
        let dir = tempfile::tempdir().map_err(|e| AgentError::Internal(e.to_string()))?;
        let marks = crate::marks::MarkStore::open(dir.path())?;
        let grpc = AgentGrpc::new(Arc::new(Agent::new(vec![], vec![], marks)), "test");
        let caps = grpc
            .get_capabilities(Request::new(pb::GetCapabilitiesRequest {}))
            .await
            .map_err(|s| AgentError::Internal(s.to_string()))?
            .into_inner();
        assert!(!declared.is_empty());
        assert_eq!(caps.rpcs, declared);
        Ok(())
    }
}
