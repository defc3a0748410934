//! Benchmark in the kernel lab: snapshots and clones through the agent
//! against the CLI a driver that shells out runs, in one run.
//!
//! For ZFS (zvols under a parent dataset) and for LVM (thin LVs in the
//! lab's thin pool), 20 snapshots of one source and then 20 volumes made
//! from them:
//! - through the agent's gRPC API (CreateSnapshot, then CreateVolume with
//!   `source_snapshot_id`: each one recorded in a durable mark, the clone's
//!   GUID or UUID pinned and its device node waited for), all 20 at once
//!   and one at a time;
//! - through the CLI: `zfs snapshot` and `zfs clone` (then a wait for the
//!   clone's device node, as the agent waits), `lvcreate --snapshot` (then
//!   `--setactivationskip n` for the clone), one process per operation, 20
//!   processes at once and one at a time.
//!
//! Run with `make bench FILTER=snapshot_pipeline`. Absolute times under
//! TCG mean little; the ratios (CLI time / agent time, above 1 when the
//! agent is faster) are the result.
use pillar_csi_lab::{
    agent::{AgentConfig, AgentProcess, Client, ZfsParent},
    bench::{bash_command, conditions, ms, processes_at_once},
    run, Lab, Result,
};
use pillar_csi_proto::agent::v1 as pb;
use std::time::{Duration, Instant};

const N: usize = 20;
const SIZE: u64 = 1 << 20;

fn fence(uid: &str) -> Option<pb::FenceToken> {
    Some(pb::FenceToken {
        volume_uid: uid.to_owned(),
        generation: 1,
    })
}

/// One backend under test: where its volumes live and how the CLI names
/// them.
struct Target {
    /// `zfs` or `lvm`.
    name: &'static str,
    /// The agent's pool or volume group.
    pool: String,
    /// The ZFS parent dataset or the VG, where the CLI works.
    cli_root: String,
}

impl Target {
    fn snapshot_cmd(&self, source: &str, snap: &str) -> String {
        match self.name {
            "zfs" => format!("zfs snapshot {}/{source}@{snap}", self.cli_root),
            _ => format!(
                "lvcreate -qq -y --snapshot -n {snap} {}/{source} >/dev/null",
                self.cli_root
            ),
        }
    }

    fn clone_cmd(&self, source: &str, snap: &str, clone: &str) -> String {
        match self.name {
            "zfs" => format!(
                "zfs clone {root}/{source}@{snap} {root}/{clone} && while [ ! -e /dev/zvol/{root}/{clone} ]; do sleep 0.01; done",
                root = self.cli_root
            ),
            _ => format!(
                "lvcreate -qq -y --snapshot --setactivationskip n -n {clone} {}/{snap} >/dev/null",
                self.cli_root
            ),
        }
    }

    fn cleanup_cmd(&self, source: &str, snaps: &[String], clones: &[String]) -> String {
        let root = &self.cli_root;
        match self.name {
            "zfs" => {
                let mut s = String::new();
                for c in clones {
                    s.push_str(&format!("zfs destroy {root}/{c}; "));
                }
                for n in snaps {
                    s.push_str(&format!("zfs destroy {root}/{source}@{n}; "));
                }
                s
            }
            _ => {
                let all: Vec<String> = clones
                    .iter()
                    .chain(snaps)
                    .map(|l| format!("{root}/{l}"))
                    .collect();
                format!("lvremove -qq -y {} >/dev/null", all.join(" "))
            }
        }
    }
}

/// The agent's side of one round: `n` snapshots, then `n` clones, at once
/// or one at a time; the two wall times.
async fn agent_round(
    c: &Client,
    t: &Target,
    source: &str,
    round: &str,
    at_once: bool,
) -> Result<(Duration, Duration, Vec<String>)> {
    let snapshot = |i: usize| {
        let mut c = c.clone();
        let (source, uid) = (format!("{}/{source}", t.pool), format!("{round}-s{i}"));
        async move {
            let r = c
                .create_snapshot(pb::CreateSnapshotRequest {
                    source_volume_id: source,
                    backend_type: 0,
                    snapshot_uid: uid,
                    fence: fence("bench-source"),
                })
                .await?
                .into_inner();
            let s = r.snapshot.unwrap_or_default();
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>((s.snapshot_id, s.size_bytes))
        }
    };
    let start = Instant::now();
    let mut ids = Vec::new();
    if at_once {
        let tasks: Vec<_> = (0..N).map(|i| tokio::spawn(snapshot(i))).collect();
        for t in tasks {
            ids.push(t.await??);
        }
    } else {
        for i in 0..N {
            ids.push(snapshot(i).await?);
        }
    }
    let snapshots = start.elapsed();
    let clone = |i: usize| {
        let mut c = c.clone();
        let id = format!("{}/{round}-c{i}", t.pool);
        // A clone is at least its snapshot's size (an LV's is whole extents).
        let (snap, bytes) = ids[i].clone();
        async move {
            c.create_volume(pb::CreateVolumeRequest {
                volume_id: id.clone(),
                backend_type: 0,
                capacity_bytes: bytes,
                fence: fence(&id.replace('/', "-")),
                source_snapshot_id: snap,
                ..Default::default()
            })
            .await?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(id)
        }
    };
    let start = Instant::now();
    let mut clones = Vec::new();
    if at_once {
        let tasks: Vec<_> = (0..N).map(|i| tokio::spawn(clone(i))).collect();
        for t in tasks {
            clones.push(t.await??);
        }
    } else {
        for i in 0..N {
            clones.push(clone(i).await?);
        }
    }
    let made = start.elapsed();
    // Deleted in the order that keeps nothing waiting: clones, then
    // snapshots.
    let mut c = c.clone();
    for id in &clones {
        c.delete_volume(pb::DeleteVolumeRequest {
            volume_id: id.clone(),
            backend_type: 0,
            fence: fence(&id.replace('/', "-")),
        })
        .await?;
    }
    for (id, _) in &ids {
        c.delete_snapshot(pb::DeleteSnapshotRequest {
            snapshot_id: id.clone(),
            backend_type: 0,
        })
        .await?;
    }
    Ok((snapshots, made, clones))
}

/// The CLI's side of one round, as [`agent_round`].
fn cli_round(t: &Target, source: &str, round: &str, at_once: bool) -> Result<(Duration, Duration)> {
    let snaps: Vec<String> = (0..N).map(|i| format!("{round}-s{i}")).collect();
    let clones: Vec<String> = (0..N).map(|i| format!("{round}-c{i}")).collect();
    let timed = |scripts: Vec<String>| -> Result<Duration> {
        if at_once {
            processes_at_once(scripts.iter().map(|s| bash_command(s)).collect())
        } else {
            let start = Instant::now();
            for s in &scripts {
                processes_at_once(vec![bash_command(s)])?;
            }
            Ok(start.elapsed())
        }
    };
    let snapshots = timed(snaps.iter().map(|s| t.snapshot_cmd(source, s)).collect())?;
    let made = timed(
        snaps
            .iter()
            .zip(&clones)
            .map(|(s, c)| t.clone_cmd(source, s, c))
            .collect(),
    )?;
    processes_at_once(vec![bash_command(&t.cleanup_cmd(source, &snaps, &clones))])?;
    Ok((snapshots, made))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> Result<()> {
    if !pillar_csi_lab::bench::selected("snapshot_pipeline") {
        return Ok(());
    }
    let lab = Lab::get();
    let parent = ZfsParent::create(&lab, "bench-snap")?;
    let mut config = AgentConfig::zvols_and_thin_lvs(&lab, "bench-snap", &parent, 4452, 3272)?;
    config.resync_interval_seconds = Some(0);
    config.state_dir = std::path::PathBuf::from("/var/lib/pillar-csi/bench-snap");
    std::fs::create_dir_all(&config.state_dir)?;
    let agent = AgentProcess::start(config).await?;
    let mut c = agent.client().await?;
    println!("snapshot_pipeline: {}", conditions());

    let targets = [
        Target {
            name: "zfs",
            pool: lab.pool.clone(),
            cli_root: parent.dataset(),
        },
        Target {
            name: "lvm",
            pool: lab.vg.clone(),
            cli_root: lab.vg.clone(),
        },
    ];
    for t in &targets {
        let source = format!("bench-src-{}", t.name);
        c.create_volume(pb::CreateVolumeRequest {
            volume_id: format!("{}/{source}", t.pool),
            backend_type: 0,
            capacity_bytes: SIZE,
            fence: fence("bench-source"),
            zfs_properties: [("sparse".to_owned(), "true".to_owned())].into(),
            ..Default::default()
        })
        .await?;
        for (at_once, how) in [(true, "20 at once"), (false, "20 one at a time")] {
            let round = if at_once { "a" } else { "o" };
            let (a_snap, a_clone, _) =
                agent_round(&c, t, &source, &format!("ag{round}"), at_once).await?;
            let (c_snap, c_clone) = cli_round(t, &source, &format!("cli{round}"), at_once)?;
            println!(
                "{} {how}: snapshots agent {:.0} ms, CLI {:.0} ms (CLI/agent {:.2}x); clones agent {:.0} ms, CLI {:.0} ms (CLI/agent {:.2}x)",
                t.name,
                ms(a_snap),
                ms(c_snap),
                c_snap.as_secs_f64() / a_snap.as_secs_f64(),
                ms(a_clone),
                ms(c_clone),
                c_clone.as_secs_f64() / a_clone.as_secs_f64(),
            );
        }
        c.delete_volume(pb::DeleteVolumeRequest {
            volume_id: format!("{}/{source}", t.pool),
            backend_type: 0,
            fence: fence("bench-source"),
        })
        .await?;
    }
    let left = run("lvs", &["--noheadings", "-o", "lv_name", &lab.vg])?;
    if left.contains("bench-src") || !parent.children()?.is_empty() {
        return Err(format!(
            "the benchmark left volumes: {left} {:?}",
            parent.children()?
        )
        .into());
    }
    Ok(())
}
