//! Cross-language bytes of metadata-loss recovery: the spec's Go signing
//! program (`main.go` here), built against the `gen/go` package that
//! protoc-gen-go makes from this revision's agent.proto, signs a grant over
//! an agent-signed snapshot; the agent's rules accept it; and `pillar-csi
//! recovery sign` prints the same three lines for the same inputs, key and
//! time (byte for byte with RSA; with ECDSA, whose signatures are
//! randomized, the same bytes with the signature cleared, and both
//! signatures verify).
//!
//! Needs Go >= 1.23, protoc and protoc-gen-go v1.33.0 in
//! `~/.cache/pillar-csi/go-bin` (`make deps` installs them); no network.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use base64::{engine::general_purpose::STANDARD, Engine};
use pillar_csi_agent::recovery::{authorization_bytes, json, rules, Recovery};
use pillar_csi_proto::agent::v1 as pb;
use prost::Message;
use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, UNIX_EPOCH},
};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// The signing time both programs are given.
const NOW: &str = "2026-11-30T12:00:00.250Z";
const NOW_SECONDS: u64 = 1_796_040_000;

fn testdata(name: &str) -> PathBuf {
    Path::new(ROOT)
        .join("agent/src/recovery/testdata")
        .join(name)
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// protoc-gen-go as `make deps` installs it.
fn protoc_gen_go() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache"));
    let bin = cache.join("pillar-csi/go-bin/protoc-gen-go");
    assert!(
        bin.is_file(),
        "{} is missing: run `make deps` (it installs protoc-gen-go v1.33.0 there)",
        bin.display()
    );
    bin
}

fn go() -> Command {
    let mut cmd = Command::new("go");
    let path = std::env::var("PATH").unwrap_or_default();
    cmd.env("PATH", format!("{path}:/usr/local/go/bin"))
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=readonly -buildvcs=false")
        .env("GOPROXY", "off");
    cmd
}

/// The spec's program, built in `dir` against gen/go of agent.proto.
fn build_go_signer(dir: &Path) -> PathBuf {
    let module = dir.join("module");
    std::fs::create_dir_all(&module).unwrap();
    for f in ["go.mod", "go.sum", "main.go"] {
        std::fs::copy(
            Path::new(ROOT).join("proto/recovery-sign").join(f),
            module.join(f),
        )
        .unwrap();
    }
    run(Command::new("protoc")
        .arg("-I")
        .arg(Path::new(ROOT).join("proto"))
        .arg(format!(
            "--plugin=protoc-gen-go={}",
            protoc_gen_go().display()
        ))
        .arg(format!("--go_out={}", module.display()))
        .arg("--go_opt=module=github.com/isac322/pillar-csi")
        .arg("pillar_csi/agent/v1/agent.proto"));
    let bin = dir.join("sign");
    run(go()
        .current_dir(&module)
        .arg("build")
        .arg("-o")
        .arg(&bin)
        .arg("."));
    bin
}

/// An inspect.json whose snapshot the test agent identity signed, taken
/// one minute before `NOW`.
fn inspect_json(recovery: &Recovery, dir: &Path) -> PathBuf {
    let mut snapshot = pb::RecoverySnapshot {
        volume_id: "data-vg/legacy".into(),
        backend_type: pb::BackendType::Lvm as i32,
        lvm_source: Some(pb::LvmIdentity {
            volume_group: "data-vg".into(),
            logical_volume: "legacy".into(),
            volume_group_uuid: "Xk3pQm-1aB2-c3D4-e5F6-g7H8-i9J0-Kl1mNo".into(),
            logical_volume_uuid: "Rt7uVw-2cD3-e4F5-g6H7-i8J9-k0L1-Mn2oPq".into(),
        }),
        old_volume_uid: "5b0c2f1e-0000-4000-8000-000000000001".into(),
        old_generation: 7,
        preserve_original: true,
        exports: vec![],
        consumers: vec![],
        exclusive_claim: "free".into(),
        agent_identity: recovery.signer.identity.clone(),
        agent_certificate_sha256: recovery.signer.certificate_sha256.clone(),
        issued_at: Some(prost_types::Timestamp {
            seconds: NOW_SECONDS as i64 - 60,
            nanos: 987_654_321,
        }),
        signature: vec![],
    };
    recovery.sign_snapshot(&mut snapshot).unwrap();
    let path = dir.join("inspect.json");
    let answer = serde_json::json!({
        "volumeId": "data-vg/legacy",
        "snapshot": json::snapshot_to_json(&snapshot),
        "consumers": [],
        "exports": [],
    });
    std::fs::write(&path, serde_json::to_string_pretty(&answer).unwrap()).unwrap();
    path
}

/// The three lines as (snapshot bytes, authorization, digest).
fn parse(out: &str) -> (Vec<u8>, pb::RecoveryAuthorization, String) {
    let line = |key: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}: ")))
            .unwrap_or_else(|| panic!("no {key} in {out:?}"))
            .to_owned()
    };
    let auth_bytes = STANDARD.decode(line("authorization")).unwrap();
    (
        STANDARD.decode(line("snapshot")).unwrap(),
        pb::RecoveryAuthorization::decode(auth_bytes.as_slice()).unwrap(),
        line("authorizationDigest"),
    )
}

#[test]
fn the_spec_go_program_and_recovery_sign_make_the_same_grant() {
    let dir = tempfile::tempdir().unwrap();
    let signer = build_go_signer(dir.path());
    let anchor = dir.path().join("anchor.pem");
    let mut both = std::fs::read(testdata("operator-ec.pub")).unwrap();
    both.extend(std::fs::read(testdata("operator-rsa.pub")).unwrap());
    std::fs::write(&anchor, both).unwrap();
    let recovery =
        Recovery::load(&anchor, &testdata("server.crt"), &testdata("server.key")).unwrap();
    let inspect = inspect_json(&recovery, dir.path());
    let now = UNIX_EPOCH + Duration::from_secs(NOW_SECONDS + 30);
    let new_uid = "9d8e7f60-0000-4000-8000-000000000002";

    for key in ["operator-rsa.key", "operator-ec.key"] {
        let go_out = run(Command::new(&signer)
            .env("PILLAR_SIGN_NOW", NOW)
            .arg(&inspect)
            .arg(testdata(key))
            .arg(new_uid)
            .arg("8"));
        let rust_out = run(Command::new(env!("CARGO_BIN_EXE_pillar-csi"))
            .args(["recovery", "sign"])
            .arg(&inspect)
            .arg(testdata(key))
            .args([new_uid, "8", "--now", NOW]));
        let (go_snap, go_auth, go_digest) = parse(&go_out);
        let (rust_snap, rust_auth, rust_digest) = parse(&rust_out);
        println!("{key}: Go\n{go_out}{key}: pillar-csi recovery sign\n{rust_out}");
        assert_eq!(go_snap, rust_snap, "{key}: snapshot bytes");
        assert_eq!(go_digest, rust_digest, "{key}: authorizationDigest");
        assert_eq!(
            authorization_bytes(&go_auth),
            authorization_bytes(&rust_auth),
            "{key}: authorization bytes, signature cleared"
        );
        if key.contains("rsa") {
            assert_eq!(
                go_out, rust_out,
                "RSA PKCS#1 v1.5 is deterministic: every byte"
            );
        }
        // `pillar-csi recovery verify` accepts the Go grant offline, and
        // names the rule a wrong trust anchor breaks.
        let line = |key: &str| {
            go_out
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{key}: ")))
                .unwrap()
                .to_owned()
        };
        let verify = |anchor: &Path| {
            Command::new(env!("CARGO_BIN_EXE_pillar-csi"))
                .args(["recovery", "verify", "--trust-anchor"])
                .arg(anchor)
                .arg("--agent-cert")
                .arg(testdata("server.crt"))
                .args(["--snapshot", &line("snapshot")])
                .args(["--authorization", &line("authorization")])
                .args(["--now", "2026-11-30T12:00:30Z"])
                .output()
                .unwrap()
        };
        let good = verify(&anchor);
        assert!(good.status.success(), "{good:?}");
        assert!(String::from_utf8_lossy(&good.stdout).contains("ok: agreement"));
        let other = if key.contains("rsa") {
            "operator-ec.pub"
        } else {
            "operator-rsa.pub"
        };
        let bad = verify(&testdata(other));
        assert!(!bad.status.success());
        assert!(
            String::from_utf8_lossy(&bad.stderr).contains(
                "refused: authorization signature: it does not verify against any key of"
            ),
            "{bad:?}"
        );
        // The agent's rules accept both grants with the snapshot they name.
        let snapshot = pb::RecoverySnapshot::decode(go_snap.as_slice()).unwrap();
        for auth in [&go_auth, &rust_auth] {
            rules::signatures(&recovery, &snapshot, auth).unwrap();
            rules::windows(&snapshot, auth, now).unwrap();
            rules::agreement(&snapshot, auth).unwrap();
        }
    }
}
