//! A simulated backend (one zvol pool, `tank`; the LVM volume group of
//! [`super::sim_lvm`] beside it) and NVMe/TCP exporter: the
//! service's unit tests (fencing, idempotency, locking and failure handling
//! without the kernel) and the CSI controller's API-server tests use it. The same
//! behaviour against the real kernel, ZFS and LVM is proven by the lab tests.
use super::*;
use crate::{
    backend::{Backend, BackendKind, Capacity, CreateOptions, ImportSource},
    config::Listener,
    export::{ExportInfo, Exporter},
    fence::Token,
    marks::ExportRecord,
};
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Mutex,
};

/// A zvol backend of one pool, `tank`, whose volumes are sizes in a map.
#[derive(Default)]
pub struct SimBackend {
    /// Refuse the next create as bad input, as a real backend refuses a bad property.
    pub fail_next: std::sync::atomic::AtomicBool,
    /// Make the next create's volume, then fail (as a report after lvcreate can).
    pub fail_after_create: std::sync::atomic::AtomicBool,
    /// Each volume's size, by its backend record.
    pub volumes: Mutex<BTreeMap<String, u64>>,
    /// How many volumes were created.
    pub created: Mutex<u32>,
    /// How many volumes were destroyed.
    pub destroyed: Mutex<u32>,
    /// The device an import reports (default: the simulated `/dev/zd0`).
    pub import_device: Mutex<Option<PathBuf>>,
}

impl Backend for SimBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Zvol
    }
    fn pool(&self) -> &str {
        "tank"
    }
    fn locate(&self, id: &VolumeId) -> Result<BackendRecord, AgentError> {
        Ok(BackendRecord::Zvol {
            dataset: format!("tank/k8s/{}", id.name()),
            guid: None,
        })
    }
    fn create(
        &self,
        at: &BackendRecord,
        bytes: u64,
        _: &CreateOptions,
    ) -> Result<(BackendRecord, VolumeState), AgentError> {
        if self
            .fail_next
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            return Err(AgentError::InvalidArgument(
                "zfs property sparse=\"maybe\": must be true or false".into(),
            ));
        }
        let name = format!("{at:?}");
        let mut v = self
            .volumes
            .lock()
            .map_err(|_| AgentError::Internal("poison".into()))?;
        if let Some(size) = v.get(&name) {
            if *size != bytes {
                return Err(AgentError::AlreadyExists(format!(
                    "{name} exists with size {size}"
                )));
            }
        } else {
            // Widen the race window: a second create for the same volume
            // running now would create it twice.
            std::thread::sleep(std::time::Duration::from_millis(2));
            v.insert(name, bytes);
            *self
                .created
                .lock()
                .map_err(|_| AgentError::Internal("poison".into()))? += 1;
            if self
                .fail_after_create
                .swap(false, std::sync::atomic::Ordering::SeqCst)
            {
                return Err(AgentError::Internal(
                    "created, then the report of the new volume failed".into(),
                ));
            }
        }
        Ok((
            at.clone(),
            VolumeState {
                capacity_bytes: bytes,
                device_path: PathBuf::from("/dev/zd0"),
            },
        ))
    }
    fn lookup(&self, at: &BackendRecord) -> Result<Option<VolumeState>, AgentError> {
        let v = self
            .volumes
            .lock()
            .map_err(|_| AgentError::Internal("poison".into()))?;
        Ok(v.get(&format!("{at:?}")).map(|b| VolumeState {
            capacity_bytes: *b,
            device_path: PathBuf::from("/dev/zd0"),
        }))
    }
    fn destroy(&self, at: &BackendRecord) -> Result<(), AgentError> {
        self.volumes
            .lock()
            .map_err(|_| AgentError::Internal("poison".into()))?
            .remove(&format!("{at:?}"));
        *self
            .destroyed
            .lock()
            .map_err(|_| AgentError::Internal("poison".into()))? += 1;
        Ok(())
    }
    fn expand(&self, at: &BackendRecord, bytes: u64) -> Result<u64, AgentError> {
        let mut v = self
            .volumes
            .lock()
            .map_err(|_| AgentError::Internal("poison".into()))?;
        let size = v
            .get_mut(&format!("{at:?}"))
            .ok_or_else(|| AgentError::NotFound("no volume".into()))?;
        *size = (*size).max(bytes);
        Ok(*size)
    }
    fn capacity(&self) -> Result<Capacity, AgentError> {
        Ok(Capacity {
            total_bytes: 100,
            available_bytes: 50,
            used_bytes: 50,
        })
    }
    fn import(
        &self,
        id: &VolumeId,
        source: &ImportSource,
        _: u64,
    ) -> Result<(BackendRecord, VolumeState), AgentError> {
        let ImportSource::Zvol { dataset, .. } = source else {
            return Err(AgentError::InvalidArgument("zvols only".into()));
        };
        let at = BackendRecord::Zvol {
            dataset: dataset.clone(),
            guid: None,
        };
        let mut state = self
            .lookup(&at)?
            .ok_or_else(|| crate::adopt::refused(id, format!("missing: {dataset}")))?;
        if let Some(device) = self
            .import_device
            .lock()
            .map_err(|_| AgentError::Internal("poison".into()))?
            .clone()
        {
            state.device_path = device;
        }
        Ok((at, state))
    }
}

/// An NVMe/TCP exporter whose exports are records in a map.
#[derive(Default)]
pub struct SimExporter {
    /// Each export's record, by volume ID.
    pub exports: Mutex<BTreeMap<String, ExportRecord>>,
    /// How long each export takes (a slow configfs apply or device wait).
    pub delay_ms: std::sync::atomic::AtomicU64,
    /// How many exports have started (counted before the delay).
    pub started: std::sync::atomic::AtomicU64,
    /// Fail the next export halfway: the export exists, then an error (a
    /// port link refused with EADDRNOTAVAIL after the namespace was enabled).
    pub fail_halfway: std::sync::atomic::AtomicBool,
}

impl Exporter for SimExporter {
    fn protocol(&self) -> Protocol {
        Protocol::NvmeofTcp
    }
    fn check_initiator(&self, i: &str) -> Result<(), AgentError> {
        nvmet::Nqn::new(i).map(|_| ()).map_err(AgentError::from)
    }
    fn new_target(&self, v: &VolumeId) -> String {
        format!("sim:{v}")
    }
    fn own_names(&self, v: &VolumeId) -> Vec<String> {
        vec![self.new_target(v)]
    }
    fn export(&self, v: &VolumeId, _: &Path, r: &ExportRecord) -> Result<ExportInfo, AgentError> {
        self.started
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let delay = self.delay_ms.load(std::sync::atomic::Ordering::SeqCst);
        std::thread::sleep(std::time::Duration::from_millis(delay));
        self.exports
            .lock()
            .map_err(|_| AgentError::Internal("poison".into()))?
            .insert(v.to_string(), r.clone());
        if self
            .fail_halfway
            .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            return Err(AgentError::Internal(
                "symlink ports/1/subsystems/...: Cannot assign requested address".into(),
            ));
        }
        Ok(ExportInfo {
            target_id: r.target.clone().unwrap_or_else(|| v.to_string()),
            listener: Listener {
                address: [127, 0, 0, 1].into(),
                port: 4420,
            },
            lun: 1,
            device_identity: format!("identity of {v}"),
        })
    }
    fn unexport(&self, v: &VolumeId, _: Option<&str>) -> Result<(), AgentError> {
        self.exports
            .lock()
            .map_err(|_| AgentError::Internal("poison".into()))?
            .remove(v.as_str());
        Ok(())
    }
    fn revalidate(&self, _: &VolumeId, _: &ExportRecord) -> Result<(), AgentError> {
        Ok(())
    }
    fn health(&self) -> Result<(), AgentError> {
        Ok(())
    }
}

/// An agent over the simulator, with its fence marks in a temporary folder.
pub struct Fixture {
    /// The agent.
    pub agent: Arc<Agent>,
    /// Its backend.
    pub backend: Arc<SimBackend>,
    /// Its LVM backend (volume group [`super::sim_lvm::VG`]).
    pub lvm: Arc<super::sim_lvm::SimLvm>,
    /// Its exporter.
    pub exporter: Arc<SimExporter>,
    /// The marks' folder, removed on drop.
    pub _dir: tempfile::TempDir,
}

/// A fresh agent over the simulator.
pub fn fixture() -> Fixture {
    fixture_with(None)
}

/// A fresh agent over the simulator, with metadata-loss recovery configured
/// when `recovery` is given (as `--recovery-trust-anchor` does).
pub fn fixture_with(recovery: Option<crate::recovery::Recovery>) -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = Arc::new(SimBackend::default());
    let lvm = Arc::new(super::sim_lvm::SimLvm::default());
    let exporter = Arc::new(SimExporter::default());
    let marks = MarkStore::open(dir.path()).expect("marks");
    let mut agent = Agent::new(
        vec![backend.clone(), lvm.clone()],
        vec![exporter.clone()],
        marks,
    );
    if let Some(recovery) = recovery {
        agent = agent.with_recovery(recovery);
    }
    let agent = Arc::new(agent);
    Fixture {
        agent,
        backend,
        lvm,
        exporter,
        _dir: dir,
    }
}

/// A fence token.
pub fn tok(uid: &str, generation: u64) -> Option<Token> {
    Some(Token {
        volume_uid: uid.into(),
        generation,
    })
}

/// A host NQN.
pub const HOST: &str = "nqn.2026-01.org.example:host";

/// [`acl`] as the simulator's kernel holds it for volume `v`: under the
/// target name the agent gave the export.
pub fn exported_acl(v: &str) -> ExportRecord {
    ExportRecord {
        target: Some(format!("sim:{v}")),
        ..acl()
    }
}

/// An export record admitting [`HOST`] only.
pub fn acl() -> ExportRecord {
    ExportRecord {
        acl: true,
        allowed_initiators: [HOST.to_owned()].into(),
        chap: None,
        target: None,
    }
}
