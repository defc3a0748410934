//! The storage node reboots under an NFS writer: a filesystem volume takes a
//! stream of fsynced records through the kernel's NFS client while the
//! agent is killed, the NFS server stopped, its export table emptied and
//! the filesystem unmounted (what a power cycle leaves). Then the node
//! boots as a Debian storage node does: ZFS mounts its filesystems, the
//! NFS server's start applies the exports files (the agent's are on disk
//! in /etc/exports.d) and serves, and the agent starts and finds its
//! volume mounted and exported as its marks say. The client's hard mount
//! holds the writer's calls and resumes them on the same file handles (the
//! export's `fsid` is the volume's, so no `ESTALE`), and every record an
//! fsync acknowledged reads back on the storage node.
//!
//! Found here: an NFS server that serves before the volume's export is back
//! answers the clients' held calls with `ESTALE`, which reaches the writer
//! (a file handle whose export it does not know is stale to nfsd). The
//! storage node's boot order (ZFS mounts, then the NFS server with the
//! exports files) is what keeps that window shut; docs/install.md says so.
//!
//! One test in its own binary: stopping the NFS server would stall every
//! other NFS test in the same guest.
//!
//! Run with `tests/lab/run tests -- nfs_reboot`.
use pillar_csi_lab::{
    agent::{pb, AgentConfig, AgentProcess},
    nfs::{exported, unmount, zget, FsParent, NfsMount, CLIENT},
    progress::wait_for,
    run, Lab, Result,
};
use std::{
    io::Write,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

const MIB: u64 = 1 << 20;
/// Records acknowledged before the reboot, and again after it.
const BEFORE: u64 = 8;
const AFTER: u64 = 8;
/// How long the storage side stays down.
const DOWN: Duration = Duration::from_secs(20);
/// How long the writer may take to get past the reboot.
const RESUME_BOUND: Duration = Duration::from_secs(240);

/// The record `n`: one line, so the storage side's file reads back in order.
fn record(n: u64) -> String {
    format!("record {n:08}\n")
}

/// What the writer did.
#[derive(Debug, Default)]
struct Report {
    attempted: u64,
    errors: Vec<String>,
    acknowledged: u64,
}

/// Appends records to `path` through the NFS mount, each fsynced before it
/// counts as acknowledged, until `stop`; a failed call is retried.
fn writer(path: PathBuf, stop: Arc<AtomicBool>, acked: Arc<AtomicU64>) -> Report {
    let mut report = Report::default();
    let mut n = 0;
    while !stop.load(Ordering::SeqCst) {
        report.attempted += 1;
        let wrote = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| {
                f.write_all(record(n).as_bytes())?;
                f.sync_all()
            });
        match wrote {
            Ok(()) => {
                report.acknowledged = n + 1;
                acked.store(n + 1, Ordering::SeqCst);
                n += 1;
            }
            Err(e) => {
                report.errors.push(e.to_string());
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    report
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the kernel lab"]
async fn nfs_reboot_of_the_storage_side_under_a_writer_loses_no_write() -> Result<()> {
    let lab = Lab::get();
    let parent = FsParent::create(&lab, "nfsr")?;
    let name = lab.unique("nfsreboot");
    let config = AgentConfig::new(
        &lab,
        &name,
        vec![format!("zfs-dataset={}", parent.dataset)],
        4433,
        3273,
    )?;
    let mut agent = AgentProcess::start(config).await?;
    let mut c = agent.client().await?;
    let short = lab.unique("fsvol");
    let id = format!("{}/{short}", parent.pool());
    let volume = format!("{}/{short}", parent.dataset);
    let fence = Some(pb::FenceToken {
        volume_uid: lab.unique("uid"),
        generation: 1,
    });
    c.create_volume(pb::CreateVolumeRequest {
        volume_id: id.clone(),
        backend_type: pb::BackendType::ZfsDataset as i32,
        capacity_bytes: 64 * MIB,
        fence: fence.clone(),
        ..Default::default()
    })
    .await?;
    let path = c
        .export_volume(pb::ExportVolumeRequest {
            volume_id: id.clone(),
            backend_type: pb::BackendType::ZfsDataset as i32,
            protocol_type: pb::ProtocolType::Nfs as i32,
            fence: fence.clone(),
            acl_enabled: true,
            allowed_initiators: vec![CLIENT.into()],
            chap: None,
        })
        .await?
        .into_inner()
        .target_id;
    let mnt = lab.work.join(format!("{name}.mnt"));
    let mount = NfsMount::mount(&path, &mnt)?;

    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let writing = std::thread::spawn({
        let (file, stop, acked) = (mnt.join("log"), stop.clone(), acked.clone());
        move || writer(file, stop, acked)
    });
    wait_for(&acked, BEFORE, Duration::from_secs(60)).await?;

    // The power cycle: the agent and the NFS server gone, the kernel's
    // export table empty, the filesystem unmounted.
    agent.kill()?;
    run("rpc.nfsd", &["0"])?;
    run("exportfs", &["-ua"])?;
    unmount(&volume)?;
    let at_reboot = acked.load(Ordering::SeqCst);
    tokio::time::sleep(DOWN).await;
    let held = acked.load(Ordering::SeqCst);

    // It boots: ZFS mounts its filesystems, the NFS server applies the
    // exports files and serves, then the agent starts.
    run("zfs", &["mount", &volume])?;
    run("exportfs", &["-r"])?;
    run("rpc.nfsd", &["4"])?;
    agent.restart().await?;
    assert_eq!(zget(&volume, "mounted")?, "yes", "mounted again at start");
    assert!(exported()?.contains(&path), "exported again at start");
    let resumed = wait_for(&acked, at_reboot + AFTER, RESUME_BOUND).await;
    stop.store(true, Ordering::SeqCst);
    let report = writing.join().map_err(|_| "the writer panicked")?;
    drop(mount);
    resumed?;

    // Every acknowledged record is on the storage node, in order.
    let text = std::fs::read_to_string(Path::new(&path).join("log"))?;
    let expected: String = (0..report.acknowledged).map(record).collect();
    println!(
        "nfs reboot under a writer: {} writes attempted, {} acknowledged ({at_reboot} before the outage, {} during it), {} failed calls: {:?}",
        report.attempted,
        report.acknowledged,
        held - at_reboot,
        report.errors.len(),
        report.errors.iter().take(3).collect::<Vec<_>>()
    );
    assert!(
        text.starts_with(&expected),
        "acknowledged records lost: the storage node holds {} bytes, {} acknowledged",
        text.len(),
        expected.len()
    );
    assert_eq!(
        held, at_reboot,
        "no write is acknowledged while the server is down"
    );
    assert!(
        report.errors.iter().all(|e| !e.contains("Stale")),
        "the file handles outlive the reboot: {:?}",
        report.errors
    );

    // Gone again through the agent: no exports file is left behind.
    let mut c = agent.client().await?;
    c.unexport_volume(pb::UnexportVolumeRequest {
        volume_id: id.clone(),
        protocol_type: pb::ProtocolType::Nfs as i32,
        fence: fence.clone(),
    })
    .await?;
    c.delete_volume(pb::DeleteVolumeRequest {
        volume_id: id.clone(),
        backend_type: pb::BackendType::ZfsDataset as i32,
        fence,
    })
    .await?;
    assert!(!exported()?.contains(&path));
    Ok(())
}
