//! The checks of a TransferVolumeOwnership that need no lock: both
//! signatures, the digest, the windows and the agreement of the grant with
//! the snapshot. Each refusal has its own message (docs/recovery.md, "Refusals,
//! From the agent"), in the order they are checked.
use super::{authorization_bytes, hex, snapshot_bytes, snapshot_digest, Recovery};
use pillar_csi_proto::agent::v1 as pb;
use std::time::{Duration, SystemTime};

/// The longest grant window.
pub const GRANT_WINDOW: Duration = Duration::from_secs(24 * 60 * 60);
/// The clock skew allowed on top of the window.
pub const CLOCK_SKEW: Duration = Duration::from_secs(2 * 60);
/// How long a snapshot stays valid.
pub const SNAPSHOT_LIFETIME: Duration = Duration::from_secs(15 * 60);

/// A timestamp as a point in time (`None`: absent or out of range).
fn instant(t: Option<&prost_types::Timestamp>) -> Option<SystemTime> {
    t.and_then(|t| SystemTime::try_from(*t).ok())
}

/// RFC 3339 (UTC, seconds) for messages.
pub fn rfc3339(t: Option<&prost_types::Timestamp>) -> String {
    t.map(|t| t.to_string()).unwrap_or_else(|| "(unset)".into())
}

/// `identity` as `vg/lv:vg_uuid:lv_uuid`.
pub fn describe_identity(i: Option<&pb::LvmIdentity>) -> String {
    match i {
        Some(i) => format!(
            "{}/{}:{}:{}",
            i.volume_group, i.logical_volume, i.volume_group_uuid, i.logical_volume_uuid
        ),
        None => "(unset)".into(),
    }
}

/// Why the signatures or the digest are not good, if they are not. These
/// hold whenever the request is looked at (also for a retry after the
/// commit): a grant whose key was removed is no grant.
pub fn signatures(
    recovery: &Recovery,
    snapshot: &pb::RecoverySnapshot,
    authorization: &pb::RecoveryAuthorization,
) -> Result<(), String> {
    if snapshot.agent_certificate_sha256 != recovery.signer.certificate_sha256 {
        return Err(format!(
            "snapshot: it was signed under another server certificate (sha256 {}, this agent's is {}); the certificate was rotated since: inspect again and sign a new grant",
            hex(&snapshot.agent_certificate_sha256),
            hex(&recovery.signer.certificate_sha256)
        ));
    }
    if !recovery
        .signer
        .verifies(&snapshot_bytes(snapshot), &snapshot.signature)
    {
        return Err("snapshot: its signature does not verify against this agent's server certificate; it was altered or not issued by this agent".into());
    }
    if !recovery.anchor.verifies(
        &authorization_bytes(authorization),
        &authorization.signature,
    ) {
        return Err(format!(
            "authorization: its signature does not verify against any key of the trust anchor {}",
            recovery.anchor.path.display()
        ));
    }
    let digest = snapshot_digest(snapshot);
    if authorization.snapshot_digest != digest {
        return Err(format!(
            "authorization: its snapshot_digest {} is not the digest {} of the snapshot sent with it",
            hex(&authorization.snapshot_digest),
            hex(&digest)
        ));
    }
    Ok(())
}

/// Why the snapshot or the grant is out of its time window at `now`, if it is.
pub fn windows(
    snapshot: &pb::RecoverySnapshot,
    authorization: &pb::RecoveryAuthorization,
    now: SystemTime,
) -> Result<(), String> {
    let taken = instant(snapshot.issued_at.as_ref())
        .ok_or_else(|| "snapshot: issued_at is missing".to_owned())?;
    if taken > now + CLOCK_SKEW {
        return Err(format!(
            "snapshot: issued_at {} is in the future; check the storage node's clock",
            rfc3339(snapshot.issued_at.as_ref())
        ));
    }
    let age = now.duration_since(taken).unwrap_or_default();
    if age > SNAPSHOT_LIFETIME {
        return Err(format!(
            "snapshot: issued at {}, {} s ago; a snapshot is valid for 15 minutes: inspect again and sign a new grant",
            rfc3339(snapshot.issued_at.as_ref()),
            age.as_secs()
        ));
    }
    let (Some(issued), Some(expires)) = (
        instant(authorization.issued_at.as_ref()),
        instant(authorization.expires_at.as_ref()),
    ) else {
        return Err("authorization: issued_at and expires_at must both be set".into());
    };
    let (i, e) = (
        rfc3339(authorization.issued_at.as_ref()),
        rfc3339(authorization.expires_at.as_ref()),
    );
    if expires <= issued {
        return Err(format!(
            "authorization: expires_at {e} is not after issued_at {i}"
        ));
    }
    if expires.duration_since(issued).unwrap_or_default() > GRANT_WINDOW + CLOCK_SKEW {
        return Err(format!(
            "authorization: its window from {i} to {e} is longer than 24 hours"
        ));
    }
    if now < issued {
        return Err(format!(
            "authorization: it is not valid before its issued_at {i}"
        ));
    }
    if now > expires {
        return Err(format!("authorization: it expired at {e}"));
    }
    Ok(())
}

/// Why the grant does not name what the snapshot shows, or the snapshot
/// does not show an idle LV, if so.
pub fn agreement(
    snapshot: &pb::RecoverySnapshot,
    authorization: &pb::RecoveryAuthorization,
) -> Result<(), String> {
    let differs = |field: &str, grant: String, snap: String| {
        Err(format!(
            "authorization: its {field} {grant} does not match the snapshot's {snap}"
        ))
    };
    if authorization.volume_id != snapshot.volume_id {
        return differs(
            "volume_id",
            format!("{:?}", authorization.volume_id),
            format!("{:?}", snapshot.volume_id),
        );
    }
    if authorization.backend_type != snapshot.backend_type
        || snapshot.backend_type != pb::BackendType::Lvm as i32
    {
        return differs(
            "backend_type",
            authorization.backend_type.to_string(),
            snapshot.backend_type.to_string(),
        );
    }
    if authorization.lvm_source != snapshot.lvm_source {
        return differs(
            "lvm_source",
            describe_identity(authorization.lvm_source.as_ref()),
            describe_identity(snapshot.lvm_source.as_ref()),
        );
    }
    if authorization.old_volume_uid != snapshot.old_volume_uid {
        return differs(
            "old_volume_uid",
            format!("{:?}", authorization.old_volume_uid),
            format!("{:?}", snapshot.old_volume_uid),
        );
    }
    if authorization.old_generation != snapshot.old_generation {
        return differs(
            "old_generation",
            authorization.old_generation.to_string(),
            snapshot.old_generation.to_string(),
        );
    }
    match authorization.preserve_original {
        None => return Err("authorization: preserve_original must be set".into()),
        Some(p) if p != snapshot.preserve_original => {
            return differs(
                "preserve_original",
                p.to_string(),
                snapshot.preserve_original.to_string(),
            )
        }
        Some(_) => {}
    }
    if authorization.new_volume_uid.is_empty() {
        return Err("authorization: new_volume_uid is empty".into());
    }
    if authorization.new_volume_uid == authorization.old_volume_uid {
        return Err(format!(
            "authorization: new_volume_uid {:?} is the old lifecycle's UID",
            authorization.new_volume_uid
        ));
    }
    if let Some(c) = snapshot.consumers.first() {
        return Err(format!(
            "snapshot: it shows the LV in use ({} {} on {}); stop the user, inspect again and sign a new grant",
            c.kind, c.detail, c.device
        ));
    }
    if let Some(x) = snapshot.exports.iter().find(|x| admits(x)) {
        return Err(format!(
            "snapshot: it shows export {} admitting an initiator; unexport it, inspect again and sign a new grant",
            x.target_id
        ));
    }
    if snapshot.exclusive_claim != "free" {
        return Err(format!(
            "snapshot: its exclusive claim is {:?}, not \"free\"; inspect again once the LV is free and sign a new grant",
            snapshot.exclusive_claim
        ));
    }
    Ok(())
}

/// Whether an observed export lets any initiator connect.
pub fn admits(export: &pb::VolumeExport) -> bool {
    export.allow_any_host || !export.allowed_hosts.is_empty()
}
