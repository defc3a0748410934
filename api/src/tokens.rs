//! The protocol and backend tokens: the words volume handles, publish
//! contexts, PillarVolumeState (`spec.protocolType`, `spec.backendType`) and
//! users' scripts carry.
//!
//! | token | meaning |
//! | --- | --- |
//! | `nvmeof-tcp` | NVMe over Fabrics, TCP transport ([`Protocol::NvmeofTcp`]) |
//! | `iscsi` | iSCSI ([`Protocol::Iscsi`]) |
//! | `nfs` | NFS, the kernel's server ([`Protocol::Nfs`]) |
//! | `local` | a bind mount on the storage node itself ([`Protocol::Local`]) |
//! | `zfs-zvol` | a ZFS volume ([`Backend::ZfsZvol`]) |
//! | `lvm-lv` | an LVM logical volume, linear or thin ([`Backend::LvmLv`]) |
//! | `zfs-dataset` | a ZFS filesystem bounded by its refquota ([`Backend::ZfsDataset`]) |
//! | `directory` | a directory on XFS bounded by a project quota ([`Backend::Directory`]) |

use std::fmt;

/// How a node reaches a volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "crd",
    derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)
)]
pub enum Protocol {
    /// NVMe over Fabrics, TCP transport.
    #[cfg_attr(feature = "crd", serde(rename = "nvmeof-tcp"))]
    NvmeofTcp,
    /// iSCSI.
    #[cfg_attr(feature = "crd", serde(rename = "iscsi"))]
    Iscsi,
    /// NFS: a filesystem volume exported by the kernel's NFS server.
    #[cfg_attr(feature = "crd", serde(rename = "nfs"))]
    Nfs,
    /// A node-local filesystem volume: a directory of an agent on a node
    /// that runs pods, bind-mounted by that node only.
    #[cfg_attr(feature = "crd", serde(rename = "local"))]
    Local,
}

impl Protocol {
    /// Every protocol, in token order.
    pub const ALL: [Protocol; 4] = [
        Protocol::NvmeofTcp,
        Protocol::Iscsi,
        Protocol::Nfs,
        Protocol::Local,
    ];

    /// The token used in publish contexts and volume handles.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::NvmeofTcp => "nvmeof-tcp",
            Protocol::Iscsi => "iscsi",
            Protocol::Nfs => "nfs",
            Protocol::Local => "local",
        }
    }

    /// Parses a token written by [`Protocol::as_str`] (exactly as spelled).
    pub fn parse(token: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == token)
    }

    /// Whether this protocol serves filesystem volumes (NFS, local) rather
    /// than block devices.
    pub fn is_filesystem(self) -> bool {
        matches!(self, Protocol::Nfs | Protocol::Local)
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What kind of storage object holds a volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "crd",
    derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema)
)]
pub enum Backend {
    /// A ZFS volume; its agent volume ID is the dataset name.
    #[cfg_attr(feature = "crd", serde(rename = "zfs-zvol"))]
    ZfsZvol,
    /// An LVM logical volume; its agent volume ID is `<vg>/<lv>`.
    #[cfg_attr(feature = "crd", serde(rename = "lvm-lv"))]
    LvmLv,
    /// A ZFS filesystem whose refquota is the volume's capacity; its agent
    /// volume ID is `<pool>/<name>`, as a zvol's.
    #[cfg_attr(feature = "crd", serde(rename = "zfs-dataset"))]
    ZfsDataset,
    /// A directory on an agent's XFS whose project quota is the volume's
    /// capacity; its agent volume ID is `<backend name>/<name>`.
    #[cfg_attr(feature = "crd", serde(rename = "directory"))]
    Directory,
}

impl Backend {
    /// Every backend, in token order.
    pub const ALL: [Backend; 4] = [
        Backend::ZfsZvol,
        Backend::LvmLv,
        Backend::ZfsDataset,
        Backend::Directory,
    ];

    /// The token used in volume handles.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::ZfsZvol => "zfs-zvol",
            Backend::LvmLv => "lvm-lv",
            Backend::ZfsDataset => "zfs-dataset",
            Backend::Directory => "directory",
        }
    }

    /// Whether volumes of this backend are filesystems (served over NFS,
    /// under the files identity) rather than block devices.
    pub fn is_filesystem(self) -> bool {
        matches!(self, Backend::ZfsDataset | Backend::Directory)
    }

    /// Parses a token written by [`Backend::as_str`] (exactly as spelled).
    pub fn parse(token: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|b| b.as_str() == token)
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_unknown_ones_are_refused() {
        for p in Protocol::ALL {
            assert_eq!(Protocol::parse(p.as_str()), Some(p));
        }
        for b in Backend::ALL {
            assert_eq!(Backend::parse(&b.to_string()), Some(b));
        }
        assert_eq!(Protocol::parse("NVMEOF-TCP"), None);
        assert_eq!(Protocol::parse("NFS"), None);
        assert!(Backend::ZfsDataset.is_filesystem() && !Backend::ZfsZvol.is_filesystem());
        assert_eq!(Backend::parse("zfs"), None);
        assert_eq!(Backend::parse(""), None);
    }
}
