//! Imports through PVC annotations: `pillar-csi.bhyoo.com/import-zvol`
//! (spec/import-zvol.md), `pillar-csi.bhyoo.com/import-lv` with
//! `import-lv-policy` (spec/adopt-lvm-lv.md), and
//! `pillar-csi.bhyoo.com/import-zfs-dataset` and
//! `pillar-csi.bhyoo.com/import-directory` (a ZFS filesystem or a directory,
//! under the files identity: always kept as it is, README "Existing
//! filesystem adoption").
//!
//! Everything here runs before anything is written: the annotation's value,
//! its fit to the class's PillarStore, and its fit to a record that already
//! exists for the volume. Each refusal is the text of the spec's Refusals
//! tables (controller-side rows); the agent's rows (`import of volume ...`)
//! come from the agent and reach the claim verbatim (see [`Error::for_claim`]).
//!
//! [`Error::for_claim`]: super::error::Error::for_claim
use super::error::{Error, Result};
use api::annotations::{
    parse_import_directory, parse_import_lv, parse_import_lv_policy, parse_import_zfs_dataset,
    parse_import_zvol, DirectoryPath, LvIdentity, LvPolicy, IMPORT_DIRECTORY_ANNOTATION,
    IMPORT_LV_ANNOTATION, IMPORT_LV_POLICY_ANNOTATION, IMPORT_ZFS_DATASET_ANNOTATION,
    IMPORT_ZVOL_ANNOTATION,
};
use api::crd::{LvmSource, PillarVolumeState, StoreBackend, VolumePhase, ZfsBackend};
use api::handle::AgentVolumeId;
use api::names::zfs::DatasetName;
use api::tokens::Backend;
use pillar_csi_proto::agent::v1 as agent;
use std::collections::BTreeMap;

/// What a claim asks to adopt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// An existing zvol, by its full dataset name.
    Zvol(DatasetName),
    /// An existing ZFS filesystem, by its full dataset name: always kept
    /// as it is (never resized, chmod-ed or destroyed).
    Filesystem(DatasetName),
    /// An existing directory on a storage node, by its absolute path:
    /// always kept as it is.
    Directory(DirectoryPath),
    /// An existing LV, pinned by names and UUIDs, with its policy.
    Lv {
        /// Names and UUIDs.
        identity: LvIdentity,
        /// PreserveOriginal or Managed.
        policy: LvPolicy,
    },
}

/// An import a claim asks for, checked against the class's store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Import {
    /// The volume to adopt.
    pub source: Source,
    /// Its volume ID on the agent: `<pool>/<zvol name>` or `<vg>/<lv>`.
    pub agent_volume_id: AgentVolumeId,
}

fn invalid(message: String) -> Error {
    Error::InvalidArgument(message)
}

/// Reads the import annotations of a claim (`None` without any) and checks
/// them against the store the class places volumes in. `store` is the
/// PillarStore's name, `backend` its backend.
pub fn requested(
    annotations: &BTreeMap<String, String>,
    backend: &StoreBackend,
) -> Result<Option<Import>> {
    let zvol = annotations.get(IMPORT_ZVOL_ANNOTATION);
    let lv = annotations.get(IMPORT_LV_ANNOTATION);
    let policy = annotations.get(IMPORT_LV_POLICY_ANNOTATION);
    let dataset = annotations.get(IMPORT_ZFS_DATASET_ANNOTATION);
    let directory = annotations.get(IMPORT_DIRECTORY_ANNOTATION);
    for (value, a) in [
        (dataset, IMPORT_ZFS_DATASET_ANNOTATION),
        (directory, IMPORT_DIRECTORY_ANNOTATION),
    ] {
        let Some(value) = value else { continue };
        if let Some(other) = [
            (dataset, IMPORT_ZFS_DATASET_ANNOTATION),
            (directory, IMPORT_DIRECTORY_ANNOTATION),
            (zvol, IMPORT_ZVOL_ANNOTATION),
            (lv, IMPORT_LV_ANNOTATION),
            (policy, IMPORT_LV_POLICY_ANNOTATION),
        ]
        .iter()
        .find_map(|(v, other)| v.filter(|_| *other != a).map(|_| *other))
        {
            return Err(invalid(format!(
                "{a} and {other} cannot be combined on one claim"
            )));
        }
        return match a {
            IMPORT_DIRECTORY_ANNOTATION => directory_in(value, backend),
            _ => filesystem_in(value, backend),
        }
        .map(Some);
    }
    match (zvol, lv) {
        (Some(_), Some(_)) => Err(invalid(format!(
            "{IMPORT_ZVOL_ANNOTATION} and {IMPORT_LV_ANNOTATION} cannot be combined on one claim"
        ))),
        (Some(value), None) => {
            if policy.is_some() {
                return Err(invalid(format!(
                    "{IMPORT_LV_POLICY_ANNOTATION} applies to {IMPORT_LV_ANNOTATION} only, not to {IMPORT_ZVOL_ANNOTATION}"
                )));
            }
            zvol_in(value, backend).map(Some)
        }
        (None, Some(value)) => lv_in(value, policy.map(String::as_str), backend).map(Some),
        (None, None) => match policy {
            Some(_) => Err(invalid(format!(
                "{IMPORT_LV_POLICY_ANNOTATION} is set without {IMPORT_LV_ANNOTATION}"
            ))),
            None => Ok(None),
        },
    }
}

fn backend_token(backend: &StoreBackend) -> &'static str {
    match (
        &backend.zfs,
        &backend.lvm,
        &backend.zfs_dataset,
        &backend.directory,
    ) {
        (Some(_), _, _, _) => Backend::ZfsZvol.as_str(),
        (_, Some(_), _, _) => Backend::LvmLv.as_str(),
        (_, _, Some(_), _) => Backend::ZfsDataset.as_str(),
        (_, _, _, Some(_)) => Backend::Directory.as_str(),
        _ => "none",
    }
}

fn zvol_in(value: &str, backend: &StoreBackend) -> Result<Import> {
    let a = IMPORT_ZVOL_ANNOTATION;
    let dataset = parse_import_zvol(value).map_err(|e| invalid(e.0))?;
    let Some(zfs) = &backend.zfs else {
        return Err(invalid(format!(
            "{a} requires a zfs.zvol PillarStore backend, got backend {:?}",
            backend_token(backend)
        )));
    };
    let agent_volume_id = below_parent(a, value, &dataset, zfs, Backend::ZfsZvol)?;
    Ok(Import {
        source: Source::Zvol(dataset),
        agent_volume_id,
    })
}

fn filesystem_in(value: &str, backend: &StoreBackend) -> Result<Import> {
    let a = IMPORT_ZFS_DATASET_ANNOTATION;
    let dataset = parse_import_zfs_dataset(value).map_err(|e| invalid(e.0))?;
    let Some(zfs) = &backend.zfs_dataset else {
        return Err(invalid(format!(
            "{a} requires a zfsDataset PillarStore backend, got backend {:?}",
            backend_token(backend)
        )));
    };
    let agent_volume_id = below_parent(a, value, &dataset, zfs, Backend::ZfsDataset)?;
    Ok(Import {
        source: Source::Filesystem(dataset),
        agent_volume_id,
    })
}

fn directory_in(value: &str, backend: &StoreBackend) -> Result<Import> {
    let a = IMPORT_DIRECTORY_ANNOTATION;
    let path = parse_import_directory(value).map_err(|e| invalid(e.0))?;
    let Some(directory) = &backend.directory else {
        return Err(invalid(format!(
            "{a} requires a directory PillarStore backend, got backend {:?}",
            backend_token(backend)
        )));
    };
    // The backend's path is the agent's to know (its configuration): the
    // agent checks that the directory is directly under it.
    let id = format!("{}/{}", directory.name, path.name());
    let agent_volume_id = AgentVolumeId::parse(Backend::Directory, &id)
        .map_err(|e| invalid(format!("{a} directory {value:?}: {e}")))?;
    Ok(Import {
        source: Source::Directory(path),
        agent_volume_id,
    })
}

/// The agent volume ID of `dataset` (named by annotation `a` as `value`),
/// which must be a child of the store's parent dataset.
fn below_parent(
    a: &str,
    value: &str,
    dataset: &DatasetName,
    zfs: &ZfsBackend,
    kind: Backend,
) -> Result<AgentVolumeId> {
    if dataset.pool() != zfs.pool {
        return Err(invalid(format!(
            "{a} dataset {value:?} lives in pool {:?} but the PillarStore selects pool {:?}",
            dataset.pool(),
            zfs.pool
        )));
    }
    let parent = match &zfs.parent_dataset {
        Some(p) => format!("{}/{p}", zfs.pool),
        None => zfs.pool.clone(),
    };
    if dataset.parent().map(|p| p.as_str().to_owned()) != Some(parent.clone()) {
        return Err(invalid(format!(
            "{a} dataset {value:?} is not under the PillarStore's parent dataset {parent:?}"
        )));
    }
    let id = format!("{}/{}", zfs.pool, dataset.last());
    AgentVolumeId::parse(kind, &id).map_err(|e| invalid(format!("{a} dataset {value:?}: {e}")))
}

fn lv_in(value: &str, policy: Option<&str>, backend: &StoreBackend) -> Result<Import> {
    let a = IMPORT_LV_ANNOTATION;
    let identity = parse_import_lv(value).map_err(|e| invalid(e.0))?;
    let policy = parse_import_lv_policy(policy).map_err(|e| invalid(e.0))?;
    let Some(lvm) = &backend.lvm else {
        return Err(invalid(format!(
            "{a} requires an lvm PillarStore backend, got backend {:?}",
            backend_token(backend)
        )));
    };
    if identity.vg.as_str() != lvm.volume_group {
        return Err(invalid(format!(
            "{a} logical volume {:?} lives in volume group {:?} but the PillarStore selects volume group {:?}",
            format!("{}/{}", identity.vg, identity.lv),
            identity.vg.as_str(),
            lvm.volume_group
        )));
    }
    let id = format!("{}/{}", identity.vg, identity.lv);
    let agent_volume_id = AgentVolumeId::parse(Backend::LvmLv, &id)
        .map_err(|e| invalid(format!("{a} value {value:?}: {e}")))?;
    Ok(Import {
        source: Source::Lv { identity, policy },
        agent_volume_id,
    })
}

impl Import {
    /// The annotation that asked for this import.
    pub fn annotation(&self) -> &'static str {
        match self.source {
            Source::Zvol(_) => IMPORT_ZVOL_ANNOTATION,
            Source::Filesystem(_) => IMPORT_ZFS_DATASET_ANNOTATION,
            Source::Directory(_) => IMPORT_DIRECTORY_ANNOTATION,
            Source::Lv { .. } => IMPORT_LV_ANNOTATION,
        }
    }

    /// `zvol "<dataset>"` or `logical volume "<vg>/<lv>"`, for messages.
    pub fn what(&self) -> String {
        match &self.source {
            Source::Zvol(d) => format!("zvol {:?}", d.as_str()),
            Source::Filesystem(d) => format!("filesystem {:?}", d.as_str()),
            Source::Directory(d) => format!("directory {:?}", d.as_str()),
            Source::Lv { identity, .. } => {
                format!(
                    "logical volume {:?}",
                    format!("{}/{}", identity.vg, identity.lv)
                )
            }
        }
    }

    /// The record's `spec.importedFrom`.
    pub fn imported_from(&self) -> Option<String> {
        match &self.source {
            Source::Zvol(d) | Source::Filesystem(d) => Some(d.as_str().to_owned()),
            Source::Directory(d) => Some(d.as_str().to_owned()),
            Source::Lv { .. } => None,
        }
    }

    /// The record's `spec.lvmSource`.
    pub fn lvm_source(&self) -> Option<LvmSource> {
        match &self.source {
            Source::Zvol(_) | Source::Filesystem(_) | Source::Directory(_) => None,
            Source::Lv { identity, policy } => Some(LvmSource {
                volume_group: identity.vg.as_str().to_owned(),
                logical_volume: identity.lv.as_str().to_owned(),
                volume_group_uuid: identity.vg_uuid.as_str().to_owned(),
                logical_volume_uuid: identity.lv_uuid.as_str().to_owned(),
                preserve_original: policy.preserves(),
            }),
        }
    }

    /// Sets the import source of the agent's CreateVolume; nothing of the
    /// store, class or `backend` annotation is sent with it (import never
    /// changes the volume).
    pub fn apply(&self, request: &mut agent::CreateVolumeRequest) {
        request.zfs_properties.clear();
        request.lvm_provisioning = agent::LvmProvisioning::Unspecified as i32;
        match &self.source {
            Source::Zvol(d) => request.import_zvol = d.as_str().to_owned(),
            Source::Filesystem(d) => request.import_zfs_dataset = d.as_str().to_owned(),
            Source::Directory(d) => request.import_directory = d.as_str().to_owned(),
            Source::Lv { identity, policy } => {
                request.import_lv = Some(agent::LvmIdentity {
                    volume_group: identity.vg.as_str().to_owned(),
                    logical_volume: identity.lv.as_str().to_owned(),
                    volume_group_uuid: identity.vg_uuid.as_str().to_owned(),
                    logical_volume_uuid: identity.lv_uuid.as_str().to_owned(),
                });
                request.import_lv_policy = policy.as_str().to_owned();
            }
        }
    }
}

/// The field of the provisioner secret (CreateVolume's `secrets`) that
/// holds the key of an imported encrypted zvol, as 64 hexadecimal digits.
pub const KEY_SECRET_FIELD: &str = "key";

/// The key of an imported encrypted zvol from CreateVolume's `secrets`
/// (the StorageClass's `csi.storage.k8s.io/provisioner-secret-name`):
/// empty without secrets. Only the names of the fields reach a message.
pub fn key_from_secrets(
    secrets: &std::collections::HashMap<String, String>,
    import: &Import,
) -> Result<Vec<u8>> {
    if secrets.is_empty() {
        return Ok(Vec::new());
    }
    let noun = match import.source {
        Source::Zvol(_) => None,
        Source::Filesystem(_) => Some("a filesystem"),
        Source::Directory(_) => Some("a directory"),
        Source::Lv { .. } => Some("a logical volume"),
    };
    if let Some(noun) = noun {
        return Err(invalid(format!(
            "the provisioner secret is for the key of an imported encrypted zvol; {} imports {noun}, which has none",
            import.annotation()
        )));
    }
    match secrets.get(KEY_SECRET_FIELD) {
        Some(key) => Ok(key.as_bytes().to_vec()),
        None => {
            let mut fields: Vec<&str> = secrets.keys().map(String::as_str).collect();
            fields.sort_unstable();
            Err(invalid(format!(
                "the provisioner secret has no field {KEY_SECRET_FIELD:?} (it has {}); put the zvol's key there as 64 hexadecimal digits",
                fields.join(", ")
            )))
        }
    }
}

/// How an existing record's source reads in a message.
fn recorded_source(state: &PillarVolumeState) -> Option<String> {
    if let Some(d) = &state.spec.imported_from {
        return Some(match state.spec.backend_type {
            Backend::ZfsDataset => format!("filesystem {d:?}"),
            Backend::Directory => format!("directory {d:?}"),
            _ => format!("zvol {d:?}"),
        });
    }
    state.spec.lvm_source.as_ref().map(|s| {
        format!(
            "logical volume {:?} ({}:{}, {})",
            format!("{}/{}", s.volume_group, s.logical_volume),
            s.volume_group_uuid,
            s.logical_volume_uuid,
            if s.preserve_original {
                LvPolicy::PreserveOriginal
            } else {
                LvPolicy::Managed
            }
        )
    })
}

/// Whether a retry's claim still asks for what the record of `name` was
/// created with: an import added after provisioning started, or changed (or
/// removed) after the import started, is refused.
pub fn check_record(name: &str, state: &PillarVolumeState, import: Option<&Import>) -> Result<()> {
    let recorded = recorded_source(state);
    match (import, recorded) {
        (None, None) => Ok(()),
        (Some(i), None) => {
            let noun = match i.source {
                Source::Zvol(_) => "a zvol",
                Source::Filesystem(_) => "a filesystem",
                Source::Directory(_) => "a directory",
                Source::Lv { .. } => "a logical volume",
            };
            Err(Error::FailedPrecondition(format!(
                "{}: volume {name:?} was already provisioned without an import; delete the PersistentVolumeClaim and re-create it to import {noun}",
                i.annotation()
            )))
        }
        (Some(i), Some(_))
            if i.imported_from() == state.spec.imported_from
                && i.lvm_source() == state.spec.lvm_source =>
        {
            Ok(())
        }
        (i, Some(source)) => {
            let annotation = match (i, &state.spec.imported_from) {
                (Some(i), _) => i.annotation(),
                (None, Some(_)) if state.spec.backend_type == Backend::ZfsDataset => {
                    IMPORT_ZFS_DATASET_ANNOTATION
                }
                (None, Some(_)) if state.spec.backend_type == Backend::Directory => {
                    IMPORT_DIRECTORY_ANNOTATION
                }
                (None, Some(_)) => IMPORT_ZVOL_ANNOTATION,
                (None, None) => IMPORT_LV_ANNOTATION,
            };
            Err(Error::FailedPrecondition(format!(
                "{annotation}: volume {name:?} already imported {source}; the import source cannot be changed"
            )))
        }
    }
}

/// The refusal of `action` (publish, expand) on a record whose import never
/// completed: the agent never adopted the volume, so pillar-csi does not
/// manage it yet.
pub fn never_adopted(volume_id: &str, state: &PillarVolumeState, action: &str) -> Option<Error> {
    if completed(state)? {
        return None;
    }
    let source = recorded_source(state)?;
    Some(Error::FailedPrecondition(format!(
        "cannot {action} volume {volume_id}: its import of {source} was never adopted"
    )))
}

/// Whether a record's import has completed (the agent adopted the volume and
/// the controller recorded it Ready). A record without an import is `None`.
/// A record being deleted is `Deleting` only when its import had completed
/// (DeleteVolume keeps the phase of an incomplete one).
pub fn completed(state: &PillarVolumeState) -> Option<bool> {
    recorded_source(state)?;
    Some(matches!(
        state.status.as_ref().and_then(|s| s.phase),
        Some(VolumePhase::Ready | VolumePhase::Deleting)
    ))
}

/// The annotation of a PillarVolumeState whose claim the controller saw
/// bound to the volume's PersistentVolume: the claim's UID. The reaper's
/// pass writes it ([`crate::reconcile::reaper`]).
pub const BOUND_CLAIM: &str = "pillar-csi.bhyoo.com/bound-claim-uid";

/// Whether the controller saw the record's claim bound to its volume: the
/// reaper's pass saw the claim of `spec.claimRef` Bound to it
/// ([`BOUND_CLAIM`]), or the volume was published at least once
/// (ControllerPublishVolume comes only for a PersistentVolume bound to the
/// claim a pod uses, and raises the publication generation), or the record
/// is a metadata-loss recovery (the lost volume was bound and holds its
/// data).
pub fn seen_bound(state: &PillarVolumeState) -> bool {
    let marked = state
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(BOUND_CLAIM));
    let claim = state.spec.claim_ref.as_ref().map(|c| &c.uid);
    (marked.is_some() && marked == claim)
        || super::state::generation(state) > 0
        || state.spec.recovery.is_some()
}

/// Whether the volume is kept as it is: an LV adopted PreserveOriginal
/// (`spec.lvmSource`) or recovered so (`spec.recovery.source`), or an
/// adopted filesystem or directory (always).
pub fn preserves_original(state: &PillarVolumeState) -> bool {
    let adopted = state.spec.lvm_source.as_ref();
    let recovered = state.spec.recovery.as_ref().map(|r| &r.source);
    adopted.or(recovered).is_some_and(|s| s.preserve_original)
        || (state.spec.backend_type.is_filesystem() && state.spec.imported_from.is_some())
}

/// Whether DeleteVolume only releases the volume (ReleaseVolume: the agent
/// checks and forgets it, nothing is destroyed) instead of deleting it: an
/// LV kept PreserveOriginal, an import that never completed, and an import
/// whose claim the controller never saw bound ([`seen_bound`]): a claim
/// deleted before it bound (its PersistentVolume made after it was gone,
/// then Released) never destroys the volume it asked to import.
pub fn released_on_delete(state: &PillarVolumeState) -> bool {
    preserves_original(state)
        || (recorded_source(state).is_some()
            && (completed(state) == Some(false) || !seen_bound(state)))
}

/// The refusal when another record already holds the volume to import.
pub fn already_managed(import: &Import, other: &PillarVolumeState) -> Error {
    Error::FailedPrecondition(format!(
        "{}: {} is already managed by volume {} (PillarVolumeState {}); delete that volume first",
        import.annotation(),
        import.what(),
        other.spec.volume_id,
        other.metadata.name.as_deref().unwrap_or_default()
    ))
}

#[cfg(test)]
#[path = "import_tests.rs"]
mod tests;
