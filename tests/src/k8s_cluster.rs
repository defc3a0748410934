//! A small cluster around a [`ClaimBed`] for the claim tests that go
//! through the real Kubernetes components: kube-controller-manager, the
//! snapshot-controller and the controller pod's four CSI sidecars
//! ([`crate::k8s`]), and the node half either real or played. With
//! [`Cluster::start_with_kubelet`], kube-scheduler and a real kubelet with
//! containerd ([`Kubelet`]) run, kubelet registers the Node and the node
//! plugin, and the test plays only the user. With [`Cluster::start`], the
//! test registers the Node and its CSINode as kubelet and
//! node-driver-registrar would, and plays kubelet too
//! ([`crate::played_kubelet`]). With [`Cluster::start_for_chart`], kube-proxy
//! and kubelet run and no driver does: the Helm chart's Pods are the driver
//! ([`crate::chart_install`]).
use crate::{
    apiserver::ApiServer,
    claim_bed::ClaimBed,
    k8s::{tail, ControllerManager, KubeProxy, Scheduler, Sidecars, SnapshotController, SIDECARS},
    kubelet::Kubelet,
    Result,
};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::core::v1::{PersistentVolumeClaimSpec, ServiceAccount};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, PostParams,
};
use serde_json::{json, Value};
use std::{
    fs,
    path::PathBuf,
    time::{Duration, Instant},
};

/// The CSI driver's name.
pub const DRIVER: &str = "pillar-csi.bhyoo.com";
/// The namespace of the user's objects.
pub const NAMESPACE: &str = "default";
/// How long one step of the real components may take under the lab's CPU.
pub const STEP: Duration = Duration::from_secs(240);

/// The bed's cluster, or the chart's ([`Cluster::start_for_chart`]): its
/// components run until it is dropped.
pub struct Cluster<'a> {
    /// The storage side, the driver and the API server; none when the
    /// chart runs the driver.
    bed: Option<&'a ClaimBed>,
    /// The Node's name (the node ID's first part).
    pub node_name: String,
    /// The user's view: the admin's client.
    pub admin: kube::Client,
    /// The ZFS dataset (`pool/parent`) under which the zvols are made.
    pub parent: String,
    /// Where the components' logs go.
    work: PathBuf,
    /// kube-scheduler and the real kubelet, first to stop when dropped.
    kubelet: Option<(Scheduler, Kubelet)>,
    /// kube-proxy, for the chart's Pods that reach the API server.
    proxy: Option<KubeProxy>,
    kcm: ControllerManager,
    snapshots: SnapshotController,
    /// Locked to restart an exited sidecar while a wait runs.
    sidecars: std::sync::Mutex<Option<Sidecars>>,
}

pub use crate::played_kubelet::Mounted;

impl<'a> Cluster<'a> {
    /// Starts kube-controller-manager, the snapshot-controller (after its
    /// CRDs) and the sidecars on `bed`, registers the Node and its CSINode
    /// as kubelet and node-driver-registrar would (no kubelet runs), and
    /// waits for the namespace's default ServiceAccount.
    pub async fn start(bed: &'a ClaimBed) -> Result<Self> {
        let _clock = crate::setup_clock::start("Cluster::start");
        let kcm = ControllerManager::start(&bed.server, &bed.lab.work).await?;
        let cluster = Self::around(bed, kcm, None).await?;
        let node: Node = from(json!({
            "metadata": {"name": cluster.node_name,
                "annotations": {"volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
        }))?;
        cluster
            .api::<Node>()
            .create(&PostParams::default(), &node)
            .await?;
        let csinode: CSINode = from(json!({
            "metadata": {"name": cluster.node_name},
            "spec": {"drivers": [{"name": DRIVER, "nodeID": bed.node_id, "topologyKeys": []}]},
        }))?;
        cluster
            .api::<CSINode>()
            .create(&PostParams::default(), &csinode)
            .await?;
        cluster.default_service_account().await?;
        Ok(cluster)
    }

    /// Starts the cluster with a real kubelet and kube-scheduler: the
    /// components of [`Cluster::start`] (kube-controller-manager with its
    /// node lifecycle controller too), kube-scheduler, and kubelet with
    /// containerd in the guest ([`Kubelet`]), which registers the Node
    /// itself; once it is Ready, the node plugin is registered with
    /// kubelet, which writes the CSINode from the plugin's NodeGetInfo.
    pub async fn start_with_kubelet(bed: &'a ClaimBed) -> Result<Self> {
        let _clock = crate::setup_clock::start("Cluster::start_with_kubelet");
        let kcm = ControllerManager::start_for_kubelet(&bed.server, &bed.lab.work).await?;
        let scheduler = Scheduler::start(&bed.server, &bed.lab.work)?;
        let kubelet = Kubelet::start(&bed.server, &bed.admin, &bed.plugin.node_name).await?;
        let mut cluster = Self::around(bed, kcm, Some((scheduler, kubelet))).await?;
        cluster.node_ready().await?;
        if let Some((_, kubelet)) = cluster.kubelet.as_mut() {
            kubelet.register(bed)?;
        }
        let node_id = cluster.registered_node_id().await?;
        assert_eq!(
            node_id, bed.node_id,
            "kubelet wrote the node ID the plugin's NodeGetInfo gives"
        );
        cluster.default_service_account().await?;
        Ok(cluster)
    }

    async fn around(
        bed: &'a ClaimBed,
        kcm: ControllerManager,
        kubelet: Option<(Scheduler, Kubelet)>,
    ) -> Result<Self> {
        let snapshots = SnapshotController::start(&bed.server, &bed.lab.work).await?;
        let sidecars = Sidecars::start(bed).await?;
        let node_name = bed.node_id.split('/').next().unwrap_or_default().to_owned();
        Ok(Self {
            bed: Some(bed),
            node_name,
            admin: bed.admin.clone(),
            parent: format!("{}/{}", bed.parent.pool, bed.parent.name),
            work: bed.lab.work.clone(),
            kubelet,
            proxy: None,
            kcm,
            snapshots,
            sidecars: std::sync::Mutex::new(Some(sidecars)),
        })
    }

    /// The cluster the Helm chart is installed on: kube-controller-manager
    /// ([`ControllerManager::start_for_chart`]), the snapshot-controller,
    /// kube-scheduler, kube-proxy and kubelet with containerd for Node
    /// `node_name`, with no driver yet: the chart's Pods are the driver
    /// (its zvols under `parent`). Returns once the Node is Ready and
    /// untainted and the namespace's default ServiceAccount exists.
    pub async fn start_for_chart(
        server: &ApiServer,
        work: &std::path::Path,
        node_name: &str,
        parent: String,
    ) -> Result<Self> {
        let _clock = crate::setup_clock::start("Cluster::start_for_chart");
        let admin = server.client().await?;
        let kcm = ControllerManager::start_for_chart(server, work).await?;
        let snapshots = SnapshotController::start(server, work).await?;
        let scheduler = Scheduler::start(server, work)?;
        let kubelet = Kubelet::start(server, &admin, node_name).await?;
        let mut cluster = Self {
            bed: None,
            node_name: node_name.to_owned(),
            admin,
            parent,
            work: work.to_owned(),
            kubelet: Some((scheduler, kubelet)),
            proxy: None,
            kcm,
            snapshots,
            sidecars: std::sync::Mutex::new(None),
        };
        cluster.node_ready().await?;
        // After the Node exists: kube-proxy reads its address from it.
        cluster.proxy = Some(KubeProxy::start(server, work, node_name)?);
        cluster.default_service_account().await?;
        Ok(cluster)
    }

    /// The bed whose driver this cluster drives (its played kubelet's
    /// node plugin); a chart cluster has none.
    pub fn bed(&self) -> &'a ClaimBed {
        self.bed
            .expect("this cluster runs the chart's driver: it has no bed")
    }

    /// Waits until kubelet wrote the driver into the Node's CSINode (the
    /// node plugin registered); its node ID there.
    pub async fn registered_node_id(&self) -> Result<String> {
        let csinodes = self.api::<CSINode>();
        let name = self.node_name.clone();
        self.until(&format!("CSINode {name} with {DRIVER}"), || {
            let (csinodes, name) = (csinodes.clone(), name.clone());
            async move {
                let csinode = csinodes.get_opt(&name).await?;
                let drivers = csinode.map(|c| c.spec.drivers).unwrap_or_default();
                Ok(drivers
                    .into_iter()
                    .find(|d| d.name == DRIVER)
                    .map(|d| d.node_id))
            }
        })
        .await
    }

    /// Waits until the Node is Ready and carries no NoSchedule taint.
    async fn node_ready(&self) -> Result<()> {
        let nodes = self.api::<Node>();
        let name = self.node_name.clone();
        self.until(&format!("Node {name} Ready and untainted"), || {
            let (nodes, name) = (nodes.clone(), name.clone());
            async move {
                Ok(nodes
                    .get_opt(&name)
                    .await?
                    .filter(ready_and_untainted)
                    .map(|_| ()))
            }
        })
        .await
    }

    /// Waits for the namespace's default ServiceAccount: the API server
    /// admits a Pod once kube-controller-manager made it.
    async fn default_service_account(&self) -> Result<()> {
        let accounts: Api<ServiceAccount> = self.namespaced();
        self.until("ServiceAccount default", || {
            let accounts = accounts.clone();
            async move { Ok(accounts.get_opt("default").await?.map(|_| ())) }
        })
        .await
    }

    /// The real kubelet, when the cluster was started with one.
    pub fn kubelet(&self) -> Option<&Kubelet> {
        self.kubelet.as_ref().map(|(_, k)| k)
    }

    /// The cluster-wide API of `K`.
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope>,
        K::DynamicType: Default,
    {
        Api::all(self.admin.clone())
    }

    /// The API of `K` in [`NAMESPACE`].
    pub fn namespaced<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.admin.clone(), NAMESPACE)
    }

    /// The API of `snapshot.storage.k8s.io/v1` kind `kind`, in [`NAMESPACE`]
    /// (VolumeSnapshot) or cluster-wide (VolumeSnapshotContent, -Class).
    pub fn snapshot_api(&self, kind: &str) -> Api<DynamicObject> {
        let gvk = GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", kind);
        let resource = ApiResource::from_gvk(&gvk);
        match kind {
            "VolumeSnapshot" => Api::namespaced_with(self.admin.clone(), NAMESPACE, &resource),
            _ => Api::all_with(self.admin.clone(), &resource),
        }
    }

    /// The tails of every component's log and the driver's.
    pub fn logs(&self) -> String {
        let sidecars = SIDECARS.iter().map(|n| {
            let log =
                fs::read_to_string(self.work.join(format!("k8s.{n}.log"))).unwrap_or_default();
            format!("==== {n} ====\n{}", tail(&log, 30))
        });
        let mut parts: Vec<String> = sidecars.collect();
        parts.push(format!(
            "==== snapshot-controller ====\n{}",
            tail(&self.snapshots.0.log(), 30)
        ));
        parts.push(format!(
            "==== kube-controller-manager ====\n{}",
            tail(&self.kcm.0.log(), 30)
        ));
        if let Some((scheduler, kubelet)) = &self.kubelet {
            parts.push(format!(
                "==== kube-scheduler ====\n{}\n{}",
                tail(&scheduler.0.log(), 15),
                kubelet.logs()
            ));
        }
        match (self.bed, &self.kubelet) {
            (Some(bed), _) => parts.push(format!("==== driver ====\n{}", tail(&bed.logs(), 30))),
            (None, Some((_, kubelet))) => parts.push(kubelet.pod_logs(20)),
            (None, None) => {}
        }
        if let Some(proxy) = &self.proxy {
            parts.push(format!(
                "==== kube-proxy ====\n{}",
                tail(&proxy.0.log(), 10)
            ));
        }
        parts.join("\n")
    }

    /// Waits (bounded by [`STEP`]) until `f` gives a value; the error names
    /// `what` and carries the components' logs.
    pub async fn until<T, F, Fut>(&self, what: &str, mut f: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<Option<T>>>,
    {
        let start = Instant::now();
        loop {
            self.restart_exited_sidecars()?;
            if let Some(v) = f().await? {
                println!("      {what}: after {:.1} s", start.elapsed().as_secs_f64());
                return Ok(v);
            }
            if start.elapsed() > STEP {
                return Err(format!("{what}: not within {STEP:?}\n{}", self.logs()).into());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Starts again each sidecar that exited, as kubelet restarts the
    /// controller pod's exited container (a sidecar exits when it loses
    /// its connection to the CSI socket, which a loaded machine's slow
    /// first probe can do); prints which and why.
    fn restart_exited_sidecars(&self) -> Result<()> {
        let mut sidecars = self.sidecars.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(sidecars) = sidecars.as_mut() {
            for restarted in sidecars.restart_exited()? {
                println!("      restarted, as kubelet would: {restarted}");
            }
        }
        Ok(())
    }

    /// The user's claim `name` of `size` (`64Mi`) in StorageClass `class`,
    /// made from `data_source` (a `spec.dataSource`) when given.
    pub async fn claim(
        &self,
        name: &str,
        class: &str,
        size: &str,
        data_source: Option<Value>,
    ) -> Result<()> {
        self.claim_annotated(name, class, size, data_source, json!({}))
            .await
    }

    /// [`Cluster::claim`] with `annotations` (a JSON object).
    pub async fn claim_annotated(
        &self,
        name: &str,
        class: &str,
        size: &str,
        data_source: Option<Value>,
        annotations: Value,
    ) -> Result<()> {
        let mut spec = json!({"accessModes": ["ReadWriteOnce"], "storageClassName": class,
            "resources": {"requests": {"storage": size}}});
        if let Some(source) = data_source {
            spec["dataSource"] = source;
        }
        let spec: PersistentVolumeClaimSpec = from(spec)?;
        let pvc = PersistentVolumeClaim {
            metadata: from(json!({"name": name, "annotations": annotations}))?,
            spec: Some(spec),
            ..Default::default()
        };
        self.namespaced::<PersistentVolumeClaim>()
            .create(&PostParams::default(), &pvc)
            .await?;
        Ok(())
    }

    /// Waits until claim `name` is Bound; returns its PV.
    pub async fn bound(&self, name: &str) -> Result<PersistentVolume> {
        let pvcs = self.namespaced::<PersistentVolumeClaim>();
        let pv_name = self
            .until(&format!("PVC {name} Bound"), || {
                let pvcs = pvcs.clone();
                async move {
                    let c = pvcs.get(name).await?;
                    Ok(c.status
                        .and_then(|s| s.phase)
                        .filter(|p| p == "Bound")
                        .and(c.spec.and_then(|s| s.volume_name)))
                }
            })
            .await?;
        Ok(self.api::<PersistentVolume>().get(&pv_name).await?)
    }

    /// Deletes claim `name` and waits until its PV is gone (the real
    /// provisioner's DeleteVolume succeeded).
    pub async fn delete_claim(&self, name: &str, pv: &PersistentVolume) -> Result<()> {
        self.namespaced::<PersistentVolumeClaim>()
            .delete(name, &DeleteParams::default())
            .await?;
        let pv_name = pv.metadata.name.clone().unwrap_or_default();
        let pvs = self.api::<PersistentVolume>();
        self.until(&format!("PV {pv_name} of PVC {name} deleted"), || {
            let (pvs, pv_name) = (pvs.clone(), pv_name.clone());
            async move { Ok(pvs.get_opt(&pv_name).await?.is_none().then_some(())) }
        })
        .await
    }

    /// A Pod `name` on the Node using `claims`; the attach-detach controller
    /// makes their VolumeAttachments.
    pub async fn pod(&self, name: &str, claims: &[&str]) -> Result<()> {
        let volumes: Vec<Value> = claims
            .iter()
            .map(|c| json!({"name": c, "persistentVolumeClaim": {"claimName": c}}))
            .collect();
        let mounts: Vec<Value> = claims
            .iter()
            .map(|c| json!({"name": c, "mountPath": format!("/{c}")}))
            .collect();
        let pod: Pod = from(json!({
            "metadata": {"name": name},
            "spec": {"nodeName": self.node_name, "automountServiceAccountToken": false,
                "containers": [{"name": "c", "image": "busybox", "volumeMounts": mounts}],
                "volumes": volumes},
        }))?;
        self.namespaced::<Pod>()
            .create(&PostParams::default(), &pod)
            .await?;
        Ok(())
    }

    /// Deletes Pod `name` at once.
    pub async fn delete_pod(&self, name: &str) -> Result<()> {
        self.namespaced::<Pod>()
            .delete(name, &DeleteParams::default().grace_period(0))
            .await?;
        Ok(())
    }

    /// Waits until the real attacher attached `pv` to the Node; returns
    /// its VolumeAttachment.
    pub async fn attached(&self, pv: &PersistentVolume) -> Result<VolumeAttachment> {
        let pv_name = pv.metadata.name.clone().unwrap_or_default();
        let vas = self.api::<VolumeAttachment>();
        let va = self
            .until(&format!("VolumeAttachment of {pv_name} attached"), || {
                let (vas, pv_name) = (vas.clone(), pv_name.clone());
                async move {
                    let list = vas.list(&ListParams::default()).await?;
                    Ok(list.items.into_iter().find(|va| {
                        va.spec.source.persistent_volume_name.as_deref() == Some(pv_name.as_str())
                            && va.status.as_ref().is_some_and(|s| s.attached)
                    }))
                }
            })
            .await?;
        assert_eq!(va.spec.attacher, DRIVER);
        assert_eq!(va.spec.node_name, self.node_name);
        Ok(va)
    }

    /// Waits until no VolumeAttachment names `pv` (the attach-detach
    /// controller deleted it, the real attacher unpublished).
    pub async fn detached(&self, pv: &PersistentVolume) -> Result<()> {
        let pv_name = pv.metadata.name.clone().unwrap_or_default();
        let vas = self.api::<VolumeAttachment>();
        self.until(&format!("VolumeAttachment of {pv_name} gone"), || {
            let (vas, pv_name) = (vas.clone(), pv_name.clone());
            async move {
                let list = vas.list(&ListParams::default()).await?;
                Ok(list
                    .items
                    .iter()
                    .all(|va| {
                        va.spec.source.persistent_volume_name.as_deref() != Some(pv_name.as_str())
                    })
                    .then_some(()))
            }
        })
        .await
    }

    /// Unregisters the Node and stops the sidecars as a deleted pod's
    /// containers stop (SIGTERM, then a grace period); the other
    /// components stop when the cluster is dropped.
    pub async fn stop(mut self) -> Result<()> {
        // kubelet first: its registrar's socket goes, and it unregisters.
        self.kubelet.take();
        self.api::<Node>()
            .delete(&self.node_name, &DeleteParams::default())
            .await?;
        self.api::<CSINode>()
            .delete(&self.node_name, &DeleteParams::default())
            .await?;
        let sidecars = self
            .sidecars
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(sidecars) = sidecars {
            sidecars.terminate().await;
        }
        Ok(())
    }
}

/// Whether `node` reports Ready and carries no NoSchedule taint (the
/// `not-ready` one it is admitted with goes once the node lifecycle
/// controller saw it Ready).
fn ready_and_untainted(node: &Node) -> bool {
    let status = node.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let taints = node.spec.as_ref().and_then(|s| s.taints.as_ref());
    ready && taints.is_none_or(|ts| ts.iter().all(|t| t.effect != "NoSchedule"))
}

/// `v` as a `T`.
pub fn from<T: serde::de::DeserializeOwned>(v: Value) -> Result<T> {
    Ok(serde_json::from_value(v)?)
}
