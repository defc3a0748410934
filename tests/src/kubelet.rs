//! A real kubelet 1.20 with containerd in the lab guest (issue 41): the
//! node half of a cluster, as `tests/lab/kubelet` starts it, and the
//! registration of the bed's node plugin with it.
//!
//! The registration is played by `tests/lab/registrar.py`: the Go module
//! proxy serves no version of node-driver-registrar, so the part of it
//! kubelet talks to (its plugin registration API) is served by that small
//! program; everything after its GetInfo answer (NodeGetInfo, the CSINode,
//! the Node's annotation) is kubelet's own work.
use crate::{
    apiserver::ApiServer,
    claim_bed::ClaimBed,
    k8s::{tail, Component},
    Result,
};
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    process::Command,
};

/// Where kubelet finds the registration sockets of node plugins.
const PLUGINS_REGISTRY: &str = "/var/lib/kubelet/plugins_registry";

/// kubelet and containerd, and the registrar of the bed's node plugin;
/// stopped (registrar first, so kubelet unregisters the driver) when
/// dropped.
pub struct Kubelet {
    /// The Node's name (`--hostname-override`).
    pub node_name: String,
    /// The folder of their logs (`kubelet.log`, `containerd.log`), `k8s.kubelet` in the lab's work folder.
    pub dir: PathBuf,
    registrar: Option<Component>,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("lab/kubelet")
}

fn registrar_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("lab/registrar.py")
}

impl Kubelet {
    /// Binds the `system:node` ClusterRole to group `system:nodes` (the
    /// binding a cluster's installer makes; Kubernetes 1.8 on leaves it
    /// out), then starts containerd and kubelet as Node `node_name` with
    /// the lab's kubelet credentials. The Node registers itself; the caller
    /// waits for it to be Ready.
    pub async fn start(server: &ApiServer, admin: &kube::Client, node_name: &str) -> Result<Self> {
        let _clock = crate::setup_clock::start("kubelet");
        let binding: ClusterRoleBinding = serde_json::from_value(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "lab-kubelets"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                "name": "system:node"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                "name": "system:nodes"}],
        }))?;
        Api::<ClusterRoleBinding>::all(admin.clone())
            .patch(
                "lab-kubelets",
                &PatchParams::apply("pillar-csi-lab").force(),
                &Patch::Apply(&binding),
            )
            .await?;
        let dir = std::env::var_os("PILLAR_LAB_WORK")
            .map(PathBuf::from)
            .ok_or("PILLAR_LAB_WORK is not set: this needs the kernel lab")?
            .join("k8s.kubelet");
        let out = Command::new("bash")
            .arg(script())
            .arg("start")
            .arg(&dir)
            .arg(node_name)
            .arg(server.kubeconfig_of("kubelet"))
            .output()?;
        if !out.status.success() {
            return Err(format!(
                "tests/lab/kubelet start failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
            .into());
        }
        Ok(Self {
            node_name: node_name.to_owned(),
            dir,
            registrar: None,
        })
    }

    /// Starts the registrar of `bed`'s node plugin in kubelet's plugin
    /// registry: kubelet calls its GetInfo, then the plugin's NodeGetInfo.
    pub fn register(&mut self, bed: &ClaimBed) -> Result<()> {
        let python = std::env::var("PILLAR_LAB_PYTHON").unwrap_or_else(|_| "python3".into());
        std::fs::create_dir_all(PLUGINS_REGISTRY)?;
        let args: Vec<OsString> = vec![
            registrar_script().into(),
            format!("--csi-address={}", bed.plugin.socket.display()).into(),
            format!(
                "--kubelet-registration-path={}",
                bed.plugin.socket.display()
            )
            .into(),
            format!("--plugin-registration-path={PLUGINS_REGISTRY}").into(),
        ];
        self.registrar = Some(Component::spawn(
            "registrar",
            Path::new(&python),
            &args,
            &self.dir.join("registrar.log"),
        )?);
        Ok(())
    }

    /// The tails of kubelet's, containerd's and the registrar's logs.
    pub fn logs(&self) -> String {
        let read = |name: &str| std::fs::read_to_string(self.dir.join(name)).unwrap_or_default();
        format!(
            "==== kubelet ====\n{}\n==== containerd ====\n{}\n==== registrar ====\n{}",
            tail(&read("kubelet.log"), 40),
            tail(&read("containerd.log"), 15),
            tail(&read("registrar.log"), 10)
        )
    }

    /// The last `n` lines of each container's log of every Pod on the
    /// node (kubelet keeps them in
    /// `/var/log/pods/<namespace>_<pod>_<uid>/<container>/<restart>.log`;
    /// the last restart's).
    pub fn pod_logs(&self, n: usize) -> String {
        let mut parts = Vec::new();
        let mut pods: Vec<PathBuf> = dir_entries(Path::new("/var/log/pods"));
        pods.sort();
        for pod in pods {
            let pod_name = pod
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            for container in dir_entries(&pod) {
                let last = dir_entries(&container).into_iter().max_by_key(|f| {
                    let stem = f
                        .file_stem()
                        .unwrap_or_default()
                        .to_string_lossy()
                        .into_owned();
                    stem.parse::<u32>().unwrap_or(0)
                });
                let Some(last) = last else { continue };
                let text = std::fs::read_to_string(&last).unwrap_or_default();
                parts.push(format!(
                    "==== pod {pod_name} container {} ({}) ====\n{}",
                    container.file_name().unwrap_or_default().to_string_lossy(),
                    last.file_name().unwrap_or_default().to_string_lossy(),
                    tail(&text, n)
                ));
            }
        }
        parts.join("\n")
    }

    /// Imports the images of the `docker save` archive `archive` into
    /// containerd's `k8s.io` namespace, where kubelet finds them.
    pub fn import_images(&self, archive: &Path) -> Result<()> {
        let out = Command::new("ctr")
            .args(["-n", "k8s.io", "images", "import"])
            .arg(archive)
            .output()?;
        if !out.status.success() {
            return Err(format!(
                "ctr images import {}: {}{}",
                archive.display(),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
            .into());
        }
        Ok(())
    }

    /// kubelet's log lines that contain `what`.
    pub fn log_lines(&self, what: &str) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("kubelet.log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(what))
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        if let Some(mut registrar) = self.registrar.take() {
            registrar.send_term();
            let start = std::time::Instant::now();
            while registrar.running() && start.elapsed().as_secs() < 5 {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
        let _ = Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(&self.dir)
            .status();
    }
}

/// The entries of folder `dir` (none when it cannot be read).
fn dir_entries(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| entries.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}
