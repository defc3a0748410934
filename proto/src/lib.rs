//! The wire contracts of pillar-csi, generated from the `.proto` files in
//! this folder: `pillar_csi.agent.v1.AgentService`, the storage-node agent.
//! The proto file documents every RPC and field, and the fencing rules.

/// `pillar_csi.agent.v1`: the storage-node agent's service.
#[allow(missing_docs, clippy::all)]
pub mod agent {
    /// Version 1 of the agent's contract.
    pub mod v1 {
        tonic::include_proto!("pillar_csi.agent.v1");
    }
}
