//! The files side of the claim bed ([`crate::claim_bed::ClaimBed::start_files`]):
//! the `files.pillar-csi.bhyoo.com` identity served by the same controller
//! and node processes on their second sockets, the agent's `zfsDataset`
//! backend under a parent filesystem of the lab's pool and its `directory`
//! backend `dirs` on an XFS mounted with `prjquota`, exported by the
//! guest's kernel NFS server; a PillarStore of each, an `nfs`
//! PillarProtocol and a PillarStorageClass of each store, whose
//! StorageClasses the files identity provisions; and, the agent and the
//! node plugin sharing the guest, a `local` PillarProtocol and a class of
//! node-local directories (the PillarAgent names the node plugin's node). The node mounts NFSv3 by default in the lab (see
//! tests/lab/guest: NFSv4 walks from a root this guest cannot export).
use crate::{
    claim_bed::Class,
    csi::{csi_pb, dial},
    nfs::FsParent,
    project_fs::ProjectFs,
    Result,
};
use api::crd::*;
use kube::api::{Api, Patch, PatchParams};
use pillar_csi_proto::csi::v1::{controller_client::ControllerClient, node_client::NodeClient};
use std::{ffi::OsString, path::PathBuf};
use tonic::transport::Channel;

/// The node's address in the lab: its NFS client address, what exports admit.
pub const NODE_ADDRESS: &str = crate::nfs::CLIENT;
/// The name of the agent's directory backend.
pub const DIRECTORY_BACKEND: &str = "dirs";

/// The agent's directory backend: an XFS mounted with `prjquota` and the
/// folder of its volumes.
#[derive(Debug)]
pub struct Directories {
    /// The filesystem.
    pub fs: ProjectFs,
    /// The backend's path: the volumes are its children.
    pub root: PathBuf,
}

impl Directories {
    /// Makes the filesystem and the folder for a bed named `prefix`.
    pub fn create(lab: &crate::Lab, prefix: &str) -> Result<Self> {
        let fs = ProjectFs::xfs(lab, &format!("{prefix}-dirs"), "prjquota")?;
        let root = fs.at.join("volumes");
        std::fs::create_dir(&root)?;
        Ok(Self { fs, root })
    }

    /// The agent's `--backend` flag.
    pub fn backend_flag(&self) -> String {
        format!("directory={DIRECTORY_BACKEND}:{}", self.root.display())
    }

    /// How many volumes the backend holds.
    pub fn children_count(&self) -> Result<usize> {
        Ok(std::fs::read_dir(&self.root)?.count())
    }
}

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
    /// The agent's directory backend.
    pub directories: Directories,
    /// The directory PillarStorageClass.
    pub directory_class: Class,
    /// The node-local directory PillarStorageClass.
    pub local_class: Class,
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

/// The node plugin's flags serving the files identity at `socket`,
/// bind-mounting node-local volumes from under `local_root`.
pub fn node_args(socket: &std::path::Path, local_root: &std::path::Path) -> Vec<OsString> {
    vec![
        "--local-root".into(),
        local_root.into(),
        "--files-endpoint".into(),
        format!("unix://{}", socket.display()).into(),
        "--node-address".into(),
        NODE_ADDRESS.into(),
        "--nfs-version".into(),
        "3".into(),
    ]
}

/// The classes [`apply_objects`] makes: filesystems, directories and
/// node-local directories.
pub struct Classes {
    /// ZFS filesystems over NFS.
    pub datasets: Class,
    /// Directories over NFS.
    pub directories: Class,
    /// Directories, node-local.
    pub local: Class,
}

/// Applies (server-side, as the admin) a `zfsDataset` PillarStore under
/// `parent` and a `directory` PillarStore of [`DIRECTORY_BACKEND`], both
/// served by agent `agent` (its `nodeName` set to `node`), an `nfs` and a
/// `local` PillarProtocol, a PillarStorageClass of each store over NFS
/// and one of the directories node-local, all named after `prefix`.
pub async fn apply_objects(
    admin: &kube::Client,
    prefix: &str,
    agent: &str,
    node: &str,
    parent: &FsParent,
) -> Result<Classes> {
    let params = PatchParams::apply("pillar-csi-lab").force();
    Api::<PillarAgent>::all(admin.clone())
        .patch(
            agent,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"nodeName": node}})),
        )
        .await?;
    let (pool, below) = parent
        .dataset
        .split_once('/')
        .ok_or("the parent filesystem is a pool")?;
    let datasets = StoreBackend {
        zfs_dataset: Some(ZfsBackend {
            pool: pool.to_owned(),
            parent_dataset: Some(below.to_owned()),
        }),
        ..Default::default()
    };
    let directories = StoreBackend {
        directory: Some(DirectoryBackend {
            name: DIRECTORY_BACKEND.to_owned(),
        }),
        ..Default::default()
    };
    for (store, backend) in [
        (format!("{prefix}-datasets"), datasets),
        (format!("{prefix}-dirs"), directories),
    ] {
        let spec = PillarStoreSpec {
            agent_ref: agent.to_owned(),
            backend,
        };
        Api::<PillarStore>::all(admin.clone())
            .patch(
                &store,
                &params,
                &Patch::Apply(PillarStore::new(&store, spec)),
            )
            .await?;
    }
    let protocol = format!("{prefix}-nfs");
    let local = format!("{prefix}-local");
    for (name, config) in [
        (
            &protocol,
            ProtocolConfig {
                nfs: Some(NfsProtocol {}),
                ..Default::default()
            },
        ),
        (
            &local,
            ProtocolConfig {
                local: Some(LocalProtocol {}),
                ..Default::default()
            },
        ),
    ] {
        let spec = PillarProtocolSpec { protocol: config };
        Api::<PillarProtocol>::all(admin.clone())
            .patch(
                name,
                &params,
                &Patch::Apply(PillarProtocol::new(name, spec)),
            )
            .await?;
    }
    Ok(Classes {
        datasets: apply_class(
            admin,
            prefix,
            "files",
            &format!("{prefix}-datasets"),
            &protocol,
            Some(ReclaimPolicy::Retain),
        )
        .await?,
        directories: apply_class(
            admin,
            prefix,
            "dirs",
            &format!("{prefix}-dirs"),
            &protocol,
            None,
        )
        .await?,
        local: apply_class(
            admin,
            prefix,
            "local",
            &format!("{prefix}-dirs"),
            &local,
            None,
        )
        .await?,
    })
}

/// Applies the PillarStorageClass `<prefix>-<what>` of `store` over
/// `protocol`, generating the StorageClass `pillar-<prefix>-<what>` with
/// `reclaim_policy` (`Delete` when `None`).
async fn apply_class(
    admin: &kube::Client,
    prefix: &str,
    what: &str,
    store: &str,
    protocol: &str,
    reclaim_policy: Option<ReclaimPolicy>,
) -> Result<Class> {
    let params = PatchParams::apply("pillar-csi-lab").force();
    let class = Class {
        name: format!("{prefix}-{what}"),
        storage_class: format!("pillar-{prefix}-{what}"),
        fs_type: "nfs",
    };
    let spec = PillarStorageClassSpec {
        store_ref: store.to_owned(),
        protocol_ref: protocol.to_owned(),
        storage_class: StorageClassTemplate {
            name: class.storage_class.clone(),
            reclaim_policy,
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

/// The volume a PV's CSI source names, as CreateVolume answered it (its
/// handle and volume context).
pub fn volume_of(csi: &k8s_openapi::api::core::v1::CSIPersistentVolumeSource) -> csi_pb::Volume {
    csi_pb::Volume {
        volume_id: csi.volume_handle.clone(),
        volume_context: csi
            .volume_attributes
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect(),
        ..Default::default()
    }
}

/// `cap` for many nodes writing (ReadWriteMany).
pub fn rwx(mut cap: csi_pb::VolumeCapability) -> csi_pb::VolumeCapability {
    use csi_pb::volume_capability::{access_mode::Mode, AccessMode};
    cap.access_mode = Some(AccessMode {
        mode: Mode::MultiNodeMultiWriter as i32,
    });
    cap
}

/// Creates the 32 MiB ReadWriteMany claim `name` of StorageClass `class`
/// with `annotations` in namespace `default`, as a user would (through
/// `admin`); returns its PV's name (`pvc-<UID>`).
pub async fn claim(
    admin: &kube::Client,
    name: &str,
    class: &str,
    annotations: &[(&str, &str)],
) -> Result<String> {
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    let annotations: std::collections::BTreeMap<&str, &str> = annotations.iter().copied().collect();
    let pvc: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": crate::claim_life::NAMESPACE,
            "annotations": annotations},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": class,
            "resources": {"requests": {"storage": (32u64 << 20).to_string()}},
        },
    }))?;
    let pvc = Api::<PersistentVolumeClaim>::namespaced(admin.clone(), crate::claim_life::NAMESPACE)
        .create(&kube::api::PostParams::default(), &pvc)
        .await?;
    Ok(format!("pvc-{}", pvc.metadata.uid.ok_or("no UID")?))
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

    /// Publishes `volume` to the bed's node for many writers and stages it
    /// at `staging`, as the attacher and kubelet do; the publish context.
    pub async fn publish_and_stage(
        &self,
        volume: &csi_pb::Volume,
        staging: &std::path::Path,
    ) -> Result<std::collections::HashMap<String, String>> {
        use crate::claim_requests::{capability, publish_volume, stage_volume};
        let cap = rwx(capability(""));
        let mut publish = publish_volume(volume, &self.node_id, "");
        publish.volume_capability = Some(cap.clone());
        let context = self
            .controller_client()
            .await?
            .controller_publish_volume(publish)
            .await?
            .into_inner()
            .publish_context;
        let mut stage = stage_volume(volume, &context, staging, "");
        stage.volume_capability = Some(cap);
        self.node_client().await?.node_stage_volume(stage).await?;
        Ok(context)
    }

    /// Unstages volume `volume_id` from `staging` and unpublishes it from
    /// the bed's node, as kubelet and the attacher do.
    pub async fn unstage_and_unpublish(
        &self,
        volume_id: &str,
        staging: &std::path::Path,
    ) -> Result<()> {
        self.node_client()
            .await?
            .node_unstage_volume(csi_pb::NodeUnstageVolumeRequest {
                volume_id: volume_id.to_owned(),
                staging_target_path: staging.display().to_string(),
            })
            .await?;
        self.controller_client()
            .await?
            .controller_unpublish_volume(csi_pb::ControllerUnpublishVolumeRequest {
                volume_id: volume_id.to_owned(),
                node_id: self.node_id.clone(),
                ..Default::default()
            })
            .await?;
        Ok(())
    }
}
