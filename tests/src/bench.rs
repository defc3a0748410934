//! What the lab's benchmarks (`tests/benches`) share: which ones the
//! filter selects, a process's resident memory and open file descriptors,
//! latency percentiles, and the configfs reset a storage node's reboot
//! makes.
use crate::Result;
use std::{collections::BTreeMap, time::Duration};

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
    fn own_descriptors_by_kind() {
        let kinds = open_fds(std::process::id()).expect("own /proc");
        assert!(fd_count(&kinds) >= 3, "{kinds:?}");
        assert!(
            kinds.keys().all(|k| !k.starts_with("socket:[")),
            "{kinds:?}"
        );
    }
}
