//! What the controller offers: its RPC capabilities and the volume
//! capabilities (access modes, access types) it accepts.
use pillar_csi_proto::csi::v1::{
    controller_service_capability::{self, rpc::Type as Rpc},
    volume_capability::{access_mode::Mode, AccessType},
    ControllerServiceCapability, VolumeCapability,
};

/// The Controller RPCs this controller serves, as ControllerGetCapabilities
/// reports them.
pub const RPCS: [Rpc; 9] = [
    Rpc::CreateDeleteVolume,
    Rpc::PublishUnpublishVolume,
    Rpc::ListVolumes,
    Rpc::GetCapacity,
    Rpc::ExpandVolume,
    Rpc::ListVolumesPublishedNodes,
    Rpc::CreateDeleteSnapshot,
    Rpc::ListSnapshots,
    Rpc::CloneVolume,
];

/// [`RPCS`] as CSI messages.
pub fn controller_capabilities() -> Vec<ControllerServiceCapability> {
    RPCS.iter()
        .map(|&rpc| ControllerServiceCapability {
            r#type: Some(controller_service_capability::Type::Rpc(
                controller_service_capability::Rpc { r#type: rpc as i32 },
            )),
        })
        .collect()
}

/// The filesystems the node plugin formats.
pub const FS_TYPES: [&str; 2] = ["ext4", "xfs"];

/// Whether an access mode lets one node at most use the volume. Every mode
/// this driver accepts is single-node: a block device written from two
/// nodes is corrupted by any local filesystem.
pub fn single_node(mode: Mode) -> bool {
    matches!(
        mode,
        Mode::SingleNodeWriter
            | Mode::SingleNodeReaderOnly
            | Mode::SingleNodeSingleWriter
            | Mode::SingleNodeMultiWriter
    )
}

/// Checks one capability; the error says what is not supported.
pub fn check(cap: &VolumeCapability) -> Result<(), String> {
    let mode = cap
        .access_mode
        .as_ref()
        .map(|m| Mode::try_from(m.mode).unwrap_or(Mode::Unknown))
        .ok_or("a volume capability has no access mode")?;
    if !single_node(mode) {
        return Err(format!(
            "access mode {} is not supported: volumes are block devices served to one node at a time",
            mode.as_str_name()
        ));
    }
    match &cap.access_type {
        Some(AccessType::Block(_)) => Ok(()),
        Some(AccessType::Mount(m)) => {
            if m.fs_type.is_empty() || FS_TYPES.contains(&m.fs_type.as_str()) {
                Ok(())
            } else {
                Err(format!(
                    "filesystem {:?} is not supported (ext4 or xfs)",
                    m.fs_type
                ))
            }
        }
        None => Err("a volume capability has neither block nor mount access".into()),
    }
}

/// Checks every capability of a request (at least one is required).
pub fn check_all(caps: &[VolumeCapability]) -> Result<(), String> {
    if caps.is_empty() {
        return Err("volume capabilities are missing".into());
    }
    caps.iter().try_for_each(check)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use pillar_csi_proto::csi::v1::volume_capability::{AccessMode, BlockVolume, MountVolume};

    fn cap(mode: Mode, access: AccessType) -> VolumeCapability {
        VolumeCapability {
            access_mode: Some(AccessMode { mode: mode as i32 }),
            access_type: Some(access),
        }
    }

    fn mount(fs: &str) -> AccessType {
        AccessType::Mount(MountVolume {
            fs_type: fs.into(),
            ..Default::default()
        })
    }

    #[test]
    fn single_node_block_and_ext4_xfs_mounts_are_accepted() {
        for mode in [Mode::SingleNodeWriter, Mode::SingleNodeMultiWriter] {
            assert_eq!(check(&cap(mode, AccessType::Block(BlockVolume {}))), Ok(()));
            assert_eq!(check(&cap(mode, mount("xfs"))), Ok(()));
            assert_eq!(check(&cap(mode, mount(""))), Ok(()));
        }
    }

    #[test]
    fn multi_node_modes_and_other_filesystems_are_refused_by_name() {
        let e = check(&cap(Mode::MultiNodeMultiWriter, mount("ext4"))).unwrap_err();
        assert!(e.contains("MULTI_NODE_MULTI_WRITER"), "{e}");
        let e = check(&cap(Mode::SingleNodeWriter, mount("btrfs"))).unwrap_err();
        assert!(e.contains("\"btrfs\""), "{e}");
        assert!(check_all(&[]).unwrap_err().contains("missing"));
    }

    #[test]
    fn the_capability_table_lists_each_rpc_once() {
        let caps = controller_capabilities();
        assert_eq!(caps.len(), RPCS.len());
    }
}
