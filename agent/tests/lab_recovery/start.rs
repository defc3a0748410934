//! What recovery needs to start (mTLS, a usable trust anchor) and what a
//! kill -9 between the mark's rename and the reply leaves.
use crate::common::{grpc::*, *};
use crate::setup::*;
use pillar_csi_agent::recovery::hex;
use pillar_csi_lab::{
    agent::{crash_points_binary, pb, AgentConfig, AgentProcess, ClientTls, ServerTls},
    env::Lab,
    tls::Ca,
};
use std::{
    fs,
    path::Path,
    time::{Duration, Instant},
};
use tonic::Code;

/// Recovery needs mTLS and the trust anchor: an agent asked to serve
/// plaintext with a trust anchor does not start; a plaintext agent (a lab
/// agent without the flag) gives no snapshot and answers
/// TransferVolumeOwnership UNAVAILABLE, and `pillar-csi recovery inspect`
/// against it fails naming plaintext; an anchor file without a key, or
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
    // `recovery inspect` with an operator's mTLS flags: no mTLS connection,
    // and the message says the agent may be serving plaintext.
    let ca = Ca::new(&dir, &lab.unique("ca-cli"))?;
    let client = ca.client("operator")?;
    let mut args = vec!["recovery".to_owned(), "inspect".into()];
    args.extend(agent_flags(agent.addr(), &ca.pem.cert, Some(&client)));
    args.extend(["--volume-id".into(), id.clone()]);
    let plain = pillar(&args);
    assert!(!plain.ok, "{plain:?}");
    assert!(
        plain
            .stderr
            .contains(&format!("agent {}: no mTLS connection (", agent.addr()))
            && plain.stderr.contains("is it serving plaintext"),
        "{plain:?}"
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
    let (_, first) = s.inspect_cli("1-before");
    s.unexport_old_grpc(&first).await;
    let (inspect, _) = s.inspect_cli("2-idle");
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
        .contains("crash point transfer-after-rename@1 armed"));

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
