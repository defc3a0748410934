//! The wire contracts of pillar-csi, generated from the `.proto` files in
//! this folder:
//!
//! - `pillar_csi.agent.v1.AgentService`, the storage-node agent. The proto
//!   file documents every RPC and field, and the fencing rules.
//! - `csi.v1`, the Container Storage Interface (spec v1.12.0): the Identity,
//!   Controller, GroupController, SnapshotMetadata and Node services that
//!   kubelet and the CSI sidecars call. `csi/conformance` checks the proto
//!   against the official Go bindings' descriptor (`make test`).
//!
//! And [`tls`], the agent link's mutual TLS for both ends, rebuilt when the
//! certificate files are renewed in place.

pub mod tls;

/// `pillar_csi.agent.v1`: the storage-node agent's service.
#[allow(missing_docs, clippy::all)]
pub mod agent {
    /// Version 1 of the agent's contract.
    pub mod v1 {
        tonic::include_proto!("pillar_csi.agent.v1");
    }
}

/// `csi.v1`: the Container Storage Interface, as kubelet and the CSI sidecars
/// speak it.
#[allow(missing_docs, clippy::all)]
pub mod csi {
    /// CSI spec v1.12.0 (`csi/v1/csi.proto`): messages, and a client and a
    /// server module per service (`identity_server`, `node_client`, ...).
    pub mod v1 {
        tonic::include_proto!("csi.v1");
    }
}
