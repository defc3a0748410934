//! The parts every API-server bed is made of: the mTLS material, an agent
//! service served over it on loopback, and the cluster objects that lead a
//! class to the agent `storage-1` (its PillarAgent, a ZFS or LVM store, the
//! NVMe/TCP protocol with ACLs, a PillarStorageClass).
use super::Result;
use api::crd::*;
use csi::controller::agents::AgentTls;
use kube::api::{Api, PostParams};
use pillar_csi_lab::tls::{Ca, Pem};
use pillar_csi_proto::agent::v1::agent_service_server::{AgentService, AgentServiceServer};
use std::time::Duration;
use tokio::sync::oneshot;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

/// The bed's certificates: a CA, the agent's server certificate for
/// 127.0.0.1 and the controller's client certificate.
pub struct Certs {
    /// The folder holding them (removed with the bed).
    pub dir: tempfile::TempDir,
    /// The CA both sides trust.
    pub ca: Ca,
    /// The agent's server certificate and key.
    pub agent: Pem,
    /// The controller's client certificate and key.
    pub controller: Pem,
}

impl Certs {
    /// A new CA and both certificates, in a temporary folder.
    pub fn new() -> Result<Certs> {
        let dir = tempfile::tempdir()?;
        let ca = Ca::new(dir.path(), "pillar-test-ca")?;
        let agent = ca.server("agent", "127.0.0.1".parse()?)?;
        let controller = ca.client("pillar-csi-controller")?;
        Ok(Certs {
            dir,
            ca,
            agent,
            controller,
        })
    }

    /// The agent's server side: its certificate, clients of the CA only.
    pub fn agent_server_tls(&self) -> Result<ServerTlsConfig> {
        Ok(ServerTlsConfig::new()
            .identity(Identity::from_pem(
                std::fs::read(&self.agent.cert)?,
                std::fs::read(&self.agent.key)?,
            ))
            .client_ca_root(Certificate::from_pem(std::fs::read(&self.ca.pem.cert)?)))
    }

    /// The controller's side of the agent connection.
    pub fn controller_tls(&self) -> AgentTls {
        AgentTls {
            cert: self.controller.cert.clone(),
            key: self.controller.key.clone(),
            ca: self.ca.pem.cert.clone(),
            server_name: None,
        }
    }
}

/// An agent service served over mTLS on 127.0.0.1; it stops (gracefully,
/// so its connections end) on [`AgentServer::stop`] or when dropped.
pub struct AgentServer {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

/// Serves `service` on 127.0.0.1:`port` (0: any free port); returns the
/// port it listens on.
pub async fn serve_agent<S: AgentService>(
    tls: &ServerTlsConfig,
    service: S,
    port: u16,
) -> Result<(u16, AgentServer)> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let port = listener.local_addr()?.port();
    let router = Server::builder()
        .tls_config(tls.clone())?
        .add_service(AgentServiceServer::new(service));
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let shutdown = async {
            let _ = stopped.await;
        };
        if let Err(e) = router
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
        {
            eprintln!("simulated agent stopped: {e}");
        }
    });
    Ok((
        port,
        AgentServer {
            stop: Some(stop),
            task,
        },
    ))
}

impl AgentServer {
    /// Stops the server and waits (20 s at most) until it has.
    pub async fn stop(mut self) -> Result {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(Duration::from_secs(20), &mut self.task)
            .await
            .map_err(|_| "the simulated agent did not stop within 20 s")??;
        Ok(())
    }
}

/// The PillarAgent `storage-1` at 127.0.0.1:`port`.
pub async fn create_agent(client: &kube::Client, port: u16) -> Result {
    let agent = PillarAgent::new(
        "storage-1",
        PillarAgentSpec {
            address: "127.0.0.1".into(),
            port,
            tls_server_name: None,
            node_name: None,
        },
    );
    Api::<PillarAgent>::all(client.clone())
        .create(&PostParams::default(), &agent)
        .await?;
    Ok(())
}

/// The store `storage-1-hot`: zvols of pool `tank` under `k8s`.
pub fn zfs_store() -> PillarStore {
    store(
        "storage-1-hot",
        StoreBackend {
            zfs: Some(ZfsBackend {
                pool: "tank".into(),
                parent_dataset: Some("k8s".into()),
            }),
            lvm: None,
            zfs_dataset: None,
            directory: None,
        },
    )
}

/// The store `storage-1-lvm`: linear LVs of `data-vg`.
pub fn lvm_store() -> PillarStore {
    store(
        "storage-1-lvm",
        StoreBackend {
            zfs: None,
            lvm: Some(LvmBackend {
                volume_group: "data-vg".into(),
                thin_pool: None,
            }),
            zfs_dataset: None,
            directory: None,
        },
    )
}

fn store(name: &str, backend: StoreBackend) -> PillarStore {
    PillarStore::new(
        name,
        PillarStoreSpec {
            agent_ref: "storage-1".into(),
            backend,
        },
    )
}

/// The PillarProtocol `nvmeof-default`: NVMe/TCP on 4420 with ACLs.
pub fn nvmeof_protocol() -> PillarProtocol {
    PillarProtocol::new(
        "nvmeof-default",
        PillarProtocolSpec {
            protocol: ProtocolConfig {
                nvmeof_tcp: Some(NvmeofTcpProtocol {
                    port: 4420,
                    acl: true,
                }),
                iscsi: None,
                nfs: None,
                local: None,
            },
        },
    )
}

/// A PillarStorageClass `name` of `store` over `nvmeof-default`,
/// generating the StorageClass `storage_class`, formatting `fs` (none:
/// the driver's default).
pub fn class(
    name: &str,
    store: &str,
    storage_class: &str,
    fs: Option<FsType>,
) -> PillarStorageClass {
    PillarStorageClass::new(
        name,
        PillarStorageClassSpec {
            store_ref: store.into(),
            protocol_ref: "nvmeof-default".into(),
            storage_class: StorageClassTemplate {
                name: storage_class.into(),
                reclaim_policy: None,
                volume_binding_mode: None,
                allow_volume_expansion: None,
            },
            filesystem: fs.map(|fs_type| Filesystem { fs_type }),
            allowed_claim_zfs_properties: Vec::new(),
            encrypted: false,
            import_keys: false,
        },
    )
}

/// Creates `stores`, the protocol `nvmeof-default` and `classes`.
pub async fn create_objects(
    client: &kube::Client,
    stores: &[PillarStore],
    classes: &[PillarStorageClass],
) -> Result {
    let pp = PostParams::default();
    for store in stores {
        Api::<PillarStore>::all(client.clone())
            .create(&pp, store)
            .await?;
    }
    Api::<PillarProtocol>::all(client.clone())
        .create(&pp, &nvmeof_protocol())
        .await?;
    for class in classes {
        Api::<PillarStorageClass>::all(client.clone())
            .create(&pp, class)
            .await?;
    }
    Ok(())
}
