//! Benchmark in the kernel lab: the agent's pipeline against the kernel's
//! own cost and against its peers as they run.
//!
//! 1. 50 zvols created, exported over NVMe/TCP with an ACL and an initiator
//!    allowed, through the agent's gRPC API, all 50 at once and one at a
//!    time; against
//!    - the floor: the same kernel work done bare in-process (lzc_create,
//!      the wait for the device node, the configfs mkdirs, writes and
//!      links), at once from 50 threads and one at a time;
//!    - the floor with the agent's reads and marks (at once only): the
//!      same, plus the kernel reads and durable writes the agent makes for
//!      its checks (see `AgentReads`), so that a run tells what they cost
//!      from what the agent adds above them;
//!    - the peers: one `bash` per volume running `zfs create -V`, a wait
//!      for the device node and the configfs writes (what a driver that
//!      shells out does), 50 processes at once and one at a time.
//!
//!    The agent's own log gives, for the requests made one at a time, how
//!    much each RPC added above its backend or configfs work.
//! 2. Restart reconciliation: the agent killed, configfs emptied, the agent
//!    started again re-creating every export from its fence marks (at half
//!    and at all of the exports, for linearity); against writing the same
//!    configfs state directly with a shell script.
//! 3. The agent's resident memory when idle.
//!
//! Run with `make bench FILTER=agent_pipeline`. Absolute times under TCG
//! mean little; the ratios are the result. Goal: the agent with 50 at once
//! at least 3x faster than the peers' 50 processes at once.
use pillar_csi_agent::marks::{FenceMark, MarkStore};
use pillar_csi_lab::{
    agent::{AgentConfig, AgentProcess, Client, ZfsParent},
    bench::{
        bash, bash_command, conditions, cpu_seconds, empty_nvmet, ms, processes_at_once, rss_kib,
        threads_at_once, write_restarting,
    },
    run, Lab, Result,
};
use pillar_csi_proto::agent::v1 as pb;
use std::{
    fmt::Write as _,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};
use sys::zfs::{floor::BareCalls, DatasetName, Zfs};

const PIPELINE: usize = 50;
const RESTART: usize = 500;
const HOST: &str = "nqn.2026-01.com.bhyoo.pillar-csi.bench:host";
const SIZE: u64 = 1 << 20;
const NVMET: &str = "/sys/kernel/config/nvmet";
/// The goal of the agent with every volume at once against the peers'
/// processes at once.
const AT_ONCE_GOAL: f64 = 3.0;

fn fence(i: usize) -> Option<pb::FenceToken> {
    Some(pb::FenceToken {
        volume_uid: format!("uid-{i}"),
        generation: 1,
    })
}

/// When the last of a run's pipelines finished each of its three steps,
/// from the run's start: where the time of a run at once goes.
#[derive(Default)]
struct Stages {
    start: Option<Instant>,
    done: std::sync::Mutex<[Duration; 3]>,
}

impl Stages {
    fn starting() -> Self {
        Stages {
            start: Some(Instant::now()),
            ..Default::default()
        }
    }

    /// Step `k` of one pipeline has just finished.
    fn done(&self, k: usize) {
        if let (Some(start), Ok(mut done)) = (self.start, self.done.lock()) {
            done[k] = done[k].max(start.elapsed());
        }
    }

    /// The three times, named.
    fn line(&self, names: [&str; 3]) -> String {
        let done = self.done.lock().map(|d| *d).unwrap_or_default();
        let parts: Vec<_> = names
            .iter()
            .zip(done)
            .map(|(n, d)| format!("{n} {:.0} ms", ms(d)))
            .collect();
        format!("last {}", parts.join(", "))
    }
}

async fn pipeline(
    mut client: Client,
    pool: String,
    name: String,
    i: usize,
    stages: std::sync::Arc<Stages>,
) -> Result<()> {
    let volume_id = format!("{pool}/{name}");
    client
        .create_volume(pb::CreateVolumeRequest {
            volume_id: volume_id.clone(),
            backend_type: pb::BackendType::ZfsZvol as i32,
            capacity_bytes: SIZE,
            fence: fence(i),
            zfs_properties: [("sparse".to_owned(), "true".to_owned())].into(),
            ..Default::default()
        })
        .await?;
    stages.done(0);
    client
        .export_volume(pb::ExportVolumeRequest {
            volume_id: volume_id.clone(),
            backend_type: pb::BackendType::ZfsZvol as i32,
            protocol_type: pb::ProtocolType::NvmeofTcp as i32,
            fence: fence(i),
            acl_enabled: true,
            allowed_initiators: vec![],
            chap: None,
        })
        .await?;
    stages.done(1);
    client
        .allow_initiator(pb::AllowInitiatorRequest {
            volume_id,
            protocol_type: pb::ProtocolType::NvmeofTcp as i32,
            initiator_id: HOST.into(),
            fence: fence(i),
        })
        .await?;
    stages.done(2);
    Ok(())
}

/// The floor of one pipeline: a sparse zvol made by `lzc_create`, its
/// device node waited for as the agent waits (udev's event, asked for again
/// when udev dropped it, as it does with many zvols at once), and its
/// NVMe/TCP export with the ACL written to configfs directly, no reads, no
/// checks. With `reads`, the same with the agent's own reads and writes
/// around it (see [`AgentReads`]).
fn floor_pipeline(
    bare: &BareCalls,
    zfs: &Zfs,
    (dataset, nqn, port): (&str, &str, u16),
    stages: &Stages,
    reads: Option<&AgentReads>,
) -> Result<()> {
    let name = DatasetName::new(dataset)?;
    if let Some(reads) = reads {
        reads.before_create(zfs, &name)?;
    }
    bare.create_zvol(dataset, SIZE, None)?;
    stages.done(0);
    let device = match reads {
        None => zfs.wait_device(&name, DEVICE_WAIT)?,
        Some(reads) => reads.pin_beside_wait(zfs, &name)?,
    };
    stages.done(1);
    if let Some(reads) = reads {
        reads.identity_read(zfs, &name)?;
    }
    let device = device.display();
    let sub = format!("{NVMET}/subsystems/{nqn}");
    std::fs::create_dir(&sub)?;
    std::fs::create_dir(format!("{sub}/namespaces/1"))?;
    std::fs::write(
        format!("{sub}/namespaces/1/device_path"),
        device.to_string(),
    )?;
    write_restarting(Path::new(&format!("{sub}/namespaces/1/enable")), "1")?;
    let host = format!("{NVMET}/hosts/{HOST}");
    match std::fs::create_dir(&host) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e.into()),
        _ => {}
    }
    std::os::unix::fs::symlink(&host, format!("{sub}/allowed_hosts/{HOST}"))?;
    std::os::unix::fs::symlink(&sub, format!("{NVMET}/ports/{port}/subsystems/{nqn}"))?;
    if let Some(reads) = reads {
        // ExportVolume's mark, then AllowInitiator's identity read and mark.
        reads.mark(&name)?;
        reads.identity_read(zfs, &name)?;
        reads.mark(&name)?;
    }
    stages.done(2);
    Ok(())
}

/// Removes what the floor's run `prefix` made: its subsystems, then its
/// zvols.
fn remove_floor_run(bare: &BareCalls, dataset: &str, prefix: &str) -> Result<()> {
    let subsystems = (0..PIPELINE)
        .map(|i| nvmet::Nqn::new(&bench_nqn(prefix, i)))
        .collect::<std::result::Result<_, _>>()?;
    nvmet::Nvmet::open()?.teardown(&nvmet::Teardown {
        subsystems,
        ..Default::default()
    })?;
    run("udevadm", &["settle"])?;
    for i in 0..PIPELINE {
        let zvol = format!("{dataset}/{prefix}{i}");
        // udev may still hold a zvol it was told about a moment ago.
        let mut tries = 0;
        while let Err(e) = bare.destroy(&zvol) {
            tries += 1;
            if e.raw_os_error() != Some(EBUSY) || tries == 50 {
                return Err(format!("destroying {zvol}: {e}").into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(())
}

/// The NQN of the bench's subsystem for volume `i` of the run `way`.
fn bench_nqn(way: &str, i: usize) -> String {
    format!("nqn.2026-01.com.bhyoo.pillar-csi.bench:{way}{i}")
}

/// The errno of a zvol still open.
const EBUSY: i32 = 16;

/// How long a device node may take, as the agent allows.
const DEVICE_WAIT: Duration = Duration::from_secs(90);

/// The kernel reads and durable writes the agent makes for one pipeline,
/// made bare beside the floor's work, so that a run tells what they cost
/// from what the agent adds above them: the read that finds no zvol under
/// the name before the create, the new zvol's GUID read beside the wait for
/// its device node (the identity pin), the identity read of ExportVolume
/// and of AllowInitiator, and four fence marks (the intent, the create, the
/// export, the allow), written by the agent's own mark store.
struct AgentReads {
    marks: MarkStore,
}

impl AgentReads {
    fn new(marks: &Path) -> Result<Self> {
        Ok(Self {
            marks: MarkStore::open(marks)?,
        })
    }

    /// The read that finds no zvol there yet, and the intent's mark.
    fn before_create(&self, zfs: &Zfs, name: &DatasetName) -> Result<()> {
        match zfs.volume_guid(name) {
            Err(sys::zfs::Error::NotFound { .. }) => self.mark(name),
            Ok(_) => Err(format!("{name} is there before its create").into()),
            Err(e) => Err(e.into()),
        }
    }

    /// The GUID read beside the wait for the device node, and the create's mark.
    fn pin_beside_wait(&self, zfs: &Zfs, name: &DatasetName) -> Result<std::path::PathBuf> {
        let (guid, device) = std::thread::scope(|s| {
            let guid = s.spawn(|| zfs.volume_guid(name));
            let device = zfs.wait_device(name, DEVICE_WAIT);
            (guid.join(), device)
        });
        guid.map_err(|_| "a GUID read panicked")??;
        self.mark(name)?;
        Ok(device?)
    }

    /// A later call's identity read (ExportVolume's, AllowInitiator's).
    fn identity_read(&self, zfs: &Zfs, name: &DatasetName) -> Result<()> {
        zfs.volume_guid(name)?;
        Ok(())
    }

    /// One durable mark of the volume `name`.
    fn mark(&self, name: &DatasetName) -> Result<()> {
        Ok(self.marks.save(&FenceMark::new(name.as_ref()))?)
    }
}

/// How many transaction groups created the zvols `{dataset}/{prefix}0..`
/// of one run.
fn txgs(zfs: &Zfs, dataset: &str, prefix: &str) -> Result<usize> {
    let mut groups = std::collections::BTreeSet::new();
    for i in 0..PIPELINE {
        let name = DatasetName::new(&format!("{dataset}/{prefix}{i}"))?;
        groups.insert(zfs.property(&name, "createtxg")?.unwrap_or_default());
    }
    Ok(groups.len())
}

/// The configfs writes of one NVMe/TCP export with an ACL, as a script would make them.
fn export_script(s: &mut String, nqn: &str, device: &str, port: u16) -> Result<()> {
    let n = NVMET;
    writeln!(
        s,
        "mkdir {n}/subsystems/{nqn} {n}/subsystems/{nqn}/namespaces/1"
    )?;
    writeln!(
        s,
        "echo -n {device} > {n}/subsystems/{nqn}/namespaces/1/device_path"
    )?;
    // Again while the kernel answers ERESTARTSYS (a new zvol's first open
    // waits for ZFS's namespace lock), for up to 10 s.
    writeln!(
        s,
        "t=0; until echo 1 > {n}/subsystems/{nqn}/namespaces/1/enable; do t=$((t+1)); [ $t -lt 500 ] || exit 1; sleep 0.02; done"
    )?;
    writeln!(s, "mkdir -p {n}/hosts/{HOST}")?;
    writeln!(
        s,
        "ln -s {n}/hosts/{HOST} {n}/subsystems/{nqn}/allowed_hosts/{HOST}"
    )?;
    writeln!(
        s,
        "ln -s {n}/subsystems/{nqn} {n}/ports/{port}/subsystems/{nqn}"
    )?;
    Ok(())
}

/// One peer's whole pipeline for one volume, as one `bash`: `zfs create
/// -V`, a wait for the device node (asking udev again when it lost it), the
/// configfs writes.
fn peer_command(dataset: &str, nqn: &str, port: u16) -> Result<Command> {
    let device = format!("/dev/zvol/{dataset}");
    // udev loses some zvols' links when many appear at once: a peer that
    // still has no link after 3 s waits for udev's queue to empty, and if
    // the link is still missing, asks udev again for each zvol disk that no
    // `/dev/zvol` link names (as the agent does). When each of fifty peers
    // asked again for every zvol, udev's queue did not empty within the
    // minute and the peers' run failed. The last wait judges.
    let mut s = format!(
        "set -e\nzfs create -s -V 1M {dataset}\n\
         udevadm wait --timeout=3 {device} || {{ udevadm settle --timeout=60 || true; \
         udevadm wait --timeout=1 {device} || {{ \
         linked=$(find /dev/zvol -type l -printf '%l\\n' | sed 's#.*/##'); \
         for d in /sys/class/block/zd*; do n=${{d##*/}}; [[ $n == *p* ]] && continue; \
         grep -qx \"$n\" <<<\"$linked\" || udevadm trigger --action=change \"$d\"; done; }}; \
         udevadm wait --timeout=60 {device}; }}\n"
    );
    export_script(&mut s, nqn, &device, port)?;
    Ok(bash_command(&s))
}

fn port_script(s: &mut String, port: u16, tcp: u16) -> Result<()> {
    let p = format!("{NVMET}/ports/{port}");
    writeln!(
        s,
        "mkdir {p}; echo tcp > {p}/addr_trtype; echo ipv4 > {p}/addr_adrfam"
    )?;
    writeln!(
        s,
        "echo 127.0.0.1 > {p}/addr_traddr; echo {tcp} > {p}/addr_trsvcid"
    )?;
    Ok(())
}

/// The sums, over the agent's log lines of `message` for the volumes whose
/// name starts with `prefix`, of `part` (the backend's or configfs's work)
/// and `total_ms` (the whole RPC inside the agent).
fn log_sums(log: &str, message: &str, prefix: &str, part: &str) -> (u64, u64, usize) {
    let field = |line: &str, key: &str| -> u64 {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{key}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let mut sums = (0, 0, 0);
    for line in log.lines().filter(|l| l.contains(message)) {
        let ours = line.split_whitespace().any(|w| {
            w.strip_prefix("volume=")
                .and_then(|v| v.rsplit('/').next())
                .is_some_and(|n| n.starts_with(prefix))
        });
        if ours {
            sums.0 += field(line, part);
            sums.1 += field(line, "total_ms");
            sums.2 += 1;
        }
    }
    sums
}

#[tokio::main]
async fn main() -> Result<()> {
    if !pillar_csi_lab::bench::selected("agent_pipeline") {
        return Ok(());
    }
    let lab = Lab::get();
    let parent = ZfsParent::create(&lab, "bench-agent")?;
    let mut config = AgentConfig::new(&lab, "bench", vec![parent.backend()], 4450, 3270)?;
    // No periodic resync: it would put back what the bench empties between steps.
    config.resync_interval_seconds = Some(0);
    // The fence marks on the guest's own filesystem, where the agent keeps
    // them in production (/var/lib/pillar-csi), not on the 9p share of the
    // lab's work folder, whose fsyncs cost tens of milliseconds when the
    // host is busy.
    config.state_dir = std::path::PathBuf::from("/var/lib/pillar-csi/bench-agent");
    std::fs::create_dir_all(&config.state_dir)?;
    // Its log there too, for the same reason (in production it goes to a
    // pipe); copied to the work folder at the end.
    let kept_log = std::mem::replace(
        &mut config.log,
        std::path::PathBuf::from("/var/lib/pillar-csi/bench-agent.log"),
    );
    let mut agent = AgentProcess::start(config).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle_kib = agent.pid().map(rss_kib).transpose()?.unwrap_or(0);

    println!("agent_pipeline: {}", conditions());

    // 1. The pipeline through the agent: all at once, then one at a time.
    let mut client = agent.client().await?;
    let agent_pid = agent.pid().ok_or("the agent has no process")?.to_string();
    let agent_cpu = cpu_seconds(&agent_pid)?;
    let start = Instant::now();
    let agent_stages = std::sync::Arc::new(Stages::starting());
    let tasks: Vec<_> = (0..PIPELINE)
        .map(|i| {
            tokio::spawn(pipeline(
                client.clone(),
                parent.pool.clone(),
                format!("c{i}"),
                i,
                agent_stages.clone(),
            ))
        })
        .collect();
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    let concurrent = start.elapsed();
    let agent_cpu = cpu_seconds(&agent_pid)? - agent_cpu;
    let start = Instant::now();
    for i in 0..PIPELINE {
        pipeline(
            client.clone(),
            parent.pool.clone(),
            format!("s{i}"),
            PIPELINE + i,
            Default::default(),
        )
        .await?;
    }
    let sequential = start.elapsed();

    // The floor, in-process on its own port: at once, then one at a time.
    let mut setup = String::from("set -e\n");
    port_script(&mut setup, 41, 4452)?;
    port_script(&mut setup, 40, 4451)?;
    bash(&setup)?;
    let bare = BareCalls::open()?;
    let zfs = Zfs::open()?;
    let dataset = parent.dataset();
    let agent_reads = AgentReads::new(Path::new("/var/lib/pillar-csi/bench-floor"))?;
    let floor_one = |way: &str, i: usize, stages: &Stages, reads: Option<&AgentReads>| {
        floor_pipeline(
            &bare,
            &zfs,
            (&format!("{dataset}/{way}{i}"), &bench_nqn(way, i), 41),
            stages,
            reads,
        )
    };
    // The CPU time of this process (its threads do the floor's work) while
    // `work` runs.
    let with_cpu = |work: &dyn Fn() -> Result<Duration>| -> Result<(Duration, f64)> {
        let before = cpu_seconds("self")?;
        let took = work()?;
        Ok((took, cpu_seconds("self")? - before))
    };
    run("udevadm", &["settle"])?;
    let floor_stages = Stages::starting();
    let (floor_concurrent, floor_cpu) = with_cpu(&|| {
        Ok(threads_at_once(PIPELINE, |i| floor_one("fc", i, &floor_stages, None))?.0)
    })?;
    run("udevadm", &["settle"])?;
    let reads_stages = Stages::starting();
    let (reads_concurrent, reads_cpu) = with_cpu(&|| {
        Ok(threads_at_once(PIPELINE, |i| {
            floor_one("fr", i, &reads_stages, Some(&agent_reads))
        })?
        .0)
    })?;
    let reads_txgs = txgs(&zfs, &dataset, "fr")?;
    // The runs after this one find the zvols and subsystems they found
    // before it was added (the peers' processes, whose udev retriggers and
    // settles go through every zvol, were much slower in two runs that
    // followed it with its zvols left in place).
    remove_floor_run(&bare, &dataset, "fr")?;
    run("udevadm", &["settle"])?;
    let start = Instant::now();
    for i in 0..PIPELINE {
        floor_one("fs", i, &Stages::default(), None)?;
    }
    let floor_sequential = start.elapsed();

    // The agent's and the floor's figures, printed before the peers run so
    // that a run whose peers fail (their udev waits time out when fifty
    // bash pipelines create zvols at once) still tells them.
    println!(
        "agent_pipeline: {PIPELINE} x (create zvol + export NVMe/TCP with ACL + allow initiator)"
    );
    let line = |what: &str, at_once: Duration, one_by_one: Duration| {
        println!(
            "  {what:<44} all at once {:8.1} ms ({:6.1} ms/volume), one at a time {:8.1} ms ({:6.1} ms/volume)",
            ms(at_once),
            ms(at_once) / PIPELINE as f64,
            ms(one_by_one),
            ms(one_by_one) / PIPELINE as f64
        )
    };
    line("agent (gRPC)", concurrent, sequential);
    line(
        "floor (bare calls, in-process)",
        floor_concurrent,
        floor_sequential,
    );
    println!(
        "  at once, agent: {}; {} txgs",
        agent_stages.line(["CreateVolume", "ExportVolume", "AllowInitiator"]),
        txgs(&zfs, &dataset, "c")?
    );
    println!(
        "  at once, floor: {}; {} txgs",
        floor_stages.line(["lzc_create", "device node", "configfs"]),
        txgs(&zfs, &dataset, "fc")?
    );
    println!(
        "  at once, floor with the agent's reads and marks: {:.1} ms; {}; {} txgs",
        ms(reads_concurrent),
        reads_stages.line(["lzc_create", "device node and GUID", "configfs"]),
        reads_txgs
    );
    println!(
        "  at once, CPU time used: agent process {agent_cpu:.2} s, floor {floor_cpu:.2} s, floor with the agent's reads and marks {reads_cpu:.2} s"
    );
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!(
        "  agent against the floor: all at once {:.2}x, one at a time {:.2}x",
        ratio(concurrent, floor_concurrent),
        ratio(sequential, floor_sequential)
    );
    println!(
        "  agent against the floor with its reads and marks: all at once {:.2}x; those reads and marks against the bare floor {:.2}x",
        ratio(concurrent, reads_concurrent),
        ratio(reads_concurrent, floor_concurrent)
    );
    // What the agent adds above its backend and configfs work, from its
    // own log of the requests made one at a time.
    let log = agent.log();
    for (rpc, message, part) in [
        ("CreateVolume", "volume created", "backend_ms"),
        ("ExportVolume", "volume exported", "apply_ms"),
        ("AllowInitiator", "initiator access changed", "apply_ms"),
    ] {
        let (work, total, n) = log_sums(&log, message, "s", part);
        println!(
            "  {rpc:<15} one at a time, in the agent: {} of {n}: work {:.1} ms/op, whole RPC {:.1} ms/op: +{:.1}% above the work",
            part.trim_end_matches("_ms"),
            work as f64 / n.max(1) as f64,
            total as f64 / n.max(1) as f64,
            (total as f64 / work.max(1) as f64 - 1.0) * 100.0
        );
    }

    // The peers, one bash per volume: at once, then one at a time.
    let peer =
        |way: &str, i: usize| peer_command(&format!("{dataset}/{way}{i}"), &bench_nqn(way, i), 40);
    run("udevadm", &["settle"])?;
    let commands = (0..PIPELINE)
        .map(|i| peer("pc", i))
        .collect::<Result<Vec<_>>>()?;
    let peers_concurrent = processes_at_once(commands)?;
    run("udevadm", &["settle"])?;
    let mut peers_sequential = Duration::ZERO;
    for i in 0..PIPELINE {
        peers_sequential += processes_at_once(vec![peer("ps", i)?])?;
    }
    line(
        "peers (bash: zfs create -V, configfs)",
        peers_concurrent,
        peers_sequential,
    );
    println!("  at once, peers: {} txgs", txgs(&zfs, &dataset, "pc")?);
    let at_once = ratio(peers_concurrent, concurrent);
    println!(
        "  peers against the agent: all at once {at_once:.3}x (goal >= {AT_ONCE_GOAL}x), one at a time {:.2}x",
        ratio(peers_sequential, sequential)
    );
    println!("agent_pipeline: {}", conditions());
    empty_nvmet()?;

    // 2. Restart reconciliation at half and all of RESTART exports.
    let mut volumes = 2 * PIPELINE;
    let mut restart = Vec::new();
    for target in [RESTART / 2, RESTART] {
        let tasks: Vec<_> = (volumes..target.max(volumes))
            .map(|i| {
                tokio::spawn(pipeline(
                    client.clone(),
                    parent.pool.clone(),
                    format!("r{i}"),
                    10_000 + i,
                    Default::default(),
                ))
            })
            .collect();
        for t in tasks {
            t.await.map_err(|e| e.to_string())??;
        }
        volumes = volumes.max(target);
        // Every volume the agent made has a mark with its export.
        let exports = volumes;
        agent.kill()?;
        empty_nvmet()?;
        let start = Instant::now();
        agent.restart().await?;
        let took = start.elapsed();
        // The restarted agent listens on a new port.
        client = agent.client().await?;
        let back = nvmet::Nvmet::open()?.read()?.subsystems.len();
        if back != exports {
            return Err(format!("restart re-created {back} of {exports} exports").into());
        }
        // The same state written directly.
        empty_nvmet()?;
        let mut s = String::from("set -e\n");
        port_script(&mut s, 1, 4450)?;
        for i in 0..exports {
            export_script(
                &mut s,
                &format!("nqn.2026-01.com.bhyoo.pillar-csi.bench:d{i}"),
                &format!("/dev/zvol/{}/c0", parent.dataset()),
                1,
            )?;
        }
        let direct = bash(&s)?;
        empty_nvmet()?;
        restart.push((exports, took, direct));
    }
    println!("agent_pipeline: restart reconciliation (kill -9, configfs emptied, agent started until it answers)");
    for (n, took, direct) in &restart {
        println!(
            "  {n:4} exports: agent {:9.1} ms ({:.2} ms/export); direct shell writes {:9.1} ms ({:.2} ms/export); agent/direct {:.2}x",
            ms(*took),
            ms(*took) / *n as f64,
            ms(*direct),
            ms(*direct) / *n as f64,
            ms(*took) / ms(*direct)
        );
    }
    if let [(n1, t1, _), (n2, t2, _)] = restart.as_slice() {
        println!(
            "  linearity: time ratio {:.2} for {:.2}x the exports",
            ms(*t2) / ms(*t1),
            *n2 as f64 / *n1 as f64
        );
    }
    println!(
        "agent_pipeline: idle resident memory {:.1} MiB",
        idle_kib as f64 / 1024.0
    );
    agent.kill()?;
    std::fs::write(&kept_log, agent.log())?;
    if at_once < AT_ONCE_GOAL {
        return Err(format!(
            "the agent with {PIPELINE} at once is {at_once:.3}x the peers' processes at once, goal {AT_ONCE_GOAL}x"
        )
        .into());
    }
    Ok(())
}
