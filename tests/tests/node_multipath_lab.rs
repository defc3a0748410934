//! Native NVMe multipath: with `nvme_core multipath=Y` the kernel shows a
//! namespace as a hidden per-path disk (`nvme<S>c<C>n<N>`, owned by the
//! controller) and a head disk (`nvme<S>n<N>`, owned by the subsystem);
//! the node plugin must stage the head. Stage, write, Unstage (disconnect),
//! Stage again and read back.
//!
//! The lab loads nvme_core with `multipath=N` (the fence tests need one
//! disk per host NQN), and the parameter is read-only once loaded. This
//! test therefore unloads the NVMe host and target modules (no volume may
//! be exported or connected: it fails naming what is; idle nvmet ports and
//! host entries that earlier agents left are removed, as they pin nvmet),
//! loads them again with `multipath=Y`, and restores `multipath=N` the same
//! way when it ends, passed or failed.
//!
//! Run with `tests/lab/run tests -- node_multipath`.
use pillar_csi_lab::{block::pattern, csi::csi_pb, node_bed::*, run, Result};
use std::{
    fs,
    path::{Path, PathBuf},
};

const PARAM: &str = "/sys/module/nvme_core/parameters/multipath";

/// Unloads `module` and every module that holds it (deepest first);
/// returns what was unloaded, in order.
fn unload(module: &str, out: &mut Vec<String>) -> Result<()> {
    let holders = Path::new("/sys/module").join(module).join("holders");
    if !holders.parent().is_some_and(Path::exists) {
        return Ok(());
    }
    for h in fs::read_dir(&holders)? {
        unload(&h?.file_name().to_string_lossy(), out)?;
    }
    run("rmmod", &[module]).map_err(|e| {
        let refs = fs::read_to_string(format!("/sys/module/{module}/refcnt")).unwrap_or_default();
        format!(
            "cannot unload {module} (reference count {}): something still uses NVMe: {e}",
            refs.trim()
        )
    })?;
    out.push(module.to_owned());
    Ok(())
}

fn names(dir: &Path) -> Vec<PathBuf> {
    fs::read_dir(dir)
        .map(|it| it.filter_map(|e| e.ok()).map(|e| e.path()).collect())
        .unwrap_or_default()
}

/// Removes what earlier agents left in nvmet's configfs that exports
/// nothing (ports without subsystem links, host entries): each folder pins
/// the nvmet module. A subsystem, or a port still linked to one, means a
/// volume is exported: that is an error naming it, and nothing is removed.
fn clear_idle_nvmet() -> Result<()> {
    let root = Path::new("/sys/kernel/config/nvmet");
    let subsystems = names(&root.join("subsystems"));
    if let Some(s) = subsystems.first() {
        return Err(format!("nvmet still exports {}: cannot reload NVMe", s.display()).into());
    }
    let ports = names(&root.join("ports"));
    for port in &ports {
        if let Some(link) = names(&port.join("subsystems")).first() {
            return Err(format!(
                "nvmet port link {} remains: cannot reload NVMe",
                link.display()
            )
            .into());
        }
    }
    for dir in ports.iter().chain(&names(&root.join("hosts"))) {
        fs::remove_dir(dir).map_err(|e| format!("removing {}: {e}", dir.display()))?;
    }
    Ok(())
}

/// Reloads nvme_core with `multipath=<want>` and every module that held it.
fn set_multipath(want: &str) -> Result<()> {
    if fs::read_to_string(PARAM)?.trim() == want {
        return Ok(());
    }
    clear_idle_nvmet()?;
    let mut removed = Vec::new();
    if let Err(e) = unload("nvme_core", &mut removed) {
        // Put back what was unloaded before the module that is busy.
        for m in removed.iter().rev() {
            let _ = run("modprobe", &[m]);
        }
        return Err(e);
    }
    run("modprobe", &["nvme_core", &format!("multipath={want}")])?;
    for m in removed.iter().rev().filter(|m| *m != "nvme_core") {
        run("modprobe", &[m])?;
    }
    run("udevadm", &["settle"])?;
    let now = fs::read_to_string(PARAM)?;
    if now.trim() != want {
        return Err(format!("nvme_core multipath is {now:?} after reloading, not {want}").into());
    }
    Ok(())
}

/// Native multipath on while it lives; off again when dropped.
struct Multipath;

impl Multipath {
    fn on() -> Result<Self> {
        set_multipath("Y")?;
        Ok(Self)
    }
}

impl Drop for Multipath {
    fn drop(&mut self) {
        if let Err(e) = set_multipath("N") {
            eprintln!("could not turn native NVMe multipath off again: {e}");
        }
    }
}

/// Whether `name` is a head disk name (`nvme<S>n<N>`), not a path disk
/// (`nvme<S>c<C>n<N>`) or a partition.
fn is_head(name: &str) -> bool {
    name.strip_prefix("nvme")
        .and_then(|rest| rest.split_once('n'))
        .is_some_and(|(s, n)| {
            !s.is_empty()
                && !n.is_empty()
                && s.bytes().all(|b| b.is_ascii_digit())
                && n.bytes().all(|b| b.is_ascii_digit())
        })
}

/// The source device of the mount at `path`.
fn mount_source(path: &Path) -> Result<String> {
    let line = mounted(path)?.ok_or("nothing mounted")?;
    let (_, tail) = line.split_once(" - ").ok_or("bad mountinfo line")?;
    Ok(tail.split(' ').nth(1).ok_or("no source")?.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn node_multipath_stages_the_head_disk_and_round_trips_data() -> Result<()> {
    // Declared first, dropped last: after the agent and the plugin.
    let _multipath = Multipath::on()?;
    let mut b = Bench::new("node-mpath").await?;
    let mut n = b.plugin.node().await?;
    let v = b.volume(ZVOL, NVME, 64 << 20).await?;
    let nqn = v.context["target"].clone();
    let staging = b.path("staging");
    let target = b.path("target");
    n.node_stage_volume(stage_req(&v, &staging, mount_cap("ext4")))
        .await?;
    let source = mount_source(&staging)?;
    let head = source.trim_start_matches("/dev/").to_owned();
    assert!(is_head(&head), "{source} is not a head disk name");
    // The head disk hangs off the subsystem, not the controller.
    let owner = fs::read_link(format!("/sys/block/{head}/device"))?;
    let owner = owner.file_name().map(|n| n.to_string_lossy().into_owned());
    assert!(
        owner
            .as_deref()
            .is_some_and(|o| o.starts_with("nvme-subsys")),
        "{head} belongs to {owner:?}, not a subsystem: not the multipath head"
    );
    // And the controller has its hidden path disk of the same namespace.
    let ctrls = controllers_of(&nqn);
    assert_eq!(ctrls.len(), 1, "{ctrls:?}");
    let ctrl_num = ctrls[0].trim_start_matches("nvme");
    let paths: Vec<String> = fs::read_dir(format!("/sys/class/nvme/{}", ctrls[0]))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains(&format!("c{ctrl_num}n")))
        .collect();
    assert_eq!(paths.len(), 1, "one hidden path disk: {paths:?}");
    let stats = n
        .node_get_volume_stats(csi_pb::NodeGetVolumeStatsRequest {
            volume_id: v.csi_id.clone(),
            volume_path: staging.display().to_string(),
            staging_target_path: staging.display().to_string(),
        })
        .await?
        .into_inner();
    assert_eq!(
        stats.volume_condition.as_ref().map(|c| c.abnormal),
        Some(false),
        "{stats:?}"
    );

    n.node_publish_volume(publish_req(&v, &staging, &target, mount_cap("ext4"), false))
        .await?;
    let data = pattern(17, 1 << 20);
    fs::write(target.join("f"), &data)?;
    run("sync", &[])?;
    n.node_unpublish_volume(unpublish_req(&v, &target)).await?;
    n.node_unstage_volume(unstage_req(&v, &staging)).await?;
    assert!(controllers_of(&nqn).is_empty(), "disconnected");

    // Connected again: the data came back from the storage side.
    n.node_stage_volume(stage_req(&v, &staging, mount_cap("ext4")))
        .await?;
    let again = mount_source(&staging)?;
    assert!(
        is_head(again.trim_start_matches("/dev/")),
        "{again} is not a head disk"
    );
    assert_eq!(
        fs::read(staging.join("f"))?,
        data,
        "read back through the head"
    );
    n.node_unstage_volume(unstage_req(&v, &staging)).await?;
    assert!(controllers_of(&nqn).is_empty());
    b.delete(&v).await?;
    Ok(())
}
