//! The claim bed: a cluster's storage path in the kernel lab. The real
//! agent (the lab's ZFS pool and thin pool, nvmet and LIO) over mTLS,
//! `pillar-csi controller` (the binary) against the API server the lab
//! runner started on the host, and `pillar-csi node` on a unix socket; the
//! chart's CRDs and the controller's RBAC; one PillarAgent, a zvol and an
//! LV PillarStore, NVMe/TCP and iSCSI PillarProtocols and three
//! PillarStorageClasses, whose StorageClasses the controller generated.
//! The `claim_` lab tests and the demo share it ([`crate::claim_life`]
//! plays the CO's side).
use crate::{
    agent::{AgentConfig, AgentProcess, ClientTls, ServerTls, ZfsParent},
    apiserver::ApiServer,
    csi::{dial, CsiProcess, NodePlugin},
    files_bed::{self, FilesSide},
    nfs::FsParent,
    tls::{Ca, Pem},
    Lab, Result,
};
use api::crd::*;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, Patch, PatchParams};
use pillar_csi_proto::csi::v1::{
    controller_client::ControllerClient, node_client::NodeClient, NodeGetInfoRequest,
};
use std::{ffi::OsString, path::Path, time::Duration};
use tonic::transport::Channel;

/// The agent's NVMe/TCP port in claim tests.
pub const NVME_PORT: u16 = 4431;
/// The agent's iSCSI port in claim tests.
pub const ISCSI_PORT: u16 = 3271;
/// How long the controller may take to generate a StorageClass.
const STORAGE_CLASS_WAIT: Duration = Duration::from_secs(120);

/// One PillarStorageClass of the bed: a store, a protocol, a filesystem.
#[derive(Debug, Clone)]
pub struct Class {
    /// The PillarStorageClass's name.
    pub name: String,
    /// The StorageClass it generates.
    pub storage_class: String,
    /// Its filesystem (`ext4`, `xfs`).
    pub fs_type: &'static str,
}

/// The bed; everything it started is stopped when dropped (the API server
/// belongs to the lab runner and stays).
pub struct ClaimBed {
    /// The lab.
    pub lab: Lab,
    /// The host's API server.
    pub server: ApiServer,
    /// An admin client (the test applies what a cluster operator would).
    pub admin: kube::Client,
    /// The zvols' parent dataset (`<pool>/<parent>`), destroyed last.
    pub parent: ZfsParent,
    /// The agent (mTLS; the controller presents a client certificate).
    pub agent: AgentProcess,
    /// `pillar-csi controller`.
    pub controller: CsiProcess,
    /// Where it serves its metrics (`/metrics`).
    pub controller_metrics: std::net::SocketAddr,
    /// `pillar-csi node`.
    pub plugin: NodePlugin,
    /// The node's CSI ID (from NodeGetInfo).
    pub node_id: String,
    /// What the bed applied.
    pub objects: Objects,
    /// The files identity, when started with [`ClaimBed::start_files`].
    pub files: Option<FilesSide>,
}

fn class(prefix: &str, what: &str, fs_type: &'static str) -> Class {
    let name = format!("{prefix}-{what}");
    Class {
        storage_class: format!("pillar-{name}"),
        name,
        fs_type,
    }
}

impl Objects {
    /// The three classes.
    pub fn classes(&self) -> [&Class; 3] {
        [&self.zvol_nvme, &self.lv_iscsi, &self.zvol_iscsi]
    }
}

/// Server-side apply of `object` (named `name`) as the test's field manager.
async fn apply<K>(client: &kube::Client, name: &str, object: &K) -> Result<()>
where
    K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope>
        + serde::Serialize
        + serde::de::DeserializeOwned
        + Clone
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    Api::<K>::all(client.clone())
        .patch(
            name,
            &PatchParams::apply("pillar-csi-lab").force(),
            &Patch::Apply(object),
        )
        .await?;
    Ok(())
}

/// Where the agent serves from: what the PillarStores name.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The agent's gRPC address.
    pub agent: std::net::SocketAddr,
    /// The zpool.
    pub pool: String,
    /// The zvols' parent dataset below the pool.
    pub parent_dataset: String,
    /// The volume group.
    pub vg: String,
    /// Its thin pool.
    pub thin_pool: String,
}

/// The objects a cluster operator applies, named after a prefix.
#[derive(Debug, Clone)]
pub struct Objects {
    /// The PillarAgent's name.
    pub agent_name: String,
    /// zvol store, NVMe/TCP, ext4.
    pub zvol_nvme: Class,
    /// thin LV store, iSCSI, xfs.
    pub lv_iscsi: Class,
    /// zvol store, iSCSI, ext4.
    pub zvol_iscsi: Class,
}

/// Applies (server-side, as the admin) a PillarAgent for `layout.agent`, a
/// zvol and a thin-LV PillarStore, an NVMe/TCP and an iSCSI PillarProtocol
/// and three PillarStorageClasses, all named after `prefix`.
pub async fn apply_objects(admin: &kube::Client, prefix: &str, layout: &Layout) -> Result<Objects> {
    let agent_name = format!("{prefix}-storage");
    let agent = PillarAgentSpec {
        address: layout.agent.ip().to_string(),
        port: layout.agent.port(),
        tls_server_name: None,
        node_name: None,
    };
    apply(admin, &agent_name, &PillarAgent::new(&agent_name, agent)).await?;
    let zvols = format!("{prefix}-zvols");
    let lvs = format!("{prefix}-lvs");
    let store = |backend| PillarStoreSpec {
        agent_ref: agent_name.clone(),
        backend,
    };
    let zfs = store(StoreBackend {
        zfs: Some(ZfsBackend {
            pool: layout.pool.clone(),
            parent_dataset: Some(layout.parent_dataset.clone()),
        }),
        ..Default::default()
    });
    apply(admin, &zvols, &PillarStore::new(&zvols, zfs)).await?;
    let lvm = store(StoreBackend {
        lvm: Some(LvmBackend {
            volume_group: layout.vg.clone(),
            thin_pool: Some(layout.thin_pool.clone()),
        }),
        ..Default::default()
    });
    apply(admin, &lvs, &PillarStore::new(&lvs, lvm)).await?;
    let nvme = format!("{prefix}-nvme");
    let iscsi = format!("{prefix}-iscsi");
    let protocol = |nvmeof_tcp, iscsi| PillarProtocolSpec {
        protocol: ProtocolConfig {
            nvmeof_tcp,
            iscsi,
            nfs: None,
            local: None,
        },
    };
    let spec = protocol(
        Some(NvmeofTcpProtocol {
            port: NVME_PORT,
            acl: true,
        }),
        None,
    );
    apply(admin, &nvme, &PillarProtocol::new(&nvme, spec)).await?;
    let spec = protocol(
        None,
        Some(IscsiProtocol {
            port: ISCSI_PORT,
            acl: true,
        }),
    );
    apply(admin, &iscsi, &PillarProtocol::new(&iscsi, spec)).await?;

    let objects = Objects {
        agent_name,
        zvol_nvme: class(prefix, "zvol-nvme", "ext4"),
        lv_iscsi: class(prefix, "lv-iscsi", "xfs"),
        zvol_iscsi: class(prefix, "zvol-iscsi", "ext4"),
    };
    for (c, store, protocol) in [
        (&objects.zvol_nvme, &zvols, &nvme),
        (&objects.lv_iscsi, &lvs, &iscsi),
        (&objects.zvol_iscsi, &zvols, &iscsi),
    ] {
        let spec = PillarStorageClassSpec {
            store_ref: store.clone(),
            protocol_ref: protocol.clone(),
            storage_class: StorageClassTemplate {
                name: c.storage_class.clone(),
                reclaim_policy: None,
                volume_binding_mode: None,
                allow_volume_expansion: None,
            },
            filesystem: Some(Filesystem {
                fs_type: if c.fs_type == "xfs" {
                    FsType::Xfs
                } else {
                    FsType::Ext4
                },
            }),
            allowed_claim_zfs_properties: Vec::new(),
            encrypted: false,
            import_keys: false,
        };
        apply(admin, &c.name, &PillarStorageClass::new(&c.name, spec)).await?;
    }
    Ok(objects)
}

/// Starts `pillar-csi controller` as ServiceAccount `pillar-csi-controller`
/// of `server` (its socket and log `<dir>/<prefix>.controller.*`),
/// presenting `client` to agents whose certificates `ca` signed, with a
/// 2 s reconcile interval (StorageClasses appear quickly), serving its
/// metrics on `metrics`, with `extra` flags.
pub async fn start_controller(
    server: &ApiServer,
    dir: &Path,
    prefix: &str,
    ca: &Ca,
    client: &Pem,
    metrics: std::net::SocketAddr,
    extra: Vec<OsString>,
) -> Result<CsiProcess> {
    let mut args: Vec<OsString> = vec![
        "controller".into(),
        "--kubeconfig".into(),
        server.kubeconfig_of("pillar-csi-controller").into(),
        "--agent-tls-cert".into(),
        client.cert.clone().into(),
        "--agent-tls-key".into(),
        client.key.clone().into(),
        "--agent-tls-ca".into(),
        ca.pem.cert.clone().into(),
        "--reconcile-interval".into(),
        "2s".into(),
        format!("--metrics-address={metrics}").into(),
    ];
    args.extend(extra);
    CsiProcess::start(
        &args,
        &dir.join(format!("{prefix}.controller.sock")),
        &dir.join(format!("{prefix}.controller.log")),
        &[("RUST_LOG", "info")],
    )
    .await
}

impl ClaimBed {
    /// Starts the bed; objects are named after `prefix` (`claim`, `demo`).
    pub async fn start(prefix: &str) -> Result<Self> {
        Self::start_with_agent_args(prefix, Vec::new()).await
    }

    /// [`ClaimBed::start`] with more flags for the agent (for example
    /// `--key-encryption-key-file <file>`).
    pub async fn start_with_agent_args(prefix: &str, agent_args: Vec<String>) -> Result<Self> {
        Self::start_with(prefix, agent_args, false).await
    }

    /// [`ClaimBed::start`] with the files identity too ([`FilesSide`]):
    /// the agent also serves ZFS filesystems over NFS, and the controller
    /// and node plugin serve `files.pillar-csi.bhyoo.com` on second sockets.
    pub async fn start_files(prefix: &str) -> Result<Self> {
        Self::start_with(prefix, Vec::new(), true).await
    }

    async fn start_with(prefix: &str, agent_args: Vec<String>, files: bool) -> Result<Self> {
        let _clock = crate::setup_clock::start("ClaimBed::start");
        let lab = Lab::get();
        let server = ApiServer::lab()?;
        server.install_chart_crds().await?;
        let admin = server.client().await?;
        // The binding of the controller's ServiceAccount to the chart's rules.
        server.controller_client().await?;

        let certs = lab.work.join(format!("{prefix}.certs"));
        let ca = Ca::new(&certs, "pillar-lab-ca")?;
        let agent_pem = ca.server("agent", "127.0.0.1".parse()?)?;
        let controller_pem = ca.client("pillar-csi-controller")?;

        let parent = ZfsParent::create(&lab, prefix)?;
        let mut config = AgentConfig::zvols_and_thin_lvs(
            &lab,
            &lab.unique(prefix),
            &parent,
            NVME_PORT,
            ISCSI_PORT,
        )?;
        config.extra_args = agent_args;
        let fs_parent = if files {
            let fs_parent = FsParent::create(&lab, &format!("{prefix}-fs"))?;
            let directories = files_bed::Directories::create(&lab, prefix)?;
            config
                .backends
                .push(format!("zfs-dataset={}", fs_parent.dataset));
            config.backends.push(directories.backend_flag());
            Some((fs_parent, directories))
        } else {
            None
        };
        let (files_controller, files_node) = files_bed::sockets(&lab.work, prefix);
        config.tls = Some((
            ServerTls {
                identity: agent_pem,
                client_ca: ca.pem.cert.clone(),
            },
            ClientTls {
                server_ca: ca.pem.cert.clone(),
                identity: Some(controller_pem.clone()),
            },
        ));
        let agent = AgentProcess::start(config).await?;
        let layout = Layout {
            agent: agent.addr(),
            pool: parent.pool.clone(),
            parent_dataset: parent.name.clone(),
            vg: lab.vg.clone(),
            thin_pool: lab.thin_pool.clone(),
        };
        let objects = apply_objects(&admin, prefix, &layout).await?;
        let controller_metrics = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let controller = start_controller(
            &server,
            &lab.work,
            prefix,
            &ca,
            &controller_pem,
            controller_metrics,
            match files {
                true => files_bed::controller_args(&files_controller),
                false => Vec::new(),
            },
        )
        .await?;
        let plugin = match files {
            true => {
                NodePlugin::start_with_args(
                    &lab,
                    &format!("{prefix}-node"),
                    files_bed::node_args(
                        &files_node,
                        &fs_parent.as_ref().ok_or("no directories")?.1.root,
                    ),
                )
                .await?
            }
            false => NodePlugin::start(&lab, &format!("{prefix}-node")).await?,
        };
        let node_id = plugin
            .node()
            .await?
            .node_get_info(NodeGetInfoRequest {})
            .await?
            .into_inner()
            .node_id;
        let files = match fs_parent {
            Some((parent, directories)) => {
                let classes = files_bed::apply_objects(
                    &admin,
                    prefix,
                    &objects.agent_name,
                    &plugin.node_name,
                    &parent,
                )
                .await?;
                let node_id = NodeClient::new(dial(&files_node).await?)
                    .node_get_info(NodeGetInfoRequest {})
                    .await?
                    .into_inner()
                    .node_id;
                Some(FilesSide {
                    parent,
                    controller_socket: files_controller,
                    node_socket: files_node,
                    node_id,
                    class: classes.datasets,
                    directories,
                    directory_class: classes.directories,
                    local_class: classes.local,
                })
            }
            None => None,
        };
        let bed = Self {
            files,
            lab,
            server,
            admin,
            parent,
            agent,
            controller,
            controller_metrics,
            plugin,
            node_id,
            objects,
        };
        for c in bed.objects.classes() {
            bed.storage_class(c).await?;
        }
        if let Some(files) = &bed.files {
            bed.storage_class(&files.class).await?;
        }
        Ok(bed)
    }

    /// A PillarStorageClass beside [`Objects::zvol_nvme`] (its store,
    /// protocol and filesystem) with `importKeys`: its claims import
    /// encrypted zvols, each naming its key Secret. Returns it once its
    /// StorageClass is generated.
    pub async fn encrypted_imports_class(&self) -> Result<Class> {
        let base = &self.objects.zvol_nvme;
        let imports = Class {
            name: format!("{}-imports", base.name),
            storage_class: format!("{}-imports", base.storage_class),
            fs_type: base.fs_type,
        };
        let mut spec = Api::<PillarStorageClass>::all(self.admin.clone())
            .get(&base.name)
            .await?
            .spec;
        spec.storage_class.name = imports.storage_class.clone();
        spec.import_keys = true;
        apply(
            &self.admin,
            &imports.name,
            &PillarStorageClass::new(&imports.name, spec),
        )
        .await?;
        self.storage_class(&imports).await?;
        Ok(imports)
    }

    /// Waits (bounded) for the StorageClass the controller generates from
    /// `class` and returns it.
    pub async fn storage_class(&self, class: &Class) -> Result<StorageClass> {
        let api = Api::<StorageClass>::all(self.admin.clone());
        let start = std::time::Instant::now();
        loop {
            if let Some(sc) = api.get_opt(&class.storage_class).await? {
                return Ok(sc);
            }
            if start.elapsed() > STORAGE_CLASS_WAIT {
                return Err(format!(
                    "the controller generated no StorageClass {} within {STORAGE_CLASS_WAIT:?}; its log:\n{}",
                    class.storage_class,
                    self.controller.log()
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// A Controller service client (the sidecars' side of the socket).
    pub async fn controller_client(&self) -> Result<ControllerClient<Channel>> {
        Ok(ControllerClient::new(self.controller.channel().await?))
    }

    /// A Node service client (kubelet's side of the socket).
    pub async fn node_client(&self) -> Result<NodeClient<Channel>> {
        Ok(NodeClient::new(dial(&self.plugin.socket).await?))
    }

    /// A fresh folder under the lab's kubelet folder.
    pub fn path(&self, what: &str) -> std::path::PathBuf {
        let dir = self.lab.work.join("kubelet");
        let _ = std::fs::create_dir_all(&dir);
        dir.join(self.lab.unique(what))
    }

    /// The logs of the three processes, for a failing test's message.
    pub fn logs(&self) -> String {
        let tail = |text: String| {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(30)..].join("\n")
        };
        format!(
            "controller:\n{}\nnode:\n{}\nagent:\n{}",
            tail(self.controller.log()),
            tail(self.plugin.log()),
            tail(self.agent.log()),
        )
    }

    /// What runs and what was applied, one line each, for people.
    pub fn describe(&self) -> Vec<String> {
        let mut lines = vec![
            format!(
                "API server: {} (on the host; the controller uses ServiceAccount pillar-csi-controller with the chart's RBAC)",
                self.server.dir().display()
            ),
            format!(
                "agent: pillar-csi agent on {} over mTLS, PillarAgent {}: zvols under {}, thin LVs in {}/{}, NVMe/TCP on 127.0.0.1:{NVME_PORT}, iSCSI on 127.0.0.1:{ISCSI_PORT}",
                self.agent.addr(),
                self.objects.agent_name,
                self.parent.dataset(),
                self.lab.vg,
                self.lab.thin_pool
            ),
            format!(
                "controller: pillar-csi controller on {}",
                self.controller.socket.display()
            ),
            format!(
                "node: pillar-csi node on {}, node ID {}",
                self.plugin.socket.display(),
                self.node_id
            ),
        ];
        for c in self.objects.classes() {
            lines.push(format!(
                "PillarStorageClass {} ({}) -> StorageClass {}",
                c.name, c.fs_type, c.storage_class
            ));
        }
        lines
    }
}
