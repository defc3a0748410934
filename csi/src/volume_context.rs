//! The volume context: what CreateVolume returns, the PersistentVolume
//! keeps (`spec.csi.volumeAttributes`) and NodeStageVolume receives.
//!
//! | key | value |
//! | --- | --- |
//! | `fsType` | the filesystem the volume resolved to (`ext4`, `xfs`) |
//! | `existingData` | present when the volume held data before pillar-csi served it or was made from another's: `import-zvol`, `import-lv`, `recovery`, `snapshot` or `clone` |
//!
//! A volume marked `existingData` is never formatted by the node, even when
//! libblkid finds no signature on it: raw application data, a wiped or
//! damaged superblock and a signature newer than the node's libblkid all
//! probe blank.
use api::crd::{FsType, PillarVolumeStateSpec};
use std::collections::HashMap;

/// The key of the filesystem type.
pub const FS_TYPE: &str = "fsType";
/// The key that marks a volume holding data from before pillar-csi.
pub const EXISTING_DATA: &str = "existingData";

/// Where a volume's data came from, when not from pillar-csi.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A zvol imported by a `pillar-csi.bhyoo.com/import-zvol` claim.
    ImportZvol,
    /// An LV adopted by a `pillar-csi.bhyoo.com/import-lv` claim.
    ImportLv,
    /// A volume whose record was recovered after a metadata loss.
    Recovery,
    /// A volume restored from a snapshot.
    Snapshot,
    /// A volume cloned from another volume.
    Clone,
}

impl Origin {
    /// The value of [`EXISTING_DATA`].
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::ImportZvol => "import-zvol",
            Origin::ImportLv => "import-lv",
            Origin::Recovery => "recovery",
            Origin::Snapshot => "snapshot",
            Origin::Clone => "clone",
        }
    }

    /// The origin a volume record names, if its data predates pillar-csi.
    pub fn of(spec: &PillarVolumeStateSpec) -> Option<Origin> {
        if spec.recovery.is_some() {
            Some(Origin::Recovery)
        } else if spec.imported_from.is_some() {
            Some(Origin::ImportZvol)
        } else if spec.lvm_source.is_some() {
            Some(Origin::ImportLv)
        } else {
            None
        }
    }
}

/// The volume context of a volume with filesystem `fs_type` (none for a
/// class without one) whose data came from `origin`.
pub fn build(fs_type: Option<FsType>, origin: Option<Origin>) -> HashMap<String, String> {
    let mut context = HashMap::new();
    if let Some(name) = fs_type.and_then(fs_type_name) {
        context.insert(FS_TYPE.to_owned(), name);
    }
    if let Some(origin) = origin {
        context.insert(EXISTING_DATA.to_owned(), origin.as_str().to_owned());
    }
    context
}

/// The token of a filesystem type, as the CRD spells it.
fn fs_type_name(fs_type: FsType) -> Option<String> {
    serde_json::to_value(fs_type)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
}

/// What a NodeStageVolume's context says of existing data: the origin's
/// token, or `None` for a volume pillar-csi made empty. Any non-empty
/// value counts, so a token this node does not know still protects.
pub fn existing_data(context: &HashMap<String, String>) -> Option<String> {
    context
        .get(EXISTING_DATA)
        .filter(|v| !v.is_empty())
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imports_and_recoveries_are_marked_and_read_back() {
        let plain = build(Some(FsType::Xfs), None);
        assert_eq!(plain.get(FS_TYPE).map(String::as_str), Some("xfs"));
        assert_eq!(existing_data(&plain), None);
        for origin in [
            Origin::ImportZvol,
            Origin::ImportLv,
            Origin::Recovery,
            Origin::Snapshot,
            Origin::Clone,
        ] {
            let context = build(None, Some(origin));
            assert_eq!(context.get(FS_TYPE), None);
            assert_eq!(existing_data(&context).as_deref(), Some(origin.as_str()));
        }
        let unknown = HashMap::from([(EXISTING_DATA.to_owned(), "from-the-future".to_owned())]);
        assert_eq!(existing_data(&unknown).as_deref(), Some("from-the-future"));
        let empty = HashMap::from([(EXISTING_DATA.to_owned(), String::new())]);
        assert_eq!(existing_data(&empty), None);
    }
}
