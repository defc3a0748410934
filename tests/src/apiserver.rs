//! A real Kubernetes API server (etcd + kube-apiserver 1.20 from `make
//! deps`) for one test: started on free loopback ports in a temporary
//! folder by `scripts/apiserver.sh`, stopped when dropped.
//!
//! It runs on the host, not in the kernel lab: nothing here needs a kernel
//! feature, and the server under TCG would be 10-30x slower.
use crate::Result;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The ServiceAccounts of namespace `pillar-csi` the launcher issues
/// kubeconfigs for.
pub const ACCOUNTS: [&str; 3] = [
    "pillar-csi-controller",
    "pillar-csi-node",
    "pillar-csi-agent",
];

/// A running API server; dropping it stops etcd and the server.
pub struct ApiServer {
    dir: tempfile::TempDir,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/apiserver.sh")
}

/// rustls needs one process-wide crypto provider; kube's client uses it.
pub fn install_crypto_provider() {
    // An error means another test of this process installed it first.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

impl ApiServer {
    /// Starts a server and waits until `/readyz` answers (a few seconds).
    pub fn start() -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("pillar-apiserver.")
            .tempdir()?;
        let out = Command::new("bash")
            .arg(script())
            .arg("start")
            .arg(dir.path())
            .output()?;
        if !out.status.success() {
            return Err(format!(
                "scripts/apiserver.sh start failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )
            .into());
        }
        Ok(ApiServer { dir })
    }

    /// The folder holding the server's data, logs and kubeconfigs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The admin kubeconfig (group `system:masters`).
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    /// The kubeconfig of ServiceAccount `pillar-csi:<account>`.
    pub fn kubeconfig_of(&self, account: &str) -> PathBuf {
        self.dir.path().join(format!("kubeconfig-{account}"))
    }

    /// A client from a kubeconfig file.
    pub async fn client_from(path: &Path) -> Result<kube::Client> {
        install_crypto_provider();
        let kubeconfig = Kubeconfig::read_from(path)?;
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        Ok(kube::Client::try_from(config)?)
    }

    /// An admin client.
    pub async fn client(&self) -> Result<kube::Client> {
        Self::client_from(&self.kubeconfig()).await
    }

    /// Runs kubectl as the admin and returns its standard output.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        let out = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .args(args)
            .output()?;
        if !out.status.success() {
            return Err(format!(
                "kubectl {} failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )
            .into());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Applies the chart's CRD files (`charts/pillar-csi/files/crds`) and
    /// waits until each is Established; returns their names.
    pub async fn install_chart_crds(&self) -> Result<Vec<String>> {
        let client = self.client().await?;
        let api: Api<CustomResourceDefinition> = Api::all(client);
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/pillar-csi/files/crds");
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            let crd: CustomResourceDefinition =
                serde_yaml::from_str(&std::fs::read_to_string(&path)?)?;
            let name = crd
                .metadata
                .name
                .clone()
                .ok_or_else(|| format!("{}: a CRD without a name", path.display()))?;
            api.patch(
                &name,
                &PatchParams::apply("pillar-csi-test"),
                &Patch::Apply(&crd),
            )
            .await?;
            names.push(name);
        }
        for name in &names {
            let mut established = false;
            for _ in 0..100 {
                let conds = api
                    .get(name)
                    .await?
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default();
                if conds
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
                {
                    established = true;
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            if !established {
                return Err(format!("CRD {name} not Established after 10 s").into());
            }
        }
        names.sort();
        Ok(names)
    }

    /// The last lines of the server's log, for a failing test's message.
    pub fn log_tail(&self) -> String {
        let log =
            std::fs::read_to_string(self.dir.path().join("apiserver.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let stopped = Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(self.dir.path())
            .status();
        if !matches!(stopped, Ok(s) if s.success()) {
            eprintln!(
                "scripts/apiserver.sh stop {} failed: {stopped:?}",
                self.dir.path().display()
            );
        }
    }
}
