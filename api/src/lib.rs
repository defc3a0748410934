//! The shared vocabulary of pillar-csi, without I/O and without the host
//! libraries: what the agent, the CSI controller and node plugin, and other
//! Rust tools agree on. Like kube-rs' `kube-core`.
//!
//! - [`tokens`]: the protocol (`nvmeof-tcp`, `iscsi`) and backend
//!   (`zfs-zvol`, `lvm-lv`) tokens.
//! - [`handle`]: agent volume IDs and the CSI volume handle
//!   `<agent>/<protocol>/<backend>/<agent volume ID>`.
//! - [`names`]: ZFS dataset and LVM VG/LV names and UUIDs, checked.
//! - [`annotations`]: the PVC annotations' values (`import-zvol`,
//!   `import-lv`, `import-lv-policy`) with the spec's refusal messages.
//! - [`crd`] (feature `crd`, on by default): the `pillar-csi.bhyoo.com/v1alpha1`
//!   custom resources as kube-rs types, and their CRD YAML.
//!
//! ```
//! use api::handle::VolumeHandle;
//!
//! let h = VolumeHandle::parse("storage-1/nvmeof-tcp/lvm-lv/data-vg/legacy")?;
//! assert_eq!(h.volume().to_string(), "data-vg/legacy");
//! # Ok::<(), api::handle::InvalidHandle>(())
//! ```

pub mod annotations;
#[cfg(feature = "crd")]
pub mod crd;
pub mod handle;
pub mod names;
pub mod tokens;

/// The CSI driver name, and the prefix of every annotation.
pub const DRIVER_NAME: &str = "pillar-csi.bhyoo.com";

/// The topology key of node-local volumes (PillarProtocol `local`): the
/// node plugin of the files identity reports it with its node's name, and
/// a node-local volume is accessible where it names the agent's node.
pub const TOPOLOGY_NODE_KEY: &str = "topology.files.pillar-csi.bhyoo.com/node";
