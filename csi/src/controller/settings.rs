//! The per-volume settings a claim may carry, each a YAML document with the
//! shape of the matching subtree of the custom resources (spec/upgrade.md:
//! one name and one nested shape wherever a setting appears):
//!
//! - `pillar-csi.bhyoo.com/filesystem`: `{fsType: ext4|xfs}`, as
//!   `PillarStorageClass.spec.filesystem`; it overrides the class's, is
//!   recorded in the PillarVolumeState's `spec.resolved.filesystem` and
//!   reaches the node as the volume context's `fsType`. An import uses it
//!   too: it must name the filesystem already on the volume.
//! - `pillar-csi.bhyoo.com/backend`: `zfs: {properties: {<name>: <value>}}`
//!   or `lvm: {provisioningMode: linear|thin}`, the tunable part of
//!   `PillarStore.spec.backend`; the structural fields (`pool`,
//!   `parentDataset`, `volumeGroup`, `thinPool`) cannot be set per volume.
//!   It reaches the agent's CreateVolume of a new volume and is not applied
//!   to an import (import never changes the volume). A claim sets only the
//!   ZFS properties its PillarStorageClass lists in
//!   `allowedClaimZfsProperties` (none by default): `dedup`, `sync`,
//!   `copies` or `keylocation` change the pool's memory, durability, space
//!   or keys, which is the storage admin's call, not the claim author's.
//!
//! Both are read once, at CreateVolume; a refusal names the annotation and
//! what is wrong, and happens before anything is written.
use super::error::{Error, Result};
use api::crd::{Filesystem, FsType, StoreBackend};
use pillar_csi_proto::agent::v1 as agent;
use serde_yaml::{Mapping, Value};
use std::collections::BTreeMap;

/// The annotation choosing the filesystem of a Filesystem-mode volume.
pub const FILESYSTEM_ANNOTATION: &str = "pillar-csi.bhyoo.com/filesystem";
/// The annotation tuning the backend of a new volume.
pub const BACKEND_ANNOTATION: &str = "pillar-csi.bhyoo.com/backend";

fn refuse(annotation: &str, why: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(format!("{annotation}: {why}"))
}

fn document(annotation: &str, value: &str) -> Result<Mapping> {
    match serde_yaml::from_str::<Value>(value) {
        Ok(Value::Mapping(m)) => Ok(m),
        Ok(other) => Err(refuse(
            annotation,
            format!(
                "the value must be a YAML mapping, got {}",
                serde_yaml::to_string(&other)
                    .unwrap_or_default()
                    .trim_end()
                    .escape_debug()
            ),
        )),
        Err(e) => Err(refuse(
            annotation,
            format!("the value is not a YAML document: {e}"),
        )),
    }
}

fn key(annotation: &str, path: &str, k: &Value) -> Result<String> {
    k.as_str().map(str::to_owned).ok_or_else(|| {
        refuse(
            annotation,
            format!("{path}: keys must be strings, got {k:?}"),
        )
    })
}

fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Parses a `filesystem` annotation.
pub fn parse_filesystem(value: &str) -> Result<Filesystem> {
    let a = FILESYSTEM_ANNOTATION;
    let doc = document(a, value)?;
    let mut fs_type = None;
    for (k, v) in &doc {
        match key(a, "the document", k)?.as_str() {
            "fsType" => {
                fs_type = Some(match v.as_str() {
                    Some("ext4") => FsType::Ext4,
                    Some("xfs") => FsType::Xfs,
                    _ => {
                        return Err(refuse(
                            a,
                            format!(
                                "fsType must be \"ext4\" or \"xfs\", got {}",
                                scalar(v).map_or_else(|| format!("{v:?}"), |s| format!("{s:?}"))
                            ),
                        ))
                    }
                })
            }
            other => return Err(refuse(a, format!("unknown field {other:?}"))),
        }
    }
    let fs_type = fs_type.ok_or_else(|| refuse(a, "fsType is missing"))?;
    Ok(Filesystem { fs_type })
}

/// The ZFS properties of encryption, and the agent's sealed key: no claim
/// sets them, whatever its class allows.
const ENCRYPTION_PROPERTIES: [&str; 6] = [
    "encryption",
    "keyformat",
    "keylocation",
    "pbkdf2iters",
    "encryptionroot",
    "pillar-csi.bhyoo.com:sealed-key",
];

/// What a `backend` annotation sets for a new volume.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BackendSettings {
    /// ZFS properties of a new zvol.
    pub zfs_properties: BTreeMap<String, String>,
    /// `Some(true)` for a thin LV, `Some(false)` for a linear one.
    pub lvm_thin: Option<bool>,
}

impl BackendSettings {
    /// Sets the agent's CreateVolume fields for a new volume in `backend`
    /// (the store's thin pool decides when the claim does not).
    pub fn apply(&self, backend: &StoreBackend, request: &mut agent::CreateVolumeRequest) {
        request.zfs_properties = self.zfs_properties.clone().into_iter().collect();
        let thin = self
            .lvm_thin
            .or(backend.lvm.as_ref().map(|l| l.thin_pool.is_some()));
        request.lvm_provisioning = match thin {
            Some(true) => agent::LvmProvisioning::Thin as i32,
            Some(false) => agent::LvmProvisioning::Linear as i32,
            None => agent::LvmProvisioning::Unspecified as i32,
        };
    }
}

/// The refusal of a ZFS property `name` that the PillarStorageClass `class`
/// does not list in `allowed`.
fn not_allowed(class: &str, allowed: &[String], name: &str) -> Error {
    let listed = if allowed.is_empty() {
        "none".to_owned()
    } else {
        allowed
            .iter()
            .map(|p| format!("{p:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    refuse(
        BACKEND_ANNOTATION,
        format!(
            "ZFS property {name:?} may not be set by a claim of PillarStorageClass {class:?} \
             (allowed: {listed}; the class's allowedClaimZfsProperties lists what claims may set)"
        ),
    )
}

/// Parses a `backend` annotation against the store `store` (its backend
/// must be the member the claim sets) for a claim of the PillarStorageClass
/// `class`, which lets claims set the ZFS properties in `allowed` and no
/// others.
pub fn parse_backend(
    value: &str,
    store: &str,
    backend: &StoreBackend,
    class: &str,
    allowed: &[String],
) -> Result<BackendSettings> {
    let a = BACKEND_ANNOTATION;
    let doc = document(a, value)?;
    let has = if backend.zfs.is_some() { "zfs" } else { "lvm" };
    let mut settings = BackendSettings::default();
    if doc.len() != 1 {
        return Err(refuse(a, "set exactly one of zfs and lvm"));
    }
    for (k, v) in &doc {
        let member = key(a, "the document", k)?;
        if member != "zfs" && member != "lvm" {
            return Err(refuse(a, format!("unknown field {member:?}")));
        }
        if member != has {
            return Err(refuse(
                a,
                format!(
                    "the claim sets {member} but the PillarStore {store:?} has a {has} backend"
                ),
            ));
        }
        let Value::Mapping(fields) = v else {
            return Err(refuse(a, format!("{member} must be a mapping")));
        };
        for (k, v) in fields {
            let field = key(a, &member, k)?;
            match (member.as_str(), field.as_str()) {
                ("zfs", "pool" | "parentDataset") | ("lvm", "volumeGroup" | "thinPool") => {
                    return Err(refuse(
                        a,
                        format!("{member}.{field} is structural and cannot be set per volume"),
                    ))
                }
                ("zfs", "properties") => {
                    let Value::Mapping(props) = v else {
                        return Err(refuse(
                            a,
                            "zfs.properties must be a mapping of names to values",
                        ));
                    };
                    for (k, v) in props {
                        let name = key(a, "zfs.properties", k)?;
                        if ENCRYPTION_PROPERTIES.contains(&name.as_str()) {
                            return Err(refuse(
                                a,
                                format!("ZFS property {name:?} is the PillarStorageClass's to set (its encrypted field), never a claim's"),
                            ));
                        }
                        if !allowed.contains(&name) {
                            return Err(not_allowed(class, allowed, &name));
                        }
                        let value = scalar(v).ok_or_else(|| {
                            refuse(
                                a,
                                format!(
                                    "zfs.properties.{name} must be a string, number or boolean"
                                ),
                            )
                        })?;
                        settings.zfs_properties.insert(name, value);
                    }
                }
                ("lvm", "provisioningMode") => {
                    let thin = match v.as_str() {
                        Some("thin") => true,
                        Some("linear") => false,
                        _ => {
                            return Err(refuse(
                                a,
                                format!(
                                "lvm.provisioningMode must be \"linear\" or \"thin\", got {v:?}"
                            ),
                            ))
                        }
                    };
                    let pool = backend.lvm.as_ref().and_then(|l| l.thin_pool.as_ref());
                    if thin && pool.is_none() {
                        return Err(refuse(
                            a,
                            format!("lvm.provisioningMode thin needs a thinPool, and the PillarStore {store:?} has none"),
                        ));
                    }
                    settings.lvm_thin = Some(thin);
                }
                _ => return Err(refuse(a, format!("unknown field {member}.{field}"))),
            }
        }
    }
    Ok(settings)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use api::crd::{LvmBackend, ZfsBackend};

    fn zfs() -> StoreBackend {
        StoreBackend {
            zfs: Some(ZfsBackend {
                pool: "tank".into(),
                parent_dataset: Some("k8s".into()),
            }),
            lvm: None,
            zfs_dataset: None,
            directory: None,
        }
    }

    fn lvm(thin: bool) -> StoreBackend {
        StoreBackend {
            zfs: None,
            lvm: Some(LvmBackend {
                volume_group: "data-vg".into(),
                thin_pool: thin.then(|| "thin0".into()),
            }),
            zfs_dataset: None,
            directory: None,
        }
    }

    /// [`parse_backend`] for a claim of the class `fast`, which lets claims
    /// set `compression` and `volblocksize`.
    fn parse(value: &str, store: &str, backend: &StoreBackend) -> Result<BackendSettings> {
        let allowed = ["compression".to_owned(), "volblocksize".to_owned()];
        parse_backend(value, store, backend, "fast", &allowed)
    }

    fn err<T: std::fmt::Debug>(r: Result<T>) -> String {
        r.unwrap_err().to_string()
    }

    #[test]
    fn the_filesystem_document_names_ext4_or_xfs() {
        assert_eq!(
            parse_filesystem("fsType: xfs\n").unwrap().fs_type,
            FsType::Xfs
        );
        assert_eq!(
            parse_filesystem("{fsType: ext4}").unwrap().fs_type,
            FsType::Ext4
        );
        assert_eq!(
            err(parse_filesystem("fsType: btrfs")),
            "pillar-csi.bhyoo.com/filesystem: fsType must be \"ext4\" or \"xfs\", got \"btrfs\""
        );
        assert_eq!(
            err(parse_filesystem("fsType: xfs\nmkfsOption: -K")),
            "pillar-csi.bhyoo.com/filesystem: unknown field \"mkfsOption\""
        );
        assert_eq!(
            err(parse_filesystem("{}")),
            "pillar-csi.bhyoo.com/filesystem: fsType is missing"
        );
        assert!(err(parse_filesystem("xfs")).contains("must be a YAML mapping"));
        assert!(err(parse_filesystem("fsType: [")).contains("not a YAML document"));
    }

    #[test]
    fn the_backend_document_sets_only_tunable_fields_of_the_store_s_member() {
        let s = parse(
            "zfs:\n  properties:\n    compression: zstd\n    volblocksize: 8192\n",
            "hot",
            &zfs(),
        )
        .unwrap();
        assert_eq!(
            s.zfs_properties,
            BTreeMap::from([
                ("compression".to_owned(), "zstd".to_owned()),
                ("volblocksize".to_owned(), "8192".to_owned())
            ])
        );
        let mut r = agent::CreateVolumeRequest::default();
        s.apply(&zfs(), &mut r);
        assert_eq!(
            r.zfs_properties.get("compression").map(String::as_str),
            Some("zstd")
        );
        assert_eq!(
            r.lvm_provisioning,
            agent::LvmProvisioning::Unspecified as i32
        );

        assert_eq!(
            err(parse("zfs: {pool: other}", "hot", &zfs())),
            "pillar-csi.bhyoo.com/backend: zfs.pool is structural and cannot be set per volume"
        );
        assert_eq!(
            err(parse("lvm: {thinPool: t}", "vg", &lvm(true))),
            "pillar-csi.bhyoo.com/backend: lvm.thinPool is structural and cannot be set per volume"
        );
        assert_eq!(
            err(parse("lvm: {provisioningMode: thin}", "hot", &zfs())),
            "pillar-csi.bhyoo.com/backend: the claim sets lvm but the PillarStore \"hot\" has a zfs backend"
        );
        assert_eq!(
            err(parse("zfs: {propertys: {a: b}}", "hot", &zfs())),
            "pillar-csi.bhyoo.com/backend: unknown field zfs.propertys"
        );
        assert!(
            err(parse("lvm: {provisioningMode: thin}", "vg", &lvm(false)))
                .contains("needs a thinPool")
        );
        let linear = parse("lvm: {provisioningMode: linear}", "vg", &lvm(true)).unwrap();
        let mut r = agent::CreateVolumeRequest::default();
        linear.apply(&lvm(true), &mut r);
        assert_eq!(r.lvm_provisioning, agent::LvmProvisioning::Linear as i32);
        let mut r = agent::CreateVolumeRequest::default();
        BackendSettings::default().apply(&lvm(true), &mut r);
        assert_eq!(r.lvm_provisioning, agent::LvmProvisioning::Thin as i32);
        assert!(err(parse("{zfs: {}, lvm: {}}", "hot", &zfs())).contains("exactly one"));
    }

    #[test]
    fn no_claim_sets_encryption_even_where_its_class_lists_it() {
        let listed: Vec<String> = ENCRYPTION_PROPERTIES
            .iter()
            .map(|p| p.to_string())
            .collect();
        for property in ENCRYPTION_PROPERTIES {
            let doc = format!("zfs: {{properties: {{{property:?}: off}}}}");
            assert_eq!(
                err(parse_backend(&doc, "hot", &zfs(), "sealed", &listed)),
                format!("pillar-csi.bhyoo.com/backend: ZFS property {property:?} is the PillarStorageClass's to set (its encrypted field), never a claim's")
            );
        }
    }

    #[test]
    fn a_claim_sets_only_the_zfs_properties_its_class_allows() {
        for (property, value) in [
            ("dedup", "on"),
            ("sync", "disabled"),
            ("copies", "3"),
            ("compress", "lz4"),
        ] {
            let doc = format!("zfs: {{properties: {{compression: lz4, {property}: {value}}}}}");
            assert_eq!(
                err(parse(&doc, "hot", &zfs())),
                format!(
                    "pillar-csi.bhyoo.com/backend: ZFS property {property:?} may not be set by a claim of PillarStorageClass \"fast\" (allowed: \"compression\", \"volblocksize\"; the class's allowedClaimZfsProperties lists what claims may set)"
                )
            );
        }
        // A class that lists nothing (the default) lets a claim set none.
        assert_eq!(
            err(parse_backend("zfs: {properties: {compression: lz4}}", "hot", &zfs(), "plain", &[])),
            "pillar-csi.bhyoo.com/backend: ZFS property \"compression\" may not be set by a claim of PillarStorageClass \"plain\" (allowed: none; the class's allowedClaimZfsProperties lists what claims may set)"
        );
        // ... and an empty property mapping, or LVM settings, stay allowed.
        assert_eq!(
            parse_backend("zfs: {properties: {}}", "hot", &zfs(), "plain", &[]).unwrap(),
            BackendSettings::default()
        );
        assert_eq!(
            parse_backend(
                "lvm: {provisioningMode: linear}",
                "vg",
                &lvm(true),
                "plain",
                &[]
            )
            .unwrap()
            .lvm_thin,
            Some(false)
        );
    }
}
