//! What the node plugin attaches: a raw block volume carries a pattern to
//! the storage side, and two volumes from one target address share the
//! connection without one's Unstage cutting off the other.
//!
//! Run with `tests/lab/run tests -- node_`.
use pillar_csi_lab::{
    block::{pattern, read_at},
    node_bed::*,
    run, Result,
};
use std::fs;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn node_block_volume_round_trips_a_pattern() -> Result<()> {
    let mut b = Bench::new("node-block").await?;
    let mut n = b.plugin.node().await?;
    let v = b.volume(ZVOL, NVME, 64 << 20).await?;
    let staging = b.path("staging");
    let target = b.path("pod").join("dev");
    n.node_stage_volume(stage_req(&v, &staging, block_cap()))
        .await?;
    assert_eq!(
        mounted(&staging)?,
        None,
        "nothing mounted at staging for a block volume"
    );
    n.node_publish_volume(publish_req(&v, &staging, &target, block_cap(), false))
        .await?;
    n.node_publish_volume(publish_req(&v, &staging, &target, block_cap(), false))
        .await?;
    let data = pattern(11, 1 << 20);
    let source = b.path("pattern");
    fs::write(&source, &data)?;
    run(
        "dd",
        &[
            &format!("if={}", source.display()),
            &format!("of={}", target.display()),
            "bs=1M",
            "seek=8",
            "oflag=direct",
            "conv=notrunc",
        ],
    )?;
    assert_eq!(
        read_at(&v.device, 8 << 20, data.len())?,
        data,
        "the storage side reads the pattern"
    );
    n.node_unpublish_volume(unpublish_req(&v, &target)).await?;
    assert!(!target.exists());
    n.node_unstage_volume(unstage_req(&v, &staging)).await?;
    assert!(!connected(&v));
    b.delete(&v).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn node_two_volumes_from_one_target_address() -> Result<()> {
    let mut b = Bench::new("node-two").await?;
    let mut n = b.plugin.node().await?;
    let v1 = b.volume(ZVOL, NVME, 64 << 20).await?;
    let v2 = b.volume(ZVOL, NVME, 64 << 20).await?;
    assert_eq!(v1.context["address"], v2.context["address"]);
    assert_eq!(v1.context["port"], v2.context["port"]);
    let (s1, s2) = (b.path("s1"), b.path("s2"));
    n.node_stage_volume(stage_req(&v1, &s1, mount_cap("ext4")))
        .await?;
    n.node_stage_volume(stage_req(&v2, &s2, mount_cap("ext4")))
        .await?;
    let data = pattern(5, 8192);
    fs::write(s2.join("f"), &data)?;
    n.node_unstage_volume(unstage_req(&v1, &s1)).await?;
    assert!(connected(&v2), "the other volume stays connected");
    let state = fs::read_to_string(format!(
        "/sys/class/nvme/{}/state",
        controllers_of(&v2.context["target"])[0]
    ))?;
    assert_eq!(state.trim(), "live");
    run("sync", &[])?;
    run("sh", &["-c", "echo 3 > /proc/sys/vm/drop_caches"])?;
    assert_eq!(fs::read(s2.join("f"))?, data, "and readable");
    n.node_unstage_volume(unstage_req(&v2, &s2)).await?;
    b.delete(&v1).await?;
    b.delete(&v2).await?;
    Ok(())
}
