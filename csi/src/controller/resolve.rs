//! From a StorageClass's parameters to where a volume lives: PillarStorageClass
//! → PillarStore → PillarAgent, and PillarProtocol.
use super::error::{Error, Result};
use api::crd::{
    PillarAgent, PillarProtocol, PillarStorageClass, PillarStore, ProtocolConfig, StoreBackend,
};
use api::handle::AgentVolumeId;
use api::tokens::{Backend, Protocol};
use kube::api::Api;
use kube::ResourceExt;
use std::collections::HashMap;

/// The StorageClass parameter naming the PillarStorageClass (the generated
/// StorageClass carries it).
pub const CLASS_PARAMETER: &str = "pillarStorageClass";

/// Everything a new volume's placement depends on.
pub struct Placement {
    /// The PillarStorageClass.
    pub class: PillarStorageClass,
    /// Its store.
    pub store: PillarStore,
    /// The store's agent.
    pub agent: PillarAgent,
    /// Its protocol.
    pub protocol: PillarProtocol,
}

async fn get<K>(client: &kube::Client, name: &str, referrer: &str) -> Result<K>
where
    K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    Api::<K>::all(client.clone())
        .get_opt(name)
        .await
        .map_err(Error::kube(format!("read {kind} {name:?}")))?
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{kind} {name:?} (named by {referrer}) does not exist"
            ))
        })
}

/// The store's backend, exactly one of `zfs`, `lvm` and `zfsDataset`.
pub fn backend_of(store_name: &str, backend: &StoreBackend) -> Result<Backend> {
    match (
        &backend.zfs,
        &backend.lvm,
        &backend.zfs_dataset,
        &backend.directory,
    ) {
        (Some(_), None, None, None) => Ok(Backend::ZfsZvol),
        (None, Some(_), None, None) => Ok(Backend::LvmLv),
        (None, None, Some(_), None) => Ok(Backend::ZfsDataset),
        (None, None, None, Some(_)) => Ok(Backend::Directory),
        _ => Err(Error::InvalidArgument(format!(
            "PillarStore {store_name:?} must set exactly one of backend.zfs, backend.lvm, backend.zfsDataset and backend.directory"
        ))),
    }
}

/// The protocol, exactly one of `nvmeofTcp`, `iscsi`, `nfs` and `local`.
pub fn protocol_of(protocol_name: &str, config: &ProtocolConfig) -> Result<Protocol> {
    match (&config.nvmeof_tcp, &config.iscsi, &config.nfs, &config.local) {
        (Some(_), None, None, None) => Ok(Protocol::NvmeofTcp),
        (None, Some(_), None, None) => Ok(Protocol::Iscsi),
        (None, None, Some(_), None) => Ok(Protocol::Nfs),
        (None, None, None, Some(_)) => Ok(Protocol::Local),
        _ => Err(Error::InvalidArgument(format!(
            "PillarProtocol {protocol_name:?} must set exactly one of protocol.nvmeofTcp, protocol.iscsi, protocol.nfs and protocol.local"
        ))),
    }
}

/// Whether exports of this protocol admit only published nodes (NFS and
/// node-local exports always do: they name their clients).
pub fn acl_of(config: &ProtocolConfig) -> bool {
    config
        .nvmeof_tcp
        .as_ref()
        .map(|p| p.acl)
        .or(config.iscsi.as_ref().map(|p| p.acl))
        .unwrap_or(true)
}

/// The agent volume ID a volume named `name` gets in a store: `<pool>/<name>`
/// (the agent places zvols and filesystems under its parentDataset),
/// `<vg>/<name>` or `<directory backend>/<name>`.
pub fn volume_in(store_name: &str, backend: &StoreBackend, name: &str) -> Result<AgentVolumeId> {
    let kind = backend_of(store_name, backend)?;
    let id = format!("{}/{name}", pool_of(backend).unwrap_or_default());
    AgentVolumeId::parse(kind, &id).map_err(|e| Error::InvalidArgument(e.to_string()))
}

/// The pool, volume group or directory backend a store's GetCapacity asks
/// for.
pub fn pool_of(backend: &StoreBackend) -> Option<String> {
    backend
        .zfs
        .as_ref()
        .or(backend.zfs_dataset.as_ref())
        .map(|z| z.pool.clone())
        .or(backend.lvm.as_ref().map(|l| l.volume_group.clone()))
        .or(backend.directory.as_ref().map(|d| d.name.clone()))
}

/// The PillarStorageClass named in `parameters`.
pub fn class_name(parameters: &HashMap<String, String>) -> Result<&str> {
    parameters
        .get(CLASS_PARAMETER)
        .map(String::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "the StorageClass parameter {CLASS_PARAMETER:?} is missing: use a StorageClass generated from a PillarStorageClass"
            ))
        })
}

/// Follows a PillarStorageClass to its store, agent and protocol.
pub async fn placement(client: &kube::Client, class: &str) -> Result<Placement> {
    let class: PillarStorageClass = get(client, class, "the StorageClass").await?;
    let by_class = format!("PillarStorageClass {:?}", class.name_any());
    let store: PillarStore = get(client, &class.spec.store_ref, &by_class).await?;
    let protocol: PillarProtocol = get(client, &class.spec.protocol_ref, &by_class).await?;
    let agent: PillarAgent = get(
        client,
        &store.spec.agent_ref,
        &format!("PillarStore {:?}", store.name_any()),
    )
    .await?;
    backend_of(&store.name_any(), &store.spec.backend)?;
    protocol_of(&protocol.name_any(), &protocol.spec.protocol)?;
    Ok(Placement {
        class,
        store,
        agent,
        protocol,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use api::crd::{LvmBackend, ZfsBackend};

    #[test]
    fn volume_ids_follow_the_store_layout() {
        let zfs = StoreBackend {
            zfs: Some(ZfsBackend {
                pool: "tank".into(),
                parent_dataset: Some("k8s".into()),
            }),
            lvm: None,
            zfs_dataset: None,
            directory: None,
        };
        assert_eq!(
            volume_in("s", &zfs, "pvc-1").unwrap().to_string(),
            "tank/pvc-1"
        );
        let root = StoreBackend {
            zfs: Some(ZfsBackend {
                pool: "tank".into(),
                parent_dataset: None,
            }),
            lvm: None,
            zfs_dataset: None,
            directory: None,
        };
        assert_eq!(
            volume_in("s", &root, "pvc-1").unwrap().to_string(),
            "tank/pvc-1"
        );
        let lvm = StoreBackend {
            zfs: None,
            lvm: Some(LvmBackend {
                volume_group: "data-vg".into(),
                thin_pool: Some("thin0".into()),
            }),
            zfs_dataset: None,
            directory: None,
        };
        let id = volume_in("s", &lvm, "pvc-1").unwrap();
        assert_eq!(
            (id.to_string().as_str(), id.backend()),
            ("data-vg/pvc-1", Backend::LvmLv)
        );
        let both = StoreBackend {
            zfs: zfs.zfs.clone(),
            lvm: lvm.lvm.clone(),
            zfs_dataset: None,
            directory: None,
        };
        let e = volume_in("s", &both, "pvc-1").err().unwrap().to_string();
        assert!(
            e.contains(
                "exactly one of backend.zfs, backend.lvm, backend.zfsDataset and backend.directory"
            ),
            "{e}"
        );
        let files = StoreBackend {
            zfs_dataset: zfs.zfs.clone(),
            ..Default::default()
        };
        let id = volume_in("s", &files, "pvc-1").unwrap();
        assert_eq!(
            (id.to_string().as_str(), id.backend()),
            ("tank/pvc-1", Backend::ZfsDataset)
        );
        assert_eq!(pool_of(&files).as_deref(), Some("tank"));
        let dirs = StoreBackend {
            directory: Some(api::crd::DirectoryBackend {
                name: "dirs".into(),
            }),
            ..Default::default()
        };
        let id = volume_in("s", &dirs, "pvc-1").unwrap();
        assert_eq!(
            (id.to_string().as_str(), id.backend()),
            ("dirs/pvc-1", Backend::Directory)
        );
        assert_eq!(pool_of(&dirs).as_deref(), Some("dirs"));
        let e = volume_in("s", &StoreBackend::default(), "pvc-1")
            .err()
            .unwrap();
        assert!(e.to_string().contains("PillarStore \"s\""), "{e}");
    }

    #[test]
    fn a_missing_class_parameter_is_named() {
        let e = class_name(&HashMap::new()).err().unwrap().to_string();
        assert!(e.contains("pillarStorageClass"), "{e}");
    }
}
