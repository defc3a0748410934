//! `pillar-csi` CSI subcommands as child processes of a test, and CSI
//! clients over their unix sockets: the test plays kubelet or a sidecar.
//!
//! [`CsiProcess`] is the one "start a subcommand on a socket and dial it"
//! loop; [`NodePlugin`] is `pillar-csi node` on it, as the lab tests use it.
use crate::{
    agent::{binary, crash_points_binary},
    Lab, Result,
};
use pillar_csi_proto::csi::v1::{
    identity_client::IdentityClient, node_client::NodeClient, ProbeRequest,
};
use std::{
    ffi::OsString,
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};
use tonic::transport::{Channel, Endpoint};

pub use pillar_csi_proto::csi::v1 as csi_pb;

/// How long a starting subcommand may take to answer Probe with ready.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Dials the CSI socket at `socket`.
pub async fn dial(socket: &Path) -> Result<Channel> {
    Ok(
        Endpoint::from_shared(format!("unix://{}", socket.display()))?
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(300))
            .connect()
            .await?,
    )
}

/// A running `pillar-csi <subcommand>` serving CSI on a unix socket; killed
/// (SIGKILL) and reaped when dropped.
#[derive(Debug)]
pub struct CsiProcess {
    /// The socket path.
    pub socket: PathBuf,
    /// Standard output and error of the process (appended).
    pub log: PathBuf,
    child: Option<Child>,
}

impl CsiProcess {
    /// Starts `pillar-csi <args> --endpoint unix://<socket>` with extra
    /// environment `env`, its output appended to `log`, and waits until its
    /// Identity service answers Probe with ready. A process that exits
    /// first, or is not ready within a minute, is an error carrying its log.
    pub async fn start(
        args: &[OsString],
        socket: &Path,
        log: &Path,
        env: &[(&str, &str)],
    ) -> Result<Self> {
        let out = fs::OpenOptions::new().create(true).append(true).open(log)?;
        // The node's test faults exist only in the crash-points build.
        let program = if env.iter().any(|(k, _)| *k == "PILLAR_CSI_NODE_FAULT") {
            crash_points_binary()?
        } else {
            binary()?
        };
        let child = Command::new(program)
            .args(args)
            .arg("--endpoint")
            .arg(format!("unix://{}", socket.display()))
            .envs(env.iter().copied())
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .map_err(|e| format!("starting pillar-csi {args:?}: {e}"))?;
        let mut process = Self {
            socket: socket.to_owned(),
            log: log.to_owned(),
            child: Some(child),
        };
        process.wait_ready(args).await?;
        Ok(process)
    }

    async fn wait_ready(&mut self, args: &[OsString]) -> Result<()> {
        let start = Instant::now();
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                return Err(format!(
                    "pillar-csi {args:?} exited with {status}; log:\n{}",
                    self.log()
                )
                .into());
            }
            let ready = async {
                let mut c = IdentityClient::new(dial(&self.socket).await?);
                Result::<_>::Ok(c.probe(ProbeRequest {}).await?.into_inner().ready)
            };
            if let Ok(Ok(Some(true))) = tokio::time::timeout(Duration::from_secs(5), ready).await {
                return Ok(());
            }
            if start.elapsed() > START_TIMEOUT {
                return Err(format!(
                    "pillar-csi {args:?} was not ready within {START_TIMEOUT:?}; log:\n{}",
                    self.log()
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// A channel to the socket.
    pub async fn channel(&self) -> Result<Channel> {
        dial(&self.socket).await
    }

    /// How the process exited, once it has (`None` while it runs or
    /// after [`CsiProcess::kill`]).
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Kills the process with SIGKILL and reaps it.
    pub fn kill(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    /// The log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for CsiProcess {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

/// A running node plugin (`pillar-csi node --node-name lab-node --iscsi`);
/// killed (SIGKILL) when dropped.
#[derive(Debug)]
pub struct NodePlugin {
    /// The socket path.
    pub socket: PathBuf,
    /// The staging-record folder.
    pub state_dir: PathBuf,
    log: PathBuf,
    process: Option<CsiProcess>,
    /// Flags added to every start after this is set (e.g.
    /// `--nvme-ctrl-loss-tmo 15`).
    pub extra_args: Vec<OsString>,
    /// `--node-name` (`lab-node` unless started with
    /// [`NodePlugin::start_as`]).
    pub node_name: String,
}

impl NodePlugin {
    /// Starts `pillar-csi node` named `name` (socket, state folder and log
    /// in the lab's work folder), with iSCSI on, and waits until Probe says
    /// ready.
    pub async fn start(lab: &Lab, name: &str) -> Result<Self> {
        Self::start_in(lab, name, lab.work.join(format!("{name}.node-state"))).await
    }

    /// As [`NodePlugin::start`], keeping staging records in `state_dir`.
    pub async fn start_in(lab: &Lab, name: &str, state_dir: PathBuf) -> Result<Self> {
        Self::start_with(lab, name, state_dir, "lab-node").await
    }

    /// As [`NodePlugin::start`], with `extra_args` on every start.
    pub async fn start_with_args(lab: &Lab, name: &str, extra_args: Vec<OsString>) -> Result<Self> {
        let mut plugin = Self::unstarted(
            lab,
            name,
            lab.work.join(format!("{name}.node-state")),
            "lab-node",
        );
        plugin.extra_args = extra_args;
        plugin.spawn(&[]).await?;
        Ok(plugin)
    }

    /// As [`NodePlugin::start`], for the node `node_name`.
    pub async fn start_as(lab: &Lab, name: &str, node_name: &str) -> Result<Self> {
        let state_dir = lab.work.join(format!("{name}.node-state"));
        Self::start_with(lab, name, state_dir, node_name).await
    }

    async fn start_with(
        lab: &Lab,
        name: &str,
        state_dir: PathBuf,
        node_name: &str,
    ) -> Result<Self> {
        let mut plugin = Self::unstarted(lab, name, state_dir, node_name);
        plugin.spawn(&[]).await?;
        Ok(plugin)
    }

    fn unstarted(lab: &Lab, name: &str, state_dir: PathBuf, node_name: &str) -> Self {
        Self {
            socket: lab.work.join(format!("{name}.csi.sock")),
            state_dir,
            log: lab.work.join(format!("{name}.node.log")),
            process: None,
            extra_args: Vec::new(),
            node_name: node_name.to_owned(),
        }
    }

    /// Starts the process with extra environment `env`, waiting for ready.
    pub async fn spawn(&mut self, env: &[(&str, &str)]) -> Result<()> {
        let mut args: Vec<OsString> = vec![
            "node".into(),
            "--node-name".into(),
            self.node_name.clone().into(),
            "--iscsi".into(),
            "--state-dir".into(),
            self.state_dir.clone().into(),
        ];
        args.extend(self.extra_args.iter().cloned());
        self.process = Some(CsiProcess::start(&args, &self.socket, &self.log, env).await?);
        Ok(())
    }

    /// A Node service client.
    pub async fn node(&self) -> Result<NodeClient<Channel>> {
        Ok(NodeClient::new(dial(&self.socket).await?))
    }

    /// An Identity service client.
    pub async fn identity(&self) -> Result<IdentityClient<Channel>> {
        Ok(IdentityClient::new(dial(&self.socket).await?))
    }

    /// Kills the plugin with SIGKILL and reaps it.
    pub fn kill(&mut self) -> Result<()> {
        match self.process.take() {
            Some(mut p) => p.kill(),
            None => Ok(()),
        }
    }

    /// The log so far (every start of this plugin appends to it).
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}
