//! The CSI node plugin against the real kernel: the agent serves zvols and
//! thin LVs over NVMe/TCP and iSCSI, `pillar-csi node` attaches them with
//! the kernel's NVMe/TCP host and open-iscsi, and this test plays kubelet
//! over the plugin's unix socket. Witnesses: sysfs (controllers), the mount
//! table, `df`, and the volume read on the storage side.
//!
//! Run with `tests/lab/run tests -- node_`.
use pillar_csi_lab::{
    agent::{pb, AgentConfig, AgentProcess, Client, ZfsParent},
    block::{pattern, read_at, write_at},
    csi::{csi_pb, NodePlugin},
    run, Lab, Result,
};
use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};
use tonic::Code;

const NVME_PORT: u16 = 4430;
const ISCSI_PORT: u16 = 3270;
const NVME: i32 = pb::ProtocolType::NvmeofTcp as i32;
const ISCSI: i32 = pb::ProtocolType::Iscsi as i32;
const ZVOL: i32 = pb::BackendType::ZfsZvol as i32;
const LVM: i32 = pb::BackendType::Lvm as i32;
/// How long Unstage of a volume whose export vanished may take: the
/// plugin's unmount wait (10 s) plus disconnecting, with room for the
/// lab's emulated CPU.
const UNSTAGE_BOUND: Duration = Duration::from_secs(60);

fn fence(uid: &str, generation: u64) -> Option<pb::FenceToken> {
    Some(pb::FenceToken {
        volume_uid: uid.to_owned(),
        generation,
    })
}

/// The agent, the plugin, and the node's identity.
struct Bench {
    _parent: ZfsParent,
    _agent: AgentProcess,
    agent: Client,
    plugin: NodePlugin,
    lab: Lab,
    host_nqn: String,
    iqn: String,
}

impl Bench {
    async fn new(name: &str) -> Result<Self> {
        let lab = Lab::get();
        let parent = ZfsParent::create(&lab, name)?;
        let config = AgentConfig::new(
            &lab,
            &lab.unique(name),
            vec![
                parent.backend(),
                format!("lvm={}/{}", lab.vg, lab.thin_pool),
            ],
            NVME_PORT,
            ISCSI_PORT,
        )?;
        let agent_process = AgentProcess::start(config).await?;
        let agent = agent_process.client().await?;
        let plugin = NodePlugin::start(&lab, &lab.unique(name)).await?;
        let info = plugin
            .node()
            .await?
            .node_get_info(csi_pb::NodeGetInfoRequest {})
            .await?
            .into_inner();
        let parts: Vec<&str> = info.node_id.split('/').collect();
        assert_eq!(parts.len(), 3, "{}", info.node_id);
        assert_eq!(parts[0], "lab-node");
        Ok(Self {
            host_nqn: parts[1].to_owned(),
            iqn: parts[2].to_owned(),
            _parent: parent,
            _agent: agent_process,
            agent,
            plugin,
            lab,
        })
    }

    /// Creates a volume of `size` on `backend` and exports it over
    /// `protocol` to this node only.
    async fn volume(&mut self, backend: i32, protocol: i32, size: u64) -> Result<Volume> {
        let uid = self.lab.unique("uid");
        let id = if backend == ZVOL {
            format!("{}/{}", self.lab.pool, self.lab.unique("vol"))
        } else {
            format!("{}/{}", self.lab.vg, self.lab.unique("lv"))
        };
        let created = self
            .agent
            .create_volume(pb::CreateVolumeRequest {
                volume_id: id.clone(),
                backend_type: backend,
                capacity_bytes: size,
                fence: fence(&uid, 1),
                lvm_provisioning: pb::LvmProvisioning::Thin as i32,
                ..Default::default()
            })
            .await?
            .into_inner();
        let mut v = Volume {
            csi_id: format!(
                "storage-1/{}/{}/{id}",
                if protocol == NVME {
                    "nvmeof-tcp"
                } else {
                    "iscsi"
                },
                if backend == ZVOL {
                    "zfs-zvol"
                } else {
                    "lvm-lv"
                }
            ),
            id,
            uid,
            backend,
            protocol,
            device: created.device_path.into(),
            context: HashMap::new(),
        };
        v.context = self.export(&v).await?;
        Ok(v)
    }

    async fn export(&mut self, v: &Volume) -> Result<HashMap<String, String>> {
        let initiator = if v.protocol == NVME {
            &self.host_nqn
        } else {
            &self.iqn
        };
        let e = self
            .agent
            .export_volume(pb::ExportVolumeRequest {
                volume_id: v.id.clone(),
                backend_type: v.backend,
                protocol_type: v.protocol,
                fence: fence(&v.uid, 1),
                acl_enabled: true,
                allowed_initiators: vec![initiator.clone()],
            })
            .await?
            .into_inner();
        Ok(HashMap::from([
            (
                "protocol".to_owned(),
                if v.protocol == NVME {
                    "nvmeof-tcp"
                } else {
                    "iscsi"
                }
                .to_owned(),
            ),
            ("address".to_owned(), e.address),
            ("port".to_owned(), e.port.to_string()),
            ("target".to_owned(), e.target_id),
            ("lun".to_owned(), e.lun.to_string()),
        ]))
    }

    async fn unexport(&mut self, v: &Volume) -> Result<()> {
        self.agent
            .unexport_volume(pb::UnexportVolumeRequest {
                volume_id: v.id.clone(),
                protocol_type: v.protocol,
                fence: fence(&v.uid, 1),
            })
            .await?;
        Ok(())
    }

    async fn delete(&mut self, v: &Volume) -> Result<()> {
        self.unexport(v).await?;
        self.agent
            .delete_volume(pb::DeleteVolumeRequest {
                volume_id: v.id.clone(),
                backend_type: v.backend,
                fence: fence(&v.uid, 1),
            })
            .await?;
        Ok(())
    }

    async fn expand(&mut self, v: &Volume, size: u64) -> Result<()> {
        self.agent
            .expand_volume(pb::ExpandVolumeRequest {
                volume_id: v.id.clone(),
                backend_type: v.backend,
                requested_bytes: size,
                fence: fence(&v.uid, 1),
            })
            .await?;
        Ok(())
    }

    /// A fresh folder for staging or publishing.
    fn path(&self, what: &str) -> PathBuf {
        let dir = self.lab.work.join("kubelet");
        let _ = fs::create_dir_all(&dir);
        dir.join(self.lab.unique(what))
    }
}

/// One agent volume and its publish context.
struct Volume {
    id: String,
    csi_id: String,
    uid: String,
    backend: i32,
    protocol: i32,
    /// The device on the storage side.
    device: PathBuf,
    context: HashMap<String, String>,
}

fn mount_cap(fs_type: &str) -> Option<csi_pb::VolumeCapability> {
    use csi_pb::volume_capability::{access_mode::Mode, AccessMode, AccessType, MountVolume};
    Some(csi_pb::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs_type.to_owned(),
            mount_flags: vec!["noatime".into()],
            volume_mount_group: String::new(),
        })),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    })
}

fn block_cap() -> Option<csi_pb::VolumeCapability> {
    use csi_pb::volume_capability::{access_mode::Mode, AccessMode, AccessType, BlockVolume};
    Some(csi_pb::VolumeCapability {
        access_type: Some(AccessType::Block(BlockVolume {})),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    })
}

fn stage_req(
    v: &Volume,
    staging: &Path,
    cap: Option<csi_pb::VolumeCapability>,
) -> csi_pb::NodeStageVolumeRequest {
    csi_pb::NodeStageVolumeRequest {
        volume_id: v.csi_id.clone(),
        publish_context: v.context.clone(),
        staging_target_path: staging.display().to_string(),
        volume_capability: cap,
        ..Default::default()
    }
}

fn publish_req(
    v: &Volume,
    staging: &Path,
    target: &Path,
    cap: Option<csi_pb::VolumeCapability>,
    readonly: bool,
) -> csi_pb::NodePublishVolumeRequest {
    csi_pb::NodePublishVolumeRequest {
        volume_id: v.csi_id.clone(),
        publish_context: v.context.clone(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: cap,
        readonly,
        ..Default::default()
    }
}

fn unstage_req(v: &Volume, staging: &Path) -> csi_pb::NodeUnstageVolumeRequest {
    csi_pb::NodeUnstageVolumeRequest {
        volume_id: v.csi_id.clone(),
        staging_target_path: staging.display().to_string(),
    }
}

fn unpublish_req(v: &Volume, target: &Path) -> csi_pb::NodeUnpublishVolumeRequest {
    csi_pb::NodeUnpublishVolumeRequest {
        volume_id: v.csi_id.clone(),
        target_path: target.display().to_string(),
    }
}

/// The mount table's line for `path` (the `findmnt` witness).
fn mounted(path: &Path) -> Result<Option<String>> {
    Ok(fs::read_to_string("/proc/self/mountinfo")?
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(&path.display().to_string()))
        .map(str::to_owned))
}

/// `df -B1` size of the filesystem at `path`.
fn df_size(path: &Path) -> Result<u64> {
    let out = run("df", &["-B1", "--output=size", &path.display().to_string()])?;
    Ok(out.lines().nth(1).unwrap_or_default().trim().parse()?)
}

/// The NVMe controllers of subsystem `nqn` (the sysfs witness).
fn controllers_of(nqn: &str) -> Vec<String> {
    fs::read_dir("/sys/class/nvme")
        .map(|it| {
            it.filter_map(|e| e.ok())
                .filter(|e| {
                    fs::read_to_string(e.path().join("subsysnqn")).is_ok_and(|s| s.trim() == nqn)
                })
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether an iSCSI session to `iqn` exists.
fn iscsi_session(iqn: &str) -> bool {
    fs::read_dir("/sys/class/iscsi_session").is_ok_and(|it| {
        it.filter_map(|e| e.ok())
            .any(|e| fs::read_to_string(e.path().join("targetname")).is_ok_and(|s| s.trim() == iqn))
    })
}

/// How many staging records the plugin keeps in `state_dir`.
fn records(state_dir: &Path) -> Result<usize> {
    Ok(fs::read_dir(state_dir)?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .count())
}

fn connected(v: &Volume) -> bool {
    let target = &v.context["target"];
    if v.protocol == NVME {
        !controllers_of(target).is_empty()
    } else {
        iscsi_session(target)
    }
}

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

/// The filesystem UUID on the namespace of subsystem `nqn` (blkid witness).
fn blkid_uuid(nqn: &str) -> Result<String> {
    let ctrl = controllers_of(nqn)
        .into_iter()
        .next()
        .ok_or("no controller")?;
    let disk = fs::read_dir(format!("/sys/class/nvme/{ctrl}"))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with(&format!("{ctrl}n")))
        .ok_or("no disk")?;
    let uuid = run(
        "blkid",
        &["-p", "-o", "value", "-s", "UUID", &format!("/dev/{disk}")],
    )?;
    assert!(!uuid.trim().is_empty());
    Ok(uuid.trim().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn node_export_removed_while_staged_is_abnormal_and_unstage_is_bounded() -> Result<()> {
    let mut b = Bench::new("node-gone").await?;
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
    let start = Instant::now();
    n.node_unstage_volume(unstage_req(&v, &staging)).await?;
    let took = start.elapsed();
    assert!(took < UNSTAGE_BOUND, "Unstage took {took:?}");
    assert_eq!(mounted(&staging)?, None);
    assert!(controllers_of(&v.context["target"]).is_empty());
    fs::write(
        b.lab.work.join("node-measurements.txt"),
        format!("unstage with the export gone: {took:?}\n"),
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
