//! PillarStorageClass → StorageClass: each PillarStorageClass generates the
//! StorageClass named by its `storageClass.name` and owns it (an
//! ownerReference with `controller: true`, so Kubernetes' garbage collector
//! deletes it with its owner).
//!
//! - provisioner `pillar-csi.bhyoo.com`, or `files.pillar-csi.bhyoo.com`
//!   for a class whose store is a `zfsDataset` (filesystem volumes; only
//!   when the controller serves that identity, else the class is
//!   `Ready=False` with reason `FilesIdentityDisabled` and no StorageClass
//!   is generated); parameters `pillarStorageClass` (what CreateVolume
//!   reads) and, for block volumes, `csi.storage.k8s.io/fstype` from
//!   `filesystem.fsType`; `reclaimPolicy` (default `Delete`),
//!   `volumeBindingMode` (default `Immediate`), `allowVolumeExpansion`
//!   (default true) from `storageClass`; with `importKeys`, the
//!   external-provisioner's secret parameters, templated from the claim's
//!   `pillar-csi.bhyoo.com/import-key-secret` annotation and namespace;
//!   for a node-local class (protocol `local`), `allowedTopologies`
//!   naming its agent's node (kept as it was while the class does not
//!   resolve).
//! - A change of the PillarStorageClass updates the StorageClass. Its
//!   provisioner, parameters, reclaimPolicy and volumeBindingMode are
//!   immutable in Kubernetes, so when one of them (or allowedTopologies)
//!   changes the StorageClass is deleted and created again (existing PVs keep their own copy of what
//!   they were provisioned with); the condition's message says so.
//! - A StorageClass of that name that this PillarStorageClass does not own
//!   is never changed: the PillarStorageClass turns `Ready=False` with reason
//!   `StorageClassConflict`, naming the owner if any.
//! - `Ready=False` with reason `InvalidReference` when the store, protocol
//!   or agent it names does not resolve (the StorageClass is still kept,
//!   with the provisioner of the class's store, or, the store gone too,
//!   the one it had).
use super::{condition_changed, ready_condition, Reconcilers};
use crate::controller::resolve::{self, Placement, CLASS_PARAMETER};
use crate::controller::topology;
use crate::driver::Driver;
use api::annotations::IMPORT_KEY_SECRET_ANNOTATION;
use api::crd::{PillarStorageClass, ReclaimPolicy, VolumeBindingMode};
use k8s_openapi::api::core::v1::TopologySelectorTerm;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use std::collections::BTreeMap;

/// The block identity's name, the provisioner of block classes'
/// StorageClasses.
pub const PROVISIONER: &str = api::DRIVER_NAME;
/// The StorageClass parameter the external-provisioner turns into the PV's fsType.
pub const FSTYPE_PARAMETER: &str = "csi.storage.k8s.io/fstype";
/// The StorageClass parameters naming the Secret the external-provisioner
/// passes in CreateVolume's secrets (templated from the claim).
pub const SECRET_NAME_PARAMETER: &str = "csi.storage.k8s.io/provisioner-secret-name";
/// See [`SECRET_NAME_PARAMETER`].
pub const SECRET_NAMESPACE_PARAMETER: &str = "csi.storage.k8s.io/provisioner-secret-namespace";

/// The StorageClass `class` generates for identity `driver`, its volumes
/// accessible where `allowed_topologies` says (everywhere: `None`).
pub fn desired(
    class: &PillarStorageClass,
    driver: Driver,
    allowed_topologies: Option<Vec<TopologySelectorTerm>>,
) -> StorageClass {
    let template = &class.spec.storage_class;
    let mut parameters = BTreeMap::from([(CLASS_PARAMETER.to_owned(), class.name_any())]);
    // A filesystem volume's fsType is its NFS mount's, no class's.
    if let Some(fs) = class
        .spec
        .filesystem
        .as_ref()
        .filter(|_| driver == Driver::Block)
    {
        let name = serde_json::to_value(fs.fs_type)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        parameters.insert(FSTYPE_PARAMETER.to_owned(), name);
    }
    if class.spec.import_keys {
        parameters.insert(
            SECRET_NAME_PARAMETER.to_owned(),
            format!("${{pvc.annotations['{IMPORT_KEY_SECRET_ANNOTATION}']}}"),
        );
        parameters.insert(
            SECRET_NAMESPACE_PARAMETER.to_owned(),
            "${pvc.namespace}".to_owned(),
        );
    }
    StorageClass {
        metadata: ObjectMeta {
            name: Some(template.name.clone()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_owned(),
                "pillar-csi".to_owned(),
            )])),
            owner_references: Some(vec![owner_reference(class)]),
            ..Default::default()
        },
        provisioner: driver.name().into(),
        parameters: Some(parameters),
        reclaim_policy: Some(
            match template.reclaim_policy.unwrap_or(ReclaimPolicy::Delete) {
                ReclaimPolicy::Delete => "Delete",
                ReclaimPolicy::Retain => "Retain",
            }
            .into(),
        ),
        volume_binding_mode: Some(
            match template
                .volume_binding_mode
                .unwrap_or(VolumeBindingMode::Immediate)
            {
                VolumeBindingMode::Immediate => "Immediate",
                VolumeBindingMode::WaitForFirstConsumer => "WaitForFirstConsumer",
            }
            .into(),
        ),
        allow_volume_expansion: Some(template.allow_volume_expansion.unwrap_or(true)),
        mount_options: None,
        allowed_topologies,
    }
}

/// The ownerReference naming `class` as the controller of what it generates.
pub fn owner_reference(class: &PillarStorageClass) -> OwnerReference {
    OwnerReference {
        api_version: PillarStorageClass::api_version(&()).into_owned(),
        kind: PillarStorageClass::kind(&()).into_owned(),
        name: class.name_any(),
        uid: class.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// The controlling owner of `sc`, if any.
fn controller_of(sc: &StorageClass) -> Option<&OwnerReference> {
    sc.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
}

/// Whether the fields Kubernetes refuses to update differ.
fn immutable_differs(have: &StorageClass, want: &StorageClass) -> bool {
    have.provisioner != want.provisioner
        || have.parameters.clone().unwrap_or_default()
            != want.parameters.clone().unwrap_or_default()
        || have.reclaim_policy.as_deref().unwrap_or("Delete")
            != want.reclaim_policy.as_deref().unwrap_or("Delete")
        || have.volume_binding_mode.as_deref().unwrap_or("Immediate")
            != want.volume_binding_mode.as_deref().unwrap_or("Immediate")
        || have.allowed_topologies != want.allowed_topologies
}

/// The node a placed class's volumes are on (none: every node), refusing
/// a node-local class that cannot place volumes.
fn local_node(p: &Placement) -> crate::controller::error::Result<Option<String>> {
    let backend = resolve::backend_of(&p.store.name_any(), &p.store.spec.backend)?;
    let protocol = resolve::protocol_of(&p.protocol.name_any(), &p.protocol.spec.protocol)?;
    topology::local_node(&p.class.name_any(), &p.agent, backend, protocol)
}

/// What one class's pass did, for its condition.
enum Outcome {
    Current,
    Created,
    Updated,
    Replaced,
    Conflict(String),
    Disabled(String),
}

impl Reconcilers {
    /// One pass over every PillarStorageClass; returns how many failed.
    pub async fn storage_classes(&self) -> u64 {
        let classes = Api::<PillarStorageClass>::all(self.client.clone());
        let list = match classes.list(&ListParams::default()).await {
            Ok(l) => l.items,
            Err(e) => {
                tracing::warn!(error = %super::with_causes(&e), "list PillarStorageClasses");
                return 1;
            }
        };
        let mut errors = 0;
        for class in list {
            if class.metadata.deletion_timestamp.is_some() {
                continue;
            }
            if let Err(e) = self.storage_class(&classes, &class).await {
                tracing::warn!(class = %class.name_any(), error = %super::with_causes(&e), "StorageClass not reconciled");
                errors += 1;
            }
        }
        errors
    }

    async fn storage_class(
        &self,
        classes: &Api<PillarStorageClass>,
        class: &PillarStorageClass,
    ) -> Result<(), kube::Error> {
        let scs = Api::<StorageClass>::all(self.client.clone());
        let name = class.spec.storage_class.name.clone();
        let placement = resolve::placement(&self.client, &class.name_any())
            .await
            .and_then(|p| local_node(&p).map(|node| (p, node)));
        let driver =
            match placement.as_ref().ok().and_then(|(p, _)| {
                resolve::backend_of(&p.store.name_any(), &p.store.spec.backend).ok()
            }) {
                Some(backend) => Driver::of_backend(backend),
                None => self.driver_unplaced(class, &scs, &name).await?,
            };
        let allowed = match &placement {
            Ok((_, node)) => topology::allowed_topologies(node.clone()),
            Err(_) => scs
                .get_opt(&name)
                .await?
                .and_then(|sc| sc.allowed_topologies),
        };
        let want = desired(class, driver, allowed);
        let uid = class.metadata.uid.clone().unwrap_or_default();
        let outcome = if driver == Driver::Files && !self.settings.files {
            Outcome::Disabled(format!(
                "PillarStorageClass {:?} places filesystem volumes, which the {} identity serves, and this controller does not serve it (the chart's files.enabled); no StorageClass {name:?} is generated",
                class.name_any(),
                driver.name()
            ))
        } else {
            self.generate(&scs, &name, &uid, &want).await?
        };
        self.set_condition(classes, class, &name, outcome, placement.map(drop))
            .await
    }

    /// The identity of a class whose placement does not resolve (its
    /// protocol or agent missing, for a while or for good): its store's,
    /// when the store is there; else the one of the StorageClass it
    /// generated before. A block default would replace a files class's
    /// StorageClass (its provisioner is immutable) while its agent is
    /// away.
    async fn driver_unplaced(
        &self,
        class: &PillarStorageClass,
        scs: &Api<StorageClass>,
        name: &str,
    ) -> Result<Driver, kube::Error> {
        let stores = Api::<api::crd::PillarStore>::all(self.client.clone());
        if let Some(store) = stores.get_opt(&class.spec.store_ref).await? {
            if let Ok(backend) = resolve::backend_of(&store.name_any(), &store.spec.backend) {
                return Ok(Driver::of_backend(backend));
            }
        }
        let before = scs.get_opt(name).await?;
        Ok(match before {
            Some(sc) if sc.provisioner == Driver::Files.name() => Driver::Files,
            _ => Driver::Block,
        })
    }

    /// Creates, updates or replaces the StorageClass `want` named `name`,
    /// when the class of UID `uid` owns it.
    async fn generate(
        &self,
        scs: &Api<StorageClass>,
        name: &str,
        uid: &str,
        want: &StorageClass,
    ) -> Result<Outcome, kube::Error> {
        Ok(match scs.get_opt(name).await? {
            None => {
                scs.create(&PostParams::default(), want).await?;
                Outcome::Created
            }
            Some(have) => match controller_of(&have) {
                Some(owner) if owner.uid == uid => {
                    if immutable_differs(&have, want) {
                        // Only this very object is deleted: a StorageClass
                        // re-created by someone else meanwhile is not ours.
                        let dp = DeleteParams {
                            preconditions: Some(kube::api::Preconditions {
                                uid: have.metadata.uid.clone(),
                                resource_version: have.metadata.resource_version.clone(),
                            }),
                            ..Default::default()
                        };
                        scs.delete(name, &dp).await?;
                        scs.create(&PostParams::default(), want).await?;
                        Outcome::Replaced
                    } else if have.allow_volume_expansion != want.allow_volume_expansion
                        || have.metadata.labels.as_ref().and_then(|l| {
                            l.get("app.kubernetes.io/managed-by").cloned()
                        }) != Some("pillar-csi".into())
                    {
                        let patch = serde_json::json!({
                            "metadata": {
                                "resourceVersion": have.metadata.resource_version,
                                "labels": {"app.kubernetes.io/managed-by": "pillar-csi"},
                            },
                            "allowVolumeExpansion": want.allow_volume_expansion,
                        });
                        scs.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                            .await?;
                        Outcome::Updated
                    } else {
                        Outcome::Current
                    }
                }
                Some(owner) => Outcome::Conflict(format!(
                    "StorageClass {name:?} already exists and is controlled by {} {:?} (uid {}), not by this PillarStorageClass; pillar-csi leaves it untouched: choose another storageClass.name or delete that StorageClass",
                    owner.kind, owner.name, owner.uid
                )),
                None => Outcome::Conflict(format!(
                    "StorageClass {name:?} already exists and is not owned by this PillarStorageClass (provisioner {:?}); pillar-csi leaves it untouched: choose another storageClass.name or delete that StorageClass",
                    have.provisioner
                )),
            },
        })
    }

    /// Sets the class's Ready condition from what its pass did and whether
    /// its references resolve.
    async fn set_condition(
        &self,
        classes: &Api<PillarStorageClass>,
        class: &PillarStorageClass,
        name: &str,
        outcome: Outcome,
        placement: crate::controller::error::Result<()>,
    ) -> Result<(), kube::Error> {
        let (ready, reason, message) = match (outcome, placement) {
            (Outcome::Conflict(why), _) => (false, "StorageClassConflict", why),
            (Outcome::Disabled(why), _) => (false, "FilesIdentityDisabled", why),
            (_, Err(e)) => (
                false,
                "InvalidReference",
                format!("StorageClass {name:?} is generated, but volumes cannot be provisioned: {e}"),
            ),
            (Outcome::Created, Ok(_)) => (true, "Generated", format!("StorageClass {name:?} created")),
            (Outcome::Updated, Ok(_)) => (true, "Generated", format!("StorageClass {name:?} updated")),
            (Outcome::Replaced, Ok(_)) => (
                true,
                "Generated",
                format!("StorageClass {name:?} replaced: its provisioner, parameters, reclaimPolicy, volumeBindingMode or allowedTopologies changed, which Kubernetes does not update in place, so it was deleted and created again"),
            ),
            (Outcome::Current, Ok(_)) => (true, "Generated", format!("StorageClass {name:?} is up to date")),
        };
        let previous = class
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
        // "Up to date" after "created/updated/replaced" says nothing new:
        // keep the message of the last change while the class stays Ready.
        let keep = ready
            && reason == "Generated"
            && message.ends_with("is up to date")
            && previous.iter().any(|c| {
                c.type_ == "Ready"
                    && c.status == "True"
                    && c.reason == "Generated"
                    && c.observed_generation == class.metadata.generation
            });
        if keep {
            return Ok(());
        }
        let condition =
            ready_condition(&previous, ready, reason, message, class.metadata.generation);
        if condition_changed(&previous, &condition) {
            let patch = serde_json::json!({"status": {"conditions": [condition]}});
            classes
                .patch_status(
                    &class.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::crd::{Filesystem, FsType, PillarStorageClassSpec, StorageClassTemplate};

    fn class(policy: Option<ReclaimPolicy>) -> PillarStorageClass {
        let mut c = PillarStorageClass::new(
            "hot",
            PillarStorageClassSpec {
                store_ref: "s".into(),
                protocol_ref: "p".into(),
                storage_class: StorageClassTemplate {
                    name: "pillar-hot".into(),
                    reclaim_policy: policy,
                    volume_binding_mode: None,
                    allow_volume_expansion: None,
                },
                filesystem: Some(Filesystem {
                    fs_type: FsType::Xfs,
                }),
                allowed_claim_zfs_properties: Vec::new(),
                encrypted: false,
                import_keys: false,
            },
        );
        c.metadata.uid = Some("u-1".into());
        c
    }

    #[test]
    fn the_generated_class_carries_the_name_fstype_and_owner() {
        let sc = desired(&class(None), Driver::Block, None);
        assert_eq!(sc.provisioner, "pillar-csi.bhyoo.com");
        let p = sc.parameters.clone().unwrap_or_default();
        assert_eq!(p.get("pillarStorageClass").map(String::as_str), Some("hot"));
        assert_eq!(
            p.get("csi.storage.k8s.io/fstype").map(String::as_str),
            Some("xfs")
        );
        assert_eq!(sc.reclaim_policy.as_deref(), Some("Delete"));
        let owner = controller_of(&sc).cloned().expect("owner");
        assert_eq!(
            (
                owner.kind.as_str(),
                owner.uid.as_str(),
                owner.api_version.as_str()
            ),
            ("PillarStorageClass", "u-1", "pillar-csi.bhyoo.com/v1alpha1")
        );
        let retain = desired(&class(Some(ReclaimPolicy::Retain)), Driver::Block, None);
        assert!(immutable_differs(&sc, &retain));
        assert!(!immutable_differs(
            &sc,
            &desired(&class(None), Driver::Block, None)
        ));
        assert!(!p.contains_key(SECRET_NAME_PARAMETER));
    }

    #[test]
    fn a_node_local_class_allows_its_agents_node_only_and_a_change_replaces_it() {
        let on = |node: &str| topology::allowed_topologies(Some(node.to_owned()));
        let sc = desired(&class(None), Driver::Files, on("worker-1"));
        let terms = sc.allowed_topologies.clone().unwrap_or_default();
        let expr = &terms[0]
            .match_label_expressions
            .as_ref()
            .expect("expressions")[0];
        assert_eq!(expr.key, api::TOPOLOGY_NODE_KEY);
        assert_eq!(expr.values, ["worker-1"]);
        assert!(immutable_differs(
            &sc,
            &desired(&class(None), Driver::Files, on("worker-2"))
        ));
        assert!(!immutable_differs(
            &sc,
            &desired(&class(None), Driver::Files, on("worker-1"))
        ));
        assert_eq!(topology::allowed_topologies(None), None);
    }

    #[test]
    fn a_filesystem_class_is_provisioned_by_the_files_identity_without_an_fstype() {
        let sc = desired(&class(None), Driver::Files, None);
        assert_eq!(sc.provisioner, "files.pillar-csi.bhyoo.com");
        let p = sc.parameters.clone().unwrap_or_default();
        assert_eq!(p.get("pillarStorageClass").map(String::as_str), Some("hot"));
        assert!(!p.contains_key(FSTYPE_PARAMETER), "{p:?}");
        assert!(immutable_differs(
            &sc,
            &desired(&class(None), Driver::Block, None)
        ));
    }

    #[test]
    fn a_class_of_encrypted_imports_has_the_provisioner_read_the_claims_key_secret() {
        let mut importing = class(None);
        importing.spec.import_keys = true;
        let sc = desired(&importing, Driver::Block, None);
        let p = sc.parameters.clone().unwrap_or_default();
        assert_eq!(
            p.get("csi.storage.k8s.io/provisioner-secret-name")
                .map(String::as_str),
            Some("${pvc.annotations['pillar-csi.bhyoo.com/import-key-secret']}")
        );
        assert_eq!(
            p.get("csi.storage.k8s.io/provisioner-secret-namespace")
                .map(String::as_str),
            Some("${pvc.namespace}")
        );
        assert!(immutable_differs(
            &sc,
            &desired(&class(None), Driver::Block, None)
        ));
    }
}
