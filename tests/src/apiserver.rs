//! A real Kubernetes API server (etcd + kube-apiserver 1.20 from `make
//! deps`) for one test: started on free loopback ports in a temporary
//! folder by `scripts/apiserver.sh`, stopped when dropped.
//!
//! It runs on the host, not in the kernel lab: nothing here needs a kernel
//! feature, and the server under TCG would be 10-30x slower. Lab tests
//! that need one use the server the lab runner started on the host for the
//! whole run ([`ApiServer::lab`]), reached from the guest at 10.0.2.2.
use crate::Result;
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
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

/// A running API server; dropping one this process started stops etcd and
/// the server.
pub struct ApiServer {
    dir: PathBuf,
    /// The temporary folder of a server this process started (and stops).
    owned: Option<tempfile::TempDir>,
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
        Ok(ApiServer {
            dir: dir.path().to_owned(),
            owned: Some(dir),
        })
    }

    /// The server the lab runner started on the host for this run: its
    /// kubeconfigs (for the guest's address of the host) are in the folder
    /// named by `PILLAR_LAB_KUBE`. It is not stopped when dropped.
    pub fn lab() -> Result<Self> {
        let dir = std::env::var_os("PILLAR_LAB_KUBE").ok_or(
            "PILLAR_LAB_KUBE is not set: the lab runner starts the API server for the demo, \
             a run without a filter and a filter selecting claim_ tests (or LAB_APISERVER=1)",
        )?;
        Ok(ApiServer {
            dir: dir.into(),
            owned: None,
        })
    }

    /// The folder holding the server's kubeconfigs (and, for a server this
    /// process started, its data and logs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The admin kubeconfig (group `system:masters`).
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    /// The kubeconfig of ServiceAccount `pillar-csi:<account>`.
    pub fn kubeconfig_of(&self, account: &str) -> PathBuf {
        self.dir.join(format!("kubeconfig-{account}"))
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

    /// A client of ServiceAccount `pillar-csi:pillar-csi-controller` bound
    /// to exactly the chart's controller rules
    /// (`charts/pillar-csi/files/rbac/controller-rules.yaml`, as the chart's
    /// ClusterRole includes them), so a test using it fails when the
    /// controller needs a rule the chart does not grant.
    pub async fn controller_client(&self) -> Result<kube::Client> {
        // The chart's rules for the controller pod's ServiceAccount: the
        // controller's and its CSI sidecars' (templates/rbac-controller.yaml),
        // and leases in the release namespace.
        let rules_of = |file: &str| -> Result<Vec<PolicyRule>> {
            let path = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join(format!("../charts/pillar-csi/files/rbac/{file}.yaml"));
            Ok(serde_yaml::from_str(&std::fs::read_to_string(&path)?)?)
        };
        let mut rules = Vec::new();
        for file in [
            "controller-rules",
            "external-provisioner-rules",
            "external-attacher-rules",
            "external-resizer-rules",
            "external-snapshotter-rules",
            // As the chart with controller.readImportKeySecrets=true: the
            // claim tests import an encrypted zvol with its key Secret.
            "import-key-secrets-rules",
        ] {
            rules.extend(rules_of(file)?);
        }
        let admin = self.client().await?;
        let name = "pillar-csi-controller";
        let role = ClusterRole {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            rules: Some(rules),
            ..Default::default()
        };
        let binding = ClusterRoleBinding {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "ClusterRole".into(),
                name: name.into(),
            },
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".into(),
                name: name.into(),
                namespace: Some("pillar-csi".into()),
                ..Default::default()
            }]),
        };
        // Server-side apply: a server shared by several tests of a lab run
        // keeps one role and one binding.
        let pp = PatchParams::apply("pillar-csi-test").force();
        Api::<ClusterRole>::all(admin.clone())
            .patch(name, &pp, &Patch::Apply(&role))
            .await?;
        Api::<ClusterRoleBinding>::all(admin.clone())
            .patch(name, &pp, &Patch::Apply(&binding))
            .await?;
        let leases = Role {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("pillar-csi".into()),
                ..Default::default()
            },
            rules: Some(rules_of("leader-election-rules")?),
        };
        let lease_binding = RoleBinding {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("pillar-csi".into()),
                ..Default::default()
            },
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "Role".into(),
                name: name.into(),
            },
            subjects: binding.subjects.clone(),
        };
        Api::<Role>::namespaced(admin.clone(), "pillar-csi")
            .patch(name, &pp, &Patch::Apply(&leases))
            .await?;
        Api::<RoleBinding>::namespaced(admin, "pillar-csi")
            .patch(name, &pp, &Patch::Apply(&lease_binding))
            .await?;
        let client = Self::client_from(&self.kubeconfig_of(name)).await?;
        // The RBAC authorizer learns new bindings through a watch: wait
        // (bounded) until the account may list what its rules grant.
        let states: Api<DynamicObject> = Api::all_with(
            client.clone(),
            &ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("pillar-csi.bhyoo.com", "v1alpha1", "PillarVolumeState"),
                "pillarvolumestates",
            ),
        );
        for _ in 0..100 {
            if states.list(&ListParams::default().limit(1)).await.is_ok() {
                return Ok(client);
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        Err(format!("{name}: the chart's rules did not take effect within 10 s").into())
    }

    /// The last lines of the server's log, for a failing test's message.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("apiserver.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        if self.owned.is_none() {
            return;
        }
        let stopped = Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(&self.dir)
            .status();
        if !matches!(stopped, Ok(s) if s.success()) {
            eprintln!(
                "scripts/apiserver.sh stop {} failed: {stopped:?}",
                self.dir.display()
            );
        }
    }
}
