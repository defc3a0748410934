//! The pillar-csi storage-node agent.
//!
//! It composes the host libraries (`nvmet`, and the ZFS and LVM backends)
//! into the `pillar_csi.agent.v1.AgentService` gRPC service:
//!
//! - [`fence`]: the fencing rules every mutating request passes first;
//! - [`marks`]: durable fence marks, one file per volume, written atomically;
//! - [`locks`]: one lock per volume ID;
//! - [`backend`] and [`export`]: the small traits behind which storage and
//!   kernel targets live, and the nvmet exporter;
//! - [`adopt`]: import and adoption refusals and the idle check;
//! - [`service`]: the operations, independent of gRPC;
//! - [`recovery`]: the signed evidence of metadata-loss recovery and its rules;
//! - [`crash`]: test-only named crash points (feature `crash-points`);
//!   [`invariants`]: the node's invariants checked over what was read of it;
//! - [`grpc`]: the tonic service; [`error`]: the one mapping to status codes;
//! - [`limits`]: message size, requests in flight and deadlines of the server;
//! - [`config`] and [`server`]: configuration, start-up reconciliation,
//!   periodic resync and serving with mTLS.

pub mod adopt;
pub mod backend;
pub mod config;
pub mod crash;
pub mod durable;
pub mod error;
pub mod export;
pub mod fence;
pub mod grpc;
pub mod imported_keys;
pub mod invariants;
pub mod limits;
pub mod locks;
pub mod marks;
pub mod recovery;
pub mod sealed_key;
pub mod server;
pub mod service;
pub mod snapshot_id;
pub mod tls;
pub mod volume;

#[cfg(test)]
mod docs_tests;
#[cfg(test)]
mod server_tests;
