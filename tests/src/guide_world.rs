//! The guide world: the cluster the operator's guides describe, in the
//! kernel lab, for the test that runs the guides' commands
//! (`tests/tests/claim_guides_lab.rs`). It has what the guides name: the
//! pool `tank` and the volume group `vg0` on the storage node `storage-1`
//! (file-backed, in the guest), the worker `worker-1`, the storage node's
//! address 192.0.2.10 (on the guest's loopback), and kube-controller-manager
//! on the lab's API server. What a cluster runs in pods, the world runs from
//! the host's build as the chart configures it, once the guide reaches its
//! `helm install`: the agent as `--name storage-1` with the values file and
//! the Secrets the guide made, the controller with the CSI sidecars, the node
//! plugin as `worker-1` with its CSINode (node-driver-registrar's part), and
//! the chart's objects the guides touch (the Deployment
//! `pillar-csi-controller`, the CSIDriver). While a command runs, the
//! controller and its sidecars follow the Deployment's replica count every
//! second, as its pod would. A guide's commands run in bash in one folder (with `charts/` of
//! the checkout beside them), with HOME, KUBECONFIG and PATH as an
//! operator's shell has them.
//!
//! The set-up an operator does outside the guides (the old driver's volume,
//! an LV holding data, a client certificate from the security owner) is in
//! the scripts of `tests/lab/guide-world/`.
use crate::{
    agent::binary,
    apiserver::ApiServer,
    csi::{CsiProcess, NodePlugin},
    k8s::{sidecar_binary, tail, Component, ControllerManager, Sidecars},
    Lab, Result,
};
use k8s_openapi::api::{apps::v1::Deployment, core::v1::Secret};
use kube::api::Api;
use pillar_csi_proto::csi::v1::NodeGetInfoRequest;
use std::{
    ffi::OsString,
    fs,
    path::{Path, PathBuf},
    process::Output,
    time::{Duration, Instant},
};

/// The storage node's address in the guides (on the guest's loopback).
pub const STORAGE_ADDRESS: &str = "192.0.2.10";
/// The agent's gRPC port (the chart's).
const AGENT_PORT: u16 = 9500;
/// How long one guide command may run (its own waits are at most 5 min).
const COMMAND_LIMIT: Duration = Duration::from_secs(420);

/// The repository's root (the checkout the guides run from).
fn checkout() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is in the checkout")
        .to_owned()
}

/// What the chart runs, once installed.
struct Installed {
    agent: Component,
    agent_args: Vec<OsString>,
    controller: Option<(CsiProcess, Sidecars)>,
    plugin: NodePlugin,
}

/// The world; its processes are killed when it is dropped, and
/// [`GuideWorld::clean_up`] removes its pool, volume group and objects.
pub struct GuideWorld {
    /// The lab.
    pub lab: Lab,
    /// The host's API server.
    pub server: ApiServer,
    /// An admin client.
    pub admin: kube::Client,
    /// Where the guides' commands run and their files are.
    pub dir: PathBuf,
    home: PathBuf,
    path: OsString,
    _kcm: ControllerManager,
    installed: Option<Installed>,
    /// What the world did on its own (restarts, slow starts), for a
    /// failing command's message.
    notes: Vec<String>,
}

impl GuideWorld {
    /// Prepares the nodes, pool, volume group, address and
    /// kube-controller-manager (`tests/lab/guide-world/prepare.sh`).
    pub async fn prepare() -> Result<Self> {
        let _clock = crate::setup_clock::start("GuideWorld::prepare");
        let lab = Lab::get();
        let server = ApiServer::lab()?;
        server.install_chart_crds().await?;
        server.controller_client().await?;
        let admin = server.client().await?;
        let dir = lab.work.join("guides");
        let home = dir.join("home");
        fs::create_dir_all(&home)?;
        std::os::unix::fs::symlink(checkout().join("charts"), dir.join("charts"))?;
        let tools = [binary()?, sidecar_binary("grpcurl")?];
        let mut dirs: Vec<PathBuf> = tools
            .iter()
            .filter_map(|t| t.parent().map(Path::to_owned))
            .collect();
        dirs.extend(std::env::split_paths(
            &std::env::var_os("PATH").unwrap_or_default(),
        ));
        let path = std::env::join_paths(dirs)?;
        // The operator's kubeconfig: the lab's admin, in namespace `default`
        // (the lab's own kubeconfig works in `pillar-csi`).
        let kubeconfig = home.join(".kube/config");
        fs::create_dir_all(home.join(".kube"))?;
        fs::copy(server.kubeconfig(), &kubeconfig)?;
        crate::run(
            "kubectl",
            &[
                "--kubeconfig",
                &kubeconfig.to_string_lossy(),
                "config",
                "set-context",
                "--current",
                "--namespace=default",
            ],
        )?;
        let kcm = ControllerManager::start(&server, &lab.work).await?;
        let world = Self {
            lab,
            server,
            admin,
            dir,
            home,
            path,
            _kcm: kcm,
            installed: None,
            notes: Vec::new(),
        };
        world.setup("prepare.sh", &[]).await?;
        Ok(world)
    }

    /// `script` as the operator's shell runs it (bash, `set -e`, in
    /// [`GuideWorld::dir`]), killed after a few minutes.
    fn command(&self, script: &str) -> tokio::process::Command {
        let mut command = tokio::process::Command::new("timeout");
        command
            .args([
                COMMAND_LIMIT.as_secs().to_string().as_str(),
                "bash",
                "-e",
                "-o",
                "pipefail",
                "-c",
                script,
            ])
            .current_dir(&self.dir)
            .env("HOME", &self.home)
            .env("PATH", &self.path)
            .env("KUBECONFIG", self.home.join(".kube/config"))
            .env("LVM_SUPPRESS_FD_WARNINGS", "1")
            .env("NO_COLOR", "1")
            .kill_on_drop(true);
        command
    }

    /// Runs a guide's `script` while the world goes on as a cluster does:
    /// the controller pod follows its Deployment every second.
    pub async fn run(&mut self, script: &str) -> Result<Output> {
        let output = self.command(script).output();
        tokio::pin!(output);
        loop {
            tokio::select! {
                out = &mut output => return Ok(out?),
                () = tokio::time::sleep(Duration::from_secs(1)) => {
                    self.follow_controller_deployment().await?;
                }
            }
        }
    }

    /// Runs set-up script `name` of `tests/lab/guide-world/` with `args`;
    /// a failure carries its output.
    pub async fn setup(&self, name: &str, args: &[&str]) -> Result<String> {
        let script = checkout().join("tests/lab/guide-world").join(name);
        let mut line = format!("bash {}", shell_quote(&script.to_string_lossy()));
        for a in args {
            line.push(' ');
            line.push_str(&shell_quote(a));
        }
        let out = self.command(&line).output().await?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if !out.status.success() {
            return Err(format!("set-up {name} failed ({}):\n{text}", out.status).into());
        }
        Ok(text)
    }

    /// What `helm install` would have started, from the values file and the
    /// Secrets the install guide made (`chart-objects.sh` applies the
    /// chart's objects the guides touch).
    pub async fn install(&mut self) -> Result<()> {
        self.setup("chart-objects.sh", &[]).await?;
        let tls = self.dir.join("pod-tls");
        let agent_tls = self
            .secret_files("pillar-agent-mtls", &tls.join("agent"))
            .await?;
        let controller_tls = self
            .secret_files("pillar-controller-mtls", &tls.join("controller"))
            .await?;
        let values: serde_yaml::Value =
            serde_yaml::from_str(&fs::read_to_string(self.dir.join("pillar-values.yaml"))?)?;
        let mut agent_args: Vec<OsString> = vec!["agent".into(), "--name=storage-1".into()];
        agent_args.extend(agent_flags(&values)?.into_iter().map(OsString::from));
        for (flag, file) in [
            ("--tls-cert", "tls.crt"),
            ("--tls-key", "tls.key"),
            ("--tls-client-ca", "ca.crt"),
        ] {
            agent_args.push(flag.into());
            agent_args.push(agent_tls.join(file).into());
        }
        let agent = self.start_agent(&agent_args).await?;
        let controller = self.start_controller(&controller_tls).await?;
        let plugin = NodePlugin::start_as(&self.lab, "guides", "worker-1").await?;
        let node_id = plugin
            .node()
            .await?
            .node_get_info(NodeGetInfoRequest {})
            .await?
            .into_inner()
            .node_id;
        self.setup("csinode.sh", &[&node_id]).await?;
        self.installed = Some(Installed {
            agent,
            agent_args,
            controller: Some(controller),
            plugin,
        });
        Ok(())
    }

    /// Writes Secret `name` of namespace `pillar-csi` into `dir` as the
    /// kubelet mounts a Secret volume, one file per key.
    async fn secret_files(&self, name: &str, dir: &Path) -> Result<PathBuf> {
        fs::create_dir_all(dir)?;
        let secrets: Api<Secret> = Api::namespaced(self.admin.clone(), "pillar-csi");
        let secret = secrets.get(name).await?;
        for (key, value) in secret.data.unwrap_or_default() {
            fs::write(dir.join(key), value.0)?;
        }
        Ok(dir.to_owned())
    }

    async fn start_agent(&self, args: &[OsString]) -> Result<Component> {
        let log = self.lab.work.join("guides.agent.log");
        let mut agent = Component::spawn("pillar-csi agent", &binary()?, args, &log)?;
        let start = Instant::now();
        let address = format!("{STORAGE_ADDRESS}:{AGENT_PORT}");
        while std::net::TcpStream::connect(&address).is_err() {
            agent.check_running()?;
            if start.elapsed() > Duration::from_secs(120) {
                return Err(format!(
                    "the agent did not listen on {address} within 120 s:\n{}",
                    tail(&agent.log(), 30)
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        Ok(agent)
    }

    async fn start_controller(&mut self, tls: &Path) -> Result<(CsiProcess, Sidecars)> {
        let start = Instant::now();
        let controller = self.controller_process(tls).await?;
        let ready = start.elapsed();
        let sidecars = Sidecars::start_on(&self.server, &controller.socket, &self.lab.work).await?;
        self.note(&format!(
            "the controller pod started: the controller ready after {:.1} s, its sidecars started after {:.1} s",
            ready.as_secs_f64(),
            start.elapsed().as_secs_f64()
        ));
        Ok((controller, sidecars))
    }

    /// The controller container's process, ready.
    async fn controller_process(&self, tls: &Path) -> Result<CsiProcess> {
        let args: Vec<OsString> = vec![
            "controller".into(),
            "--kubeconfig".into(),
            self.server.kubeconfig_of("pillar-csi-controller").into(),
            "--agent-tls-cert".into(),
            tls.join("tls.crt").into(),
            "--agent-tls-key".into(),
            tls.join("tls.key").into(),
            "--agent-tls-ca".into(),
            tls.join("ca.crt").into(),
            "--agent-tls-server-name=pillar-csi-agent.pillar-csi.svc".into(),
            "--reconcile-interval".into(),
            "2s".into(),
        ];
        CsiProcess::start(
            &args,
            &self.lab.work.join("guides.controller.sock"),
            &self.lab.work.join("guides.controller.log"),
            &[("RUST_LOG", "info")],
        )
        .await
    }

    /// The controller pod's processes, while it runs.
    fn controller_pod(&mut self) -> Option<&mut (CsiProcess, Sidecars)> {
        self.installed.as_mut().and_then(|i| i.controller.as_mut())
    }

    /// Keeps `what` the world did on its own, with the time, and prints it
    /// (in the test's output).
    fn note(&mut self, what: &str) {
        let line = format!("guide world, {}: {what}", clock());
        eprintln!("{line}");
        self.notes.push(line);
    }

    /// Starts or stops the controller pod's processes to follow the
    /// replica count of the Deployment `pillar-csi-controller`, as its
    /// ReplicaSet and kubelet would; a process of the pod that exited (a
    /// sidecar exits when it loses its connection to the controller's
    /// socket) is started again alone, as kubelet restarts a container.
    pub async fn follow_controller_deployment(&mut self) -> Result<()> {
        let mut restarted = Vec::new();
        let pod = self.controller_pod();
        if let Some(status) = pod.and_then(|(controller, _)| controller.exit_status()) {
            let log = self.lab.work.join("guides.controller.log");
            restarted.push(format!(
                "the controller exited ({status}); its last lines:\n{}",
                tail(&fs::read_to_string(log).unwrap_or_default(), 6)
            ));
            let fresh = self
                .controller_process(&self.dir.join("pod-tls/controller"))
                .await?;
            if let Some((controller, _)) = self.controller_pod() {
                *controller = fresh;
            }
        }
        if let Some((_, sidecars)) = self.controller_pod() {
            restarted.extend(sidecars.restart_exited()?);
        }
        for why in restarted {
            self.note(&format!("restarted as kubelet would: {why}"));
        }
        let Some(installed) = self.installed.as_ref() else {
            return Ok(());
        };
        let deployments: Api<Deployment> = Api::namespaced(self.admin.clone(), "pillar-csi");
        let replicas = deployments
            .get("pillar-csi-controller")
            .await?
            .spec
            .and_then(|s| s.replicas)
            .unwrap_or(1);
        match (replicas > 0, installed.controller.is_some()) {
            (false, true) => self.stop_controller().await,
            (true, false) => {
                let tls = self.dir.join("pod-tls/controller");
                let controller = self.start_controller(&tls).await?;
                if let Some(installed) = self.installed.as_mut() {
                    installed.controller = Some(controller);
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Stops the controller pod's processes (for set-up done while no
    /// controller watches); [`GuideWorld::follow_controller_deployment`]
    /// starts them again.
    pub async fn stop_controller(&mut self) {
        if let Some((controller, sidecars)) =
            self.installed.as_mut().and_then(|i| i.controller.take())
        {
            sidecars.terminate().await;
            drop(controller);
        }
    }

    /// Restarts the agent with `flag` added (a `helm upgrade` that adds an
    /// `agent.extraArgs` entry rolls the DaemonSet's pod).
    pub async fn restart_agent_with(&mut self, flag: &str) -> Result<()> {
        let installed = self
            .installed
            .as_mut()
            .ok_or("the agent restarts only once installed")?;
        installed.agent.stop();
        installed.agent_args.push(flag.into());
        let args = installed.agent_args.clone();
        let agent = self.start_agent(&args).await?;
        if let Some(installed) = self.installed.as_mut() {
            installed.agent = agent;
        }
        Ok(())
    }

    /// The logs of the world's processes, for a failing command's message.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for note in &self.notes[self.notes.len().saturating_sub(6)..] {
            out += &format!("{note}\n");
        }
        if let Some(i) = &self.installed {
            out += &format!("==== agent ====\n{}\n", tail(&i.agent.log(), 25));
            if let Some((c, s)) = &i.controller {
                out += &format!("==== controller ====\n{}\n", tail(&c.log(), 25));
                for component in &s.components {
                    out += &format!(
                        "==== {} ====\n{}\n",
                        component.name,
                        short(&component.log(), 8)
                    );
                }
            }
            out += &format!("==== node ====\n{}\n", tail(&i.plugin.log(), 15));
        }
        out
    }

    /// Stops everything and removes the world's pool, volume group,
    /// address and cluster objects (`clean-up.sh`).
    pub async fn clean_up(mut self) -> Result<()> {
        self.installed = None;
        self.setup("clean-up.sh", &[]).await.map(|_| ())
    }
}

/// The agent's flags for the chart's `agent` values (`backends`, `nvmeof`,
/// `iscsi`), as the chart's ConfigMap configures it.
fn agent_flags(values: &serde_yaml::Value) -> Result<Vec<String>> {
    let agent = &values["agent"];
    let mut flags = Vec::new();
    for backend in agent["backends"].as_sequence().into_iter().flatten() {
        if let Some(zfs) = backend.get("zfs") {
            let pool = zfs["pool"].as_str().ok_or("a zfs backend without pool")?;
            flags.push(match zfs["parentDataset"].as_str() {
                Some(parent) => format!("--backend=zfs={pool}/{parent}"),
                None => format!("--backend=zfs={pool}"),
            });
        } else if let Some(lvm) = backend.get("lvm") {
            let vg = lvm["volumeGroup"]
                .as_str()
                .ok_or("an lvm backend without volumeGroup")?;
            flags.push(match lvm["thinPool"].as_str() {
                Some(thin) => format!("--backend=lvm={vg}/{thin}"),
                None => format!("--backend=lvm={vg}"),
            });
        } else {
            return Err(format!("a backend of neither kind: {backend:?}").into());
        }
    }
    for protocol in ["nvmeof", "iscsi"] {
        if let Some(address) = agent[protocol]["address"].as_str() {
            flags.push(format!("--{protocol}-address={address}"));
        }
        if let Some(port) = agent[protocol]["port"].as_u64() {
            flags.push(format!("--{protocol}-port={port}"));
        }
    }
    Ok(flags)
}

/// The last `n` lines of `text`, each cut at 300 characters (the sidecars
/// log whole objects).
fn short(text: &str, n: usize) -> String {
    let lines: Vec<String> = text
        .lines()
        .map(|l| l.chars().take(300).collect())
        .collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The time of day in UTC (`HH:MM:SS`), as the components' logs show it.
fn clock() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!(
        "{:02}:{:02}:{:02} UTC",
        secs / 3600 % 24,
        secs / 60 % 60,
        secs % 60
    )
}

/// `text` quoted for bash.
fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_values_of_the_install_guide_become_the_agents_flags() {
        let values: serde_yaml::Value = serde_yaml::from_str(
            "agent:\n  backends:\n    - zfs: {pool: tank, parentDataset: k8s}\n    - lvm: {volumeGroup: vg0, thinPool: thin0}\n    - lvm: {volumeGroup: vg1}\n  nvmeof: {address: 192.0.2.10, port: 4420}\n  iscsi: {address: 192.0.2.10}\n",
        )
        .expect("valid");
        assert_eq!(
            agent_flags(&values).expect("valid"),
            [
                "--backend=zfs=tank/k8s",
                "--backend=lvm=vg0/thin0",
                "--backend=lvm=vg1",
                "--nvmeof-address=192.0.2.10",
                "--nvmeof-port=4420",
                "--iscsi-address=192.0.2.10",
            ]
        );
        let bad: serde_yaml::Value =
            serde_yaml::from_str("agent: {backends: [{nfs: {}}]}").expect("valid");
        assert!(agent_flags(&bad).is_err());
    }
}
