//! A test bed for the Controller against a real kube-apiserver 1.20: the
//! CRDs, an in-process agent over its simulator (`pillar_csi_agent::service::sim`:
//! the zvol pool `tank` with parentDataset `k8s`, the volume group `data-vg`)
//! behind mTLS, and a recorder between the controller and the agent that
//! keeps every agent RPC it was asked (so a test can say no agent call was
//! made, or what a CreateVolume carried).
#![allow(dead_code, clippy::unwrap_used)]
pub mod parts;

use api::crd::*;
use csi::controller::agents::Agents;
use csi::controller::Controller;
use csi::metrics::Metrics;
use csi::reconcile::{Reconcilers, Settings};
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use parts::*;
use pillar_csi_agent::grpc::AgentGrpc;
use pillar_csi_agent::service::sim;
use pillar_csi_lab::apiserver::ApiServer;
use pillar_csi_proto::agent::v1 as ag;
use pillar_csi_proto::agent::v1::agent_service_server::AgentService;
use pillar_csi_proto::csi::v1 as pb;
use pillar_csi_proto::csi::v1::volume_capability::{
    access_mode::Mode, AccessMode, AccessType, MountVolume,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

/// The tests' result type.
pub type Result<T = ()> = pillar_csi_lab::Result<T>;

/// Every agent RPC the controller made, in order: its method name, and the
/// CreateVolume requests in full.
#[derive(Default)]
pub struct Calls {
    /// Method names (`create_volume`, `release_volume`, ...).
    pub methods: Vec<&'static str>,
    /// Each CreateVolume request.
    pub creates: Vec<ag::CreateVolumeRequest>,
}

/// Where the recorder holds an agent call (CreateVolume, unless
/// [`Bed::held_method`] names another) until released.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Hold {
    /// Nowhere: calls pass.
    #[default]
    None,
    /// Before the agent sees the request.
    Request,
    /// After the agent created the volume, before the reply leaves.
    Reply,
}

/// The agent service between the controller and the simulated agent.
#[derive(Clone)]
pub struct Recorder {
    inner: AgentGrpc,
    calls: Arc<Mutex<Calls>>,
    hold: watch::Receiver<Hold>,
    held_method: Arc<Mutex<&'static str>>,
}

impl Recorder {
    /// Waits while CreateVolume is held at `at`.
    async fn pass(&self, at: Hold) {
        let mut hold = self.hold.clone();
        let _ = hold.wait_for(|h| *h != at).await;
    }

    fn seen(&self, method: &'static str, request: &dyn std::any::Any) {
        let mut calls = self.calls.lock().unwrap();
        calls.methods.push(method);
        if let Some(c) = request.downcast_ref::<ag::CreateVolumeRequest>() {
            calls.creates.push(c.clone());
        }
    }
}

macro_rules! delegate {
    ($($method:ident($req:ident) -> $resp:ident;)*) => {
        #[tonic::async_trait]
        impl AgentService for Recorder {
            $(
                async fn $method(
                    &self,
                    request: Request<ag::$req>,
                ) -> std::result::Result<Response<ag::$resp>, Status> {
                    self.seen(stringify!($method), request.get_ref());
                    let create = stringify!($method) == *self.held_method.lock().unwrap();
                    if create {
                        self.pass(Hold::Request).await;
                    }
                    let reply = self.inner.$method(request).await;
                    if create {
                        self.pass(Hold::Reply).await;
                    }
                    reply
                }
            )*
        }
    };
}

delegate! {
    get_capabilities(GetCapabilitiesRequest) -> GetCapabilitiesResponse;
    get_capacity(GetCapacityRequest) -> GetCapacityResponse;
    list_volumes(ListVolumesRequest) -> ListVolumesResponse;
    health_check(HealthCheckRequest) -> HealthCheckResponse;
    create_volume(CreateVolumeRequest) -> CreateVolumeResponse;
    delete_volume(DeleteVolumeRequest) -> DeleteVolumeResponse;
    expand_volume(ExpandVolumeRequest) -> ExpandVolumeResponse;
    export_volume(ExportVolumeRequest) -> ExportVolumeResponse;
    unexport_volume(UnexportVolumeRequest) -> UnexportVolumeResponse;
    allow_initiator(AllowInitiatorRequest) -> AllowInitiatorResponse;
    deny_initiator(DenyInitiatorRequest) -> DenyInitiatorResponse;
    release_volume(ReleaseVolumeRequest) -> ReleaseVolumeResponse;
    inspect_volume(InspectVolumeRequest) -> InspectVolumeResponse;
    transfer_volume_ownership(TransferVolumeOwnershipRequest) -> TransferVolumeOwnershipResponse;
    reconcile_state(ReconcileStateRequest) -> ReconcileStateResponse;
    create_snapshot(CreateSnapshotRequest) -> CreateSnapshotResponse;
    delete_snapshot(DeleteSnapshotRequest) -> DeleteSnapshotResponse;
    list_snapshots(ListSnapshotsRequest) -> ListSnapshotsResponse;
}

/// An API server with the CRDs, the simulated agent `storage-1`, and two
/// classes: `hot` (store `storage-1-hot`: pool tank, parentDataset k8s;
/// xfs; claims may set the ZFS properties compression and volblocksize)
/// and `lvm` (store `storage-1-lvm`: volume group data-vg, linear; ext4),
/// both NVMe/TCP with ACLs.
pub struct Bed {
    /// The API server.
    pub server: ApiServer,
    /// An admin client.
    pub client: kube::Client,
    /// The simulated agent.
    pub fixture: sim::Fixture,
    /// The controller, as its ServiceAccount.
    pub controller: Controller,
    /// What the agent was asked.
    pub calls: Arc<Mutex<Calls>>,
    /// The agent's port.
    pub agent_port: u16,
    /// Where agent CreateVolume calls are held (none at first).
    pub hold: watch::Sender<Hold>,
    /// The agent method `hold` applies to (`create_volume` at first).
    pub held_method: Arc<Mutex<&'static str>>,
    /// The mTLS material of agent and controller.
    pub certs: Certs,
    _agent: AgentServer,
}

/// Starts the bed.
pub async fn bed() -> Result<Bed> {
    let server = ApiServer::start()?;
    server.install_chart_crds().await?;
    let client = server.client().await?;
    let certs = Certs::new()?;
    let fixture = sim::fixture();
    let calls = Arc::new(Mutex::new(Calls::default()));
    let (hold, held) = watch::channel(Hold::None);
    let held_method = Arc::new(Mutex::new("create_volume"));
    let recorder = Recorder {
        inner: AgentGrpc::new(fixture.agent.clone(), "sim"),
        calls: calls.clone(),
        hold: held,
        held_method: held_method.clone(),
    };
    let (port, agent) = serve_agent(&certs.agent_server_tls()?, recorder, 0).await?;
    create_agent(&client, port).await?;
    create_objects(
        &client,
        &[zfs_store(), lvm_store()],
        &[
            {
                // Claims of `hot` may tune these two properties (and no
                // others) with the backend annotation.
                let mut hot = class("hot", "storage-1-hot", "pillar-hot", Some(FsType::Xfs));
                hot.spec.allowed_claim_zfs_properties =
                    vec!["compression".into(), "volblocksize".into()];
                hot
            },
            class("lvm", "storage-1-lvm", "pillar-lvm", Some(FsType::Ext4)),
        ],
    )
    .await?;
    let agents = Agents::new(Some(&certs.controller_tls()))?;
    // The controller runs as its ServiceAccount with the chart's rules only.
    let controller = Controller::new(server.controller_client().await?, agents);
    Ok(Bed {
        server,
        client,
        fixture,
        controller,
        calls,
        agent_port: port,
        hold,
        held_method,
        certs,
        _agent: agent,
    })
}

impl Bed {
    /// How many agent RPCs were made so far.
    pub fn agent_calls(&self) -> usize {
        self.calls.lock().unwrap().methods.len()
    }

    /// The agent RPCs made after the first `from`.
    pub fn agent_calls_since(&self, from: usize) -> Vec<&'static str> {
        self.calls.lock().unwrap().methods[from..].to_vec()
    }

    /// The last CreateVolume the agent was asked.
    pub fn last_create(&self) -> Option<ag::CreateVolumeRequest> {
        self.calls.lock().unwrap().creates.last().cloned()
    }

    /// Points the PillarAgent at `port` (1: nothing listens).
    pub fn agent_at(&self, port: u16) -> Result {
        self.server.kubectl(&[
            "patch",
            "pillaragent",
            "storage-1",
            "--type=merge",
            "-p",
            &format!("{{\"spec\":{{\"port\":{port}}}}}"),
        ])?;
        Ok(())
    }

    /// Adds a zvol `tank/k8s/<name>` of `bytes` to the simulated pool, as
    /// another driver left it.
    pub fn add_zvol(&self, name: &str, bytes: u64) {
        self.fixture
            .backend
            .volumes
            .lock()
            .unwrap()
            .insert(zvol_key(name), bytes);
    }

    /// The size of the simulated zvol `tank/k8s/<name>`, if it exists.
    pub fn zvol(&self, name: &str) -> Option<u64> {
        self.fixture
            .backend
            .volumes
            .lock()
            .unwrap()
            .get(&zvol_key(name))
            .copied()
    }

    /// How many zvols the simulated pool holds.
    pub fn zvols(&self) -> usize {
        self.fixture.backend.volumes.lock().unwrap().len()
    }

    /// Deletes the claim `namespace/name` and waits until it is gone (the
    /// API server's admission adds kubernetes.io/pvc-protection, which only
    /// the absent kube-controller-manager would remove: done here).
    pub async fn delete_claim(&self, namespace: &str, name: &str) -> Result {
        let claims = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), namespace);
        claims.delete(name, &DeleteParams::default()).await?;
        claims
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
            )
            .await?;
        for _ in 0..100 {
            if claims.get_opt(name).await?.is_none() {
                return Ok(());
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        Err(format!("claim {namespace}/{name} still exists after 10 s").into())
    }

    /// The controller's reconcilers (the reaper among them), as its
    /// ServiceAccount, reaching the agent through the recorder.
    pub async fn reconcilers(&self) -> Result<Reconcilers> {
        Ok(Reconcilers::new(
            self.server.controller_client().await?,
            Agents::new(Some(&self.certs.controller_tls()))?,
            Arc::new(Metrics::default()),
            Settings::default(),
        ))
    }

    /// Runs `create` with the agent's CreateVolume held before the agent
    /// sees it, and `meanwhile` once the recorder holds it; then lets it go.
    pub async fn held_while<T>(
        &self,
        create: impl std::future::Future<Output = T>,
        meanwhile: impl std::future::Future<Output = Result>,
    ) -> Result<T> {
        let from = self.agent_calls();
        self.hold.send_replace(Hold::Request);
        let other = async {
            let mut seen = false;
            for _ in 0..300 {
                seen = self.agent_calls_since(from).contains(&"create_volume");
                if seen {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            let done = if seen {
                meanwhile.await
            } else {
                Err("the agent's CreateVolume never came".into())
            };
            self.hold.send_replace(Hold::None);
            done
        };
        let (created, done) = tokio::join!(create, other);
        done?;
        Ok(created)
    }

    /// How many volumes the simulated pool and volume group destroyed.
    pub fn destroyed(&self) -> u32 {
        *self.fixture.backend.destroyed.lock().unwrap() + *self.fixture.lvm.removed.lock().unwrap()
    }
}

/// The simulated pool's key of the zvol `tank/k8s/<name>`.
pub fn zvol_key(name: &str) -> String {
    format!(
        "{:?}",
        pillar_csi_agent::marks::BackendRecord::Zvol {
            dataset: format!("tank/k8s/{name}"),
            guid: None,
        }
    )
}

/// A single-node-writer capability, mounted (`fs` may be empty).
pub fn mount_cap(fs: &str) -> pb::VolumeCapability {
    pb::VolumeCapability {
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs.into(),
            ..Default::default()
        })),
    }
}

/// A CreateVolume of `bytes` for the claim `namespace/claim` of `class`.
pub fn create_request(
    name: &str,
    bytes: i64,
    class: &str,
    namespace: &str,
    claim: &str,
) -> pb::CreateVolumeRequest {
    pb::CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(pb::CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![mount_cap("")],
        parameters: HashMap::from([
            ("pillarStorageClass".to_owned(), class.to_owned()),
            ("csi.storage.k8s.io/pvc/name".to_owned(), claim.to_owned()),
            (
                "csi.storage.k8s.io/pvc/namespace".to_owned(),
                namespace.to_owned(),
            ),
        ]),
        ..Default::default()
    }
}

/// Creates the claim `namespace/name` (64 MiB, ReadWriteOnce) with
/// `annotations`; returns the PV name the provisioner would use.
pub async fn claim(
    bed: &Bed,
    namespace: &str,
    name: &str,
    annotations: &[(&str, &str)],
) -> Result<String> {
    let annotations: HashMap<&str, &str> = annotations.iter().copied().collect();
    let pvc: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "64Mi"}}},
    }))?;
    let pvc = Api::<PersistentVolumeClaim>::namespaced(bed.client.clone(), namespace)
        .create(&PostParams::default(), &pvc)
        .await?;
    Ok(format!(
        "pvc-{}",
        pvc.metadata.uid.ok_or("a claim without a UID")?
    ))
}

/// The messages of the Warning events about the claim `namespace/name`.
pub async fn warnings(bed: &Bed, namespace: &str, name: &str) -> Result<Vec<String>> {
    let events = Api::<Event>::namespaced(bed.client.clone(), namespace)
        .list(&ListParams::default())
        .await?;
    let mut found: Vec<(Option<String>, String)> = events
        .items
        .into_iter()
        .filter(|e| {
            e.involved_object.kind.as_deref() == Some("PersistentVolumeClaim")
                && e.involved_object.name.as_deref() == Some(name)
                && e.type_.as_deref() == Some("Warning")
        })
        .map(|e| {
            (
                e.metadata.creation_timestamp.map(|t| t.0.to_string()),
                e.message.unwrap_or_default(),
            )
        })
        .collect();
    found.sort();
    Ok(found.into_iter().map(|(_, m)| m).collect())
}

/// The record named `name`.
pub async fn state(bed: &Bed, name: &str) -> Result<Option<PillarVolumeState>> {
    Ok(Api::<PillarVolumeState>::all(bed.client.clone())
        .get_opt(name)
        .await?)
}

/// Every reservation, by name.
pub async fn reservations(bed: &Bed) -> Result<Vec<PillarVolumeReservation>> {
    Ok(Api::<PillarVolumeReservation>::all(bed.client.clone())
        .list(&ListParams::default())
        .await?
        .items)
}

/// Every record.
pub async fn states(bed: &Bed) -> Result<Vec<PillarVolumeState>> {
    Ok(Api::<PillarVolumeState>::all(bed.client.clone())
        .list(&ListParams::default())
        .await?
        .items)
}
