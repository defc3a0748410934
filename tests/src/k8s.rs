//! The real Kubernetes components a cluster runs beside the driver, started
//! in the lab guest for the claim tests that go through them: the CSI
//! sidecars the chart deploys in the controller pod (external-provisioner,
//! -attacher, -resizer, -snapshotter, built by `scripts/deps-sidecars.sh`
//! at the chart's versions, on the controller's socket with the chart's
//! flags and its ServiceAccount's rules), kube-controller-manager (built by
//! `scripts/deps-apiserver.sh` from Debian's source, with the PV binder,
//! expander, attach-detach and protection controllers) and the
//! snapshot-controller with its VolumeSnapshot CRDs (external-snapshotter,
//! a cluster component the chart does not ship). Each process is killed
//! when dropped.
use crate::{apiserver::ApiServer, claim_bed::ClaimBed, Result};
use std::{
    ffi::OsString,
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    time::Duration,
};

/// The lease timings of the sidecars' leader election under the lab's
/// emulated CPU (lab.md: the defaults lose the lease under TCG).
const LEASE: [&str; 3] = [
    "--leader-election-lease-duration=60s",
    "--leader-election-renew-deadline=40s",
    "--leader-election-retry-period=10s",
];

/// The controllers of kube-controller-manager a CSI volume's life needs
/// (`serviceaccount` makes the namespace's default ServiceAccount, which
/// the API server's admission requires of a Pod).
const CONTROLLERS: &str = "persistentvolume-binder,persistentvolume-expander,attachdetach,\
                           pv-protection,pvc-protection,serviceaccount";

/// One running component: its process and log.
pub struct Component {
    /// What it is (`csi-provisioner`).
    pub name: String,
    /// Its standard output and error.
    pub log: PathBuf,
    program: PathBuf,
    args: Vec<OsString>,
    child: Child,
}

impl Component {
    /// Starts `program args`, its output appended to `log`.
    pub fn spawn(name: &str, program: &Path, args: &[OsString], log: &Path) -> Result<Self> {
        Ok(Self {
            name: name.to_owned(),
            log: log.to_owned(),
            program: program.to_owned(),
            args: args.to_vec(),
            child: start(name, program, args, log)?,
        })
    }

    /// Starts it again as it was started, once it has exited (as kubelet
    /// restarts a container); its output goes on in the same log.
    pub fn restart(&mut self) -> Result<()> {
        self.stop();
        self.child = start(&self.name, &self.program, &self.args, &self.log)?;
        Ok(())
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// An error unless it still runs.
    pub fn check_running(&mut self) -> Result<()> {
        match self.child.try_wait()? {
            None => Ok(()),
            Some(status) => Err(format!(
                "{} exited with {status}; its log:\n{}",
                self.name,
                self.log()
            )
            .into()),
        }
    }
}

impl Component {
    /// Kills the process (SIGKILL) and reaps it; again is a no-op.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM, as kubelet does first to a deleted pod's containers
    /// (the sidecars give up their leader leases on it, so a new pod need
    /// not wait them out).
    pub fn send_term(&mut self) {
        if self.running() {
            let _ = Command::new("kill")
                .args(["-TERM", &self.child.id().to_string()])
                .status();
        }
    }

    /// Whether the process still runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// How it exited, once it has (`None` while it runs).
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

impl Drop for Component {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `program args` started, its output appended to `log`.
fn start(name: &str, program: &Path, args: &[OsString], log: &Path) -> Result<Child> {
    let out = fs::OpenOptions::new().create(true).append(true).open(log)?;
    Ok(Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .map_err(|e| format!("starting {name} ({}): {e}", program.display()))?)
}

/// Where `scripts/deps-sidecars.sh` put `name` (a sidecar, the
/// snapshot-controller, the folder of the snapshot CRDs).
pub fn sidecar_binary(name: &str) -> Result<PathBuf> {
    // In the lab, the control plane's programs run on the host through
    // links of their names ([`crate::host_exec`]).
    if let Some(tools) = std::env::var_os(crate::host_exec::TOOLS_VAR) {
        let link = PathBuf::from(tools).join(name);
        if link.exists() {
            return Ok(link);
        }
    }
    let dir = match std::env::var_os("PILLAR_LAB_GO_BIN") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
            .join(".cache/pillar-csi/go-bin"),
    };
    let bin = dir.join(name);
    if !bin.exists() {
        return Err(format!("{} is missing: run `make deps`", bin.display()).into());
    }
    Ok(bin)
}

/// The sidecars of the controller pod, by binary name; each logs to
/// `k8s.<name>.log` in the lab's work folder.
pub const SIDECARS: [&str; 4] = [
    "csi-provisioner",
    "csi-attacher",
    "csi-resizer",
    "csi-snapshotter",
];

/// The CSI sidecars of the controller pod.
pub struct Sidecars {
    /// external-provisioner, -attacher, -resizer and -snapshotter.
    pub components: Vec<Component>,
}

/// How long a stopped sidecar or controller gets between SIGTERM and SIGKILL,
/// as a deleted pod's containers get.
const GRACE: Duration = Duration::from_secs(10);

/// Stops `components` as a deleted pod's containers stop: SIGTERM to all,
/// SIGKILL (on drop) to those still running after [`GRACE`]. A component
/// that runs leader election gives its lease up on SIGTERM; killed, it
/// would leave the lease held for its whole duration (60 s here), and the
/// next test's sidecars on the same API server would wait that out.
fn terminate_all(components: &mut [Component]) {
    components.iter_mut().for_each(Component::send_term);
    let start = std::time::Instant::now();
    while components.iter_mut().any(Component::running) && start.elapsed() < GRACE {
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl Drop for Sidecars {
    fn drop(&mut self) {
        terminate_all(&mut self.components);
    }
}

impl Sidecars {
    /// Stops them as a deleted pod's containers stop ([`terminate_all`]).
    pub async fn terminate(mut self) {
        let mut components = std::mem::take(&mut self.components);
        tokio::task::spawn_blocking(move || terminate_all(&mut components))
            .await
            .ok();
    }

    /// Starts again each sidecar that exited, as kubelet restarts a
    /// pod's exited container and leaves the others running (a sidecar
    /// exits when it loses its connection to the CSI socket); says which,
    /// how each exited and its last log lines.
    pub fn restart_exited(&mut self) -> Result<Vec<String>> {
        let mut restarted = Vec::new();
        for c in &mut self.components {
            if let Some(status) = c.exit_status() {
                restarted.push(format!(
                    "{} exited ({status}); its last lines:\n{}",
                    c.name,
                    tail(&c.log(), 6)
                ));
                c.restart()?;
            }
        }
        Ok(restarted)
    }

    /// Starts the four sidecars on `bed`'s controller socket as the
    /// chart runs them (its flags, the controller's ServiceAccount and the
    /// chart's rules for it, leader election in namespace `pillar-csi`).
    pub async fn start(bed: &ClaimBed) -> Result<Self> {
        Self::start_on(&bed.server, &bed.controller.socket, &bed.lab.work).await
    }

    /// Starts the four sidecars on the controller socket `socket` as the
    /// chart runs them, against `server`, each logging to
    /// `dir/k8s.<name>.log`.
    pub async fn start_on(server: &ApiServer, socket: &Path, dir: &Path) -> Result<Self> {
        let _clock = crate::setup_clock::start("sidecars");
        server.controller_client().await?;
        let kubeconfig = server.kubeconfig_of("pillar-csi-controller");
        let mut components = Vec::new();
        for name in SIDECARS {
            let mut args: Vec<OsString> = vec![
                format!("--csi-address={}", socket.display()).into(),
                format!("--kubeconfig={}", kubeconfig.display()).into(),
                "--leader-election".into(),
                "--leader-election-namespace=pillar-csi".into(),
                "--timeout=120s".into(),
                "--v=4".into(),
            ];
            args.extend(LEASE.iter().map(OsString::from));
            if matches!(name, "csi-provisioner" | "csi-snapshotter") {
                args.push("--extra-create-metadata".into());
            }
            // As the chart runs it (templates/controller-deployment.yaml).
            if name == "csi-provisioner" {
                args.push("--immediate-topology=false".into());
            }
            let log = dir.join(format!("k8s.{name}.log"));
            components.push(Component::spawn(name, &sidecar_binary(name)?, &args, &log)?);
        }
        Ok(Self { components })
    }
}

/// kube-controller-manager, against `server` as its admin.
pub struct ControllerManager(pub Component);

impl ControllerManager {
    /// Starts it with the controllers a CSI volume's life needs, writing its
    /// log into `dir`, and waits (bounded) until it says they started.
    pub async fn start(server: &ApiServer, dir: &Path) -> Result<Self> {
        Self::start_with(server, dir, CONTROLLERS, &[]).await
    }

    /// [`ControllerManager::start`] for a cluster with a real kubelet: the
    /// node lifecycle controller too, which lifts the `not-ready` taint a
    /// new Node is admitted with once its kubelet reports Ready. Its
    /// evictions are off (`--enable-taint-manager=false`, and a NotReady
    /// grace longer than a test): a kubelet under the lab's emulated CPU
    /// can be late with its status without the test's Pods being evicted.
    pub async fn start_for_kubelet(server: &ApiServer, dir: &Path) -> Result<Self> {
        let controllers = format!("{CONTROLLERS},nodelifecycle");
        let flags = [
            "--enable-taint-manager=false",
            "--node-monitor-grace-period=5m",
            "--pod-eviction-timeout=30m",
        ];
        Self::start_with(server, dir, &controllers, &flags).await
    }

    /// [`ControllerManager::start_for_kubelet`] for the chart's install:
    /// the workload controllers (Deployment, ReplicaSet, DaemonSet), the
    /// garbage collector (`helm uninstall` leaves the Pods to it) and the
    /// ServiceAccount token controller, which signs the controller Pod's
    /// token with the server's key and gives it the cluster's CA.
    pub async fn start_for_chart(server: &ApiServer, dir: &Path) -> Result<Self> {
        let controllers = format!(
            "{CONTROLLERS},nodelifecycle,deployment,replicaset,daemonset,garbagecollector,\
             serviceaccount-token"
        );
        let key = format!(
            "--service-account-private-key-file={}",
            server.dir().join("sa.key").display()
        );
        let ca = format!("--root-ca-file={}", server.dir().join("ca.crt").display());
        let flags = [
            "--enable-taint-manager=false",
            "--node-monitor-grace-period=5m",
            "--pod-eviction-timeout=30m",
            &key,
            &ca,
        ];
        Self::start_with(server, dir, &controllers, &flags).await
    }

    async fn start_with(
        server: &ApiServer,
        dir: &Path,
        controllers: &str,
        flags: &[&str],
    ) -> Result<Self> {
        let _clock = crate::setup_clock::start("kube-controller-manager");
        let program = which("kube-controller-manager")?;
        let mut args: Vec<OsString> = vec![
            format!("--kubeconfig={}", server.kubeconfig().display()).into(),
            format!("--controllers={controllers}").into(),
            "--leader-elect=false".into(),
            "--use-service-account-credentials=false".into(),
            "--port=0".into(),
            "--secure-port=0".into(),
            // Without a kubelet, nodes report nothing: the attach-detach
            // controller's sync from the nodes' status is what counts.
            "--attach-detach-reconcile-sync-period=5s".into(),
            "--v=2".into(),
        ];
        args.extend(flags.iter().map(OsString::from));
        // The log is appended to by every kube-controller-manager of this
        // guest: only what this one wrote tells that it started.
        let log = dir.join("k8s.kube-controller-manager.log");
        let before = fs::metadata(&log).map_or(0, |m| m.len()) as usize;
        let mut kcm = Component::spawn("kube-controller-manager", &program, &args, &log)?;
        let start = std::time::Instant::now();
        let started = || {
            let written = fs::read(&log).unwrap_or_default();
            String::from_utf8_lossy(written.get(before..).unwrap_or_default())
                .contains("Started \"attachdetach\"")
        };
        while !started() {
            kcm.check_running()?;
            if start.elapsed() > Duration::from_secs(180) {
                return Err(format!(
                    "kube-controller-manager did not start its controllers within 180 s:\n{}",
                    tail(&kcm.log(), 40)
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Ok(Self(kcm))
    }
}

/// kube-scheduler, against `server` as its admin (no leader election, no
/// port of its own: in the lab it runs on the host beside other guests'
/// schedulers, [`crate::host_exec`]), logging into `dir`.
pub struct Scheduler(pub Component);

impl Scheduler {
    /// Starts it; it schedules once it has listed the cluster's objects.
    pub fn start(server: &ApiServer, dir: &Path) -> Result<Self> {
        let args: Vec<OsString> = vec![
            format!("--kubeconfig={}", server.kubeconfig().display()).into(),
            "--leader-elect=false".into(),
            "--port=0".into(),
            "--secure-port=0".into(),
            "--v=2".into(),
        ];
        Ok(Self(Component::spawn(
            "kube-scheduler",
            &which("kube-scheduler")?,
            &args,
            &dir.join("k8s.kube-scheduler.log"),
        )?))
    }
}

/// kube-proxy in iptables mode, against `server` as its admin: it routes
/// Pods' connections to Services' cluster IPs (the chart's controller
/// reaches the API server at the `kubernetes` Service), masquerading them
/// all (the lab's user-mode network knows only the guest's address).
/// Dropping it stops it and removes its iptables chains (`--cleanup`): the
/// lab's later tests share the guest.
pub struct KubeProxy(pub Component);

impl KubeProxy {
    /// Starts it for Node `node`, logging into `dir`.
    pub fn start(server: &ApiServer, dir: &Path, node: &str) -> Result<Self> {
        let args: Vec<OsString> = vec![
            format!("--kubeconfig={}", server.kubeconfig().display()).into(),
            format!("--hostname-override={node}").into(),
            "--proxy-mode=iptables".into(),
            "--masquerade-all".into(),
            "--cluster-cidr=10.244.0.0/24".into(),
            // No conntrack table resize: the guest's defaults serve.
            "--conntrack-max-per-core=0".into(),
            "--v=2".into(),
        ];
        Ok(Self(Component::spawn(
            "kube-proxy",
            &which("kube-proxy")?,
            &args,
            &dir.join("k8s.kube-proxy.log"),
        )?))
    }
}

impl Drop for KubeProxy {
    fn drop(&mut self) {
        self.0.stop();
        if let Ok(program) = which("kube-proxy") {
            let _ = std::process::Command::new(program)
                .arg("--cleanup")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

/// The snapshot-controller (external-snapshotter), against `server` as its
/// admin, after the VolumeSnapshot CRDs of its release are applied.
pub struct SnapshotController(pub Component);

impl Drop for SnapshotController {
    fn drop(&mut self) {
        terminate_all(std::slice::from_mut(&mut self.0));
    }
}

impl SnapshotController {
    /// Applies the VolumeSnapshot, VolumeSnapshotContent and
    /// VolumeSnapshotClass CRDs and starts the controller (its default
    /// flags, leader election as a cluster's deployment runs it), writing
    /// its log into `dir`.
    pub async fn start(server: &ApiServer, dir: &Path) -> Result<Self> {
        let crds = sidecar_binary("snapshot-crds")?;
        server.kubectl(&["apply", "-f", &crds.display().to_string()])?;
        for crd in [
            "volumesnapshotclasses",
            "volumesnapshotcontents",
            "volumesnapshots",
        ] {
            server.kubectl(&[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                &format!("crd/{crd}.snapshot.storage.k8s.io"),
            ])?;
        }
        let mut args: Vec<OsString> = vec![
            format!("--kubeconfig={}", server.kubeconfig().display()).into(),
            "--leader-election".into(),
            "--leader-election-namespace=kube-system".into(),
            "--v=4".into(),
        ];
        args.extend(LEASE.iter().map(OsString::from));
        let program = sidecar_binary("snapshot-controller")?;
        let log = dir.join("k8s.snapshot-controller.log");
        Ok(Self(Component::spawn(
            "snapshot-controller",
            &program,
            &args,
            &log,
        )?))
    }
}

/// `name` on the PATH.
fn which(name: &str) -> Result<PathBuf> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .chain([PathBuf::from("/usr/local/bin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| format!("{name} is not on the PATH: run `make deps`").into())
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Polls `f` every half second until it gives a value, at most `limit`
/// (the real components' pace: a controller's resync, a sidecar's retry);
/// says how long it took.
pub async fn until<T, F, Fut>(what: &str, limit: Duration, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let start = std::time::Instant::now();
    loop {
        if let Some(v) = f().await? {
            println!("      {what}: after {:.1} s", start.elapsed().as_secs_f64());
            return Ok(v);
        }
        if start.elapsed() > limit {
            return Err(format!("{what}: not within {limit:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
