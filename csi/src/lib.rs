//! The CSI layer of pillar-csi: what kubelet and the CSI sidecars call.
//!
//! - [`controller`]: the Controller service (volumes recorded as
//!   PillarVolumeState objects, made by agents over mTLS).
//! - [`node_id`]: the node ID that NodeGetInfo reports and
//!   ControllerPublishVolume receives, carrying the node's initiator names.
//! - [`publish_context`]: what ControllerPublishVolume hands to
//!   NodeStageVolume (where to connect, which namespace or LUN).

pub mod controller;
pub mod node_id;
pub mod publish_context;
