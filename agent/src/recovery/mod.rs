//! Metadata-loss recovery's evidence: the agent's signed RecoverySnapshot,
//! the operator's signed RecoveryAuthorization, and the rules a transfer
//! checks them against. Pure: no lock, no mark, no device (the service's
//! `recovery.rs` does those).
//!
//! Digests and signatures are over the deterministic protobuf encoding with
//! `signature` cleared. prost encodes fields in field-number order and
//! neither message has a map, so the bytes are the ones Go's
//! `proto.MarshalOptions{Deterministic: true}` produces.
pub mod json;
pub mod keys;
pub mod rules;

pub use keys::{KeyError, PrivateSigner, PublicKey, ServerSigner, TrustAnchor};
use pillar_csi_proto::agent::v1 as pb;
use prost::Message;

/// Recovery as configured at start: the operator keys and the snapshot signer.
#[derive(Debug, Clone)]
pub struct Recovery {
    /// Keys that may sign grants.
    pub anchor: TrustAnchor,
    /// The server TLS identity that signs snapshots.
    pub signer: ServerSigner,
}

/// The bytes a snapshot's digest and signature cover.
pub fn snapshot_bytes(snapshot: &pb::RecoverySnapshot) -> Vec<u8> {
    let mut unsigned = snapshot.clone();
    unsigned.signature.clear();
    unsigned.encode_to_vec()
}

/// The bytes an authorization's digest and signature cover.
pub fn authorization_bytes(authorization: &pb::RecoveryAuthorization) -> Vec<u8> {
    let mut unsigned = authorization.clone();
    unsigned.signature.clear();
    unsigned.encode_to_vec()
}

/// SHA-256 of the snapshot, signature cleared (`snapshot_digest`).
pub fn snapshot_digest(snapshot: &pb::RecoverySnapshot) -> Vec<u8> {
    keys::sha256(&snapshot_bytes(snapshot))
}

/// SHA-256 of the authorization, signature cleared (`authorizationDigest`).
pub fn authorization_digest(authorization: &pb::RecoveryAuthorization) -> Vec<u8> {
    keys::sha256(&authorization_bytes(authorization))
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The grant the spec's Go program builds over `snapshot`: the snapshot's
/// digest, its volume, LV, old lifecycle and policy, the new lifecycle, the
/// window, signed with `key`.
pub fn authorize(
    snapshot: &pb::RecoverySnapshot,
    new_volume_uid: &str,
    new_generation: u64,
    issued_at: prost_types::Timestamp,
    expires_at: prost_types::Timestamp,
    key: &PrivateSigner,
) -> Result<pb::RecoveryAuthorization, String> {
    let mut authorization = pb::RecoveryAuthorization {
        snapshot_digest: snapshot_digest(snapshot),
        volume_id: snapshot.volume_id.clone(),
        backend_type: snapshot.backend_type,
        lvm_source: snapshot.lvm_source.clone(),
        old_volume_uid: snapshot.old_volume_uid.clone(),
        old_generation: snapshot.old_generation,
        new_volume_uid: new_volume_uid.to_owned(),
        new_generation,
        preserve_original: Some(snapshot.preserve_original),
        issued_at: Some(issued_at),
        expires_at: Some(expires_at),
        signature: Vec::new(),
    };
    authorization.signature = key.sign(&authorization_bytes(&authorization))?;
    Ok(authorization)
}

impl Recovery {
    /// Reads the trust anchor and the server identity once, at start; any
    /// problem stops the agent.
    pub fn load(
        anchor: &std::path::Path,
        cert: &std::path::Path,
        key: &std::path::Path,
    ) -> Result<Self, KeyError> {
        Ok(Self {
            anchor: TrustAnchor::load(anchor)?,
            signer: ServerSigner::load(cert, key)?,
        })
    }

    /// Signs `snapshot` in place (its `signature` is replaced).
    pub fn sign_snapshot(&self, snapshot: &mut pb::RecoverySnapshot) -> Result<(), String> {
        snapshot.signature = self.signer.sign(&snapshot_bytes(snapshot))?;
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod testkit;
#[cfg(test)]
mod tests;
