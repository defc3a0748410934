//! Benchmark in the kernel lab: NodeStageVolume + NodePublishVolume of 20
//! filesystem volumes over NVMe/TCP through `pillar-csi node`, against the
//! per-volume process pipeline other drivers run (`nvme connect`, a wait for
//! the disk, `blkid`, `mkfs.ext4`, `mount`, `mount --bind`), one volume at a
//! time and all 20 at once. Both sides run mkfs with the same options
//! (`csi::node::format::mkfs_args`). Both sides' time is split by step: the
//! peer's by timing each process, ours from the plugin's `step timed` log
//! lines (`csi::node::timed`). The floor is 20 bare connects through
//! `/dev/nvme-fabrics` (no disk wait, no filesystem): the kernel holds one
//! global mutex (`nvmf_dev_mutex`) across `nvmf_create_ctrl`, so connects
//! run one at a time whoever asks.
//!
//! Run with `make bench FILTER=node`. Absolute times under TCG mean little;
//! the ratios are the result (also written to `node-bench.txt`).
use pillar_csi_lab::{
    agent::{pb, AgentConfig, AgentProcess, ZfsParent},
    csi::{csi_pb, NodePlugin},
    run, Lab, Result,
};
use std::{
    collections::{BTreeMap, HashMap},
    fs,
    io::{Read, Write},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

const VOLUMES: usize = 20;
const SIZE: u64 = 64 << 20;
const PORT: u16 = 4450;

/// One exported volume.
#[derive(Clone)]
struct Vol {
    csi_id: String,
    nqn: String,
    nsid: u32,
    /// The storage side's device (wiped between rounds).
    device: String,
}

fn cap() -> Option<csi_pb::VolumeCapability> {
    use csi_pb::volume_capability::{access_mode::Mode, AccessMode, AccessType, MountVolume};
    Some(csi_pb::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: "ext4".into(),
            ..Default::default()
        })),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    })
}

fn dirs(root: &Path, i: usize) -> (PathBuf, PathBuf) {
    (
        root.join(format!("staging-{i}")),
        root.join(format!("target-{i}")),
    )
}

/// Ours: Stage + Publish through the plugin.
async fn ours(plugin: &NodePlugin, v: Vol, i: usize, root: PathBuf) -> Result<()> {
    let mut n = plugin.node().await?;
    let (staging, target) = dirs(&root, i);
    let context: HashMap<String, String> = HashMap::from([
        ("protocol".into(), "nvmeof-tcp".into()),
        ("address".into(), "127.0.0.1".into()),
        ("port".into(), PORT.to_string()),
        ("target".into(), v.nqn.clone()),
        ("lun".into(), v.nsid.to_string()),
    ]);
    n.node_stage_volume(csi_pb::NodeStageVolumeRequest {
        volume_id: v.csi_id.clone(),
        publish_context: context.clone(),
        staging_target_path: staging.display().to_string(),
        volume_capability: cap(),
        ..Default::default()
    })
    .await?;
    n.node_publish_volume(csi_pb::NodePublishVolumeRequest {
        volume_id: v.csi_id.clone(),
        publish_context: context,
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: cap(),
        ..Default::default()
    })
    .await?;
    Ok(())
}

async fn ours_undo(plugin: &NodePlugin, v: &Vol, i: usize, root: &Path) -> Result<()> {
    let mut n = plugin.node().await?;
    let (staging, target) = dirs(root, i);
    n.node_unpublish_volume(csi_pb::NodeUnpublishVolumeRequest {
        volume_id: v.csi_id.clone(),
        target_path: target.display().to_string(),
    })
    .await?;
    n.node_unstage_volume(csi_pb::NodeUnstageVolumeRequest {
        volume_id: v.csi_id.clone(),
        staging_target_path: staging.display().to_string(),
    })
    .await?;
    Ok(())
}

/// Seconds per step of the peer pipeline, summed over volumes.
#[derive(Default, Debug, Clone, Copy)]
struct Steps {
    connect: f64,
    device: f64,
    blkid: f64,
    mkfs: f64,
    mount: f64,
}

/// The peer: one process per step, as the JavaScript and Go drivers run.
fn peer(v: &Vol, i: usize, root: &Path, steps: &Mutex<Steps>) -> Result<()> {
    let (staging, target) = dirs(root, i);
    let mut t = Instant::now();
    let mut lap = |f: &mut dyn FnMut(&mut Steps, f64)| {
        let s = t.elapsed().as_secs_f64();
        t = Instant::now();
        if let Ok(mut steps) = steps.lock() {
            f(&mut steps, s);
        }
    };
    run(
        "nvme",
        &[
            "connect",
            "-t",
            "tcp",
            "-a",
            "127.0.0.1",
            "-s",
            &PORT.to_string(),
            "-n",
            &v.nqn,
        ],
    )?;
    lap(&mut |s, d| s.connect += d);
    let dev = loop {
        if let Some(dev) = disk_of(&v.nqn, v.nsid) {
            if Path::new(&dev).exists() {
                break dev;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    lap(&mut |s, d| s.device += d);
    // blkid exits 2 when it finds no signature: blank, so format.
    let blank = std::process::Command::new("blkid")
        .args(["-p", &dev])
        .output()?
        .status
        .code()
        == Some(2);
    lap(&mut |s, d| s.blkid += d);
    if !blank {
        return Err(format!("{dev} is not blank: the round would not format").into());
    }
    run("mkfs.ext4", &csi::node::format::mkfs_args("ext4", &dev)?)?;
    lap(&mut |s, d| s.mkfs += d);
    fs::create_dir_all(&staging)?;
    fs::create_dir_all(&target)?;
    run(
        "mount",
        &["-t", "ext4", &dev, &staging.display().to_string()],
    )?;
    run(
        "mount",
        &[
            "--bind",
            &staging.display().to_string(),
            &target.display().to_string(),
        ],
    )?;
    lap(&mut |s, d| s.mount += d);
    Ok(())
}

fn peer_undo(v: &Vol, i: usize, root: &Path) -> Result<()> {
    let (staging, target) = dirs(root, i);
    run("umount", &[&target.display().to_string()])?;
    run("umount", &[&staging.display().to_string()])?;
    run("nvme", &["disconnect", "-n", &v.nqn])?;
    Ok(())
}

/// The disk of namespace `nsid` of subsystem `nqn` (sysfs), if shown.
fn disk_of(nqn: &str, nsid: u32) -> Option<String> {
    fs::read_dir("/sys/block")
        .ok()?
        .filter_map(|e| e.ok())
        .find_map(|e| {
            let p = e.path();
            let read = |f: &str| {
                fs::read_to_string(p.join(f))
                    .map(|s| s.trim().to_owned())
                    .ok()
            };
            (read("nsid") == Some(nsid.to_string())
                && read("device/subsysnqn").as_deref() == Some(nqn))
            .then(|| format!("/dev/{}", e.file_name().to_string_lossy()))
        })
}

/// Seconds per step of ours, summed over the plugin's `step timed` lines
/// in `log` (`step="connect" ms=12.5`; the log from where a round began).
fn our_steps(log: &str) -> BTreeMap<String, f64> {
    let mut steps = BTreeMap::new();
    for line in log.lines().filter(|l| l.contains("step timed")) {
        let field = |key: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .map(|v| v.trim_matches('"').to_owned())
        };
        if let (Some(step), Some(ms)) = (field("step="), field("ms=")) {
            if let Ok(ms) = ms.parse::<f64>() {
                *steps.entry(step).or_insert(0.0) += ms / 1000.0;
            }
        }
    }
    steps
}

fn show(steps: &BTreeMap<String, f64>) -> String {
    ["connect", "device", "probe", "mkfs", "mount", "bind"]
        .iter()
        .map(|k| format!("{k} {:.2}", steps.get(*k).copied().unwrap_or(0.0)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// One bare connect through `/dev/nvme-fabrics`; returns the controller.
fn bare_connect(v: &Vol) -> Result<String> {
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/nvme-fabrics")?;
    f.write_all(
        format!(
            "nqn={},transport=tcp,traddr=127.0.0.1,trsvcid={PORT}",
            v.nqn
        )
        .as_bytes(),
    )?;
    let mut reply = String::new();
    f.read_to_string(&mut reply)?;
    let instance = reply
        .trim()
        .split(',')
        .find_map(|kv| kv.strip_prefix("instance="))
        .ok_or_else(|| format!("unexpected reply {reply:?}"))?;
    Ok(format!("nvme{instance}"))
}

fn bare_disconnect(ctrls: &[String]) -> Result<()> {
    for c in ctrls {
        fs::write(format!("/sys/class/nvme/{c}/delete_controller"), "1")?;
    }
    Ok(())
}

/// The floor: 20 bare connects one at a time, then all at once.
fn floor(vols: &[Vol]) -> Result<(Duration, Duration)> {
    let start = Instant::now();
    let ctrls = vols.iter().map(bare_connect).collect::<Result<Vec<_>>>()?;
    let seq = start.elapsed();
    bare_disconnect(&ctrls)?;
    let start = Instant::now();
    let threads: Vec<_> = vols
        .iter()
        .map(|v| {
            let v = v.clone();
            std::thread::spawn(move || bare_connect(&v).map_err(|e| e.to_string()))
        })
        .collect();
    let mut ctrls = Vec::new();
    for t in threads {
        ctrls.push(t.join().map_err(|_| "a connect thread panicked")??);
    }
    let par = start.elapsed();
    bare_disconnect(&ctrls)?;
    Ok((seq, par))
}

/// Removes every signature from the storage side, so each round formats,
/// and checks that libblkid sees each volume blank. The initiators write
/// through nvmet, past the storage side's page cache of the zvol, so that
/// cache is dropped first (else wipefs reads stale blocks and erases
/// nothing).
fn wipe(vols: &[Vol]) -> Result<()> {
    for v in vols {
        run("blockdev", &["--flushbufs", &v.device])?;
        run("wipefs", &["-a", "-q", &v.device])?;
        run("blockdev", &["--flushbufs", &v.device])?;
        let probe = std::process::Command::new("blkid")
            .args(["-p", &v.device])
            .output()?;
        if probe.status.code() != Some(2) {
            return Err(format!(
                "{} is not blank after wipefs: {}",
                v.device,
                String::from_utf8_lossy(&probe.stdout)
            )
            .into());
        }
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> Result<()> {
    if !pillar_csi_lab::bench::selected("node_pipeline") {
        return Ok(());
    }
    let lab = Lab::get();
    let parent = ZfsParent::create(&lab, "bench-node")?;
    let mut config = AgentConfig::new(&lab, "bench-node", vec![parent.backend()], PORT, 3290)?;
    config.resync_interval_seconds = Some(0);
    config.state_dir = PathBuf::from("/var/lib/pillar-csi/bench-node-agent");
    fs::create_dir_all(&config.state_dir)?;
    let agent = AgentProcess::start(config).await?;
    let mut c = agent.client().await?;
    let mut vols = Vec::new();
    for i in 0..VOLUMES {
        let id = format!("{}/b{i}", lab.pool);
        let fence = Some(pb::FenceToken {
            volume_uid: format!("uid-{i}"),
            generation: 1,
        });
        let created = c
            .create_volume(pb::CreateVolumeRequest {
                volume_id: id.clone(),
                backend_type: pb::BackendType::ZfsZvol as i32,
                capacity_bytes: SIZE,
                fence: fence.clone(),
                zfs_properties: [("sparse".to_owned(), "true".to_owned())].into(),
                ..Default::default()
            })
            .await?
            .into_inner();
        let e = c
            .export_volume(pb::ExportVolumeRequest {
                volume_id: id.clone(),
                backend_type: pb::BackendType::ZfsZvol as i32,
                protocol_type: pb::ProtocolType::NvmeofTcp as i32,
                fence,
                acl_enabled: false,
                allowed_initiators: vec![],
                chap: None,
            })
            .await?
            .into_inner();
        vols.push(Vol {
            csi_id: format!("storage-1/nvmeof-tcp/zfs-zvol/{id}"),
            nqn: e.target_id,
            nsid: e.lun,
            device: created.device_path,
        });
    }
    let plugin =
        NodePlugin::start_in(&lab, "bench-node", "/var/lib/pillar-csi/bench-node".into()).await?;
    let root = PathBuf::from("/var/lib/pillar-csi/bench-kubelet");
    fs::create_dir_all(&root)?;
    let plugin = Arc::new(plugin);

    // The floor first: no disk, no filesystem, only the kernel's connects.
    let (floor_seq, floor_par) = floor(&vols)?;

    // Ours, one at a time.
    wipe(&vols)?;
    let mark = plugin.log().len();
    let start = Instant::now();
    for (i, v) in vols.iter().enumerate() {
        ours(&plugin, v.clone(), i, root.clone()).await?;
    }
    let ours_seq = start.elapsed();
    let ours_seq_steps = our_steps(plugin.log().get(mark..).unwrap_or_default());
    for (i, v) in vols.iter().enumerate() {
        ours_undo(&plugin, v, i, &root).await?;
    }
    // Ours, all at once.
    wipe(&vols)?;
    let mark = plugin.log().len();
    let start = Instant::now();
    let tasks: Vec<_> = vols
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let (p, v, r) = (plugin.clone(), v.clone(), root.clone());
            tokio::spawn(async move { ours(&p, v, i, r).await.map_err(|e| e.to_string()) })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    let ours_par = start.elapsed();
    let ours_par_steps = our_steps(plugin.log().get(mark..).unwrap_or_default());
    for (i, v) in vols.iter().enumerate() {
        ours_undo(&plugin, v, i, &root).await?;
    }

    // The peer, one at a time.
    wipe(&vols)?;
    let seq_steps = Mutex::new(Steps::default());
    let start = Instant::now();
    for (i, v) in vols.iter().enumerate() {
        peer(v, i, &root, &seq_steps)?;
    }
    let peer_seq = start.elapsed();
    for (i, v) in vols.iter().enumerate() {
        peer_undo(v, i, &root)?;
    }
    // The peer, all at once.
    wipe(&vols)?;
    let par_steps = Arc::new(Mutex::new(Steps::default()));
    let start = Instant::now();
    let threads: Vec<_> = vols
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let (v, r, s) = (v.clone(), root.clone(), par_steps.clone());
            std::thread::spawn(move || peer(&v, i, &r, &s).map_err(|e| e.to_string()))
        })
        .collect();
    for t in threads {
        t.join().map_err(|_| "a peer thread panicked")??;
    }
    let peer_par = start.elapsed();
    for (i, v) in vols.iter().enumerate() {
        peer_undo(v, i, &root)?;
    }

    let seq = seq_steps.lock().map(|s| *s).unwrap_or_default();
    let par = par_steps.lock().map(|s| *s).unwrap_or_default();
    let secs = |d: Duration| d.as_secs_f64();
    let report = format!(
        "node_pipeline: stage+publish of {VOLUMES} ext4 volumes over NVMe/TCP (mkfs.ext4 {mkfs})\n\
         sequential: ours {:.2} s, peer pipeline {:.2} s, ratio {:.2}x; connect floor {:.2} s (ours {:.1}x it, peer {:.1}x)\n\
         20 at once: ours {:.2} s, peer pipeline {:.2} s, ratio {:.2}x; connect floor {:.2} s (ours {:.1}x it, peer {:.1}x)\n\
         connect floor: 20 at once take {:.2}x the time of one at a time\n\
         our steps, sequential (s, summed): {}\n\
         our steps, 20 at once (s, summed over volumes): {}\n\
         peer steps, sequential (s, summed): connect {:.2}, device wait {:.2}, blkid {:.2}, mkfs {:.2}, mount {:.2}\n\
         peer steps, 20 at once (s, summed over volumes): connect {:.2}, device wait {:.2}, blkid {:.2}, mkfs {:.2}, mount {:.2}\n",
        secs(ours_seq),
        secs(peer_seq),
        secs(peer_seq) / secs(ours_seq),
        secs(floor_seq),
        secs(ours_seq) / secs(floor_seq),
        secs(peer_seq) / secs(floor_seq),
        secs(ours_par),
        secs(peer_par),
        secs(peer_par) / secs(ours_par),
        secs(floor_par),
        secs(ours_par) / secs(floor_par),
        secs(peer_par) / secs(floor_par),
        secs(floor_par) / secs(floor_seq),
        show(&ours_seq_steps),
        show(&ours_par_steps),
        seq.connect, seq.device, seq.blkid, seq.mkfs, seq.mount,
        par.connect, par.device, par.blkid, par.mkfs, par.mount,
        mkfs = csi::node::format::mkfs_args("ext4", "DEV")?.join(" "),
    );
    print!("{report}");
    fs::write(lab.work.join("node-bench.txt"), &report)?;
    for i in 0..VOLUMES {
        let id = format!("{}/b{i}", lab.pool);
        let fence = Some(pb::FenceToken {
            volume_uid: format!("uid-{i}"),
            generation: 1,
        });
        c.unexport_volume(pb::UnexportVolumeRequest {
            volume_id: id.clone(),
            protocol_type: pb::ProtocolType::NvmeofTcp as i32,
            fence: fence.clone(),
        })
        .await?;
    }
    drop(agent);
    Ok(())
}
