//! The CSI node plugin against the real kernel, a volume's whole life: the
//! agent serves a zvol or a thin LV over NVMe/TCP or iSCSI, `pillar-csi
//! node` stages, publishes, grows and reports on it, and this test plays
//! kubelet over the plugin's unix socket. Witnesses: sysfs (controllers,
//! sessions), the mount table, `df`.
//!
//! Run with `tests/lab/run tests -- node_`.
use pillar_csi_lab::{block::pattern, csi::csi_pb, node_bed::*, Result};
use std::fs;

/// The full lifecycle of one volume; see the first lab test.
async fn lifecycle(
    backend: i32,
    protocol: i32,
    fs_type: &str,
    size: u64,
    grown: u64,
) -> Result<()> {
    let mut b = Bench::new("node-life").await?;
    let v = b.volume(backend, protocol, size).await?;
    let mut n = b.plugin.node().await?;
    let staging = b.path("staging");
    let target = b.path("target");
    n.node_stage_volume(stage_req(&v, &staging, mount_cap(fs_type)))
        .await?;
    let line = mounted(&staging)?.ok_or("nothing mounted at staging")?;
    assert!(line.contains(&format!(" - {fs_type} ")), "{line}");
    assert!(connected(&v), "connected after Stage");
    n.node_publish_volume(publish_req(
        &v,
        &staging,
        &target,
        mount_cap(fs_type),
        false,
    ))
    .await?;
    let data = pattern(7, 64 << 10);
    fs::write(target.join("file"), &data)?;
    n.node_unpublish_volume(unpublish_req(&v, &target)).await?;
    assert!(!target.exists(), "the plugin removes the target path");
    n.node_unstage_volume(unstage_req(&v, &staging)).await?;
    assert_eq!(mounted(&staging)?, None);
    assert!(!connected(&v), "disconnected after the last Unstage");

    // Staged again: the same filesystem, the file is there (no reformat).
    n.node_stage_volume(stage_req(&v, &staging, mount_cap(fs_type)))
        .await?;
    assert_eq!(
        fs::read(staging.join("file"))?,
        data,
        "the file survived: not reformatted"
    );
    n.node_publish_volume(publish_req(
        &v,
        &staging,
        &target,
        mount_cap(fs_type),
        false,
    ))
    .await?;

    // Grown on the storage side, then on the node while mounted.
    let before = df_size(&target)?;
    b.expand(&v, grown).await?;
    let reply = n
        .node_expand_volume(csi_pb::NodeExpandVolumeRequest {
            volume_id: v.csi_id.clone(),
            volume_path: target.display().to_string(),
            capacity_range: Some(csi_pb::CapacityRange {
                required_bytes: grown as i64,
                limit_bytes: 0,
            }),
            staging_target_path: staging.display().to_string(),
            volume_capability: mount_cap(fs_type),
            ..Default::default()
        })
        .await?
        .into_inner();
    assert!(reply.capacity_bytes as u64 >= grown, "{reply:?}");
    let after = df_size(&target)?;
    assert!(
        after > before + (grown - size) / 2,
        "df shows the new size while mounted: {before} -> {after} (volume {size} -> {grown})"
    );
    let stats = n
        .node_get_volume_stats(csi_pb::NodeGetVolumeStatsRequest {
            volume_id: v.csi_id.clone(),
            volume_path: target.display().to_string(),
            staging_target_path: staging.display().to_string(),
        })
        .await?
        .into_inner();
    assert!(
        !stats.volume_condition.as_ref().is_some_and(|c| c.abnormal),
        "{stats:?}"
    );
    let bytes = stats
        .usage
        .iter()
        .find(|u| u.unit == csi_pb::volume_usage::Unit::Bytes as i32);
    assert_eq!(bytes.map(|u| u.total as u64), Some(after), "{stats:?}");
    assert!(stats
        .usage
        .iter()
        .any(|u| u.unit == csi_pb::volume_usage::Unit::Inodes as i32 && u.total > 0));

    n.node_unpublish_volume(unpublish_req(&v, &target)).await?;
    n.node_unstage_volume(unstage_req(&v, &staging)).await?;
    assert!(!connected(&v));
    b.delete(&v).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn node_lifecycle_nvme_tcp_zvol_ext4() -> Result<()> {
    lifecycle(ZVOL, NVME, "ext4", 64 << 20, 128 << 20).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn node_lifecycle_nvme_tcp_thin_lv_xfs() -> Result<()> {
    lifecycle(LVM, NVME, "xfs", 320 << 20, 400 << 20).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn node_lifecycle_iscsi_zvol_xfs() -> Result<()> {
    lifecycle(ZVOL, ISCSI, "xfs", 320 << 20, 400 << 20).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn node_lifecycle_iscsi_thin_lv_ext4() -> Result<()> {
    lifecycle(LVM, ISCSI, "ext4", 64 << 20, 128 << 20).await
}
