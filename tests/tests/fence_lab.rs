//! Fencing reaches the data path: when the agent takes an initiator's access
//! away, the initiator's live connection ends before the RPC returns, its
//! later writes fail and never reach the volume, and initiators still
//! allowed go on (over NVMe/TCP after a reconnect). The initiators are the
//! kernel NVMe/TCP host and open-iscsi in the lab guest, playing two
//! machines with two host NQNs or two initiator names; the witness of what
//! landed is the zvol read on the storage side.
//!
//! Run with `tests/lab/run tests -- fence_`. Measured pauses are appended to
//! `fence-measurements.txt` in the lab's work folder.
use pillar_csi_lab::{
    agent::{pb, AgentConfig, AgentProcess, Client, ZfsParent},
    block::{pattern, read_at, write_at},
    iscsi::{Iface, Session},
    mount::Mounted,
    nvme::Connection,
    Lab, Result,
};
use std::{
    fs,
    io::Write,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        mpsc, Arc,
    },
    thread,
    time::{Duration, Instant},
};

/// The agent's NVMe/TCP and iSCSI ports, the same as the other agent lab
/// tests use (the agent's nvmet port 1 keeps one address across tests).
const NVME_PORT: u16 = 4430;
const ISCSI_PORT: u16 = 3270;
const AGENT_NVMET_PORT: nvmet::PortId = nvmet::PortId(1);
const ZVOL: i32 = pb::BackendType::ZfsZvol as i32;
const NVME: i32 = pb::ProtocolType::NvmeofTcp as i32;
const ISCSI: i32 = pb::ProtocolType::Iscsi as i32;
const BLOCK: usize = 4096;
/// Where host A writes block after block (host B's filesystem, when there
/// is one, takes the first 32 MiB of the 64 MiB volume).
const A_REGION: u64 = 40 << 20;
/// Where single checked writes go.
const PROBE: u64 = 60 << 20;
/// How long a cut-off host may take to see its writes fail, and a still
/// allowed host to be served again (its reconnect delay is 10 s; the lab's
/// emulated CPU is slow).
const SETTLE: Duration = Duration::from_secs(150);

fn fence(uid: &str, generation: u64) -> Option<pb::FenceToken> {
    Some(pb::FenceToken {
        volume_uid: uid.to_owned(),
        generation,
    })
}

fn host_nqn(lab: &Lab, name: &str) -> String {
    format!("nqn.2026-01.com.bhyoo.pillar-csi.lab:{}", lab.unique(name))
}

fn initiator_iqn(lab: &Lab, name: &str) -> String {
    format!("iqn.2003-01.org.example.lab:{}", lab.unique(name))
}

/// One zvol made through a fresh agent, and the means to change its export.
struct Fixture {
    _parent: ZfsParent,
    agent: AgentProcess,
    c: Client,
    id: String,
    uid: String,
    /// The zvol on the storage side: the witness of what landed.
    zvol: PathBuf,
}

impl Fixture {
    async fn new(lab: &Lab, name: &str) -> Result<Self> {
        assert_eq!(
            fs::read_to_string("/sys/module/nvme_core/parameters/multipath")?.trim(),
            "N",
            "the lab guest loads nvme_core with multipath=N, so each host NQN has its own disk"
        );
        let parent = ZfsParent::create(lab, name)?;
        let config = AgentConfig::new(
            lab,
            &lab.unique(name),
            vec![parent.backend()],
            NVME_PORT,
            ISCSI_PORT,
        )?;
        let agent = AgentProcess::start(config).await?;
        let mut c = agent.client().await?;
        let uid = lab.unique("uid");
        let id = format!("{}/{}", lab.pool, lab.unique("vol"));
        let zvol = c
            .create_volume(pb::CreateVolumeRequest {
                volume_id: id.clone(),
                backend_type: ZVOL,
                capacity_bytes: 64 << 20,
                fence: fence(&uid, 1),
                ..Default::default()
            })
            .await?
            .into_inner()
            .device_path
            .into();
        Ok(Self {
            _parent: parent,
            agent,
            c,
            id,
            uid,
            zvol,
        })
    }

    /// ExportVolume with an ACL of `initiators`, or any initiator when `None`.
    async fn export(
        &mut self,
        protocol: i32,
        initiators: Option<&[&str]>,
        generation: u64,
    ) -> Result<String> {
        Ok(self
            .c
            .export_volume(pb::ExportVolumeRequest {
                volume_id: self.id.clone(),
                backend_type: ZVOL,
                protocol_type: protocol,
                fence: fence(&self.uid, generation),
                acl_enabled: initiators.is_some(),
                allowed_initiators: initiators
                    .unwrap_or_default()
                    .iter()
                    .map(|s| (*s).to_owned())
                    .collect(),
                chap: None,
            })
            .await?
            .into_inner()
            .target_id)
    }

    async fn deny(&mut self, protocol: i32, initiator: &str, generation: u64) -> Result<()> {
        self.c
            .deny_initiator(pb::DenyInitiatorRequest {
                volume_id: self.id.clone(),
                protocol_type: protocol,
                initiator_id: initiator.to_owned(),
                fence: fence(&self.uid, generation),
            })
            .await?;
        Ok(())
    }

    async fn allow(&mut self, protocol: i32, initiator: &str, generation: u64) -> Result<()> {
        self.c
            .allow_initiator(pb::AllowInitiatorRequest {
                volume_id: self.id.clone(),
                protocol_type: protocol,
                initiator_id: initiator.to_owned(),
                fence: fence(&self.uid, generation),
            })
            .await?;
        Ok(())
    }

    async fn delete(mut self, generation: u64) -> Result<()> {
        self.c
            .delete_volume(pb::DeleteVolumeRequest {
                volume_id: self.id.clone(),
                backend_type: ZVOL,
                fence: fence(&self.uid, generation),
            })
            .await?;
        Ok(())
    }
}

/// Runs `f` on a thread and waits up to `limit` for its result (a write
/// to a host whose controller is reconnecting blocks until it gives up).
fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .map_err(|_| format!("{what} did not finish within {limit:?}").into())
}

/// How long a write of a cut-off host may stay held by the host (it
/// reconnects until `ctrl_loss_tmo` when the target no longer serves the
/// subsystem at all) before the test gives up on the host's side.
const HOLD: Duration = Duration::from_secs(40);

/// A write issued by a host that was cut off must fail, or stay held by the
/// host and fail once `give_up` (deleting the host's controller) runs; its
/// bytes must not be on the volume, and the host cannot read. Returns how
/// long the host took to fail it by itself, if it did.
fn assert_cut_off(
    dev: &Path,
    zvol: &Path,
    seed: u64,
    who: &str,
    give_up: impl FnOnce(),
) -> Result<Option<Duration>> {
    let start = Instant::now();
    let data = pattern(seed, BLOCK);
    let (d, w) = (dev.to_path_buf(), data.clone());
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(write_at(&d, PROBE, &w).map_err(|e| e.to_string()));
    });
    let (written, took) = match rx.recv_timeout(HOLD) {
        Ok(r) => (r, Some(start.elapsed())),
        Err(_) => {
            assert!(
                read_at(zvol, PROBE, BLOCK)? != data,
                "{who}'s held write landed on the volume"
            );
            give_up();
            let r = rx
                .recv_timeout(SETTLE)
                .map_err(|_| format!("{who}'s held write outlived its controller"))?;
            (r, None)
        }
    };
    assert!(
        written.is_err(),
        "{who} wrote to the volume after its access was taken away"
    );
    assert!(
        read_at(zvol, PROBE, BLOCK)? != data,
        "{who}'s write after the cut-off landed on the volume"
    );
    assert!(
        read_at(dev, 0, BLOCK).is_err(),
        "{who} still reads the volume after its access was taken away"
    );
    Ok(took)
}

/// Waits until every controller this kernel holds for subsystem `nqn` is
/// live or gone. The lab plays several machines with one kernel, which
/// refuses a new controller whose ID duplicates one of its controllers
/// still reconnecting to the same subsystem; the target hands out the IDs
/// that a cut-off freed. Separate machines do not meet this.
fn wait_settled(nqn: &str) -> Result<()> {
    let start = Instant::now();
    loop {
        let mut busy = Vec::new();
        for entry in fs::read_dir("/sys/class/nvme")? {
            let dir = entry?.path();
            let read = |f: &str| {
                fs::read_to_string(dir.join(f))
                    .map(|s| s.trim().to_owned())
                    .unwrap_or_default()
            };
            let state = read("state");
            if read("subsysnqn") == nqn && !state.is_empty() && state != "live" {
                busy.push(format!("{}: {state}", dir.display()));
            }
        }
        if busy.is_empty() {
            return Ok(());
        }
        if start.elapsed() > SETTLE {
            return Err(format!("controllers of {nqn} did not settle: {busy:?}").into());
        }
        thread::sleep(Duration::from_millis(200));
    }
}

/// A write by a host still allowed lands (after its reconnect, if any).
fn assert_served(dev: &Path, zvol: &Path, seed: u64, who: &str) -> Result<()> {
    let data = pattern(seed, BLOCK);
    let (d, w) = (dev.to_path_buf(), data.clone());
    within(SETTLE, &format!("{who}'s write"), move || {
        write_at(&d, PROBE + BLOCK as u64, &w).map_err(|e| e.to_string())
    })?
    .map_err(|e| format!("{who}, still allowed, could not write: {e}"))?;
    assert!(
        read_at(zvol, PROBE + BLOCK as u64, BLOCK)? == data,
        "{who}'s write did not land on the volume"
    );
    Ok(())
}

/// One write of a [`RawWriter`].
#[derive(Debug)]
struct RawWrite {
    start: Instant,
    offset: u64,
    seed: u64,
    ok: bool,
}

/// Writes block after block of a raw device (each flushed) until a write
/// fails or it is stopped.
struct RawWriter {
    progress: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    done: mpsc::Receiver<Vec<RawWrite>>,
}

impl RawWriter {
    fn start(dev: PathBuf, base: u64, seed: u64) -> Self {
        let progress = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, done) = mpsc::channel();
        let (p, s) = (progress.clone(), stop.clone());
        thread::spawn(move || {
            let mut log = Vec::new();
            for i in 0..(16 << 20) / BLOCK as u64 {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                let (offset, seed) = (base + i * BLOCK as u64, seed + i);
                let start = Instant::now();
                let ok = write_at(&dev, offset, &pattern(seed, BLOCK)).is_ok();
                log.push(RawWrite {
                    start,
                    offset,
                    seed,
                    ok,
                });
                p.fetch_add(1, Ordering::SeqCst);
                if !ok {
                    break;
                }
            }
            let _ = tx.send(log);
        });
        Self {
            progress,
            stop,
            done,
        }
    }

    /// The log, once the writer ended by itself (a failed write).
    fn ended(self) -> Result<Vec<RawWrite>> {
        let log = self
            .done
            .recv_timeout(SETTLE)
            .map_err(|_| format!("the cut-off host's writes went on for {SETTLE:?}"))?;
        self.stop.store(true, Ordering::SeqCst);
        Ok(log)
    }
}

/// Checks a cut-off writer's log against the volume: its writes ended with
/// a failure, every acknowledged write is on the volume, and none it began
/// after `cut` is.
fn check_landed(zvol: &Path, log: &[RawWrite], cut: Instant) -> Result<()> {
    assert!(
        log.last().is_some_and(|w| !w.ok),
        "the cut-off host's writes did not end with a failure"
    );
    for w in log {
        let there = read_at(zvol, w.offset, BLOCK)? == pattern(w.seed, BLOCK);
        if w.ok {
            assert!(there, "an acknowledged write at {} is missing", w.offset);
        }
        if w.start > cut {
            assert!(
                !w.ok && !there,
                "a write begun after the cut-off landed at {}",
                w.offset
            );
        }
    }
    Ok(())
}

/// Appends 4 KiB records to a file, each made durable with fdatasync, and
/// notes when each completed: the I/O of a host that stays allowed.
struct Ticker {
    progress: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    done: mpsc::Receiver<std::result::Result<Vec<Instant>, String>>,
}

impl Ticker {
    fn start(file: PathBuf) -> Self {
        let progress = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, done) = mpsc::channel();
        let (p, s) = (progress.clone(), stop.clone());
        thread::spawn(move || {
            let run = || -> std::result::Result<Vec<Instant>, String> {
                let mut f = fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&file)
                    .map_err(|e| format!("open {}: {e}", file.display()))?;
                let mut times = Vec::new();
                for i in 0u64.. {
                    if s.load(Ordering::SeqCst) {
                        break;
                    }
                    f.write_all(&pattern(i, BLOCK))
                        .and_then(|()| f.sync_data())
                        .map_err(|e| format!("record {i}: {e}"))?;
                    times.push(Instant::now());
                    p.fetch_add(1, Ordering::SeqCst);
                }
                Ok(times)
            };
            let _ = tx.send(run());
        });
        Self {
            progress,
            stop,
            done,
        }
    }

    fn finish(self) -> Result<Vec<Instant>> {
        self.stop.store(true, Ordering::SeqCst);
        Ok(self
            .done
            .recv_timeout(SETTLE)
            .map_err(|_| "the allowed host's writer did not stop")??)
    }
}

/// Waits until `counter` has grown by `by` from `from`, up to `SETTLE`.
fn wait_progress(counter: &AtomicUsize, from: usize, by: usize, what: &str) -> Result<()> {
    let start = Instant::now();
    while counter.load(Ordering::SeqCst) < from + by {
        if start.elapsed() > SETTLE {
            return Err(format!("{what} made no progress within {SETTLE:?}").into());
        }
        thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Checks that `file` holds exactly records `0..n` of a [`Ticker`].
fn check_records(file: &Path, n: usize) -> Result<()> {
    let bytes = fs::read(file)?;
    assert_eq!(bytes.len(), n * BLOCK, "records in {}", file.display());
    for (i, record) in bytes.chunks(BLOCK).enumerate() {
        assert!(
            record == pattern(i as u64, BLOCK),
            "record {i} of the allowed host's file is damaged"
        );
    }
    Ok(())
}

/// The longest pause between two completed records, and the median one.
fn pauses(times: &[Instant]) -> (Duration, Duration) {
    let mut gaps: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).collect();
    gaps.sort();
    (
        gaps.last().copied().unwrap_or_default(),
        gaps.get(gaps.len() / 2).copied().unwrap_or_default(),
    )
}

fn measured(lab: &Lab, line: &str) -> Result<()> {
    let mut f = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(lab.work.join("fence-measurements.txt"))?;
    writeln!(f, "{line}")?;
    Ok(())
}

/// Connects `host` to subsystem `nqn` on the agent's port; a refusal carries
/// the kernel's last NVMe messages.
fn connect(nqn: &str, host: &str) -> Result<Connection> {
    Connection::tcp("127.0.0.1", NVME_PORT, nqn, host).map_err(|e| {
        let log = pillar_csi_lab::run("dmesg", &[]).unwrap_or_default();
        let tail: Vec<&str> = log.lines().filter(|l| l.contains("nvme")).collect();
        format!("{e}; kernel: {:?}", &tail[tail.len().saturating_sub(6)..]).into()
    })
}

/// Whether the agent's nvmet port links subsystem `nqn`.
fn linked(nqn: &str) -> Result<bool> {
    let state = nvmet::Nvmet::open()?.read()?;
    Ok(state.ports.get(&AGENT_NVMET_PORT).is_some_and(|p| {
        p.subsystems
            .contains(&nvmet::Nqn::new(nqn).expect("an NQN"))
    }))
}

fn allowed_hosts(nqn: &str) -> Result<Vec<String>> {
    let state = nvmet::Nvmet::open()?.read()?;
    let sub = state
        .subsystems
        .get(&nvmet::Nqn::new(nqn)?)
        .ok_or_else(|| format!("subsystem {nqn} is missing"))?;
    Ok(sub.allowed_hosts.iter().map(|h| h.to_string()).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn fence_nvme_deny_cuts_off_a_connected_host_and_the_other_carries_on() -> Result<()> {
    let lab = Lab::get();
    let mut v = Fixture::new(&lab, "fence-deny").await?;
    let (a, b) = (host_nqn(&lab, "a"), host_nqn(&lab, "b"));
    let nqn = v.export(NVME, Some(&[&a, &b]), 1).await?;
    let conn_a = connect(&nqn, &a)?;
    let conn_b = connect(&nqn, &b)?;
    let (dev_a, dev_b) = (
        conn_a.own_namespace_device(1)?,
        conn_b.own_namespace_device(1)?,
    );
    assert_ne!(dev_a, dev_b);
    Mounted::mkfs(&dev_b, "32M")?;
    let mnt = Mounted::mount(&dev_b, lab.work.join(lab.unique("mnt-b")), "rw")?;
    let file = mnt.dir.join("records");

    // Both write: A block after block on the raw device, B fsynced records
    // on its filesystem.
    let ticker = Ticker::start(file.clone());
    let writer = RawWriter::start(dev_a.clone(), A_REGION, 1000);
    wait_progress(&writer.progress, 0, 5, "host A")?;
    wait_progress(&ticker.progress, 0, 5, "host B")?;

    let asked = Instant::now();
    v.deny(NVME, &a, 2).await?;
    let cut = Instant::now();
    let rpc = cut - asked;
    let at_cut = ticker.progress.load(Ordering::SeqCst);

    // A: its next write fails and never lands, it cannot read, and it
    // cannot connect again.
    let a_failed_after = assert_cut_off(&dev_a, &v.zvol, 7, "host A", || ())?
        .ok_or("host A's write was held, not failed")?;
    let log = writer.ended()?;
    check_landed(&v.zvol, &log, cut)?;
    assert!(
        Connection::tcp("127.0.0.1", NVME_PORT, &nqn, &a).is_err(),
        "host A connected again after DenyInitiator"
    );

    // B: its records go on after a pause, every one intact.
    wait_progress(&ticker.progress, at_cut, 5, "host B after the cut-off")?;
    let times = ticker.finish()?;
    let (longest, median) = pauses(&times);
    mnt.unmount()?;
    let mnt = Mounted::mount(&dev_b, lab.work.join(lab.unique("mnt-b")), "rw")?;
    check_records(&mnt.dir.join("records"), times.len())?;
    mnt.unmount()?;
    assert_eq!(allowed_hosts(&nqn)?, vec![b.clone()]);
    assert!(linked(&nqn)?, "the subsystem is linked to its port again");
    measured(
        &lab,
        &format!(
            "deny (NVMe/TCP, default host settings): DenyInitiator took {:.2} s; host B (allowed, ext4, fdatasync per 4 KiB record) longest pause {:.2} s over {} records (median gap {} ms), no I/O error; host A's write after the deny failed after {:.2} s",
            rpc.as_secs_f64(),
            longest.as_secs_f64(),
            times.len(),
            median.as_millis(),
            a_failed_after.as_secs_f64()
        ),
    )?;
    drop((conn_a, conn_b));
    v.delete(2).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn fence_nvme_rwo_move_late_writes_of_the_old_host_never_land() -> Result<()> {
    let lab = Lab::get();
    let mut v = Fixture::new(&lab, "fence-move").await?;
    let (a, b) = (host_nqn(&lab, "a"), host_nqn(&lab, "b"));
    let nqn = v.export(NVME, Some(&[&a]), 1).await?;
    let conn_a = connect(&nqn, &a)?;
    let dev_a = conn_a.own_namespace_device(1)?;
    let writer = RawWriter::start(dev_a.clone(), A_REGION, 2000);
    wait_progress(&writer.progress, 0, 5, "host A")?;

    // ControllerUnpublish on A, ControllerPublish on B.
    v.deny(NVME, &a, 2).await?;
    let cut = Instant::now();
    // A late write of A, held by A's host while it tries to reconnect ...
    let late = pattern(8, BLOCK);
    let (d, w) = (dev_a.clone(), late.clone());
    let a_late = thread::spawn(move || write_at(&d, PROBE, &w).map_err(|e| e.to_string()));
    v.allow(NVME, &b, 3).await?;
    // ... then B connects and writes the same block (once A's controller
    // is gone from this kernel, see `wait_settled`).
    wait_settled(&nqn)?;
    let conn_b = connect(&nqn, &b)?;
    let dev_b = conn_b.own_namespace_device(1)?;
    let mine = pattern(9, BLOCK);
    write_at(&dev_b, PROBE, &mine)?;
    let log = writer.ended()?;
    let late_result = within(SETTLE, "host A's late write", move || a_late.join())?
        .map_err(|_| "host A's late write panicked")?;
    assert!(late_result.is_err(), "host A's late write succeeded");
    assert!(
        read_at(&v.zvol, PROBE, BLOCK)? == mine,
        "the block holds something other than B's write"
    );
    check_landed(&v.zvol, &log, cut)?;
    assert_eq!(allowed_hosts(&nqn)?, vec![b.clone()]);
    drop((conn_a, conn_b));
    v.delete(3).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn fence_nvme_export_with_a_narrower_acl_cuts_off_the_hosts_left_out() -> Result<()> {
    let lab = Lab::get();
    let mut v = Fixture::new(&lab, "fence-acl").await?;
    let (a, b) = (host_nqn(&lab, "a"), host_nqn(&lab, "b"));

    // Any host -> an ACL of B: A, connected under "any host", is cut off.
    let nqn = v.export(NVME, None, 1).await?;
    let conn_a = connect(&nqn, &a)?;
    let conn_b = connect(&nqn, &b)?;
    let dev_a = conn_a.own_namespace_device(1)?;
    let dev_b = conn_b.own_namespace_device(1)?;
    v.export(NVME, Some(&[&b]), 1).await?;
    assert_cut_off(&dev_a, &v.zvol, 10, "host A (any host -> ACL)", || ())?;
    assert_served(&dev_b, &v.zvol, 11, "host B")?;
    drop(conn_a);

    // An ACL of A and B -> an ACL of B.
    v.export(NVME, Some(&[&a, &b]), 2).await?;
    let conn_a = connect(&nqn, &a)?;
    let dev_a = conn_a.own_namespace_device(1)?;
    write_at(&dev_a, A_REGION, &pattern(12, BLOCK))?;
    v.export(NVME, Some(&[&b]), 2).await?;
    assert_cut_off(&dev_a, &v.zvol, 13, "host A (ACL -> narrower ACL)", || ())?;
    assert_served(&dev_b, &v.zvol, 14, "host B")?;
    assert_eq!(allowed_hosts(&nqn)?, vec![b.clone()]);
    drop((conn_a, conn_b));
    v.delete(2).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn fence_nvme_reconcile_state_and_unexport_cut_off_connected_hosts() -> Result<()> {
    let lab = Lab::get();
    let mut v = Fixture::new(&lab, "fence-reconcile").await?;
    let (a, b) = (host_nqn(&lab, "a"), host_nqn(&lab, "b"));
    let nqn = v.export(NVME, Some(&[&a, &b]), 1).await?;
    let conn_a = connect(&nqn, &a)?;
    let conn_b = connect(&nqn, &b)?;
    let dev_a = conn_a.own_namespace_device(1)?;
    let dev_b = conn_b.own_namespace_device(1)?;

    // ReconcileState: the controller's desired export leaves A out.
    let reply =
        v.c.reconcile_state(pb::ReconcileStateRequest {
            exports: vec![pb::DesiredExport {
                volume_id: v.id.clone(),
                protocol_type: NVME,
                fence: fence(&v.uid, 2),
                acl_enabled: true,
                allowed_initiators: vec![b.clone()],
                chap: None,
            }],
        })
        .await?
        .into_inner();
    assert_eq!((reply.repaired, reply.refused), (1, Vec::<String>::new()));
    assert_cut_off(&dev_a, &v.zvol, 20, "host A (ReconcileState)", || ())?;
    assert_served(&dev_b, &v.zvol, 21, "host B")?;

    // UnexportVolume: B, the last host, is cut off too.
    v.c.unexport_volume(pb::UnexportVolumeRequest {
        volume_id: v.id.clone(),
        protocol_type: NVME,
        fence: fence(&v.uid, 2),
    })
    .await?;
    // The subsystem is gone: B's host keeps its write until ctrl_loss_tmo
    // (600 s by default) unless its controller is deleted.
    assert_cut_off(&dev_b, &v.zvol, 22, "host B (UnexportVolume)", move || {
        drop(conn_b)
    })?;
    drop(conn_a);
    v.delete(2).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn fence_nvme_restart_cuts_off_a_host_its_mark_denies() -> Result<()> {
    let lab = Lab::get();
    let mut v = Fixture::new(&lab, "fence-restart").await?;
    let (a, b) = (host_nqn(&lab, "a"), host_nqn(&lab, "b"));
    let nqn = v.export(NVME, Some(&[&a, &b]), 1).await?;
    let conn_b = connect(&nqn, &b)?;
    let dev_b = conn_b.own_namespace_device(1)?;

    // The deny is recorded through the agent, which then dies; configfs is
    // put back as it was before the deny and A holds a live controller: the
    // state an agent leaves that recorded a deny without acting on it.
    v.deny(NVME, &a, 2).await?;
    v.agent.kill()?;
    let target = nvmet::Nvmet::open()?;
    // The deny removed A's host object too (no subsystem allowed it any more).
    assert!(!target.tree().exists(&format!("hosts/{a}")));
    target.tree().run(&[
        nvmet::Step::mkdir(format!("hosts/{a}")),
        nvmet::Step::symlink(
            format!("hosts/{a}"),
            format!("subsystems/{nqn}/allowed_hosts/{a}"),
        ),
    ])?;
    wait_settled(&nqn)?;
    let conn_a = connect(&nqn, &a)?;
    let dev_a = conn_a.own_namespace_device(1)?;
    write_at(&dev_a, A_REGION, &pattern(30, BLOCK))?;

    v.agent.restart().await?;
    assert_cut_off(&dev_a, &v.zvol, 31, "host A (restart)", || ())?;
    assert_served(&dev_b, &v.zvol, 32, "host B")?;
    assert_eq!(allowed_hosts(&nqn)?, vec![b.clone()]);
    assert!(
        v.agent.log().contains("controllers cut off"),
        "the agent logs the cut-off"
    );
    v.c = v.agent.client().await?;
    drop((conn_a, conn_b));
    v.delete(2).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn fence_nvme_kill_in_the_middle_of_a_cut_off_never_leaves_the_subsystem_unlinked(
) -> Result<()> {
    let lab = Lab::get();
    let mut v = Fixture::new(&lab, "fence-kill").await?;
    let (a, b) = (host_nqn(&lab, "a"), host_nqn(&lab, "b"));
    let nqn = v.export(NVME, Some(&[&a, &b]), 1).await?;
    let conn_b = connect(&nqn, &b)?;
    let dev_b = conn_b.own_namespace_device(1)?;

    // The steps a DenyInitiator of A takes, planned as the agent plans them.
    let target = nvmet::Nvmet::open()?;
    let present = target.read()?;
    let nqn_t = nvmet::Nqn::new(&nqn)?;
    let mut desired = nvmet::State::default();
    let mut sub = present.subsystems[&nqn_t].clone();
    sub.allowed_hosts.remove(&nvmet::Nqn::new(&a)?);
    desired.subsystems.insert(nqn_t.clone(), sub);
    let mut port = present.ports[&AGENT_NVMET_PORT].clone();
    port.subsystems = [nqn_t.clone()].into();
    desired.ports.insert(AGENT_NVMET_PORT, port);
    let plan = nvmet::plan_apply_revoking(&present, &desired)?;
    assert_eq!(plan.cut_off, vec![(AGENT_NVMET_PORT, nqn_t.clone())]);

    // A kill -9 after each step but the last (a kill before the first or
    // after the last leaves the old or the new state): the agent dies with
    // the RPC unanswered and its mark unchanged, and starts again.
    for k in 1..plan.steps.len() {
        v.agent.kill()?;
        target.tree().run(&plan.steps[..k])?;
        assert!(!linked(&nqn)?, "after step {k} the subsystem is unlinked");
        v.agent.restart().await?;
        assert!(
            linked(&nqn)?,
            "killed after step {k}: the restart did not link the subsystem back"
        );
        let mut hosts = vec![a.clone(), b.clone()];
        hosts.sort();
        assert_eq!(allowed_hosts(&nqn)?, hosts, "killed after step {k}");
        assert_served(&dev_b, &v.zvol, 40 + k as u64, "host B")?;
    }
    // The controller retries the unanswered DenyInitiator.
    v.c = v.agent.client().await?;
    v.deny(NVME, &a, 2).await?;
    assert_eq!(allowed_hosts(&nqn)?, vec![b.clone()]);
    assert!(linked(&nqn)?);
    assert_served(&dev_b, &v.zvol, 49, "host B")?;

    // Real kills (SIGKILL) of the agent while a DenyInitiator runs, at
    // several points of it: whatever the kill hit, the restarted agent
    // serves the subsystem, with the old ACL or the new one (the new one if
    // the RPC was answered).
    let mut both = vec![a.clone(), b.clone()];
    both.sort();
    let mut outcomes = Vec::new();
    for (i, delay) in [0u64, 150, 300, 500, 800].into_iter().enumerate() {
        let generation = 3 + i as u64;
        v.allow(NVME, &a, generation).await?;
        let mut c = v.c.clone();
        let request = pb::DenyInitiatorRequest {
            volume_id: v.id.clone(),
            protocol_type: NVME,
            initiator_id: a.clone(),
            fence: fence(&v.uid, generation),
        };
        let call = tokio::spawn(async move { c.deny_initiator(request).await });
        tokio::time::sleep(Duration::from_millis(delay)).await;
        v.agent.kill()?;
        let answered = call.await?.is_ok();
        v.agent.restart().await?;
        v.c = v.agent.client().await?;
        assert!(
            linked(&nqn)?,
            "killed {delay} ms into DenyInitiator: the subsystem is not linked after the restart"
        );
        let hosts = allowed_hosts(&nqn)?;
        assert!(
            hosts == vec![b.clone()] || (!answered && hosts == both),
            "killed {delay} ms into DenyInitiator (answered: {answered}): allowed hosts {hosts:?}"
        );
        assert_served(&dev_b, &v.zvol, 50 + i as u64, "host B")?;
        outcomes.push(format!(
            "{delay} ms: {}",
            if hosts == both { "old ACL" } else { "new ACL" }
        ));
    }
    measured(
        &lab,
        &format!("kill -9 during DenyInitiator, state after the restart: {outcomes:?}"),
    )?;
    drop(conn_b);
    v.delete(7).await
}

/// Sets the iSCSI session's recovery timeout (`recovery_tmo`, the time the
/// initiator holds I/O of a dropped session) of the session with `target`
/// through `iface`, so a cut-off initiator fails its I/O within the test.
fn short_recovery(target: &str, iface: &str, seconds: u32) -> Result<()> {
    for entry in fs::read_dir("/sys/class/iscsi_session")? {
        let dir = entry?.path();
        let read = |f: &str| {
            fs::read_to_string(dir.join(f))
                .map(|s| s.trim().to_owned())
                .unwrap_or_default()
        };
        if read("targetname") == target && read("ifacename") == iface {
            fs::write(dir.join("recovery_tmo"), seconds.to_string())?;
            return Ok(());
        }
    }
    Err(format!("no iSCSI session with {target} through {iface}").into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn fence_iscsi_acl_changes_end_the_removed_initiators_session() -> Result<()> {
    let lab = Lab::get();
    let mut v = Fixture::new(&lab, "fence-iscsi").await?;
    let (a, b) = (initiator_iqn(&lab, "a"), initiator_iqn(&lab, "b"));
    let iface_a = Iface::new(&lab.unique("fence-a"), &a)?;
    let iface_b = Iface::new(&lab.unique("fence-b"), &b)?;
    // Any initiator first (demo mode).
    let target = v.export(ISCSI, None, 1).await?;
    let portal = format!("127.0.0.1:{ISCSI_PORT}");
    let session_b = Session::login(&target, &portal, Some(&iface_b))?;
    let dev_b = session_b.disk(0)?;

    // Demo mode -> an ACL of B; DenyInitiator of A; an ACL leaving A out.
    let rounds = [
        ("any initiator -> ACL", 50u64),
        ("DenyInitiator", 60),
        ("narrower ACL", 70),
    ];
    for (round, (what, seed)) in rounds.into_iter().enumerate() {
        let session_a = Session::login(&target, &portal, Some(&iface_a))?;
        short_recovery(&target, &iface_a.name, 10)?;
        let dev_a = session_a.disk(0)?;
        assert_ne!(dev_a, dev_b);
        write_at(&dev_a, A_REGION, &pattern(seed, BLOCK))?;
        let writer = RawWriter::start(dev_b.clone(), A_REGION + (1 << 20), seed * 1000);
        wait_progress(&writer.progress, 0, 3, "initiator B")?;
        let asked = Instant::now();
        match round {
            0 => drop(v.export(ISCSI, Some(&[&b]), 1).await?),
            1 => v.deny(ISCSI, &a, 2).await?,
            _ => drop(v.export(ISCSI, Some(&[&b]), 3).await?),
        }
        let rpc = asked.elapsed();
        let at_cut = writer.progress.load(Ordering::SeqCst);
        let a_failed_after = assert_cut_off(&dev_a, &v.zvol, seed + 1, "initiator A", || ())?
            .ok_or("initiator A's write was held, not failed")?;
        // B goes on (after a re-login when the whole TPG was cycled).
        wait_progress(&writer.progress, at_cut, 3, "initiator B")?;
        writer.stop.store(true, Ordering::SeqCst);
        let log = writer
            .done
            .recv_timeout(SETTLE)
            .map_err(|_| "initiator B's writer did not stop")?;
        assert!(
            log.iter().all(|w| w.ok),
            "initiator B saw a failed write ({what})"
        );
        let starts: Vec<Instant> = log.iter().map(|w| w.start).collect();
        let (longest, median) = pauses(&starts);
        assert_served(&dev_b, &v.zvol, seed + 2, "initiator B")?;
        measured(
            &lab,
            &format!(
                "iSCSI {what}: RPC took {:.2} s; initiator B (allowed, raw 4 KiB writes each flushed) longest pause {:.2} s (median {} ms), no failed write; initiator A's write afterwards failed after {:.2} s (recovery_tmo 10 s)",
                rpc.as_secs_f64(),
                longest.as_secs_f64(),
                median.as_millis(),
                a_failed_after.as_secs_f64()
            ),
        )?;
        drop(session_a);
        match round {
            0 => v.allow(ISCSI, &a, 2).await?,
            1 => v.allow(ISCSI, &a, 3).await?,
            _ => {}
        }
    }
    drop(session_b);
    drop((iface_a, iface_b));
    v.delete(3).await
}
