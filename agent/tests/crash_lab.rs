//! The crash matrix in the kernel lab: every operation of the agent, killed
//! (SIGKILL) at every crash point it passes (`crate::crash::POINTS`), then
//! restarted with the ordinary binary and the same request repeated as the
//! controller would. After each case the node's invariants hold
//! (`invariants::check` finds nothing new) and the data pattern written
//! before the operation is intact. Prints the matrix (operations × points).
//!
//! Run with `tests/lab/run tests -- crash_`. One parent dataset and one agent
//! state folder serve every case; each case's volume is small and sparse and
//! is deleted (its ended mark removed) before the next case, so start-up
//! reconciliation and the passes it makes are the same for every case.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use pillar_csi_agent::{
    crash,
    invariants::{self, ListedVolume, Observed, Violation},
    marks::{encode, SUFFIX},
};
use pillar_csi_lab::{
    agent::{crash_points_binary, pb, AgentConfig, AgentProcess, ZfsParent},
    block::{pattern, read_at, write_at},
    env::Lab,
    run,
};
use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};
use tonic::Status;

type R<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const NVME_PORT: u16 = 4436;
const ISCSI_PORT: u16 = 3276;
const SIZE: u64 = 8 << 20;
const ZVOL: i32 = pb::BackendType::ZfsZvol as i32;
const NVME: i32 = pb::ProtocolType::NvmeofTcp as i32;
const ISCSI: i32 = pb::ProtocolType::Iscsi as i32;
const HOST1: &str = "nqn.2026-01.org.example.crash:h1";
const HOST2: &str = "nqn.2026-01.org.example.crash:h2";
const INIT1: &str = "iqn.2026-01.org.example.crash:i1";
const INIT2: &str = "iqn.2026-01.org.example.crash:i2";
/// Where the data pattern sits (bytes), and how long it is.
const PATTERN_AT: u64 = 1 << 20;
const PATTERN_LEN: usize = 64 << 10;

/// The operations of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Create,
    Import,
    ExportNvme,
    ExportIscsi,
    AllowNvme,
    DenyNvme,
    AllowIscsi,
    DenyIscsi,
    UnexportNvme,
    UnexportIscsi,
    Expand,
    Delete,
    Release,
    Reconcile,
}

const OPS: [Op; 14] = [
    Op::Create,
    Op::Import,
    Op::ExportNvme,
    Op::ExportIscsi,
    Op::AllowNvme,
    Op::DenyNvme,
    Op::AllowIscsi,
    Op::DenyIscsi,
    Op::UnexportNvme,
    Op::UnexportIscsi,
    Op::Expand,
    Op::Delete,
    Op::Release,
    Op::Reconcile,
];

impl Op {
    fn label(self) -> &'static str {
        match self {
            Op::Create => "CreateVolume",
            Op::Import => "ImportVolume",
            Op::ExportNvme => "ExportVolume nvme",
            Op::ExportIscsi => "ExportVolume iscsi",
            Op::AllowNvme => "AllowInitiator nvme",
            Op::DenyNvme => "DenyInitiator nvme",
            Op::AllowIscsi => "AllowInitiator iscsi",
            Op::DenyIscsi => "DenyInitiator iscsi",
            Op::UnexportNvme => "UnexportVolume nvme",
            Op::UnexportIscsi => "UnexportVolume iscsi",
            Op::Expand => "ExpandVolume",
            Op::Delete => "DeleteVolume",
            Op::Release => "ReleaseVolume",
            Op::Reconcile => "restart reconcile",
        }
    }

    /// Whether the volume exists before the operation (its data is checked).
    fn on_existing(self) -> bool {
        !matches!(self, Op::Create)
    }
}

/// One case's volume.
#[derive(Debug, Clone)]
struct Case {
    id: String,
    dataset: String,
    uid: String,
    /// The zvol an import adopts.
    source: Option<String>,
}

impl Case {
    fn fence(&self) -> Option<pb::FenceToken> {
        Some(pb::FenceToken {
            volume_uid: self.uid.clone(),
            generation: 1,
        })
    }
}

struct Bed {
    lab: Lab,
    parent: ZfsParent,
    agent: AgentProcess,
    crash_binary: PathBuf,
    baseline: Vec<Violation>,
    serial: u32,
}

fn sh(script: &str) -> String {
    run("sh", &["-c", script]).unwrap_or_else(|e| panic!("{script}: {e}"))
}

fn export_request(c: &Case, protocol: i32, initiators: &[&str]) -> pb::ExportVolumeRequest {
    pb::ExportVolumeRequest {
        volume_id: c.id.clone(),
        backend_type: ZVOL,
        protocol_type: protocol,
        fence: c.fence(),
        acl_enabled: true,
        allowed_initiators: initiators.iter().map(|s| (*s).to_owned()).collect(),
        chap: None,
    }
}

impl Bed {
    fn state_dir(&self) -> PathBuf {
        self.agent.config().state_dir.clone()
    }

    /// A new case's names (nothing made yet).
    fn case(&mut self) -> Case {
        self.serial += 1;
        let name = format!("c{}", self.serial);
        Case {
            id: format!("{}/{name}", self.parent.pool),
            dataset: format!("{}/{name}", self.parent.dataset()),
            uid: format!("uid-crash-{}", self.serial),
            source: None,
        }
    }

    /// What the node holds now.
    fn observe(&self) -> R<Observed> {
        let mut seen = Observed {
            agent_port: Some(nvmet::PortId(1)),
            reconciled: true,
            ..Default::default()
        };
        for entry in fs::read_dir(self.state_dir())? {
            let entry = entry?;
            seen.files.push((
                entry.file_name().to_string_lossy().into_owned(),
                fs::read(entry.path())?,
            ));
        }
        sh("udevadm settle || true");
        let listed = run(
            "zfs",
            &[
                "list",
                "-H",
                "-o",
                "name",
                "-t",
                "volume",
                "-r",
                &self.parent.dataset(),
            ],
        )?;
        for name in listed.lines().filter(|l| !l.is_empty()) {
            let device = fs::canonicalize(format!("/dev/zvol/{name}"))
                .unwrap_or_else(|_| PathBuf::from(format!("/dev/zvol/{name}")));
            seen.volumes.push(ListedVolume {
                name: name.to_owned(),
                device,
            });
        }
        seen.nvmet = nvmet::Nvmet::open()?.read()?;
        let lio = lio::Lio::open()?;
        seen.lio = lio.read()?;
        seen.lio_hbas = lio.hbas()?;
        let paths = seen
            .nvmet
            .subsystems
            .values()
            .flat_map(|s| s.namespaces.values().map(|n| n.device_path.clone()))
            .chain(
                seen.lio
                    .storage_objects
                    .values()
                    .map(|s| s.udev_path.clone()),
            )
            .collect::<Vec<_>>();
        for p in paths {
            if let Ok(real) = fs::canonicalize(&p) {
                seen.resolved.insert(p, real);
            }
        }
        Ok(seen)
    }

    /// The violations not present before the first case.
    fn violations(&self) -> R<Vec<Violation>> {
        let found = invariants::check(&self.observe()?);
        Ok(found
            .into_iter()
            .filter(|v| !self.baseline.contains(v))
            .collect())
    }

    fn device(c: &Case) -> PathBuf {
        PathBuf::from(format!("/dev/zvol/{}", c.dataset))
    }

    fn write_pattern(&self, c: &Case, seed: u64) -> R {
        let dev = Self::device(c);
        pillar_csi_lab::block::wait_for(&dev, Duration::from_secs(30))?;
        write_at(&dev, PATTERN_AT, &pattern(seed, PATTERN_LEN))
    }

    fn pattern_intact(&self, c: &Case, seed: u64) -> R<bool> {
        let dev = Self::device(c);
        pillar_csi_lab::block::wait_for(&dev, Duration::from_secs(30))?;
        Ok(read_at(&dev, PATTERN_AT, PATTERN_LEN)? == pattern(seed, PATTERN_LEN))
    }

    async fn create(&self, c: &Case) -> R {
        let mut client = self.agent.client().await?;
        client
            .create_volume(pb::CreateVolumeRequest {
                volume_id: c.id.clone(),
                backend_type: ZVOL,
                capacity_bytes: SIZE,
                fence: c.fence(),
                ..Default::default()
            })
            .await?;
        Ok(())
    }

    async fn export(&self, c: &Case, protocol: i32, initiators: &[&str]) -> R {
        let mut client = self.agent.client().await?;
        client
            .export_volume(export_request(c, protocol, initiators))
            .await?;
        Ok(())
    }

    /// The state `op` starts from, made with the ordinary agent; the
    /// pattern written when the volume exists.
    async fn prepare(&mut self, op: Op) -> R<Case> {
        let mut c = self.case();
        match op {
            Op::Create => return Ok(c),
            Op::Import => {
                // An import adopts the zvol where the volume ID resolves.
                run(
                    "zfs",
                    &["create", "-s", "-V", &SIZE.to_string(), &c.dataset],
                )?;
                c.source = Some(c.dataset.clone());
            }
            _ => self.create(&c).await?,
        }
        self.write_pattern(&c, u64::from(self.serial))?;
        match op {
            Op::ExportNvme | Op::ExportIscsi | Op::Create | Op::Import => {}
            Op::AllowNvme | Op::UnexportNvme | Op::Expand => {
                self.export(&c, NVME, &[HOST1]).await?
            }
            Op::DenyNvme => self.export(&c, NVME, &[HOST1, HOST2]).await?,
            Op::AllowIscsi | Op::UnexportIscsi => self.export(&c, ISCSI, &[INIT1]).await?,
            Op::DenyIscsi => self.export(&c, ISCSI, &[INIT1, INIT2]).await?,
            Op::Delete | Op::Release | Op::Reconcile => {
                self.export(&c, NVME, &[HOST1]).await?;
                self.export(&c, ISCSI, &[INIT1]).await?;
            }
        }
        if op == Op::Reconcile {
            // The kernel lost every export (a reboot): start-up
            // reconciliation re-creates them from the marks.
            self.wipe_exports(&c)?;
        }
        Ok(c)
    }

    /// Removes the case's exports from configfs behind the agent's back.
    fn wipe_exports(&self, c: &Case) -> R {
        let id = pillar_csi_agent::volume::VolumeId::parse(&c.id)?;
        let nqn = pillar_csi_agent::export::NvmetExporter::nqn(&id)?;
        nvmet::Nvmet::open()?.teardown(&nvmet::Teardown {
            subsystems: [nqn].into(),
            ..Default::default()
        })?;
        let (iqn, object) = pillar_csi_agent::export::LioExporter::names(&id)?;
        lio::Lio::open()?.teardown(&lio::Teardown {
            targets: [iqn].into(),
            storage_objects: [object].into(),
        })?;
        Ok(())
    }

    /// The operation's request, as the controller sends it (and repeats it).
    async fn call(&self, op: Op, c: &Case) -> Result<(), Status> {
        let mut client = self
            .agent
            .client()
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        call_on(&mut client, op, c).await
    }

    /// Deletes the case's volume and its mark, and the agent's nvmet port
    /// when it links nothing, so the next case starts from the same node.
    async fn cleanup(&mut self, c: &Case) -> R {
        let mut client = self.agent.client().await?;
        let delete = |uid: &str| pb::DeleteVolumeRequest {
            volume_id: c.id.clone(),
            backend_type: ZVOL,
            fence: Some(pb::FenceToken {
                volume_uid: uid.to_owned(),
                generation: 1,
            }),
        };
        if client.delete_volume(delete(&c.uid)).await.is_err() {
            // An ended (released) lifecycle: a new one deletes the volume.
            client
                .delete_volume(delete(&format!("{}-cleanup", c.uid)))
                .await?;
        }
        if let Some(source) = &c.source {
            let _ = run("zfs", &["destroy", source]);
        }
        let mark = self.state_dir().join(format!("{}{SUFFIX}", encode(&c.id)));
        fs::remove_file(&mark)?;
        let target = nvmet::Nvmet::open()?;
        let state = target.read()?;
        if state
            .ports
            .get(&nvmet::PortId(1))
            .is_some_and(|p| p.subsystems.is_empty())
        {
            target.teardown(&nvmet::Teardown {
                ports: [nvmet::PortId(1)].into(),
                ..Default::default()
            })?;
        }
        Ok(())
    }

    /// Restarts the agent: the crash-points binary armed with `armed`
    /// (`None`: the ordinary binary), logging to a fresh file. Waits for
    /// it to serve unless `answer` is false.
    async fn restart(&mut self, armed: Option<&str>, answer: bool) -> R {
        let log = self.lab.work.join(format!("crash-{}.log", self.serial));
        let config = self.agent.config_mut();
        config.log = log;
        match armed {
            Some(point) => {
                config.binary = Some(self.crash_binary.clone());
                config.env = vec![(crash::ENV.into(), point.into())];
            }
            None => {
                config.binary = None;
                config.env.clear();
            }
        }
        if answer {
            self.agent.restart().await
        } else {
            self.agent.restart_unanswered()
        }
    }
}

/// Shows a line of the report: on the real standard error (past the test
/// harness's capture, so the guest's output shows it) and in
/// `crash-matrix.txt` in the lab's work folder.
fn say(work: &Path, line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
    if let Ok(mut f) = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(work.join("crash-matrix.txt"))
    {
        let _ = writeln!(f, "{line}");
    }
}

/// The point names passed in `log` (in order, repeats kept).
fn passes(log: &str) -> Vec<String> {
    log.lines()
        .filter_map(|l| l.strip_prefix("crash point "))
        .filter_map(|l| l.strip_suffix(" passed"))
        .map(str::to_owned)
        .collect()
}

fn count(passes: &[String]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for p in passes {
        *out.entry(p.clone()).or_default() += 1;
    }
    out
}

/// What start-up and the operation pass: (start-up passes, the
/// operation's passes in order).
async fn trace(bed: &mut Bed, op: Op) -> R<(BTreeMap<String, usize>, Vec<String>)> {
    let c = bed.prepare(op).await?;
    bed.restart(Some("trace"), true).await?;
    let startup = bed.agent.log();
    let result = bed.call(op, &c).await;
    let all = bed.agent.log();
    let started = count(&passes(&startup));
    let during = if op == Op::Reconcile {
        passes(&startup)
    } else {
        passes(&all[startup.len()..])
    };
    if let Err(e) = result {
        return Err(format!("{}: the traced run failed: {e}", op.label()).into());
    }
    bed.restart(None, true).await?;
    bed.cleanup(&c).await?;
    Ok((
        if op == Op::Reconcile {
            BTreeMap::new()
        } else {
            started
        },
        during,
    ))
}

/// One cell: the agent killed at the `n`-th pass of `point` in `op`.
async fn case(bed: &mut Bed, op: Op, point: &str, armed_at: usize) -> R<Result<(), String>> {
    let c = bed.prepare(op).await?;
    let armed = format!("{point}@{armed_at}");
    bed.restart(Some(&armed), op != Op::Reconcile).await?;
    let reached = format!("crash point {point} reached");
    // The request runs in a task of its own: its reply never comes.
    let call = {
        let (addr, case) = (bed.agent.addr(), c.clone());
        tokio::spawn(async move {
            if op == Op::Reconcile {
                return Ok(());
            }
            let mut client = pillar_csi_lab::agent::connect(addr, None)
                .await
                .map_err(|e| Status::unavailable(e.to_string()))?;
            call_on(&mut client, op, &case).await
        })
    };
    let start = Instant::now();
    let mut outcome = Ok(());
    while !bed.agent.log().contains(&reached) {
        if call.is_finished() && op != Op::Reconcile {
            let r = call.await?;
            outcome = Err(format!("not reached; the request returned {r:?}"));
            break;
        }
        if start.elapsed() > Duration::from_secs(120) {
            outcome = Err("not reached within 120 s".into());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bed.agent.kill()?;
    if outcome.is_ok() {
        bed.restart(None, true).await?;
        let repeated = bed.call(op, &c).await;
        outcome = judge(bed, op, &c, repeated)?;
    } else {
        bed.restart(None, true).await?;
    }
    bed.cleanup(&c).await?;
    Ok(outcome)
}

/// The repeated request's result, the invariants and the data.
fn judge(bed: &Bed, op: Op, c: &Case, repeated: Result<(), Status>) -> R<Result<(), String>> {
    if let Err(s) = repeated {
        return Ok(Err(format!(
            "the repeated request failed: {:?} {}",
            s.code(),
            s.message()
        )));
    }
    let violations = bed.violations()?;
    if !violations.is_empty() {
        return Ok(Err(format!("invariants: {violations:?}")));
    }
    let data = match op {
        Op::Delete => {
            !Path::new(&Bed::device(c)).exists() || {
                // The zvol node may linger a moment after the destroy.
                sh("udevadm settle || true");
                !Bed::device(c).exists()
            }
        }
        _ if op.on_existing() => bed.pattern_intact(c, u64::from(bed.serial))?,
        _ => pillar_csi_lab::block::wait_for(&Bed::device(c), Duration::from_secs(30)).is_ok(),
    };
    if !data {
        return Ok(Err(match op {
            Op::Delete => "the volume is still there".into(),
            Op::Create => "the volume is missing".into(),
            _ => "the data pattern changed".into(),
        }));
    }
    Ok(Ok(()))
}

/// The operation's request on `client`.
/// The operation's request on `client`.
async fn call_on(
    client: &mut pillar_csi_lab::agent::Client,
    op: Op,
    c: &Case,
) -> Result<(), Status> {
    let (id, fence) = (c.id.clone(), c.fence());
    match op {
        Op::Create => client
            .create_volume(pb::CreateVolumeRequest {
                volume_id: id,
                backend_type: ZVOL,
                capacity_bytes: SIZE,
                fence,
                ..Default::default()
            })
            .await
            .map(drop),
        Op::Import => client
            .create_volume(pb::CreateVolumeRequest {
                volume_id: id,
                backend_type: ZVOL,
                capacity_bytes: SIZE,
                fence,
                import_zvol: c.source.clone().unwrap_or_default(),
                ..Default::default()
            })
            .await
            .map(drop),
        Op::ExportNvme => client
            .export_volume(export_request(c, NVME, &[HOST1]))
            .await
            .map(drop),
        Op::ExportIscsi => client
            .export_volume(export_request(c, ISCSI, &[INIT1]))
            .await
            .map(drop),
        Op::AllowNvme | Op::AllowIscsi => {
            let (protocol, initiator) = if op == Op::AllowNvme {
                (NVME, HOST2)
            } else {
                (ISCSI, INIT2)
            };
            client
                .allow_initiator(pb::AllowInitiatorRequest {
                    volume_id: id,
                    protocol_type: protocol,
                    initiator_id: initiator.into(),
                    fence,
                })
                .await
                .map(drop)
        }
        Op::DenyNvme | Op::DenyIscsi => {
            let (protocol, initiator) = if op == Op::DenyNvme {
                (NVME, HOST2)
            } else {
                (ISCSI, INIT2)
            };
            client
                .deny_initiator(pb::DenyInitiatorRequest {
                    volume_id: id,
                    protocol_type: protocol,
                    initiator_id: initiator.into(),
                    fence,
                })
                .await
                .map(drop)
        }
        Op::UnexportNvme | Op::UnexportIscsi => client
            .unexport_volume(pb::UnexportVolumeRequest {
                volume_id: id,
                protocol_type: if op == Op::UnexportNvme { NVME } else { ISCSI },
                fence,
            })
            .await
            .map(drop),
        Op::Expand => client
            .expand_volume(pb::ExpandVolumeRequest {
                volume_id: id,
                backend_type: ZVOL,
                requested_bytes: 2 * SIZE,
                fence,
            })
            .await
            .map(drop),
        Op::Delete => client
            .delete_volume(pb::DeleteVolumeRequest {
                volume_id: id,
                backend_type: ZVOL,
                fence,
            })
            .await
            .map(drop),
        Op::Release => client
            .release_volume(pb::ReleaseVolumeRequest {
                volume_id: id,
                backend_type: ZVOL,
                fence,
            })
            .await
            .map(drop),
        Op::Reconcile => Ok(()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the kernel lab"]
async fn crash_matrix_every_operation_at_every_point() -> R {
    let lab = Lab::get();
    let started = Instant::now();
    let parent = ZfsParent::create(&lab, "crash")?;
    let config = AgentConfig::new(
        &lab,
        &lab.unique("crash"),
        vec![parent.backend()],
        NVME_PORT,
        ISCSI_PORT,
    )?;
    // No periodic resync: its passes would shift the counted ones.
    let mut config = config;
    config.resync_interval_seconds = Some(0);
    let agent = AgentProcess::start(config).await?;
    let mut bed = Bed {
        lab: lab.clone(),
        parent,
        agent,
        crash_binary: crash_points_binary()?,
        baseline: Vec::new(),
        serial: 0,
    };
    bed.baseline = invariants::check(&bed.observe()?);
    let work = lab.work.clone();
    say(
        &work,
        &format!(
            "violations present before the matrix (not ours): {:?}",
            bed.baseline
        ),
    );
    let all_passes = std::env::var("PILLAR_CRASH_ALL_PASSES").is_ok();
    let mut matrix: Vec<(Op, BTreeMap<String, String>)> = Vec::new();
    let mut failures = Vec::new();
    let mut cases = 0;
    for op in OPS {
        // A setup step that fails (not a cell) is reported and the next
        // operation runs on the ordinary agent.
        let row = match row(&mut bed, op, all_passes, &mut cases, &mut failures).await {
            Ok(row) => row,
            Err(e) => {
                failures.push(format!("{}: {e}", op.label()));
                let _ = bed.restart(None, true).await;
                [("error".to_owned(), e.to_string())].into()
            }
        };
        say(
            &work,
            &format!(
                "{} ({:.0} s): {row:?}",
                op.label(),
                started.elapsed().as_secs_f64()
            ),
        );
        matrix.push((op, row));
    }
    print_matrix(&work, &matrix);
    say(
        &work,
        &format!(
            "crash matrix: {cases} cases, {} failed, {:.0} s",
            failures.len(),
            started.elapsed().as_secs_f64()
        ),
    );
    for f in &failures {
        say(&work, &format!("FAILED {f}"));
    }
    assert!(failures.is_empty(), "{failures:#?}");
    assert_eq!(bed.violations()?, vec![], "the node is clean at the end");
    Ok(())
}

/// The row of `op`: each point it passes, crashed at its first and last
/// pass (every pass with `all_passes`).
async fn row(
    bed: &mut Bed,
    op: Op,
    all_passes: bool,
    cases: &mut usize,
    failures: &mut Vec<String>,
) -> R<BTreeMap<String, String>> {
    let (startup, during) = trace(bed, op).await?;
    let mut row = BTreeMap::new();
    for (point, total) in &count(&during) {
        let picks: BTreeSet<usize> = if all_passes {
            (1..=*total).collect()
        } else {
            [1, *total].into()
        };
        let mut cell = Vec::new();
        for n in picks {
            let at = startup.get(point).copied().unwrap_or(0) + n;
            *cases += 1;
            let t = Instant::now();
            let outcome = case(bed, op, point, at).await?;
            say(
                &bed.lab.work,
                &format!(
                    "  {} at {point}@{n} (armed @{at}): {outcome:?} ({:.1} s)",
                    op.label(),
                    t.elapsed().as_secs_f64()
                ),
            );
            match outcome {
                Ok(()) => cell.push(format!("ok{n}")),
                Err(why) => {
                    cell.push(format!("FAIL{n}"));
                    failures.push(format!("{} at {point}@{n}: {why}", op.label()));
                }
            }
        }
        row.insert(point.clone(), format!("{}/{total}", cell.join(",")));
    }
    Ok(row)
}

/// Operations down, crash points across: `ok<n>` per pass crashed at
/// (`/<passes>`), `-` where the operation does not pass the point.
fn print_matrix(work: &Path, matrix: &[(Op, BTreeMap<String, String>)]) {
    let points: Vec<&str> = crash::POINTS
        .iter()
        .map(|(n, _)| *n)
        .filter(|n| matrix.iter().any(|(_, row)| row.contains_key(*n)))
        .collect();
    say(work, "crash matrix (operation x point; ok<n>: killed at the n-th pass, then repaired; /<passes>):");
    for (i, p) in points.iter().enumerate() {
        say(work, &format!("  P{i:02} = {p}"));
    }
    let mut header = format!("{:<22}", "operation");
    for i in 0..points.len() {
        header.push_str(&format!(" {:<10}", format!("P{i:02}")));
    }
    say(work, &header);
    for (op, row) in matrix {
        let mut line = format!("{:<22}", op.label());
        for p in &points {
            line.push_str(&format!(" {:<10}", row.get(*p).map_or("-", String::as_str)));
        }
        say(work, &line);
    }
}
