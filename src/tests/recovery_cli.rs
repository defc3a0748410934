//! The operator's CLI against the agent's gRPC service on the host: the
//! `pillar-csi` binary (`recovery inspect|sign|verify`, `rebind-check`)
//! talks over mTLS to the real service (`AgentGrpc` with a trust anchor)
//! over the simulator's volume group. The same steps against real LVM, the
//! agent binary and the independent JSON client are the lab's
//! `recovery_procedure_moves_an_adopted_lv_to_a_new_lifecycle`; this one
//! runs with `cargo test` everywhere.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use base64::{engine::general_purpose::STANDARD, Engine};
use pillar_csi_agent::{
    grpc::AgentGrpc,
    marks::MarkStore,
    recovery::Recovery,
    service,
    service::sim,
    service::sim_lvm::{VG, VG_UUID},
};
use pillar_csi_lab::tls::{Ca, Pem};
use pillar_csi_proto::agent::v1 as pb;
use pillar_csi_proto::agent::v1::{
    agent_service_client::AgentServiceClient, agent_service_server::AgentServiceServer,
};
use prost::Message;
use serde_json::Value;
use std::{path::Path, process::Command, sync::Arc};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, Server, ServerTlsConfig};

const OLD: &str = "uid-old";
const NEW: &str = "uid-new";

/// One run of the binary: (success, stdout, stderr).
fn pillar(args: &[String]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_pillar-csi"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// The in-process agent behind mTLS, with the trust anchor `anchor`; its address.
async fn serve(agent: Arc<service::Agent>, server: &Pem, ca: &Path) -> std::net::SocketAddr {
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(
            std::fs::read(&server.cert).unwrap(),
            std::fs::read(&server.key).unwrap(),
        ))
        .client_ca_root(Certificate::from_pem(std::fs::read(ca).unwrap()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = Server::builder()
        .tls_config(tls)
        .unwrap()
        .add_service(AgentServiceServer::new(AgentGrpc::new(agent, "sim")));
    tokio::spawn(async move {
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        router.serve_with_incoming(incoming).await.unwrap();
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_cli_against_the_agent_service_over_mtls() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new(dir.path(), "ca").unwrap();
    let server = ca
        .server("storage-1", "127.0.0.1".parse().unwrap())
        .unwrap();
    let client = ca.client("operator").unwrap();
    let (key, anchor) = (
        dir.path().join("operator.key"),
        dir.path().join("operator.pub"),
    );
    let made = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:prime256v1 -out {} 2>/dev/null && openssl pkey -in {} -pubout -out {}",
            s(&key), s(&key), s(&anchor)
        ))
        .status()
        .unwrap();
    assert!(made.success());

    let fixture = sim::fixture();
    let lv_uuid = fixture.lvm.add("legacy", 32 << 20);
    let agent = Arc::new(
        service::Agent::new(
            vec![fixture.backend.clone(), fixture.lvm.clone()],
            vec![fixture.exporter.clone()],
            MarkStore::open(dir.path().join("marks")).unwrap(),
        )
        .with_recovery(Recovery::load(&anchor, &server.cert, &server.key).unwrap()),
    );
    let addr = serve(agent, &server, &ca.pem.cert).await;
    let channel = Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(std::fs::read(&ca.pem.cert).unwrap()))
                .identity(Identity::from_pem(
                    std::fs::read(&client.cert).unwrap(),
                    std::fs::read(&client.key).unwrap(),
                )),
        )
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut c = AgentServiceClient::new(channel);
    let id = format!("{}/legacy", VG);
    let source = pb::LvmIdentity {
        volume_group: VG.into(),
        logical_volume: "legacy".into(),
        volume_group_uuid: VG_UUID.into(),
        logical_volume_uuid: lv_uuid.clone(),
    };
    c.create_volume(pb::CreateVolumeRequest {
        volume_id: id.clone(),
        backend_type: pb::BackendType::Lvm as i32,
        capacity_bytes: 1 << 20,
        fence: Some(pb::FenceToken {
            volume_uid: OLD.into(),
            generation: 1,
        }),
        import_lv: Some(source),
        ..Default::default()
    })
    .await
    .unwrap();

    let flags = |cert: bool| {
        let mut f = vec![
            "--agent".to_owned(),
            addr.to_string(),
            "--cacert".into(),
            s(&ca.pem.cert),
        ];
        if cert {
            f.extend([
                "--cert".into(),
                s(&client.cert),
                "--key".into(),
                s(&client.key),
            ]);
        }
        f
    };
    let inspect = |volume: &str, cert: bool| {
        let mut a = vec!["recovery".to_owned(), "inspect".into()];
        a.extend(flags(cert));
        a.extend(["--volume-id".into(), volume.into()]);
        pillar(&a)
    };

    // inspect: the answer with a snapshot of the old lifecycle.
    let (ok, out, err) = inspect(&id, true);
    assert!(ok, "{err}");
    let inspected: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(inspected["fence"]["volumeUid"], OLD);
    assert_eq!(inspected["snapshot"]["oldGeneration"], "1");
    assert_eq!(inspected["snapshot"]["agentIdentity"], "storage-1");
    let file = dir.path().join("inspect.json");
    std::fs::write(&file, &out).unwrap();
    // Refusals naming their cause.
    let (ok, _, err) = inspect(&id, false);
    assert!(!ok);
    assert!(err.contains("--cert, --key missing"), "{err}");
    let (ok, _, err) = inspect(&format!("{}/absent", VG), true);
    assert!(!ok);
    assert!(
        err.contains(&format!("InspectVolume of {}/absent: ", VG)),
        "{err}"
    );

    // sign, then verify: every rule; a tampered grant names its rule.
    let (ok, out, err) = pillar(&[
        "recovery".into(),
        "sign".into(),
        s(&file),
        s(&key),
        NEW.into(),
        "2".into(),
    ]);
    assert!(ok, "{err}");
    let line = |k: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}: ")))
            .unwrap()
            .to_owned()
    };
    let (snapshot, authorization, digest) = (
        line("snapshot"),
        line("authorization"),
        line("authorizationDigest"),
    );
    let verify = |grant: &str| {
        pillar(&[
            "recovery".into(),
            "verify".into(),
            "--trust-anchor".into(),
            s(&anchor),
            "--agent-cert".into(),
            s(&server.cert),
            "--snapshot".into(),
            snapshot.clone(),
            "--authorization".into(),
            grant.into(),
        ])
    };
    let (ok, out, err) = verify(&authorization);
    assert!(ok, "{err}");
    for rule in [
        "snapshot signature",
        "authorization signature",
        "snapshot digest",
        "windows",
        "agreement",
    ] {
        assert!(out.lines().any(|l| l == format!("ok: {rule}")), "{out}");
    }
    let mut grant =
        pb::RecoveryAuthorization::decode(STANDARD.decode(&authorization).unwrap().as_slice())
            .unwrap();
    grant.new_volume_uid = "uid-someone-else".into();
    let (ok, _, err) = verify(&STANDARD.encode(grant.encode_to_vec()));
    assert!(!ok);
    assert!(err.contains("refused: authorization signature: "), "{err}");

    // The controller's call commits.
    let decode = |b: &str| STANDARD.decode(b).unwrap();
    let reply = c
        .transfer_volume_ownership(pb::TransferVolumeOwnershipRequest {
            volume_id: id.clone(),
            backend_type: pb::BackendType::Lvm as i32,
            snapshot: Some(pb::RecoverySnapshot::decode(decode(&snapshot).as_slice()).unwrap()),
            authorization: Some(
                pb::RecoveryAuthorization::decode(decode(&authorization).as_slice()).unwrap(),
            ),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.outcome, pb::TransferOutcome::Committed as i32);
    assert_eq!(reply.authorization_digest, digest);

    // rebind-check, live, against the record after the transfer.
    let record = |uid: &str, volume: &str| {
        let v = serde_json::json!({
            "apiVersion": "pillar-csi.bhyoo.com/v1alpha1",
            "kind": "PillarVolumeState",
            "metadata": {"name": "pvc-claim", "uid": uid},
            "spec": {
                "volumeID": format!("storage-1/nvmeof-tcp/lvm-lv/{volume}"),
                "agentVolumeID": volume, "agentRef": "storage-1",
                "backendType": "lvm-lv", "protocolType": "nvmeof-tcp",
                "recovery": {"oldVolumeUID": OLD, "oldGeneration": 1, "newGeneration": 2,
                             "source": {"volumeGroup": VG, "logicalVolume": "legacy",
                                        "volumeGroupUUID": VG_UUID,
                                        "logicalVolumeUUID": lv_uuid, "preserveOriginal": true},
                             "newVolumeUID": NEW, "authorization": authorization,
                             "authorizationDigest": digest}},
            "status": {"phase": "Ready", "publicationGeneration": 2}
        });
        let path = dir
            .path()
            .join(format!("pvs-{uid}-{}.json", volume.replace('/', "_")));
        std::fs::write(&path, v.to_string()).unwrap();
        path
    };
    let rebind = |pvs: &Path, volume: Option<&str>| {
        let mut a = vec!["rebind-check".to_owned()];
        a.extend(flags(true));
        if let Some(v) = volume {
            a.extend(["--volume-id".into(), v.into()]);
        }
        a.extend(["--pvs-json".into(), s(pvs)]);
        pillar(&a)
    };
    let falses = |out: &str| -> Vec<String> {
        out.lines()
            .filter_map(|l| l.strip_prefix("false\t# "))
            .map(str::to_owned)
            .collect()
    };
    let (ok, out, _) = rebind(&record(NEW, &id), None);
    assert!(ok, "{out}");
    assert_eq!(
        out.lines().filter(|l| l.starts_with("true\t# ")).count(),
        9,
        "{out}"
    );
    let (ok, out, _) = rebind(&record(OLD, &id), None);
    assert!(!ok);
    assert_eq!(
        falses(&out),
        ["$in.fence.volumeUid == $pvs.metadata.uid"],
        "{out}"
    );
    let (ok, out, _) = rebind(&record(NEW, &format!("{}/other", VG)), Some(&id));
    assert!(!ok);
    assert_eq!(
        falses(&out),
        ["$in.volumeId == $pvs.spec.agentVolumeID"],
        "{out}"
    );
}
