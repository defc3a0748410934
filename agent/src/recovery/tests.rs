//! Recovery evidence over fixed vectors: the deterministic encoding and its
//! digests against bytes made by Python's protobuf (an independent
//! implementation), an RSA signature against openssl's, and every rule
//! refused with its own message.
use super::{
    rules::*,
    testkit::{data, read},
    *,
};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// `issued_at` of the fixed snapshot: 1796000000.123456789.
const T0: u64 = 1_796_000_000;

fn at(seconds: u64, nanos: i32) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: seconds as i64,
        nanos,
    }
}

fn when(seconds: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(seconds)
}

fn identity() -> pb::LvmIdentity {
    pb::LvmIdentity {
        volume_group: "data-vg".into(),
        logical_volume: "legacy".into(),
        volume_group_uuid: "Xk3pQm-1aB2-c3D4-e5F6-g7H8-i9J0-Kl1mNo".into(),
        logical_volume_uuid: "Rt7uVw-2cD3-e4F5-g6H7-i8J9-k0L1-Mn2oPq".into(),
    }
}

/// The snapshot of the fixed vector (Python made its bytes).
fn fixed_snapshot() -> pb::RecoverySnapshot {
    pb::RecoverySnapshot {
        volume_id: "data-vg/legacy".into(),
        backend_type: pb::BackendType::Lvm as i32,
        lvm_source: Some(identity()),
        old_volume_uid: "5b0c2f1e-0000-4000-8000-000000000001".into(),
        old_generation: 7,
        preserve_original: true,
        exports: vec![pb::VolumeExport {
            protocol_type: pb::ProtocolType::NvmeofTcp as i32,
            target_id: "nqn.x".into(),
            managed: true,
            allowed_hosts: vec![],
            allow_any_host: false,
        }],
        consumers: vec![],
        exclusive_claim: "free".into(),
        agent_identity: "storage-1".into(),
        agent_certificate_sha256: (0u8..32).collect(),
        issued_at: Some(at(T0, 123_456_789)),
        signature: b"ignored by the digest".to_vec(),
    }
}

#[test]
fn the_encoding_and_digests_match_an_independent_implementation() {
    let snap = fixed_snapshot();
    assert_eq!(
        hex(&snapshot_bytes(&snap)),
        "0a0e646174612d76672f6c656761637910021a610a07646174612d766712066c65676163791a26586b3370516d2d316142322d633344342d653546362d673748382d69394a302d4b6c316d4e6f22265274377556772d326344332d653446352d673648372d69384a392d6b304c312d4d6e326f5071222435623063326631652d303030302d343030302d383030302d303030303030303030303031280730013a0b080112056e716e2e7818014a0466726565520973746f726167652d315a20000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f620b088092b3d80610959aef3a"
    );
    assert_eq!(
        hex(&snapshot_digest(&snap)),
        "a18024bb26f68e1a050449ac438f01898eddf32368b5f5dd3cc854ff28f2f0dd"
    );
    let auth = pb::RecoveryAuthorization {
        snapshot_digest: snapshot_digest(&snap),
        volume_id: "data-vg/legacy".into(),
        backend_type: pb::BackendType::Lvm as i32,
        lvm_source: Some(identity()),
        old_volume_uid: snap.old_volume_uid.clone(),
        old_generation: 7,
        new_volume_uid: "9d8e7f60-0000-4000-8000-000000000002".into(),
        new_generation: 8,
        // Explicitly false: an optional field is encoded although false.
        preserve_original: Some(false),
        issued_at: Some(at(T0, 0)),
        expires_at: Some(at(T0 + 3600, 0)),
        signature: vec![1, 2, 3],
    };
    assert_eq!(
        hex(&authorization_bytes(&auth)),
        "0a20a18024bb26f68e1a050449ac438f01898eddf32368b5f5dd3cc854ff28f2f0dd120e646174612d76672f6c6567616379180222610a07646174612d766712066c65676163791a26586b3370516d2d316142322d633344342d653546362d673748382d69394a302d4b6c316d4e6f22265274377556772d326344332d653446352d673648372d69384a392d6b304c312d4d6e326f50712a2435623063326631652d303030302d343030302d383030302d30303030303030303030303130073a2439643865376636302d303030302d343030302d383030302d303030303030303030303032400848005206088092b3d8065a060890aeb3d806"
    );
    assert_eq!(
        hex(&authorization_digest(&auth)),
        "f16e3b92f0980269edd9b4df6c5b7d61014f2920bd05b318f86c4d5a04d23ebe"
    );
}

#[test]
fn an_rsa_signature_matches_openssl_and_ecdsa_verifies() -> Result<(), String> {
    let message = b"pillar-csi fixed vector";
    let rsa = PrivateSigner::from_pem(&read("operator-rsa.key"))?;
    let signature = rsa.sign(message)?;
    assert_eq!(
        hex(&signature),
        String::from_utf8_lossy(&read("rsa-signature.hex")).trim()
    );
    let anchor = TrustAnchor::load(&data("operator-rsa.pub")).map_err(|e| e.to_string())?;
    assert!(anchor.verifies(message, &signature));
    assert!(!anchor.verifies(b"another message", &signature));

    let ec = PrivateSigner::from_pem(&read("operator-ec.key"))?;
    let signature = ec.sign(message)?;
    let ec_anchor = TrustAnchor::load(&data("operator-ec.pub")).map_err(|e| e.to_string())?;
    assert!(ec_anchor.verifies(message, &signature));
    assert!(!anchor.verifies(message, &signature), "another key");
    Ok(())
}

#[test]
fn the_trust_anchor_takes_several_keys_and_refuses_unusable_files() -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let both = dir.path().join("both.pem");
    let mut text = read("operator-ec.pub");
    text.extend(read("operator-rsa.pub"));
    text.extend(read("san-rsa.crt"));
    std::fs::write(&both, &text).map_err(|e| e.to_string())?;
    assert_eq!(
        TrustAnchor::load(&both).map_err(|e| e.to_string())?.len(),
        3
    );

    let cases: [(&str, &[u8], &str); 4] = [
        ("empty.pem", b"", "no PUBLIC KEY or CERTIFICATE block with a usable key"),
        (
            "private-only.pem",
            &read("operator-ec.key"),
            "no PUBLIC KEY or CERTIFICATE block with a usable key",
        ),
        (
            "ed25519.pem",
            &read("other-ed25519.pub"),
            "block 1 holds a key of algorithm 1.3.101.112; only RSA and ECDSA (P-256, P-384) keys may sign grants",
        ),
        (
            "garbage.pem",
            b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
            "block 1 cannot be parsed",
        ),
    ];
    for (name, body, want) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, body).map_err(|e| e.to_string())?;
        let err = TrustAnchor::load(&path).expect_err(name).to_string();
        assert!(err.contains(want), "{name}: {err}");
        assert!(err.contains(&path.display().to_string()), "{err}");
    }
    let missing = TrustAnchor::load(&dir.path().join("absent.pem"))
        .expect_err("missing")
        .to_string();
    assert!(missing.contains("cannot read it"), "{missing}");
    Ok(())
}

#[test]
fn the_server_identity_must_name_the_agent_and_match_its_key() -> Result<(), String> {
    let signer =
        ServerSigner::load(&data("server.crt"), &data("server.key")).map_err(|e| e.to_string())?;
    assert_eq!(signer.identity, "storage-1");
    let sec1 = ServerSigner::load(&data("server.crt"), &data("server-sec1.key"))
        .map_err(|e| e.to_string())?;
    assert_eq!(sec1.certificate_sha256, signer.certificate_sha256);
    let san = ServerSigner::load(&data("san-rsa.crt"), &data("san-rsa.key"))
        .map_err(|e| e.to_string())?;
    assert_eq!(
        san.identity, "storage-2.example",
        "the DNS SAN without a CN"
    );
    let nameless = ServerSigner::load(&data("nameless.crt"), &data("nameless.key"))
        .expect_err("nameless")
        .to_string();
    assert!(
        nameless.contains("has no Subject CN and no DNS SAN"),
        "{nameless}"
    );
    let mismatch = ServerSigner::load(&data("server.crt"), &data("rotated.key"))
        .expect_err("another key")
        .to_string();
    assert!(
        mismatch.contains("the key does not match the certificate"),
        "{mismatch}"
    );
    Ok(())
}

/// A valid snapshot and grant at `T0 + 60`, signed by the fixtures' keys.
struct Case {
    recovery: Recovery,
    snapshot: pb::RecoverySnapshot,
    authorization: pb::RecoveryAuthorization,
    operator: PrivateSigner,
    now: SystemTime,
}

fn case() -> Case {
    let recovery = testkit::recovery();
    let mut snapshot = fixed_snapshot();
    snapshot.exports.clear();
    snapshot.agent_certificate_sha256 = recovery.signer.certificate_sha256.clone();
    recovery.sign_snapshot(&mut snapshot).expect("sign");
    let operator = testkit::operator();
    let authorization = authorize(
        &snapshot,
        "9d8e7f60-0000-4000-8000-000000000002",
        8,
        at(T0, 0),
        at(T0 + 3600, 0),
        &operator,
    )
    .expect("authorize");
    Case {
        recovery,
        snapshot,
        authorization,
        operator,
        now: when(T0 + 60),
    }
}

impl Case {
    fn check(&self) -> Result<(), String> {
        signatures(&self.recovery, &self.snapshot, &self.authorization)?;
        windows(&self.snapshot, &self.authorization, self.now)?;
        agreement(&self.snapshot, &self.authorization)
    }

    /// Re-signs the grant after a change (so only the rule under test fails).
    fn resign(&mut self) {
        self.authorization.signature = self
            .operator
            .sign(&authorization_bytes(&self.authorization))
            .expect("sign");
    }

    /// Re-signs the snapshot and re-digests the grant.
    fn resnapshot(&mut self) {
        self.recovery
            .sign_snapshot(&mut self.snapshot)
            .expect("sign");
        self.authorization.snapshot_digest = snapshot_digest(&self.snapshot);
        self.resign();
    }
}

#[test]
fn a_valid_grant_passes_every_rule() {
    assert_eq!(case().check(), Ok(()));
}

#[test]
fn every_rule_is_refused_with_its_own_message() {
    type Change = fn(&mut Case);
    let rules: Vec<(&str, Change)> = vec![
        (
            "snapshot: it was signed under another server certificate",
            |c| {
                c.snapshot.agent_certificate_sha256 = vec![0; 32];
            },
        ),
        (
            "snapshot: its signature does not verify against this agent's server certificate",
            |c| {
                c.snapshot.old_generation = 6;
            },
        ),
        (
            "authorization: its signature does not verify against any key of the trust anchor",
            |c| {
                c.operator = PrivateSigner::from_pem(&read("operator-rsa.key")).expect("key");
                c.resign();
            },
        ),
        ("authorization: its snapshot_digest", |c| {
            c.authorization.snapshot_digest = vec![0; 32];
            c.resign();
        }),
        ("snapshot: issued at", |c| c.now = when(T0 + 15 * 60 + 1)),
        ("snapshot: issued_at", |c| {
            c.snapshot.issued_at = Some(at(T0 + 3 * 60 + 61, 0));
            c.resnapshot();
        }),
        ("authorization: it expired at", |c| {
            c.snapshot.issued_at = Some(at(T0 + 3600, 0));
            c.resnapshot();
            c.now = when(T0 + 3601);
        }),
        ("authorization: it is not valid before its issued_at", |c| {
            c.authorization.issued_at = Some(at(T0 + 120, 0));
            c.resign();
        }),
        ("is longer than 24 hours", |c| {
            c.authorization.expires_at = Some(at(T0 + 24 * 3600 + 121, 0));
            c.resign();
        }),
        ("authorization: expires_at", |c| {
            c.authorization.expires_at = Some(at(T0, 0));
            c.resign();
        }),
        (
            "authorization: issued_at and expires_at must both be set",
            |c| {
                c.authorization.expires_at = None;
                c.resign();
            },
        ),
        ("authorization: its volume_id", |c| {
            c.authorization.volume_id = "data-vg/other".into();
            c.resign();
        }),
        ("authorization: its backend_type", |c| {
            c.authorization.backend_type = pb::BackendType::ZfsZvol as i32;
            c.resign();
        }),
        ("authorization: its lvm_source", |c| {
            if let Some(s) = c.authorization.lvm_source.as_mut() {
                s.logical_volume_uuid = "other".into();
            }
            c.resign();
        }),
        ("authorization: its old_volume_uid", |c| {
            c.authorization.old_volume_uid = "someone-else".into();
            c.resign();
        }),
        ("authorization: its old_generation", |c| {
            c.authorization.old_generation = 6;
            c.resign();
        }),
        ("authorization: its preserve_original", |c| {
            c.authorization.preserve_original = Some(false);
            c.resign();
        }),
        ("authorization: preserve_original must be set", |c| {
            c.authorization.preserve_original = None;
            c.resign();
        }),
        ("authorization: new_volume_uid is empty", |c| {
            c.authorization.new_volume_uid.clear();
            c.resign();
        }),
        ("is the old lifecycle's UID", |c| {
            c.authorization.new_volume_uid = c.authorization.old_volume_uid.clone();
            c.resign();
        }),
        ("snapshot: it shows the LV in use", |c| {
            c.snapshot.consumers.push(pb::VolumeConsumer {
                kind: "mount".into(),
                device: "dm-3".into(),
                detail: "/mnt".into(),
            });
            c.resnapshot();
        }),
        ("admitting an initiator", |c| {
            c.snapshot.exports.push(pb::VolumeExport {
                protocol_type: pb::ProtocolType::NvmeofTcp as i32,
                target_id: "nqn.y".into(),
                managed: true,
                allowed_hosts: vec!["nqn.host".into()],
                allow_any_host: false,
            });
            c.resnapshot();
        }),
        ("snapshot: its exclusive claim is \"busy\"", |c| {
            c.snapshot.exclusive_claim = "busy".into();
            c.resnapshot();
        }),
    ];
    let mut seen = std::collections::BTreeSet::new();
    for (want, change) in rules {
        let mut c = case();
        change(&mut c);
        let got = c.check().expect_err(want);
        assert!(got.contains(want), "want {want:?}, got {got:?}");
        assert!(seen.insert(got.clone()), "two rules share a message: {got}");
    }
}

#[test]
fn a_rotated_server_certificate_invalidates_snapshots() {
    let c = case();
    let rotated = Recovery::load(
        &data("operator-ec.pub"),
        &data("rotated.crt"),
        &data("rotated.key"),
    )
    .expect("rotated");
    let got = signatures(&rotated, &c.snapshot, &c.authorization).expect_err("rotated");
    assert!(got.contains("the certificate was rotated since"), "{got}");
}

/// grpcurl's JSON (made by Python's `json_format`, defaults printed) reads
/// back as the same snapshot, with the same digest.
#[test]
fn the_snapshot_reads_back_from_proto3_json() -> Result<(), String> {
    let text = String::from_utf8_lossy(&read("inspect.json")).into_owned();
    let parsed = json::snapshot_of_inspection(&text)?;
    assert_eq!(parsed, fixed_snapshot());
    assert_eq!(snapshot_digest(&parsed), snapshot_digest(&fixed_snapshot()));
    let none =
        json::snapshot_of_inspection(r#"{"volumeId": "data-vg/legacy"}"#).expect_err("no snapshot");
    assert!(none.contains("has no snapshot"), "{none}");
    Ok(())
}

#[test]
fn the_snapshot_round_trips_through_json() -> Result<(), String> {
    let snap = fixed_snapshot();
    let text = serde_json::json!({ "snapshot": json::snapshot_to_json(&snap) }).to_string();
    assert_eq!(json::snapshot_of_inspection(&text)?, snap);
    Ok(())
}

/// The whole answer prints as Python's `json_format` printed it (defaults
/// included), and `recovery sign` reads the snapshot back from it.
#[test]
fn an_inspection_prints_as_proto3_json_does() -> Result<(), String> {
    let answer = pb::InspectVolumeResponse {
        volume_id: "data-vg/legacy".into(),
        snapshot: Some(fixed_snapshot()),
        ..Default::default()
    };
    let printed = json::inspection_to_json(&answer);
    let python: serde_json::Value =
        serde_json::from_slice(&read("inspect.json")).map_err(|e| e.to_string())?;
    assert_eq!(printed, python);
    assert_eq!(
        json::snapshot_of_inspection(&printed.to_string())?,
        fixed_snapshot()
    );
    let full = pb::InspectVolumeResponse {
        lvm: Some(pb::LvmObservation {
            identity: Some(identity()),
            exclusive_claim: "busy".into(),
            size_bytes: 1 << 40,
            ..Default::default()
        }),
        fence: Some(pb::FenceState {
            exists: true,
            volume_uid: "u".into(),
            generation: u64::MAX,
            ended_uids: vec!["e".into()],
            ..Default::default()
        }),
        ..answer
    };
    let v = json::inspection_to_json(&full);
    assert_eq!(v["lvm"]["sizeBytes"], "1099511627776");
    assert_eq!(v["lvm"]["exclusiveClaim"], "busy");
    assert_eq!(
        v["lvm"]["identity"]["volumeGroupUuid"],
        identity().volume_group_uuid
    );
    assert_eq!(v["fence"]["generation"], u64::MAX.to_string());
    assert_eq!(v["fence"]["ended"], false);
    assert_eq!(v["fence"]["endedUids"], serde_json::json!(["e"]));
    assert!(
        v["fence"].get("lvmSource").is_none(),
        "absent message left out"
    );
    Ok(())
}
