//! The crash matrix's test bed: one parent dataset and one agent state
//! folder shared by every case, the state each operation starts from, its
//! request, what the node holds (for the invariant checker), and the cleanup
//! that returns the node to where the next case starts.
use pillar_csi_agent::{
    crash,
    invariants::{self, ListedVolume, Observed, Violation},
    marks::{encode, SUFFIX},
};
use pillar_csi_lab::{
    agent::{pb, AgentProcess, ZfsParent},
    block::{pattern, read_at, write_at},
    env::Lab,
    run,
};
use std::{fs, path::PathBuf, time::Duration};
use tonic::Status;

pub type R<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

pub const NVME_PORT: u16 = 4436;
pub const ISCSI_PORT: u16 = 3276;
pub const SIZE: u64 = 8 << 20;
pub const ZVOL: i32 = pb::BackendType::ZfsZvol as i32;
pub const NVME: i32 = pb::ProtocolType::NvmeofTcp as i32;
pub const ISCSI: i32 = pb::ProtocolType::Iscsi as i32;
pub const HOST1: &str = "nqn.2026-01.org.example.crash:h1";
pub const HOST2: &str = "nqn.2026-01.org.example.crash:h2";
pub const INIT1: &str = "iqn.2026-01.org.example.crash:i1";
pub const INIT2: &str = "iqn.2026-01.org.example.crash:i2";
/// Where the data pattern sits (bytes), and how long it is.
pub const PATTERN_AT: u64 = 1 << 20;
pub const PATTERN_LEN: usize = 64 << 10;

/// The operations of the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Create,
    Import,
    ExportNvme,
    ExportIscsi,
    AllowNvme,
    DenyNvme,
    AllowIscsi,
    DenyIscsi,
    UnexportNvme,
    UnexportIscsi,
    Expand,
    Delete,
    Release,
    Reconcile,
}

pub const OPS: [Op; 14] = [
    Op::Create,
    Op::Import,
    Op::ExportNvme,
    Op::ExportIscsi,
    Op::AllowNvme,
    Op::DenyNvme,
    Op::AllowIscsi,
    Op::DenyIscsi,
    Op::UnexportNvme,
    Op::UnexportIscsi,
    Op::Expand,
    Op::Delete,
    Op::Release,
    Op::Reconcile,
];

impl Op {
    pub fn label(self) -> &'static str {
        match self {
            Op::Create => "CreateVolume",
            Op::Import => "ImportVolume",
            Op::ExportNvme => "ExportVolume nvme",
            Op::ExportIscsi => "ExportVolume iscsi",
            Op::AllowNvme => "AllowInitiator nvme",
            Op::DenyNvme => "DenyInitiator nvme",
            Op::AllowIscsi => "AllowInitiator iscsi",
            Op::DenyIscsi => "DenyInitiator iscsi",
            Op::UnexportNvme => "UnexportVolume nvme",
            Op::UnexportIscsi => "UnexportVolume iscsi",
            Op::Expand => "ExpandVolume",
            Op::Delete => "DeleteVolume",
            Op::Release => "ReleaseVolume",
            Op::Reconcile => "restart reconcile",
        }
    }

    /// Whether the volume exists before the operation (its data is checked).
    pub fn on_existing(self) -> bool {
        !matches!(self, Op::Create)
    }
}

/// One case's volume.
#[derive(Debug, Clone)]
pub struct Case {
    pub id: String,
    pub dataset: String,
    pub uid: String,
    /// The zvol an import adopts.
    pub source: Option<String>,
}

impl Case {
    pub fn fence(&self) -> Option<pb::FenceToken> {
        Some(pb::FenceToken {
            volume_uid: self.uid.clone(),
            generation: 1,
        })
    }
}

pub struct Bed {
    pub lab: Lab,
    pub parent: ZfsParent,
    pub agent: AgentProcess,
    pub crash_binary: PathBuf,
    pub baseline: Vec<Violation>,
    pub serial: u32,
}

pub fn sh(script: &str) -> String {
    run("sh", &["-c", script]).unwrap_or_else(|e| panic!("{script}: {e}"))
}

pub fn export_request(c: &Case, protocol: i32, initiators: &[&str]) -> pb::ExportVolumeRequest {
    pb::ExportVolumeRequest {
        volume_id: c.id.clone(),
        backend_type: ZVOL,
        protocol_type: protocol,
        fence: c.fence(),
        acl_enabled: true,
        allowed_initiators: initiators.iter().map(|s| (*s).to_owned()).collect(),
        chap: None,
    }
}

impl Bed {
    pub fn state_dir(&self) -> PathBuf {
        self.agent.config().state_dir.clone()
    }

    /// A new case's names (nothing made yet).
    pub fn case(&mut self) -> Case {
        self.serial += 1;
        let name = format!("c{}", self.serial);
        Case {
            id: format!("{}/{name}", self.parent.pool),
            dataset: format!("{}/{name}", self.parent.dataset()),
            uid: format!("uid-crash-{}", self.serial),
            source: None,
        }
    }

    /// What the node holds now.
    pub fn observe(&self) -> R<Observed> {
        let mut seen = Observed {
            agent_port: Some(nvmet::PortId(1)),
            reconciled: true,
            ..Default::default()
        };
        for entry in fs::read_dir(self.state_dir())? {
            let entry = entry?;
            seen.files.push((
                entry.file_name().to_string_lossy().into_owned(),
                fs::read(entry.path())?,
            ));
        }
        sh("udevadm settle || true");
        let listed = run(
            "zfs",
            &[
                "list",
                "-H",
                "-o",
                "name",
                "-t",
                "volume",
                "-r",
                &self.parent.dataset(),
            ],
        )?;
        for name in listed.lines().filter(|l| !l.is_empty()) {
            let device = fs::canonicalize(format!("/dev/zvol/{name}"))
                .unwrap_or_else(|_| PathBuf::from(format!("/dev/zvol/{name}")));
            seen.volumes.push(ListedVolume {
                name: name.to_owned(),
                device,
            });
        }
        seen.nvmet = nvmet::Nvmet::open()?.read()?;
        let lio = lio::Lio::open()?;
        seen.lio = lio.read()?;
        seen.lio_hbas = lio.hbas()?;
        let paths = seen
            .nvmet
            .subsystems
            .values()
            .flat_map(|s| s.namespaces.values().map(|n| n.device_path.clone()))
            .chain(
                seen.lio
                    .storage_objects
                    .values()
                    .map(|s| s.udev_path.clone()),
            )
            .collect::<Vec<_>>();
        for p in paths {
            if let Ok(real) = fs::canonicalize(&p) {
                seen.resolved.insert(p, real);
            }
        }
        Ok(seen)
    }

    /// The violations not present before the first case.
    pub fn violations(&self) -> R<Vec<Violation>> {
        let found = invariants::check(&self.observe()?);
        Ok(found
            .into_iter()
            .filter(|v| !self.baseline.contains(v))
            .collect())
    }

    pub fn device(c: &Case) -> PathBuf {
        PathBuf::from(format!("/dev/zvol/{}", c.dataset))
    }

    pub fn write_pattern(&self, c: &Case, seed: u64) -> R {
        let dev = Self::device(c);
        pillar_csi_lab::block::wait_for(&dev, Duration::from_secs(30))?;
        write_at(&dev, PATTERN_AT, &pattern(seed, PATTERN_LEN))
    }

    pub fn pattern_intact(&self, c: &Case, seed: u64) -> R<bool> {
        let dev = Self::device(c);
        pillar_csi_lab::block::wait_for(&dev, Duration::from_secs(30))?;
        Ok(read_at(&dev, PATTERN_AT, PATTERN_LEN)? == pattern(seed, PATTERN_LEN))
    }

    pub async fn create(&self, c: &Case) -> R {
        let mut client = self.agent.client().await?;
        client
            .create_volume(pb::CreateVolumeRequest {
                volume_id: c.id.clone(),
                backend_type: ZVOL,
                capacity_bytes: SIZE,
                fence: c.fence(),
                ..Default::default()
            })
            .await?;
        Ok(())
    }

    pub async fn export(&self, c: &Case, protocol: i32, initiators: &[&str]) -> R {
        let mut client = self.agent.client().await?;
        client
            .export_volume(export_request(c, protocol, initiators))
            .await?;
        Ok(())
    }

    /// The state `op` starts from, made with the ordinary agent; the
    /// pattern written when the volume exists.
    pub async fn prepare(&mut self, op: Op) -> R<Case> {
        let mut c = self.case();
        match op {
            Op::Create => return Ok(c),
            Op::Import => {
                // An import adopts the zvol where the volume ID resolves.
                run(
                    "zfs",
                    &["create", "-s", "-V", &SIZE.to_string(), &c.dataset],
                )?;
                c.source = Some(c.dataset.clone());
            }
            _ => self.create(&c).await?,
        }
        self.write_pattern(&c, u64::from(self.serial))?;
        match op {
            Op::ExportNvme | Op::ExportIscsi | Op::Create | Op::Import => {}
            Op::AllowNvme | Op::UnexportNvme | Op::Expand => {
                self.export(&c, NVME, &[HOST1]).await?
            }
            Op::DenyNvme => self.export(&c, NVME, &[HOST1, HOST2]).await?,
            Op::AllowIscsi | Op::UnexportIscsi => self.export(&c, ISCSI, &[INIT1]).await?,
            Op::DenyIscsi => self.export(&c, ISCSI, &[INIT1, INIT2]).await?,
            Op::Delete | Op::Release | Op::Reconcile => {
                self.export(&c, NVME, &[HOST1]).await?;
                self.export(&c, ISCSI, &[INIT1]).await?;
            }
        }
        if op == Op::Reconcile {
            // The kernel lost every export (a reboot): start-up
            // reconciliation re-creates them from the marks.
            self.wipe_exports(&c)?;
        }
        Ok(c)
    }

    /// Removes the case's exports from configfs behind the agent's back
    /// (whatever agent name their targets carry: they end in the volume's
    /// part).
    pub fn wipe_exports(&self, c: &Case) -> R {
        let id = pillar_csi_agent::volume::VolumeId::parse(&c.id)?;
        let suffix = format!(":{}", id.target_suffix());
        let nvmet = nvmet::Nvmet::open()?;
        let subsystems = nvmet.read()?.subsystems.into_keys();
        nvmet.teardown(&nvmet::Teardown {
            subsystems: subsystems
                .filter(|n| n.as_str().ends_with(&suffix))
                .collect(),
            ..Default::default()
        })?;
        let lio = lio::Lio::open()?;
        let targets = lio.read()?.targets.into_keys();
        lio.teardown(&lio::Teardown {
            targets: targets.filter(|n| n.as_str().ends_with(&suffix)).collect(),
            storage_objects: [pillar_csi_agent::export::LioExporter::object(&id)?].into(),
        })?;
        Ok(())
    }

    /// The operation's request, as the controller sends it (and repeats it).
    pub async fn call(&self, op: Op, c: &Case) -> Result<(), Status> {
        let mut client = self
            .agent
            .client()
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        call_on(&mut client, op, c).await
    }

    /// Deletes the case's volume and its mark, and the agent's nvmet port
    /// when it links nothing, so the next case starts from the same node.
    pub async fn cleanup(&mut self, c: &Case) -> R {
        let mut client = self.agent.client().await?;
        let delete = |uid: &str| pb::DeleteVolumeRequest {
            volume_id: c.id.clone(),
            backend_type: ZVOL,
            fence: Some(pb::FenceToken {
                volume_uid: uid.to_owned(),
                generation: 1,
            }),
        };
        if client.delete_volume(delete(&c.uid)).await.is_err() {
            // An ended (released) lifecycle: a new one deletes the volume.
            client
                .delete_volume(delete(&format!("{}-cleanup", c.uid)))
                .await?;
        }
        if let Some(source) = &c.source {
            let _ = run("zfs", &["destroy", source]);
        }
        let mark = self.state_dir().join(format!("{}{SUFFIX}", encode(&c.id)));
        match fs::remove_file(&mark) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
        let target = nvmet::Nvmet::open()?;
        let state = target.read()?;
        if state
            .ports
            .get(&nvmet::PortId(1))
            .is_some_and(|p| p.subsystems.is_empty())
        {
            target.teardown(&nvmet::Teardown {
                ports: [nvmet::PortId(1)].into(),
                ..Default::default()
            })?;
        }
        Ok(())
    }

    /// Restarts the agent: the crash-points binary armed with `armed`
    /// (`None`: the ordinary binary), logging to a fresh file. Waits for
    /// it to serve unless `answer` is false.
    pub async fn restart(&mut self, armed: Option<&str>, answer: bool) -> R {
        let log = self.lab.work.join(format!("crash-{}.log", self.serial));
        let config = self.agent.config_mut();
        config.log = log;
        match armed {
            Some(point) => {
                config.binary = Some(self.crash_binary.clone());
                config.env = vec![(crash::ENV.into(), point.into())];
            }
            None => {
                config.binary = None;
                config.env.clear();
            }
        }
        if answer {
            self.agent.restart().await
        } else {
            self.agent.restart_unanswered()
        }
    }
}

/// The operation's request on `client`.
pub async fn call_on(
    client: &mut pillar_csi_lab::agent::Client,
    op: Op,
    c: &Case,
) -> Result<(), Status> {
    let (id, fence) = (c.id.clone(), c.fence());
    match op {
        Op::Create => client
            .create_volume(pb::CreateVolumeRequest {
                volume_id: id,
                backend_type: ZVOL,
                capacity_bytes: SIZE,
                fence,
                ..Default::default()
            })
            .await
            .map(drop),
        Op::Import => client
            .create_volume(pb::CreateVolumeRequest {
                volume_id: id,
                backend_type: ZVOL,
                capacity_bytes: SIZE,
                fence,
                import_zvol: c.source.clone().unwrap_or_default(),
                ..Default::default()
            })
            .await
            .map(drop),
        Op::ExportNvme => client
            .export_volume(export_request(c, NVME, &[HOST1]))
            .await
            .map(drop),
        Op::ExportIscsi => client
            .export_volume(export_request(c, ISCSI, &[INIT1]))
            .await
            .map(drop),
        Op::AllowNvme | Op::AllowIscsi => {
            let (protocol, initiator) = if op == Op::AllowNvme {
                (NVME, HOST2)
            } else {
                (ISCSI, INIT2)
            };
            client
                .allow_initiator(pb::AllowInitiatorRequest {
                    volume_id: id,
                    protocol_type: protocol,
                    initiator_id: initiator.into(),
                    fence,
                })
                .await
                .map(drop)
        }
        Op::DenyNvme | Op::DenyIscsi => {
            let (protocol, initiator) = if op == Op::DenyNvme {
                (NVME, HOST2)
            } else {
                (ISCSI, INIT2)
            };
            client
                .deny_initiator(pb::DenyInitiatorRequest {
                    volume_id: id,
                    protocol_type: protocol,
                    initiator_id: initiator.into(),
                    fence,
                })
                .await
                .map(drop)
        }
        Op::UnexportNvme | Op::UnexportIscsi => client
            .unexport_volume(pb::UnexportVolumeRequest {
                volume_id: id,
                protocol_type: if op == Op::UnexportNvme { NVME } else { ISCSI },
                fence,
            })
            .await
            .map(drop),
        Op::Expand => client
            .expand_volume(pb::ExpandVolumeRequest {
                volume_id: id,
                backend_type: ZVOL,
                requested_bytes: 2 * SIZE,
                fence,
            })
            .await
            .map(drop),
        Op::Delete => client
            .delete_volume(pb::DeleteVolumeRequest {
                volume_id: id,
                backend_type: ZVOL,
                fence,
            })
            .await
            .map(drop),
        Op::Release => client
            .release_volume(pb::ReleaseVolumeRequest {
                volume_id: id,
                backend_type: ZVOL,
                fence,
            })
            .await
            .map(drop),
        Op::Reconcile => Ok(()),
    }
}
