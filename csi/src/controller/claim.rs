//! What a CreateVolume's claim asks for: the PersistentVolumeClaim named by
//! the provisioner's `csi.storage.k8s.io/pvc/name|namespace` parameters,
//! its annotations read once ([`Wants`]), and for an import the checks and
//! the reservation that come before any record or agent call.
use super::error::{Error, Result};
use super::import::{self, Import};
use super::resolve::Placement;
use super::settings::{self, BackendSettings};
use super::Controller;
use api::crd::{ClaimRef, Filesystem, PillarVolumeState};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::Api;
use kube::ResourceExt;
use pillar_csi_proto::csi::v1 as csi;
use std::collections::{BTreeMap, HashMap};

/// The parameters the external-provisioner adds with `--extra-create-metadata`.
pub const PVC_NAME: &str = "csi.storage.k8s.io/pvc/name";
/// See [`PVC_NAME`].
pub const PVC_NAMESPACE: &str = "csi.storage.k8s.io/pvc/namespace";

/// A claim's annotations, checked against the class's store.
#[derive(Clone, Debug, Default)]
pub struct Wants {
    /// The volume to adopt instead of creating one.
    pub import: Option<Import>,
    /// The filesystem the annotation chose (overrides the class's).
    pub filesystem: Option<Filesystem>,
    /// The backend settings of a new volume (not applied to an import).
    pub backend: BackendSettings,
}

/// Reads `annotations` for a volume placed by `place` with `capabilities`.
pub fn wants(
    annotations: &BTreeMap<String, String>,
    place: &Placement,
    capabilities: &[csi::VolumeCapability],
) -> Result<Wants> {
    let store = place.store.name_any();
    let import = import::requested(annotations, &place.store.spec.backend)?;
    let filesystem = match annotations.get(settings::FILESYSTEM_ANNOTATION) {
        None => None,
        Some(value) => {
            let block = capabilities.iter().any(|c| {
                matches!(
                    c.access_type,
                    Some(csi::volume_capability::AccessType::Block(_))
                )
            });
            if block {
                return Err(Error::InvalidArgument(format!(
                    "{}: a raw block volume (volumeMode: Block) has no filesystem; remove the annotation",
                    settings::FILESYSTEM_ANNOTATION
                )));
            }
            Some(settings::parse_filesystem(value)?)
        }
    };
    let backend = match annotations.get(settings::BACKEND_ANNOTATION) {
        None => BackendSettings::default(),
        Some(value) => settings::parse_backend(value, &store, &place.store.spec.backend)?,
    };
    Ok(Wants {
        import,
        filesystem,
        backend,
    })
}

/// The reference a record keeps of its claim.
pub fn reference(claim: &PersistentVolumeClaim) -> ClaimRef {
    ClaimRef {
        uid: claim.metadata.uid.clone().unwrap_or_default(),
        namespace: claim.namespace().unwrap_or_default(),
        name: claim.name_any(),
    }
}

impl Controller {
    /// What the claim of a CreateVolume asks, and its reference. When the
    /// claim is gone but the volume's record exists (the provisioner
    /// retries a CreateVolume after the claim's deletion, to learn whether
    /// a volume exists to delete), the record's import stands for it.
    pub(super) async fn wants_of(
        &self,
        request: &csi::CreateVolumeRequest,
        place: &Placement,
        existing: Option<&PillarVolumeState>,
    ) -> Result<(Wants, Option<ClaimRef>)> {
        match (self.claim(&request.parameters).await, existing) {
            (Ok(claim), _) => {
                let annotations = claim.as_ref().map(|c| c.annotations().clone());
                let wants = wants(
                    &annotations.unwrap_or_default(),
                    place,
                    &request.volume_capabilities,
                )?;
                Ok((wants, claim.as_ref().map(reference)))
            }
            (Err(Error::FailedPrecondition(_)), Some(state)) => Ok((
                Wants {
                    import: import::recorded(state)?,
                    ..Wants::default()
                },
                state.spec.claim_ref.clone(),
            )),
            (Err(e), _) => Err(e),
        }
    }

    /// The claim named by the provisioner's parameters (`None` without
    /// them); a named claim that does not exist is refused.
    pub(super) async fn claim(
        &self,
        parameters: &HashMap<String, String>,
    ) -> Result<Option<PersistentVolumeClaim>> {
        let (Some(name), Some(namespace)) =
            (parameters.get(PVC_NAME), parameters.get(PVC_NAMESPACE))
        else {
            return Ok(None);
        };
        Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(Error::kube(format!(
                "read PersistentVolumeClaim {namespace}/{name}"
            )))?
            .map(Some)
            .ok_or_else(|| {
                Error::FailedPrecondition(format!(
                    "PersistentVolumeClaim {namespace}/{name} does not exist"
                ))
            })
    }

    /// Before an import's record or agent call: refuses when another
    /// volume already holds the volume to import (its record) or its
    /// reservation, then takes the reservation for the volume `name` of
    /// `claim`. Held already by `name` is fine (a retry).
    pub(super) async fn reserve(
        &self,
        import: &Import,
        agent: &str,
        name: &str,
        claim: Option<&ClaimRef>,
    ) -> Result<()> {
        let id = import.agent_volume_id.to_string();
        let other: Option<PillarVolumeState> = self.states.list().await?.into_iter().find(|s| {
            s.name_any() != name
                && s.spec.agent_ref == agent
                && (s.spec.agent_volume_id == id
                    || (s.spec.imported_from.is_some()
                        && s.spec.imported_from == import.imported_from()))
        });
        if let Some(other) = other {
            return Err(import::already_managed(import, &other));
        }
        let held = self.reservations.get(agent, &id).await?;
        super::reservations::Reservations::check(import, name, held.as_ref())?;
        let claim = claim.ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{}: an import needs the claim: run the external-provisioner with --extra-create-metadata",
                import.annotation()
            ))
        })?;
        self.reservations.take(import, agent, name, claim).await?;
        Ok(())
    }
}
