//! Benchmark in the kernel lab: the agent under load (issue #15, Tests, "Load").
//!
//! Two identical rounds against one agent, each:
//! 1. N sparse 64 MiB zvols (`PILLAR_LOAD_VOLUMES`, 1000 by default) created,
//!    exported over NVMe/TCP with an ACL and one host NQN allowed, by 20
//!    clients at once (each with its own gRPC channel, pulling volumes from
//!    one queue); every RPC's latency recorded.
//! 2. Restart reconciliation, twice: the agent killed and started again with
//!    configfs as it was (a process restart), then killed with configfs
//!    emptied (a reboot). The agent serves only once it has re-created every
//!    recorded export, so a start is timed until it answers HealthCheck;
//!    then configfs must hold all N subsystems with their host.
//! 3. Everything denied, unexported and deleted by 20 clients; then no zvol,
//!    no subsystem, no host and no live volume may be left.
//!
//! The agent's resident memory and open file descriptors are read before
//! the first round and after each step; the second round must not grow
//! them. Our way has no peer here: the comparisons are round 2 against
//! round 1 and 20 clients against a short sequential baseline (one client,
//! 50 volumes, on the emptied agent at the end).
//!
//! Run with `tests/lab/run bench -- agent_load`
//! (`PILLAR_LOAD_VOLUMES=200 tests/lab/run bench -- agent_load` for fewer).
use pillar_csi_lab::{
    agent::{pb, AgentConfig, AgentProcess, Client, ZfsParent},
    bench::{empty_nvmet, open_fds, rss_kib},
    Lab, Result,
};
mod report;

use std::{
    collections::{BTreeMap, VecDeque},
    future::Future,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

/// Clients at once in the rounds.
const CLIENTS: usize = 20;
/// Volumes of the sequential baseline.
const BASELINE: usize = 50;
/// The host NQN every export allows.
const HOST: &str = "nqn.2026-01.com.bhyoo.pillar-csi.bench:load-host";
/// The agent's subsystem NQNs start with this.
const NQN_PREFIX: &str = "nqn.2026-01.com.bhyoo.pillar-csi:";
/// Each zvol's size (sparse: no space is reserved).
const SIZE: u64 = 64 << 20;

/// The RPCs a volume's life takes here, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Rpc {
    Create,
    Export,
    Allow,
    Deny,
    Unexport,
    Delete,
}

impl Rpc {
    const ALL: [Rpc; 6] = [
        Rpc::Create,
        Rpc::Export,
        Rpc::Allow,
        Rpc::Deny,
        Rpc::Unexport,
        Rpc::Delete,
    ];

    fn name(self) -> &'static str {
        match self {
            Rpc::Create => "CreateVolume",
            Rpc::Export => "ExportVolume",
            Rpc::Allow => "AllowInitiator",
            Rpc::Deny => "DenyInitiator",
            Rpc::Unexport => "UnexportVolume",
            Rpc::Delete => "DeleteVolume",
        }
    }
}

/// Latencies by RPC.
type Samples = BTreeMap<Rpc, Vec<Duration>>;

/// Which half of a volume's life a pass drives.
#[derive(Clone, Copy)]
enum Pass {
    /// CreateVolume, ExportVolume, AllowInitiator.
    Up,
    /// DenyInitiator, UnexportVolume, DeleteVolume.
    Down,
}

/// One volume of a pass: its agent volume ID and its lifecycle's UID.
#[derive(Clone, Debug)]
struct Volume {
    id: String,
    uid: String,
}

impl Volume {
    /// `count` volumes `<pool>/<prefix><i>`, lifecycles `<tag>-<i>`.
    fn many(parent: &ZfsParent, prefix: &str, tag: &str, count: usize) -> Vec<Self> {
        (0..count)
            .map(|i| Volume {
                id: format!("{}/{prefix}{i}", parent.pool),
                uid: format!("{tag}-{i}"),
            })
            .collect()
    }

    fn fence(&self) -> Option<pb::FenceToken> {
        Some(pb::FenceToken {
            volume_uid: self.uid.clone(),
            generation: 1,
        })
    }
}

/// Runs one RPC and records its latency under `rpc`.
async fn timed<T>(
    samples: &mut Samples,
    rpc: Rpc,
    volume: &Volume,
    call: impl Future<Output = Result<T, tonic::Status>>,
) -> Result<()> {
    let start = Instant::now();
    call.await
        .map_err(|e| format!("{} of {}: {e}", rpc.name(), volume.id))?;
    samples.entry(rpc).or_default().push(start.elapsed());
    Ok(())
}

/// Creates, exports and allows `v`.
async fn up(client: &mut Client, v: &Volume, samples: &mut Samples) -> Result<()> {
    let nvme = pb::ProtocolType::NvmeofTcp as i32;
    let zvol = pb::BackendType::ZfsZvol as i32;
    let create = pb::CreateVolumeRequest {
        volume_id: v.id.clone(),
        backend_type: zvol,
        capacity_bytes: SIZE,
        fence: v.fence(),
        zfs_properties: [("sparse".to_owned(), "true".to_owned())].into(),
        ..Default::default()
    };
    timed(samples, Rpc::Create, v, client.create_volume(create)).await?;
    let export = pb::ExportVolumeRequest {
        volume_id: v.id.clone(),
        backend_type: zvol,
        protocol_type: nvme,
        fence: v.fence(),
        acl_enabled: true,
        allowed_initiators: vec![],
        chap: None,
    };
    timed(samples, Rpc::Export, v, client.export_volume(export)).await?;
    let allow = pb::AllowInitiatorRequest {
        volume_id: v.id.clone(),
        protocol_type: nvme,
        initiator_id: HOST.into(),
        fence: v.fence(),
    };
    timed(samples, Rpc::Allow, v, client.allow_initiator(allow)).await
}

/// Denies, unexports and deletes `v`.
async fn down(client: &mut Client, v: &Volume, samples: &mut Samples) -> Result<()> {
    let nvme = pb::ProtocolType::NvmeofTcp as i32;
    let deny = pb::DenyInitiatorRequest {
        volume_id: v.id.clone(),
        protocol_type: nvme,
        initiator_id: HOST.into(),
        fence: v.fence(),
    };
    timed(samples, Rpc::Deny, v, client.deny_initiator(deny)).await?;
    let unexport = pb::UnexportVolumeRequest {
        volume_id: v.id.clone(),
        protocol_type: nvme,
        fence: v.fence(),
    };
    timed(samples, Rpc::Unexport, v, client.unexport_volume(unexport)).await?;
    let delete = pb::DeleteVolumeRequest {
        volume_id: v.id.clone(),
        backend_type: pb::BackendType::ZfsZvol as i32,
        fence: v.fence(),
    };
    timed(samples, Rpc::Delete, v, client.delete_volume(delete)).await
}

/// Drives `pass` over `volumes` with `clients` clients, each on its own gRPC
/// channel (connected before the clock starts), taking the next volume from
/// one shared queue. Returns the wall time and every RPC's latency.
async fn drive(
    agent: &AgentProcess,
    volumes: &[Volume],
    clients: usize,
    pass: Pass,
) -> Result<(Duration, Samples)> {
    let queue: VecDeque<Volume> = volumes.iter().cloned().collect();
    let queue = Arc::new(Mutex::new(queue));
    let mut connected = Vec::with_capacity(clients);
    for _ in 0..clients {
        connected.push(agent.client().await?);
    }
    let start = Instant::now();
    let tasks: Vec<_> = connected
        .into_iter()
        .map(|mut client| {
            let queue = Arc::clone(&queue);
            tokio::spawn(async move {
                let mut samples = Samples::new();
                loop {
                    let next = queue.lock().map_err(|_| "queue lock poisoned")?.pop_front();
                    let Some(v) = next else { break };
                    match pass {
                        Pass::Up => up(&mut client, &v, &mut samples).await?,
                        Pass::Down => down(&mut client, &v, &mut samples).await?,
                    }
                }
                Result::<_>::Ok(samples)
            })
        })
        .collect();
    let mut all = Samples::new();
    for task in tasks {
        for (rpc, mut s) in task.await.map_err(|e| e.to_string())?? {
            all.entry(rpc).or_default().append(&mut s);
        }
    }
    Ok((start.elapsed(), all))
}

/// The agent's resident memory and open descriptors at one point.
#[derive(Debug, Clone, Default)]
struct Usage {
    rss_kib: u64,
    fds: BTreeMap<String, usize>,
}

/// Reads the agent's [`Usage`], once the connections of clients just
/// dropped have had time to close on its side.
async fn usage(agent: &AgentProcess) -> Result<Usage> {
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pid = agent.pid().ok_or("the agent is not running")?;
    Ok(Usage {
        rss_kib: rss_kib(pid)?,
        fds: open_fds(pid)?,
    })
}

/// Checks that configfs holds `n` subsystems of the agent, each linked to a
/// port, with its namespace enabled and [`HOST`] allowed.
fn check_exports(n: usize) -> Result<()> {
    let state = nvmet::Nvmet::open()?.read()?;
    let linked: std::collections::BTreeSet<_> = state
        .ports
        .values()
        .flat_map(|p| p.subsystems.iter())
        .collect();
    let complete = state
        .subsystems
        .iter()
        .filter(|(nqn, s)| {
            nqn.as_str().starts_with(NQN_PREFIX)
                && linked.contains(nqn)
                && s.allowed_hosts.iter().any(|h| h.as_str() == HOST)
                && s.namespaces.values().all(|ns| ns.enabled)
                && !s.namespaces.is_empty()
        })
        .count();
    if complete != n || state.subsystems.len() != n {
        return Err(format!(
            "configfs holds {} subsystems, {complete} of them complete; {n} expected",
            state.subsystems.len()
        )
        .into());
    }
    Ok(())
}

/// Checks that nothing of a pass is left: no zvol under `parent`, no nvmet
/// subsystem or host, no live volume in the agent's ListVolumes.
async fn check_empty(agent: &AgentProcess, parent: &ZfsParent) -> Result<()> {
    let zvols = parent.children()?;
    let state = nvmet::Nvmet::open()?.read()?;
    let live: Vec<String> = agent
        .client()
        .await?
        .list_volumes(pb::ListVolumesRequest {})
        .await?
        .into_inner()
        .volumes
        .into_iter()
        .filter(|v| !v.ended)
        .map(|v| v.volume_id)
        .collect();
    if !zvols.is_empty()
        || !state.subsystems.is_empty()
        || !state.hosts.is_empty()
        || !live.is_empty()
    {
        return Err(format!(
            "left behind: {} zvols, {} subsystems, hosts {:?}, {} live volumes (first: {:?} {:?})",
            zvols.len(),
            state.subsystems.len(),
            state.hosts,
            live.len(),
            zvols.first(),
            live.first()
        )
        .into());
    }
    Ok(())
}

/// What one round measured.
#[derive(Debug, Default)]
struct Round {
    up: Duration,
    down: Duration,
    samples: Samples,
    restart_kept: Duration,
    restart_emptied: Duration,
    /// Before the round, after the load, after the restarts, after the deletes.
    usage: [Usage; 4],
}

/// One round over `n` volumes `v<i>` (lifecycles `r<round>-<i>`).
async fn round(
    agent: &mut AgentProcess,
    parent: &ZfsParent,
    n: usize,
    number: usize,
) -> Result<Round> {
    let volumes = Volume::many(parent, "v", &format!("r{number}"), n);
    let mut r = Round::default();
    r.usage[0] = usage(agent).await?;
    let (up, mut samples) = drive(agent, &volumes, CLIENTS, Pass::Up).await?;
    r.up = up;
    check_exports(n)?;
    r.usage[1] = usage(agent).await?;

    let start = Instant::now();
    agent.restart().await?;
    r.restart_kept = start.elapsed();
    check_exports(n)?;
    agent.kill()?;
    empty_nvmet()?;
    let start = Instant::now();
    agent.restart().await?;
    r.restart_emptied = start.elapsed();
    check_exports(n)?;
    r.usage[2] = usage(agent).await?;

    let (down, down_samples) = drive(agent, &volumes, CLIENTS, Pass::Down).await?;
    r.down = down;
    samples.extend(down_samples);
    r.samples = samples;
    check_empty(agent, parent).await?;
    r.usage[3] = usage(agent).await?;
    println!(
        "agent_load: round {number} done: up {:.1} s, restarts {:.1} s and {:.1} s, down {:.1} s",
        up.as_secs_f64(),
        r.restart_kept.as_secs_f64(),
        r.restart_emptied.as_secs_f64(),
        down.as_secs_f64()
    );
    Ok(r)
}

#[tokio::main]
async fn main() -> Result<()> {
    if !pillar_csi_lab::bench::selected("agent_load") {
        return Ok(());
    }
    let n: usize = match std::env::var("PILLAR_LOAD_VOLUMES") {
        Ok(v) => v
            .parse()
            .map_err(|e| format!("PILLAR_LOAD_VOLUMES={v:?}: {e}"))?,
        Err(_) => 1000,
    };
    let lab = Lab::get();
    let parent = ZfsParent::create(&lab, "bench-load")?;
    let mut config = AgentConfig::new(&lab, "load", vec![parent.backend()], 4450, 3270)?;
    // No periodic resync during the rounds: only the restarts reconcile.
    config.resync_interval_seconds = Some(0);
    // Marks on the guest's own filesystem, as in production (see agent_pipeline).
    config.state_dir = std::path::PathBuf::from("/var/lib/pillar-csi").join(lab.unique("load"));
    std::fs::create_dir_all(&config.state_dir)?;
    // A start re-creates all n exports before it serves.
    config.start_timeout = Duration::from_secs(120).max(Duration::from_millis(500) * n as u32);
    let mut agent = AgentProcess::start(config).await?;
    let first = round(&mut agent, &parent, n, 1).await?;
    let second = round(&mut agent, &parent, n, 2).await?;
    let rounds = [first, second];

    let base = Volume::many(&parent, "b", "base", BASELINE.min(n));
    let (base_up, _) = drive(&agent, &base, 1, Pass::Up).await?;
    let (base_down, _) = drive(&agent, &base, 1, Pass::Down).await?;
    check_empty(&agent, &parent).await?;

    report::report(n, &rounds, base_up, base_down);
    let verdict = report::verdict(&rounds);
    agent.kill()?;
    verdict
}
