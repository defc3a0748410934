//! The node plugin refuses what it must not touch and repeats what it may:
//! a device holding another filesystem or a partition table is never
//! formatted, nor is a volume holding existing data that probes blank (and
//! the refused Stage leaves nothing behind), nor a disk that shows another
//! export's identity; repeated calls succeed and conflicting ones are
//! ALREADY_EXISTS.
//!
//! Run with `tests/lab/run tests -- node_`.
use pillar_csi_lab::{
    block::{pattern, read_at, write_at},
    node_bed::*,
    run, Result,
};
use std::fs;
use tonic::Code;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn node_refuses_another_filesystem_and_a_partition_table() -> Result<()> {
    let mut b = Bench::new("node-refuse").await?;
    let mut n = b.plugin.node().await?;
    // ext4 with a file, made on the storage side.
    let v = b.volume(ZVOL, NVME, 64 << 20).await?;
    run("mkfs.ext4", &["-q", &v.device.display().to_string()])?;
    let witness = b.path("witness");
    fs::create_dir_all(&witness)?;
    run(
        "mount",
        &[
            &v.device.display().to_string(),
            &witness.display().to_string(),
        ],
    )?;
    let data = pattern(3, 4096);
    fs::write(witness.join("keep"), &data)?;
    run("umount", &[&witness.display().to_string()])?;
    let staging = b.path("staging");
    let e = n
        .node_stage_volume(stage_req(&v, &staging, mount_cap("xfs")))
        .await
        .expect_err("ext4 staged as xfs is refused");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
    assert!(e.message().contains("ext4"), "{e}");
    assert_eq!(mounted(&staging)?, None);
    // kubelet calls no Unstage after a failed Stage: the refusal itself
    // ended the connection and left no staging record.
    assert!(!connected(&v), "the refused Stage's connection is ended");
    assert_eq!(records(&b.plugin.state_dir)?, 0, "no staging record left");
    n.node_unstage_volume(unstage_req(&v, &staging)).await?;
    run(
        "mount",
        &[
            "-o",
            "ro",
            &v.device.display().to_string(),
            &witness.display().to_string(),
        ],
    )?;
    assert_eq!(
        fs::read(witness.join("keep"))?,
        data,
        "the ext4 data is intact"
    );
    run("umount", &[&witness.display().to_string()])?;
    b.delete(&v).await?;

    // A DOS partition table and no filesystem.
    let v = b.volume(ZVOL, NVME, 64 << 20).await?;
    let mut entry = [0u8; 16];
    entry[4] = 0x83;
    entry[8..12].copy_from_slice(&2048u32.to_le_bytes());
    entry[12..16].copy_from_slice(&4096u32.to_le_bytes());
    write_at(&v.device, 446, &entry)?;
    write_at(&v.device, 510, &[0x55, 0xAA])?;
    let before = read_at(&v.device, 0, 1 << 20)?;
    let e = n
        .node_stage_volume(stage_req(&v, &staging, mount_cap("ext4")))
        .await
        .expect_err("a partition table is refused");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
    assert!(e.message().contains("partition table"), "{e}");
    assert!(!connected(&v), "the refused Stage's connection is ended");
    assert_eq!(records(&b.plugin.state_dir)?, 0, "no staging record left");
    n.node_unstage_volume(unstage_req(&v, &staging)).await?;
    assert_eq!(read_at(&v.device, 0, 1 << 20)?, before, "nothing written");
    b.delete(&v).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn node_never_formats_a_volume_holding_existing_data_that_probes_blank() -> Result<()> {
    let mut b = Bench::new("node-existing").await?;
    let mut n = b.plugin.node().await?;
    // Raw application data after the first MiB: libblkid finds no
    // signature, as on a former block-mode volume or a wiped superblock.
    for (backend, protocol, origin) in [(LVM, NVME, "import-lv"), (ZVOL, ISCSI, "import-zvol")] {
        let v = b.volume(backend, protocol, 64 << 20).await?;
        let data = pattern(11, 32 << 20);
        write_at(&v.device, 1 << 20, &data)?;
        let before = read_at(&v.device, 0, 40 << 20)?;
        let out = run("blkid", &["-p", &v.device.display().to_string()]);
        assert!(out.is_err(), "blkid -p finds no signature: {out:?}");
        let staging = b.path("staging");
        let mut req = stage_req(&v, &staging, mount_cap("ext4"));
        req.volume_context
            .insert("existingData".to_owned(), origin.to_owned());
        let e = n
            .node_stage_volume(req)
            .await
            .expect_err("a volume holding data is not formatted");
        assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
        assert!(e.message().contains(origin), "{e}");
        assert!(e.message().contains("volumeMode: Block"), "{e}");
        assert_eq!(mounted(&staging)?, None);
        assert!(!connected(&v), "the refused Stage's connection is ended");
        assert_eq!(records(&b.plugin.state_dir)?, 0, "no staging record left");
        assert!(
            read_at(&v.device, 0, 40 << 20)? == before,
            "{origin}: not one byte written"
        );
        b.delete(&v).await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn node_calls_are_idempotent_and_conflicts_already_exist() -> Result<()> {
    let mut b = Bench::new("node-idem").await?;
    let mut n = b.plugin.node().await?;
    let v = b.volume(ZVOL, ISCSI, 64 << 20).await?;
    let staging = b.path("staging");
    let target = b.path("target");
    for _ in 0..2 {
        n.node_stage_volume(stage_req(&v, &staging, mount_cap("ext4")))
            .await?;
    }
    let e = n
        .node_stage_volume(stage_req(&v, &b.path("other-staging"), mount_cap("ext4")))
        .await
        .expect_err("a second staging path");
    assert_eq!(e.code(), Code::AlreadyExists, "{e}");
    for _ in 0..2 {
        n.node_publish_volume(publish_req(&v, &staging, &target, mount_cap("ext4"), true))
            .await?;
    }
    let line = mounted(&target)?.ok_or("not published")?;
    assert!(
        line.split(' ')
            .nth(5)
            .is_some_and(|o| o.split(',').any(|f| f == "ro")),
        "{line}"
    );
    let e = n
        .node_publish_volume(publish_req(&v, &staging, &target, mount_cap("ext4"), false))
        .await
        .expect_err("read-write over a read-only publish");
    assert_eq!(e.code(), Code::AlreadyExists, "{e}");
    for _ in 0..2 {
        n.node_unpublish_volume(unpublish_req(&v, &target)).await?;
    }
    for _ in 0..2 {
        n.node_unstage_volume(unstage_req(&v, &staging)).await?;
    }
    assert!(!connected(&v));
    b.delete(&v).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn node_never_publishes_stats_or_grows_a_lost_staging_mount_and_reports_a_read_only_one(
) -> Result<()> {
    let mut b = Bench::new("node-lost-mount").await?;
    let mut n = b.plugin.node().await?;
    let v = b.volume(ZVOL, NVME, 64 << 20).await?;
    let staging = b.path("staging");
    n.node_stage_volume(stage_req(&v, &staging, mount_cap("ext4")))
        .await?;
    let stats_req = pillar_csi_lab::csi::csi_pb::NodeGetVolumeStatsRequest {
        volume_id: v.csi_id.clone(),
        volume_path: staging.display().to_string(),
        staging_target_path: staging.display().to_string(),
    };
    // The filesystem turns read-only (as ext4 does after an I/O or journal
    // error): the volume is abnormal, though its transport is live.
    run(
        "mount",
        &["-o", "remount,ro", &staging.display().to_string()],
    )?;
    let stats = n
        .node_get_volume_stats(stats_req.clone())
        .await?
        .into_inner();
    let condition = stats.volume_condition.ok_or("no volume condition")?;
    assert!(
        condition.abnormal && condition.message.contains("read-only"),
        "{condition:?}"
    );
    // The staging mount goes behind the plugin's back: the record still
    // says Staged, the folder is empty, on the node's own disk.
    run("umount", &[&staging.display().to_string()])?;
    let target = b.path("target");
    let e = n
        .node_publish_volume(publish_req(&v, &staging, &target, mount_cap("ext4"), false))
        .await
        .expect_err("no pod gets the empty staging folder");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
    assert!(e.message().contains("nothing is mounted at"), "{e}");
    assert_eq!(mounted(&target)?, None, "nothing bound at the target");
    let stats = n.node_get_volume_stats(stats_req).await?.into_inner();
    let condition = stats.volume_condition.ok_or("no volume condition")?;
    assert!(condition.abnormal, "{condition:?}");
    assert!(stats.usage.is_empty(), "no usage of the wrong filesystem");
    b.expand(&v, 96 << 20).await?;
    let e = n
        .node_expand_volume(pillar_csi_lab::csi::csi_pb::NodeExpandVolumeRequest {
            volume_id: v.csi_id.clone(),
            volume_path: staging.display().to_string(),
            capacity_range: Some(pillar_csi_lab::csi::csi_pb::CapacityRange {
                required_bytes: 96 << 20,
                limit_bytes: 0,
            }),
            staging_target_path: staging.display().to_string(),
            volume_capability: mount_cap("ext4"),
            ..Default::default()
        })
        .await
        .expect_err("no resize of the node's own filesystem");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
    n.node_unstage_volume(unstage_req(&v, &staging)).await?;
    assert!(!connected(&v), "Unstage ended the connection");
    b.delete(&v).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn node_a_failed_stage_leaves_the_node_as_it_found_it() -> Result<()> {
    let mut b = Bench::new("node-undo").await?;
    let mut n = b.plugin.node().await?;
    let bad_flags = || {
        let mut cap = mount_cap("ext4");
        if let Some(pillar_csi_lab::csi::csi_pb::volume_capability::AccessType::Mount(m)) =
            cap.as_mut().and_then(|c| c.access_type.as_mut())
        {
            m.mount_flags = vec!["nosuchoption".into()];
        }
        cap
    };
    // mount(2) refuses an unknown option after the connection was made and
    // the filesystem made: the connection and the record go again, and a
    // Stage with other options is not refused as ALREADY_EXISTS.
    for protocol in [NVME, ISCSI] {
        let v = b.volume(ZVOL, protocol, 64 << 20).await?;
        let staging = b.path("staging");
        let e = n
            .node_stage_volume(stage_req(&v, &staging, bad_flags()))
            .await
            .expect_err("an unknown mount option is refused");
        assert!(
            e.message().contains("nosuchoption") || e.message().contains("Invalid argument"),
            "{e}"
        );
        assert!(
            !connected(&v),
            "the failed Stage ended the connection it made: {e}"
        );
        assert_eq!(records(&b.plugin.state_dir)?, 0, "no staging record left");
        n.node_stage_volume(stage_req(&v, &staging, mount_cap("ext4")))
            .await?;
        assert!(mounted(&staging)?.is_some());
        n.node_unstage_volume(unstage_req(&v, &staging)).await?;
        b.delete(&v).await?;
    }
    // A connection the failed Stage found (made by hand, with the node's
    // own host NQN) is not touched.
    let v = b.volume(ZVOL, NVME, 64 << 20).await?;
    let nqn = v.context["target"].clone();
    run(
        "nvme",
        &[
            "connect",
            "-t",
            "tcp",
            "-a",
            &v.context["address"],
            "-s",
            &v.context["port"],
            "-n",
            &nqn,
            "--hostnqn",
            &b.host_nqn,
        ],
    )?;
    let found = controllers_of(&nqn);
    assert_eq!(found.len(), 1, "connected by hand");
    let staging = b.path("staging");
    n.node_stage_volume(stage_req(&v, &staging, bad_flags()))
        .await
        .expect_err("an unknown mount option is refused");
    assert_eq!(
        controllers_of(&nqn),
        found,
        "the hand-made controller is kept"
    );
    assert_eq!(records(&b.plugin.state_dir)?, 0, "no staging record left");
    run("nvme", &["disconnect", "-n", &nqn])?;
    b.delete(&v).await?;
    Ok(())
}

/// Issue 39, hole 6. Two storage nodes exporting one volume ID once showed
/// hosts one target name, and a host could reach one node's disk for the
/// other's volume. Target names now carry the agent's name, and ExportVolume
/// answers the identity the exported device shows (the publish context's
/// `deviceIdentity`). Here the node is sent, for volume X's target, the
/// identity of volume Y (what a controller holds when the disk found under
/// a target name is another storage node's): Stage is refused
/// FAILED_PRECONDITION naming both identities, the connection it made is
/// ended, nothing is formatted or mounted, and no record stays; with X's own
/// identity the same Stage succeeds. Over NVMe/TCP and iSCSI.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn node_refuses_a_disk_that_shows_another_exports_identity() -> Result<()> {
    let mut b = Bench::new("node-identity").await?;
    let mut n = b.plugin.node().await?;
    for protocol in [NVME, ISCSI] {
        let x = b.volume(ZVOL, protocol, 32 << 20).await?;
        let y = b.volume(ZVOL, protocol, 32 << 20).await?;
        let target = x.context["target"].clone();
        let prefix = if protocol == NVME {
            "nqn.2026-01.com.bhyoo.pillar-csi:"
        } else {
            "iqn.2026-01.com.bhyoo.pillar-csi:"
        };
        let named = target.strip_prefix(prefix).unwrap_or_default();
        assert!(
            named.split(':').count() == 2 && !named.starts_with(':'),
            "the target name carries the agent's name: {target}"
        );
        let (want, other) = (&x.context["deviceIdentity"], &y.context["deviceIdentity"]);
        assert_ne!(want, other, "two volumes, two identities");

        let staging = b.path("staging");
        let mut swapped = stage_req(&x, &staging, mount_cap("ext4"));
        swapped
            .publish_context
            .insert("deviceIdentity".into(), other.clone());
        let e = n
            .node_stage_volume(swapped)
            .await
            .expect_err("a disk showing another export's identity is refused");
        assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
        assert!(
            e.message().contains(other.as_str()) && e.message().contains("shows identity"),
            "{e}"
        );
        assert!(
            !connected(&x),
            "the connection the refused Stage made is ended"
        );
        assert_eq!(mounted(&staging)?, None);
        assert_eq!(records(&b.plugin.state_dir)?, 0, "no staging record stays");
        let probe = std::process::Command::new("blkid")
            .args(["-p", "-o", "value", "-s", "TYPE"])
            .arg(&x.device)
            .output()?;
        assert!(probe.stdout.is_empty(), "nothing was formatted: {probe:?}");

        n.node_stage_volume(stage_req(&x, &staging, mount_cap("ext4")))
            .await?;
        assert!(mounted(&staging)?.is_some());
        n.node_unstage_volume(unstage_req(&x, &staging)).await?;
        assert!(!connected(&x));
        b.delete(&x).await?;
        b.delete(&y).await?;
    }
    Ok(())
}
