//! The two CSI identities one binary serves, each on its own socket with its
//! own CSIDriver object:
//!
//! | identity | volumes | transports |
//! | --- | --- | --- |
//! | `pillar-csi.bhyoo.com` ([`Driver::Block`]) | zvols, LVs | NVMe/TCP, iSCSI |
//! | `files.pillar-csi.bhyoo.com` ([`Driver::Files`]) | ZFS filesystems, directories | NFS, node-local bind mounts |
//!
//! A volume belongs to exactly one: the identity that made it is the one
//! whose name its PV carries, so each refuses the other's volumes, classes
//! and publish contexts by name rather than serving them half.
use api::tokens::{Backend, Protocol};

/// The filesystem identity's name (the second CSIDriver object's name).
pub const FILES_DRIVER_NAME: &str = "files.pillar-csi.bhyoo.com";

/// One CSI identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Driver {
    /// Block volumes: `pillar-csi.bhyoo.com`.
    Block,
    /// Filesystem volumes over NFS: `files.pillar-csi.bhyoo.com`.
    Files,
}

impl Driver {
    /// The CSI driver name (GetPluginInfo, the StorageClass provisioner).
    pub fn name(self) -> &'static str {
        match self {
            Driver::Block => api::DRIVER_NAME,
            Driver::Files => FILES_DRIVER_NAME,
        }
    }

    /// The identity that serves volumes of `backend`.
    pub fn of_backend(backend: Backend) -> Self {
        if backend.is_filesystem() {
            Driver::Files
        } else {
            Driver::Block
        }
    }

    /// The identity that serves volumes reached over `protocol`.
    pub fn of_protocol(protocol: Protocol) -> Self {
        match protocol {
            Protocol::Nfs | Protocol::Local => Driver::Files,
            Protocol::NvmeofTcp | Protocol::Iscsi => Driver::Block,
        }
    }

    /// What this identity's volumes are, for refusals.
    pub fn serves(self) -> &'static str {
        match self {
            Driver::Block => "block volumes (zvols and LVs over NVMe/TCP or iSCSI)",
            Driver::Files => {
                "filesystem volumes (ZFS filesystems and directories, over NFS or node-local)"
            }
        }
    }

    /// `Err` naming both identities when `backend` and `protocol` are not
    /// this identity's (`what` names the object that asked for them).
    pub fn check(self, what: &str, backend: Backend, protocol: Protocol) -> Result<(), String> {
        for other in [Driver::of_backend(backend), Driver::of_protocol(protocol)] {
            if other != self {
                return Err(format!(
                    "{what} has backend {backend} and protocol {protocol}, which are served by {} ({}); this is {}, which serves {}",
                    other.name(),
                    other.serves(),
                    self.name(),
                    self.serves()
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn each_backend_and_protocol_belongs_to_one_identity() {
        assert_eq!(Driver::Block.name(), "pillar-csi.bhyoo.com");
        assert_eq!(Driver::Files.name(), "files.pillar-csi.bhyoo.com");
        assert_eq!(
            Driver::Files.check(
                "PillarStorageClass \"x\"",
                Backend::ZfsDataset,
                Protocol::Nfs
            ),
            Ok(())
        );
        assert_eq!(
            Driver::Block.check("x", Backend::LvmLv, Protocol::Iscsi),
            Ok(())
        );
        let e = Driver::Block
            .check(
                "PillarStorageClass \"fs\"",
                Backend::ZfsDataset,
                Protocol::Nfs,
            )
            .unwrap_err();
        assert!(
            e.contains("served by files.pillar-csi.bhyoo.com") && e.contains("\"fs\""),
            "{e}"
        );
        let e = Driver::Files
            .check("x", Backend::ZfsDataset, Protocol::NvmeofTcp)
            .unwrap_err();
        assert!(e.contains("served by pillar-csi.bhyoo.com"), "{e}");
        let e = Driver::Block
            .check("x", Backend::ZfsZvol, Protocol::Nfs)
            .unwrap_err();
        assert!(e.contains("protocol nfs"), "{e}");
    }
}
