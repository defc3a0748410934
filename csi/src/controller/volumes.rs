//! CreateVolume, DeleteVolume, ControllerExpandVolume and
//! ValidateVolumeCapabilities.
//!
//! CreateVolume writes the PillarVolumeState first; its UID (and the
//! publication generation, 0 for a new record) is the fence token of the
//! agent call, so a controller that restarts mid-way converges on the same
//! agent lifecycle. A record is removed only after the agent answered.
use super::capabilities::check_all;
use super::error::{Error, Result};
use super::import;
use super::naming;
use super::resolve::{self, acl_of, protocol_of, volume_in};
use super::state::{fence, generation};
use super::topology;
use super::{backend_type, Controller};
use crate::volume_context;
use api::crd::{
    ExportSpec, PillarVolumeState, PillarVolumeStateSpec, PillarVolumeStateStatus, Resolved,
    VolumePhase,
};
use api::handle::VolumeHandle;
use kube::ResourceExt;
use pillar_csi_proto::agent::v1 as agent;
use pillar_csi_proto::csi::v1 as csi;

/// The size of a volume whose request names none: 1 GiB.
pub const DEFAULT_BYTES: u64 = 1 << 30;
pub use super::claim::{PVC_NAME, PVC_NAMESPACE};

fn requested_bytes(range: Option<&csi::CapacityRange>) -> Result<u64> {
    let (required, limit) = range.map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
    if required < 0 || limit < 0 {
        return Err(Error::InvalidArgument(
            "capacity_range bytes must not be negative".into(),
        ));
    }
    if limit > 0 && required > limit {
        return Err(Error::InvalidArgument(format!(
            "capacity_range: required_bytes {required} exceeds limit_bytes {limit}"
        )));
    }
    Ok(match (required, limit) {
        (0, 0) => DEFAULT_BYTES,
        (0, l) => (l as u64).min(DEFAULT_BYTES),
        (r, _) => r as u64,
    })
}

impl Controller {
    /// CreateVolume.
    pub async fn provision(&self, req: csi::CreateVolumeRequest) -> Result<csi::Volume> {
        if req.name.is_empty() {
            return Err(Error::InvalidArgument("the volume name is missing".into()));
        }
        check_all(self.driver, &req.volume_capabilities).map_err(Error::InvalidArgument)?;
        let record_name = naming::record_name(&req.name);
        let found = self.states.get(&record_name).await?;
        if let Some(state) = found
            .as_ref()
            .filter(|s| !naming::is_record_of(*s, &req.name))
        {
            return Err(Error::AlreadyExists(format!(
                "volume {:?}: its record {record_name:?} belongs to volume {:?}",
                req.name,
                state
                    .annotations()
                    .get(naming::CSI_NAME)
                    .unwrap_or(&record_name)
            )));
        }
        if let Some(state) = found {
            if state.spec.recovery.is_some() {
                return self.recover(&req, state).await;
            }
        }
        let source = match &req.volume_content_source {
            Some(source) => Some(self.content_source(source).await?),
            None => None,
        };
        let bytes = match (&source, &req.capacity_range) {
            (Some(source), None) => source.bytes,
            _ => requested_bytes(req.capacity_range.as_ref())?,
        };
        let class = resolve::class_name(&req.parameters)?;
        let place = resolve::placement(&self.client, class).await?;
        let store_name = place.store.name_any();
        let protocol = protocol_of(&place.protocol.name_any(), &place.protocol.spec.protocol)?;
        self.driver
            .check(
                &format!("PillarStorageClass {class:?}"),
                resolve::backend_of(&store_name, &place.store.spec.backend)?,
                protocol,
            )
            .map_err(Error::InvalidArgument)?;
        let local = topology::local_node(
            class,
            &place.agent,
            resolve::backend_of(&store_name, &place.store.spec.backend)?,
            protocol,
        )?;
        if let Some(node) = &local {
            topology::check_requisite(
                &req.name,
                node,
                &place.agent.name_any(),
                req.accessibility_requirements.as_ref(),
            )?;
        }
        let existing = self.states.get(&record_name).await?;
        let (wants, claim_ref) = self.wants_of(&req, &place, existing.as_ref()).await?;
        // Checked before anything is recorded: a refusal records nothing.
        let import_key = match &wants.import {
            Some(import) => import::key_from_secrets(&req.secrets, import)?,
            None => Vec::new(),
        };
        if place.class.spec.encrypted {
            if place.store.spec.backend.zfs.is_none() {
                let backend = match resolve::backend_of(&store_name, &place.store.spec.backend)? {
                    api::tokens::Backend::LvmLv => "an LVM backend",
                    api::tokens::Backend::Directory => "a directory backend",
                    _ => "a zfsDataset backend",
                };
                return Err(Error::InvalidArgument(format!(
                    "PillarStorageClass {:?} is encrypted and its PillarStore {store_name:?} has {backend}: encryption is ZFS native encryption of zvols",
                    place.class.name_any(),
                )));
            }
            if wants.import.is_some() {
                return Err(Error::InvalidArgument(format!(
                    "volume {:?}: PillarStorageClass {:?} is encrypted, and an imported zvol keeps the encryption it has; import it with a class that is not encrypted",
                    req.name,
                    place.class.name_any()
                )));
            }
        }
        if let Some(source) = &source {
            if wants.import.is_some() {
                return Err(Error::InvalidArgument(format!(
                    "volume {:?}: a claim cannot both import a volume and be made from a snapshot or volume",
                    req.name
                )));
            }
            if source.agent != place.agent.name_any() {
                return Err(Error::InvalidArgument(format!(
                    "volume {:?}: its source is on agent {}, the class places volumes on agent {}; a volume is made from a snapshot or volume of its own store",
                    req.name,
                    source.agent,
                    place.agent.name_any()
                )));
            }
            if bytes < source.bytes {
                return Err(Error::OutOfRange(format!(
                    "volume {:?}: {bytes} bytes requested, less than the {} bytes of its source",
                    req.name, source.bytes
                )));
            }
        }
        let id = match &wants.import {
            Some(import) => import.agent_volume_id.clone(),
            None => volume_in(
                &store_name,
                &place.store.spec.backend,
                &naming::agent_name(&record_name),
            )?,
        };
        let handle = VolumeHandle::new(&place.agent.name_any(), protocol, id.clone())
            .map_err(|e| Error::InvalidArgument(e.to_string()))?;

        if let Some(existing) = &existing {
            import::check_record(&req.name, existing, wants.import.as_ref())?;
        }
        if let Some(import) = &wants.import {
            self.reserve(
                import,
                &place.agent.name_any(),
                &record_name,
                claim_ref.as_ref(),
            )
            .await?;
        }
        let state = match existing {
            Some(existing) => existing,
            None => {
                let mut record = PillarVolumeState::new(
                    &record_name,
                    PillarVolumeStateSpec {
                        volume_id: handle.to_string(),
                        agent_volume_id: id.to_string(),
                        agent_ref: place.agent.name_any(),
                        backend_type: id.backend(),
                        protocol_type: protocol,
                        capacity_bytes: bytes,
                        claim_ref,
                        imported_from: wants.import.as_ref().and_then(|i| i.imported_from()),
                        lvm_source: wants.import.as_ref().and_then(|i| i.lvm_source()),
                        resolved: Some(Resolved {
                            storage_class_ref: place.class.name_any(),
                            store_ref: store_name.clone(),
                            protocol_ref: place.protocol.name_any(),
                            backend: place.store.spec.backend.clone(),
                            protocol: place.protocol.spec.protocol.clone(),
                            filesystem: wants
                                .filesystem
                                .clone()
                                .or_else(|| place.class.spec.filesystem.clone()),
                            encrypted: place.class.spec.encrypted,
                        }),
                        export_spec: Some(ExportSpec {
                            acl_enabled: acl_of(&place.protocol.spec.protocol),
                            allowed_initiators: Vec::new(),
                        }),
                        recovery: None,
                    },
                );
                record.metadata.labels = None;
                if record_name != req.name {
                    record.metadata.annotations = Some(
                        [(naming::CSI_NAME.to_owned(), req.name.clone())]
                            .into_iter()
                            .collect(),
                    );
                }
                self.states.create(&record).await?
            }
        };
        if state.spec.volume_id != handle.to_string() {
            return Err(Error::AlreadyExists(format!(
                "volume {:?} already exists as {} (requested {handle})",
                req.name, state.spec.volume_id
            )));
        }
        let limit = req.capacity_range.as_ref().map_or(0, |r| r.limit_bytes);
        if state.status.as_ref().and_then(|s| s.phase) == Some(VolumePhase::Ready)
            && (state.spec.capacity_bytes < bytes
                || (limit > 0 && state.spec.capacity_bytes > limit as u64))
        {
            return Err(Error::AlreadyExists(format!(
                "volume {:?} already exists with {} bytes, outside the range requested ({bytes} to {})",
                req.name,
                state.spec.capacity_bytes,
                if limit > 0 { limit.to_string() } else { "any".into() }
            )));
        }
        if state.status.as_ref().and_then(|s| s.deleting) == Some(true) {
            return Err(Error::Aborted(format!(
                "volume {:?} is being deleted",
                req.name
            )));
        }

        let mut request = agent::CreateVolumeRequest {
            volume_id: id.to_string(),
            backend_type: backend_type(id.backend()),
            capacity_bytes: bytes,
            fence: Some(fence(&state, generation(&state))),
            // As recorded: a record made before a change of the class
            // keeps what it was made with.
            encrypted: state.spec.resolved.as_ref().is_some_and(|r| r.encrypted),
            ..Default::default()
        };
        wants.backend.apply(&place.store.spec.backend, &mut request);
        if let Some(import) = &wants.import {
            import.apply(&mut request);
            request.import_zvol_key = import_key;
        }
        if let Some(source) = &source {
            source.apply(&mut request);
        }
        let mut client = self.agents.client(&place.agent)?;
        let created = client
            .client
            .create_volume(request)
            .await
            .map_err(client.fail())?
            .into_inner();
        // An import never resizes: one larger than the request allows is
        // released at once (nothing destroyed) and the record, never
        // Ready, is left to the reaper, as for a claim that went.
        if wants.import.is_some() && limit > 0 && created.capacity_bytes > limit as u64 {
            client.end_lifecycle(&state, true).await?;
            return Err(Error::OutOfRange(format!(
                "volume {:?}: the imported volume {id} is {} bytes, more than limit_bytes {limit}; it is released, not resized",
                req.name, created.capacity_bytes
            )));
        }
        // The claim may have gone while the agent worked: a volume never
        // turns Ready for a claim that can no longer bind to it (the record
        // stays as it was, for the reaper).
        self.claim_of_record(&req).await?;

        let state = if state.spec.capacity_bytes != created.capacity_bytes {
            self.states
                .patch_spec(
                    &state,
                    serde_json::json!({"capacityBytes": created.capacity_bytes}),
                )
                .await?
        } else {
            state
        };
        if state.status.as_ref().and_then(|s| s.phase) != Some(VolumePhase::Ready) {
            let status = PillarVolumeStateStatus {
                phase: Some(VolumePhase::Ready),
                ..state.status.clone().unwrap_or_default()
            };
            self.states.set_status(&state, status).await?;
        }
        let fs_type = state
            .spec
            .resolved
            .as_ref()
            .and_then(|r| r.filesystem.as_ref())
            .map(|fs| fs.fs_type);
        let origin = volume_context::Origin::of(&state.spec).or(source.map(|s| s.origin));
        let context = volume_context::build(fs_type, origin);
        Ok(csi::Volume {
            capacity_bytes: created.capacity_bytes as i64,
            volume_id: handle.to_string(),
            volume_context: context,
            content_source: req.volume_content_source.clone(),
            accessible_topology: topology::accessible(local),
        })
    }

    /// DeleteVolume: the agent deletes the volume, or releases it (checks
    /// it and forgets the claim, nothing is destroyed: a PreserveOriginal
    /// LV, adopted or recovered, an import that never completed, or one
    /// whose claim was never seen bound, see [`import::released_on_delete`]),
    /// then the import's reservation and the record go. While the agent
    /// cannot be reached the records stay, for the retry.
    pub async fn remove(&self, volume_id: &str) -> Result<()> {
        if volume_id.is_empty() {
            return Err(Error::InvalidArgument("the volume ID is missing".into()));
        }
        let Some(state) = self.states.by_handle(volume_id).await? else {
            return Ok(());
        };
        let status = state.status.clone().unwrap_or_default();
        if super::recovery::is_pending(&state) || status.phase == Some(VolumePhase::RecoveryPending)
        {
            return Err(Error::FailedPrecondition(format!(
                "volume {volume_id} is RecoveryPending: it cannot be deleted"
            )));
        }
        if let Some(node) = status.published_nodes.first() {
            return Err(Error::FailedPrecondition(format!(
                "volume {volume_id} is still published to node {}",
                node.node_id
            )));
        }
        // An import that never completed keeps its phase while it is
        // deleted, so that a retry still knows nothing was adopted.
        let incomplete = import::completed(&state) == Some(false);
        let state = if status.deleting != Some(true) {
            let phase = if incomplete {
                status.phase
            } else {
                Some(VolumePhase::Deleting)
            };
            self.states
                .set_status(
                    &state,
                    PillarVolumeStateStatus {
                        deleting: Some(true),
                        phase,
                        ..status
                    },
                )
                .await?
        } else {
            state
        };
        let agent = self.agent_of(&state).await?;
        let mut client = self.agents.client(&agent)?;
        client
            .end_lifecycle(&state, import::released_on_delete(&state))
            .await?;
        self.reservations.release_for(&state).await?;
        self.states.delete(&state).await
    }

    /// ControllerExpandVolume: returns the new capacity.
    pub async fn expand(&self, req: csi::ControllerExpandVolumeRequest) -> Result<(u64, bool)> {
        if req.volume_id.is_empty() {
            return Err(Error::InvalidArgument("the volume ID is missing".into()));
        }
        // CSI: capacity_range is required here, with at least one bound;
        // the default size of CreateVolume is no size to grow to.
        let range = req
            .capacity_range
            .as_ref()
            .filter(|r| r.required_bytes != 0 || r.limit_bytes != 0)
            .ok_or_else(|| {
                Error::InvalidArgument(
                    "capacity_range is required for ControllerExpandVolume, with required_bytes or limit_bytes set".into(),
                )
            })?;
        let bytes = requested_bytes(Some(range))?;
        let state = self.ready_state(&req.volume_id, "expand").await?;
        let agent = self.agent_of(&state).await?;
        let mut client = self.agents.client(&agent)?;
        let grown = client
            .client
            .expand_volume(agent::ExpandVolumeRequest {
                volume_id: state.spec.agent_volume_id.clone(),
                backend_type: backend_type(state.spec.backend_type),
                requested_bytes: bytes,
                fence: Some(fence(&state, generation(&state))),
            })
            .await
            .map_err(client.fail())?
            .into_inner();
        if grown.capacity_bytes != state.spec.capacity_bytes {
            self.states
                .patch_spec(
                    &state,
                    serde_json::json!({"capacityBytes": grown.capacity_bytes}),
                )
                .await?;
        }
        let block = matches!(
            req.volume_capability
                .as_ref()
                .and_then(|c| c.access_type.as_ref()),
            Some(csi::volume_capability::AccessType::Block(_))
        );
        // A filesystem volume's refquota is what its NFS clients see: the
        // node has nothing to grow.
        Ok((
            grown.capacity_bytes,
            !block && !state.spec.backend_type.is_filesystem(),
        ))
    }

    /// ValidateVolumeCapabilities: confirms the capabilities when every one
    /// is supported, otherwise says which is not.
    pub async fn validate(
        &self,
        req: csi::ValidateVolumeCapabilitiesRequest,
    ) -> Result<csi::ValidateVolumeCapabilitiesResponse> {
        if req.volume_id.is_empty() {
            return Err(Error::InvalidArgument("the volume ID is missing".into()));
        }
        if req.volume_capabilities.is_empty() {
            return Err(Error::InvalidArgument(
                "volume capabilities are missing".into(),
            ));
        }
        if self.states.by_handle(&req.volume_id).await?.is_none() {
            return Err(Error::NotFound(format!(
                "volume {} does not exist",
                req.volume_id
            )));
        }
        Ok(match check_all(self.driver, &req.volume_capabilities) {
            Ok(()) => csi::ValidateVolumeCapabilitiesResponse {
                confirmed: Some(csi::validate_volume_capabilities_response::Confirmed {
                    volume_context: req.volume_context,
                    volume_capabilities: req.volume_capabilities,
                    parameters: req.parameters,
                    mutable_parameters: req.mutable_parameters,
                }),
                message: String::new(),
            },
            Err(why) => csi::ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: why,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_ranges_resolve_or_are_refused() {
        assert_eq!(requested_bytes(None).ok(), Some(DEFAULT_BYTES));
        let r = |required, limit| csi::CapacityRange {
            required_bytes: required,
            limit_bytes: limit,
        };
        assert_eq!(requested_bytes(Some(&r(5 << 20, 0))).ok(), Some(5 << 20));
        assert_eq!(requested_bytes(Some(&r(0, 1 << 20))).ok(), Some(1 << 20));
        let e = requested_bytes(Some(&r(2 << 20, 1 << 20))).err();
        assert!(e.is_some_and(|e| e.to_string().contains("exceeds limit_bytes")));
        assert!(requested_bytes(Some(&r(-1, 0))).is_err());
    }
}
