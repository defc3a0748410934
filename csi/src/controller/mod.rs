//! The CSI Controller service: volumes are recorded as PillarVolumeState
//! objects in the Kubernetes API and made by storage-node agents over gRPC
//! with mTLS.
//!
//! - [`volumes`]: CreateVolume, DeleteVolume, ControllerExpandVolume,
//!   ValidateVolumeCapabilities;
//! - [`publish`]: ControllerPublishVolume / ControllerUnpublishVolume;
//! - [`listing`]: ListVolumes, GetCapacity;
//! - [`capabilities`]: what the controller offers and accepts;
//! - [`resolve`]: PillarStorageClass → PillarStore → PillarAgent, PillarProtocol;
//! - [`state`]: the PillarVolumeState store and the fence token;
//! - [`agents`]: channels to agents; [`error`]: the one mapping to gRPC codes;
//! - [`events`]: events on claims and records, where users read refusals;
//! - [`claim`]: the claim of a CreateVolume and what its annotations ask;
//! - [`import`]: the `import-zvol` / `import-lv` annotations and their
//!   refusals; [`reservations`]: the PillarVolumeReservation each import
//!   takes; [`settings`]: the `filesystem` and `backend` annotations;
//! - [`recovery`]: metadata-loss recovery (RecoveryPending records, the
//!   grant's checks, TransferVolumeOwnership);
//! - [`snapshots`]: CreateSnapshot, DeleteSnapshot, ListSnapshots (the
//!   PillarSnapshot records) and CreateVolume's content sources.

pub mod agents;
pub mod capabilities;
pub mod claim;
pub mod error;
pub mod events;
pub mod import;
pub mod listing;
pub mod naming;
pub mod publish;
pub mod recovery;
pub mod reservations;
pub mod resolve;
pub mod settings;
pub mod snapshots;
pub mod state;
pub mod timed;
pub mod topology;
pub mod volumes;

use crate::driver::Driver;
use agents::Agents;
use api::crd::{PillarAgent, PillarVolumeState, VolumePhase};
use api::tokens::{Backend, Protocol};
use error::{Error, Result};
use kube::api::Api;
use pillar_csi_proto::agent::v1 as agent;
use pillar_csi_proto::csi::v1 as csi;
use state::States;
use tonic::{Request, Response, Status};

/// The Controller service.
pub struct Controller {
    driver: Driver,
    client: kube::Client,
    states: States,
    reservations: reservations::Reservations,
    agents: Agents,
    events: events::Events,
}

/// The agent's enum for a backend token.
pub fn backend_type(backend: Backend) -> i32 {
    match backend {
        Backend::ZfsZvol => agent::BackendType::ZfsZvol as i32,
        Backend::LvmLv => agent::BackendType::Lvm as i32,
        Backend::ZfsDataset => agent::BackendType::ZfsDataset as i32,
        Backend::Directory => agent::BackendType::Directory as i32,
    }
}

/// The agent's enum for a protocol token.
pub fn protocol_type(protocol: Protocol) -> i32 {
    match protocol {
        Protocol::NvmeofTcp => agent::ProtocolType::NvmeofTcp as i32,
        Protocol::Iscsi => agent::ProtocolType::Iscsi as i32,
        Protocol::Nfs => agent::ProtocolType::Nfs as i32,
        Protocol::Local => agent::ProtocolType::Local as i32,
    }
}

impl Controller {
    /// The block identity's controller, using `client` for the API and
    /// `agents` for storage nodes.
    pub fn new(client: kube::Client, agents: Agents) -> Self {
        Self::serving(Driver::Block, client, agents)
    }

    /// The controller of identity `driver`: it makes, publishes and deletes
    /// only that identity's volumes.
    pub fn serving(driver: Driver, client: kube::Client, agents: Agents) -> Self {
        Controller {
            driver,
            states: States::new(client.clone()),
            reservations: reservations::Reservations::new(client.clone()),
            events: events::Events::new(client.clone()),
            client,
            agents,
        }
    }

    /// The PillarAgent named `name`.
    async fn agent_named(&self, name: &str) -> Result<PillarAgent> {
        Api::<PillarAgent>::all(self.client.clone())
            .get_opt(name)
            .await
            .map_err(Error::kube(format!("read PillarAgent {name:?}")))?
            .ok_or_else(|| Error::Unavailable(format!("PillarAgent {name:?} does not exist")))
    }

    /// The PillarAgent holding a volume.
    async fn agent_of(&self, state: &PillarVolumeState) -> Result<PillarAgent> {
        self.agent_named(&state.spec.agent_ref).await
    }

    /// The record of a volume that exists, is Ready and is not being deleted;
    /// `action` names the refused operation.
    async fn ready_state(&self, volume_id: &str, action: &str) -> Result<PillarVolumeState> {
        let state = self
            .states
            .by_handle(volume_id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("volume {volume_id} does not exist")))?;
        if recovery::is_pending(&state) {
            return Err(Error::FailedPrecondition(format!(
                "cannot {action} volume {volume_id}: it is RecoveryPending (a metadata-loss recovery has not committed), not Ready"
            )));
        }
        let status = state.status.clone().unwrap_or_default();
        if status.deleting == Some(true) {
            return Err(Error::FailedPrecondition(format!(
                "cannot {action} volume {volume_id}: it is being deleted"
            )));
        }
        let mine = self.driver.check(
            &format!("volume {volume_id}"),
            state.spec.backend_type,
            state.spec.protocol_type,
        );
        if let Err(why) = mine {
            return Err(Error::InvalidArgument(format!("cannot {action}: {why}")));
        }
        if let Some(refusal) = import::never_adopted(volume_id, &state, action) {
            return Err(refusal);
        }
        if status.phase != Some(VolumePhase::Ready) {
            let phase = status
                .phase
                .map(|p| format!("{p:?}"))
                .unwrap_or_else(|| "Pending".into());
            return Err(Error::FailedPrecondition(format!(
                "cannot {action} volume {volume_id}: it is {phase}, not Ready"
            )));
        }
        Ok(state)
    }
}

impl Controller {
    /// Posts a CreateVolume refusal, text for text (an agent's refusal as
    /// the agent wrote it, see [`Error::for_claim`]), as a Warning event on
    /// the claim named by the provisioner's `csi.storage.k8s.io/pvc/*`
    /// parameters (when they are there and that claim, of the UID in the
    /// volume's name, still exists: never on a claim re-created under the
    /// name).
    async fn tell_claim(&self, request: &csi::CreateVolumeRequest, refusal: &Error) {
        if let Ok(Some(claim)) = self.claim(request).await {
            self.events
                .post(
                    &claim,
                    events::Kind::Warning,
                    "ProvisioningFailed",
                    &refusal.for_claim(),
                )
                .await;
        }
    }
}

fn unimplemented<T>(what: &str) -> Result<Response<T>, Status> {
    Err(Status::unimplemented(format!("{what} is not supported")))
}

#[tonic::async_trait]
impl csi::controller_server::Controller for Controller {
    async fn create_volume(
        &self,
        request: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        let request = request.into_inner();
        match self.provision(request.clone()).await {
            Ok(volume) => Ok(Response::new(csi::CreateVolumeResponse {
                volume: Some(volume),
            })),
            Err(refusal) => {
                self.tell_claim(&request, &refusal).await;
                Err(refusal.into())
            }
        }
    }

    async fn delete_volume(
        &self,
        request: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        self.remove(&request.into_inner().volume_id).await?;
        Ok(Response::new(csi::DeleteVolumeResponse {}))
    }

    async fn controller_publish_volume(
        &self,
        request: Request<csi::ControllerPublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerPublishVolumeResponse>, Status> {
        let publish_context = self.publish(request.into_inner()).await?;
        Ok(Response::new(csi::ControllerPublishVolumeResponse {
            publish_context,
        }))
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerUnpublishVolumeResponse>, Status> {
        self.unpublish(request.into_inner()).await?;
        Ok(Response::new(csi::ControllerUnpublishVolumeResponse {}))
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<csi::ValidateVolumeCapabilitiesResponse>, Status> {
        Ok(Response::new(self.validate(request.into_inner()).await?))
    }

    async fn list_volumes(
        &self,
        request: Request<csi::ListVolumesRequest>,
    ) -> Result<Response<csi::ListVolumesResponse>, Status> {
        Ok(Response::new(self.list(request.into_inner()).await?))
    }

    async fn get_capacity(
        &self,
        request: Request<csi::GetCapacityRequest>,
    ) -> Result<Response<csi::GetCapacityResponse>, Status> {
        let available = self.capacity(request.into_inner()).await?;
        Ok(Response::new(csi::GetCapacityResponse {
            available_capacity: i64::try_from(available).unwrap_or(i64::MAX),
            ..Default::default()
        }))
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        Ok(Response::new(csi::ControllerGetCapabilitiesResponse {
            capabilities: capabilities::controller_capabilities(self.driver),
        }))
    }

    async fn create_snapshot(
        &self,
        request: Request<csi::CreateSnapshotRequest>,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        let snapshot = self.snapshot(request.into_inner()).await?;
        Ok(Response::new(csi::CreateSnapshotResponse {
            snapshot: Some(snapshot),
        }))
    }

    async fn delete_snapshot(
        &self,
        request: Request<csi::DeleteSnapshotRequest>,
    ) -> Result<Response<csi::DeleteSnapshotResponse>, Status> {
        self.remove_snapshot(&request.into_inner().snapshot_id)
            .await?;
        Ok(Response::new(csi::DeleteSnapshotResponse {}))
    }

    async fn list_snapshots(
        &self,
        request: Request<csi::ListSnapshotsRequest>,
    ) -> Result<Response<csi::ListSnapshotsResponse>, Status> {
        Ok(Response::new(
            self.list_snapshots_page(request.into_inner()).await?,
        ))
    }

    async fn get_snapshot(
        &self,
        _: Request<csi::GetSnapshotRequest>,
    ) -> Result<Response<csi::GetSnapshotResponse>, Status> {
        unimplemented("GetSnapshot")
    }

    async fn controller_expand_volume(
        &self,
        request: Request<csi::ControllerExpandVolumeRequest>,
    ) -> Result<Response<csi::ControllerExpandVolumeResponse>, Status> {
        let (capacity, node_expansion_required) = self.expand(request.into_inner()).await?;
        Ok(Response::new(csi::ControllerExpandVolumeResponse {
            capacity_bytes: capacity as i64,
            node_expansion_required,
        }))
    }

    async fn controller_get_volume(
        &self,
        _: Request<csi::ControllerGetVolumeRequest>,
    ) -> Result<Response<csi::ControllerGetVolumeResponse>, Status> {
        unimplemented("ControllerGetVolume")
    }

    async fn controller_modify_volume(
        &self,
        _: Request<csi::ControllerModifyVolumeRequest>,
    ) -> Result<Response<csi::ControllerModifyVolumeResponse>, Status> {
        unimplemented("ControllerModifyVolume")
    }
}
