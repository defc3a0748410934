//! The gRPC face of the agent: requests checked and translated, replies built.
//! Errors become status codes in one place ([`crate::error`]).
use crate::{
    backend::{BackendKind, CreateOptions, ImportSource},
    error::AgentError,
    export::Protocol,
    fence::Token,
    marks::{AdoptedSource, ExportRecord},
    service::{Agent, Inspection},
    volume::truncate,
};
use pillar_csi_proto::agent::v1::{self as pb, agent_service_server::AgentService};
use std::{sync::Arc, time::SystemTime};
use tonic::{Request, Response, Status};
use tracing::instrument;

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

fn backend_kind(value: i32) -> Result<Option<BackendKind>, AgentError> {
    match pb::BackendType::try_from(value) {
        Ok(pb::BackendType::Unspecified) => Ok(None),
        Ok(pb::BackendType::ZfsZvol) => Ok(Some(BackendKind::Zvol)),
        Ok(pb::BackendType::Lvm) => Ok(Some(BackendKind::Lvm)),
        Err(_) => Err(AgentError::InvalidArgument(format!(
            "backend_type {value} is not a known BackendType"
        ))),
    }
}

fn backend_type(kind: BackendKind) -> pb::BackendType {
    match kind {
        BackendKind::Zvol => pb::BackendType::ZfsZvol,
        BackendKind::Lvm => pb::BackendType::Lvm,
    }
}

fn protocol(value: i32) -> Result<Protocol, AgentError> {
    match pb::ProtocolType::try_from(value) {
        Ok(pb::ProtocolType::NvmeofTcp) => Ok(Protocol::NvmeofTcp),
        Ok(pb::ProtocolType::Iscsi) => Ok(Protocol::Iscsi),
        Ok(pb::ProtocolType::Unspecified) => Err(AgentError::InvalidArgument(
            "protocol_type is required (PROTOCOL_TYPE_NVMEOF_TCP or PROTOCOL_TYPE_ISCSI)".into(),
        )),
        Err(_) => Err(AgentError::InvalidArgument(format!(
            "protocol_type {value} is not a known ProtocolType"
        ))),
    }
}

fn protocol_type(p: Protocol) -> pb::ProtocolType {
    match p {
        Protocol::NvmeofTcp => pb::ProtocolType::NvmeofTcp,
        Protocol::Iscsi => pb::ProtocolType::Iscsi,
    }
}

fn token(fence: Option<pb::FenceToken>) -> Option<Token> {
    fence.map(|f| Token {
        volume_uid: f.volume_uid,
        generation: f.generation,
    })
}

fn export_record(acl: bool, initiators: Vec<String>) -> ExportRecord {
    ExportRecord {
        acl,
        allowed_initiators: initiators.into_iter().collect(),
    }
}

/// The import source of a CreateVolumeRequest, if it names one.
fn import_source(r: &pb::CreateVolumeRequest) -> Result<Option<ImportSource>, AgentError> {
    match (&r.import_zvol, &r.import_lv) {
        (z, Some(_)) if !z.is_empty() => Err(AgentError::InvalidArgument(format!(
            "volume {}: set at most one of import_zvol and import_lv",
            truncate(&r.volume_id)
        ))),
        (z, None) if !z.is_empty() => Ok(Some(ImportSource::Zvol { dataset: z.clone() })),
        (_, Some(lv)) => {
            let value = format!(
                "{}/{}:{}:{}",
                lv.volume_group, lv.logical_volume, lv.volume_group_uuid, lv.logical_volume_uuid
            );
            let identity = api::annotations::parse_import_lv(&value).map_err(|e| {
                AgentError::InvalidArgument(format!(
                    "volume {}: import_lv: {e}",
                    truncate(&r.volume_id)
                ))
            })?;
            let policy = match r.import_lv_policy.as_str() {
                "" => api::annotations::LvPolicy::PreserveOriginal,
                other => api::annotations::parse_import_lv_policy(Some(other)).map_err(|e| {
                    AgentError::InvalidArgument(format!(
                        "volume {}: import_lv_policy: {e}",
                        truncate(&r.volume_id)
                    ))
                })?,
            };
            Ok(Some(ImportSource::Lv { identity, policy }))
        }
        _ => Ok(None),
    }
}

fn lvm_identity(vg: &str, lv: &str, vg_uuid: &str, lv_uuid: &str) -> pb::LvmIdentity {
    pb::LvmIdentity {
        volume_group: vg.to_owned(),
        logical_volume: lv.to_owned(),
        volume_group_uuid: vg_uuid.to_owned(),
        logical_volume_uuid: lv_uuid.to_owned(),
    }
}

/// The wire form of an inspection.
fn inspection(volume_id: String, i: Inspection) -> pb::InspectVolumeResponse {
    use sys::block::Exclusive;
    let lv = &i.lv;
    let device_path = lv
        .path
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let (filesystem_probe_state, filesystem_type) = match &i.probe {
        sys::blkid::Probe::Filesystem { fs_type } => ("filesystem", fs_type.clone()),
        sys::blkid::Probe::Blank => ("blank", String::new()),
        _ => ("unknown", String::new()),
    };
    let mut consumers = Vec::new();
    for m in &i.usage.mounts {
        consumers.push(pb::VolumeConsumer {
            kind: "mount".into(),
            device: m.device.clone(),
            detail: m.mount_point.display().to_string(),
        });
    }
    for h in &i.usage.holders {
        consumers.push(pb::VolumeConsumer {
            kind: "holder".into(),
            device: h.of.clone(),
            detail: match &h.dm_name {
                Some(n) => format!("{} ({n})", h.holder),
                None => h.holder.clone(),
            },
        });
    }
    let recorded = |p: Protocol| {
        i.mark
            .as_ref()
            .and_then(|m| m.exports.get(p.as_str()).cloned())
    };
    let mut exports = Vec::new();
    for n in &i.usage.nvmet {
        let (allow_any_host, allowed_hosts) = i
            .nvmet_allowed
            .get(&n.subsystem)
            .cloned()
            .unwrap_or_default();
        exports.push(pb::VolumeExport {
            protocol_type: pb::ProtocolType::NvmeofTcp as i32,
            target_id: n.subsystem.clone(),
            managed: n.subsystem == i.own.nqn && recorded(Protocol::NvmeofTcp).is_some(),
            allowed_hosts,
            allow_any_host,
        });
    }
    for l in &i.usage.lio {
        let own = if l.name == i.own.lio_object {
            recorded(Protocol::Iscsi)
        } else {
            None
        };
        exports.push(pb::VolumeExport {
            protocol_type: pb::ProtocolType::Iscsi as i32,
            target_id: format!("{}/{}", l.backstore, l.name),
            managed: own.is_some(),
            allow_any_host: own.as_ref().is_some_and(|r| !r.acl),
            allowed_hosts: own
                .map(|r| r.allowed_initiators.into_iter().collect())
                .unwrap_or_default(),
        });
    }
    let fence = match &i.mark {
        None => pb::FenceState::default(),
        Some(m) => {
            let (lvm_source, preserve_original) = match &m.adopted {
                Some(AdoptedSource::Lv {
                    vg,
                    lv,
                    vg_uuid,
                    lv_uuid,
                    preserve_original,
                }) => (
                    Some(lvm_identity(vg, lv, vg_uuid, lv_uuid)),
                    *preserve_original,
                ),
                _ => (None, false),
            };
            pb::FenceState {
                exists: true,
                ended: m.fence.live.is_none(),
                volume_uid: m
                    .fence
                    .live
                    .as_ref()
                    .map(|l| l.volume_uid.clone())
                    .unwrap_or_default(),
                generation: m.fence.live.as_ref().map(|l| l.generation).unwrap_or(0),
                lvm_source,
                preserve_original,
                ended_uids: m.fence.ended_uids.iter().cloned().collect(),
            }
        }
    };
    pb::InspectVolumeResponse {
        volume_id,
        lvm: Some(pb::LvmObservation {
            identity: Some(lvm_identity(
                lv.vg.as_str(),
                &lv.name,
                lv.vg_uuid.as_str(),
                lv.uuid.as_str(),
            )),
            exclusive_claim: match i.usage.exclusive {
                Exclusive::Free => "free",
                Exclusive::Busy => "busy",
                Exclusive::Unknown(_) => "unknown",
            }
            .into(),
            size_bytes: lv.size,
            segtype: lv.segtype.clone(),
            lv_attr: lv.attr.raw.clone(),
            pool_lv: lv.pool_lv.clone().unwrap_or_default(),
            active: lv.attr.active,
            device_path,
            layout_refusal: i.layout_refusal.clone().unwrap_or_default(),
        }),
        filesystem_probe_state: filesystem_probe_state.into(),
        filesystem_type,
        consumers,
        exports,
        fence: Some(fence),
        observed_at: Some(prost_types::Timestamp::from(SystemTime::now())),
    }
}

type Reply<T> = Result<Response<T>, Status>;

/// The RPCs this agent serves, in the order `AgentService` declares them
/// (GetCapabilitiesResponse.rpcs).
pub const SERVED_RPCS: [&str; 14] = [
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
    "ReconcileState",
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
        let options = CreateOptions {
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
                    .create_volume(
                        &r.volume_id,
                        kind,
                        r.capacity_bytes,
                        options,
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

    #[instrument(skip_all, fields(volume = %request.get_ref().volume_id))]
    async fn inspect_volume(
        &self,
        request: Request<pb::InspectVolumeRequest>,
    ) -> Reply<pb::InspectVolumeResponse> {
        let r = request.into_inner();
        let i = self
            .agent
            .inspect_volume(&r.volume_id, backend_kind(r.backend_type)?)
            .await?;
        Ok(Response::new(inspection(r.volume_id, i)))
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
                export_record(r.acl_enabled, r.allowed_initiators),
                token(r.fence).as_ref(),
            )
            .await?;
        Ok(Response::new(pb::ExportVolumeResponse {
            target_id: info.target_id,
            address: info.listener.address.to_string(),
            port: u32::from(info.listener.port),
            lun: info.lun,
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
                export_record(e.acl_enabled, e.allowed_initiators),
                token(e.fence),
            ));
        }
        let out = self.agent.reconcile_exports(desired).await;
        Ok(Response::new(pb::ReconcileStateResponse {
            repaired: out.applied,
            refused: out.failed,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VG_UUID: &str = "Xk3pQm-1aB2-c3D4-e5F6-g7H8-i9J0-Kl1mNo";
    const LV_UUID: &str = "Rt7uVw-2cD3-e4F5-g6H7-i8J9-k0L1-Mn2oPq";

    fn request(zvol: &str, lv: Option<(&str, &str)>, policy: &str) -> pb::CreateVolumeRequest {
        pb::CreateVolumeRequest {
            volume_id: "data-vg/legacy".into(),
            import_zvol: zvol.into(),
            import_lv: lv.map(|(vg, lv)| lvm_identity(vg, lv, VG_UUID, LV_UUID)),
            import_lv_policy: policy.into(),
            ..Default::default()
        }
    }

    /// GetCapabilities lists every RPC `agent.proto` declares, in its order:
    /// an RPC added to the contract and not to the list fails here.
    #[tokio::test]
    async fn get_capabilities_lists_the_rpcs_the_proto_declares() -> Result<(), AgentError> {
        let declared: Vec<&str> = include_str!("../../proto/pillar_csi/agent/v1/agent.proto")
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

    #[test]
    fn import_fields_become_one_checked_source() -> Result<(), AgentError> {
        assert_eq!(import_source(&request("", None, ""))?, None);
        assert_eq!(
            import_source(&request("tank/k8s/v", None, ""))?,
            Some(ImportSource::Zvol {
                dataset: "tank/k8s/v".into()
            })
        );
        let Some(ImportSource::Lv { identity, policy }) =
            import_source(&request("", Some(("data-vg", "legacy")), ""))?
        else {
            panic!("an LV source");
        };
        assert_eq!(identity.lv_uuid.as_str(), LV_UUID);
        assert_eq!(policy, api::annotations::LvPolicy::PreserveOriginal);
        assert!(matches!(
            import_source(&request("", Some(("data-vg", "legacy")), "Managed"))?,
            Some(ImportSource::Lv {
                policy: api::annotations::LvPolicy::Managed,
                ..
            })
        ));
        for bad in [
            request("tank/k8s/v", Some(("data-vg", "legacy")), ""),
            request("", Some(("data-vg", "legacy")), "managed"),
            request("", Some(("data-vg", "a/b")), ""),
            request("", Some(("data vg", "legacy")), ""),
        ] {
            assert!(
                matches!(import_source(&bad), Err(AgentError::InvalidArgument(_))),
                "{bad:?}"
            );
        }
        Ok(())
    }
}
