//! What the controller offers: its RPC capabilities and the volume
//! capabilities (access modes, access types) it accepts, for each identity.
use crate::driver::Driver;
use pillar_csi_proto::csi::v1::{
    controller_service_capability::{self, rpc::Type as Rpc},
    volume_capability::{access_mode::Mode, AccessType},
    ControllerServiceCapability, VolumeCapability,
};

/// The Controller RPCs the block identity serves, as
/// ControllerGetCapabilities reports them.
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

/// The Controller RPCs the filesystem identity serves: the first six of
/// [`RPCS`], the volumes' own (no snapshots or clones of filesystem
/// volumes yet).
pub const FILES_RPCS: &[Rpc] = RPCS.split_at(6).0;

/// The RPCs `driver` serves.
pub fn rpcs(driver: Driver) -> &'static [Rpc] {
    match driver {
        Driver::Block => &RPCS,
        Driver::Files => FILES_RPCS,
    }
}

/// [`rpcs`] as CSI messages.
pub fn controller_capabilities(driver: Driver) -> Vec<ControllerServiceCapability> {
    rpcs(driver)
        .iter()
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

/// The filesystem types a filesystem volume's capability may name (none,
/// or what it is).
pub const NFS_FS_TYPES: [&str; 3] = ["", "nfs", "nfs4"];

/// Checks one capability for `driver`; the error says what is not
/// supported.
pub fn check(driver: Driver, cap: &VolumeCapability) -> Result<(), String> {
    let mode = cap
        .access_mode
        .as_ref()
        .map(|m| Mode::try_from(m.mode).unwrap_or(Mode::Unknown))
        .ok_or("a volume capability has no access mode")?;
    if driver == Driver::Files {
        return check_files(mode, cap);
    }
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

/// A filesystem volume over NFS: every access mode (many nodes may mount
/// one export), mount access only.
fn check_files(mode: Mode, cap: &VolumeCapability) -> Result<(), String> {
    if mode == Mode::Unknown {
        return Err("access mode UNKNOWN is not supported".into());
    }
    match &cap.access_type {
        Some(AccessType::Mount(m)) if NFS_FS_TYPES.contains(&m.fs_type.as_str()) => Ok(()),
        Some(AccessType::Mount(m)) => Err(format!(
            "filesystem {:?} is not supported: a filesystem volume is mounted over NFS (leave fsType empty)",
            m.fs_type
        )),
        Some(AccessType::Block(_)) => Err(
            "block access is not supported: a filesystem volume is mounted over NFS, never a raw block device".into(),
        ),
        None => Err("a volume capability has neither block nor mount access".into()),
    }
}

/// Checks every capability of a request for `driver` (at least one is
/// required).
pub fn check_all(driver: Driver, caps: &[VolumeCapability]) -> Result<(), String> {
    if caps.is_empty() {
        return Err("volume capabilities are missing".into());
    }
    caps.iter().try_for_each(|c| check(driver, c))
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
            let block = |c| check(Driver::Block, &c);
            assert_eq!(block(cap(mode, AccessType::Block(BlockVolume {}))), Ok(()));
            assert_eq!(block(cap(mode, mount("xfs"))), Ok(()));
            assert_eq!(block(cap(mode, mount(""))), Ok(()));
        }
    }

    #[test]
    fn multi_node_modes_and_other_filesystems_are_refused_by_name() {
        let block = |c| check(Driver::Block, &c);
        let e = block(cap(Mode::MultiNodeMultiWriter, mount("ext4"))).unwrap_err();
        assert!(e.contains("MULTI_NODE_MULTI_WRITER"), "{e}");
        let e = block(cap(Mode::SingleNodeWriter, mount("btrfs"))).unwrap_err();
        assert!(e.contains("\"btrfs\""), "{e}");
        assert!(check_all(Driver::Block, &[])
            .unwrap_err()
            .contains("missing"));
    }

    #[test]
    fn filesystem_volumes_take_every_mode_and_only_nfs_mounts() {
        let files = |c| check(Driver::Files, &c);
        for mode in [
            Mode::MultiNodeMultiWriter,
            Mode::MultiNodeReaderOnly,
            Mode::SingleNodeWriter,
        ] {
            assert_eq!(files(cap(mode, mount(""))), Ok(()));
            assert_eq!(files(cap(mode, mount("nfs"))), Ok(()));
        }
        let e = files(cap(Mode::MultiNodeMultiWriter, mount("ext4"))).unwrap_err();
        assert!(e.contains("over NFS"), "{e}");
        let e = files(cap(
            Mode::SingleNodeWriter,
            AccessType::Block(BlockVolume {}),
        ))
        .unwrap_err();
        assert!(e.contains("never a raw block device"), "{e}");
        assert!(files(cap(Mode::Unknown, mount(""))).is_err());
    }

    #[test]
    fn the_capability_tables_list_each_rpc_once() {
        for driver in [Driver::Block, Driver::Files] {
            let caps = controller_capabilities(driver);
            let seen: std::collections::HashSet<i32> =
                rpcs(driver).iter().map(|r| *r as i32).collect();
            assert_eq!((caps.len(), seen.len()), (rpcs(driver).len(), caps.len()));
        }
        assert!(!FILES_RPCS.contains(&Rpc::CreateDeleteSnapshot));
    }
}
