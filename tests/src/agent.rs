//! The agent binary (`pillar-csi agent`) as a child process of a lab test,
//! and gRPC clients for it.
//!
//! The binary is found beside the test executable's folder
//! (`target/debug/deps/<test>` -> `target/debug/pillar-csi`); the lab runner
//! builds it with the test binaries. Its standard output and error go to a
//! log file in the lab's work folder (appended across restarts).
use crate::{run, tls::Pem, Lab, Result};
use pillar_csi_proto::agent::v1::{agent_service_client::AgentServiceClient, HealthCheckRequest};
use std::{
    fs,
    net::{SocketAddr, TcpListener},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

pub use pillar_csi_proto::agent::v1 as pb;

/// A connected gRPC client of the agent.
pub type Client = AgentServiceClient<Channel>;

/// How long a starting agent may take to answer HealthCheck by default
/// (the lab's emulated CPU is slow, and start-up re-creates every recorded
/// export); [`AgentConfig::start_timeout`] changes it.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// The server side of mTLS: the agent's certificate and key, and the CA
/// whose client certificates it accepts.
#[derive(Debug, Clone)]
pub struct ServerTls {
    /// The agent's certificate and key.
    pub identity: Pem,
    /// The CA of client certificates.
    pub client_ca: PathBuf,
}

/// The client side of TLS: the CA the client trusts for the server, and the
/// client certificate it presents, if any.
#[derive(Debug, Clone)]
pub struct ClientTls {
    /// The CA that signed the agent's certificate.
    pub server_ca: PathBuf,
    /// The client's certificate and key; `None` presents none.
    pub identity: Option<Pem>,
}

/// How to run one agent.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// `--backend` values (`zfs=<pool>/<parent>`, `lvm=<vg>[/<thin>]`).
    pub backends: Vec<String>,
    /// `--state-dir`.
    pub state_dir: PathBuf,
    /// `--nvmeof-port` (on 127.0.0.1).
    pub nvmeof_port: u16,
    /// `--iscsi-port` (on 127.0.0.1).
    pub iscsi_port: u16,
    /// `--tls-*` and the client the helper itself uses; `None` runs
    /// `--insecure-plaintext`.
    pub tls: Option<(ServerTls, ClientTls)>,
    /// `--resync-interval-seconds`; `None` keeps the agent's default.
    pub resync_interval_seconds: Option<u64>,
    /// The log file.
    pub log: PathBuf,
    /// More flags (for example `--recovery-trust-anchor <file>`).
    pub extra_args: Vec<String>,
    /// Environment variables of the agent process (for example the
    /// test-only `PILLAR_CRASH_POINT`).
    pub env: Vec<(String, String)>,
    /// Another binary than `target/debug/pillar-csi` (for example the one
    /// built with crash points, [`crash_points_binary`]).
    pub binary: Option<PathBuf>,
    /// How long a start may take until the agent answers HealthCheck (120 s
    /// by default; a start reconciling many exports takes longer).
    pub start_timeout: Duration,
}

impl AgentConfig {
    /// [`AgentConfig::new`] serving zvols under `parent` and thin LVs in
    /// the lab's thin pool: the agent of the node and claim beds.
    pub fn zvols_and_thin_lvs(
        lab: &Lab,
        name: &str,
        parent: &ZfsParent,
        nvmeof_port: u16,
        iscsi_port: u16,
    ) -> Result<Self> {
        let backends = vec![
            parent.backend(),
            format!("lvm={}/{}", lab.vg, lab.thin_pool),
        ];
        Self::new(lab, name, backends, nvmeof_port, iscsi_port)
    }

    /// A plaintext agent named `name` with a fresh state folder and log file
    /// in the lab's work folder, serving `backends`, with NVMe/TCP and iSCSI
    /// on 127.0.0.1 at `nvmeof_port` and `iscsi_port`.
    pub fn new(
        lab: &Lab,
        name: &str,
        backends: Vec<String>,
        nvmeof_port: u16,
        iscsi_port: u16,
    ) -> Result<Self> {
        let state_dir = lab.work.join(format!("{name}.state"));
        fs::create_dir_all(&state_dir)?;
        Ok(Self {
            backends,
            state_dir,
            nvmeof_port,
            iscsi_port,
            tls: None,
            resync_interval_seconds: None,
            log: lab.work.join(format!("{name}.agent.log")),
            extra_args: Vec::new(),
            env: Vec::new(),
            binary: None,
            start_timeout: START_TIMEOUT,
        })
    }
}

/// A parent dataset made for one test with `zfs create`, holding the
/// agent's zvols; destroyed recursively when dropped (best effort).
#[derive(Debug)]
pub struct ZfsParent {
    /// The pool.
    pub pool: String,
    /// The dataset under the pool (without the pool).
    pub name: String,
}

impl ZfsParent {
    /// Creates `pool/<unique name>` from `prefix`.
    pub fn create(lab: &Lab, prefix: &str) -> Result<Self> {
        let name = lab.unique(prefix);
        run("zfs", &["create", &format!("{}/{name}", lab.pool)])?;
        Ok(Self {
            pool: lab.pool.clone(),
            name,
        })
    }

    /// The `--backend` value for it.
    pub fn backend(&self) -> String {
        format!("zfs={}/{}", self.pool, self.name)
    }

    /// Its full dataset name.
    pub fn dataset(&self) -> String {
        format!("{}/{}", self.pool, self.name)
    }

    /// The full names of every dataset below it (the `zfs list` witness).
    pub fn children(&self) -> Result<Vec<String>> {
        let out = run(
            "zfs",
            &[
                "list",
                "-H",
                "-r",
                "-t",
                "all",
                "-o",
                "name,type,volsize",
                "-p",
                &self.dataset(),
            ],
        )?;
        Ok(out
            .lines()
            .filter(|l| l.split('\t').next() != Some(self.dataset().as_str()))
            .map(str::to_owned)
            .collect())
    }
}

impl Drop for ZfsParent {
    fn drop(&mut self) {
        let _ = run("zfs", &["destroy", "-r", &self.dataset()]);
    }
}

/// A port on 127.0.0.1 that nothing listens on now.
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The `pillar-csi` binary built beside the running test, or its copy in
/// `PILLAR_LAB_BIN_DIR` (the lab guest copies it to memory: an exec over
/// the guest's 9p root reads all 80 MB again each time).
pub fn binary() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("PILLAR_LAB_BIN_DIR") {
        let copy = Path::new(&dir).join("pillar-csi");
        if copy.is_file() {
            return Ok(copy);
        }
    }
    let exe = std::env::current_exe()?;
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join("pillar-csi"))
        .ok_or_else(|| format!("no target folder above {}", exe.display()))?;
    if !bin.is_file() {
        return Err(format!(
            "{} is missing: build it with `cargo build --bins` (the lab runner does)",
            bin.display()
        )
        .into());
    }
    Ok(bin)
}

/// `pillar-csi` built with the test-only `crash-points` feature, which the
/// lab runner copies beside the ordinary binary.
pub fn crash_points_binary() -> Result<PathBuf> {
    let bin = binary()?.with_file_name("pillar-csi-crash-points");
    if !bin.is_file() {
        return Err(format!(
            "{} is missing: tests/lab/run builds it (cargo build -p pillar-csi --features crash-points)",
            bin.display()
        )
        .into());
    }
    Ok(bin)
}

/// A running agent; killed (SIGKILL) when dropped.
#[derive(Debug)]
pub struct AgentProcess {
    config: AgentConfig,
    child: Option<Child>,
    addr: SocketAddr,
    health: pb::HealthCheckResponse,
}

impl AgentProcess {
    /// Starts the agent and waits until it answers HealthCheck.
    pub async fn start(config: AgentConfig) -> Result<Self> {
        let mut agent = Self {
            config,
            child: None,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            health: pb::HealthCheckResponse::default(),
        };
        agent.spawn().await?;
        Ok(agent)
    }

    async fn spawn(&mut self) -> Result<()> {
        self.spawn_child()?;
        self.health = self.wait_healthy().await?;
        Ok(())
    }

    fn spawn_child(&mut self) -> Result<()> {
        self.addr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let c = &self.config;
        let mut cmd = Command::new(match &c.binary {
            Some(bin) => bin.clone(),
            None => binary()?,
        });
        cmd.arg("agent");
        for b in &c.backends {
            cmd.args(["--backend", b]);
        }
        cmd.args(["--listen", &self.addr.to_string()])
            .arg("--state-dir")
            .arg(&c.state_dir)
            .args(["--nvmeof-address", "127.0.0.1"])
            .args(["--nvmeof-port", &c.nvmeof_port.to_string()])
            .args(["--iscsi-address", "127.0.0.1"])
            .args(["--iscsi-port", &c.iscsi_port.to_string()]);
        if let Some(seconds) = c.resync_interval_seconds {
            cmd.args(["--resync-interval-seconds", &seconds.to_string()]);
        }
        match &c.tls {
            None => {
                cmd.arg("--insecure-plaintext");
            }
            Some((server, _)) => {
                cmd.arg("--tls-cert")
                    .arg(&server.identity.cert)
                    .arg("--tls-key")
                    .arg(&server.identity.key)
                    .arg("--tls-client-ca")
                    .arg(&server.client_ca);
            }
        }
        cmd.args(&c.extra_args);
        cmd.envs(c.env.iter().map(|(k, v)| (k, v)));
        let mut log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&c.log)?;
        // The agent's own first line ("agent starting") follows: the gap is
        // the time to exec the binary and load its libraries.
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
        std::io::Write::write_all(
            &mut log,
            format!(
                "lab: spawning the agent at unix time {:.3}\n",
                now.as_secs_f64()
            )
            .as_bytes(),
        )?;
        let child = cmd
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting the agent: {e}"))?;
        self.child = Some(child);
        Ok(())
    }

    async fn wait_healthy(&mut self) -> Result<pb::HealthCheckResponse> {
        let start = Instant::now();
        let limit = self.config.start_timeout;
        let tls = self.config.tls.as_ref().map(|(_, c)| c.clone());
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    self.child = None;
                    return Err(format!(
                        "the agent exited with {status} before answering; its log:\n{}",
                        self.log_tail()
                    )
                    .into());
                }
            }
            let attempt = async {
                let mut client = connect(self.addr, tls.as_ref()).await?;
                let reply = client.health_check(HealthCheckRequest {}).await?;
                Result::<_>::Ok(reply.into_inner())
            };
            match tokio::time::timeout(Duration::from_secs(10), attempt).await {
                Ok(Ok(health)) => return Ok(health),
                Ok(Err(_)) | Err(_) if start.elapsed() < limit => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Ok(Err(e)) => {
                    return Err(format!(
                        "the agent did not answer HealthCheck within {limit:?}: {e}; its log:\n{}",
                        self.log_tail()
                    )
                    .into())
                }
                Err(_) => {
                    return Err(format!(
                        "the agent did not answer HealthCheck within {limit:?}; its log:\n{}",
                        self.log_tail()
                    )
                    .into())
                }
            }
        }
    }

    /// The HealthCheck answer that ended the last start.
    pub fn health(&self) -> &pb::HealthCheckResponse {
        &self.health
    }

    /// The process ID, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(std::process::Child::id)
    }

    /// The gRPC address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// How the agent runs.
    pub fn config(&self) -> &AgentConfig {
        &self.config
    }

    /// How the agent runs, to change before a [`AgentProcess::restart`].
    pub fn config_mut(&mut self) -> &mut AgentConfig {
        &mut self.config
    }

    /// A client as the helper connects (the configured client certificate, if TLS).
    pub async fn client(&self) -> Result<Client> {
        connect(
            self.addr,
            self.config.tls.as_ref().map(|(_, client)| client),
        )
        .await
    }

    /// Kills the agent with SIGKILL (no clean shutdown) and reaps it.
    pub fn kill(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    /// Starts the agent again (killing it first if it runs), with the same
    /// configuration and state folder, on a new gRPC port.
    pub async fn restart(&mut self) -> Result<()> {
        self.kill()?;
        self.spawn().await
    }

    /// Starts the agent again like [`AgentProcess::restart`] without
    /// waiting for it to answer: a crash point in start-up reconciliation
    /// stops it before it serves.
    pub fn restart_unanswered(&mut self) -> Result<()> {
        self.kill()?;
        self.spawn_child()
    }

    /// The whole log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.config.log).unwrap_or_default()
    }

    fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

/// Connects to an agent at `addr`: plaintext when `tls` is `None`, else TLS
/// trusting `tls.server_ca` for the name `127.0.0.1` and presenting
/// `tls.identity`. The connection is made (and, with TLS, the handshake run)
/// before this returns; with TLS 1.3 a refused client certificate may still
/// only show on the first call.
pub async fn connect(addr: SocketAddr, tls: Option<&ClientTls>) -> Result<Client> {
    let endpoint = match tls {
        None => Endpoint::from_shared(format!("http://{addr}"))?,
        Some(t) => {
            let mut config = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(fs::read(&t.server_ca)?))
                .domain_name(addr.ip().to_string());
            if let Some(id) = &t.identity {
                config =
                    config.identity(Identity::from_pem(fs::read(&id.cert)?, fs::read(&id.key)?));
            }
            Endpoint::from_shared(format!("https://{addr}"))?.tls_config(config)?
        }
    };
    let channel = endpoint
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(300))
        .connect()
        .await?;
    Ok(AgentServiceClient::new(channel))
}
