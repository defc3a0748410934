//! Metadata-loss recovery in the kernel lab (spec: adopt-lvm-lv.md,
//! "Recover after metadata loss"). The `pillar-csi agent` binary runs with
//! mTLS and `--recovery-trust-anchor`; an LV with data is adopted and
//! exported under an "old" lifecycle whose Kubernetes records are then
//! considered lost (the mark survives). The operator's steps go through the
//! independent JSON client (`tests/lab/agent_json.py`, grpcurl's flags and
//! JSON), the grant is signed by `pillar-csi recovery sign`, and
//! TransferVolumeOwnership is called as the controller calls it (the bytes
//! of the annotation and of `spec.recovery.authorization`).
//!
//! Run with `tests/lab/run tests -- recovery_`.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use api::annotations::LvIdentity;
use base64::{engine::general_purpose::STANDARD, Engine};
use pillar_csi_agent::{
    marks::FenceMark,
    recovery::{hex, Recovery},
};
use pillar_csi_lab::{
    agent::{binary, crash_points_binary, pb, AgentConfig, AgentProcess, ClientTls, ServerTls},
    env::Lab,
    nvme::Connection,
    tls::Ca,
};
use prost::Message;
use serde_json::Value;
use std::{
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};
use tonic::Code;

mod common;
use common::{grpc::*, *};

const OLD: &str = "uid-old-lifecycle";
const NEW: &str = "uid-new-lifecycle";

/// One adopted LV served by an mTLS agent with a trust anchor.
struct Setup {
    lab: Lab,
    agent: AgentProcess,
    vg: String,
    name: String,
    id: String,
    ident: LvIdentity,
    dir: PathBuf,
    /// The operator's private key (PKCS#8 PEM); its public half is the anchor.
    operator_key: PathBuf,
    /// The agent's server certificate and key (they sign snapshots).
    server_cert: PathBuf,
    server_key: PathBuf,
    anchor: PathBuf,
}

fn openssl_key(dir: &Path, name: &str, algorithm: &str) -> (PathBuf, PathBuf) {
    let key = dir.join(format!("{name}.key"));
    let public = dir.join(format!("{name}.pub"));
    let opts = match algorithm {
        "ec" => "-algorithm EC -pkeyopt ec_paramgen_curve:prime256v1",
        _ => "-algorithm RSA -pkeyopt rsa_keygen_bits:2048",
    };
    sh(&format!(
        "openssl genpkey {opts} -out {k} 2>/dev/null && openssl pkey -in {k} -pubout -out {p}",
        k = key.display(),
        p = public.display()
    ));
    (key, public)
}

/// An LV with ext4 and a file, an mTLS agent with the operator's public
/// key as trust anchor, the LV adopted (PreserveOriginal) under `OLD` and
/// exported over NVMe/TCP to `HOST_NQN`: the state the lost PVC left.
async fn setup(prefix: &str) -> Setup {
    let lab = Lab::get();
    let vg = lab.vg.clone();
    let name = lab.unique(prefix).replace('-', "_");
    sh(&format!("lvcreate -q -y -L 32M -n {name} {vg}"));
    settle();
    let dev = format!("/dev/{vg}/{name}");
    let mnt = mkdir_tmp();
    sh(&format!(
        "mkfs.ext4 -q {dev} && mount {dev} {m} && printf 'data before the loss\\n' > {m}/data.txt && umount {m}",
        m = mnt.display()
    ));
    let dir = lab.work.join(lab.unique("recovery-keys"));
    fs::create_dir_all(&dir).unwrap();
    let ca = Ca::new(&dir, "recovery-ca").unwrap();
    let server = ca
        .server("storage-1", "127.0.0.1".parse().unwrap())
        .unwrap();
    let client = ca.client("operator").unwrap();
    let (operator_key, anchor) = openssl_key(&dir, "operator", "ec");
    let mut config = AgentConfig::new(
        &lab,
        &lab.unique(prefix),
        vec![format!("lvm={vg}")],
        GRPC_NVME_PORT,
        GRPC_ISCSI_PORT,
    )
    .unwrap();
    config.tls = Some((
        ServerTls {
            identity: server.clone(),
            client_ca: ca.pem.cert.clone(),
        },
        ClientTls {
            server_ca: ca.pem.cert.clone(),
            identity: Some(client),
        },
    ));
    config.extra_args = vec![
        "--recovery-trust-anchor".into(),
        anchor.display().to_string(),
    ];
    let agent = AgentProcess::start(config).await.unwrap();
    let id = format!("{vg}/{name}");
    let ident = lv_identity(&vg, &name);
    let mut c = agent.client().await.unwrap();
    c.create_volume(import_request(&ident, OLD)).await.unwrap();
    c.export_volume(pb::ExportVolumeRequest {
        volume_id: id.clone(),
        backend_type: LVM,
        protocol_type: pb::ProtocolType::NvmeofTcp as i32,
        fence: fence(OLD, 2),
        acl_enabled: true,
        allowed_initiators: vec![HOST_NQN.into()],
        chap: None,
    })
    .await
    .unwrap();
    Setup {
        lab,
        agent,
        vg,
        name,
        id,
        ident,
        dir,
        operator_key,
        server_cert: server.cert,
        server_key: server.key,
        anchor,
    }
}

impl Setup {
    /// InspectVolume through the JSON client; the answer is kept as
    /// `<step>.inspect.json` (the file `recovery sign` reads).
    fn inspect(&self, step: &str) -> (PathBuf, Value) {
        let request = format!(
            r#"{{"volume_id": "{}", "backend_type": "BACKEND_TYPE_LVM"}}"#,
            self.id
        );
        let (status, out, err) = agent_json(&self.lab, &self.agent, &request);
        assert_eq!(status, 0, "agent_json.py failed: {err}");
        let path = self.dir.join(format!("{step}.inspect.json"));
        fs::write(&path, &out).unwrap();
        (path, serde_json::from_str(&out).unwrap())
    }

    /// Step 1 of the spec: UnexportVolume under the old lifecycle's token
    /// read from the inspection, through the JSON client.
    fn unexport_old(&self, inspected: &Value) {
        let uid = inspected["fence"]["volumeUid"].as_str().unwrap();
        let generation = inspected["fence"]["generation"].as_str().unwrap();
        let request = format!(
            r#"{{"volume_id": "{}", "protocol_type": "PROTOCOL_TYPE_NVMEOF_TCP",
 "fence": {{"volume_uid": "{uid}", "generation": "{generation}"}}}}"#,
            self.id
        );
        let (status, _, err) = agent_json_call(&self.lab, &self.agent, "UnexportVolume", &request);
        assert_eq!(status, 0, "UnexportVolume: {err}");
    }

    /// `pillar-csi recovery sign` over an inspection: (snapshot,
    /// authorization, authorizationDigest) as printed.
    fn sign(&self, inspect: &Path, key: &Path, generation: u64, now: Option<&str>) -> Signed {
        let mut args = vec![
            "recovery".to_owned(),
            "sign".into(),
            inspect.display().to_string(),
            key.display().to_string(),
            NEW.into(),
            generation.to_string(),
        ];
        if let Some(now) = now {
            args.extend(["--now".into(), now.into()]);
        }
        let out = std::process::Command::new(binary().unwrap())
            .args(&args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "recovery sign: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Signed::parse(&String::from_utf8_lossy(&out.stdout))
    }

    /// TransferVolumeOwnership as the controller calls it.
    async fn transfer(
        &self,
        signed: &Signed,
    ) -> Result<pb::TransferVolumeOwnershipResponse, tonic::Status> {
        let mut c = self.agent.client().await.unwrap();
        c.transfer_volume_ownership(signed.request(&self.id))
            .await
            .map(tonic::Response::into_inner)
    }

    fn mark(&self) -> FenceMark {
        serde_json::from_slice(&fs::read(mark_file(&self.agent, &self.id)).unwrap()).unwrap()
    }

    fn unchanged(&self) -> Unchanged {
        unchanged(&self.agent, &self.vg, &self.name)
    }

    fn dev(&self) -> String {
        format!("/dev/{}/{}", self.vg, self.name)
    }
}

/// The three lines `recovery sign` prints.
#[derive(Debug, Clone)]
struct Signed {
    snapshot: String,
    authorization: String,
    digest: String,
}

impl Signed {
    fn parse(out: &str) -> Self {
        let line = |key: &str| {
            out.lines()
                .find_map(|l| l.strip_prefix(&format!("{key}: ")))
                .unwrap_or_else(|| panic!("no {key} in {out}"))
                .to_owned()
        };
        Self {
            snapshot: line("snapshot"),
            authorization: line("authorization"),
            digest: line("authorizationDigest"),
        }
    }

    fn request(&self, id: &str) -> pb::TransferVolumeOwnershipRequest {
        pb::TransferVolumeOwnershipRequest {
            volume_id: id.into(),
            backend_type: LVM,
            snapshot: Some(
                pb::RecoverySnapshot::decode(STANDARD.decode(&self.snapshot).unwrap().as_slice())
                    .unwrap(),
            ),
            authorization: Some(
                pb::RecoveryAuthorization::decode(
                    STANDARD.decode(&self.authorization).unwrap().as_slice(),
                )
                .unwrap(),
            ),
        }
    }
}

/// The message of a FAILED_PRECONDITION refusal.
fn refusal<T: std::fmt::Debug>(r: Result<T, tonic::Status>) -> String {
    match r {
        Ok(v) => panic!("expected a refusal, the call succeeded: {v:?}"),
        Err(s) => {
            assert_eq!(s.code(), Code::FailedPrecondition, "{s:?}");
            s.message().to_owned()
        }
    }
}

/// The whole procedure of the spec, step by step: inspect, unexport under
/// the old token, inspect again (idle, with a snapshot), sign, transfer.
/// The new lifecycle owns the volume and serves its data over NVMe/TCP; the
/// old token is refused; the identical retry is ALREADY_COMMITTED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the kernel lab"]
async fn recovery_procedure_moves_an_adopted_lv_to_a_new_lifecycle() -> R {
    let s = setup("recover").await;
    // 1. Stop the old lifecycle: the export is still there.
    let (_, first) = s.inspect("1-before");
    assert_eq!(first["fence"]["volumeUid"], OLD);
    assert_eq!(first["fence"]["generation"], "2");
    assert_eq!(first["exports"].as_array().unwrap().len(), 1);
    s.unexport_old(&first);
    // The spec's conditions, through the camelCase JSON paths.
    let (inspect, idle) = s.inspect("2-idle");
    assert_eq!(idle["exports"], serde_json::json!([]));
    assert_eq!(idle["consumers"], serde_json::json!([]));
    assert_eq!(idle["lvm"]["exclusiveClaim"], "free");
    let snap = &idle["snapshot"];
    assert_eq!(snap["volumeId"], s.id.as_str());
    assert_eq!(snap["oldVolumeUid"], OLD);
    assert_eq!(snap["oldGeneration"], "2");
    assert_eq!(snap["preserveOriginal"], true);
    assert_eq!(snap["agentIdentity"], "storage-1");
    assert_eq!(
        snap["lvmSource"]["logicalVolumeUuid"],
        s.ident.lv_uuid.as_str()
    );
    // 3. Sign (newGeneration = oldGeneration + 1).
    let signed = s.sign(&inspect, &s.operator_key, 3, None);
    // 4. The controller's call.
    let reply = s.transfer(&signed).await?;
    assert_eq!(reply.outcome, pb::TransferOutcome::Committed as i32);
    assert_eq!(reply.fence, fence(NEW, 3));
    assert_eq!(reply.authorization_digest, signed.digest);
    let mark = s.mark();
    let live = mark.fence.live.clone().unwrap();
    assert_eq!((live.volume_uid.as_str(), live.generation), (NEW, 3));
    assert!(mark.fence.ended_uids.contains(OLD));
    let recovered = mark.recovered.clone().unwrap();
    assert_eq!(recovered.authorization_digest, signed.digest);
    assert_eq!(
        (recovered.old_volume_uid.as_str(), recovered.old_generation),
        (OLD, 2)
    );
    assert!(
        mark.adopted.as_ref().unwrap().preserves(),
        "pin and policy kept"
    );
    let (_, after) = s.inspect("3-after");
    assert_eq!(after["fence"]["volumeUid"], NEW);
    assert!(after["fence"]["endedUids"]
        .as_array()
        .unwrap()
        .contains(&Value::from(OLD)));

    // The identical retry: ALREADY_COMMITTED, the mark as it was.
    let bytes = fs::read(mark_file(&s.agent, &s.id))?;
    let retry = s.transfer(&signed).await?;
    assert_eq!(retry.outcome, pb::TransferOutcome::AlreadyCommitted as i32);
    assert_eq!(fs::read(mark_file(&s.agent, &s.id))?, bytes);

    // The old token is refused; the new lifecycle serves the data.
    let mut c = s.agent.client().await?;
    let export = |uid: &str, generation: u64| pb::ExportVolumeRequest {
        volume_id: s.id.clone(),
        backend_type: LVM,
        protocol_type: pb::ProtocolType::NvmeofTcp as i32,
        fence: fence(uid, generation),
        acl_enabled: true,
        allowed_initiators: vec![HOST_NQN.into()],
        chap: None,
    };
    let old = refusal(c.export_volume(export(OLD, 2)).await);
    note(&s.lab, &old);
    assert_eq!(
        old,
        format!(
            "stale fencing token for volume {}: lifecycle {OLD} has ended",
            s.id
        )
    );
    let info = c.export_volume(export(NEW, 3)).await?.into_inner();
    {
        let conn = Connection::tcp("127.0.0.1", GRPC_NVME_PORT, &info.target_id, HOST_NQN)?;
        let remote = conn.namespace_device(1)?;
        assert_eq!(
            read_file_on(&remote.display().to_string(), "data.txt"),
            "data before the loss\n"
        );
    }
    c.unexport_volume(pb::UnexportVolumeRequest {
        volume_id: s.id.clone(),
        protocol_type: pb::ProtocolType::NvmeofTcp as i32,
        fence: fence(NEW, 3),
    })
    .await?;
    assert_eq!(lv_identity(&s.vg, &s.name), s.ident, "the LV is untouched");
    assert_eq!(read_file_on(&s.dev(), "data.txt"), "data before the loss\n");
    let marks: Vec<_> = fs::read_dir(&s.agent.config().state_dir)?.collect();
    assert_eq!(marks.len(), 1, "one mark, no temporary file");
    drop(s.agent);
    sh(&format!("lvremove -q -y {}", s.id));
    Ok(())
}

/// A snapshot taken 16 minutes ago: signed, as the agent signs, with the
/// agent's own server key (the test made it), dated back.
fn stale_snapshot(s: &Setup, fresh: &Path) -> PathBuf {
    let recovery = Recovery::load(&s.anchor, &s.server_cert, &s.server_key).unwrap();
    let text = fs::read_to_string(fresh).unwrap();
    let mut snapshot = pillar_csi_agent::recovery::json::snapshot_of_inspection(&text).unwrap();
    snapshot.issued_at = Some(prost_types::Timestamp::from(
        SystemTime::now() - Duration::from_secs(16 * 60),
    ));
    recovery.sign_snapshot(&mut snapshot).unwrap();
    let mut v: Value = serde_json::from_str(&text).unwrap();
    v["snapshot"]["issuedAt"] = Value::from(snapshot.issued_at.unwrap().to_string());
    v["snapshot"]["signature"] = Value::from(STANDARD.encode(&snapshot.signature));
    let path = s.dir.join("stale.inspect.json");
    fs::write(&path, v.to_string()).unwrap();
    path
}

/// Each refusal of the spec from its real cause, each shown to change
/// nothing (the state folder's bytes, the LV, nvmet and LIO configfs, the
/// mounts); then the valid grant commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the kernel lab"]
async fn recovery_refusals_come_from_their_real_causes() -> R {
    let s = setup("recrefuse").await;
    let (_, first) = s.inspect("1-before");
    s.unexport_old(&first);
    let refused = |why: &str| format!("recovery of volume {} refused: {why}", s.id);
    let check = |name: &str, before: Unchanged, message: String, want: &str| {
        note(&s.lab, &message);
        assert!(
            message.starts_with(&refused(want)),
            "{name}: want {want:?}, got {message:?}"
        );
        assert_eq!(s.unchanged(), before, "{name} changed something");
    };

    // Expired grant: signed two hours ago (issued 2h01m ago, expired 1h ago).
    let (inspect, _) = s.inspect("2-idle");
    let two_hours_ago = prost_types::Timestamp::from(SystemTime::now() - Duration::from_secs(7200));
    let expired = s.sign(
        &inspect,
        &s.operator_key,
        3,
        Some(&two_hours_ago.to_string()),
    );
    let before = s.unchanged();
    check(
        "expired",
        before,
        refusal(s.transfer(&expired).await),
        "authorization: it expired at",
    );

    // Stale snapshot (16 minutes old).
    let stale = s.sign(&stale_snapshot(&s, &inspect), &s.operator_key, 3, None);
    let before = s.unchanged();
    check(
        "stale",
        before,
        refusal(s.transfer(&stale).await),
        "snapshot: issued at",
    );

    // Wrong key: an operator key that is not in the trust anchor.
    let (other_key, _) = openssl_key(&s.dir, "not-trusted", "rsa");
    let wrong = s.sign(&inspect, &other_key, 3, None);
    let before = s.unchanged();
    check(
        "wrong key",
        before,
        refusal(s.transfer(&wrong).await),
        &format!(
            "authorization: its signature does not verify against any key of the trust anchor {}",
            s.anchor.display()
        ),
    );

    // Digest mismatch: a grant over one snapshot sent with another.
    let good = s.sign(&inspect, &s.operator_key, 3, None);
    let (inspect_b, _) = s.inspect("3-other");
    let other = s.sign(&inspect_b, &s.operator_key, 3, None);
    let mixed = Signed {
        snapshot: other.snapshot.clone(),
        ..good.clone()
    };
    let before = s.unchanged();
    check(
        "digest",
        before,
        refusal(s.transfer(&mixed).await),
        "authorization: its snapshot_digest",
    );

    // The LV mounted at transfer time (the grant was signed while idle).
    let mnt = mkdir_tmp();
    sh(&format!("mount -o ro {} {}", s.dev(), mnt.display()));
    let before = s.unchanged();
    let r = s.transfer(&good).await;
    let after = s.unchanged();
    sh(&format!("umount {}", mnt.display()));
    note(&s.lab, &format!("{r:?}"));
    let message = refusal(r);
    assert_eq!(
        message,
        refused(&format!(
            "in use: device {} is mounted at {}; unmount it first",
            s.dev(),
            mnt.display()
        ))
    );
    assert_eq!(after, before, "mounted: nothing changed");

    // An export still admitting an initiator at transfer time (made by the
    // old lifecycle after the snapshot, at the same generation).
    let mut c = s.agent.client().await?;
    let info = c
        .export_volume(pb::ExportVolumeRequest {
            volume_id: s.id.clone(),
            backend_type: LVM,
            protocol_type: pb::ProtocolType::NvmeofTcp as i32,
            fence: fence(OLD, 2),
            acl_enabled: true,
            allowed_initiators: vec![HOST_NQN.into()],
            chap: None,
        })
        .await?
        .into_inner();
    let before = s.unchanged();
    check(
        "export",
        before,
        refusal(s.transfer(&good).await),
        &format!(
            "export: nvmeof-tcp target {} still admits {HOST_NQN}; unexport it under the old lifecycle's token first",
            info.target_id
        ),
    );
    let (_, exported) = s.inspect("4-exported");
    s.unexport_old(&exported);

    // Nothing was recorded by any refusal: the valid grant now commits.
    assert_eq!(s.mark().fence.live.unwrap().volume_uid, OLD);
    let reply = s.transfer(&good).await?;
    assert_eq!(reply.outcome, pb::TransferOutcome::Committed as i32);
    // Any other grant after the commit is refused.
    let late = refusal(s.transfer(&other).await);
    note(&s.lab, &late);
    assert!(
        late.contains(&format!("lifecycle {OLD} has ended")),
        "{late}"
    );
    assert_eq!(read_file_on(&s.dev(), "data.txt"), "data before the loss\n");
    drop(s.agent);
    sh(&format!("lvremove -q -y {}", s.id));
    Ok(())
}

/// Recovery needs mTLS and the trust anchor: an agent asked to serve
/// plaintext with a trust anchor does not start; a plaintext agent (a lab
/// agent without the flag) gives no snapshot and answers
/// TransferVolumeOwnership UNAVAILABLE; an anchor file without a key, or
/// with an Ed25519 key, stops the agent naming the problem.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the kernel lab"]
async fn recovery_needs_mtls_and_a_usable_trust_anchor() -> R {
    let lab = Lab::get();
    let dir = lab.work.join(lab.unique("recovery-start"));
    fs::create_dir_all(&dir)?;
    let (_, anchor) = openssl_key(&dir, "operator", "ec");
    let start = |name: &str, extra: Vec<String>, plaintext: bool| {
        let mut config = AgentConfig::new(
            &lab,
            &lab.unique(name),
            vec![format!("lvm={}", lab.vg)],
            GRPC_NVME_PORT,
            GRPC_ISCSI_PORT,
        )
        .unwrap();
        config.extra_args = extra;
        if !plaintext {
            let ca = Ca::new(&dir, &lab.unique("ca")).unwrap();
            let server = ca
                .server("storage-1", "127.0.0.1".parse().unwrap())
                .unwrap();
            let client = ca.client("operator").unwrap();
            config.tls = Some((
                ServerTls {
                    identity: server,
                    client_ca: ca.pem.cert.clone(),
                },
                ClientTls {
                    server_ca: ca.pem.cert.clone(),
                    identity: Some(client),
                },
            ));
        }
        config
    };
    let flag = |path: &Path| {
        vec![
            "--recovery-trust-anchor".to_owned(),
            path.display().to_string(),
        ]
    };

    let refused_start = |config: AgentConfig| async move {
        let err = AgentProcess::start(config)
            .await
            .expect_err("must not start");
        err.to_string()
    };
    let plaintext = refused_start(start("rec-plain", flag(&anchor), true)).await;
    assert!(
        plaintext.contains("--recovery-trust-anchor needs mTLS"),
        "{plaintext}"
    );
    let empty = dir.join("empty.pem");
    fs::write(&empty, "")?;
    let no_key = refused_start(start("rec-empty", flag(&empty), false)).await;
    assert!(
        no_key.contains("no PUBLIC KEY or CERTIFICATE block with a usable key"),
        "{no_key}"
    );
    let ed = dir.join("ed25519.pem");
    sh(&format!(
        "openssl genpkey -algorithm ED25519 | openssl pkey -pubout -out {}",
        ed.display()
    ));
    let ed_key = refused_start(start("rec-ed", flag(&ed), false)).await;
    assert!(
        ed_key.contains("holds a key of algorithm 1.3.101.112"),
        "{ed_key}"
    );
    let missing = refused_start(start("rec-missing", flag(&dir.join("absent.pem")), false)).await;
    assert!(missing.contains("cannot read it"), "{missing}");

    // A plaintext lab agent: no snapshot, transfers UNAVAILABLE.
    let vg = lab.vg.clone();
    let name = lab.unique("recplain").replace('-', "_");
    sh(&format!("lvcreate -q -y -L 16M -n {name} {vg}"));
    settle();
    let agent = AgentProcess::start(start("rec-lab", vec![], true)).await?;
    let mut c = agent.client().await?;
    let ident = lv_identity(&vg, &name);
    c.create_volume(import_request(&ident, OLD)).await?;
    let id = format!("{vg}/{name}");
    let inspected = c
        .inspect_volume(pb::InspectVolumeRequest {
            volume_id: id.clone(),
            backend_type: LVM,
        })
        .await?
        .into_inner();
    assert_eq!(inspected.fence.unwrap().volume_uid, OLD);
    assert!(
        inspected.snapshot.is_none(),
        "no snapshot for a plaintext caller"
    );
    let before = unchanged(&agent, &vg, &name);
    let status = c
        .transfer_volume_ownership(pb::TransferVolumeOwnershipRequest {
            volume_id: id.clone(),
            backend_type: LVM,
            snapshot: Some(pb::RecoverySnapshot::default()),
            authorization: Some(pb::RecoveryAuthorization::default()),
        })
        .await
        .expect_err("unavailable");
    note(&lab, status.message());
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(
        status.message(),
        "recovery is not configured on this agent: start it with --recovery-trust-anchor"
    );
    assert_eq!(unchanged(&agent, &vg, &name), before);
    drop(agent);
    sh(&format!("lvremove -q -y {id}"));
    Ok(())
}

/// kill -9 of the agent between the new mark's rename and the reply (the
/// test-only crash point `transfer-after-rename` stops the agent there),
/// then the controller's retry of the identical request: ALREADY_COMMITTED,
/// and one mark (no temporary file) holding the new lifecycle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the kernel lab"]
async fn recovery_kill_after_the_rename_then_retry_is_already_committed() -> R {
    let mut s = setup("reckill").await;
    let (_, first) = s.inspect("1-before");
    s.unexport_old(&first);
    let (inspect, _) = s.inspect("2-idle");
    let signed = s.sign(&inspect, &s.operator_key, 3, None);
    s.agent.config_mut().binary = Some(crash_points_binary()?);
    s.agent.config_mut().env = vec![(
        pillar_csi_agent::crash::ENV.into(),
        "transfer-after-rename".into(),
    )];
    s.agent.restart().await?;
    assert!(s
        .agent
        .log()
        .contains("crash point transfer-after-rename armed"));

    let request = signed.request(&s.id);
    let mut c = s.agent.client().await?;
    let call = tokio::spawn(async move { c.transfer_volume_ownership(request).await });
    let start = Instant::now();
    while !s
        .agent
        .log()
        .contains("crash point transfer-after-rename reached")
    {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the crash point was not reached; log:\n{}",
            s.agent.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    s.agent.kill()?; // SIGKILL
    let lost = call.await?;
    assert!(lost.is_err(), "the reply never came: {lost:?}");
    // The rename happened: the new lifecycle is on disk, in one mark.
    let mark = s.mark();
    assert_eq!(mark.fence.live.clone().unwrap().volume_uid, NEW);
    assert_eq!(
        mark.recovered.clone().unwrap().authorization_digest,
        signed.digest
    );
    let state_dir = s.agent.config().state_dir.clone();
    let files = || -> Vec<String> {
        fs::read_dir(&state_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    };
    assert_eq!(files().len(), 1, "{:?}", files());

    // The controller retries the identical request on the restarted agent.
    s.agent.config_mut().env.clear();
    s.agent.restart().await?;
    let bytes = fs::read(mark_file(&s.agent, &s.id))?;
    let retry = s.transfer(&signed).await?;
    assert_eq!(retry.outcome, pb::TransferOutcome::AlreadyCommitted as i32);
    assert_eq!(retry.fence, fence(NEW, 3));
    assert_eq!(
        retry.authorization_digest,
        hex(&pillar_csi_agent::recovery::authorization_digest(
            signed.request(&s.id).authorization.as_ref().unwrap()
        ))
    );
    assert_eq!(
        fs::read(mark_file(&s.agent, &s.id))?,
        bytes,
        "the retry wrote nothing"
    );
    assert_eq!(files().len(), 1, "one mark");
    assert_eq!(read_file_on(&s.dev(), "data.txt"), "data before the loss\n");
    drop(s.agent);
    sh(&format!("lvremove -q -y {}", s.id));
    Ok(())
}
