//! The spec's procedure, step by step, with the operator's tools checked
//! against the real agent along the way: `recovery inspect` against the
//! independent JSON client, `recovery verify` on the real snapshot and
//! grant (and on tampered ones), `rebind-check` live against the record
//! the controller holds after the transfer, and `recovery inspect`'s
//! refusals (no client certificate, a volume that does not exist, an agent
//! without `--recovery-trust-anchor`).
use crate::common::{grpc::*, *};
use crate::setup::{refusal, *};
use base64::{engine::general_purpose::STANDARD, Engine};
use pillar_csi_lab::{agent::pb, nvme::Connection};
use prost::Message;
use serde_json::Value;
use std::{
    fs,
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

/// An inspection without what differs between two calls of an idle LV:
/// the observation time and the snapshot's time and signature.
fn without_times(v: &Value) -> Value {
    let mut v = v.clone();
    v.as_object_mut().unwrap().remove("observedAt");
    let snapshot = v["snapshot"].as_object_mut().expect("a snapshot");
    snapshot.remove("issuedAt");
    snapshot.remove("signature");
    v
}

/// The rules `recovery verify` reports, in its order.
const RULES: [&str; 5] = [
    "snapshot signature",
    "authorization signature",
    "snapshot digest",
    "windows",
    "agreement",
];

/// `recovery verify` passed every rule of `signed`.
fn verified(s: &Setup, which: &str, signed: &Signed) {
    let run = s.verify(&signed.snapshot, &signed.authorization, None);
    assert!(run.ok, "{which}: {run:?}");
    for rule in RULES {
        assert!(
            run.stdout.lines().any(|l| l == format!("ok: {rule}")),
            "{which}: no `ok: {rule}` in {}",
            run.stdout
        );
    }
    assert!(
        run.stdout
            .contains(&format!("authorizationDigest: {}", signed.digest)),
        "{which}: {}",
        run.stdout
    );
}

/// `recovery verify` refused, naming `rule` and `why`.
fn refused_by(run: Run, rule: &str, why: &str) {
    assert!(!run.ok, "{rule}: verify passed: {run:?}");
    let want = format!("refused: {rule}: {why}");
    assert!(
        run.stderr.contains(&want),
        "want {want:?} in {:?}",
        run.stderr
    );
}

/// The PillarVolumeState the controller holds after the committed transfer
/// (as `csi/src/controller/recovery.rs` leaves it: `spec.recovery` with the
/// write-once fields, no `lvmSource`, status Ready at newGeneration with the
/// latch), with `uid` and `agent_volume_id`, written as `kubectl get -o json`
/// prints it.
fn recovered_record(s: &Setup, signed: &Signed, uid: &str, agent_volume_id: &str) -> PathBuf {
    use api::{
        crd::{
            ClaimRef, LvmSource, PillarVolumeState, PillarVolumeStateSpec, PillarVolumeStateStatus,
            Recovery, RecoveryLatch, VolumePhase,
        },
        tokens::{Backend, Protocol},
    };
    let claim = "6a1c8c1e-0000-4000-8000-00000000c1a1";
    let mut state = PillarVolumeState::new(
        &format!("pvc-{claim}"),
        PillarVolumeStateSpec {
            volume_id: format!("storage-1/nvmeof-tcp/lvm-lv/{agent_volume_id}"),
            agent_volume_id: agent_volume_id.into(),
            agent_ref: "storage-1".into(),
            backend_type: Backend::LvmLv,
            protocol_type: Protocol::NvmeofTcp,
            capacity_bytes: 32 << 20,
            claim_ref: Some(ClaimRef {
                uid: claim.into(),
                namespace: "db".into(),
                name: "data-legacy".into(),
            }),
            imported_from: None,
            lvm_source: None,
            resolved: None,
            export_spec: None,
            recovery: Some(Recovery {
                old_volume_uid: OLD.into(),
                old_generation: 2,
                new_generation: 3,
                source: LvmSource {
                    volume_group: s.vg.clone(),
                    logical_volume: s.name.clone(),
                    volume_group_uuid: s.ident.vg_uuid.as_str().to_owned(),
                    logical_volume_uuid: s.ident.lv_uuid.as_str().to_owned(),
                    preserve_original: true,
                },
                new_volume_uid: Some(NEW.into()),
                authorization: Some(signed.authorization.clone()),
                authorization_digest: Some(signed.digest.clone()),
            }),
        },
    );
    state.metadata.uid = Some(uid.into());
    let sha = ring::digest::digest(&ring::digest::SHA256, signed.authorization.as_bytes());
    state.status = Some(PillarVolumeStateStatus {
        publication_generation: Some(3),
        phase: Some(VolumePhase::Ready),
        recovery_latch: Some(RecoveryLatch {
            new_volume_uid: NEW.into(),
            authorization_digest: signed.digest.clone(),
            authorization_sha256: pillar_csi_agent::recovery::hex(sha.as_ref()),
        }),
        ..Default::default()
    });
    let path = s.dir.join(format!(
        "pvs-{uid}-{}.json",
        agent_volume_id.replace('/', "_")
    ));
    fs::write(&path, serde_json::to_string_pretty(&state).unwrap()).unwrap();
    path
}

/// `rebind-check` live: InspectVolume of `volume_id` (default: the record's
/// agentVolumeID) against the record in `pvs`.
fn rebind_check(s: &Setup, pvs: &Path, volume_id: Option<&str>) -> Run {
    let mut args = vec!["rebind-check".to_owned()];
    args.extend(s.flags());
    if let Some(id) = volume_id {
        args.extend(["--volume-id".into(), id.into()]);
    }
    args.extend(["--pvs-json".into(), pvs.display().to_string()]);
    pillar(&args)
}

/// The lines `rebind-check` printed that are `false`, by check.
fn false_lines(run: &Run) -> Vec<String> {
    run.stdout
        .lines()
        .filter_map(|l| l.strip_prefix("false\t# "))
        .map(str::to_owned)
        .collect()
}

/// The whole procedure of the spec, step by step: inspect, unexport under
/// the old token, inspect again (idle, with a snapshot), sign, transfer.
/// The new lifecycle owns the volume and serves its data over NVMe/TCP; the
/// old token is refused; the identical retry is ALREADY_COMMITTED. Along
/// the way the operator's CLI is checked against the same agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the kernel lab"]
async fn recovery_procedure_moves_an_adopted_lv_to_a_new_lifecycle() -> R {
    let mut s = setup("recover").await;
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

    // `recovery inspect` of the same idle LV over mTLS: the same answer as
    // the JSON client's, field for field, but for the times and signature.
    let (inspect_cli, idle_cli) = s.inspect_cli("2-idle-cli");
    assert_eq!(without_times(&idle_cli), without_times(&idle));
    assert!(!idle_cli["snapshot"]["signature"]
        .as_str()
        .unwrap()
        .is_empty());

    // 3. Sign (newGeneration = oldGeneration + 1), over both inspections:
    // `recovery sign` reads both, and each snapshot and grant verifies
    // against the agent's certificate and the trust anchor.
    let signed = s.sign(&inspect, &s.operator_key, 3, None);
    let signed_cli = s.sign(&inspect_cli, &s.operator_key, 3, None);
    verified(&s, "agent_json.py", &signed);
    verified(&s, "recovery inspect", &signed_cli);
    let (mut a, mut b) = (signed.snapshot(), signed_cli.snapshot());
    for x in [&mut a, &mut b] {
        x.issued_at = None;
        x.signature.clear();
    }
    assert_eq!(a, b, "the two snapshots differ beyond time and signature");

    // `recovery verify` names the rule a tampered grant or snapshot breaks.
    let mut grant = signed.grant();
    grant.new_generation = 4;
    let tampered = STANDARD.encode(grant.encode_to_vec());
    refused_by(
        s.verify(&signed.snapshot, &tampered, None),
        "authorization signature",
        &format!(
            "it does not verify against any key of {}",
            s.anchor.display()
        ),
    );
    let mut snapshot = signed.snapshot();
    snapshot.old_generation = 1;
    refused_by(
        s.verify(
            &STANDARD.encode(snapshot.encode_to_vec()),
            &signed.authorization,
            None,
        ),
        "snapshot signature",
        &format!("it does not verify against {}", s.server_cert.display()),
    );
    let later = prost_types::Timestamp::from(SystemTime::now() + Duration::from_secs(20 * 60));
    refused_by(
        s.verify(
            &signed.snapshot,
            &signed.authorization,
            Some(&later.to_string()),
        ),
        "windows",
        "snapshot: issued at",
    );

    // `recovery inspect`'s refusals, each naming its cause: no client
    // certificate, a volume that does not exist.
    let (_, client) = s.agent.config().tls.clone().unwrap();
    let mut args = vec!["recovery".to_owned(), "inspect".into()];
    args.extend(agent_flags(s.agent.addr(), &client.server_ca, None));
    args.extend(["--volume-id".into(), s.id.clone()]);
    let no_cert = pillar(&args);
    assert!(!no_cert.ok, "{no_cert:?}");
    assert!(
        no_cert
            .stderr
            .contains("--cert, --key missing: the agent gives recovery snapshots only over mTLS"),
        "{no_cert:?}"
    );
    let absent = format!("{}/absent_lv", s.vg);
    let missing = s.inspect_cli_run(&absent, &[]);
    assert!(!missing.ok, "{missing:?}");
    assert!(
        missing.stderr.contains(&format!(
            "InspectVolume of {absent}: FailedPrecondition: volume {absent}: logical volume {absent} is missing"
        )),
        "{missing:?}"
    );

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
    let (_, after) = s.inspect_cli("3-after");
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

    // `rebind-check` live against the record the controller now holds:
    // every line true (the volume ID read from the record); the old
    // lifecycle's record, or a record of another volume, turns its line false.
    let good = rebind_check(&s, &recovered_record(&s, &signed, NEW, &s.id), None);
    assert!(good.ok, "{good:?}");
    assert_eq!(good.stdout.lines().count(), 9, "{}", good.stdout);
    assert!(
        good.stdout.lines().all(|l| l.starts_with("true\t# ")),
        "{}",
        good.stdout
    );
    let stale = rebind_check(&s, &recovered_record(&s, &signed, OLD, &s.id), None);
    assert!(!stale.ok, "{stale:?}");
    assert_eq!(
        false_lines(&stale),
        ["$in.fence.volumeUid == $pvs.metadata.uid"],
        "{}",
        stale.stdout
    );
    let other = format!("{}/another_lv", s.vg);
    let elsewhere = rebind_check(&s, &recovered_record(&s, &signed, NEW, &other), Some(&s.id));
    assert!(!elsewhere.ok, "{elsewhere:?}");
    assert_eq!(
        false_lines(&elsewhere),
        ["$in.volumeId == $pvs.spec.agentVolumeID"],
        "{}",
        elsewhere.stdout
    );

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
    drop(c);
    assert_eq!(lv_identity(&s.vg, &s.name), s.ident, "the LV is untouched");
    assert_eq!(read_file_on(&s.dev(), "data.txt"), "data before the loss\n");
    let marks: Vec<_> = fs::read_dir(&s.agent.config().state_dir)?.collect();
    assert_eq!(marks.len(), 1, "one mark, no temporary file");

    // The same agent restarted without --recovery-trust-anchor answers
    // InspectVolume without a snapshot: `recovery inspect` refuses it,
    // naming the flag, and prints it with --allow-no-snapshot.
    s.agent.config_mut().extra_args.clear();
    s.agent.restart().await?;
    let bare = s.inspect_cli_run(&s.id, &[]);
    assert!(!bare.ok, "{bare:?}");
    assert!(
        bare.stderr
            .contains("InspectVolume answered without a snapshot")
            && bare
                .stderr
                .contains("when it runs with --recovery-trust-anchor"),
        "{bare:?}"
    );
    let printed = s.inspect_cli_run(&s.id, &["--allow-no-snapshot"]);
    assert!(printed.ok, "{printed:?}");
    let printed: Value = serde_json::from_str(&printed.stdout)?;
    assert_eq!(printed["fence"]["volumeUid"], NEW);
    assert!(printed.get("snapshot").is_none(), "{printed}");
    drop(s.agent);
    sh(&format!("lvremove -q -y {}", s.id));
    Ok(())
}
