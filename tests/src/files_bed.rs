//! The files side of the claim bed ([`crate::claim_bed::ClaimBed::start_files`]):
//! the `files.pillar-csi.bhyoo.com` identity served by the same controller
//! and node processes on their second sockets, the agent's `zfsDataset`
//! backend under a parent filesystem of the lab's pool, exported by the
//! guest's kernel NFS server; a `zfsDataset` PillarStore, an `nfs`
//! PillarProtocol and one PillarStorageClass whose StorageClass the files
//! identity provisions. The node mounts NFSv3 by default in the lab (see
//! tests/lab/guest: NFSv4 walks from a root this guest cannot export).
use crate::{claim_bed::Class, csi::dial, nfs::FsParent, Result};
use api::crd::*;
use kube::api::{Api, Patch, PatchParams};
use pillar_csi_proto::csi::v1::{controller_client::ControllerClient, node_client::NodeClient};
use std::{ffi::OsString, path::PathBuf};
use tonic::transport::Channel;

/// The node's address in the lab: its NFS client address, what exports admit.
pub const NODE_ADDRESS: &str = crate::nfs::CLIENT;

/// The files identity's part of a bed.
#[derive(Debug)]
pub struct FilesSide {
    /// The parent filesystem of the agent's `zfsDataset` backend.
    pub parent: FsParent,
    /// The controller's files socket.
    pub controller_socket: PathBuf,
    /// The node plugin's files socket.
    pub node_socket: PathBuf,
    /// The files node ID (from NodeGetInfo on the files socket).
    pub node_id: String,
    /// The filesystem PillarStorageClass.
    pub class: Class,
}

/// The sockets of the files identity for a bed named `prefix` in `dir`.
pub fn sockets(dir: &std::path::Path, prefix: &str) -> (PathBuf, PathBuf) {
    (
        dir.join(format!("{prefix}.files-controller.sock")),
        dir.join(format!("{prefix}.files-node.sock")),
    )
}

/// The controller's flags serving the files identity at `socket`.
pub fn controller_args(socket: &std::path::Path) -> Vec<OsString> {
    vec![
        "--files-endpoint".into(),
        format!("unix://{}", socket.display()).into(),
    ]
}

/// The node plugin's flags serving the files identity at `socket`.
pub fn node_args(socket: &std::path::Path) -> Vec<OsString> {
    vec![
        "--files-endpoint".into(),
        format!("unix://{}", socket.display()).into(),
        "--node-address".into(),
        NODE_ADDRESS.into(),
        "--nfs-version".into(),
        "3".into(),
    ]
}

/// Applies (server-side, as the admin) a `zfsDataset` PillarStore under
/// `parent` served by agent `agent`, an `nfs` PillarProtocol and their
/// PillarStorageClass, all named after `prefix`.
pub async fn apply_objects(
    admin: &kube::Client,
    prefix: &str,
    agent: &str,
    parent: &FsParent,
) -> Result<Class> {
    let params = PatchParams::apply("pillar-csi-lab").force();
    let (pool, below) = parent
        .dataset
        .split_once('/')
        .ok_or("the parent filesystem is a pool")?;
    let store = format!("{prefix}-datasets");
    let spec = PillarStoreSpec {
        agent_ref: agent.to_owned(),
        backend: StoreBackend {
            zfs_dataset: Some(ZfsBackend {
                pool: pool.to_owned(),
                parent_dataset: Some(below.to_owned()),
            }),
            ..Default::default()
        },
    };
    Api::<PillarStore>::all(admin.clone())
        .patch(
            &store,
            &params,
            &Patch::Apply(PillarStore::new(&store, spec)),
        )
        .await?;
    let protocol = format!("{prefix}-nfs");
    let spec = PillarProtocolSpec {
        protocol: ProtocolConfig {
            nfs: Some(NfsProtocol {}),
            ..Default::default()
        },
    };
    Api::<PillarProtocol>::all(admin.clone())
        .patch(
            &protocol,
            &params,
            &Patch::Apply(PillarProtocol::new(&protocol, spec)),
        )
        .await?;
    let class = Class {
        name: format!("{prefix}-files"),
        storage_class: format!("pillar-{prefix}-files"),
        fs_type: "nfs",
    };
    let spec = PillarStorageClassSpec {
        store_ref: store,
        protocol_ref: protocol,
        storage_class: StorageClassTemplate {
            name: class.storage_class.clone(),
            reclaim_policy: None,
            volume_binding_mode: None,
            allow_volume_expansion: None,
        },
        filesystem: None,
        allowed_claim_zfs_properties: Vec::new(),
        encrypted: false,
        import_keys: false,
    };
    Api::<PillarStorageClass>::all(admin.clone())
        .patch(
            &class.name,
            &params,
            &Patch::Apply(PillarStorageClass::new(&class.name, spec)),
        )
        .await?;
    Ok(class)
}

impl FilesSide {
    /// A Controller service client on the files socket.
    pub async fn controller_client(&self) -> Result<ControllerClient<Channel>> {
        Ok(ControllerClient::new(dial(&self.controller_socket).await?))
    }

    /// A Node service client on the files socket.
    pub async fn node_client(&self) -> Result<NodeClient<Channel>> {
        Ok(NodeClient::new(dial(&self.node_socket).await?))
    }
}
