//! The storage node reboots under NFS writers: a ZFS filesystem volume and
//! a directory volume (on an XFS with project quotas) each take a stream
//! of fsynced records through the kernel's NFS client while the agent is
//! killed, the NFS server stopped, its export table emptied and both
//! filesystems unmounted (what a power cycle leaves). Then the node boots
//! as a Debian storage node does: ZFS mounts its filesystems and fstab the
//! XFS, the NFS server's start applies the exports files (the agent's are
//! on disk in /etc/exports.d) and serves, and the agent starts and finds
//! its volumes mounted and exported as its marks say. The client's hard
//! mounts hold the writers' calls and resume them on the same file handles
//! (each export's `fsid` is its volume's, so no `ESTALE`), and every record
//! an fsync acknowledged reads back on the storage node.
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
    project_fs::ProjectFs,
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

/// One volume served to the client and written to through its mount.
struct Served {
    id: String,
    backend_type: i32,
    /// The exported path on the storage node.
    path: String,
    mount: NfsMount,
    acked: Arc<AtomicU64>,
    writing: std::thread::JoinHandle<Report>,
}

/// Creates volume `id` of `backend_type`, exports it to the client, mounts
/// it at `mnt` and starts its writer (stopped by `stop`).
async fn serve(
    c: &mut pillar_csi_lab::agent::Client,
    id: &str,
    backend_type: pb::BackendType,
    fence: &Option<pb::FenceToken>,
    mnt: PathBuf,
    stop: &Arc<AtomicBool>,
) -> Result<Served> {
    let backend_type = backend_type as i32;
    c.create_volume(pb::CreateVolumeRequest {
        volume_id: id.to_owned(),
        backend_type,
        capacity_bytes: 64 * MIB,
        fence: fence.clone(),
        ..Default::default()
    })
    .await?;
    let path = c
        .export_volume(pb::ExportVolumeRequest {
            volume_id: id.to_owned(),
            backend_type,
            protocol_type: pb::ProtocolType::Nfs as i32,
            fence: fence.clone(),
            acl_enabled: true,
            allowed_initiators: vec![CLIENT.into()],
            chap: None,
        })
        .await?
        .into_inner()
        .target_id;
    let mount = NfsMount::mount(&path, &mnt)?;
    let acked = Arc::new(AtomicU64::new(0));
    let writing = std::thread::spawn({
        let (file, stop, acked) = (mnt.join("log"), stop.clone(), acked.clone());
        move || writer(file, stop, acked)
    });
    Ok(Served {
        id: id.to_owned(),
        backend_type,
        path,
        mount,
        acked,
        writing,
    })
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the kernel lab"]
async fn nfs_reboot_of_the_storage_side_under_a_writer_loses_no_write() -> Result<()> {
    let lab = Lab::get();
    let parent = FsParent::create(&lab, "nfsr")?;
    let xfs = ProjectFs::xfs(&lab, "nfsrdirs", "prjquota")?;
    let root = xfs.at.join("volumes");
    std::fs::create_dir(&root)?;
    let name = lab.unique("nfsreboot");
    let config = AgentConfig::new(
        &lab,
        &name,
        vec![
            format!("zfs-dataset={}", parent.dataset),
            format!("directory=dirs:{}", root.display()),
        ],
        4433,
        3273,
    )?;
    let mut agent = AgentProcess::start(config).await?;
    let mut c = agent.client().await?;
    let short = lab.unique("fsvol");
    let volume = format!("{}/{short}", parent.dataset);
    let fence = Some(pb::FenceToken {
        volume_uid: lab.unique("uid"),
        generation: 1,
    });
    let stop = Arc::new(AtomicBool::new(false));
    let mut served = Vec::new();
    for (id, kind) in [
        (
            format!("{}/{short}", parent.pool()),
            pb::BackendType::ZfsDataset,
        ),
        (
            format!("dirs/{}", lab.unique("dirvol")),
            pb::BackendType::Directory,
        ),
    ] {
        let mnt = lab.work.join(format!("{name}-{}.mnt", served.len()));
        served.push(serve(&mut c, &id, kind, &fence, mnt, &stop).await?);
    }
    for s in &served {
        wait_for(&s.acked, BEFORE, Duration::from_secs(60)).await?;
    }

    // The power cycle: the agent and the NFS server gone, the kernel's
    // export table empty, the filesystems unmounted.
    agent.kill()?;
    run("rpc.nfsd", &["0"])?;
    run("exportfs", &["-ua"])?;
    unmount(&volume)?;
    xfs.unmount()?;
    let at_reboot: Vec<u64> = served
        .iter()
        .map(|s| s.acked.load(Ordering::SeqCst))
        .collect();
    tokio::time::sleep(DOWN).await;
    let held: Vec<u64> = served
        .iter()
        .map(|s| s.acked.load(Ordering::SeqCst))
        .collect();

    // It boots: ZFS mounts its filesystems and fstab the XFS, the NFS
    // server applies the exports files and serves, then the agent starts.
    run("zfs", &["mount", &volume])?;
    xfs.mount()?;
    run("exportfs", &["-r"])?;
    run("rpc.nfsd", &["4"])?;
    agent.restart().await?;
    assert_eq!(zget(&volume, "mounted")?, "yes", "mounted again at start");
    let table = exported()?;
    for s in &served {
        assert!(
            table.contains(&s.path),
            "{} exported again at start",
            s.path
        );
    }
    let mut late = Vec::new();
    for (s, at) in served.iter().zip(&at_reboot) {
        if let Err(e) = wait_for(&s.acked, at + AFTER, RESUME_BOUND).await {
            late.push(format!("{}: {e}", s.id));
        }
    }
    stop.store(true, Ordering::SeqCst);
    let mut c = agent.client().await?;
    for ((s, at_reboot), held) in served.into_iter().zip(at_reboot).zip(held) {
        let report = s.writing.join().map_err(|_| "a writer panicked")?;
        drop(s.mount);
        if !late.is_empty() {
            return Err(late.join("; ").into());
        }

        // Every acknowledged record is on the storage node, in order.
        let text = std::fs::read_to_string(Path::new(&s.path).join("log"))?;
        let expected: String = (0..report.acknowledged).map(record).collect();
        println!(
            "nfs reboot under a writer of {}: {} writes attempted, {} acknowledged ({at_reboot} before the outage, {} during it), {} failed calls: {:?}",
            s.id,
            report.attempted,
            report.acknowledged,
            held - at_reboot,
            report.errors.len(),
            report.errors.iter().take(3).collect::<Vec<_>>()
        );
        assert!(
            text.starts_with(&expected),
            "{}: acknowledged records lost: the storage node holds {} bytes, {} acknowledged",
            s.id,
            text.len(),
            expected.len()
        );
        assert_eq!(
            held, at_reboot,
            "{}: no write is acknowledged while the server is down",
            s.id
        );
        assert!(
            report.errors.iter().all(|e| !e.contains("Stale")),
            "{}: the file handles outlive the reboot: {:?}",
            s.id,
            report.errors
        );

        // Gone again through the agent: no exports file is left behind.
        c.unexport_volume(pb::UnexportVolumeRequest {
            volume_id: s.id.clone(),
            protocol_type: pb::ProtocolType::Nfs as i32,
            fence: fence.clone(),
        })
        .await?;
        c.delete_volume(pb::DeleteVolumeRequest {
            volume_id: s.id.clone(),
            backend_type: s.backend_type,
            fence: fence.clone(),
        })
        .await?;
        assert!(!exported()?.contains(&s.path));
    }
    Ok(())
}
