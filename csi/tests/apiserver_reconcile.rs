//! The controller's reconcilers against a real kube-apiserver 1.20, run as
//! the controller's ServiceAccount with exactly the chart's rules, and an
//! in-process agent over its simulated backend behind mTLS (stopped and
//! started again on the same port where a test needs it down).
use api::crd::*;
use csi::controller::agents::{AgentTls, Agents};
use csi::controller::reservations::name_for;
use csi::controller::Controller;
use csi::metrics::Metrics;
use csi::node_id::NodeId;
use csi::reconcile::leader::Election;
use csi::reconcile::{names, Reconcilers, Settings};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use pillar_csi_agent::grpc::AgentGrpc;
use pillar_csi_agent::service::sim;
use pillar_csi_lab::apiserver::ApiServer;
use pillar_csi_proto::agent::v1 as agent_pb;
use pillar_csi_proto::csi::v1 as pb;
use pillar_csi_proto::csi::v1::controller_server::Controller as _;
use pillar_csi_proto::csi::v1::volume_capability::{
    access_mode::Mode, AccessMode, AccessType, MountVolume,
};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tonic::transport::ServerTlsConfig;
use tonic::Request;

mod common;

use common::parts::*;
use common::Result;

const NQN_A: &str = "nqn.2014-08.org.nvmexpress:uuid:0f6a8e4c-2b1d-4c55-9a4e-6c1f0e5d7a21";
const IQN: &str = "iqn.1993-08.org.debian:01:5e2f9a1b7c3d";

struct Bed {
    server: ApiServer,
    client: kube::Client,
    fixture: sim::Fixture,
    tls: ServerTlsConfig,
    port: u16,
    agent_server: Option<AgentServer>,
    agent_tls: AgentTls,
    /// The controller's ServiceAccount, bound to exactly the chart's rules.
    sa: kube::Client,
    controller: Controller,
    _certs: Certs,
}

impl Bed {
    async fn stop_agent(&mut self) -> Result {
        if let Some(server) = self.agent_server.take() {
            server.stop().await?;
        }
        Ok(())
    }

    async fn start_agent(&mut self) -> Result {
        let service = AgentGrpc::new(self.fixture.agent.clone(), "sim");
        let (_, server) = serve_agent(&self.tls, service, self.port).await?;
        self.agent_server = Some(server);
        Ok(())
    }

    /// Reconcilers running as the controller's ServiceAccount, with their
    /// own metrics.
    async fn reconcilers(&self, settings: Settings) -> Result<Reconcilers> {
        Ok(Reconcilers::new(
            self.sa.clone(),
            Agents::new(Some(&self.agent_tls))?,
            Arc::new(Metrics::default()),
            settings,
        ))
    }
}

async fn bed() -> Result<Bed> {
    let server = ApiServer::start()?;
    server.install_chart_crds().await?;
    let client = server.client().await?;

    let certs = Certs::new()?;
    let fixture = sim::fixture();
    let tls = certs.agent_server_tls()?;
    let service = AgentGrpc::new(fixture.agent.clone(), "sim");
    let (port, agent_server) = serve_agent(&tls, service, 0).await?;
    create_agent(&client, port).await?;
    create_objects(&client, &[zfs_store()], &[hot_class("hot", "pillar-hot")]).await?;
    let agent_tls = certs.controller_tls();
    let sa = server.controller_client().await?;
    let controller = Controller::new(sa.clone(), Agents::new(Some(&agent_tls))?);
    Ok(Bed {
        server,
        client,
        fixture,
        tls,
        port,
        agent_server: Some(agent_server),
        agent_tls,
        sa,
        controller,
        _certs: certs,
    })
}

/// A class of the store `storage-1-hot` (xfs) generating `storage_class`.
fn hot_class(name: &str, storage_class: &str) -> PillarStorageClass {
    class(name, "storage-1-hot", storage_class, Some(FsType::Xfs))
}

fn mount_cap() -> pb::VolumeCapability {
    pb::VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: "xfs".into(),
            ..Default::default()
        })),
    }
}

fn create_request(name: &str, params: &HashMap<String, String>) -> pb::CreateVolumeRequest {
    pb::CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(pb::CapacityRange {
            required_bytes: 64 << 20,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![mount_cap()],
        parameters: params.clone(),
        ..Default::default()
    }
}

/// Creates claim `db/<name>`; returns its UID.
async fn claim(bed: &Bed, name: &str) -> Result<String> {
    let pvc: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": "db"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "64Mi"}}},
    }))?;
    let pvc = Api::<PersistentVolumeClaim>::namespaced(bed.client.clone(), "db")
        .create(&PostParams::default(), &pvc)
        .await?;
    Ok(pvc.metadata.uid.ok_or("a claim without UID")?)
}

async fn delete_claim(bed: &Bed, name: &str) -> Result {
    let claims = Api::<PersistentVolumeClaim>::namespaced(bed.client.clone(), "db");
    claims.delete(name, &DeleteParams::default()).await?;
    // The admission plugin adds kubernetes.io/pvc-protection, and no
    // kube-controller-manager runs here to remove it: do its part.
    claims
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await?;
    for _ in 0..100 {
        if Api::<PersistentVolumeClaim>::namespaced(bed.client.clone(), "db")
            .get_opt(name)
            .await?
            .is_none()
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("claim db/{name} still exists after 10 s").into())
}

/// The parameters the external-provisioner sends for claim `db/<name>` of
/// the generated StorageClass `sc`.
fn params(sc: &StorageClass, claim: &str) -> HashMap<String, String> {
    let mut p: HashMap<String, String> = sc
        .parameters
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    p.insert("csi.storage.k8s.io/pvc/name".into(), claim.into());
    p.insert("csi.storage.k8s.io/pvc/namespace".into(), "db".into());
    p
}

fn ready_of(conditions: &[Condition]) -> Option<Condition> {
    conditions.iter().find(|c| c.type_ == "Ready").cloned()
}

async fn class_ready(bed: &Bed, name: &str) -> Result<Option<Condition>> {
    let c = Api::<PillarStorageClass>::all(bed.client.clone())
        .get(name)
        .await?;
    Ok(ready_of(&c.status.unwrap_or_default().conditions))
}

async fn agent_ready(bed: &Bed) -> Result<Option<Condition>> {
    let a = Api::<PillarAgent>::all(bed.client.clone())
        .get("storage-1")
        .await?;
    Ok(ready_of(&a.status.unwrap_or_default().conditions))
}

fn exported(bed: &Bed, volume: &str) -> Option<(bool, Vec<String>)> {
    bed.fixture.exporter.exports.lock().ok().and_then(|e| {
        e.get(volume)
            .map(|r| (r.acl, r.allowed_initiators.iter().cloned().collect()))
    })
}

#[tokio::test]
async fn a_pillar_storage_class_generates_and_owns_its_storage_class() -> Result {
    let bed = bed().await?;
    bed.server.kubectl(&["create", "namespace", "db"])?;
    let r = bed.reconcilers(Settings::default()).await?;
    let scs = Api::<StorageClass>::all(bed.client.clone());
    let classes = Api::<PillarStorageClass>::all(bed.client.clone());

    assert_eq!(r.storage_classes().await, 0);
    let hot = classes.get("hot").await?;
    let sc = scs.get("pillar-hot").await?;
    assert_eq!(sc.provisioner, "pillar-csi.bhyoo.com");
    let p = sc.parameters.clone().unwrap_or_default();
    assert_eq!(p.len(), 2, "{p:?}");
    assert_eq!(p.get("pillarStorageClass").map(String::as_str), Some("hot"));
    assert_eq!(
        p.get("csi.storage.k8s.io/fstype").map(String::as_str),
        Some("xfs")
    );
    assert_eq!(sc.reclaim_policy.as_deref(), Some("Delete"));
    assert_eq!(sc.volume_binding_mode.as_deref(), Some("Immediate"));
    assert_eq!(sc.allow_volume_expansion, Some(true));
    let owners = sc.metadata.owner_references.clone().unwrap_or_default();
    assert_eq!(owners.len(), 1, "{owners:?}");
    let o = &owners[0];
    assert_eq!(
        (o.api_version.as_str(), o.kind.as_str(), o.name.as_str()),
        ("pillar-csi.bhyoo.com/v1alpha1", "PillarStorageClass", "hot")
    );
    assert_eq!(
        Some(o.uid.clone()),
        hot.metadata.uid,
        "the owner's live UID"
    );
    assert_eq!(
        (o.controller, o.block_owner_deletion),
        (Some(true), Some(true))
    );
    let ready = class_ready(&bed, "hot")
        .await?
        .ok_or("no Ready condition")?;
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("True", "Generated")
    );

    // CreateVolume takes what the generated StorageClass carries.
    let uid = claim(&bed, "data-0").await?;
    let created = bed
        .controller
        .create_volume(Request::new(create_request(
            &format!("pvc-{uid}"),
            &params(&sc, "data-0"),
        )))
        .await?
        .into_inner();
    assert_eq!(
        created.volume.map(|v| v.volume_id),
        Some(format!("storage-1/nvmeof-tcp/zfs-zvol/tank/pvc-{uid}"))
    );

    // A second pass changes nothing.
    assert_eq!(r.storage_classes().await, 0);
    assert_eq!(
        scs.get("pillar-hot").await?.metadata.resource_version,
        sc.metadata.resource_version
    );

    // A mutable field is updated in place.
    classes
        .patch(
            "hot",
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"spec": {"storageClass": {"allowVolumeExpansion": false}}}),
            ),
        )
        .await?;
    assert_eq!(r.storage_classes().await, 0);
    let updated = scs.get("pillar-hot").await?;
    assert_eq!(updated.allow_volume_expansion, Some(false));
    assert_eq!(updated.metadata.uid, sc.metadata.uid, "updated in place");

    // An immutable one (reclaimPolicy, fsType) replaces the StorageClass.
    classes
        .patch(
            "hot",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {
                "storageClass": {"reclaimPolicy": "Retain"},
                "filesystem": {"fsType": "ext4"}}})),
        )
        .await?;
    assert_eq!(r.storage_classes().await, 0);
    let replaced = scs.get("pillar-hot").await?;
    assert_ne!(replaced.metadata.uid, sc.metadata.uid, "replaced");
    assert_eq!(replaced.reclaim_policy.as_deref(), Some("Retain"));
    assert_eq!(
        replaced
            .parameters
            .unwrap_or_default()
            .get("csi.storage.k8s.io/fstype")
            .map(String::as_str),
        Some("ext4")
    );
    let ready = class_ready(&bed, "hot")
        .await?
        .ok_or("no Ready condition")?;
    assert_eq!(ready.status, "True");
    assert!(
        ready.message.contains("replaced") && ready.message.contains("deleted and created again"),
        "{}",
        ready.message
    );

    // A StorageClass of the name that is not ours is never touched.
    let foreign: StorageClass = serde_json::from_value(serde_json::json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": "fast"},
        "provisioner": "other.example.com",
        "parameters": {"tier": "gold"},
    }))?;
    let foreign = scs.create(&PostParams::default(), &foreign).await?;
    classes
        .create(&PostParams::default(), &hot_class("cold", "fast"))
        .await?;
    assert_eq!(r.storage_classes().await, 0);
    let after = scs.get("fast").await?;
    assert_eq!(
        after.metadata.resource_version, foreign.metadata.resource_version,
        "left untouched"
    );
    assert_eq!(after.provisioner, "other.example.com");
    let ready = class_ready(&bed, "cold")
        .await?
        .ok_or("no Ready condition")?;
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "StorageClassConflict")
    );
    assert!(
        ready.message.contains("\"fast\"")
            && ready.message.contains("not owned")
            && ready.message.contains("other.example.com"),
        "{}",
        ready.message
    );
    // Nor is one another PillarStorageClass owns.
    classes
        .create(&PostParams::default(), &hot_class("hot-twin", "pillar-hot"))
        .await?;
    assert_eq!(r.storage_classes().await, 0);
    assert_eq!(
        scs.get("pillar-hot").await?.metadata.uid,
        replaced.metadata.uid
    );
    let ready = class_ready(&bed, "hot-twin")
        .await?
        .ok_or("no Ready condition")?;
    assert_eq!(ready.reason, "StorageClassConflict");
    assert!(
        ready.message.contains("PillarStorageClass \"hot\""),
        "{}",
        ready.message
    );
    Ok(())
}

/// A files class whose placement stops resolving keeps its StorageClass:
/// the provisioner of an existing StorageClass is immutable, so a block
/// default would delete it and make a block one while, say, its protocol
/// or agent is away.
#[tokio::test]
async fn a_files_class_keeps_its_storage_class_while_its_references_are_gone() -> Result {
    let bed = bed().await?;
    let r = bed
        .reconcilers(Settings {
            files: true,
            ..Settings::default()
        })
        .await?;
    let store = PillarStore::new(
        "storage-1-files",
        PillarStoreSpec {
            agent_ref: "storage-1".into(),
            backend: StoreBackend {
                zfs_dataset: Some(ZfsBackend {
                    pool: "tank".into(),
                    parent_dataset: Some("files".into()),
                }),
                ..Default::default()
            },
        },
    );
    let pp = PostParams::default();
    Api::<PillarStore>::all(bed.client.clone())
        .create(&pp, &store)
        .await?;
    Api::<PillarStorageClass>::all(bed.client.clone())
        .create(
            &pp,
            &class("files", "storage-1-files", "pillar-files", None),
        )
        .await?;
    assert_eq!(r.storage_classes().await, 0);
    let scs = Api::<StorageClass>::all(bed.client.clone());
    let sc = scs.get("pillar-files").await?;
    assert_eq!(sc.provisioner, "files.pillar-csi.bhyoo.com");

    // The protocol gone: the store still says files.
    Api::<PillarProtocol>::all(bed.client.clone())
        .delete("nvmeof-default", &DeleteParams::default())
        .await?;
    assert_eq!(r.storage_classes().await, 0);
    let kept = scs.get("pillar-files").await?;
    assert_eq!(kept.metadata.uid, sc.metadata.uid, "not replaced");
    let ready = class_ready(&bed, "files")
        .await?
        .ok_or("no Ready condition")?;
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "InvalidReference")
    );

    // The store gone too: the StorageClass it generated says files.
    Api::<PillarStore>::all(bed.client.clone())
        .delete("storage-1-files", &DeleteParams::default())
        .await?;
    assert_eq!(r.storage_classes().await, 0);
    let kept = scs.get("pillar-files").await?;
    assert_eq!(kept.metadata.uid, sc.metadata.uid, "not replaced");
    assert_eq!(kept.provisioner, "files.pillar-csi.bhyoo.com");
    Ok(())
}

/// Runs health passes until the agent's Ready status is `want` (bounded).
async fn wait_agent_ready(bed: &Bed, r: &Reconcilers, want: &str) -> Result<Condition> {
    let start = Instant::now();
    loop {
        assert_eq!(r.agent_health().await, 0, "a status was not written");
        if let Some(c) = agent_ready(bed).await? {
            if c.status == want {
                return Ok(c);
            }
        }
        if start.elapsed() > Duration::from_secs(30) {
            return Err(format!(
                "PillarAgent Ready did not turn {want} within 30 s: {:?}",
                agent_ready(bed).await?
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn pillar_agent_ready_follows_the_agents_health_check() -> Result {
    let mut bed = bed().await?;
    let r = bed.reconcilers(Settings::default()).await?;
    let up = wait_agent_ready(&bed, &r, "True").await?;
    assert_eq!(up.reason, "Healthy");
    assert!(
        up.message.contains(&format!("127.0.0.1:{}", bed.port)),
        "{}",
        up.message
    );
    let a = Api::<PillarAgent>::all(bed.client.clone())
        .get("storage-1")
        .await?;
    assert_eq!(
        a.status.and_then(|s| s.agent_version).as_deref(),
        Some("sim")
    );
    assert_eq!(r.metrics().agents().get("storage-1"), Some(&true));

    bed.stop_agent().await?;
    let down = wait_agent_ready(&bed, &r, "False").await?;
    assert_eq!(down.reason, "Unreachable");
    assert!(
        down.message
            .contains(&format!("the agent at 127.0.0.1:{}", bed.port)),
        "{}",
        down.message
    );
    assert_eq!(r.metrics().agents().get("storage-1"), Some(&false));
    assert!(r
        .metrics()
        .render()
        .contains("pillar_csi_agent_reachable{agent=\"storage-1\"} 0\n"));

    bed.start_agent().await?;
    let back = wait_agent_ready(&bed, &r, "True").await?;
    assert_eq!(back.reason, "Healthy");
    assert_eq!(r.metrics().agents().get("storage-1"), Some(&true));
    Ok(())
}

/// The claim `db/<claim_name>` and its volume of class `hot`: the volume's
/// name and handle.
async fn provision(bed: &Bed, claim_name: &str) -> Result<(String, String)> {
    let sc_params: HashMap<String, String> =
        HashMap::from([("pillarStorageClass".to_owned(), "hot".to_owned())]);
    let name = format!("pvc-{}", claim(bed, claim_name).await?);
    let handle = bed
        .controller
        .create_volume(Request::new(create_request(&name, &sc_params)))
        .await?
        .into_inner()
        .volume
        .ok_or("no volume")?
        .volume_id;
    Ok((name, handle))
}

#[tokio::test]
async fn the_resync_on_start_restores_an_export_removed_behind_the_agents_back() -> Result {
    let bed = bed().await?;
    bed.server.kubectl(&["create", "namespace", "db"])?;
    let sc_params: HashMap<String, String> =
        HashMap::from([("pillarStorageClass".to_owned(), "hot".to_owned())]);
    // One volume published to node A, one never published.
    let (name, handle) = provision(&bed, "data-0").await?;
    let idle = format!("pvc-{}", claim(&bed, "data-1").await?);
    bed.controller
        .create_volume(Request::new(create_request(&idle, &sc_params)))
        .await?;
    let node = NodeId::new("worker-a", NQN_A, IQN)?;
    bed.controller
        .controller_publish_volume(Request::new(pb::ControllerPublishVolumeRequest {
            volume_id: handle.clone(),
            node_id: node.to_string(),
            volume_capability: Some(mount_cap()),
            ..Default::default()
        }))
        .await?;
    let volume = format!("tank/{name}");
    assert_eq!(
        exported(&bed, &volume),
        Some((true, vec![NQN_A.to_owned()]))
    );

    // The export vanishes on the storage node (configfs is volatile).
    bed.fixture
        .exporter
        .exports
        .lock()
        .map_err(|_| "poisoned")?
        .remove(&volume);
    assert_eq!(exported(&bed, &volume), None);

    // The reconcilers start (as the controller does): the first round resyncs.
    let r = bed
        .reconcilers(Settings {
            interval: Duration::from_secs(3600),
            sync_period: Duration::from_secs(3600),
            files: false,
        })
        .await?;
    let (_leading, rx) = watch::channel(true);
    let metrics = r.metrics().clone();
    let running = tokio::spawn(async move { r.run(rx).await });
    let start = Instant::now();
    while metrics.passes(names::RESYNC) == 0 {
        if start.elapsed() > Duration::from_secs(30) {
            return Err("no resync within 30 s of the start".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    running.abort();
    assert_eq!(
        exported(&bed, &volume),
        Some((true, vec![NQN_A.to_owned()])),
        "restored with its ACL"
    );
    assert_eq!(
        exported(&bed, &format!("tank/{idle}")),
        None,
        "a volume never published is not exported"
    );
    assert!(metrics
        .render()
        .contains("pillar_csi_reconcile_errors_total{reconciler=\"resync\"} 0\n"));
    Ok(())
}

/// An export the agent cannot make again (here its volume is gone from the
/// backend; on a storage node, also the key of an encrypted zvol that cannot
/// be opened) is shown on the volume's record, and the message goes once a
/// later resync makes the export.
#[tokio::test]
async fn a_resync_refusal_is_shown_on_the_record_until_the_export_is_made() -> Result {
    let bed = bed().await?;
    bed.server.kubectl(&["create", "namespace", "db"])?;
    let (name, handle) = provision(&bed, "data-0").await?;
    bed.controller
        .controller_publish_volume(Request::new(pb::ControllerPublishVolumeRequest {
            volume_id: handle.clone(),
            node_id: NodeId::new("worker-a", NQN_A, IQN)?.to_string(),
            volume_capability: Some(mount_cap()),
            ..Default::default()
        }))
        .await?;
    let key = common::zvol_key(&name);
    let bytes = bed
        .fixture
        .backend
        .volumes
        .lock()
        .map_err(|_| "poisoned")?
        .remove(&key)
        .ok_or("no zvol")?;
    let message = |bed: &Bed| {
        let states = Api::<PillarVolumeState>::all(bed.client.clone());
        let name = name.clone();
        async move { Ok::<_, kube::Error>(states.get(&name).await?.status.and_then(|s| s.message)) }
    };
    let r = bed
        .reconcilers(Settings {
            interval: Duration::from_secs(3600),
            sync_period: Duration::from_secs(3600),
            files: false,
        })
        .await?;
    assert_eq!(r.resync().await, 1);
    let shown = message(&bed).await?.ok_or("no message on the record")?;
    assert!(
        shown.starts_with("resync: agent storage-1 could not restore the export: ")
            && shown.contains("does not exist in its backend"),
        "{shown}"
    );
    bed.fixture
        .backend
        .volumes
        .lock()
        .map_err(|_| "poisoned")?
        .insert(key, bytes);
    assert_eq!(r.resync().await, 0);
    assert_eq!(message(&bed).await?, None);
    Ok(())
}

async fn phase_pending(bed: &Bed, name: &str) -> Result {
    Api::<PillarVolumeState>::all(bed.client.clone())
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"phase": "Pending"}})),
        )
        .await?;
    Ok(())
}

async fn record(bed: &Bed, name: &str) -> Result<Option<PillarVolumeState>> {
    Ok(Api::<PillarVolumeState>::all(bed.client.clone())
        .get_opt(name)
        .await?)
}

fn destroyed(bed: &Bed) -> Result<u32> {
    Ok(*bed
        .fixture
        .backend
        .destroyed
        .lock()
        .map_err(|_| "poisoned")?)
}

/// A record as an import's CreateVolume writes it before the agent answers.
fn import_record(name: &str, claim_uid: &str, claim: &str) -> PillarVolumeState {
    PillarVolumeState::new(
        name,
        PillarVolumeStateSpec {
            volume_id: "storage-1/nvmeof-tcp/zfs-zvol/tank/legacy".into(),
            agent_volume_id: "tank/legacy".into(),
            agent_ref: "storage-1".into(),
            backend_type: api::tokens::Backend::ZfsZvol,
            protocol_type: api::tokens::Protocol::NvmeofTcp,
            capacity_bytes: 64 << 20,
            claim_ref: Some(ClaimRef {
                uid: claim_uid.into(),
                namespace: "db".into(),
                name: claim.into(),
            }),
            imported_from: Some("tank/k8s/legacy".into()),
            lvm_source: None,
            resolved: None,
            export_spec: None,
            recovery: None,
        },
    )
}

#[tokio::test]
async fn the_reaper_forgets_abandoned_claims_and_keeps_what_the_spec_keeps() -> Result {
    let mut bed = bed().await?;
    bed.server.kubectl(&["create", "namespace", "db"])?;
    let r = bed.reconcilers(Settings::default()).await?;
    let states = Api::<PillarVolumeState>::all(bed.client.clone());
    let sc_params: HashMap<String, String> =
        HashMap::from([("pillarStorageClass".to_owned(), "hot".to_owned())]);

    // 1. A created volume whose record never turned Ready (the controller
    //    stopped after the agent's answer), its claim then deleted: the
    //    agent destroys it, the record goes.
    let created = format!("pvc-{}", claim(&bed, "made").await?);
    let mut p = sc_params.clone();
    p.insert("csi.storage.k8s.io/pvc/name".into(), "made".into());
    p.insert("csi.storage.k8s.io/pvc/namespace".into(), "db".into());
    bed.controller
        .create_volume(Request::new(create_request(&created, &p)))
        .await?;
    phase_pending(&bed, &created).await?;
    // While the claim exists, nothing happens.
    assert_eq!(r.reap().await, 0);
    assert!(record(&bed, &created).await?.is_some());

    // 2. An import that never completed, with its reservation; the agent
    //    holds a live lifecycle of the record (its import was admitted).
    let import_uid = claim(&bed, "legacy").await?;
    let import = states
        .create(
            &PostParams::default(),
            &import_record("pvc-import", &import_uid, "legacy"),
        )
        .await?;
    let reservation_name = name_for("storage-1", "tank/legacy");
    let reservation = PillarVolumeReservation::new(
        &reservation_name,
        PillarVolumeReservationSpec {
            claim_ref: ClaimRef {
                uid: import_uid.clone(),
                namespace: "db".into(),
                name: "legacy".into(),
            },
            owner_volume: "pvc-import".into(),
            agent_ref: "storage-1".into(),
            agent_volume_id: "tank/legacy".into(),
        },
    );
    Api::<PillarVolumeReservation>::all(bed.client.clone())
        .create(&PostParams::default(), &reservation)
        .await?;
    let agents = Agents::new(Some(&bed.agent_tls))?;
    let storage_1 = Api::<PillarAgent>::all(bed.client.clone())
        .get("storage-1")
        .await?;
    agents
        .client(&storage_1)?
        .client
        .create_volume(agent_pb::CreateVolumeRequest {
            volume_id: "tank/legacy".into(),
            backend_type: agent_pb::BackendType::ZfsZvol as i32,
            capacity_bytes: 64 << 20,
            fence: Some(agent_pb::FenceToken {
                volume_uid: import.metadata.uid.clone().unwrap_or_default(),
                generation: 0,
            }),
            ..Default::default()
        })
        .await?;

    // 3. Records the reaper keeps although their claims are gone: a
    //    recovery record (born RecoveryPending, no status yet), a Ready
    //    record of a claim that was bound (published: a Retain PV deleted
    //    by hand leaves it, by the spec), and a Pending record whose PV
    //    exists.
    let mut recovery = import_record("pvc-recovery", "gone-1", "gone-1");
    recovery.spec.imported_from = None;
    recovery.spec.agent_volume_id = "tank/recovered".into();
    recovery.spec.recovery = Some(Recovery {
        old_volume_uid: "old".into(),
        old_generation: 3,
        new_generation: 4,
        source: LvmSource {
            volume_group: "vg".into(),
            logical_volume: "lv".into(),
            volume_group_uuid: "a".into(),
            logical_volume_uuid: "b".into(),
            preserve_original: true,
        },
        new_volume_uid: None,
        authorization: None,
        authorization_digest: None,
    });
    states.create(&PostParams::default(), &recovery).await?;
    let mut ready = import_record("pvc-ready", "gone-2", "gone-2");
    ready.spec.imported_from = None;
    ready.spec.agent_volume_id = "tank/ready".into();
    states.create(&PostParams::default(), &ready).await?;
    states
        .patch_status(
            "pvc-ready",
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"status": {"phase": "Ready", "publicationGeneration": 2}}),
            ),
        )
        .await?;
    let mut bound = import_record("pvc-bound", "gone-3", "gone-3");
    bound.spec.imported_from = None;
    bound.spec.agent_volume_id = "tank/bound".into();
    states.create(&PostParams::default(), &bound).await?;
    let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "pvc-bound"},
        "spec": {"capacity": {"storage": "64Mi"}, "accessModes": ["ReadWriteOnce"],
                 "persistentVolumeReclaimPolicy": "Retain",
                 "csi": {"driver": "pillar-csi.bhyoo.com", "volumeHandle": "storage-1/nvmeof-tcp/zfs-zvol/tank/bound"}},
    }))?;
    Api::<PersistentVolume>::all(bed.client.clone())
        .create(&PostParams::default(), &pv)
        .await?;

    // The claims go while the agent is down: everything stays, the reason
    // is on the records, and the reaper retries.
    delete_claim(&bed, "made").await?;
    delete_claim(&bed, "legacy").await?;
    bed.stop_agent().await?;
    assert_eq!(
        r.reap().await,
        2,
        "both abandoned records wait for the agent"
    );
    for name in [&created, "pvc-import"] {
        let kept = record(&bed, name)
            .await?
            .ok_or("removed while the agent was down")?;
        let message = kept.status.and_then(|s| s.message).unwrap_or_default();
        assert!(message.contains("the reaper retries"), "{message}");
    }
    assert!(Api::<PillarVolumeReservation>::all(bed.client.clone())
        .get_opt(&reservation_name)
        .await?
        .is_some());
    assert_eq!(destroyed(&bed)?, 0);

    // The agent is back: the created volume is destroyed, the import only
    // released (the zvol stays), their records and reservation go.
    bed.start_agent().await?;
    assert_eq!(r.reap().await, 0);
    assert!(record(&bed, &created).await?.is_none());
    assert!(record(&bed, "pvc-import").await?.is_none());
    assert!(Api::<PillarVolumeReservation>::all(bed.client.clone())
        .get_opt(&reservation_name)
        .await?
        .is_none());
    assert_eq!(destroyed(&bed)?, 1, "only the created volume is destroyed");
    let volumes = bed
        .fixture
        .backend
        .volumes
        .lock()
        .map_err(|_| "poisoned")?
        .clone();
    // The simulator keys zvols by their dataset, tank/k8s/<name>.
    let holds = |name: &str| {
        volumes
            .keys()
            .any(|k| k.contains(&format!("\"tank/k8s/{name}\"")))
    };
    assert!(holds("legacy"), "the import's zvol stays: {volumes:?}");
    assert!(!holds(&created), "{volumes:?}");
    let listed = agents
        .client(&storage_1)?
        .client
        .list_volumes(agent_pb::ListVolumesRequest {})
        .await?
        .into_inner()
        .volumes;
    let legacy = listed
        .iter()
        .find(|v| v.volume_id == "tank/legacy")
        .ok_or("the agent forgot its mark of tank/legacy")?;
    assert!(legacy.ended, "the import's lifecycle has ended: {legacy:?}");

    // Kept: the recovery record, the Ready one, the one with a PV.
    for name in ["pvc-recovery", "pvc-ready", "pvc-bound"] {
        assert!(record(&bed, name).await?.is_some(), "{name} was reaped");
    }
    // Another pass changes nothing more.
    assert_eq!(r.reap().await, 0);
    assert_eq!(destroyed(&bed)?, 1);
    Ok(())
}

/// Binds the controller's ServiceAccount to the chart's leader-election
/// rules in namespace pillar-csi, as the chart's Role does.
async fn grant_leader_election(admin: &kube::Client) -> Result {
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../charts/pillar-csi/files/rbac/leader-election-rules.yaml");
    let rules: Vec<PolicyRule> = serde_yaml::from_str(&std::fs::read_to_string(file)?)?;
    let name = "pillar-csi-controller-leader-election";
    let meta = ObjectMeta {
        name: Some(name.into()),
        namespace: Some("pillar-csi".into()),
        ..Default::default()
    };
    let pp = PostParams::default();
    Api::<Role>::namespaced(admin.clone(), "pillar-csi")
        .create(
            &pp,
            &Role {
                metadata: meta.clone(),
                rules: Some(rules),
            },
        )
        .await?;
    Api::<RoleBinding>::namespaced(admin.clone(), "pillar-csi")
        .create(
            &pp,
            &RoleBinding {
                metadata: meta,
                role_ref: RoleRef {
                    api_group: "rbac.authorization.k8s.io".into(),
                    kind: "Role".into(),
                    name: name.into(),
                },
                subjects: Some(vec![Subject {
                    kind: "ServiceAccount".into(),
                    name: "pillar-csi-controller".into(),
                    namespace: Some("pillar-csi".into()),
                    ..Default::default()
                }]),
            },
        )
        .await?;
    Ok(())
}

/// One in-process controller replica: its election and its reconcilers.
struct Replica {
    metrics: Arc<Metrics>,
    election: tokio::task::JoinHandle<()>,
    reconciling: tokio::task::JoinHandle<()>,
    _stop: watch::Sender<bool>,
}

async fn replica(bed: &Bed, identity: &str, lease: Duration) -> Result<Replica> {
    let r = bed
        .reconcilers(Settings {
            interval: Duration::from_millis(200),
            sync_period: Duration::from_secs(3600),
            files: false,
        })
        .await?;
    let metrics = r.metrics().clone();
    let (leading_tx, leading) = watch::channel(false);
    let (stop, stopped) = watch::channel(false);
    let election = Election {
        namespace: "pillar-csi".into(),
        name: "pillar-csi-controller".into(),
        identity: identity.into(),
        lease_duration: lease,
    };
    let client = bed.sa.clone();
    Ok(Replica {
        metrics,
        election: tokio::spawn(election.run(client, leading_tx, stopped)),
        reconciling: tokio::spawn(async move { r.run(leading).await }),
        _stop: stop,
    })
}

async fn holder(bed: &Bed) -> Result<Option<String>> {
    Ok(Api::<Lease>::namespaced(bed.client.clone(), "pillar-csi")
        .get_opt("pillar-csi-controller")
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty()))
}

#[tokio::test]
async fn only_the_leader_reconciles_and_another_replica_takes_over() -> Result {
    let bed = bed().await?;
    grant_leader_election(&bed.client).await?;
    let lease = Duration::from_secs(3);
    let a = replica(&bed, "replica-a", lease).await?;
    let b = replica(&bed, "replica-b", lease).await?;

    let start = Instant::now();
    let first = loop {
        if let Some(h) = holder(&bed).await? {
            break h;
        }
        if start.elapsed() > Duration::from_secs(20) {
            return Err("no replica took the Lease within 20 s".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (leader, follower) = if first == "replica-a" { (a, b) } else { (b, a) };
    let start = Instant::now();
    while leader.metrics.passes(names::STORAGE_CLASSES) < 3 {
        if start.elapsed() > Duration::from_secs(20) {
            return Err("the leader ran no 3 rounds within 20 s".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        follower.metrics.passes(names::STORAGE_CLASSES),
        0,
        "the follower reconciled"
    );
    assert_eq!(holder(&bed).await?.as_deref(), Some(first.as_str()));
    assert!(leader.metrics.render().contains("pillar_csi_leader 1\n"));
    assert!(follower.metrics.render().contains("pillar_csi_leader 0\n"));

    // The leader dies without releasing the Lease.
    leader.election.abort();
    leader.reconciling.abort();
    let died = Instant::now();
    while follower.metrics.passes(names::STORAGE_CLASSES) == 0 {
        if died.elapsed() > Duration::from_secs(30) {
            return Err("the follower did not take over within 30 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = died.elapsed();
    // Within the lease duration, plus the follower's retry period and a
    // round's start.
    assert!(
        took <= lease + Duration::from_millis(600) + Duration::from_secs(1),
        "took over after {took:?}"
    );
    assert!(
        took >= Duration::from_millis(500),
        "took over after only {took:?}: the lease was not respected"
    );
    let now = holder(&bed).await?.ok_or("no holder")?;
    assert_ne!(now, first);
    follower.election.abort();
    follower.reconciling.abort();
    Ok(())
}

#[tokio::test]
async fn a_replica_that_stops_cleanly_hands_the_lease_over_at_once() -> Result {
    let bed = bed().await?;
    grant_leader_election(&bed.client).await?;
    let lease = Duration::from_secs(30);
    let a = replica(&bed, "replica-a", lease).await?;
    let start = Instant::now();
    while holder(&bed).await?.as_deref() != Some("replica-a") {
        if start.elapsed() > Duration::from_secs(20) {
            return Err("replica-a did not take the Lease within 20 s".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let b = replica(&bed, "replica-b", lease).await?;
    a._stop.send_replace(true);
    tokio::time::timeout(Duration::from_secs(20), a.election)
        .await
        .map_err(|_| "replica-a did not stop")??;
    let stopped = Instant::now();
    while b.metrics.passes(names::STORAGE_CLASSES) == 0 {
        if stopped.elapsed() > Duration::from_secs(15) {
            return Err("replica-b did not take over within 15 s of a released 30 s lease".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(holder(&bed).await?.as_deref(), Some("replica-b"));
    a.reconciling.abort();
    b.election.abort();
    b.reconciling.abort();
    Ok(())
}

/// The child process, killed when dropped.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `GET /metrics` on `port`: the body as `series -> value`.
async fn scrape(port: u16) -> Result<HashMap<String, f64>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await?;
    let (head, body) = reply.split_once("\r\n\r\n").ok_or("no HTTP head")?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!("GET /metrics: {head}").into());
    }
    let mut out = HashMap::new();
    for line in body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line.rsplit_once(' ').ok_or("a line without value")?;
        out.insert(series.to_owned(), value.parse::<f64>()?);
    }
    Ok(out)
}

#[tokio::test]
async fn the_controller_binary_leads_and_counts_rpcs_by_method_and_code_on_metrics() -> Result {
    use pb::controller_client::ControllerClient;
    let server = ApiServer::start()?;
    server.install_chart_crds().await?;
    server.controller_client().await?;
    grant_leader_election(&server.client().await?).await?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("csi.sock");
    let log = std::fs::File::create(dir.path().join("controller.log"))?;
    let _child = Running(
        std::process::Command::new(pillar_csi_lab::agent::binary()?)
            .arg("controller")
            .arg("--kubeconfig")
            .arg(server.kubeconfig_of("pillar-csi-controller"))
            .arg("--endpoint")
            .arg(format!("unix://{}", socket.display()))
            .args([
                "--agent-insecure-plaintext",
                "--leader-elect",
                "--leader-election-namespace=pillar-csi",
                "--leader-election-identity=replica-1",
                "--leader-election-lease-duration=5s",
                "--reconcile-interval=1s",
            ])
            .arg(format!("--metrics-address=127.0.0.1:{port}"))
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?,
    );
    let start = Instant::now();
    let channel = loop {
        if socket.exists() {
            if let Ok(c) =
                tonic::transport::Endpoint::from_shared(format!("unix://{}", socket.display()))?
                    .connect()
                    .await
            {
                break c;
            }
        }
        if start.elapsed() > Duration::from_secs(30) {
            let log =
                std::fs::read_to_string(dir.path().join("controller.log")).unwrap_or_default();
            return Err(
                format!("the controller's socket did not answer within 30 s:\n{log}").into(),
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut controller = ControllerClient::new(channel);
    for _ in 0..2 {
        controller
            .controller_get_capabilities(pb::ControllerGetCapabilitiesRequest {})
            .await?;
    }
    let refused = controller
        .create_volume(pb::CreateVolumeRequest::default())
        .await
        .expect_err("a nameless volume");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);

    // It takes the Lease and reconciles.
    let start = Instant::now();
    let metrics = loop {
        let m = scrape(port).await?;
        let passes = m
            .get("pillar_csi_reconcile_passes_total{reconciler=\"storage-classes\"}")
            .copied()
            .unwrap_or(0.0);
        if m.get("pillar_csi_leader") == Some(&1.0) && passes >= 1.0 {
            break m;
        }
        if start.elapsed() > Duration::from_secs(30) {
            return Err(format!("not leading and reconciling within 30 s: {m:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let series = |method: &str, code: &str| {
        format!("pillar_csi_controller_rpc_total{{method=\"{method}\",code=\"{code}\"}}")
    };
    assert_eq!(
        metrics.get(&series("ControllerGetCapabilities", "OK")),
        Some(&2.0)
    );
    assert_eq!(
        metrics.get(&series("CreateVolume", "InvalidArgument")),
        Some(&1.0)
    );
    assert_eq!(metrics.get(&series("CreateVolume", "OK")), None);
    assert_eq!(
        metrics.get("pillar_csi_controller_rpc_duration_seconds_count{method=\"CreateVolume\",code=\"InvalidArgument\"}"),
        Some(&1.0)
    );
    assert_eq!(
        metrics.get("pillar_csi_controller_rpc_duration_seconds_bucket{method=\"ControllerGetCapabilities\",code=\"OK\",le=\"+Inf\"}"),
        Some(&2.0)
    );
    let lease = Api::<Lease>::namespaced(server.client().await?, "pillar-csi")
        .get("pillar-csi-controller")
        .await?;
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("replica-1")
    );
    Ok(())
}
