//! What the in-process lab tests of the agent share: the real backends
//! (libzfs, liblvm2cmd) and kernel targets (nvmet, LIO) behind an `Agent`,
//! tokens, shell witnesses and the LV identity read with `lvs`.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]
use api::annotations::{LvIdentity, LvPolicy};
use pillar_csi_agent::{
    backend::{Backend, ImportSource, LvmBackend, VolumeState, ZfsBackend},
    config::Listener,
    error::AgentError,
    export::{Exporter, LioExporter, NvmetExporter, TargetNames},
    fence::Token,
    marks::MarkStore,
    service::Agent,
};
use pillar_csi_lab::{cmd::run, env::Lab};
use std::{
    net::IpAddr,
    path::PathBuf,
    sync::{Arc, OnceLock},
};

pub mod grpc;

pub type R = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// The name the lab's in-process agents give their export targets.
pub const AGENT_NAME: &str = "lab-storage";
pub const HOST_NQN: &str = "nqn.2026-01.com.bhyoo.pillar-csi.lab:adopt-host";

pub fn sh(script: &str) -> String {
    run("sh", &["-c", script]).unwrap_or_else(|e| panic!("{e}"))
}

pub fn zfs() -> Arc<sys::zfs::Zfs> {
    static Z: OnceLock<Arc<sys::zfs::Zfs>> = OnceLock::new();
    Z.get_or_init(|| Arc::new(sys::zfs::Zfs::open().expect("libzfs")))
        .clone()
}

pub fn lvm() -> Arc<sys::lvm::Lvm> {
    static L: OnceLock<Arc<sys::lvm::Lvm>> = OnceLock::new();
    L.get_or_init(|| sys::lvm::Lvm::start_shared().expect("liblvm2cmd"))
        .clone()
}

pub struct Fixture {
    pub agent: std::sync::Arc<Agent>,
    pub state: tempfile::TempDir,
}

/// An in-process agent over `backends` whose nvmet (port ID 31, TCP 4420)
/// and LIO (TCP 3260) exports listen on 127.0.0.1.
pub fn agent(backends: Vec<Arc<dyn Backend>>) -> Fixture {
    agent_on(
        backends,
        IpAddr::from([127, 0, 0, 1]),
        nvmet::PortId(31),
        4420,
    )
}

/// An agent whose exports listen on `local`, its NVMe/TCP exports through
/// nvmet port `port_id` at TCP `nvme_port`.
pub fn agent_on(
    backends: Vec<Arc<dyn Backend>>,
    local: IpAddr,
    port_id: nvmet::PortId,
    nvme_port: u16,
) -> Fixture {
    let state = tempfile::tempdir().unwrap();
    let exporters: Vec<Arc<dyn Exporter>> = vec![
        Arc::new(NvmetExporter::new(
            nvmet::Nvmet::open().unwrap(),
            Listener {
                address: local,
                port: nvme_port,
            },
            port_id,
            TargetNames::new(AGENT_NAME).unwrap(),
        )),
        Arc::new(LioExporter::new(
            lio::Lio::open().unwrap(),
            Listener {
                address: local,
                port: 3260,
            },
            TargetNames::new(AGENT_NAME).unwrap(),
        )),
    ];
    let marks = MarkStore::open(state.path().join("agent")).unwrap();
    Fixture {
        agent: std::sync::Arc::new(Agent::new(backends, exporters, marks)),
        state,
    }
}

pub fn zfs_agent(lab: &Lab, parent: &str) -> Fixture {
    let b = ZfsBackend::new(zfs(), &lab.pool, Some(parent), None).unwrap();
    agent(vec![Arc::new(b)])
}

pub fn lvm_agent(lab: &Lab, thin: bool) -> Fixture {
    let pool = thin.then_some(lab.thin_pool.as_str());
    let b = LvmBackend::new(lvm(), &lab.vg, pool).unwrap();
    agent(vec![Arc::new(b)])
}

pub fn token(uid: &str, generation: u64) -> Token {
    Token {
        volume_uid: uid.into(),
        generation,
    }
}

pub async fn import_zvol(
    f: &Fixture,
    id: &str,
    dataset: &str,
    bytes: u64,
    uid: &str,
) -> Result<VolumeState, AgentError> {
    f.agent
        .import_volume(
            id,
            None,
            bytes,
            ImportSource::Zvol {
                dataset: dataset.into(),
                key: None,
            },
            Some(&token(uid, 1)),
        )
        .await
}

pub fn refusal(r: Result<VolumeState, AgentError>) -> String {
    match r {
        Ok(v) => panic!("expected a refusal, the import succeeded: {v:?}"),
        Err(e) => {
            assert!(
                matches!(e, AgentError::FailedPrecondition(_)),
                "refusals are FAILED_PRECONDITION: {e:?}"
            );
            e.to_string()
        }
    }
}

pub fn settle() {
    let _ = run("udevadm", &["settle"]);
}

pub fn mkdir_tmp() -> PathBuf {
    let d = tempfile::Builder::new()
        .prefix("adopt-mnt")
        .tempdir()
        .unwrap()
        .keep();
    d
}

pub fn lv_identity(vg: &str, lv: &str) -> LvIdentity {
    let out = sh(&format!(
        "lvs --noheadings --separator : -o vg_name,lv_name,vg_uuid,lv_uuid {vg}/{lv} | tr -d ' '"
    ));
    let parts: Vec<&str> = out.trim().split(':').collect();
    api::annotations::parse_import_lv(&format!(
        "{}/{}:{}:{}",
        parts[0], parts[1], parts[2], parts[3]
    ))
    .unwrap()
}

pub async fn import_lv(
    f: &Fixture,
    identity: &LvIdentity,
    policy: LvPolicy,
    bytes: u64,
    uid: &str,
) -> Result<VolumeState, AgentError> {
    f.agent
        .import_volume(
            &format!("{}/{}", identity.vg, identity.lv),
            None,
            bytes,
            ImportSource::Lv {
                identity: identity.clone(),
                policy,
            },
            Some(&token(uid, 1)),
        )
        .await
}
