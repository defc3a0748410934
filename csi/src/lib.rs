//! The CSI layer of pillar-csi: what kubelet and the CSI sidecars call.
//!
//! - [`controller`]: the Controller service (volumes recorded as
//!   PillarVolumeState objects, made by agents over mTLS).
//! - [`driver`]: the two CSI identities (block volumes, and filesystem
//!   volumes over NFS) and which volumes each serves.
//! - [`node_id`]: the node ID that NodeGetInfo reports and
//!   ControllerPublishVolume receives, carrying the node's initiator names.
//! - [`publish_context`]: what ControllerPublishVolume hands to
//!   NodeStageVolume (where to connect, which namespace or LUN).
//! - [`identity`]: the Identity service (driver name, capabilities, Probe).
//! - [`node`]: the Node service (attach, format blank devices, mount,
//!   publish, expand, stats).
//! - [`endpoint`]: serving on kubelet's unix socket.
//! - [`reconcile`]: the controller's reconcilers (StorageClasses, agent
//!   health, export resync, the abandoned-volume reaper) and leader election.
//! - [`metrics`]: the controller's Prometheus metrics and `/metrics`.
//! - [`volume_context`]: what CreateVolume hands, through the PV, to
//!   NodeStageVolume (the filesystem type, and whether the volume holds
//!   data from before pillar-csi).

pub mod controller;
pub mod driver;
pub mod endpoint;
pub mod identity;
pub mod metrics;
pub mod node;
pub mod node_id;
pub mod publish_context;
pub mod reconcile;
pub mod volume_context;
