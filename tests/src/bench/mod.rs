//! What the lab's benchmarks share: which ones the filter selects, the
//! conditions a figure was measured under, the floor ratio and the peers
//! run at once, configfs exports against their floor and peers
//! ([`exports`]), a process's resident memory, CPU time and open file descriptors,
//! latency percentiles, and the configfs reset a storage node's reboot
//! makes.
use crate::Result;
use std::{
    collections::BTreeMap,
    process::Command,
    sync::Barrier,
    time::{Duration, Instant},
};

mod exports;
pub use exports::*;

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
    /// When the two were timed in alternating blocks: ours / floor in
    /// each pair of adjacent blocks, spread as [`Pairs`].
    pub pairs: Option<Pairs>,
}

/// The ratios of ours to the floor in pairs of adjacent blocks: a host
/// that takes the guest's CPU away for a few milliseconds lands in one
/// block, and moves the totals of operations of a millisecond by more than
/// the goal's margin, but not the median pair.
#[derive(Debug, Clone, Copy)]
pub struct Pairs {
    /// Pairs of blocks.
    pub count: usize,
    /// The lowest ratio of a pair.
    pub low: f64,
    /// The median ratio.
    pub median: f64,
    /// The highest ratio of a pair.
    pub high: f64,
}

impl Pairs {
    /// The spread of `ours[i] / floor[i]`; `None` without a pair.
    pub fn of(ours: &[Duration], floor: &[Duration]) -> Option<Self> {
        let mut ratios: Vec<f64> = ours
            .iter()
            .zip(floor)
            .map(|(o, f)| o.as_secs_f64() / f.as_secs_f64().max(f64::MIN_POSITIVE))
            .collect();
        ratios.sort_unstable_by(f64::total_cmp);
        let count = ratios.len();
        let median = match count {
            0 => return None,
            _ if count % 2 == 1 => ratios[count / 2],
            _ => (ratios[count / 2 - 1] + ratios[count / 2]) / 2.0,
        };
        Some(Self {
            count,
            low: ratios[0],
            median,
            high: ratios[count - 1],
        })
    }
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

    /// `ours 8.1 ms/op, floor 7.5 ms/op: 1.08x the floor (goal <= 1.15x)`,
    /// and the spread of its pairs of blocks when it has them.
    pub fn line(&self) -> String {
        let per = |d: Duration| ms(d) / self.n.max(1) as f64;
        let pairs = self.pairs.map_or_else(String::new, |p| {
            format!(
                "; in {} pairs of blocks median {:.2}x (lowest {:.2}x, highest {:.2}x)",
                p.count, p.median, p.low, p.high
            )
        });
        format!(
            "ours {:.2} ms/op, floor {:.2} ms/op: {:.2}x the floor (goal <= {FLOOR_GOAL}x){pairs}",
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

/// The CPU time, user and system, that process `pid` (`"self"` for this
/// one) has used so far, its threads' included, in seconds.
pub fn cpu_seconds(pid: &str) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let ticks = cpu_ticks(&stat).ok_or_else(|| format!("no CPU times in /proc/{pid}/stat"))?;
    // The kernel counts them in USER_HZ, 100 a second on every architecture
    // the lab runs.
    Ok(ticks as f64 / 100.0)
}

/// `utime` + `stime` of a `/proc/<pid>/stat` line: the 14th and 15th
/// fields, counted after the command name's closing parenthesis (the name
/// may hold spaces and parentheses).
fn cpu_ticks(stat: &str) -> Option<u64> {
    let (_, after_name) = stat.rsplit_once(')')?;
    let mut fields = after_name.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(user + system)
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
    fn cpu_ticks_are_counted_after_the_command_name() {
        let stat = "482 (a (b) c) S 1 482 482 0 -1 4194560 900 0 3 0 250 41 0 0 20 0 7 0 812";
        assert_eq!(cpu_ticks(stat), Some(291));
        assert_eq!(cpu_ticks("482 (a) S 1 482"), None);
        assert!(cpu_seconds("self").expect("own /proc") >= 0.0);
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
