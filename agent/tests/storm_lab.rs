//! A restart storm (issue #15): many exported volumes, initiators connected
//! and writing, and the agent killed with SIGKILL again and again while its
//! start-up reconciliation (a resync of every export) runs. Afterwards
//! every export is as it was, the invariant checker finds nothing new, and
//! no initiator saw a failed write.
//!
//! By default 40 volumes and 4 kills; `PILLAR_STORM_VOLUMES=200
//! PILLAR_STORM_RESTARTS=10` is the size (tests/lab/run passes both
//! into the guest).
// The crash matrix's bed; this test uses part of it.
#[allow(dead_code)]
mod crash_bed;

use crash_bed::{export_request, Bed, Case, ISCSI, ISCSI_PORT, NVME, NVME_PORT, R};
use pillar_csi_lab::{
    agent::{AgentConfig, AgentProcess, ZfsParent},
    block::{pattern, write_at},
    env::Lab,
    iscsi::{Iface, Session},
    nvme::Connection,
};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc,
};
use std::thread;
use std::time::{Duration, Instant};

/// The NVMe/TCP host and the iSCSI initiator the volumes admit.
const HOST: &str = crash_bed::HOST1;
const INITIATOR: &str = crash_bed::INIT1;
/// Volumes with an initiator connected and writing, per protocol.
const WRITERS_PER_PROTOCOL: usize = 2;
const BLOCK: usize = 4096;

fn env_count(name: &str, default: usize) -> R<usize> {
    match std::env::var(name) {
        Ok(v) => Ok(v.parse().map_err(|e| format!("{name}={v:?}: {e}"))?),
        Err(_) => Ok(default),
    }
}

/// What configfs exports, by target: NQN or IQN -> admitted initiators.
fn exports() -> R<BTreeMap<String, BTreeSet<String>>> {
    let mut seen = BTreeMap::new();
    for (nqn, sub) in nvmet::Nvmet::open()?.read()?.subsystems {
        let hosts = sub
            .allowed_hosts
            .iter()
            .map(|h| h.as_str().to_owned())
            .collect();
        seen.insert(nqn.as_str().to_owned(), hosts);
    }
    for (iqn, target) in lio::Lio::open()?.read()?.targets {
        let acls = target
            .tpgs
            .values()
            .flat_map(|t| t.acls.keys().map(|a| a.as_str().to_owned()))
            .collect();
        seen.insert(iqn.as_str().to_owned(), acls);
    }
    Ok(seen)
}

/// A thread writing 4 KiB blocks, each flushed, until stopped; it counts
/// the writes that failed.
struct Writer {
    stop: Arc<AtomicBool>,
    done: thread::JoinHandle<(usize, Vec<String>)>,
}

impl Writer {
    fn start(dev: PathBuf, seed: u64) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let done = thread::spawn(move || {
            let (mut ok, mut failed) = (0, Vec::new());
            let mut i = 0u64;
            while !s.load(Ordering::SeqCst) {
                let offset = (1 << 20) + (i % 1024) * BLOCK as u64;
                match write_at(&dev, offset, &pattern(seed + i, BLOCK)) {
                    Ok(()) => ok += 1,
                    Err(e) => failed.push(e.to_string()),
                }
                i += 1;
                thread::sleep(Duration::from_millis(20));
            }
            (ok, failed)
        });
        Writer { stop, done }
    }

    fn finish(self) -> R<(usize, Vec<String>)> {
        self.stop.store(true, Ordering::SeqCst);
        self.done.join().map_err(|_| "a writer panicked".into())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the kernel lab"]
async fn storm_agent_killed_during_resync_keeps_every_export_and_initiator() -> R {
    let lab = Lab::get();
    let volumes = env_count("PILLAR_STORM_VOLUMES", 40)?;
    let restarts = env_count("PILLAR_STORM_RESTARTS", 4)?;
    let parent = ZfsParent::create(&lab, "storm")?;
    let mut config = AgentConfig::new(
        &lab,
        &lab.unique("storm"),
        vec![parent.backend()],
        NVME_PORT,
        ISCSI_PORT,
    )?;
    // A periodic resync beside the start-up one, so kills land in both.
    config.resync_interval_seconds = Some(2);
    let agent = AgentProcess::start(config).await?;
    let mut bed = Bed {
        lab: lab.clone(),
        parent,
        agent,
        crash_binary: PathBuf::new(),
        baseline: Vec::new(),
        serial: 0,
    };
    bed.baseline = pillar_csi_agent::invariants::check(&bed.observe()?);

    // Every volume exported, even ones over NVMe/TCP, odd ones over iSCSI.
    let started = Instant::now();
    let mut cases: Vec<(Case, i32, String)> = Vec::new();
    let mut client = bed.agent.client().await?;
    for n in 0..volumes {
        let c = bed.case();
        bed.create(&c).await?;
        let (protocol, initiator) = if n % 2 == 0 {
            (NVME, HOST)
        } else {
            (ISCSI, INITIATOR)
        };
        let target = client
            .export_volume(export_request(&c, protocol, &[initiator]))
            .await?
            .into_inner()
            .target_id;
        cases.push((c, protocol, target));
    }
    let setup = started.elapsed();
    let before = exports()?;

    // Initiators on the first volumes of each protocol, writing.
    let iface = Iface::new(&lab.unique("storm"), INITIATOR)?;
    let portal = format!("127.0.0.1:{ISCSI_PORT}");
    let (mut nvme, mut iscsi, mut writers) = (Vec::new(), Vec::new(), Vec::new());
    for (c, protocol, target) in &cases {
        let dev = if *protocol == NVME && nvme.len() < WRITERS_PER_PROTOCOL {
            let conn = Connection::tcp("127.0.0.1", NVME_PORT, target, HOST)?;
            let dev = conn.namespace_device(1)?;
            nvme.push(conn);
            dev
        } else if *protocol == ISCSI && iscsi.len() < WRITERS_PER_PROTOCOL {
            let session = Session::login(target, &portal, Some(&iface))?;
            let dev = session.disk(0)?;
            iscsi.push(session);
            dev
        } else {
            continue;
        };
        writers.push((
            c.id.clone(),
            Writer::start(dev, 1000 * writers.len() as u64),
        ));
    }

    // One full restart first: how long the start-up resync takes.
    let clock = Instant::now();
    bed.agent.restart().await?;
    let full_start = clock.elapsed();
    // Then kills spread over that time, the agent never let finish.
    for k in 1..=restarts {
        bed.agent.restart_unanswered()?;
        tokio::time::sleep(full_start.mul_f64(k as f64 / (restarts + 1) as f64)).await;
    }
    let clock = Instant::now();
    bed.agent.restart().await?;
    let last_start = clock.elapsed();
    // Two periodic resyncs after the storm, still with the initiators on.
    tokio::time::sleep(Duration::from_secs(5)).await;

    let mut failed = Vec::new();
    let mut written = 0;
    for (id, w) in writers {
        let (ok, errors) = w.finish()?;
        written += ok;
        if ok == 0 || !errors.is_empty() {
            failed.push(format!("{id}: {ok} writes, failed: {errors:?}"));
        }
    }
    drop((nvme, iscsi, iface));
    let after = exports()?;
    let violations = bed.violations()?;
    let line = format!(
        "restart storm: {volumes} volumes exported in {:.1} s, {restarts} kills during start-up resync (a full start took {:.1} s, the last {:.1} s), {} initiators wrote {written} blocks, {} failed",
        setup.as_secs_f64(),
        full_start.as_secs_f64(),
        last_start.as_secs_f64(),
        2 * WRITERS_PER_PROTOCOL,
        failed.len()
    );
    std::fs::write(lab.work.join("storm-measurements.txt"), &line)?;
    println!("{line}");

    for (c, _, _) in &cases {
        bed.cleanup(c).await?;
    }
    assert!(failed.is_empty(), "{line}\n{failed:#?}");
    assert!(violations.is_empty(), "{line}\nviolations: {violations:#?}");
    let lost: Vec<_> = before
        .iter()
        .filter(|(k, v)| after.get(*k) != Some(*v))
        .map(|(k, _)| k)
        .collect();
    assert!(
        lost.is_empty(),
        "exports lost or changed by the storm: {lost:?}"
    );
    assert_eq!(before.len(), after.len(), "exports added by the storm");
    Ok(())
}
