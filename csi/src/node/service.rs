//! The CSI Node gRPC service: checks each request's fields, runs the work on
//! a blocking thread inside a tracing span carrying the volume ID, and maps
//! results to CSI's replies and status codes.
use super::error::{Error, Result};
use super::publish::PublishRequest;
use super::stage::{Access, StageRequest};
use super::{format::requested_fs_type, Node};
use crate::driver::Driver;
use crate::publish_context::{Chap, PublishContext};
use crate::volume_context;
use pillar_csi_proto::csi::v1::{
    self as pb, node_server, node_service_capability, volume_capability::AccessType,
    volume_usage::Unit,
};
use std::{path::PathBuf, sync::Arc};
use tonic::{Request, Response, Status};
use tracing::Instrument;

/// The node service over a [`Node`].
#[derive(Debug, Clone)]
pub struct NodeService {
    driver: Driver,
    node: Arc<Node>,
}

impl NodeService {
    /// Serves `node` as identity `driver`.
    pub fn new(driver: Driver, node: Arc<Node>) -> Self {
        Self { driver, node }
    }

    /// The capability's access, as this identity reads it: a filesystem
    /// volume is always its NFS mount, whatever fsType says.
    fn access_of(&self, capability: Option<&pb::VolumeCapability>) -> Result<Access, Status> {
        let access = access_of(capability)?;
        match (self.driver, access) {
            (Driver::Files, Access::Block) => Err(Status::invalid_argument(
                "block access is not supported: a filesystem volume is mounted over NFS, never a raw block device",
            )),
            (Driver::Files, Access::Mount { flags, .. }) => Ok(Access::Mount {
                fs_type: "nfs".into(),
                flags,
            }),
            (Driver::Block, access) => Ok(access),
        }
    }

    /// Runs `work` on a blocking thread in a span named `rpc` with the
    /// volume ID, logging the outcome.
    async fn run<T: Send + 'static>(
        &self,
        rpc: &'static str,
        volume_id: &str,
        work: impl FnOnce(&Node) -> Result<T> + Send + 'static,
    ) -> Result<T, Status> {
        let span = tracing::info_span!("csi", rpc, volume_id = %volume_id);
        let node = self.node.clone();
        async move {
            let started = std::time::Instant::now();
            let result = tokio::task::spawn_blocking(move || work(&node))
                .await
                .map_err(|e| Status::internal(format!("{rpc}: the worker failed: {e}")))?;
            match &result {
                Ok(_) => tracing::info!(took = ?started.elapsed(), "ok"),
                Err(e) => tracing::warn!(took = ?started.elapsed(), code = ?e.kind, "{e}"),
            }
            result.map_err(Error::into_status)
        }
        .instrument(span)
        .await
    }
}

fn required<'a>(field: &str, value: &'a str) -> Result<&'a str, Status> {
    if value.is_empty() {
        return Err(Status::invalid_argument(format!("{field} is missing")));
    }
    Ok(value)
}

fn access_of(capability: Option<&pb::VolumeCapability>) -> Result<Access, Status> {
    let capability =
        capability.ok_or_else(|| Status::invalid_argument("volume_capability is missing"))?;
    match &capability.access_type {
        Some(AccessType::Block(_)) => Ok(Access::Block),
        Some(AccessType::Mount(m)) if nfs_fs_type(&m.fs_type) => Ok(Access::Mount {
            fs_type: m.fs_type.clone(),
            flags: m.mount_flags.clone(),
        }),
        Some(AccessType::Mount(m)) => Ok(Access::Mount {
            fs_type: requested_fs_type(&m.fs_type)
                .map_err(Error::into_status)?
                .to_owned(),
            flags: m.mount_flags.clone(),
        }),
        None => Err(Status::invalid_argument(
            "volume_capability has neither block nor mount access",
        )),
    }
}

/// An fsType only the files identity takes.
fn nfs_fs_type(fs_type: &str) -> bool {
    matches!(fs_type, "nfs" | "nfs4")
}

fn rpc_capability(t: node_service_capability::rpc::Type) -> pb::NodeServiceCapability {
    pb::NodeServiceCapability {
        r#type: Some(node_service_capability::Type::Rpc(
            node_service_capability::Rpc { r#type: t as i32 },
        )),
    }
}

#[tonic::async_trait]
impl node_server::Node for NodeService {
    async fn node_stage_volume(
        &self,
        request: Request<pb::NodeStageVolumeRequest>,
    ) -> Result<Response<pb::NodeStageVolumeResponse>, Status> {
        let r = request.into_inner();
        let volume_id = required("volume_id", &r.volume_id)?.to_owned();
        let staging = required("staging_target_path", &r.staging_target_path)?;
        let access = self.access_of(r.volume_capability.as_ref())?;
        let req = StageRequest {
            volume_id: volume_id.clone(),
            staging_path: PathBuf::from(staging),
            context: PublishContext {
                chap: Chap::from_secrets(&r.secrets)
                    .map_err(|e| Status::invalid_argument(e.to_string()))?,
                ..PublishContext::from_map(&r.publish_context)
                    .map_err(|e| Status::invalid_argument(e.to_string()))?
            },
            access,
            existing_data: volume_context::existing_data(&r.volume_context),
        };
        let serving = Driver::of_protocol(req.context.protocol);
        if serving != self.driver {
            return Err(Status::invalid_argument(format!(
                "volume {volume_id}: its publish context's protocol {} is served by {}, not by {}",
                req.context.protocol,
                serving.name(),
                self.driver.name()
            )));
        }
        self.run("NodeStageVolume", &volume_id, move |n| n.stage(&req))
            .await?;
        Ok(Response::new(pb::NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        request: Request<pb::NodeUnstageVolumeRequest>,
    ) -> Result<Response<pb::NodeUnstageVolumeResponse>, Status> {
        let r = request.into_inner();
        let volume_id = required("volume_id", &r.volume_id)?.to_owned();
        let staging = PathBuf::from(required("staging_target_path", &r.staging_target_path)?);
        let id = volume_id.clone();
        self.run("NodeUnstageVolume", &volume_id, move |n| {
            n.unstage(&id, &staging)
        })
        .await?;
        Ok(Response::new(pb::NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        request: Request<pb::NodePublishVolumeRequest>,
    ) -> Result<Response<pb::NodePublishVolumeResponse>, Status> {
        let r = request.into_inner();
        let volume_id = required("volume_id", &r.volume_id)?.to_owned();
        let staging = PathBuf::from(required("staging_target_path", &r.staging_target_path)?);
        let target = PathBuf::from(required("target_path", &r.target_path)?);
        let block = self.access_of(r.volume_capability.as_ref())? == Access::Block;
        let (id, read_only) = (volume_id.clone(), r.readonly);
        self.run("NodePublishVolume", &volume_id, move |n| {
            n.publish(&PublishRequest {
                volume_id: &id,
                staging_path: &staging,
                target_path: &target,
                block,
                read_only,
            })
        })
        .await?;
        Ok(Response::new(pb::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<pb::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<pb::NodeUnpublishVolumeResponse>, Status> {
        let r = request.into_inner();
        let volume_id = required("volume_id", &r.volume_id)?.to_owned();
        let target = PathBuf::from(required("target_path", &r.target_path)?);
        let id = volume_id.clone();
        self.run("NodeUnpublishVolume", &volume_id, move |n| {
            n.unpublish(&id, &target)
        })
        .await?;
        Ok(Response::new(pb::NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<pb::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<pb::NodeGetVolumeStatsResponse>, Status> {
        let r = request.into_inner();
        let volume_id = required("volume_id", &r.volume_id)?.to_owned();
        let path = PathBuf::from(required("volume_path", &r.volume_path)?);
        let id = volume_id.clone();
        let stats = self
            .run("NodeGetVolumeStats", &volume_id, move |n| {
                n.stats(&id, &path)
            })
            .await?;
        let usage = |(total, available, used): (u64, u64, u64), unit: Unit| pb::VolumeUsage {
            total: total as i64,
            available: available as i64,
            used: used as i64,
            unit: unit as i32,
        };
        let mut reply = pb::NodeGetVolumeStatsResponse {
            usage: Vec::new(),
            volume_condition: Some(pb::VolumeCondition {
                abnormal: stats.abnormal.is_some(),
                message: stats.abnormal.unwrap_or_else(|| "healthy".into()),
            }),
        };
        if let Some(u) = stats.usage {
            reply.usage.push(usage(u.bytes, Unit::Bytes));
            if let Some(inodes) = u.inodes {
                reply.usage.push(usage(inodes, Unit::Inodes));
            }
        }
        Ok(Response::new(reply))
    }

    async fn node_expand_volume(
        &self,
        request: Request<pb::NodeExpandVolumeRequest>,
    ) -> Result<Response<pb::NodeExpandVolumeResponse>, Status> {
        let r = request.into_inner();
        let volume_id = required("volume_id", &r.volume_id)?.to_owned();
        required("volume_path", &r.volume_path)?;
        let required_bytes = r
            .capacity_range
            .map(|c| c.required_bytes.max(0) as u64)
            .unwrap_or(0);
        let id = volume_id.clone();
        let size = self
            .run("NodeExpandVolume", &volume_id, move |n| {
                n.expand(&id, required_bytes)
            })
            .await?;
        Ok(Response::new(pb::NodeExpandVolumeResponse {
            capacity_bytes: size as i64,
        }))
    }

    async fn node_get_capabilities(
        &self,
        _request: Request<pb::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<pb::NodeGetCapabilitiesResponse>, Status> {
        use node_service_capability::rpc::Type;
        // A filesystem volume grows on the storage node alone.
        let types: &[Type] = match self.driver {
            Driver::Block => &[
                Type::StageUnstageVolume,
                Type::ExpandVolume,
                Type::GetVolumeStats,
                Type::VolumeCondition,
            ],
            Driver::Files => &[
                Type::StageUnstageVolume,
                Type::GetVolumeStats,
                Type::VolumeCondition,
            ],
        };
        Ok(Response::new(pb::NodeGetCapabilitiesResponse {
            capabilities: types.iter().copied().map(rpc_capability).collect(),
        }))
    }

    async fn node_get_info(
        &self,
        _request: Request<pb::NodeGetInfoRequest>,
    ) -> Result<Response<pb::NodeGetInfoResponse>, Status> {
        // The files identity's node-local volumes are reachable on their
        // own node only: the node's name is its topology.
        let (node_id, accessible_topology) = match self.driver {
            Driver::Block => (self.node.node_id().to_string(), None),
            Driver::Files => {
                let id = self.node.files_node_id().ok_or_else(|| {
                    Status::failed_precondition(
                        "this node plugin has no NFS client address: start it with --node-address",
                    )
                })?;
                let topology = pb::Topology {
                    segments: [(api::TOPOLOGY_NODE_KEY.to_owned(), id.name().to_owned())].into(),
                };
                (id.to_string(), Some(topology))
            }
        };
        Ok(Response::new(pb::NodeGetInfoResponse {
            node_id,
            max_volumes_per_node: 0,
            accessible_topology,
        }))
    }
}
