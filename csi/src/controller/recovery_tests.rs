//! The record's checks, without an API server (the API-server tests drive
//! the same refusals through CreateVolume).
#![allow(clippy::unwrap_used)]
use super::*;
use api::crd::{ClaimRef, PillarVolumeStateSpec};
use api::tokens::Protocol;

const UID: &str = "5c0ffee0-0000-4000-8000-000000000001";

fn source() -> LvmSource {
    LvmSource {
        volume_group: "data-vg".into(),
        logical_volume: "legacy".into(),
        volume_group_uuid: "VGUUID".into(),
        logical_volume_uuid: "LVUUID".into(),
        preserve_original: true,
    }
}

fn snapshot() -> agent::RecoverySnapshot {
    agent::RecoverySnapshot {
        volume_id: "data-vg/legacy".into(),
        backend_type: agent::BackendType::Lvm as i32,
        lvm_source: Some(identity_of(&source())),
        old_volume_uid: "old".into(),
        old_generation: 4,
        preserve_original: true,
        exclusive_claim: "free".into(),
        agent_identity: "storage-1".into(),
        signature: vec![1, 2, 3],
        ..Default::default()
    }
}

fn grant(snap: &agent::RecoverySnapshot) -> agent::RecoveryAuthorization {
    agent::RecoveryAuthorization {
        snapshot_digest: snapshot_digest(snap),
        volume_id: "data-vg/legacy".into(),
        backend_type: agent::BackendType::Lvm as i32,
        lvm_source: Some(identity_of(&source())),
        old_volume_uid: "old".into(),
        old_generation: 4,
        new_volume_uid: UID.into(),
        new_generation: 5,
        preserve_original: Some(true),
        signature: vec![9, 9],
        ..Default::default()
    }
}

fn record(
    snap: &agent::RecoverySnapshot,
    auth: &agent::RecoveryAuthorization,
) -> PillarVolumeState {
    let mut state = PillarVolumeState::new(
        "pvc-x",
        PillarVolumeStateSpec {
            volume_id: "storage-1/nvmeof-tcp/lvm-lv/data-vg/legacy".into(),
            agent_volume_id: "data-vg/legacy".into(),
            agent_ref: "storage-1".into(),
            backend_type: Backend::LvmLv,
            protocol_type: Protocol::NvmeofTcp,
            capacity_bytes: 1 << 30,
            claim_ref: Some(ClaimRef {
                uid: "c".into(),
                namespace: "db".into(),
                name: "data".into(),
            }),
            imported_from: None,
            lvm_source: None,
            resolved: None,
            export_spec: None,
            recovery: Some(Recovery {
                old_volume_uid: "old".into(),
                old_generation: 4,
                new_generation: 5,
                source: source(),
                new_volume_uid: Some(UID.into()),
                authorization: Some(STANDARD.encode(auth.encode_to_vec())),
                authorization_digest: Some(authorization_digest(auth)),
            }),
        },
    );
    state.metadata.uid = Some(UID.into());
    state.metadata.annotations = Some(
        [(
            RECOVERY_SNAPSHOT_ANNOTATION.to_owned(),
            STANDARD.encode(snap.encode_to_vec()),
        )]
        .into(),
    );
    state
}

fn refusal(state: &PillarVolumeState) -> String {
    match check_all(state) {
        Ok(_) => panic!("expected a refusal"),
        Err(why) => why,
    }
}

#[test]
fn digests_are_the_agents() {
    let snap = snapshot();
    let auth = grant(&snap);
    assert_eq!(
        snapshot_digest(&snap),
        pillar_csi_agent::recovery::snapshot_digest(&snap)
    );
    assert_eq!(
        authorization_digest(&auth),
        pillar_csi_agent::recovery::hex(&pillar_csi_agent::recovery::authorization_digest(&auth))
    );
}

#[test]
fn a_consistent_record_yields_the_transfer_request() {
    let snap = snapshot();
    let auth = grant(&snap);
    let checked = check_all(&record(&snap, &auth)).unwrap();
    assert_eq!(checked.request.volume_id, "data-vg/legacy");
    assert_eq!(checked.request.snapshot, Some(snap));
    assert_eq!(checked.request.authorization, Some(auth.clone()));
    assert_eq!(
        checked.latch.authorization_digest,
        authorization_digest(&auth)
    );
    assert_eq!(checked.latch.new_volume_uid, UID);
}

/// A change of the record and the field its refusal must name.
type Case = (&'static str, fn(&mut PillarVolumeState));

#[test]
fn each_disagreement_is_refused_naming_its_field() {
    let snap = snapshot();
    let auth = grant(&snap);
    let cases: Vec<Case> = vec![
        ("spec.recovery.newVolumeUID is not set", |s| {
            s.spec.recovery.as_mut().unwrap().new_volume_uid = None
        }),
        ("spec.recovery.authorization is not set", |s| {
            s.spec.recovery.as_mut().unwrap().authorization = None
        }),
        ("spec.recovery.authorizationDigest is not set", |s| {
            s.spec.recovery.as_mut().unwrap().authorization_digest = None
        }),
        ("spec.recovery.newVolumeUID \"other\" is not this record's metadata.uid", |s| {
            s.spec.recovery.as_mut().unwrap().new_volume_uid = Some("other".into())
        }),
        ("spec.recovery.authorizationDigest 00 is not the digest", |s| {
            s.spec.recovery.as_mut().unwrap().authorization_digest = Some("00".into())
        }),
        ("spec.recovery.authorization is not base64", |s| {
            s.spec.recovery.as_mut().unwrap().authorization = Some("%%%".into())
        }),
        ("its old_volume_uid \"old\" does not match spec.recovery.oldVolumeUID \"older\"", |s| {
            s.spec.recovery.as_mut().unwrap().old_volume_uid = "older".into()
        }),
        ("its old_generation 4 does not match spec.recovery.oldGeneration 3", |s| {
            s.spec.recovery.as_mut().unwrap().old_generation = 3
        }),
        ("its new_generation 5 does not match spec.recovery.newGeneration 6", |s| {
            s.spec.recovery.as_mut().unwrap().new_generation = 6
        }),
        ("its preserve_original Some(true) does not match spec.recovery.source.preserveOriginal false", |s| {
            s.spec.recovery.as_mut().unwrap().source.preserve_original = false
        }),
        ("its lvm_source", |s| {
            s.spec.recovery.as_mut().unwrap().source.logical_volume_uuid = "OTHER".into()
        }),
        ("spec.agentVolumeID \"data-vg/other\" is not spec.recovery.source's \"data-vg/legacy\"", |s| {
            s.spec.agent_volume_id = "data-vg/other".into()
        }),
        ("spec.lvmSource cannot be combined with spec.recovery", |s| {
            s.spec.lvm_source = Some(source())
        }),
        ("spec.volumeID storage-2/nvmeof-tcp/lvm-lv/data-vg/legacy does not agree", |s| {
            s.spec.volume_id = "storage-2/nvmeof-tcp/lvm-lv/data-vg/legacy".into()
        }),
        ("annotation is not set", |s| {
            s.metadata.annotations = None
        }),
        ("annotation holds a snapshot of digest", |s| {
            let mut other = snapshot();
            other.exclusive_claim = "busy".into();
            s.metadata.annotations = Some(
                [(RECOVERY_SNAPSHOT_ANNOTATION.to_owned(), STANDARD.encode(other.encode_to_vec()))].into(),
            );
        }),
        ("annotation does not decode as a RecoverySnapshot", |s| {
            s.metadata.annotations = Some(
                [(RECOVERY_SNAPSHOT_ANNOTATION.to_owned(), STANDARD.encode([0xff, 0xff, 0xff]))].into(),
            );
        }),
    ];
    for (want, change) in cases {
        let mut state = record(&snap, &auth);
        change(&mut state);
        let got = refusal(&state);
        assert!(got.contains(want), "wanted {want:?} in {got:?}");
    }
}

/// A change of a grant.
type GrantChange = fn(&mut agent::RecoveryAuthorization);

#[test]
fn a_grant_for_another_record_or_volume_is_refused() {
    let snap = snapshot();
    let changes: [(&str, GrantChange); 3] = [
        ("its new_volume_uid \"someone-else\"", |a| {
            a.new_volume_uid = "someone-else".into()
        }),
        ("its volume_id \"data-vg/x\"", |a| {
            a.volume_id = "data-vg/x".into()
        }),
        ("its preserve_original None", |a| a.preserve_original = None),
    ];
    for (want, change) in changes {
        let mut auth = grant(&snap);
        change(&mut auth);
        // A grant whose digest was recomputed: only the field disagrees.
        let got = refusal(&record(&snap, &auth));
        assert!(got.contains(want), "wanted {want:?} in {got:?}");
    }
}

#[test]
fn a_changed_write_once_field_is_refused_against_the_latch() {
    let snap = snapshot();
    let auth = grant(&snap);
    let mut state = record(&snap, &auth);
    let latch = check_all(&state).unwrap().latch;
    state.status = Some(PillarVolumeStateStatus {
        recovery_latch: Some(latch.clone()),
        ..Default::default()
    });
    assert!(check_all(&state).is_ok(), "the latched values pass");
    // Another valid grant (a new window) with its own digest: still refused.
    let mut again = grant(&snap);
    again.signature = vec![7];
    again.issued_at = Some(prost_types::Timestamp {
        seconds: 60,
        nanos: 0,
    });
    let r = state.spec.recovery.as_mut().unwrap();
    r.authorization = Some(STANDARD.encode(again.encode_to_vec()));
    r.authorization_digest = Some(authorization_digest(&again));
    let got = refusal(&state);
    assert!(
        got.starts_with("spec.recovery.authorizationDigest changed from"),
        "{got}"
    );
    // Only the signature changed: the digest is the same, the bytes are not.
    let mut resigned = auth.clone();
    resigned.signature = vec![8, 8];
    let mut state = record(&snap, &resigned);
    state.status = Some(PillarVolumeStateStatus {
        recovery_latch: Some(latch),
        ..Default::default()
    });
    let got = refusal(&state);
    assert!(
        got.starts_with("spec.recovery.authorization changed after it was set"),
        "{got}"
    );
}

#[test]
fn pending_is_recovery_not_yet_ready() {
    let snap = snapshot();
    let mut state = record(&snap, &grant(&snap));
    assert!(is_pending(&state), "born pending, before any status");
    state.status = Some(PillarVolumeStateStatus {
        phase: Some(VolumePhase::RecoveryPending),
        ..Default::default()
    });
    assert!(is_pending(&state));
    state.status = Some(PillarVolumeStateStatus {
        phase: Some(VolumePhase::Ready),
        ..Default::default()
    });
    assert!(!is_pending(&state));
    state.spec.recovery = None;
    state.status = None;
    assert!(!is_pending(&state), "an ordinary record is not");
}
