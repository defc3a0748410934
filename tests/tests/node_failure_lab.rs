//! The node plugin through failures: killed between connect and mount (a
//! restarted plugin's retried Stage reuses the controller and the
//! filesystem), an export removed while staged (reported abnormal, and
//! Unstage is bounded), and an Unstage under a flush the storage side does
//! not take (the connection is kept until every byte is written).
//!
//! Run with `tests/lab/run tests -- node_`.
use pillar_csi_lab::{agent::pb, block::pattern, csi::csi_pb, node_bed::*, run, Result};
use std::{
    fs,
    time::{Duration, Instant},
};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn node_killed_before_mount_restarts_and_stage_retries() -> Result<()> {
    let mut b = Bench::new("node-kill").await?;
    let v = b.volume(ZVOL, NVME, 64 << 20).await?;
    let staging = b.path("staging");
    b.plugin.kill()?;
    b.plugin
        .spawn(&[("PILLAR_CSI_NODE_FAULT", "hang-before-mount")])
        .await?;
    let mut n = b.plugin.node().await?;
    let req = stage_req(&v, &staging, mount_cap("ext4"));
    let hung = tokio::spawn(async move { n.node_stage_volume(req).await });
    // Wait (bounded) until the plugin says it reached the fault point.
    let start = Instant::now();
    while !b.plugin.log().contains("hanging before the mount") {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the fault point was not reached:\n{}",
            b.plugin.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let nqn = v.context["target"].clone();
    assert_eq!(controllers_of(&nqn).len(), 1, "connected before the kill");
    let disk = blkid_uuid(&nqn)?;
    b.plugin.kill()?;
    let _ = hung.await;
    assert_eq!(mounted(&staging)?, None);
    b.plugin.spawn(&[]).await?;
    let mut n = b.plugin.node().await?;
    n.node_stage_volume(stage_req(&v, &staging, mount_cap("ext4")))
        .await?;
    assert_eq!(controllers_of(&nqn).len(), 1, "no second controller");
    assert_eq!(
        blkid_uuid(&nqn)?,
        disk,
        "no second format: the filesystem UUID is the same"
    );
    assert!(mounted(&staging)?.is_some());
    n.node_unstage_volume(unstage_req(&v, &staging)).await?;
    assert!(controllers_of(&nqn).is_empty());
    b.delete(&v).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn node_export_removed_while_staged_is_abnormal_and_unstage_is_bounded() -> Result<()> {
    let mut b = Bench::new("node-gone").await?;
    // The host gives a lost controller up after 15 s here (600 s by
    // default): until then the target may come back, and Unstage cuts
    // nothing.
    b.plugin.kill()?;
    b.plugin.extra_args = vec!["--nvme-ctrl-loss-tmo".into(), "15".into()];
    b.plugin.spawn(&[]).await?;
    let mut n = b.plugin.node().await?;
    let v = b.volume(ZVOL, NVME, 64 << 20).await?;
    let staging = b.path("staging");
    n.node_stage_volume(stage_req(&v, &staging, mount_cap("ext4")))
        .await?;
    fs::write(staging.join("f"), b"dirty")?;
    let stats_req = csi_pb::NodeGetVolumeStatsRequest {
        volume_id: v.csi_id.clone(),
        volume_path: staging.display().to_string(),
        staging_target_path: staging.display().to_string(),
    };
    let healthy = n
        .node_get_volume_stats(stats_req.clone())
        .await?
        .into_inner();
    assert_eq!(healthy.volume_condition.map(|c| c.abnormal), Some(false));
    b.unexport(&v).await?;
    let start = Instant::now();
    let condition = loop {
        let s = n
            .node_get_volume_stats(stats_req.clone())
            .await?
            .into_inner();
        if let Some(c) = s.volume_condition.filter(|c| c.abnormal) {
            break c;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "never reported abnormal"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(
        condition.message.contains("not reachable") || condition.message.contains("gone"),
        "{condition:?}"
    );
    // kubelet retries Unstage: while the host reconnects, each try is
    // DEADLINE_EXCEEDED or FAILED_PRECONDITION and the controller stays;
    // once the host gave it up (ctrl_loss_tmo), the dead transport is ended.
    let start = Instant::now();
    let mut refused = 0;
    loop {
        match n.node_unstage_volume(unstage_req(&v, &staging)).await {
            Ok(_) => break,
            Err(e) => {
                assert!(
                    matches!(
                        e.code(),
                        tonic::Code::DeadlineExceeded | tonic::Code::FailedPrecondition
                    ),
                    "{e}"
                );
                assert!(
                    start.elapsed() < UNSTAGE_BOUND,
                    "Unstage never completed: {e}"
                );
                refused += 1;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
    // How many tries were refused depends on whether the host still
    // reconnected when Unstage came (timing under the emulated CPU); what
    // holds on every path is that every try before the end was retryable
    // and the end came within the bound. The stalled-flush test shows the
    // refusal itself.
    let took = start.elapsed();
    assert_eq!(mounted(&staging)?, None);
    assert!(controllers_of(&v.context["target"]).is_empty());
    measured(
        &b.lab,
        &format!("unstage with the export gone: {took:?} ({refused} retryable refusals before it, ctrl_loss_tmo 15 s)"),
    )?;
    b.agent
        .delete_volume(pb::DeleteVolumeRequest {
            volume_id: v.id.clone(),
            backend_type: v.backend,
            fence: fence(&v.uid, 1),
        })
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn node_unstage_under_a_stalled_flush_keeps_the_connection_until_written() -> Result<()> {
    let mut b = Bench::new("node-flush").await?;
    let mut n = b.plugin.node().await?;
    let v = b.volume(LVM, NVME, 64 << 20).await?;
    let staging = b.path("staging");
    n.node_stage_volume(stage_req(&v, &staging, mount_cap("ext4")))
        .await?;
    // Written without fsync: dirty in the node's page cache, written back
    // only by the unmount.
    let data = pattern(21, 8 << 20);
    fs::write(staging.join("unsynced"), &data)?;
    // The storage side stops taking writes (a slow or stalled backend): the
    // thin LV's device-mapper table is suspended, I/O to it is held.
    let (vg, lv) = v.id.split_once('/').ok_or("an LV ID is vg/lv")?;
    let dm = format!("{}-{}", vg.replace('-', "--"), lv.replace('-', "--"));
    run("dmsetup", &["suspend", &dm])?;
    let start = Instant::now();
    let stalled = n.node_unstage_volume(unstage_req(&v, &staging)).await;
    let waited = start.elapsed();
    let kept = connected(&v);
    run("dmsetup", &["resume", &dm])?;
    let e = stalled.expect_err("no OK while the filesystem's data is unwritten");
    assert!(
        matches!(
            e.code(),
            tonic::Code::DeadlineExceeded | tonic::Code::FailedPrecondition
        ),
        "{e}"
    );
    assert!(kept, "the connection was kept under the flush: {e}");
    assert_eq!(
        records(&b.plugin.state_dir)?,
        1,
        "the volume is still staged"
    );
    // kubelet retries Unstage; once the writeback is through it succeeds.
    let retried = Instant::now();
    loop {
        match n.node_unstage_volume(unstage_req(&v, &staging)).await {
            Ok(_) => break,
            Err(e) if retried.elapsed() < Duration::from_secs(180) => {
                println!("Unstage retried: {e}");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Err(e) => {
                return Err(format!("Unstage never succeeded: {e}\n{}", b.plugin.log()).into())
            }
        }
    }
    assert!(!connected(&v), "the connection ended once idle");
    measured(
        &b.lab,
        &format!(
        "stalled flush: the first Unstage answered {:?} after {:.1} s; the retries succeeded {:.1} s after the backend resumed",
        e.code(),
        waited.as_secs_f64(),
        retried.elapsed().as_secs_f64()
    ))?;
    let witness = b.path("witness");
    fs::create_dir_all(&witness)?;
    let (device, at) = (
        v.device.display().to_string(),
        witness.display().to_string(),
    );
    run("mount", &["-o", "ro", &device, &at])?;
    let read = fs::read(witness.join("unsynced"));
    run("umount", &[&at])?;
    assert!(
        read? == data,
        "every byte written before Unstage is on the volume"
    );
    b.delete(&v).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn node_a_lost_volume_s_disk_name_taken_by_another_is_never_used_for_it() -> Result<()> {
    let mut b = Bench::new("node-reuse").await?;
    let mut n = b.plugin.node().await?;
    let a = b.volume(ZVOL, NVME, 64 << 20).await?;
    let staging_a = b.path("staging");
    n.node_stage_volume(stage_req(&a, &staging_a, block_cap()))
        .await?;
    // A's controller is lost for good (as the kernel deletes it after
    // ctrl_loss_tmo); the next volume's disk may get its name.
    run("nvme", &["disconnect", "-n", &a.context["target"]])?;
    let c = b.volume(ZVOL, NVME, 64 << 20).await?;
    let staging_c = b.path("staging");
    n.node_stage_volume(stage_req(&c, &staging_c, block_cap()))
        .await?;
    // Stats is asked about a path that exists (a block volume's staging
    // folder is not made by Stage; kubelet asks about the published file).
    fs::create_dir_all(&staging_a)?;
    let stats = n
        .node_get_volume_stats(csi_pb::NodeGetVolumeStatsRequest {
            volume_id: a.csi_id.clone(),
            volume_path: staging_a.display().to_string(),
            staging_target_path: staging_a.display().to_string(),
        })
        .await?
        .into_inner();
    let condition = stats.volume_condition.ok_or("no condition")?;
    assert!(
        condition.abnormal,
        "A is not reported healthy from C's disk: {condition:?}"
    );
    let target = b.path("target");
    let e = n
        .node_publish_volume(publish_req(&a, &staging_a, &target, block_cap(), false))
        .await
        .expect_err("A's pod never gets C's disk");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e}");
    assert_eq!(mounted(&target)?, None);
    measured(
        &b.lab,
        &format!(
            "a lost volume's disk name reused: A's Stats said {:?}; Publish of A: {}",
            condition.message,
            e.message()
        ),
    )?;
    // Both Unstage: A's dead connection is forgotten, C's stays until its own.
    n.node_unstage_volume(unstage_req(&a, &staging_a)).await?;
    assert!(connected(&c), "C's connection is not A's to end");
    n.node_unstage_volume(unstage_req(&c, &staging_c)).await?;
    assert!(!connected(&c));
    b.delete(&a).await?;
    b.delete(&c).await?;
    Ok(())
}
