//! Typed values for the state of the LIO tree, desired or present.
use crate::names::{Iqn, Lun, StorageObjectName, Tpgt};
use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    path::PathBuf,
};

/// A set of LIO objects: what is present, or what should be.
///
/// As a desired state it names only the objects its owner manages:
/// [`Lio::apply`](crate::Lio::apply) leaves every other storage object and
/// target alone. Within a target it names, the target's TPGs, and within a
/// TPG its portals, LUNs and ACLs, are complete: extra ones are removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// iblock storage objects by name (names are unique across the iblock HBAs).
    pub storage_objects: BTreeMap<StorageObjectName, StorageObject>,
    /// iSCSI targets by IQN.
    pub targets: BTreeMap<Iqn, Target>,
}

/// An iblock storage object: one block device the target can serve.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StorageObject {
    /// The block device (`udev_path`), for example `/dev/zvol/tank/pvc-1`.
    pub udev_path: PathBuf,
    /// `readonly`: the target refuses writes to the device.
    pub readonly: bool,
    /// The T10 unit serial (`wwn/vpd_unit_serial`); `None` keeps the kernel's.
    /// Set before the object is exported through a LUN.
    pub unit_serial: Option<String>,
    /// Read back: the HBA index `N` of the `iblock_N` folder the object lives
    /// in. Ignored in a desired state (a new object gets a free index).
    pub hba: Option<u32>,
    /// Read back: `enable`, the device is opened and configured. Ignored in a
    /// desired state (a desired object is always enabled).
    pub enabled: bool,
}

/// An iSCSI target.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Target {
    /// Target portal groups by tag.
    pub tpgs: BTreeMap<Tpgt, Tpg>,
}

/// A target portal group: where and to whom the target's LUNs are served.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tpg {
    /// `enable`: the TPG accepts logins.
    pub enabled: bool,
    /// The TPG's access attributes.
    pub attributes: TpgAttributes,
    /// Network portals the TPG listens on.
    pub portals: BTreeSet<SocketAddr>,
    /// LUNs by number.
    pub luns: BTreeMap<Lun, TpgLun>,
    /// Node ACLs by initiator name.
    pub acls: BTreeMap<Iqn, Acl>,
    /// Read back: LUN folders that exist without their link to a storage
    /// object, left by a crash between the `mkdir` and the `symlink` (or
    /// between the `unlink` and the `rmdir`). They serve nothing; an apply
    /// links a wanted one and removes the others. Empty in a desired state.
    pub unlinked_luns: BTreeSet<Lun>,
}

/// Access attributes of a TPG (`tpgt_N/attrib/...`).
///
/// The default is the safe set targetcli uses: no CHAP required, only
/// initiators with an ACL admitted, demo mode write-protected, no dynamic
/// ACL cache. (The kernel's own default requires CHAP: `authentication=1`.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TpgAttributes {
    /// `authentication`: initiators must authenticate with CHAP.
    pub authentication: bool,
    /// `generate_node_acls`: any initiator may log in (demo mode); ACLs are ignored.
    pub generate_node_acls: bool,
    /// `demo_mode_write_protect`: initiators admitted by demo mode get read-only LUNs.
    pub demo_mode_write_protect: bool,
    /// `cache_dynamic_acls`: keep the ACLs generated in demo mode after logout.
    pub cache_dynamic_acls: bool,
}

impl Default for TpgAttributes {
    fn default() -> Self {
        Self {
            authentication: false,
            generate_node_acls: false,
            demo_mode_write_protect: true,
            cache_dynamic_acls: false,
        }
    }
}

impl TpgAttributes {
    /// Demo mode: any initiator logs in and may write, no CHAP.
    pub fn open() -> Self {
        Self {
            authentication: false,
            generate_node_acls: true,
            demo_mode_write_protect: false,
            cache_dynamic_acls: true,
        }
    }

    pub(crate) fn entries(&self) -> [(&'static str, bool); 4] {
        [
            ("authentication", self.authentication),
            ("generate_node_acls", self.generate_node_acls),
            ("demo_mode_write_protect", self.demo_mode_write_protect),
            ("cache_dynamic_acls", self.cache_dynamic_acls),
        ]
    }
}

/// A LUN of a TPG: a link to a storage object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TpgLun {
    /// The iblock storage object served.
    pub storage_object: StorageObjectName,
    /// Read back: the name of the link in the LUN folder (the kernel takes
    /// any name; rtslib uses random ones). `None` in a desired state: this
    /// crate names its links `storage`.
    pub link: Option<String>,
}

impl TpgLun {
    /// A LUN serving `storage_object`.
    pub fn new(storage_object: StorageObjectName) -> Self {
        Self {
            storage_object,
            link: None,
        }
    }
}

/// A node ACL: one initiator admitted to a TPG, with the LUNs it sees.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Acl {
    /// Mapped LUNs by the number the initiator sees.
    pub mapped_luns: BTreeMap<Lun, MappedLun>,
    /// CHAP credentials the initiator must present (used when the TPG's
    /// `authentication` is on); `None` leaves whatever is set.
    pub chap: Option<Chap>,
    /// Read back: mapped LUN folders without their link to a TPG LUN (a
    /// crash between `mkdir` and `symlink`, or `unlink` and `rmdir`). An
    /// apply links a wanted one and removes the others. Empty in a desired
    /// state.
    pub unlinked_mapped_luns: BTreeSet<Lun>,
}

/// A mapped LUN of a node ACL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappedLun {
    /// The TPG LUN it shows.
    pub tpg_lun: Lun,
    /// `write_protect`: the initiator may only read.
    pub write_protect: bool,
    /// Read back: the name of the link in the mapped LUN folder. `None` in a
    /// desired state: this crate names its links `tpg_lun`.
    pub link: Option<String>,
}

impl MappedLun {
    /// A writable mapping of the TPG LUN `tpg_lun`.
    pub fn new(tpg_lun: Lun) -> Self {
        Self {
            tpg_lun,
            write_protect: false,
            link: None,
        }
    }
}

/// CHAP credentials of a node ACL (`auth/userid`, `auth/password`).
#[derive(Clone, PartialEq, Eq)]
pub struct Chap {
    /// The user ID the initiator presents.
    pub userid: String,
    /// The secret (12 to 16 characters for interoperable initiators; the
    /// kernel allows up to 255).
    pub password: String,
}

impl std::fmt::Debug for Chap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chap")
            .field("userid", &self.userid)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// Objects to remove, with everything that hangs off them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Teardown {
    /// Targets: each TPG disabled, mapped LUNs, ACLs, LUNs and portals
    /// removed, then the TPG and the target.
    pub targets: BTreeSet<Iqn>,
    /// Storage objects: removed once no remaining LUN serves them.
    pub storage_objects: BTreeSet<StorageObjectName>,
}
