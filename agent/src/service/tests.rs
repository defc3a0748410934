//! The service's logic over a simulated backend and exporter: fencing,
//! idempotency and locking. The same behaviour against the real kernel, ZFS
//! and LVM is proven by the lab tests.
use super::*;
use crate::{backend::BackendKind, config::Listener, export::ExportInfo};
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Mutex,
};

#[derive(Default)]
struct SimBackend {
    /// Refuse the next create as bad input, as a real backend refuses a bad property.
    fail_next: std::sync::atomic::AtomicBool,
    volumes: Mutex<BTreeMap<String, u64>>,
    created: Mutex<u32>,
    destroyed: Mutex<u32>,
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
}

#[derive(Default)]
struct SimExporter {
    exports: Mutex<BTreeMap<String, ExportRecord>>,
}

impl Exporter for SimExporter {
    fn protocol(&self) -> Protocol {
        Protocol::NvmeofTcp
    }
    fn check_initiator(&self, i: &str) -> Result<(), AgentError> {
        nvmet::Nqn::new(i).map(|_| ()).map_err(AgentError::from)
    }
    fn export(&self, v: &VolumeId, _: &Path, r: &ExportRecord) -> Result<ExportInfo, AgentError> {
        self.exports
            .lock()
            .map_err(|_| AgentError::Internal("poison".into()))?
            .insert(v.to_string(), r.clone());
        Ok(ExportInfo {
            target_id: v.to_string(),
            listener: Listener {
                address: [127, 0, 0, 1].into(),
                port: 4420,
            },
            lun: 1,
        })
    }
    fn unexport(&self, v: &VolumeId) -> Result<(), AgentError> {
        self.exports
            .lock()
            .map_err(|_| AgentError::Internal("poison".into()))?
            .remove(v.as_str());
        Ok(())
    }
    fn revalidate(&self, _: &VolumeId) -> Result<(), AgentError> {
        Ok(())
    }
    fn health(&self) -> Result<(), AgentError> {
        Ok(())
    }
}

struct Fixture {
    agent: Arc<Agent>,
    backend: Arc<SimBackend>,
    exporter: Arc<SimExporter>,
    _dir: tempfile::TempDir,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let backend = Arc::new(SimBackend::default());
    let exporter = Arc::new(SimExporter::default());
    let marks = MarkStore::open(dir.path()).expect("marks");
    let agent = Arc::new(Agent::new(
        vec![backend.clone()],
        vec![exporter.clone()],
        marks,
    ));
    Fixture {
        agent,
        backend,
        exporter,
        _dir: dir,
    }
}

fn tok(uid: &str, generation: u64) -> Option<Token> {
    Some(Token {
        volume_uid: uid.into(),
        generation,
    })
}

const HOST: &str = "nqn.2026-01.org.example:host";

fn acl() -> ExportRecord {
    ExportRecord {
        acl: true,
        allowed_initiators: [HOST.to_owned()].into(),
    }
}

#[tokio::test]
async fn fencing_end_to_end() -> Result<(), AgentError> {
    let f = fixture();
    let a = &f.agent;
    let missing = a
        .create_volume("tank/v", None, 10, CreateOptions::default(), None)
        .await;
    assert!(matches!(missing, Err(AgentError::FailedPrecondition(_))));
    assert_eq!(
        a.marks().volume_ids()?,
        Vec::<String>::new(),
        "a refused call writes no mark"
    );

    a.create_volume(
        "tank/v",
        None,
        10,
        CreateOptions::default(),
        tok("u1", 1).as_ref(),
    )
    .await?;
    a.export_volume(
        "tank/v",
        None,
        Protocol::NvmeofTcp,
        acl(),
        tok("u1", 3).as_ref(),
    )
    .await?;
    let before = a.marks().load("tank/v")?;
    let stale = a
        .unexport_volume("tank/v", Protocol::NvmeofTcp, tok("u1", 2).as_ref())
        .await;
    assert!(
        matches!(&stale, Err(AgentError::FailedPrecondition(m)) if m.starts_with("stale fencing token")),
        "{stale:?}"
    );
    let other = a.delete_volume("tank/v", None, tok("u2", 9).as_ref()).await;
    assert!(
        matches!(&other, Err(AgentError::FailedPrecondition(m)) if m.contains("owned by live lifecycle u1"))
    );
    assert_eq!(a.marks().load("tank/v")?, before, "refusals change nothing");
    assert!(f
        .exporter
        .exports
        .lock()
        .map_err(|_| AgentError::Internal("poison".into()))?
        .contains_key("tank/v"));

    a.delete_volume("tank/v", None, tok("u1", 3).as_ref())
        .await?;
    assert_eq!(
        *f.backend
            .destroyed
            .lock()
            .map_err(|_| AgentError::Internal("poison".into()))?,
        1
    );
    assert!(
        f.exporter
            .exports
            .lock()
            .map_err(|_| AgentError::Internal("poison".into()))?
            .is_empty(),
        "delete removed the export"
    );
    a.delete_volume("tank/v", None, tok("u1", 3).as_ref())
        .await?;
    assert_eq!(
        *f.backend
            .destroyed
            .lock()
            .map_err(|_| AgentError::Internal("poison".into()))?,
        1,
        "a retried delete touches nothing"
    );
    let ended = a
        .export_volume(
            "tank/v",
            None,
            Protocol::NvmeofTcp,
            acl(),
            tok("u1", 4).as_ref(),
        )
        .await;
    assert!(matches!(ended, Err(AgentError::FailedPrecondition(m)) if m.contains("has ended")));
    a.create_volume(
        "tank/v",
        None,
        10,
        CreateOptions::default(),
        tok("u3", 1).as_ref(),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn volumes_this_agent_did_not_create_are_left_alone() -> Result<(), AgentError> {
    let f = fixture();
    let a = &f.agent;
    let foreign = BackendRecord::Zvol {
        dataset: "tank/k8s/foreign".into(),
    };
    f.backend.create(&foreign, 10, &CreateOptions::default())?;
    let export = a
        .export_volume(
            "tank/foreign",
            None,
            Protocol::NvmeofTcp,
            acl(),
            tok("u1", 1).as_ref(),
        )
        .await;
    assert!(
        matches!(export, Err(AgentError::FailedPrecondition(m)) if m.contains("not created by this agent"))
    );
    let expand = a
        .expand_volume("tank/foreign", None, 20, tok("u1", 1).as_ref())
        .await;
    assert!(matches!(expand, Err(AgentError::FailedPrecondition(_))));
    a.delete_volume("tank/foreign", None, tok("u1", 1).as_ref())
        .await?;
    assert!(
        f.backend.lookup(&foreign)?.is_some(),
        "delete destroyed a volume it never created"
    );
    assert_eq!(
        *f.backend
            .destroyed
            .lock()
            .map_err(|_| AgentError::Internal("poison".into()))?,
        0
    );
    Ok(())
}

#[tokio::test]
async fn concurrent_identical_creates_make_one_volume() -> Result<(), AgentError> {
    let f = fixture();
    let calls = (0..16).map(|_| {
        let a = f.agent.clone();
        tokio::spawn(async move {
            a.create_volume(
                "tank/same",
                None,
                10,
                CreateOptions::default(),
                tok("u1", 1).as_ref(),
            )
            .await
        })
    });
    for c in calls.collect::<Vec<_>>() {
        c.await??;
    }
    assert_eq!(
        *f.backend
            .created
            .lock()
            .map_err(|_| AgentError::Internal("poison".into()))?,
        1
    );
    Ok(())
}

#[tokio::test]
async fn bad_input_is_refused_before_anything() -> Result<(), AgentError> {
    let f = fixture();
    let a = &f.agent;
    for id in [
        "../x",
        "a/../../b",
        "tank/a\0",
        "tank/a\n",
        &"x".repeat(4096),
        "other/v",
    ] {
        let r = a
            .create_volume(
                id,
                None,
                10,
                CreateOptions::default(),
                tok("u1", 1).as_ref(),
            )
            .await;
        assert!(
            matches!(r, Err(AgentError::InvalidArgument(_))),
            "{id:?}: {r:?}"
        );
    }
    f.backend
        .fail_next
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let failed = a
        .create_volume(
            "tank/v",
            None,
            10,
            CreateOptions::default(),
            tok("u1", 1).as_ref(),
        )
        .await;
    assert!(
        matches!(failed, Err(AgentError::InvalidArgument(_))),
        "{failed:?}"
    );
    assert_eq!(
        a.marks().volume_ids()?,
        Vec::<String>::new(),
        "a failed create leaves no mark"
    );
    let zero = a
        .create_volume(
            "tank/v",
            None,
            0,
            CreateOptions::default(),
            tok("u1", 1).as_ref(),
        )
        .await;
    assert!(matches!(zero, Err(AgentError::InvalidArgument(m)) if m.contains("capacity_bytes")));
    let lvm = a
        .create_volume(
            "tank/v",
            Some(BackendKind::Lvm),
            10,
            CreateOptions::default(),
            tok("u1", 1).as_ref(),
        )
        .await;
    assert!(matches!(lvm, Err(AgentError::InvalidArgument(_))));
    let bad_host = ExportRecord {
        acl: true,
        allowed_initiators: ["not an nqn".to_owned()].into(),
    };
    let r = a
        .export_volume(
            "tank/v",
            None,
            Protocol::NvmeofTcp,
            bad_host,
            tok("u1", 1).as_ref(),
        )
        .await;
    assert!(matches!(r, Err(AgentError::InvalidArgument(_))));
    assert_eq!(a.marks().volume_ids()?, Vec::<String>::new());
    Ok(())
}

#[tokio::test]
async fn restart_recreates_exports_and_skips_corrupt_marks() -> Result<(), AgentError> {
    let f = fixture();
    let a = &f.agent;
    for v in ["tank/a", "tank/b"] {
        a.create_volume(v, None, 10, CreateOptions::default(), tok(v, 1).as_ref())
            .await?;
        a.export_volume(v, None, Protocol::NvmeofTcp, acl(), tok(v, 1).as_ref())
            .await?;
    }
    f.exporter
        .exports
        .lock()
        .map_err(|_| AgentError::Internal("poison".into()))?
        .clear();
    std::fs::write(
        a.marks()
            .dir()
            .join(format!("{}.mark.json", crate::marks::encode("tank/b"))),
        b"garbage",
    )
    .map_err(|e| AgentError::Internal(e.to_string()))?;
    let r = a.reconcile_from_marks().await?;
    assert_eq!(r.applied, 1);
    assert!(
        r.failed.len() == 1 && r.failed[0].contains("tank/b") && r.failed[0].contains("corrupt"),
        "{r:?}"
    );
    let restored = f
        .exporter
        .exports
        .lock()
        .map_err(|_| AgentError::Internal("poison".into()))?
        .get("tank/a")
        .cloned();
    assert_eq!(restored, Some(acl()));
    let corrupt = a
        .unexport_volume("tank/b", Protocol::NvmeofTcp, tok("tank/b", 1).as_ref())
        .await;
    assert!(matches!(corrupt, Err(AgentError::Internal(_))));
    Ok(())
}

#[tokio::test]
async fn calls_for_a_pool_no_backend_serves_are_refused_and_record_nothing(
) -> Result<(), AgentError> {
    let f = fixture();
    let a = &f.agent;
    let results = [
        a.unexport_volume("other/v", Protocol::NvmeofTcp, tok("u1", 1).as_ref())
            .await,
        a.set_initiator(
            "other/v",
            Protocol::NvmeofTcp,
            HOST,
            true,
            tok("u1", 1).as_ref(),
        )
        .await,
        a.set_initiator(
            "other/v",
            Protocol::NvmeofTcp,
            HOST,
            false,
            tok("u1", 1).as_ref(),
        )
        .await,
    ];
    for r in results {
        assert!(
            matches!(&r, Err(AgentError::InvalidArgument(m)) if m.contains("no backend")),
            "{r:?}"
        );
    }
    assert_eq!(a.marks().volume_ids()?, Vec::<String>::new());
    Ok(())
}
