//! The CSI node plugin (`pillar-csi node`) as a child process of a lab test,
//! and a CSI client over its unix socket: the test plays kubelet.
use crate::{agent::binary, Lab, Result};
use pillar_csi_proto::csi::v1::{
    identity_client::IdentityClient, node_client::NodeClient, ProbeRequest,
};
use std::{
    fs,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};
use tonic::transport::{Channel, Endpoint};

pub use pillar_csi_proto::csi::v1 as csi_pb;

/// How long a starting plugin may take to answer Probe with ready.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A running node plugin; killed (SIGKILL) when dropped.
#[derive(Debug)]
pub struct NodePlugin {
    /// The socket path.
    pub socket: PathBuf,
    /// The staging-record folder.
    pub state_dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
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
        let mut plugin = Self {
            socket: lab.work.join(format!("{name}.csi.sock")),
            state_dir,
            log: lab.work.join(format!("{name}.node.log")),
            child: None,
        };
        plugin.spawn(&[]).await?;
        Ok(plugin)
    }

    /// Starts the process with extra environment `env`, waiting for ready.
    pub async fn spawn(&mut self, env: &[(&str, &str)]) -> Result<()> {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let child = Command::new(binary()?)
            .arg("node")
            .arg("--endpoint")
            .arg(format!("unix://{}", self.socket.display()))
            .args(["--node-name", "lab-node", "--iscsi"])
            .arg("--state-dir")
            .arg(&self.state_dir)
            .envs(env.iter().copied())
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting the node plugin: {e}"))?;
        self.child = Some(child);
        let start = Instant::now();
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                return Err(
                    format!("the node plugin exited with {status}; log:\n{}", self.log()).into(),
                );
            }
            let ready = async {
                let mut c = IdentityClient::new(self.channel().await?);
                Result::<_>::Ok(c.probe(ProbeRequest {}).await?.into_inner().ready)
            };
            if let Ok(Ok(Some(true))) = tokio::time::timeout(Duration::from_secs(5), ready).await {
                return Ok(());
            }
            if start.elapsed() > START_TIMEOUT {
                return Err(format!(
                    "the node plugin was not ready within {START_TIMEOUT:?}; log:\n{}",
                    self.log()
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn channel(&self) -> Result<Channel> {
        Ok(
            Endpoint::from_shared(format!("unix://{}", self.socket.display()))?
                .connect_timeout(Duration::from_secs(5))
                .timeout(Duration::from_secs(300))
                .connect()
                .await?,
        )
    }

    /// A Node service client.
    pub async fn node(&self) -> Result<NodeClient<Channel>> {
        Ok(NodeClient::new(self.channel().await?))
    }

    /// An Identity service client.
    pub async fn identity(&self) -> Result<IdentityClient<Channel>> {
        Ok(IdentityClient::new(self.channel().await?))
    }

    /// Kills the plugin with SIGKILL and reaps it.
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

impl Drop for NodePlugin {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}
