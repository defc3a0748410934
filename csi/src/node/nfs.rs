//! Filesystem volumes over NFS (the files identity) on the node.
//!
//! NodeStageVolume mounts the export at the staging path with mount(2) and
//! the option string the kernel's NFS client parses itself (`vers=`,
//! `addr=`, `port=`, `clientaddr=`; for NFSv3 the kernel makes the MOUNT
//! call too), so no `mount.nfs` runs. NodeUnstageVolume unmounts it and
//! never detaches it lazily: a detached NFS mount keeps writing its dirty
//! pages back after Unstage answered, and ControllerUnpublishVolume then
//! revokes this node's access under them. NodePublishVolume binds the
//! staging mount into pods as for a block volume's filesystem.
//!
//! The NFS version is the capability's mount flags' `vers=` (or `nfsvers=`,
//! the StorageClass's `mountOptions`), else the node plugin's
//! `--nfs-version` ([`DEFAULT_VERSION`] unless set); the server's address
//! and port are the publish context's and a flag naming them is refused.
use super::error::{Error, Result};
use super::mounts::{mount_at, mount_filesystem, split_options, MountEntry, Options};
use super::record::StagingRecord;
use super::stage::{Access, StageRequest};
use super::Node;
use crate::publish_context::{Protocol, PublishContext};
use std::net::IpAddr;
use std::path::Path;

/// The NFS version mounted when neither the mount flags nor the node
/// plugin's configuration name one.
pub const DEFAULT_VERSION: &str = "4.2";

/// Checks an NFS version the node plugin is configured with.
pub fn check_version(version: &str) -> Result<()> {
    fs_type_of(version).map(drop)
}

fn fs_type_of(version: &str) -> Result<&'static str> {
    VERSIONS
        .iter()
        .find(|(v, _)| *v == version)
        .map(|(_, t)| *t)
        .ok_or_else(|| {
            Error::invalid(format!(
                "NFS version {version:?} is not supported (3, 4, 4.0, 4.1 or 4.2)"
            ))
        })
}

/// The versions the node mounts, and the filesystem type of each.
const VERSIONS: [(&str, &str); 5] = [
    ("3", "nfs"),
    ("4", "nfs4"),
    ("4.0", "nfs4"),
    ("4.1", "nfs4"),
    ("4.2", "nfs4"),
];

/// Options the driver sets from the publish context and the node's
/// address; a mount flag naming one is refused rather than obeyed.
const OWNED: [&str; 4] = ["addr", "port", "clientaddr", "mountaddr"];

/// What mount(2) is given for one export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NfsMount {
    /// `<server>:<export path>` (an IPv6 server in brackets), as the
    /// mount table shows it.
    pub source: String,
    /// `nfs` (version 3) or `nfs4`.
    pub fs_type: &'static str,
    /// The flags and the option string.
    pub options: Options,
}

/// The mount source of the export `path` on `server`.
pub fn source_of(server: IpAddr, path: &str) -> String {
    match server {
        IpAddr::V4(a) => format!("{a}:{path}"),
        IpAddr::V6(a) => format!("[{a}]:{path}"),
    }
}

/// The node's side of its NFS mounts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NfsClient {
    /// The node's own address, given to NFSv4 as `clientaddr`.
    pub address: Option<IpAddr>,
    /// The version mounted when the mount flags name none.
    pub version: String,
}

impl Default for NfsClient {
    fn default() -> Self {
        Self {
            address: None,
            version: DEFAULT_VERSION.to_owned(),
        }
    }
}

/// The mount of the export in `ctx` with the CSI mount `flags` from the
/// node `client`.
pub fn nfs_mount(ctx: &PublishContext, flags: &[String], client: &NfsClient) -> Result<NfsMount> {
    let given = split_options(flags)?;
    let mut version = None;
    let mut data = Vec::new();
    for option in given.data.split(',').filter(|o| !o.is_empty()) {
        let key = option.split_once('=').map_or(option, |(k, _)| k);
        match key {
            "vers" | "nfsvers" => version = option.split_once('=').map(|(_, v)| v.to_owned()),
            k if OWNED.contains(&k) => {
                return Err(Error::invalid(format!(
                    "mount option {option:?} is not allowed: the driver sets {k} from the volume's export and the node's address"
                )))
            }
            _ => data.push(option.to_owned()),
        }
    }
    let version = version.unwrap_or_else(|| client.version.clone());
    let fs_type = fs_type_of(&version)?;
    let has_proto = data.iter().any(|o| o.starts_with("proto="));
    let mut options = Options {
        flags: given.flags,
        data: data.join(","),
    }
    .with_data(&format!("vers={version}"))
    .with_data(&format!("addr={}", ctx.address))
    .with_data(&format!("port={}", ctx.port));
    if !has_proto {
        let proto = if ctx.address.is_ipv6() { "tcp6" } else { "tcp" };
        options = options.with_data(&format!("proto={proto}"));
    }
    if let (Some(client), "nfs4") = (client.address, fs_type) {
        options = options.with_data(&format!("clientaddr={client}"));
    }
    Ok(NfsMount {
        source: source_of(ctx.address, &ctx.target),
        fs_type,
        options,
    })
}

/// Whether a staging record is an NFS volume's.
pub fn is_nfs(r: &StagingRecord) -> bool {
    r.protocol == Protocol::Nfs.as_str()
}

/// The staging mount of the NFS volume of `r`, or why `path` does not hold
/// its export.
pub(super) fn export_at(
    r: &StagingRecord,
    path: &Path,
) -> Result<std::result::Result<MountEntry, String>> {
    let source = r
        .address
        .parse()
        .map(|a| source_of(a, &r.target))
        .map_err(|_| {
            Error::internal(format!(
                "staging record of {}: address {:?}",
                r.volume_id, r.address
            ))
        })?;
    let fs_type = r.fs_type.as_deref().unwrap_or("nfs4");
    Ok(match mount_at(path)? {
        Some(m) if m.source == source && m.fs_type == fs_type => Ok(m),
        Some(m) => Err(format!(
            "{} has {} ({}) mounted, not the export {source} of volume {}",
            path.display(),
            m.source,
            m.fs_type,
            r.volume_id
        )),
        None => Err(format!(
            "nothing is mounted at {}, where the export {source} of volume {} should be",
            path.display(),
            r.volume_id
        )),
    })
}

impl Node {
    /// NodeStageVolume of an NFS volume: the export mounted at the staging
    /// path, recorded before the mount (a restart finds what it mounted).
    pub(super) fn stage_nfs(&self, req: &StageRequest) -> Result<()> {
        let Access::Mount { flags, .. } = &req.access else {
            return Err(Error::invalid(format!(
                "volume {} is a filesystem volume over NFS: it cannot be staged as a block device",
                req.volume_id
            )));
        };
        let mount = nfs_mount(&req.context, flags, &self.config.nfs)?;
        let want = StagingRecord {
            fs_type: Some(mount.fs_type.to_owned()),
            ..req.record()
        };
        self.stage_share(req, want, || {
            super::timed("mount", || {
                mount_filesystem(
                    Path::new(&mount.source),
                    &req.staging_path,
                    mount.fs_type,
                    &mount.options,
                )
            })
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn context(address: &str) -> PublishContext {
        PublishContext {
            protocol: Protocol::Nfs,
            address: address.parse().unwrap(),
            port: 2049,
            target: "/tank/k8s/pvc-1".into(),
            lun: 0,
            device_identity: None,
            chap: None,
        }
    }

    fn flags(f: &[&str]) -> Vec<String> {
        f.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn nfs_4_2_is_the_default_and_the_driver_sets_where_to_mount_from() {
        let client = NfsClient {
            address: "192.0.2.9".parse().ok(),
            ..Default::default()
        };
        let at = context("192.0.2.1");
        let m = nfs_mount(&at, &[], &client).unwrap();
        assert_eq!(m.source, "192.0.2.1:/tank/k8s/pvc-1");
        assert_eq!(m.fs_type, "nfs4");
        assert_eq!(
            m.options.data,
            "vers=4.2,addr=192.0.2.1,port=2049,proto=tcp,clientaddr=192.0.2.9"
        );
        let v3 = nfs_mount(&at, &flags(&["nfsvers=3", "nolock", "ro"]), &client).unwrap();
        assert_eq!(v3.fs_type, "nfs");
        assert_eq!(
            v3.options.data,
            "nolock,vers=3,addr=192.0.2.1,port=2049,proto=tcp"
        );
        assert!(v3.options.flags.contains(rustix::mount::MountFlags::RDONLY));
        let v6 = nfs_mount(
            &context("2001:db8::1"),
            &flags(&["vers=4.1,proto=rdma"]),
            &NfsClient::default(),
        )
        .unwrap();
        assert_eq!(v6.source, "[2001:db8::1]:/tank/k8s/pvc-1");
        assert_eq!(
            v6.options.data,
            "proto=rdma,vers=4.1,addr=2001:db8::1,port=2049"
        );
        let node_v3 = NfsClient {
            version: "3".into(),
            ..client
        };
        let m = nfs_mount(&at, &[], &node_v3).unwrap();
        assert_eq!(
            (m.fs_type, m.options.data.as_str()),
            ("nfs", "vers=3,addr=192.0.2.1,port=2049,proto=tcp")
        );
        let m = nfs_mount(&at, &flags(&["vers=4.2"]), &node_v3).unwrap();
        assert_eq!(m.fs_type, "nfs4", "the mount flags win over the node's");
    }

    #[test]
    fn unknown_versions_and_the_drivers_own_options_are_refused_by_name() {
        let (node, at) = (NfsClient::default(), context("192.0.2.1"));
        let e = nfs_mount(&at, &flags(&["vers=2"]), &node).unwrap_err();
        assert!(e.message.contains("NFS version \"2\""), "{e:?}");
        assert!(check_version("4.2").is_ok() && check_version("5").is_err());
        let e = nfs_mount(&at, &flags(&["addr=10.0.0.1"]), &node).unwrap_err();
        assert!(
            e.message.contains("\"addr=10.0.0.1\" is not allowed"),
            "{e:?}"
        );
        let e = nfs_mount(&at, &flags(&["bind"]), &node).unwrap_err();
        assert!(e.message.contains("not allowed"), "{e:?}");
    }
}
