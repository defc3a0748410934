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
use std::collections::BTreeMap;

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
        Some(value) => settings::parse_backend(
            value,
            &store,
            &place.store.spec.backend,
            &place.class.name_any(),
            &place.class.spec.allowed_claim_zfs_properties,
        )?,
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

/// Whether the claim of UID `uid` is the one the volume `csi_name` is
/// provisioned for. The external-provisioner names a claim's volume
/// `<prefix>-<claim UID>` (`pvc-<UID>` by default), or with
/// `--volume-name-uuid-length` `<prefix>-<the UID without dashes, cut>`:
/// a claim deleted and re-created under its name has another UID, so a
/// retry of the old claim's CreateVolume never reads the new claim.
pub fn names_claim(csi_name: &str, uid: &str) -> bool {
    if uid.is_empty() {
        return false;
    }
    if csi_name
        .strip_suffix(uid)
        .is_some_and(|prefix| prefix.ends_with('-'))
    {
        return true;
    }
    let compact = uid.replace('-', "");
    csi_name
        .rsplit_once('-')
        .is_some_and(|(_, cut)| !cut.is_empty() && compact.starts_with(cut))
}

impl Controller {
    /// What the claim of a CreateVolume asks, and its reference. A claim
    /// that is gone (deleted, or re-created under its name with another
    /// UID) is refused before any agent call, also when the volume's record
    /// exists: an import is never completed for a claim that cannot bind
    /// to it, and the record is left to the reaper, which releases an
    /// import and deletes a volume it created.
    pub(super) async fn wants_of(
        &self,
        request: &csi::CreateVolumeRequest,
        place: &Placement,
        existing: Option<&PillarVolumeState>,
    ) -> Result<(Wants, Option<ClaimRef>)> {
        let claim = match existing {
            Some(_) => self.claim_of_record(request).await?,
            None => self.claim(request).await?,
        };
        let annotations = claim.as_ref().map(|c| c.annotations().clone());
        let wants = wants(
            &annotations.unwrap_or_default(),
            place,
            &request.volume_capabilities,
        )?;
        Ok((wants, claim.as_ref().map(reference)))
    }

    /// [`Self::claim`] for a volume whose record exists; a claim that is
    /// gone is refused saying what becomes of the record.
    pub(super) async fn claim_of_record(
        &self,
        request: &csi::CreateVolumeRequest,
    ) -> Result<Option<PersistentVolumeClaim>> {
        self.claim(request).await.map_err(|e| match e {
            Error::FailedPrecondition(why) => Error::FailedPrecondition(format!(
                "{why}; volume {:?} is not provisioned for a claim that is gone: its records are removed without destroying an imported volume",
                request.name
            )),
            e => e,
        })
    }

    /// The claim of a CreateVolume, named by the provisioner's parameters
    /// (`None` without them). A named claim that does not exist, or whose
    /// UID is not the one in the volume's name ([`names_claim`]), is
    /// refused: FAILED_PRECONDITION, final for the provisioner.
    pub(super) async fn claim(
        &self,
        request: &csi::CreateVolumeRequest,
    ) -> Result<Option<PersistentVolumeClaim>> {
        let parameters = &request.parameters;
        let (Some(name), Some(namespace)) =
            (parameters.get(PVC_NAME), parameters.get(PVC_NAMESPACE))
        else {
            return Ok(None);
        };
        let claim = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(Error::kube(format!(
                "read PersistentVolumeClaim {namespace}/{name}"
            )))?
            .ok_or_else(|| {
                Error::FailedPrecondition(format!(
                    "PersistentVolumeClaim {namespace}/{name} does not exist"
                ))
            })?;
        let uid = claim.metadata.uid.as_deref().unwrap_or_default();
        if !names_claim(&request.name, uid) {
            return Err(Error::FailedPrecondition(format!(
                "PersistentVolumeClaim {namespace}/{name} is not the claim of volume {:?}: its UID is {uid} (the claim was deleted and re-created)",
                request.name
            )));
        }
        Ok(Some(claim))
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

#[cfg(test)]
mod tests {
    use super::names_claim;

    #[test]
    fn a_volume_names_only_the_claim_of_its_uid() {
        let uid = "0d5201a5-3c1e-4c55-a2a7-3f7d3c4e9b10";
        assert!(names_claim(&format!("pvc-{uid}"), uid));
        assert!(names_claim(&format!("my-prefix-{uid}"), uid));
        // --volume-name-uuid-length: the UID without dashes, cut.
        assert!(names_claim("pvc-0d5201a53c1e", uid));
        // A claim re-created under its name has another UID.
        let other = "7b1c2d3e-0000-4c55-a2a7-3f7d3c4e9b10";
        assert!(!names_claim(&format!("pvc-{uid}"), other));
        assert!(!names_claim("pvc-0d5201a53c1e", other));
        assert!(!names_claim(&format!("pvc-x{uid}"), ""));
        assert!(!names_claim(uid, uid));
        assert!(!names_claim("pvc-", uid));
    }
}
