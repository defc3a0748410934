//! `pillar-csi recovery sign|verify`: the operator's side of metadata-loss
//! recovery (spec: adopt-lvm-lv.md, "Recover after metadata loss"), which
//! the spec leaves to a Go program.
//!
//! `inspect` calls InspectVolume over mTLS and prints the answer in the
//! proto3 JSON `sign` reads (see [`crate::agent_call`]).
//! `sign` reads an InspectVolume answer (grpcurl's JSON), the operator's
//! private key (PKCS#8 PEM, as the Go program reads it), the new UID and
//! generation, and prints the three lines the Go program prints, with the
//! same bytes (RSA signatures are deterministic, so the whole authorization
//! is; ECDSA signatures are randomized, everything else is the same).
//! `verify` checks a snapshot and a grant offline and names the first rule
//! that fails.
use base64::{engine::general_purpose::STANDARD, Engine};
use clap::{Args, Subcommand};
use pillar_csi_agent::recovery::{
    authorization_digest, authorize, hex, json, rules, snapshot_digest, PrivateSigner, PublicKey,
    TrustAnchor,
};
use pillar_csi_proto::agent::v1 as pb;
use prost::Message;
use std::{
    path::PathBuf,
    time::{Duration, SystemTime},
};

/// The recovery subcommands.
#[derive(Subcommand)]
pub enum RecoveryCommand {
    /// InspectVolume over mTLS; prints the answer as proto3 JSON (the file
    /// `recovery sign` reads), and refuses an answer without a snapshot.
    Inspect(InspectArgs),
    /// Sign a grant over the snapshot of an InspectVolume answer; prints
    /// `snapshot:`, `authorization:` (base64) and `authorizationDigest:` (hex).
    Sign(SignArgs),
    /// Check a snapshot and a grant offline; prints each rule and exits 1
    /// at the first that fails.
    Verify(VerifyArgs),
}

/// `recovery sign`.
#[derive(Args)]
pub struct SignArgs {
    /// The InspectVolume answer (proto3 JSON, as grpcurl prints it).
    inspect_json: PathBuf,
    /// The operator's private key (PEM; PKCS#8, SEC1 or PKCS#1; RSA or ECDSA P-256).
    key: PathBuf,
    /// The new lifecycle: the recovery record's metadata.uid.
    new_volume_uid: String,
    /// The generation the new lifecycle starts at (spec.recovery.newGeneration).
    new_generation: u64,
    /// The signing time (RFC 3339; default now): issued_at is one minute
    /// before it, expires_at one hour after, as in the spec's Go program.
    #[arg(long)]
    now: Option<prost_types::Timestamp>,
}

/// `recovery inspect`.
#[derive(Args)]
pub struct InspectArgs {
    #[command(flatten)]
    agent: crate::agent_call::AgentFlags,
    #[command(flatten)]
    volume: crate::agent_call::VolumeFlags,
    /// Print an answer that has no snapshot instead of failing.
    #[arg(long)]
    allow_no_snapshot: bool,
}

/// `recovery verify`.
#[derive(Args)]
pub struct VerifyArgs {
    /// The agent's trust anchor file (the operator's public keys).
    #[arg(long)]
    trust_anchor: PathBuf,
    /// The snapshot, base64 (the recovery-snapshot annotation).
    #[arg(long)]
    snapshot: String,
    /// The grant, base64 (spec.recovery.authorization).
    #[arg(long)]
    authorization: String,
    /// The agent's server certificate, to check the snapshot's signature too.
    #[arg(long)]
    agent_cert: Option<PathBuf>,
    /// The time to check the windows at (RFC 3339; default now).
    #[arg(long)]
    now: Option<prost_types::Timestamp>,
}

fn timestamp_at(at: SystemTime) -> prost_types::Timestamp {
    prost_types::Timestamp::from(at)
}

fn instant(t: &prost_types::Timestamp) -> Result<SystemTime, String> {
    SystemTime::try_from(*t).map_err(|e| format!("time {t} is out of range: {e}"))
}

/// Runs one recovery subcommand; the text to print, or why it failed.
pub fn run(command: RecoveryCommand) -> Result<String, String> {
    match command {
        RecoveryCommand::Inspect(a) => {
            crate::agent_call::inspect_for_recovery(&a.agent, &a.volume, a.allow_no_snapshot)
        }
        RecoveryCommand::Sign(a) => sign(a),
        RecoveryCommand::Verify(a) => verify(a),
    }
}

fn sign(a: SignArgs) -> Result<String, String> {
    let text = std::fs::read_to_string(&a.inspect_json)
        .map_err(|e| format!("{}: {e}", a.inspect_json.display()))?;
    let snapshot = json::snapshot_of_inspection(&text)
        .map_err(|e| format!("{}: {e}", a.inspect_json.display()))?;
    let pem = std::fs::read(&a.key).map_err(|e| format!("{}: {e}", a.key.display()))?;
    let key = PrivateSigner::from_pem(&pem).map_err(|e| format!("{}: {e}", a.key.display()))?;
    let now = match &a.now {
        Some(t) => instant(t)?,
        None => SystemTime::now(),
    };
    let minute = Duration::from_secs(60);
    let authorization = authorize(
        &snapshot,
        &a.new_volume_uid,
        a.new_generation,
        timestamp_at(now - minute),
        timestamp_at(now + 60 * minute),
        &key,
    )?;
    Ok(format!(
        "snapshot: {}\nauthorization: {}\nauthorizationDigest: {}",
        STANDARD.encode(snapshot.encode_to_vec()),
        STANDARD.encode(authorization.encode_to_vec()),
        hex(&authorization_digest(&authorization))
    ))
}

fn decode<M: Message + Default>(what: &str, b64: &str) -> Result<M, String> {
    let bytes = STANDARD
        .decode(b64.trim())
        .map_err(|e| format!("{what}: not base64: {e}"))?;
    M::decode(bytes.as_slice()).map_err(|e| format!("{what}: not a {what}: {e}"))
}

fn verify(a: VerifyArgs) -> Result<String, String> {
    let snapshot: pb::RecoverySnapshot = decode("snapshot", &a.snapshot)?;
    let authorization: pb::RecoveryAuthorization = decode("authorization", &a.authorization)?;
    let anchor = TrustAnchor::load(&a.trust_anchor).map_err(|e| e.to_string())?;
    let now = match &a.now {
        Some(t) => instant(t)?,
        None => SystemTime::now(),
    };
    let mut out = vec![format!(
        "snapshotDigest: {}\nauthorizationDigest: {}",
        hex(&snapshot_digest(&snapshot)),
        hex(&authorization_digest(&authorization))
    )];
    let mut check = |rule: &str, result: Result<(), String>| -> Result<(), String> {
        match result {
            Ok(()) => {
                out.push(format!("ok: {rule}"));
                Ok(())
            }
            Err(why) => Err(format!("{}\nrefused: {rule}: {why}", out.join("\n"))),
        }
    };
    if let Some(cert) = &a.agent_cert {
        let der = first_certificate(cert)?;
        let key = x509_public_key(&der)?;
        let signed = key.verifies(
            &pillar_csi_agent::recovery::snapshot_bytes(&snapshot),
            &snapshot.signature,
        );
        check(
            "snapshot signature",
            signed.then_some(()).ok_or_else(|| {
                format!(
                    "it does not verify against {} (another agent, a rotated certificate, or altered)",
                    cert.display()
                )
            }),
        )?;
    }
    check(
        "authorization signature",
        anchor
            .verifies(
                &pillar_csi_agent::recovery::authorization_bytes(&authorization),
                &authorization.signature,
            )
            .then_some(())
            .ok_or_else(|| {
                format!(
                    "it does not verify against any key of {}",
                    a.trust_anchor.display()
                )
            }),
    )?;
    check(
        "snapshot digest",
        (authorization.snapshot_digest == snapshot_digest(&snapshot))
            .then_some(())
            .ok_or_else(|| "the grant names another snapshot".to_owned()),
    )?;
    check("windows", rules::windows(&snapshot, &authorization, now))?;
    check("agreement", rules::agreement(&snapshot, &authorization))?;
    Ok(out.join("\n"))
}

fn first_certificate(path: &PathBuf) -> Result<Vec<u8>, String> {
    use rustls_pki_types::{pem::PemObject, CertificateDer};
    CertificateDer::from_pem_file(path)
        .map(|c| c.to_vec())
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn x509_public_key(der: &[u8]) -> Result<PublicKey, String> {
    PublicKey::from_certificate(der)
}
