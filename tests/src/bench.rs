//! What the lab's benchmarks share: which ones the filter selects, the
//! conditions a figure was measured under, the floor ratio and the peers
//! run at once, configfs steps made bare (the floor) or by a shell script
//! (the peer), rounds that alternate what they time, a process's resident
//! memory and open file descriptors, latency percentiles, and the configfs
//! reset a storage node's reboot makes.
use crate::Result;
use nvmet::Step;
use std::{
    collections::BTreeMap,
    fmt::Write as _,
    path::Path,
    process::Command,
    sync::Barrier,
    time::{Duration, Instant},
};

/// The goal for a single operation against its floor: at most this many
/// times the bare kernel work.
pub const FLOOR_GOAL: f64 = 1.15;

/// The conditions of the figures that follow, in one line: the host's load
/// average (the lab runner samples it while the guest runs), the busy loops
/// `LOAD=n` started beside the guest, another lab guest if one ran
/// (`BENCH_SHARED=1`), and the guest's own load average.
pub fn conditions() -> String {
    let first3 = |s: String| s.split_whitespace().take(3).collect::<Vec<_>>().join(" ");
    let host = std::env::var("PILLAR_LAB_WORK")
        .ok()
        .and_then(|w| std::fs::read_to_string(format!("{w}/host-loadavg")).ok())
        .map_or_else(|| "not sampled".to_owned(), first3);
    let guest = std::fs::read_to_string("/proc/loadavg").map_or_else(|e| e.to_string(), first3);
    let loops = std::env::var("PILLAR_BENCH_LOAD_LOOPS").unwrap_or_else(|_| "0".into());
    let others = std::env::var("PILLAR_BENCH_OTHER_GUESTS")
        .map(|p| format!(", ANOTHER LAB GUEST RAN (qemu {p})"))
        .unwrap_or_default();
    format!("host load average {host} (LOAD={loops} busy loops{others}); guest {guest}")
}

/// One operation of ours against its floor, the bare kernel work under it
/// timed in the same run: `ours` and `floor` are totals over `n` operations.
#[derive(Debug, Clone, Copy)]
pub struct Floor {
    /// Our total.
    pub ours: Duration,
    /// The floor's total.
    pub floor: Duration,
    /// Operations in each total.
    pub n: usize,
}

impl Floor {
    /// ours / floor.
    pub fn ratio(&self) -> f64 {
        self.ours.as_secs_f64() / self.floor.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    /// Whether the ratio is within [`FLOOR_GOAL`].
    pub fn met(&self) -> bool {
        self.ratio() <= FLOOR_GOAL
    }

    /// `ours 8.1 ms/op, floor 7.5 ms/op: 1.08x the floor (goal <= 1.15x)`.
    pub fn line(&self) -> String {
        let per = |d: Duration| ms(d) / self.n.max(1) as f64;
        format!(
            "ours {:.2} ms/op, floor {:.2} ms/op: {:.2}x the floor (goal <= {FLOOR_GOAL}x)",
            per(self.ours),
            per(self.floor),
            self.ratio()
        )
    }
}

/// Runs `work(0..n)` from `n` threads released at once; the wall time from
/// the release until the last one ends, and each one's own time. The first
/// error ends the run.
pub fn threads_at_once<F>(n: usize, work: F) -> Result<(Duration, Vec<Duration>)>
where
    F: Fn(usize) -> Result<()> + Sync,
{
    let barrier = Barrier::new(n + 1);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let (barrier, work) = (&barrier, &work);
                s.spawn(move || -> Result<Duration> {
                    barrier.wait();
                    let t = Instant::now();
                    work(i)?;
                    Ok(t.elapsed())
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        let mut each = Vec::with_capacity(n);
        for h in handles {
            each.push(h.join().map_err(|_| "a benchmark thread panicked")??);
        }
        Ok((start.elapsed(), each))
    })
}

/// Starts every command at once (as a driver that serves concurrent
/// requests with concurrent CLI processes does) and waits for all; the wall
/// time. A command that fails is named with its standard error.
pub fn processes_at_once(commands: Vec<Command>) -> Result<Duration> {
    let start = Instant::now();
    let children = commands
        .into_iter()
        .map(|mut c| {
            c.stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped());
            let what = format!("{c:?}");
            c.spawn()
                .map(|child| (what.clone(), child))
                .map_err(|e| format!("{what}: {e}"))
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let mut failed = Vec::new();
    for (what, child) in children {
        let out = child.wait_with_output()?;
        if !out.status.success() {
            failed.push(format!(
                "{what}: {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    let took = start.elapsed();
    if failed.is_empty() {
        Ok(took)
    } else {
        Err(failed.join("; ").into())
    }
}

/// Makes `steps` under `root` with plain `std::fs` calls (`create_dir`,
/// `write`, `symlink`, `remove_file`, `remove_dir`), in order: the bare
/// kernel work of a configfs change, with no reads, no planning and no
/// checks. The floor an operation of ours is measured against.
pub fn bare(root: &Path, steps: &[Step]) -> Result<()> {
    for step in steps {
        match step {
            Step::Mkdir(p) => std::fs::create_dir(root.join(p))?,
            Step::Write { path, value } => std::fs::write(root.join(path), value)?,
            Step::Symlink { target, link } => {
                std::os::unix::fs::symlink(root.join(target), root.join(link))?;
            }
            Step::Unlink(p) => std::fs::remove_file(root.join(p))?,
            Step::Rmdir(p) => std::fs::remove_dir(root.join(p))?,
        }
    }
    Ok(())
}

/// `steps` under `root` as a shell script of one command per object
/// (`mkdir`, `echo -n ... >`, `ln -s`, `rm`, `rmdir`), as hand-written
/// scripts and the CLI drivers' shell-outs make them; it stops at the first
/// failure.
pub fn shell_script(root: &Path, steps: &[Step]) -> Result<String> {
    let root = root.display();
    let mut s = String::from("set -e\n");
    for step in steps {
        match step {
            Step::Mkdir(p) => writeln!(s, "mkdir '{root}/{p}'")?,
            Step::Write { path, value } => writeln!(s, "echo -n '{value}' > '{root}/{path}'")?,
            Step::Symlink { target, link } => {
                writeln!(s, "ln -s '{root}/{target}' '{root}/{link}'")?
            }
            Step::Unlink(p) => writeln!(s, "rm '{root}/{p}'")?,
            Step::Rmdir(p) => writeln!(s, "rmdir '{root}/{p}'")?,
        }
    }
    Ok(s)
}

/// Runs `script` with one `bash`, fed on standard input (a long script does
/// not fit in an argument); the wall time, process start included.
pub fn bash(script: &str) -> Result<Duration> {
    use std::io::Write;
    let start = Instant::now();
    let mut child = Command::new("bash")
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .ok_or("no stdin for bash")?
        .write_all(script.as_bytes())?;
    let out = child.wait_with_output()?;
    let took = start.elapsed();
    if !out.status.success() {
        return Err(format!(
            "shell script failed: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )
        .into());
    }
    Ok(took)
}

/// `bash -c script`, for [`processes_at_once`].
pub fn bash_command(script: &str) -> Command {
    let mut c = Command::new("bash");
    c.arg("-c").arg(script);
    c
}

/// Times each of `work` over `blocks` blocks of `per_block` operations,
/// the works alternating inside every round and the one that goes first
/// rotating from round to round, so that a change of the host's load hits
/// them all alike. Operation `k` (0 to `blocks * per_block`) of each work
/// is `work[w](k)`; the total time of each work.
pub fn alternating(
    blocks: usize,
    per_block: usize,
    work: &mut [&mut dyn FnMut(usize) -> Result<()>],
) -> Result<Vec<Duration>> {
    let mut totals = vec![Duration::ZERO; work.len()];
    for b in 0..blocks {
        for j in 0..work.len() {
            let w = (b + j) % work.len();
            let start = Instant::now();
            for k in b * per_block..(b + 1) * per_block {
                work[w](k)?;
            }
            totals[w] += start.elapsed();
        }
    }
    Ok(totals)
}

/// One kind of export a benchmark compares with its floor and its peers:
/// export `k` of a set (`"ours"`, `"floor"`, `"shell"`, `"threads"`), made
/// by us as the agent makes it, or as configfs steps. Exports of different
/// sets, and of one set, are distinct objects (and devices, where the
/// kernel opens them exclusively) that may all be present at once.
pub trait Exports: Sync {
    /// The configfs tree the steps are relative to.
    fn root(&self) -> &Path;
    /// Ours: export `k` of `set` as the agent makes it per ExportVolume.
    fn export(&self, set: &str, k: usize) -> Result<()>;
    /// Ours: its removal as the agent makes it per UnexportVolume.
    fn unexport(&self, set: &str, k: usize) -> Result<()>;
    /// The configfs steps that make export `k` of `set`.
    fn export_steps(&self, set: &str, k: usize) -> Result<Vec<Step>>;
    /// The configfs steps that remove it.
    fn unexport_steps(&self, set: &str, k: usize) -> Result<Vec<Step>>;
    /// How many exports of `set` are present, whole.
    fn present(&self, set: &str) -> Result<usize>;
}

/// The floor and peer figures of [`floor_and_peers`].
#[derive(Debug, Clone)]
pub struct PeerFigures {
    /// One export as the agent makes it against the bare steps.
    pub export: Floor,
    /// One unexport against the bare steps.
    pub unexport: Floor,
    /// Exports made by one `bash` per export, one after another.
    pub shell_in_turn: Duration,
    /// Exports made by one `bash` per export, all at once.
    pub shell_at_once: Duration,
    /// Ours from one thread per export, released at once.
    pub ours_at_once: Duration,
    /// Each thread's own time in that run.
    pub ours_each: Vec<Duration>,
    /// Ours from one thread per export, serialised by one lock as the
    /// agent serialises its configfs changes.
    pub ours_locked: Duration,
    /// Exports in each of the peer runs.
    pub concurrent: usize,
}

impl PeerFigures {
    /// The figures as report lines, each starting with `prefix`.
    pub fn lines(&self, prefix: &str) -> Vec<String> {
        let n = self.concurrent;
        let per = |d: Duration, k: usize| ms(d) / k.max(1) as f64;
        let ours = per(self.export.ours, self.export.n);
        vec![
            format!("{prefix}export as the agent makes it: {}", self.export.line()),
            format!("{prefix}unexport as the agent makes it: {}", self.unexport.line()),
            format!(
                "{prefix}in turn: one bash per export, {n} one after another {:.1} ms ({:.2} ms/export); ours as the agent {ours:.2} ms/export: shell/ours {:.2}x",
                ms(self.shell_in_turn),
                per(self.shell_in_turn, n),
                per(self.shell_in_turn, n) / ours
            ),
            format!(
                "{prefix}at once: {n} bash processes {:.1} ms; ours from {n} threads {:.1} ms (each p50 {:.2} ms, max {:.2} ms); through one lock, as the agent serialises, {:.1} ms: shell/ours {:.2}x, shell/ours-through-the-lock {:.2}x",
                ms(self.shell_at_once),
                ms(self.ours_at_once),
                ms(percentile(&self.ours_each, 50.0)),
                ms(percentile(&self.ours_each, 100.0)),
                ms(self.ours_locked),
                ms(self.shell_at_once) / ms(self.ours_at_once),
                ms(self.shell_at_once) / ms(self.ours_locked)
            ),
        ]
    }
}

/// The floor of one export and of one unexport, `blocks` alternating
/// blocks of `per_block` each (the last `blocks * per_block` of ours and
/// of the floor present together at the top); then the peers the way CLI
/// drivers serve requests: one `bash` per export (the steps as
/// [`shell_script`]), `concurrent` one after another and `concurrent` at
/// once, against ours from as many threads, as they come and through one
/// lock. Every run is checked and removed again (untimed). Export 0 of set
/// `"anchor"`, made first and removed last, keeps the port or portal
/// listening throughout, so that no timed operation starts or stops the
/// listener (the kernel does when the first export links to it and the
/// last one goes).
pub fn floor_and_peers(
    e: &impl Exports,
    blocks: usize,
    per_block: usize,
    concurrent: usize,
) -> Result<PeerFigures> {
    let n = blocks * per_block;
    let steps = |up: bool| -> Result<Vec<Vec<Step>>> {
        (0..n)
            .map(|k| {
                if up {
                    e.export_steps("floor", k)
                } else {
                    e.unexport_steps("floor", k)
                }
            })
            .collect()
    };
    let (floor_up, floor_down) = (steps(true)?, steps(false)?);
    e.export("anchor", 0)?;
    let figures =
        floor_and_peers_anchored(e, blocks, per_block, concurrent, &floor_up, &floor_down);
    e.unexport("anchor", 0)?;
    figures
}

fn floor_and_peers_anchored(
    e: &impl Exports,
    blocks: usize,
    per_block: usize,
    concurrent: usize,
    floor_up: &[Vec<Step>],
    floor_down: &[Vec<Step>],
) -> Result<PeerFigures> {
    let n = blocks * per_block;
    let expect = |set: &str, want: usize| -> Result<()> {
        let got = e.present(set)?;
        if got == want {
            Ok(())
        } else {
            Err(format!("{got} exports of set {set} present, expected {want}").into())
        }
    };
    let up = alternating(
        blocks,
        per_block,
        &mut [&mut |k| e.export("ours", k), &mut |k| {
            bare(e.root(), &floor_up[k])
        }],
    )?;
    expect("ours", n)?;
    expect("floor", n)?;
    let down = alternating(
        blocks,
        per_block,
        &mut [&mut |k| e.unexport("ours", k), &mut |k| {
            bare(e.root(), &floor_down[k])
        }],
    )?;
    expect("ours", 0)?;
    expect("floor", 0)?;

    let scripts = (0..concurrent)
        .map(|k| shell_script(e.root(), &e.export_steps("shell", k)?))
        .collect::<Result<Vec<_>>>()?;
    let clear = |set: &str| -> Result<()> {
        (0..concurrent).try_for_each(|k| e.unexport(set, k))?;
        expect(set, 0)
    };
    let start = Instant::now();
    for s in &scripts {
        bash(s)?;
    }
    let shell_in_turn = start.elapsed();
    expect("shell", concurrent)?;
    clear("shell")?;
    let shell_at_once = processes_at_once(scripts.iter().map(|s| bash_command(s)).collect())?;
    expect("shell", concurrent)?;
    clear("shell")?;
    let (ours_at_once, ours_each) = threads_at_once(concurrent, |k| e.export("threads", k))?;
    expect("threads", concurrent)?;
    clear("threads")?;
    let lock = std::sync::Mutex::new(());
    let (ours_locked, _) = threads_at_once(concurrent, |k| {
        let _serial = lock.lock().map_err(|_| "lock poisoned")?;
        e.export("threads", k)
    })?;
    expect("threads", concurrent)?;
    clear("threads")?;
    Ok(PeerFigures {
        export: Floor {
            ours: up[0],
            floor: up[1],
            n,
        },
        unexport: Floor {
            ours: down[0],
            floor: down[1],
            n,
        },
        shell_in_turn,
        shell_at_once,
        ours_at_once,
        ours_each,
        ours_locked,
        concurrent,
    })
}

/// Whether the benchmark `name` is selected by the filter arguments the
/// lab runner passes (`make bench FILTER=...`): no filter selects every
/// benchmark, else one that is part of `name` (flags are ignored).
pub fn selected(name: &str) -> bool {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str()))
}

/// `VmRSS` of process `pid`, in KiB (`/proc/<pid>/status`).
pub fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| "no VmRSS".into())
}

/// The open file descriptors of process `pid` by kind: the target of each
/// `/proc/<pid>/fd` link with the inode number of sockets, pipes and
/// anonymous inodes left out (`socket`, `pipe`, `anon_inode:[eventpoll]`,
/// `/dev/zfs`, ...), with how many descriptors have it. Two snapshots that
/// differ name what was opened or closed between them.
pub fn open_fds(pid: u32) -> Result<BTreeMap<String, usize>> {
    let mut kinds = BTreeMap::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))? {
        // A descriptor closed between the listing and the readlink is gone.
        let Ok(target) = std::fs::read_link(entry?.path()) else {
            continue;
        };
        let target = target.to_string_lossy().into_owned();
        let kind = match target.split_once(":[") {
            Some((kind, _)) if matches!(kind, "socket" | "pipe") => kind.to_owned(),
            _ => target,
        };
        *kinds.entry(kind).or_insert(0) += 1;
    }
    Ok(kinds)
}

/// The total of an [`open_fds`] snapshot.
pub fn fd_count(kinds: &BTreeMap<String, usize>) -> usize {
    kinds.values().sum()
}

/// A duration in milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The `p`-th percentile (0 < p <= 100, nearest rank) of `samples`;
/// zero when there are none.
pub fn percentile(samples: &[Duration], p: f64) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    // Nearest rank: the smallest sample with at least p% at or below it.
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Removes every nvmet object (what a reboot does to configfs).
pub fn empty_nvmet() -> Result<()> {
    let target = nvmet::Nvmet::open()?;
    let state = target.read()?;
    target.teardown(&nvmet::Teardown {
        subsystems: state.subsystems.keys().cloned().collect(),
        ports: state.ports.keys().copied().collect(),
        hosts: state.hosts.clone(),
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let samples: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        assert_eq!(percentile(&samples, 50.0), Duration::from_millis(50));
        assert_eq!(percentile(&samples, 99.0), Duration::from_millis(99));
        assert_eq!(percentile(&samples, 100.0), Duration::from_millis(100));
        assert_eq!(percentile(&samples[..1], 99.0), Duration::from_millis(100));
        assert_eq!(percentile(&[], 50.0), Duration::ZERO);
    }

    #[test]
    fn bare_steps_and_their_script_make_the_same_tree() -> Result<()> {
        let steps = [
            Step::mkdir("obj"),
            Step::write("obj/attr", "1"),
            Step::symlink("obj", "link"),
        ];
        let (a, b) = (tempfile::tempdir()?, tempfile::tempdir()?);
        bare(a.path(), &steps)?;
        bash(&shell_script(b.path(), &steps)?)?;
        for dir in [a.path(), b.path()] {
            assert_eq!(std::fs::read_to_string(dir.join("link/attr"))?, "1");
        }
        let undo = [Step::unlink("link"), Step::rmdir("obj")];
        bare(a.path(), &[Step::write("obj/attr", "2")])?;
        std::fs::remove_file(a.path().join("obj/attr"))?;
        bare(a.path(), &undo)?;
        assert!(!a.path().join("obj").exists());
        Ok(())
    }

    #[test]
    fn alternating_rounds_give_each_work_every_operation() -> Result<()> {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let totals = alternating(
            3,
            2,
            &mut [
                &mut |k| {
                    a.push(k);
                    Ok(())
                },
                &mut |k| {
                    b.push(k);
                    Ok(())
                },
            ],
        )?;
        assert_eq!(totals.len(), 2);
        assert_eq!(a, (0..6).collect::<Vec<_>>());
        assert_eq!(b, a);
        Ok(())
    }

    #[test]
    fn own_descriptors_by_kind() {
        let kinds = open_fds(std::process::id()).expect("own /proc");
        assert!(fd_count(&kinds) >= 3, "{kinds:?}");
        assert!(
            kinds.keys().all(|k| !k.starts_with("socket:[")),
            "{kinds:?}"
        );
    }
}
