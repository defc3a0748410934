//! The Helm chart installed for real on the lab's cluster (issue 41): the
//! chart's images made offline and imported into the guest's containerd
//! (`tests/lab/mkimage.py chart`, on the Debian base layers of
//! `scripts/deps-image-base.py`), `helm install` of `charts/pillar-csi`
//! with the Helm CLI an operator runs, and its Pods (the controller with
//! the real sidecars, the node plugin, the agent) run by the real kubelet
//! until `helm uninstall` removes them.
//!
//! Two sidecars are the lab's stand-ins, each in an image of its own with
//! the real one's flags: node-driver-registrar (`tests/lab/registrar.py`)
//! and livenessprobe (`tests/lab/livenessprobe.py`); the Go module proxy
//! serves neither.
use crate::{
    apiserver::ApiServer,
    claim_bed::{Class, Layout, ISCSI_PORT, NVME_PORT},
    k8s::sidecar_binary,
    k8s_cluster::{from, Cluster, DRIVER},
    tls::{Ca, Pem},
    Result,
};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

/// The release's name; its objects are named `chartlab-pillar-csi-*`, apart
/// from what other tests of the run left under the chart's default names.
pub const RELEASE: &str = "chartlab";
/// The release's namespace.
pub const CHART_NAMESPACE: &str = "chartlab";
/// How long the chart's Pods may take to be Ready (images unpacked, six
/// containers started under the lab's emulated CPU).
const ROLLOUT: Duration = Duration::from_secs(600);

/// A release of the chart on the cluster.
pub struct ChartInstall {
    helm: PathBuf,
    kubeconfig: PathBuf,
    /// The values the release was installed with (a JSON file).
    pub values: PathBuf,
    /// Seconds `ctr images import` of the chart's images took.
    pub imported_in: f64,
    /// Seconds from `helm install` until the Pods were Ready and the node
    /// plugin registered.
    pub ready_in: f64,
}

impl ChartInstall {
    /// Imports the chart's images (`chart-images.tar` in `work`, which the
    /// lab runner made) into the kubelet's containerd, makes the release's namespace and its mTLS Secrets
    /// (signed by `ca`: the agent's server certificate for `layout.agent`,
    /// the controller's client certificate), labels the Node a storage node
    /// and runs `helm install` with values for the lab's pool and volume
    /// group; returns once the three Pods are Ready and kubelet registered
    /// the node plugin.
    pub async fn install(
        cluster: &Cluster<'_>,
        server: &ApiServer,
        work: &Path,
        layout: &Layout,
        ca: &Ca,
    ) -> Result<Self> {
        let kubelet = cluster
            .kubelet()
            .ok_or("the chart's cluster runs kubelet")?;
        // Made by the lab runner on the host (tests/lab/run, mkimage.py chart).
        let images = work.join("chart-images.tar");
        if !images.is_file() {
            return Err(format!(
                "{} is missing: the lab runner makes it when the API server runs (tests/lab/run)",
                images.display()
            )
            .into());
        }
        let started = Instant::now();
        let imported = kubelet.import_images(&images);
        let _ = fs::remove_file(&images);
        imported?;
        let imported_in = started.elapsed().as_secs_f64();
        println!("      the chart's images imported into containerd in {imported_in:.1} s");

        let admin = &cluster.admin;
        Api::<Namespace>::all(admin.clone())
            .create(
                &PostParams::default(),
                &from(json!({"metadata": {"name": CHART_NAMESPACE}}))?,
            )
            .await?;
        let agent_pem = ca.server("chartlab-agent", layout.agent.ip())?;
        let controller_pem = ca.client("chartlab-controller")?;
        let secrets: Api<Secret> = Api::namespaced(admin.clone(), CHART_NAMESPACE);
        for (name, pem) in [
            ("chartlab-agent-mtls", &agent_pem),
            ("chartlab-controller-mtls", &controller_pem),
        ] {
            secrets
                .create(&PostParams::default(), &tls_secret(name, pem, ca)?)
                .await?;
        }
        let label = json!({"metadata": {"labels": {"pillar-csi.bhyoo.com/storage-node": "true"}}});
        Api::<Node>::all(admin.clone())
            .patch(
                &cluster.node_name,
                &PatchParams::default(),
                &Patch::Merge(&label),
            )
            .await?;

        let mut chart = Self {
            helm: sidecar_binary("helm")?,
            kubeconfig: server.kubeconfig(),
            values: work.join("chartlab-values.json"),
            imported_in,
            ready_in: 0.0,
        };
        fs::write(&chart.values, serde_json::to_vec_pretty(&values(layout))?)?;
        remove_unowned_csidriver(cluster).await?;
        let chart_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/pillar-csi");
        let started = Instant::now();
        let out = chart.helm(&[
            "install",
            RELEASE,
            &chart_dir.display().to_string(),
            "--namespace",
            CHART_NAMESPACE,
            "--values",
            &chart.values.display().to_string(),
        ])?;
        println!(
            "      [helm] {}",
            out.lines()
                .take(6)
                .collect::<Vec<_>>()
                .join("\n      [helm] ")
        );
        chart.rolled_out(cluster).await?;
        chart.ready_in = started.elapsed().as_secs_f64();
        Ok(chart)
    }

    /// Runs the Helm CLI against the cluster's admin kubeconfig; its output.
    pub fn helm(&self, args: &[&str]) -> Result<String> {
        let out = Command::new(&self.helm)
            .args(args)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .env("HELM_CACHE_HOME", self.values.with_extension("helm-cache"))
            .env(
                "HELM_CONFIG_HOME",
                self.values.with_extension("helm-config"),
            )
            .env("HELM_DATA_HOME", self.values.with_extension("helm-data"))
            .output()?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if !out.status.success() {
            return Err(format!("helm {}: {text}", args.join(" ")).into());
        }
        Ok(text)
    }

    /// Waits until the release's three Pods are Ready and kubelet wrote the
    /// node plugin into the Node's CSINode.
    async fn rolled_out(&self, cluster: &Cluster<'_>) -> Result<()> {
        let pods: Api<Pod> = Api::namespaced(cluster.admin.clone(), CHART_NAMESPACE);
        let started = Instant::now();
        let mut last_report = Instant::now();
        loop {
            let listed = pods.list(&ListParams::default()).await?.items;
            let states: Vec<String> = listed.iter().map(pod_state).collect();
            let ready = listed.iter().filter(|p| pod_ready(p)).count();
            if ready == 3 && listed.len() == 3 {
                println!(
                    "      the release's Pods Ready after {:.1} s: {}",
                    started.elapsed().as_secs_f64(),
                    states.join("; ")
                );
                break;
            }
            if started.elapsed() > ROLLOUT {
                return Err(format!(
                    "the release's Pods not Ready within {ROLLOUT:?}: {}\n{}",
                    states.join("; "),
                    cluster.logs()
                )
                .into());
            }
            if last_report.elapsed() > Duration::from_secs(60) {
                println!("      waiting: {}", states.join("; "));
                last_report = Instant::now();
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        let name = &cluster.node_name;
        let node_id = cluster.registered_node_id().await?;
        assert!(
            node_id.starts_with(&format!("{name}/")),
            "the node plugin's node ID {node_id} names the Node (the chart passes spec.nodeName)"
        );
        println!("      CSINode {name}: {DRIVER} with node ID {node_id}");
        Ok(())
    }

    /// Waits until the release's controller generated `class`'s StorageClass.
    pub async fn storage_class(
        &self,
        cluster: &Cluster<'_>,
        class: &Class,
    ) -> Result<StorageClass> {
        let api: Api<StorageClass> = Api::all(cluster.admin.clone());
        let name = class.storage_class.clone();
        cluster
            .until(
                &format!("StorageClass {name} from the release's controller"),
                || {
                    let (api, name) = (api.clone(), name.clone());
                    async move { Ok(api.get_opt(&name).await?) }
                },
            )
            .await
    }

    /// `helm uninstall`, then waits until the namespace has no Pod left
    /// (kubelet stopped them all, the node plugin unregistered).
    pub async fn uninstall(&self, cluster: &Cluster<'_>) -> Result<()> {
        let out = self.helm(&["uninstall", RELEASE, "--namespace", CHART_NAMESPACE])?;
        println!("      [helm] {}", out.trim());
        let pods: Api<Pod> = Api::namespaced(cluster.admin.clone(), CHART_NAMESPACE);
        cluster
            .until("the release's Pods gone", || {
                let pods = pods.clone();
                async move {
                    let left = pods.list(&ListParams::default()).await?.items;
                    Ok(left.is_empty().then_some(()))
                }
            })
            .await
    }
}

/// Removes a CSIDriver of the driver's name that no Helm release owns: the
/// guides' test of the same run applies the chart's objects without Helm
/// and leaves it, and Helm refuses to install over an object it does not
/// own (a cluster has one CSIDriver per name).
async fn remove_unowned_csidriver(cluster: &Cluster<'_>) -> Result<()> {
    let drivers: Api<CSIDriver> = Api::all(cluster.admin.clone());
    let Some(driver) = drivers.get_opt(DRIVER).await? else {
        return Ok(());
    };
    let labels = driver.metadata.labels.unwrap_or_default();
    if labels
        .get("app.kubernetes.io/managed-by")
        .map(String::as_str)
        == Some("Helm")
    {
        return Ok(());
    }
    println!("      CSIDriver {DRIVER} left by another test without Helm: deleted first");
    drivers.delete(DRIVER, &Default::default()).await?;
    cluster
        .until(&format!("CSIDriver {DRIVER} gone"), || {
            let drivers = drivers.clone();
            async move { Ok(drivers.get_opt(DRIVER).await?.is_none().then_some(())) }
        })
        .await
}

/// The release's values: the lab's images, the mTLS Secrets made by
/// [`ChartInstall::install`], the lab's pool and volume group, its NVMe/TCP
/// and iSCSI ports. The CRDs are the run's (every claim test applies them), and the
/// VolumeSnapshotClass is left out (another test's may exist).
fn values(layout: &Layout) -> serde_json::Value {
    json!({
        "installCRDs": false,
        "image": {"repository": "localhost/pillar-csi", "tag": "lab"},
        "sidecars": {
            "livenessProbe": {"image": "localhost/livenessprobe:lab"},
            "nodeDriverRegistrar": {"image": "localhost/node-driver-registrar:lab"},
        },
        "snapshotClass": {"create": false},
        "mtls": {
            "certManager": {"enabled": false},
            "agentSecretName": "chartlab-agent-mtls",
            "controllerSecretName": "chartlab-controller-mtls",
        },
        "controller": {"extraArgs": ["--reconcile-interval=2s"]},
        "agent": {
            "port": layout.agent.port(),
            "backends": [
                {"zfs": {"pool": layout.pool, "parentDataset": layout.parent_dataset}},
                {"lvm": {"volumeGroup": layout.vg, "thinPool": layout.thin_pool}},
            ],
            "nvmeof": {"address": "0.0.0.0", "port": NVME_PORT},
            "iscsi": {"address": "0.0.0.0", "port": ISCSI_PORT},
        },
    })
}

/// A Secret with a certificate, its key and the CA as `ca.crt`.
fn tls_secret(name: &str, pem: &Pem, ca: &Ca) -> Result<Secret> {
    let read = |p: &Path| -> Result<String> { Ok(fs::read_to_string(p)?) };
    from(json!({
        "metadata": {"name": name},
        "stringData": {
            "tls.crt": read(&pem.cert)?,
            "tls.key": read(&pem.key)?,
            "ca.crt": read(&ca.pem.cert)?,
        },
    }))
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// `name phase (container: state, ...)`.
fn pod_state(pod: &Pod) -> String {
    let status = pod.status.clone().unwrap_or_default();
    let containers: Vec<String> = status
        .container_statuses
        .unwrap_or_default()
        .iter()
        .map(|c| {
            let state = c.state.clone().unwrap_or_default();
            let how = if let Some(w) = state.waiting {
                format!("waiting {}", w.reason.unwrap_or_default())
            } else if let Some(t) = state.terminated {
                format!("terminated {}", t.reason.unwrap_or_default())
            } else {
                format!("running, ready {}", c.ready)
            };
            format!("{}: {how} (restarts {})", c.name, c.restart_count)
        })
        .collect();
    format!(
        "{} {} ({})",
        pod.metadata.name.clone().unwrap_or_default(),
        status.phase.unwrap_or_default(),
        containers.join(", ")
    )
}
