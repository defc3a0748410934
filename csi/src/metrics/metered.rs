//! The Controller service with every RPC counted and timed by method and
//! gRPC code ([`super::Metrics`]); the endpoint serves this wrapper.
use super::Metrics;
use crate::controller::Controller;
use pillar_csi_proto::csi::v1 as csi;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;
use tonic::{Request, Response, Status};

/// A [`Controller`] whose RPCs are recorded in [`Metrics`].
pub struct Metered {
    inner: Controller,
    metrics: Arc<Metrics>,
}

impl Metered {
    /// Wraps `inner`, recording into `metrics`.
    pub fn new(inner: Controller, metrics: Arc<Metrics>) -> Self {
        Metered { inner, metrics }
    }

    async fn timed<T>(
        &self,
        method: &str,
        call: impl Future<Output = Result<Response<T>, Status>>,
    ) -> Result<Response<T>, Status> {
        let start = Instant::now();
        let out = call.await;
        let code = match &out {
            Ok(_) => tonic::Code::Ok,
            Err(status) => status.code(),
        };
        self.metrics.observe_rpc(method, code, start.elapsed());
        out
    }
}

#[tonic::async_trait]
impl csi::controller_server::Controller for Metered {
    async fn create_volume(
        &self,
        request: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        self.timed("CreateVolume", self.inner.create_volume(request))
            .await
    }

    async fn delete_volume(
        &self,
        request: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        self.timed("DeleteVolume", self.inner.delete_volume(request))
            .await
    }

    async fn controller_publish_volume(
        &self,
        request: Request<csi::ControllerPublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerPublishVolumeResponse>, Status> {
        self.timed(
            "ControllerPublishVolume",
            self.inner.controller_publish_volume(request),
        )
        .await
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerUnpublishVolumeResponse>, Status> {
        self.timed(
            "ControllerUnpublishVolume",
            self.inner.controller_unpublish_volume(request),
        )
        .await
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<csi::ValidateVolumeCapabilitiesResponse>, Status> {
        self.timed(
            "ValidateVolumeCapabilities",
            self.inner.validate_volume_capabilities(request),
        )
        .await
    }

    async fn list_volumes(
        &self,
        request: Request<csi::ListVolumesRequest>,
    ) -> Result<Response<csi::ListVolumesResponse>, Status> {
        self.timed("ListVolumes", self.inner.list_volumes(request))
            .await
    }

    async fn get_capacity(
        &self,
        request: Request<csi::GetCapacityRequest>,
    ) -> Result<Response<csi::GetCapacityResponse>, Status> {
        self.timed("GetCapacity", self.inner.get_capacity(request))
            .await
    }

    async fn controller_get_capabilities(
        &self,
        request: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        self.timed(
            "ControllerGetCapabilities",
            self.inner.controller_get_capabilities(request),
        )
        .await
    }

    async fn create_snapshot(
        &self,
        request: Request<csi::CreateSnapshotRequest>,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        self.timed("CreateSnapshot", self.inner.create_snapshot(request))
            .await
    }

    async fn delete_snapshot(
        &self,
        request: Request<csi::DeleteSnapshotRequest>,
    ) -> Result<Response<csi::DeleteSnapshotResponse>, Status> {
        self.timed("DeleteSnapshot", self.inner.delete_snapshot(request))
            .await
    }

    async fn list_snapshots(
        &self,
        request: Request<csi::ListSnapshotsRequest>,
    ) -> Result<Response<csi::ListSnapshotsResponse>, Status> {
        self.timed("ListSnapshots", self.inner.list_snapshots(request))
            .await
    }

    async fn get_snapshot(
        &self,
        request: Request<csi::GetSnapshotRequest>,
    ) -> Result<Response<csi::GetSnapshotResponse>, Status> {
        self.timed("GetSnapshot", self.inner.get_snapshot(request))
            .await
    }

    async fn controller_expand_volume(
        &self,
        request: Request<csi::ControllerExpandVolumeRequest>,
    ) -> Result<Response<csi::ControllerExpandVolumeResponse>, Status> {
        self.timed(
            "ControllerExpandVolume",
            self.inner.controller_expand_volume(request),
        )
        .await
    }

    async fn controller_get_volume(
        &self,
        request: Request<csi::ControllerGetVolumeRequest>,
    ) -> Result<Response<csi::ControllerGetVolumeResponse>, Status> {
        self.timed(
            "ControllerGetVolume",
            self.inner.controller_get_volume(request),
        )
        .await
    }

    async fn controller_modify_volume(
        &self,
        request: Request<csi::ControllerModifyVolumeRequest>,
    ) -> Result<Response<csi::ControllerModifyVolumeResponse>, Status> {
        self.timed(
            "ControllerModifyVolume",
            self.inner.controller_modify_volume(request),
        )
        .await
    }
}
