//! The PVC annotations' values, checked by one set of pure functions that
//! the agent and the CSI controller both use.
//!
//! - `pillar-csi.bhyoo.com/import-zvol`: a full ZFS dataset name
//!   `<pool>[/<parent>]/<name>` ([`parse_import_zvol`]); the messages are the
//!   controller-side rows of `spec/import-zvol.md`'s Refusals table.
//! - `pillar-csi.bhyoo.com/import-lv`: `<vg>/<lv>:<vg_uuid>:<lv_uuid>`
//!   ([`parse_import_lv`]).
//! - `pillar-csi.bhyoo.com/import-lv-policy`: `PreserveOriginal` (the
//!   default when absent) or `Managed`, case-sensitive ([`parse_import_lv_policy`]).
//! - `pillar-csi.bhyoo.com/import-directory`: an absolute path on a storage
//!   node ([`parse_import_directory`]).
//!
//! Name rules are not repeated here: datasets are checked by
//! [`crate::names::zfs::check_dataset_name`], VG and LV names by
//! [`crate::names::lvm::check_name`] and UUIDs by
//! [`crate::names::lvm::LvmUuid`].
use crate::names::lvm::{LvName, LvmUuid, VgName};
use crate::names::zfs::{check_dataset_name, DatasetName, NameRule};
use std::fmt;

/// The annotation naming a zvol to import.
pub const IMPORT_ZVOL_ANNOTATION: &str = "pillar-csi.bhyoo.com/import-zvol";
/// The annotation naming a ZFS filesystem to adopt (the
/// `files.pillar-csi.bhyoo.com` driver's).
pub const IMPORT_ZFS_DATASET_ANNOTATION: &str = "pillar-csi.bhyoo.com/import-zfs-dataset";
/// The annotation naming an existing directory to adopt (the
/// `files.pillar-csi.bhyoo.com` driver's).
pub const IMPORT_DIRECTORY_ANNOTATION: &str = "pillar-csi.bhyoo.com/import-directory";
/// The annotation naming an LV to adopt, with its UUIDs.
pub const IMPORT_LV_ANNOTATION: &str = "pillar-csi.bhyoo.com/import-lv";
/// The annotation choosing the adopted LV's policy.
pub const IMPORT_LV_POLICY_ANNOTATION: &str = "pillar-csi.bhyoo.com/import-lv-policy";
/// The annotation naming the Secret (in the claim's namespace) that holds
/// the key of the encrypted zvol a claim imports, read by the
/// external-provisioner for a class with `importKeys` (see
/// [`crate::crd::PillarStorageClassSpec::import_keys`]).
pub const IMPORT_KEY_SECRET_ANNOTATION: &str = "pillar-csi.bhyoo.com/import-key-secret";
/// The PillarVolumeState annotation holding a metadata-loss recovery's
/// agent-signed RecoverySnapshot (deterministic protobuf, base64).
pub const RECOVERY_SNAPSHOT_ANNOTATION: &str = "pillar-csi.bhyoo.com/recovery-snapshot";

const ZVOL_FORM: &str = "\"<pool>[/<parent>]/<name>\"";
const LV_FORM: &str = "\"<vg>/<lv>:<vg_uuid>:<lv_uuid>\"";

/// A value of an adoption annotation that cannot be used; its text is the
/// refusal message the spec prints.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidAnnotation(pub String);

/// Checks an `import-zvol` value: a dataset below a pool, every component
/// a ZFS name. Returns the dataset, or the spec's message for the first rule
/// broken (the value is quoted in the message).
pub fn parse_import_zvol(value: &str) -> Result<DatasetName, InvalidAnnotation> {
    parse_dataset(IMPORT_ZVOL_ANNOTATION, value)
}

/// Checks an `import-zfs-dataset` value by the rules of
/// [`parse_import_zvol`], its messages naming that annotation.
pub fn parse_import_zfs_dataset(value: &str) -> Result<DatasetName, InvalidAnnotation> {
    parse_dataset(IMPORT_ZFS_DATASET_ANNOTATION, value)
}

/// A dataset below a pool named by the annotation `a`.
fn parse_dataset(a: &str, value: &str) -> Result<DatasetName, InvalidAnnotation> {
    if value.is_empty() {
        return Err(InvalidAnnotation(format!(
            "unsupported PVC annotation {a:?}: value must name a ZFS dataset as {ZVOL_FORM}, got empty"
        )));
    }
    if !value.contains('/') || value.starts_with('/') || value.ends_with('/') {
        return Err(InvalidAnnotation(format!(
            "{a} must name a ZFS dataset as {ZVOL_FORM}, got {value:?}"
        )));
    }
    match check_dataset_name(value) {
        Ok(()) => DatasetName::new(value)
            .map_err(|e| InvalidAnnotation(format!("{a} dataset {value:?}: {}", e.rule))),
        Err(NameRule::LeadingOrTrailingSlash | NameRule::Empty | NameRule::NotBelowPool) => {
            Err(InvalidAnnotation(format!(
                "{a} must name a ZFS dataset as {ZVOL_FORM}, got {value:?}"
            )))
        }
        Err(rule) => Err(InvalidAnnotation(format!("{a} dataset {value:?}: {rule}"))),
    }
}

/// The longest path an `import-directory` value may be (`PATH_MAX` less
/// its terminating NUL).
const PATH_MAX: usize = 4095;

/// An `import-directory` value: an absolute path in its plain form (no
/// `.` or `..` component, no empty one, no trailing slash).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DirectoryPath(String);

impl DirectoryPath {
    /// The path as the annotation gave it.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The folder that holds the directory (`/` for a top-level one).
    pub fn parent(&self) -> &str {
        match self.0.rfind('/') {
            Some(0) | None => "/",
            Some(i) => &self.0[..i],
        }
    }

    /// The directory's own name, its last component.
    pub fn name(&self) -> &str {
        self.0.rsplit('/').next().unwrap_or_default()
    }
}

impl fmt::Display for DirectoryPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Checks an `import-directory` value: an absolute path in its plain
/// form, with no control character, at most 4095 bytes.
pub fn parse_import_directory(value: &str) -> Result<DirectoryPath, InvalidAnnotation> {
    let a = IMPORT_DIRECTORY_ANNOTATION;
    let form = "an absolute path \"/<folder>/<name>\"";
    if !value.starts_with('/') || value == "/" {
        return Err(InvalidAnnotation(format!(
            "{a} must name a directory as {form}, got {value:?}"
        )));
    }
    if value.len() > PATH_MAX {
        return Err(InvalidAnnotation(format!(
            "{a} path is {} bytes long, more than the {PATH_MAX} a path may be",
            value.len()
        )));
    }
    if value.chars().any(char::is_control) {
        return Err(InvalidAnnotation(format!(
            "{a} path {value:?} holds a control character"
        )));
    }
    if let Some(c) = value[1..]
        .split('/')
        .find(|c| c.is_empty() || *c == "." || *c == "..")
    {
        return Err(InvalidAnnotation(format!(
            "{a} path {value:?} has the component {c:?}; write the path plainly, with no empty, \".\" or \"..\" component and no trailing slash"
        )));
    }
    Ok(DirectoryPath(value.to_owned()))
}

/// The identity an `import-lv` value pins: names and UUIDs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LvIdentity {
    /// The volume group.
    pub vg: VgName,
    /// The logical volume.
    pub lv: LvName,
    /// The volume group's UUID.
    pub vg_uuid: LvmUuid,
    /// The logical volume's UUID.
    pub lv_uuid: LvmUuid,
}

impl fmt::Display for LvIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}:{}:{}",
            self.vg, self.lv, self.vg_uuid, self.lv_uuid
        )
    }
}

/// Checks an `import-lv` value `<vg>/<lv>:<vg_uuid>:<lv_uuid>`. LVM names
/// never contain `:` or `/`, so the value splits in exactly one way.
pub fn parse_import_lv(value: &str) -> Result<LvIdentity, InvalidAnnotation> {
    let a = IMPORT_LV_ANNOTATION;
    if value.is_empty() {
        return Err(InvalidAnnotation(format!(
            "unsupported PVC annotation {a:?}: value must name a logical volume as {LV_FORM}, got empty"
        )));
    }
    let form = || {
        InvalidAnnotation(format!(
            "{a} must name a logical volume as {LV_FORM}, got {value:?}"
        ))
    };
    let parts: Vec<&str> = value.split(':').collect();
    let [path, vg_uuid, lv_uuid] = parts.as_slice() else {
        return Err(form());
    };
    let Some((vg, lv)) = path.split_once('/') else {
        return Err(form());
    };
    let bad = |what: String| InvalidAnnotation(format!("{a} value {value:?}: {what}"));
    Ok(LvIdentity {
        vg: VgName::new(vg).map_err(|e| bad(e.to_string()))?,
        lv: LvName::new(lv).map_err(|e| bad(e.to_string()))?,
        vg_uuid: LvmUuid::new(vg_uuid).map_err(|e| bad(format!("VG UUID: {e}")))?,
        lv_uuid: LvmUuid::new(lv_uuid).map_err(|e| bad(format!("LV UUID: {e}")))?,
    })
}

/// What happens to an adopted LV after the import.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LvPolicy {
    /// The driver never deletes, resizes, formats or checks the LV (the default).
    #[default]
    PreserveOriginal,
    /// The LV becomes an ordinary volume, which DeleteVolume destroys.
    Managed,
}

impl LvPolicy {
    /// The annotation's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            LvPolicy::PreserveOriginal => "PreserveOriginal",
            LvPolicy::Managed => "Managed",
        }
    }

    /// Whether the original LV is preserved.
    pub fn preserves(self) -> bool {
        self == LvPolicy::PreserveOriginal
    }
}

impl fmt::Display for LvPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Checks an `import-lv-policy` value: absent is `PreserveOriginal`;
/// `PreserveOriginal` and `Managed` are accepted exactly as spelled; anything
/// else (another case, an empty value, spaces) is refused.
pub fn parse_import_lv_policy(value: Option<&str>) -> Result<LvPolicy, InvalidAnnotation> {
    match value {
        None | Some("PreserveOriginal") => Ok(LvPolicy::PreserveOriginal),
        Some("Managed") => Ok(LvPolicy::Managed),
        Some(other) => Err(InvalidAnnotation(format!(
            "{IMPORT_LV_POLICY_ANNOTATION} must be \"PreserveOriginal\" or \"Managed\" (case-sensitive), got {other:?}"
        ))),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const VG_UUID: &str = "Xk3pQm-1aB2-c3D4-e5F6-g7H8-i9J0-Kl1mNo";
    const LV_UUID: &str = "Rt7uVw-2cD3-e4F5-g6H7-i8J9-k0L1-Mn2oPq";

    #[test]
    fn directory_values_are_plain_absolute_paths() {
        let ok = parse_import_directory("/srv/share/media").unwrap();
        assert_eq!((ok.parent(), ok.name()), ("/srv/share", "media"));
        let top = parse_import_directory("/media").unwrap();
        assert_eq!((top.parent(), top.name()), ("/", "media"));
        let a = IMPORT_DIRECTORY_ANNOTATION;
        for v in ["", "/", "srv/media", "./srv"] {
            assert_eq!(
                parse_import_directory(v).unwrap_err().0,
                format!(
                    "{a} must name a directory as an absolute path \"/<folder>/<name>\", got {v:?}"
                )
            );
        }
        for (v, c) in [
            ("/srv/media/", ""),
            ("/srv//media", ""),
            ("/srv/./media", "."),
            ("/srv/../etc", ".."),
        ] {
            let e = parse_import_directory(v).unwrap_err().0;
            assert!(
                e.starts_with(&format!("{a} path {v:?} has the component {c:?}")),
                "{e}"
            );
        }
        let e = parse_import_directory("/srv/a\nb").unwrap_err().0;
        assert!(e.ends_with("holds a control character"), "{e}");
        let long = format!("/{}", "x".repeat(PATH_MAX));
        let e = parse_import_directory(&long).unwrap_err().0;
        assert!(e.contains("4096 bytes long, more than the 4095"), "{e}");
    }

    fn zvol_err(v: &str) -> String {
        parse_import_zvol(v).unwrap_err().0
    }

    #[test]
    fn zvol_values_follow_the_spec_messages() {
        let ok = parse_import_zvol("hot-data/k8s/pvc-0d52:x_y.z").unwrap();
        assert_eq!(ok.as_str(), "hot-data/k8s/pvc-0d52:x_y.z");
        assert_eq!(
            parse_import_zvol("hot-data/pvc-1").unwrap().pool(),
            "hot-data"
        );

        assert_eq!(
            zvol_err(""),
            "unsupported PVC annotation \"pillar-csi.bhyoo.com/import-zvol\": value must name a ZFS dataset as \"<pool>[/<parent>]/<name>\", got empty"
        );
        for v in ["hot-data", "/hot-data/x", "hot-data/x/"] {
            assert_eq!(
                zvol_err(v),
                format!("pillar-csi.bhyoo.com/import-zvol must name a ZFS dataset as \"<pool>[/<parent>]/<name>\", got {v:?}")
            );
        }
        assert_eq!(
            zvol_err("hot-data//x"),
            "pillar-csi.bhyoo.com/import-zvol dataset \"hot-data//x\": empty dataset component"
        );
        assert_eq!(
            zvol_err("hot-data/../x"),
            "pillar-csi.bhyoo.com/import-zvol dataset \"hot-data/../x\": dataset component \"..\" is not a name"
        );
        assert!(zvol_err("hot-data/./x").ends_with("dataset component \".\" is not a name"));
        for (v, c) in [
            ("hot-data/x@snap", '@'),
            ("hot-data/x#b", '#'),
            ("hot-data/a b", ' '),
            ("hot-data/é", 'é'),
        ] {
            let e = zvol_err(v);
            assert!(
                e.starts_with(&format!(
                    "pillar-csi.bhyoo.com/import-zvol dataset {v:?}: dataset component "
                )),
                "{e}"
            );
            assert!(
                e.ends_with(&format!("contains invalid character {c:?}")),
                "{e}"
            );
        }
        assert!(zvol_err(&format!("p/{}", "a".repeat(300))).contains("ZFS allows at most"));
    }

    #[test]
    fn lv_values_split_into_names_and_uuids() {
        let id = parse_import_lv(&format!("data-vg/legacy:{VG_UUID}:{LV_UUID}")).unwrap();
        assert_eq!(id.vg.as_str(), "data-vg");
        assert_eq!(id.lv.as_str(), "legacy");
        assert_eq!(id.vg_uuid.as_str(), VG_UUID);
        assert_eq!(id.lv_uuid.as_str(), LV_UUID);
        assert_eq!(
            id.to_string(),
            format!("data-vg/legacy:{VG_UUID}:{LV_UUID}")
        );
    }

    #[test]
    fn malformed_lv_values_are_refused_naming_the_part() {
        let form = |v: &str| {
            format!("pillar-csi.bhyoo.com/import-lv must name a logical volume as \"<vg>/<lv>:<vg_uuid>:<lv_uuid>\", got {v:?}")
        };
        assert!(parse_import_lv("").unwrap_err().0.ends_with("got empty"));
        for v in [
            "data-vg/legacy".to_owned(),
            format!("data-vg/legacy:{VG_UUID}"),
            format!("data-vg/legacy:{VG_UUID}:{LV_UUID}:x"),
            format!("legacy:{VG_UUID}:{LV_UUID}"),
        ] {
            assert_eq!(parse_import_lv(&v).unwrap_err().0, form(&v));
        }
        let e = parse_import_lv(&format!("data-vg/a/b:{VG_UUID}:{LV_UUID}"))
            .unwrap_err()
            .0;
        assert!(e.contains("invalid LV name \"a/b\""), "{e}");
        let e = parse_import_lv(&format!("-vg/lv:{VG_UUID}:{LV_UUID}"))
            .unwrap_err()
            .0;
        assert!(e.contains("invalid VG name"), "{e}");
        let e = parse_import_lv(&format!("vg/lv_tmeta:{VG_UUID}:{LV_UUID}"))
            .unwrap_err()
            .0;
        assert!(e.contains("reserved"), "{e}");
        let e = parse_import_lv(&format!("vg/lv:{VG_UUID}:short"))
            .unwrap_err()
            .0;
        assert!(e.contains("LV UUID: invalid LVM UUID \"short\""), "{e}");
        let e = parse_import_lv(&format!("vg/lv:x-y:{LV_UUID}"))
            .unwrap_err()
            .0;
        assert!(e.contains("VG UUID"), "{e}");
    }

    #[test]
    fn the_policy_is_preserve_by_default_and_case_sensitive() {
        assert_eq!(parse_import_lv_policy(None), Ok(LvPolicy::PreserveOriginal));
        assert_eq!(
            parse_import_lv_policy(Some("PreserveOriginal")),
            Ok(LvPolicy::PreserveOriginal)
        );
        assert_eq!(
            parse_import_lv_policy(Some("Managed")),
            Ok(LvPolicy::Managed)
        );
        for v in [
            "managed",
            "MANAGED",
            "preserveoriginal",
            "",
            " Managed",
            "Delete",
        ] {
            let e = parse_import_lv_policy(Some(v)).unwrap_err().0;
            assert_eq!(
                e,
                format!("pillar-csi.bhyoo.com/import-lv-policy must be \"PreserveOriginal\" or \"Managed\" (case-sensitive), got {v:?}")
            );
        }
        assert!(LvPolicy::default().preserves());
        assert!(!LvPolicy::Managed.preserves());
    }
}
