//! The storage node reboots under a writer: a staged ext4 volume takes a
//! stream of fsynced records while the agent is killed and the kernel
//! target emptied (as a power cycle leaves configfs), then the agent starts
//! again and makes its exports again. The host's controller or session
//! reconnects to the same namespace or LUN, the writer's held I/O goes on,
//! and every record an fsync acknowledged reads back from the storage side.
//!
//! One test in its own binary: emptying the kernel target would cut every
//! other test's exports in the same guest.
//!
//! Run with `tests/lab/run tests -- node_reboot`.
use pillar_csi_lab::{block::pattern, node_bed::*, progress::wait_for, run, Result};
use std::{
    fs,
    os::unix::fs::FileExt,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

/// The size of one record.
const RECORD: usize = 4096;
/// Records acknowledged before the reboot, and again after it.
const BEFORE: u64 = 8;
const AFTER: u64 = 8;
/// How long the storage side stays down: longer than the NVMe host's I/O
/// timeout (30 s), so held I/O must outlast it.
const DOWN: Duration = Duration::from_secs(45);
/// How long the writer may take to get past the reboot.
const RESUME_BOUND: Duration = Duration::from_secs(240);

/// What the writer did.
#[derive(Debug, Default)]
struct Report {
    attempted: u64,
    failed: u64,
    acknowledged: Vec<u64>,
}

/// Writes record 1, 2, ... (each `pattern(n)`, at offset `n * RECORD`) and
/// fsyncs it, until `stop`; `acked` is the last acknowledged record.
fn writer(path: PathBuf, stop: Arc<AtomicBool>, acked: Arc<AtomicU64>) -> Report {
    let mut report = Report::default();
    let file = match fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&path)
    {
        Ok(f) => f,
        Err(_) => {
            report.failed = 1;
            return report;
        }
    };
    let mut n = 0;
    while !stop.load(Ordering::SeqCst) {
        n += 1;
        report.attempted += 1;
        let written = file
            .write_all_at(&pattern(n, RECORD), n * RECORD as u64)
            .and_then(|()| file.sync_data());
        match written {
            Ok(()) => {
                report.acknowledged.push(n);
                acked.store(n, Ordering::SeqCst);
            }
            Err(_) => report.failed += 1,
        }
    }
    report
}

/// The namespace's `device_uuid` in nvmet, as hosts see it.
fn namespace_uuid(nqn: &str) -> Result<String> {
    let path = format!("/sys/kernel/config/nvmet/subsystems/{nqn}/namespaces/1/device_uuid");
    Ok(fs::read_to_string(path)?.trim().to_owned())
}

/// The records of `file` on the storage-side `device`, mounted read-only
/// at `witness`, that differ from what was acknowledged.
fn lost_records(device: &Path, witness: &Path, acknowledged: &[u64]) -> Result<u64> {
    fs::create_dir_all(witness)?;
    run(
        "mount",
        &[
            "-o",
            "ro",
            &device.display().to_string(),
            &witness.display().to_string(),
        ],
    )?;
    let read = fs::read(witness.join("log"));
    run("umount", &[&witness.display().to_string()])?;
    let bytes = read?;
    Ok(acknowledged
        .iter()
        .filter(|&&n| {
            let at = n as usize * RECORD;
            bytes.get(at..at + RECORD) != Some(&pattern(n, RECORD)[..])
        })
        .count() as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn node_reboot_of_the_storage_side_under_a_writer_loses_no_write() -> Result<()> {
    let mut b = Bench::new("node-reboot").await?;
    for (backend, protocol, name) in [(ZVOL, NVME, "nvme"), (ZVOL, ISCSI, "iscsi")] {
        let v = b.volume(backend, protocol, 64 << 20).await?;
        let mut n = b.plugin.node().await?;
        let staging = b.path("staging");
        n.node_stage_volume(stage_req(&v, &staging, mount_cap("ext4")))
            .await?;
        let identity = (protocol == NVME)
            .then(|| namespace_uuid(&v.context["target"]))
            .transpose()?;

        let (stop, acked) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
        );
        let handle = {
            let (path, stop, acked) = (staging.join("log"), stop.clone(), acked.clone());
            tokio::task::spawn_blocking(move || writer(path, stop, acked))
        };
        wait_for(&acked, BEFORE, RESUME_BOUND).await?;
        let outage = b.reboot_storage(DOWN).await?;
        let at_reboot = acked.load(Ordering::SeqCst);
        if let Some(before) = &identity {
            assert_eq!(
                &namespace_uuid(&v.context["target"])?,
                before,
                "the namespace came back with its identity"
            );
        }
        let resumed = wait_for(&acked, at_reboot + AFTER, RESUME_BOUND).await;
        stop.store(true, Ordering::SeqCst);
        // A writer still held in an fsync when the bound ran out never
        // comes back: the test fails rather than waits on it.
        let report = tokio::time::timeout(RESUME_BOUND, handle)
            .await
            .map_err(|_| {
                format!(
                    "{name}: the writer is still held\nplugin log:\n{}",
                    b.plugin.log()
                )
            })??;
        resumed.map_err(|e| format!("{name}: {e}\nplugin log:\n{}", b.plugin.log()))?;

        n.node_unstage_volume(unstage_req(&v, &staging)).await?;
        assert!(!connected(&v), "{name}: Unstage ended the connection");
        // LIO holds the zvol exclusively while it exports it: the witness
        // mounts it once the export is gone.
        b.unexport(&v).await?;
        let lost = lost_records(&v.device, &b.path("witness"), &report.acknowledged)?;
        let line = format!(
            "reboot under a writer ({name}): {} writes attempted, {} failed, {lost} lost of {} acknowledged; the target was gone {:.1} s",
            report.attempted,
            report.failed,
            report.acknowledged.len(),
            outage.as_secs_f64()
        );
        measured(&b.lab, &line)?;
        assert_eq!(report.failed, 0, "{name}: no write failed: {report:?}");
        assert_eq!(lost, 0, "{name}: every acknowledged write reads back");
        b.delete(&v).await?;
    }
    Ok(())
}
