//! The node-lab bed: the agent serving zvols and thin LVs over NVMe/TCP
//! and iSCSI on loopback, `pillar-csi node` as a child process, CSI request
//! builders, and the kernel's witnesses (sysfs controllers and sessions, the
//! mount table, `df`, `blkid`). The `node_*` lab tests (`tests/tests/node_*`)
//! share it.
use crate::{
    agent::{pb, AgentConfig, AgentProcess, Client, ZfsParent},
    csi::{csi_pb, NodePlugin},
    run, Lab, Result,
};
use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
    time::Duration,
};

/// The agent's NVMe/TCP port in node tests.
pub const NVME_PORT: u16 = 4430;
/// The agent's iSCSI port in node tests.
pub const ISCSI_PORT: u16 = 3270;
/// NVMe/TCP, as the agent's enum.
pub const NVME: i32 = pb::ProtocolType::NvmeofTcp as i32;
/// iSCSI, as the agent's enum.
pub const ISCSI: i32 = pb::ProtocolType::Iscsi as i32;
/// A zvol, as the agent's enum.
pub const ZVOL: i32 = pb::BackendType::ZfsZvol as i32;
/// A thin LV, as the agent's enum.
pub const LVM: i32 = pb::BackendType::Lvm as i32;
/// How long Unstage of a volume whose export vanished may take, retries
/// included: the host's reconnecting (the test's 15 s `ctrl_loss_tmo`), the
/// plugin's unmount wait (10 s) and disconnecting, with room for the lab's
/// emulated CPU.
pub const UNSTAGE_BOUND: Duration = Duration::from_secs(60);

/// A fence token.
pub fn fence(uid: &str, generation: u64) -> Option<pb::FenceToken> {
    Some(pb::FenceToken {
        volume_uid: uid.to_owned(),
        generation,
    })
}

/// The agent, the plugin, and the node's identity.
pub struct Bench {
    parent: ZfsParent,
    /// The agent's process.
    pub agent_process: AgentProcess,
    /// The agent's client.
    pub agent: Client,
    /// The node plugin.
    pub plugin: NodePlugin,
    /// The lab.
    pub lab: Lab,
    /// The node's host NQN (from NodeGetInfo).
    pub host_nqn: String,
    /// The node's initiator IQN (from NodeGetInfo).
    pub iqn: String,
}

impl Bench {
    /// Starts an agent (a fresh ZFS parent and the lab's thin pool) and a
    /// node plugin, and reads the node's identity.
    pub async fn new(name: &str) -> Result<Self> {
        Self::with_agent_args(name, Vec::new()).await
    }

    /// [`Bench::new`] with more flags for the agent (for example
    /// `--key-encryption-key-file <file>`).
    pub async fn with_agent_args(name: &str, agent_args: Vec<String>) -> Result<Self> {
        let _clock = crate::setup_clock::start("NodeBed::start");
        let lab = Lab::get();
        let parent = ZfsParent::create(&lab, name)?;
        let mut config = AgentConfig::zvols_and_thin_lvs(
            &lab,
            &lab.unique(name),
            &parent,
            NVME_PORT,
            ISCSI_PORT,
        )?;
        config.extra_args = agent_args;
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
            parent,
            agent_process,
            agent,
            plugin,
            lab,
        })
    }

    /// Creates a volume of `size` on `backend` and exports it over
    /// `protocol` to this node only.
    pub async fn volume(&mut self, backend: i32, protocol: i32, size: u64) -> Result<Volume> {
        self.volume_with_chap(backend, protocol, size, None).await
    }

    /// As [`Bench::volume`]; with `chap`, the iSCSI export requires these
    /// CHAP credentials (the publish context does not carry them: the test
    /// adds them or not).
    pub async fn volume_with_chap(
        &mut self,
        backend: i32,
        protocol: i32,
        size: u64,
        chap: Option<pb::IscsiChap>,
    ) -> Result<Volume> {
        self.make_volume(backend, protocol, size, chap, false).await
    }

    /// An encrypted zvol of `size` (the agent needs its key-encryption
    /// key, [`Bench::with_agent_args`]), exported over `protocol` to this
    /// node only.
    pub async fn encrypted_zvol(&mut self, protocol: i32, size: u64) -> Result<Volume> {
        self.make_volume(ZVOL, protocol, size, None, true).await
    }

    async fn make_volume(
        &mut self,
        backend: i32,
        protocol: i32,
        size: u64,
        chap: Option<pb::IscsiChap>,
        encrypted: bool,
    ) -> Result<Volume> {
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
                encrypted,
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
            chap,
        };
        v.context = self.export(&v).await?;
        Ok(v)
    }

    /// Exports `v` to this node only; returns the publish context.
    pub async fn export(&mut self, v: &Volume) -> Result<HashMap<String, String>> {
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
                chap: v.chap.clone(),
            })
            .await?
            .into_inner();
        let mut context = HashMap::from([
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
        ]);
        if !e.device_identity.is_empty() {
            context.insert("deviceIdentity".to_owned(), e.device_identity);
        }
        Ok(context)
    }

    /// Unexports `v`.
    pub async fn unexport(&mut self, v: &Volume) -> Result<()> {
        self.agent
            .unexport_volume(pb::UnexportVolumeRequest {
                volume_id: v.id.clone(),
                protocol_type: v.protocol,
                fence: fence(&v.uid, 1),
            })
            .await?;
        Ok(())
    }

    /// Unexports and deletes `v`.
    pub async fn delete(&mut self, v: &Volume) -> Result<()> {
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

    /// Grows `v` on the storage side to `size`.
    pub async fn expand(&mut self, v: &Volume, size: u64) -> Result<()> {
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

    /// Reboots the storage side as a power cycle does: the agent killed,
    /// every nvmet and LIO object removed from configfs (the kernel target's
    /// state does not survive a reboot), the agent started again, which
    /// makes its exports again from its marks, after `down` (the node's
    /// reboot). Returns how long the target was gone: from the kill until
    /// the restarted agent answered.
    pub async fn reboot_storage(&mut self, down: Duration) -> Result<Duration> {
        let start = std::time::Instant::now();
        self.agent_process.kill()?;
        empty_kernel_targets()?;
        tokio::time::sleep(down).await;
        self.agent_process.restart().await?;
        self.agent = self.agent_process.client().await?;
        Ok(start.elapsed())
    }

    /// The dataset of the zvol of agent volume ID `volume_id` (the ID names
    /// the pool and the zvol; the agent keeps it under the bench's parent
    /// dataset).
    pub fn dataset(&self, volume_id: &str) -> String {
        let name = volume_id.rsplit('/').next().unwrap_or_default();
        format!("{}/{name}", self.parent.dataset())
    }

    /// A fresh folder for staging or publishing.
    pub fn path(&self, what: &str) -> PathBuf {
        let dir = self.lab.work.join("kubelet");
        let _ = fs::create_dir_all(&dir);
        dir.join(self.lab.unique(what))
    }
}

/// Appends `line` to the lab's `node-measurements.txt` (the node tests'
/// figures, kept in the work folder after the run).
pub fn measured(lab: &Lab, line: &str) -> Result<()> {
    use std::io::Write;
    let mut f = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(lab.work.join("node-measurements.txt"))?;
    writeln!(f, "{line}")?;
    Ok(())
}

/// A key-encryption key file for the agent (`--key-encryption-key-file`):
/// 32 random bytes, mode 0600, in the lab's work folder; with its bytes.
pub fn key_encryption_key_file(lab: &Lab, name: &str) -> Result<(PathBuf, Vec<u8>)> {
    use std::io::{Read, Write};
    use std::os::unix::fs::OpenOptionsExt;
    let mut bytes = vec![0u8; 32];
    fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    let path = lab.work.join(lab.unique(name));
    fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(0o600)
        .open(&path)?
        .write_all(&bytes)?;
    Ok((path, bytes))
}

/// The agent's flags that give it the key-encryption key at `path`.
pub fn key_encryption_key_args(path: &Path) -> Vec<String> {
    vec![
        "--key-encryption-key-file".into(),
        path.display().to_string(),
    ]
}

/// `zfs unload-key dataset`, after udev settled, tried again (for up to
/// ten seconds) while the probe udev runs on a device written and closed
/// still holds it.
pub fn unload_zfs_key(dataset: &str) -> Result<()> {
    let mut tries = 0;
    loop {
        run("udevadm", &["settle"])?;
        match run("zfs", &["unload-key", dataset]) {
            Ok(_) => return Ok(()),
            Err(e) if tries == 20 => return Err(e.into()),
            Err(_) => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(500));
            }
        }
    }
}

/// Removes every nvmet subsystem, port and host and every LIO target and
/// iblock storage object, in the kernel's order, as a reboot leaves them.
pub fn empty_kernel_targets() -> Result<()> {
    let nvmet = nvmet::Nvmet::open()?;
    let state = nvmet.read()?;
    nvmet.teardown(&nvmet::Teardown {
        subsystems: state.subsystems.keys().cloned().collect(),
        ports: state.ports.keys().cloned().collect(),
        hosts: state.hosts,
    })?;
    let lio = lio::Lio::open()?;
    let state = lio.read()?;
    lio.teardown(&lio::Teardown {
        targets: state.targets.keys().cloned().collect(),
        storage_objects: state.storage_objects.keys().cloned().collect(),
    })?;
    Ok(())
}

/// One agent volume and its publish context.
pub struct Volume {
    /// The agent's volume ID.
    pub id: String,
    /// The CSI volume handle.
    pub csi_id: String,
    /// The fence UID.
    pub uid: String,
    /// The backend, as the agent's enum.
    pub backend: i32,
    /// The protocol, as the agent's enum.
    pub protocol: i32,
    /// The device on the storage side.
    pub device: PathBuf,
    /// The publish context.
    pub context: HashMap<String, String>,
    /// The CHAP credentials the export requires, if any.
    pub chap: Option<pb::IscsiChap>,
}

/// A single-node-writer filesystem capability (`noatime`).
pub fn mount_cap(fs_type: &str) -> Option<csi_pb::VolumeCapability> {
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

/// A single-node-writer block capability.
pub fn block_cap() -> Option<csi_pb::VolumeCapability> {
    use csi_pb::volume_capability::{access_mode::Mode, AccessMode, AccessType, BlockVolume};
    Some(csi_pb::VolumeCapability {
        access_type: Some(AccessType::Block(BlockVolume {})),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    })
}

/// A NodeStageVolume request.
pub fn stage_req(
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

/// A NodePublishVolume request.
pub fn publish_req(
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

/// A NodeUnstageVolume request.
pub fn unstage_req(v: &Volume, staging: &Path) -> csi_pb::NodeUnstageVolumeRequest {
    csi_pb::NodeUnstageVolumeRequest {
        volume_id: v.csi_id.clone(),
        staging_target_path: staging.display().to_string(),
    }
}

/// A NodeUnpublishVolume request.
pub fn unpublish_req(v: &Volume, target: &Path) -> csi_pb::NodeUnpublishVolumeRequest {
    csi_pb::NodeUnpublishVolumeRequest {
        volume_id: v.csi_id.clone(),
        target_path: target.display().to_string(),
    }
}

/// The mount table's line for `path` (the `findmnt` witness).
pub fn mounted(path: &Path) -> Result<Option<String>> {
    Ok(fs::read_to_string("/proc/self/mountinfo")?
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(&path.display().to_string()))
        .map(str::to_owned))
}

/// `df -B1` size of the filesystem at `path`.
pub fn df_size(path: &Path) -> Result<u64> {
    let out = run("df", &["-B1", "--output=size", &path.display().to_string()])?;
    Ok(out.lines().nth(1).unwrap_or_default().trim().parse()?)
}

/// The NVMe controllers of subsystem `nqn` (the sysfs witness).
pub fn controllers_of(nqn: &str) -> Vec<String> {
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
pub fn iscsi_session(iqn: &str) -> bool {
    fs::read_dir("/sys/class/iscsi_session").is_ok_and(|it| {
        it.filter_map(|e| e.ok())
            .any(|e| fs::read_to_string(e.path().join("targetname")).is_ok_and(|s| s.trim() == iqn))
    })
}

/// How many staging records the plugin keeps in `state_dir`.
pub fn records(state_dir: &Path) -> Result<usize> {
    Ok(fs::read_dir(state_dir)?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .count())
}

/// Whether the node holds a connection to `v`'s target.
pub fn connected(v: &Volume) -> bool {
    connected_to(v.protocol == NVME, &v.context["target"])
}

/// Whether the node holds a connection to `target`: an NVMe subsystem NQN
/// when `nvme`, else an iSCSI target IQN.
pub fn connected_to(nvme: bool, target: &str) -> bool {
    if nvme {
        !controllers_of(target).is_empty()
    } else {
        iscsi_session(target)
    }
}

/// The filesystem UUID on the namespace of subsystem `nqn` (blkid witness).
pub fn blkid_uuid(nqn: &str) -> Result<String> {
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
