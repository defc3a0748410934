//! The crash matrix in the kernel lab: every operation of the agent, killed
//! (SIGKILL) at every crash point it passes (`crate::crash::POINTS`), then
//! restarted with the ordinary binary and the same request repeated as the
//! controller would. After each case the node's invariants hold
//! (`invariants::check` finds nothing new) and the data pattern written
//! before the operation is intact. Prints the matrix (operations × points).
//!
//! By default each operation is killed once, after its mark is committed
//! (the reply lost); `PILLAR_CRASH_FULL=1 tests/lab/run tests -- crash_` (the
//! runner passes it into the guest) runs
//! every point each operation passes (found by a traced run first).
//!
//! Run with `tests/lab/run tests -- crash_`. One parent dataset and one agent
//! state folder serve every case; each case's volume is small and sparse and
//! is deleted (its ended mark removed) before the next case, so start-up
//! reconciliation and the passes it makes are the same for every case.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use crash_bed::{call_on, sh, Bed, Case, Op, ISCSI_PORT, NVME_PORT, OPS, R};
use pillar_csi_agent::{crash, invariants};
use pillar_csi_lab::{
    agent::{crash_points_binary, AgentConfig, AgentProcess, ZfsParent},
    env::Lab,
};
use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::Path,
    time::{Duration, Instant},
};
use tonic::Status;

mod crash_bed;

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
    bed.restart(None, true).await?;
    bed.cleanup(&c).await?;
    if let Err(e) = result {
        return Err(format!("{}: the traced run failed: {e}", op.label()).into());
    }
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
    // The whole matrix costs about half a minute of emulated guest per
    // case (two agent starts, a volume made and removed): every point is
    // run only when asked; by default every operation loses its reply
    // after its mark is committed (what the controller repeats most).
    let full = all_passes || std::env::var("PILLAR_CRASH_FULL").is_ok();
    let mut matrix: Vec<(Op, BTreeMap<String, String>)> = Vec::new();
    let mut failures = Vec::new();
    let mut cases = 0;
    for op in OPS {
        // A setup step that fails (not a cell) is reported and the next
        // operation runs on the ordinary agent.
        let picked = if full {
            row(&mut bed, op, all_passes, &mut cases, &mut failures).await
        } else {
            lost_reply(&mut bed, op, &mut cases, &mut failures).await
        };
        let row = match picked {
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

/// The default row of `op`: killed once its mark is committed (restart
/// reconciliation: once one volume's exports are re-applied), the reply lost.
async fn lost_reply(
    bed: &mut Bed,
    op: Op,
    cases: &mut usize,
    failures: &mut Vec<String>,
) -> R<BTreeMap<String, String>> {
    let point = if op == Op::Reconcile {
        "reconcile-volume-done"
    } else {
        "mark-committed"
    };
    *cases += 1;
    let t = Instant::now();
    let outcome = case(bed, op, point, 1).await?;
    say(
        &bed.lab.work,
        &format!(
            "  {} at {point}@1: {outcome:?} ({:.1} s)",
            op.label(),
            t.elapsed().as_secs_f64()
        ),
    );
    let cell = match outcome {
        Ok(()) => "ok1".to_owned(),
        Err(why) => {
            failures.push(format!("{} at {point}@1: {why}", op.label()));
            "FAIL1".to_owned()
        }
    };
    Ok([(point.to_owned(), cell)].into())
}

/// The row of `op`: each point it passes, crashed at its first pass (every
/// pass with `all_passes`).
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
            [1].into()
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
