//! Running the agent: build it from the configuration, re-create exports
//! from the marks, resync periodically, and serve gRPC (mTLS or, in a lab,
//! plaintext) until SIGTERM or SIGINT.
use crate::{
    backend::{Backend, BackendKind, DatasetBackend, DirectoryBackend, LvmBackend, ZfsBackend},
    config::{AgentConfig, BackendConfig},
    export::{
        host_name, Exporter, LioExporter, LocalExporter, NfsExporter, NvmetExporter, TargetNames,
    },
    grpc::AgentGrpc,
    imported_keys::ImportedKeys,
    marks::MarkStore,
    sealed_key::{Kek, Keks},
    service::Agent,
};
use pillar_csi_proto::agent::v1::agent_service_server::AgentServiceServer;
use pillar_csi_proto::tls::{ServerTls, TlsFiles};
use std::sync::Arc;
use tonic::transport::Server;
use tracing::{info, warn};

/// The nvmet port ID the agent's NVMe/TCP listener uses.
pub const NVMET_PORT_ID: u16 = 1;

/// A failure to start or run the agent.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The configuration is not usable.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// Building the agent failed.
    #[error("agent start-up: {0}")]
    Startup(String),
    /// The gRPC server failed.
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// Opens every configured backend: ZFS through one shared libzfs handle,
/// LVM through one shared lvm2 worker.
pub fn open_backends(config: &AgentConfig) -> Result<Vec<Arc<dyn Backend>>, ServeError> {
    let keks = key_encryption_keys(config)?;
    let mut zfs = None;
    let mut lvm = None;
    let mut backends: Vec<Arc<dyn Backend>> = Vec::new();
    for b in &config.backends {
        match b {
            BackendConfig::Zfs {
                pool,
                parent_dataset,
            } => {
                let handle = zfs_handle(&mut zfs)?;
                let keys = ImportedKeys::open(&config.state_dir)
                    .map_err(|e| ServeError::Startup(format!("sealed keys: {e}")))?;
                let backend =
                    ZfsBackend::new(handle, pool, parent_dataset.as_deref(), keks.clone())
                        .map_err(|e| ServeError::Startup(e.to_string()))?
                        .with_imported_keys(keys);
                backends.push(Arc::new(backend));
            }
            BackendConfig::ZfsDataset {
                pool,
                parent_dataset,
            } => {
                let backend =
                    DatasetBackend::new(zfs_handle(&mut zfs)?, pool, parent_dataset.as_deref())
                        .map_err(|e| ServeError::Startup(e.to_string()))?;
                backends.push(Arc::new(backend));
            }
            BackendConfig::Directory { name, path } => {
                let backend = DirectoryBackend::new(name, path)
                    .map_err(|e| ServeError::Startup(e.to_string()))?;
                backends.push(Arc::new(backend));
            }
            BackendConfig::Lvm {
                volume_group,
                thin_pool,
            } => {
                let handle = match &lvm {
                    Some(h) => Arc::clone(h),
                    None => {
                        let h = sys::lvm::Lvm::start_shared()
                            .map_err(|e| ServeError::Startup(e.to_string()))?;
                        lvm = Some(Arc::clone(&h));
                        h
                    }
                };
                let backend = LvmBackend::new(handle, volume_group, thin_pool.as_deref())
                    .map_err(|e| ServeError::Startup(e.to_string()))?;
                backends.push(Arc::new(backend));
            }
        }
    }
    Ok(backends)
}

/// The one libzfs handle of the agent's ZFS backends, opened by the first.
fn zfs_handle(opened: &mut Option<Arc<sys::zfs::Zfs>>) -> Result<Arc<sys::zfs::Zfs>, ServeError> {
    if let Some(h) = opened {
        return Ok(Arc::clone(h));
    }
    let started = std::time::Instant::now();
    let h = Arc::new(sys::zfs::Zfs::open().map_err(|e| ServeError::Startup(e.to_string()))?);
    info!(userland = %h.versions().userland, kernel = %h.versions().kernel,
        open_ms = started.elapsed().as_millis() as u64, "ZFS opened");
    *opened = Some(Arc::clone(&h));
    Ok(h)
}

/// The key-encryption keys of `config`, read once; `None` without
/// `keyEncryptionKeyFile`.
fn key_encryption_keys(config: &AgentConfig) -> Result<Option<Arc<Keks>>, ServeError> {
    let load =
        |path: &std::path::Path| Kek::load(path).map_err(|e| ServeError::Startup(e.to_string()));
    let Some(current) = config
        .key_encryption_key_file
        .as_deref()
        .map(load)
        .transpose()?
    else {
        return Ok(None);
    };
    let previous = config
        .previous_key_encryption_key_file
        .as_deref()
        .map(load)
        .transpose()?;
    info!(
        kek = current.id(),
        previous = previous.as_ref().map(Kek::id),
        "key-encryption key loaded"
    );
    Ok(Some(Arc::new(Keks::new(current, previous))))
}

/// During a rotation of the key-encryption key (`config` names the
/// previous one), seals every volume key the previous KEK sealed under the
/// current one, before anything is served; what could not be is logged
/// (the previous KEK still opens it).
pub fn reseal_keys(config: &AgentConfig, backends: &[Arc<dyn Backend>]) {
    if config.previous_key_encryption_key_file.is_none() {
        return;
    }
    for backend in backends {
        let (resealed, failed) = backend.reseal_keys();
        info!(
            pool = backend.pool(),
            resealed, "volume keys sealed under the current key-encryption key"
        );
        for why in failed {
            warn!(
                pool = backend.pool(),
                why, "a volume key could not be sealed again"
            );
        }
    }
}

/// When `config` asks for it (`--change-volume-keys`), gives every
/// encrypted volume the agent made a new key, before anything is served;
/// what could not be changed is logged (it keeps a key that opens it).
pub fn change_volume_keys(config: &AgentConfig, backends: &[Arc<dyn Backend>]) {
    if !config.change_volume_keys {
        return;
    }
    for backend in backends {
        let (changed, failed) = backend.change_volume_keys();
        info!(
            pool = backend.pool(),
            changed, "encrypted volumes given a new key of their own"
        );
        for why in failed {
            warn!(
                pool = backend.pool(),
                why, "the key of a volume could not be changed"
            );
        }
    }
}

/// Builds the agent for `config` over `backends`: its exporters (each
/// kernel target that is present) and its marks.
pub fn build(config: &AgentConfig, backends: Vec<Arc<dyn Backend>>) -> Result<Agent, ServeError> {
    let marks =
        MarkStore::open(&config.state_dir).map_err(|e| ServeError::Startup(e.to_string()))?;
    let name = match &config.name {
        Some(name) => name.clone(),
        None => host_name().map_err(|e| ServeError::Startup(e.to_string()))?,
    };
    let names = TargetNames::new(&name).map_err(|e| ServeError::Startup(e.to_string()))?;
    info!(agent = %name, target_names = %names.agent(), "export targets are named for this agent");
    let mut exporters: Vec<Arc<dyn Exporter>> = Vec::new();
    match nvmet::Nvmet::open() {
        Ok(target) => exporters.push(Arc::new(NvmetExporter::new(
            target,
            config.nvmeof,
            nvmet::PortId(NVMET_PORT_ID),
            names.clone(),
        ))),
        Err(e) => warn!(error = %e, "NVMe/TCP exports unavailable"),
    }
    match lio::Lio::open() {
        Ok(target) => exporters.push(Arc::new(LioExporter::new(target, config.iscsi, names))),
        Err(e) => warn!(error = %e, "iSCSI exports unavailable"),
    }
    // Filesystem volumes only: NFS is offered when a backend holds them.
    if backends.iter().any(|b| b.kind().is_filesystem()) {
        let nfs = NfsExporter::new(config.nfs);
        if let Err(e) = nfs.health() {
            warn!(error = %e, "NFS exports will fail until the kernel NFS server runs");
        }
        exporters.push(Arc::new(nfs));
    }
    // Directories only: a node-local export is a bind mount by the node.
    if backends.iter().any(|b| b.kind() == BackendKind::Directory) {
        exporters.push(Arc::new(LocalExporter));
    }
    let agent = Agent::new(backends, exporters, marks);
    match (
        &config.recovery_trust_anchor,
        &config.tls.cert,
        &config.tls.key,
    ) {
        (None, ..) => Ok(agent),
        (Some(anchor), Some(cert), Some(key)) => {
            let recovery = crate::recovery::Recovery::load(anchor, cert, key)
                .map_err(|e| ServeError::Startup(e.to_string()))?;
            info!(
                trust_anchor = %anchor.display(),
                keys = recovery.anchor.len(),
                identity = %recovery.signer.identity,
                "metadata-loss recovery configured"
            );
            Ok(agent.with_recovery(recovery))
        }
        (Some(_), ..) => Err(ServeError::Startup(
            "--recovery-trust-anchor needs the server TLS certificate and key".into(),
        )),
    }
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term => {},
    }
    info!("shutting down");
}

/// Destroys the volumes kept for snapshots that are all gone; a failure
/// is logged and retried at the next resync.
async fn collect_kept(agent: &Agent) {
    match agent.collect_all().await {
        Ok(failed) if !failed.is_empty() => {
            warn!(failed = ?failed, "some volumes kept for their snapshots could not be collected")
        }
        Ok(_) => {}
        Err(e) => warn!(error = %e, "the collection of volumes kept for their snapshots failed"),
    }
}

/// Serves `agent` as `config` says; returns when a shutdown signal arrives.
pub async fn serve(config: &AgentConfig, agent: Agent, version: &str) -> Result<(), ServeError> {
    config.validate()?;
    let agent = Arc::new(agent);
    let restored = agent
        .reconcile_from_marks()
        .await
        .map_err(|e| ServeError::Startup(e.to_string()))?;
    info!(
        applied = restored.applied,
        failed = restored.failed.len(),
        "exports re-created from fence marks"
    );
    collect_kept(&agent).await;
    if let Some(every) = config.resync_interval() {
        let resync = agent.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.tick().await;
            loop {
                tick.tick().await;
                match resync.reconcile_from_marks().await {
                    Ok(r) if !r.failed.is_empty() => {
                        warn!(failed = ?r.failed, "resync could not repair every export")
                    }
                    Ok(_) => {}
                    Err(e) => warn!(error = %e, "resync failed"),
                }
                collect_kept(&resync).await;
            }
        });
    }
    let limits = config.limits;
    let router = Server::builder()
        .timeout(std::time::Duration::from_secs(
            limits.request_timeout_seconds,
        ))
        .layer(crate::limits::LimitsLayer::new(
            limits.max_concurrent_requests,
        ))
        .add_service(
            AgentServiceServer::new(AgentGrpc::new(agent, version))
                .max_decoding_message_size(limits.max_message_bytes),
        );
    info!(listen = %config.listen, "agent serving");
    if config.insecure_plaintext {
        warn!("serving gRPC in plaintext: for labs only");
        router
            .serve_with_shutdown(config.listen, shutdown_signal())
            .await?;
        return Ok(());
    }
    let missing = || ServeError::Startup("TLS file missing".into());
    let files = TlsFiles {
        cert: config.tls.cert.clone().ok_or_else(missing)?,
        key: config.tls.key.clone().ok_or_else(missing)?,
        ca: config.tls.client_ca.clone().ok_or_else(missing)?,
    };
    // Re-read at every handshake: certificates renewed in place are served
    // without a restart (pillar_csi_proto::tls).
    let tls = ServerTls::server(files).map_err(|e| ServeError::Startup(e.to_string()))?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| ServeError::Startup(format!("listen on {}: {e}", config.listen)))?;
    router
        .serve_with_incoming_shutdown(
            crate::tls::incoming(listener, Arc::new(tls)),
            shutdown_signal(),
        )
        .await?;
    Ok(())
}
