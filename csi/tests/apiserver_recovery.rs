//! Metadata-loss recovery through the Controller service against a real
//! kube-apiserver 1.20 (spec: adopt-lvm-lv.md, "Recover after metadata
//! loss"): the record the operator writes is RecoveryPending, refuses
//! publish, expand and delete, and CreateVolume refuses every disagreement
//! of the record, the claim and the grant (on the claim and on the record)
//! before the agent is called; the agent's refusal keeps it pending. With
//! the simulator's volume group and a trust anchor, the whole path commits:
//! agent-signed snapshot, operator-signed grant, TransferVolumeOwnership,
//! Ready at newGeneration. The agent is the in-process one behind mTLS.
use api::annotations::{IMPORT_LV_ANNOTATION, RECOVERY_SNAPSHOT_ANNOTATION};
use api::crd::*;
use api::tokens::{Backend, Protocol};
use base64::{engine::general_purpose::STANDARD, Engine};
use csi::controller::agents::Agents;
use csi::controller::recovery::{authorization_digest, is_pending, snapshot_digest};
use csi::controller::Controller;
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use pillar_csi_agent::grpc::AgentGrpc;
use pillar_csi_agent::service::sim;
use pillar_csi_lab::apiserver::ApiServer;
use pillar_csi_proto::agent::v1 as agent;
use pillar_csi_proto::csi::v1 as pb;
use pillar_csi_proto::csi::v1::controller_server::Controller as _;
use pillar_csi_proto::csi::v1::volume_capability::{access_mode::Mode, AccessMode, AccessType};
use prost::Message;
use std::collections::HashMap;
use tonic::transport::{Certificate, Identity};
use tonic::{Code, Request};

mod common;

use common::parts::*;
use common::Result;

const HANDLE: &str = "storage-1/nvmeof-tcp/lvm-lv/data-vg/legacy";
const OLD: &str = "uid-of-the-lost-record";

struct Bed {
    port: u16,
    agent_client_tls: (std::path::PathBuf, pillar_csi_lab::tls::Pem),
    server: ApiServer,
    client: kube::Client,
    controller: Controller,
    _certs: Certs,
    _fixture: sim::Fixture,
    _agent: AgentServer,
}

/// The API server with the chart's CRDs, the simulated agent behind mTLS
/// (no trust anchor) as PillarAgent storage-1, an LVM store on data-vg and
/// the class `lvm` over NVMe/TCP; the controller as its ServiceAccount.
async fn bed() -> Result<Bed> {
    bed_with(false).await
}

/// [`bed`]; with `recovery`, the agent runs with a trust anchor holding the
/// public half of `<certs>/operator.key` (its server key signs snapshots).
async fn bed_with(recovery: bool) -> Result<Bed> {
    let server = ApiServer::start()?;
    server.install_chart_crds().await?;
    let client = server.client().await?;
    let certs = Certs::new()?;
    let fixture = sim::fixture();
    let agent = if recovery {
        let key = certs.dir.path().join("operator.key");
        let public = certs.dir.path().join("operator.pub");
        let made = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:prime256v1 -out {k} 2>/dev/null && openssl pkey -in {k} -pubout -out {p}",
                k = key.display(),
                p = public.display()
            ))
            .status()?;
        assert!(made.success(), "openssl made the operator key");
        let marks = pillar_csi_agent::marks::MarkStore::open(certs.dir.path().join("marks"))
            .map_err(|e| e.to_string())?;
        std::sync::Arc::new(
            pillar_csi_agent::service::Agent::new(
                vec![fixture.backend.clone(), fixture.lvm.clone()],
                vec![fixture.exporter.clone()],
                marks,
            )
            .with_recovery(
                pillar_csi_agent::recovery::Recovery::load(
                    &public,
                    &certs.agent.cert,
                    &certs.agent.key,
                )
                .map_err(|e| e.to_string())?,
            ),
        )
    } else {
        fixture.agent.clone()
    };
    let agent_client_tls = (certs.ca.pem.cert.clone(), certs.controller.clone());
    let service = AgentGrpc::new(agent, "sim");
    let (port, agent) = serve_agent(&certs.agent_server_tls()?, service, 0).await?;
    create_agent(&client, port).await?;
    create_objects(
        &client,
        &[lvm_store()],
        &[class("lvm", "storage-1-lvm", "pillar-lvm", None)],
    )
    .await?;
    let agents = Agents::new(Some(&certs.controller_tls()))?;
    let controller = Controller::new(server.controller_client().await?, agents);
    Ok(Bed {
        port,
        agent_client_tls,
        server,
        client,
        controller,
        _certs: certs,
        _fixture: fixture,
        _agent: agent,
    })
}

fn cap() -> pb::VolumeCapability {
    pb::VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Block(Default::default())),
    }
}

fn source() -> LvmSource {
    LvmSource {
        volume_group: "data-vg".into(),
        logical_volume: "legacy".into(),
        volume_group_uuid: "vg-uuid-1".into(),
        logical_volume_uuid: "lv-uuid-1".into(),
        preserve_original: true,
    }
}

fn identity() -> agent::LvmIdentity {
    let s = source();
    agent::LvmIdentity {
        volume_group: s.volume_group,
        logical_volume: s.logical_volume,
        volume_group_uuid: s.volume_group_uuid,
        logical_volume_uuid: s.logical_volume_uuid,
    }
}

/// A snapshot as the agent issues it (the signature is not checked by the
/// controller; the agent checks it).
fn snapshot() -> agent::RecoverySnapshot {
    agent::RecoverySnapshot {
        volume_id: "data-vg/legacy".into(),
        backend_type: agent::BackendType::Lvm as i32,
        lvm_source: Some(identity()),
        old_volume_uid: OLD.into(),
        old_generation: 4,
        preserve_original: true,
        exclusive_claim: "free".into(),
        agent_identity: "agent".into(),
        signature: vec![0x30, 0x01],
        ..Default::default()
    }
}

/// The grant the spec's program signs over `snap` for the record `uid`.
fn grant(snap: &agent::RecoverySnapshot, uid: &str) -> agent::RecoveryAuthorization {
    agent::RecoveryAuthorization {
        snapshot_digest: snapshot_digest(snap),
        volume_id: "data-vg/legacy".into(),
        backend_type: agent::BackendType::Lvm as i32,
        lvm_source: Some(identity()),
        old_volume_uid: OLD.into(),
        old_generation: 4,
        new_volume_uid: uid.into(),
        new_generation: 5,
        preserve_original: Some(true),
        signature: vec![0x30, 0x02],
        ..Default::default()
    }
}

/// The claim `db/<name>` and the recovery record named after it, as step 2
/// of the procedure writes them (no write-once field yet).
async fn claim_and_record(bed: &Bed, name: &str) -> Result<(String, PillarVolumeState)> {
    let pvc: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": "db"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "32Mi"}}},
    }))?;
    let pvc = Api::<PersistentVolumeClaim>::namespaced(bed.client.clone(), "db")
        .create(&PostParams::default(), &pvc)
        .await?;
    let uid = pvc.metadata.uid.clone().ok_or("claim without UID")?;
    let record = PillarVolumeState::new(
        &format!("pvc-{uid}"),
        PillarVolumeStateSpec {
            volume_id: HANDLE.into(),
            agent_volume_id: "data-vg/legacy".into(),
            agent_ref: "storage-1".into(),
            backend_type: Backend::LvmLv,
            protocol_type: Protocol::NvmeofTcp,
            capacity_bytes: 32 << 20,
            claim_ref: Some(ClaimRef {
                uid,
                namespace: "db".into(),
                name: name.into(),
            }),
            imported_from: None,
            lvm_source: None,
            resolved: None,
            export_spec: None,
            recovery: Some(Recovery {
                old_volume_uid: OLD.into(),
                old_generation: 4,
                new_generation: 5,
                source: source(),
                new_volume_uid: None,
                authorization: None,
                authorization_digest: None,
            }),
        },
    );
    let record = Api::<PillarVolumeState>::all(bed.client.clone())
        .create(&PostParams::default(), &record)
        .await?;
    Ok((
        format!(
            "pvc-{}",
            record.spec.claim_ref.clone().ok_or("no claimRef")?.uid
        ),
        record,
    ))
}

/// Step 3's patch: the snapshot annotation and the write-once fields.
async fn latch_grant(
    bed: &Bed,
    name: &str,
    snap: &agent::RecoverySnapshot,
    auth: &agent::RecoveryAuthorization,
    digest: &str,
) -> Result<PillarVolumeState> {
    let patch = serde_json::json!({
        "metadata": {"annotations": {RECOVERY_SNAPSHOT_ANNOTATION: STANDARD.encode(snap.encode_to_vec())}},
        "spec": {"recovery": {
            "newVolumeUID": auth.new_volume_uid,
            "authorization": STANDARD.encode(auth.encode_to_vec()),
            "authorizationDigest": digest,
        }},
    });
    Ok(Api::<PillarVolumeState>::all(bed.client.clone())
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?)
}

async fn create(
    bed: &Bed,
    name: &str,
    claim: &str,
) -> std::result::Result<pb::Volume, tonic::Status> {
    let params: HashMap<String, String> = [
        ("pillarStorageClass", "lvm"),
        ("csi.storage.k8s.io/pvc/name", claim),
        ("csi.storage.k8s.io/pvc/namespace", "db"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    bed.controller
        .create_volume(Request::new(pb::CreateVolumeRequest {
            name: name.into(),
            capacity_range: Some(pb::CapacityRange {
                required_bytes: 32 << 20,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![cap()],
            parameters: params,
            ..Default::default()
        }))
        .await
        .map(|r| r.into_inner().volume.unwrap_or_default())
}

/// The messages of Warning events about `kind`/`name` in `namespace`.
async fn warnings(bed: &Bed, namespace: &str, kind: &str, name: &str) -> Result<Vec<String>> {
    Ok(Api::<Event>::namespaced(bed.client.clone(), namespace)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| {
            e.involved_object.kind.as_deref() == Some(kind)
                && e.involved_object.name.as_deref() == Some(name)
                && e.type_.as_deref() == Some("Warning")
        })
        .filter_map(|e| e.message)
        .collect())
}

async fn record(bed: &Bed, name: &str) -> Result<PillarVolumeState> {
    Ok(Api::<PillarVolumeState>::all(bed.client.clone())
        .get(name)
        .await?)
}

fn phase(state: &PillarVolumeState) -> Option<VolumePhase> {
    state.status.as_ref().and_then(|s| s.phase)
}

/// The refusal's message after checking its code; the claim and the
/// record both show it as a Warning event, and the record stays pending.
async fn refused(
    bed: &Bed,
    name: &str,
    claim: &str,
    result: std::result::Result<pb::Volume, tonic::Status>,
    code: Code,
) -> Result<String> {
    let status = match result {
        Ok(v) => return Err(format!("expected a refusal, got {v:?}").into()),
        Err(s) => s,
    };
    assert_eq!(status.code(), code, "{status:?}");
    let text = status.message().to_owned();
    assert!(
        warnings(bed, "db", "PersistentVolumeClaim", claim)
            .await?
            .contains(&text),
        "the claim's events show {text:?}"
    );
    assert!(
        warnings(bed, "default", "PillarVolumeState", name)
            .await?
            .contains(&text),
        "the record's events show {text:?}"
    );
    let state = record(bed, name).await?;
    assert_eq!(phase(&state), Some(VolumePhase::RecoveryPending));
    assert!(is_pending(&state));
    assert_eq!(
        state.status.and_then(|s| s.message).as_deref(),
        Some(text.as_str())
    );
    Ok(text)
}

#[tokio::test]
async fn a_recovery_record_serves_nothing_and_is_checked_before_the_agent() -> Result {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let bed = bed().await?;
    bed.server.kubectl(&["create", "namespace", "db"])?;
    let (name, born) = claim_and_record(&bed, "data-legacy").await?;
    assert!(is_pending(&born), "born RecoveryPending, before any status");

    // Publish, expand and delete are refused; nothing is written.
    let node = "worker-a/nqn.2014-08.org.nvmexpress:uuid:0f6a8e4c-2b1d-4c55-9a4e-6c1f0e5d7a21/iqn.1993-08.org.debian:01:5e2f9a1b7c3d";
    let e = bed
        .controller
        .controller_publish_volume(Request::new(pb::ControllerPublishVolumeRequest {
            volume_id: HANDLE.into(),
            node_id: node.into(),
            volume_capability: Some(cap()),
            ..Default::default()
        }))
        .await
        .expect_err("publish of a RecoveryPending volume");
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert_eq!(e.message(), format!("cannot publish volume {HANDLE}: it is RecoveryPending (a metadata-loss recovery has not committed), not Ready"));
    let e = bed
        .controller
        .controller_expand_volume(Request::new(pb::ControllerExpandVolumeRequest {
            volume_id: HANDLE.into(),
            capacity_range: Some(pb::CapacityRange {
                required_bytes: 64 << 20,
                limit_bytes: 0,
            }),
            ..Default::default()
        }))
        .await
        .expect_err("expand of a RecoveryPending volume");
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(
        e.message().starts_with(&format!(
            "cannot expand volume {HANDLE}: it is RecoveryPending"
        )),
        "{e:?}"
    );
    let e = bed
        .controller
        .delete_volume(Request::new(pb::DeleteVolumeRequest {
            volume_id: HANDLE.into(),
            ..Default::default()
        }))
        .await
        .expect_err("delete of a RecoveryPending volume");
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert_eq!(
        e.message(),
        format!("volume {HANDLE} is RecoveryPending: it cannot be deleted")
    );
    assert_eq!(
        record(&bed, &name).await?.metadata.resource_version,
        born.metadata.resource_version,
        "the refusals wrote nothing"
    );

    // CreateVolume before the grant: pending, and why.
    let why = refused(
        &bed,
        &name,
        "data-legacy",
        create(&bed, &name, "data-legacy").await,
        Code::FailedPrecondition,
    )
    .await?;
    assert!(
        why.starts_with(&format!(
            "recovery of volume {HANDLE} refused: spec.recovery.newVolumeUID is not set"
        )),
        "{why}"
    );

    // A grant for another record: latched as first seen (write-once),
    // refused by its field.
    let uid = born.metadata.uid.clone().ok_or("no uid")?;
    let snap = snapshot();
    let stranger = grant(&snap, "some-other-record");
    let stranger_digest = authorization_digest(&stranger);
    latch_grant(&bed, &name, &snap, &stranger, &stranger_digest).await?;
    let why = refused(
        &bed,
        &name,
        "data-legacy",
        create(&bed, &name, "data-legacy").await,
        Code::FailedPrecondition,
    )
    .await?;
    assert!(why.contains(&format!("spec.recovery.newVolumeUID \"some-other-record\" is not this record's metadata.uid \"{uid}\"")), "{why}");
    // Write-once: the right grant cannot replace it; the record is started over.
    let auth = grant(&snap, &uid);
    let digest = authorization_digest(&auth);
    latch_grant(&bed, &name, &snap, &auth, &digest).await?;
    let why = refused(
        &bed,
        &name,
        "data-legacy",
        create(&bed, &name, "data-legacy").await,
        Code::FailedPrecondition,
    )
    .await?;
    assert!(why.contains(&format!("spec.recovery.newVolumeUID changed from \"some-other-record\" to \"{uid}\" after it was set; it is write-once")), "{why}");

    // A second claim and record: a wrong digest is refused naming it.
    let (name, born) = claim_and_record(&bed, "data-b").await?;
    let uid = born.metadata.uid.clone().ok_or("no uid")?;
    let auth = grant(&snap, &uid);
    let digest = authorization_digest(&auth);
    latch_grant(&bed, &name, &snap, &auth, &"0".repeat(64)).await?;
    let why = refused(
        &bed,
        &name,
        "data-b",
        create(&bed, &name, "data-b").await,
        Code::FailedPrecondition,
    )
    .await?;
    assert!(why.contains(&format!("spec.recovery.authorizationDigest {} is not the digest {digest} of spec.recovery.authorization", "0".repeat(64))), "{why}");

    // A third: the grant right, the snapshot annotation (not write-once)
    // not the snapshot the grant was signed over, then corrected.
    let (name, born) = claim_and_record(&bed, "data-c").await?;
    let uid = born.metadata.uid.clone().ok_or("no uid")?;
    let auth = grant(&snap, &uid);
    let digest = authorization_digest(&auth);
    let mut other = snapshot();
    other.exclusive_claim = "busy".into();
    latch_grant(&bed, &name, &other, &auth, &digest).await?;
    let why = refused(
        &bed,
        &name,
        "data-c",
        create(&bed, &name, "data-c").await,
        Code::FailedPrecondition,
    )
    .await?;
    assert!(
        why.contains(&format!(
            "the {RECOVERY_SNAPSHOT_ANNOTATION} annotation holds a snapshot of digest"
        )),
        "{why}"
    );

    // Everything agrees: the agent is called, and its refusal (no trust
    // anchor) keeps the record pending with the latch as written.
    latch_grant(&bed, &name, &snap, &auth, &digest).await?;
    let why = refused(
        &bed,
        &name,
        "data-c",
        create(&bed, &name, "data-c").await,
        Code::Unavailable,
    )
    .await?;
    assert_eq!(why, "agent storage-1: recovery is not configured on this agent: start it with --recovery-trust-anchor");
    let latched = record(&bed, &name)
        .await?
        .status
        .and_then(|s| s.recovery_latch)
        .ok_or("no latch")?;
    assert_eq!(latched.new_volume_uid, uid);
    assert_eq!(latched.authorization_digest, digest);

    // Write-once: another grant with its own valid digest is refused now.
    let mut later = grant(&snap, &uid);
    later.issued_at = Some(prost_types::Timestamp {
        seconds: 1_800_000_000,
        nanos: 0,
    });
    let later_digest = authorization_digest(&later);
    latch_grant(&bed, &name, &snap, &later, &later_digest).await?;
    let why = refused(
        &bed,
        &name,
        "data-c",
        create(&bed, &name, "data-c").await,
        Code::FailedPrecondition,
    )
    .await?;
    assert!(why.contains(&format!("spec.recovery.authorizationDigest changed from \"{digest}\" to \"{later_digest}\" after it was set; it is write-once")), "{why}");
    latch_grant(&bed, &name, &snap, &auth, &digest).await?;

    // A claim carrying import-lv is refused by its annotation.
    let claims = Api::<PersistentVolumeClaim>::namespaced(bed.client.clone(), "db");
    claims
        .patch(
            "data-c",
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"metadata": {"annotations": {IMPORT_LV_ANNOTATION: "data-vg/legacy:vg-uuid-1:lv-uuid-1"}}})),
        )
        .await?;
    let why = refused(
        &bed,
        &name,
        "data-c",
        create(&bed, &name, "data-c").await,
        Code::FailedPrecondition,
    )
    .await?;
    assert!(
        why.contains(&format!(
            "the claim db/data-c carries the {IMPORT_LV_ANNOTATION} annotation"
        )),
        "{why}"
    );

    // CreateVolume for another claim than the record's claimRef.
    let other_claim: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "intruder", "namespace": "db"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "32Mi"}}},
    }))?;
    claims.create(&PostParams::default(), &other_claim).await?;
    // The volume's name carries the record's claim's UID, not the
    // intruder's: the refusal is the record's, and no event goes to a
    // claim the volume is not for.
    let e = create(&bed, &name, "intruder")
        .await
        .expect_err("CreateVolume for another claim");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    let why = e.message().to_owned();
    assert!(
        why.contains("spec.claimRef names claim db/data-c with UID"),
        "{why}"
    );
    assert!(warnings(&bed, "default", "PillarVolumeState", &name)
        .await?
        .contains(&why));
    assert!(warnings(&bed, "db", "PersistentVolumeClaim", "intruder")
        .await?
        .is_empty());

    // Still pending after all of it: delete is refused, the record kept.
    let e = bed
        .controller
        .delete_volume(Request::new(pb::DeleteVolumeRequest {
            volume_id: HANDLE.into(),
            ..Default::default()
        }))
        .await
        .expect_err("delete of a RecoveryPending volume");
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(is_pending(&record(&bed, &name).await?));
    Ok(())
}

/// The agent's client as the operator's tools reach it (mTLS, verified).
async fn operator_client(
    bed: &Bed,
) -> Result<agent::agent_service_client::AgentServiceClient<tonic::transport::Channel>> {
    let (ca, pem) = &bed.agent_client_tls;
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(ca)?))
        .identity(Identity::from_pem(
            std::fs::read(&pem.cert)?,
            std::fs::read(&pem.key)?,
        ));
    let channel =
        tonic::transport::Endpoint::from_shared(format!("https://127.0.0.1:{}", bed.port))?
            .tls_config(tls)?
            .connect()
            .await?;
    Ok(agent::agent_service_client::AgentServiceClient::new(
        channel,
    ))
}

/// The whole path with the agent's simulated VG: an LV adopted under the
/// old lifecycle, its records lost; the operator's record, the agent's
/// signed snapshot and a grant signed with the trust anchor's key; then
/// CreateVolume moves the volume: the agent's mark holds the new lifecycle
/// at newGeneration, the record is Ready with that generation, the lost
/// PV's handle comes back, and publishing works under the new token.
#[tokio::test]
async fn a_recovery_commits_through_the_controller_and_delete_releases_a_preserved_lv() -> Result {
    let bed = bed_with(true).await?;
    bed.server.kubectl(&["create", "namespace", "db"])?;
    let lv_uuid = bed._fixture.lvm.add("legacy", 32 << 20);
    let vg_uuid = pillar_csi_agent::service::sim_lvm::VG_UUID;
    let mut c = operator_client(&bed).await?;
    let ident = agent::LvmIdentity {
        volume_group: "data-vg".into(),
        logical_volume: "legacy".into(),
        volume_group_uuid: vg_uuid.into(),
        logical_volume_uuid: lv_uuid.clone(),
    };
    c.create_volume(agent::CreateVolumeRequest {
        volume_id: "data-vg/legacy".into(),
        backend_type: agent::BackendType::Lvm as i32,
        capacity_bytes: 1 << 20,
        fence: Some(agent::FenceToken {
            volume_uid: OLD.into(),
            generation: 4,
        }),
        import_lv: Some(ident.clone()),
        ..Default::default()
    })
    .await?;
    let (name, born) = claim_and_record(&bed, "data-legacy").await?;
    // The record's source as the agent knows the LV.
    let patch = serde_json::json!({"spec": {"recovery": {"source": {
        "volumeGroupUUID": vg_uuid, "logicalVolumeUUID": lv_uuid}}}});
    Api::<PillarVolumeState>::all(bed.client.clone())
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let uid = born.metadata.uid.clone().ok_or("no uid")?;
    let inspected = c
        .inspect_volume(agent::InspectVolumeRequest {
            volume_id: "data-vg/legacy".into(),
            backend_type: agent::BackendType::Lvm as i32,
        })
        .await?
        .into_inner();
    let snap = inspected
        .snapshot
        .ok_or("no snapshot for a verified caller")?;
    assert_eq!(
        (snap.old_volume_uid.as_str(), snap.old_generation),
        (OLD, 4)
    );
    let key = pillar_csi_agent::recovery::PrivateSigner::from_pem(&std::fs::read(
        bed._certs.dir.path().join("operator.key"),
    )?)?;
    let now = std::time::SystemTime::now();
    let auth = pillar_csi_agent::recovery::authorize(
        &snap,
        &uid,
        5,
        prost_types::Timestamp::from(now - std::time::Duration::from_secs(60)),
        prost_types::Timestamp::from(now + std::time::Duration::from_secs(3600)),
        &key,
    )?;
    let digest = authorization_digest(&auth);
    latch_grant(&bed, &name, &snap, &auth, &digest).await?;

    let volume = create(&bed, &name, "data-legacy").await?;
    assert_eq!(volume.volume_id, HANDLE, "the lost PV's handle");
    assert_eq!(volume.capacity_bytes, 32 << 20);
    assert_eq!(
        volume
            .volume_context
            .get("existingData")
            .map(String::as_str),
        Some("recovery"),
        "the node never formats a recovered volume"
    );
    let state = record(&bed, &name).await?;
    assert_eq!(phase(&state), Some(VolumePhase::Ready));
    assert!(!is_pending(&state));
    assert_eq!(
        state.status.as_ref().and_then(|s| s.publication_generation),
        Some(5)
    );
    let after = c
        .inspect_volume(agent::InspectVolumeRequest {
            volume_id: "data-vg/legacy".into(),
            backend_type: agent::BackendType::Lvm as i32,
        })
        .await?
        .into_inner()
        .fence
        .ok_or("no fence")?;
    assert_eq!(
        (after.volume_uid.as_str(), after.generation),
        (uid.as_str(), 5)
    );
    assert!(after.ended_uids.contains(&OLD.to_owned()));
    // Again (the provisioner's retry): the same volume.
    assert_eq!(create(&bed, &name, "data-legacy").await?.volume_id, HANDLE);
    // Publishing now works, under the new lifecycle's token.
    let node = "worker-a/nqn.2014-08.org.nvmexpress:uuid:0f6a8e4c-2b1d-4c55-9a4e-6c1f0e5d7a21/iqn.1993-08.org.debian:01:5e2f9a1b7c3d";
    bed.controller
        .controller_publish_volume(Request::new(pb::ControllerPublishVolumeRequest {
            volume_id: HANDLE.into(),
            node_id: node.into(),
            volume_capability: Some(cap()),
            ..Default::default()
        }))
        .await?;
    let state = record(&bed, &name).await?;
    assert_eq!(
        state.status.as_ref().and_then(|s| s.publication_generation),
        Some(6)
    );
    bed.controller
        .controller_unpublish_volume(Request::new(pb::ControllerUnpublishVolumeRequest {
            volume_id: HANDLE.into(),
            node_id: node.into(),
            ..Default::default()
        }))
        .await?;
    let generation = record(&bed, &name)
        .await?
        .status
        .and_then(|s| s.publication_generation)
        .ok_or("no generation")?;
    // DeleteVolume of the recovered PreserveOriginal LV releases it (the
    // agent checks identity and idleness, the LV stays), as for an LV
    // adopted so: the release the controller sent, repeated (its retry
    // after a lost answer), succeeds instead of "lifecycle has ended".
    bed.controller
        .delete_volume(Request::new(pb::DeleteVolumeRequest {
            volume_id: HANDLE.into(),
            ..Default::default()
        }))
        .await?;
    assert!(bed._fixture.lvm.lv("legacy").is_some(), "the LV stays");
    c.release_volume(agent::ReleaseVolumeRequest {
        volume_id: "data-vg/legacy".into(),
        backend_type: agent::BackendType::Lvm as i32,
        fence: Some(agent::FenceToken {
            volume_uid: uid.clone(),
            generation,
        }),
    })
    .await?;
    Ok(())
}
