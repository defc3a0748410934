//! The agent's configuration: a YAML file and flags, checked whole at start.
use serde::{Deserialize, Serialize};
use std::{
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    time::Duration,
};

/// One storage backend, as in the Helm values' `agent.backends`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum BackendConfig {
    /// zvols under `pool[/parentDataset]`.
    Zfs {
        /// The pool.
        pool: String,
        /// The dataset under the pool that holds the zvols; none for the pool itself.
        #[serde(
            default,
            rename = "parentDataset",
            skip_serializing_if = "Option::is_none"
        )]
        parent_dataset: Option<String>,
    },
    /// ZFS filesystems under `pool[/parentDataset]` (which must mount),
    /// each bounded by its `refquota`: filesystem volumes over NFS.
    ZfsDataset {
        /// The pool.
        pool: String,
        /// The dataset under the pool that holds the filesystems; none for the pool itself.
        #[serde(
            default,
            rename = "parentDataset",
            skip_serializing_if = "Option::is_none"
        )]
        parent_dataset: Option<String>,
    },
    /// Directories under `path` (an absolute path on XFS or ext4 mounted
    /// with `prjquota`), each bounded by a project quota: filesystem
    /// volumes over NFS. `name` is the first component of their volume IDs.
    Directory {
        /// The backend's name.
        name: String,
        /// The directory that holds the volumes.
        path: PathBuf,
    },
    /// LVs in a volume group, thin ones in `thinPool`.
    Lvm {
        /// The volume group.
        #[serde(rename = "volumeGroup")]
        volume_group: String,
        /// The thin pool for thin LVs; none for linear only.
        #[serde(default, rename = "thinPool", skip_serializing_if = "Option::is_none")]
        thin_pool: Option<String>,
    },
}

/// mTLS files.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TlsConfig {
    /// The server certificate (PEM).
    pub cert: Option<PathBuf>,
    /// Its private key (PEM).
    pub key: Option<PathBuf>,
    /// The CA that signs client certificates (PEM); clients must present one.
    pub client_ca: Option<PathBuf>,
}

/// Where an export protocol listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Listener {
    /// The address initiators connect to.
    pub address: IpAddr,
    /// The TCP port.
    pub port: u16,
}

/// The whole configuration. Read a file with [`AgentConfig::from_yaml`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct AgentConfig {
    /// The agent's name, in the names of its export targets (unique per
    /// agent: two storage nodes never show hosts one NQN or IQN); the
    /// chart gives the node's name. `None`: the host name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Storage backends, each a one-key map (`- zfs: {...}`, `- lvm: {...}`).
    #[serde(default, with = "serde_yaml::with::singleton_map_recursive")]
    pub backends: Vec<BackendConfig>,
    /// The gRPC listen address.
    pub listen: SocketAddr,
    /// Where fence marks live.
    pub state_dir: PathBuf,
    /// mTLS; required unless `insecure_plaintext`.
    #[serde(default)]
    pub tls: TlsConfig,
    /// Serve gRPC without TLS (labs only).
    #[serde(default)]
    pub insecure_plaintext: bool,
    /// The NVMe/TCP listener.
    pub nvmeof: Listener,
    /// The iSCSI listener.
    pub iscsi: Listener,
    /// Where NFS clients reach the kernel NFS server (its address and port
    /// are the server's own; this is what volumes are published with).
    pub nfs: Listener,
    /// Seconds between resyncs of exports from the marks (0: never).
    pub resync_interval_seconds: u64,
    /// Public keys (PEM: PUBLIC KEY or CERTIFICATE blocks, RSA or ECDSA)
    /// that may sign metadata-loss recovery grants; none: recovery off.
    /// Needs mTLS: the server TLS key signs the recovery snapshots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_trust_anchor: Option<PathBuf>,
    /// The key-encryption key (a file of 32 random bytes, from a Secret
    /// mounted only into the agent) that seals the keys of encrypted zvols;
    /// none: encryption is refused and encrypted zvols are not unlocked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_encryption_key_file: Option<PathBuf>,
    /// During a rotation of the key-encryption key: the previous one,
    /// which still opens what it sealed; the agent seals every such key
    /// again under the current one at start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_key_encryption_key_file: Option<PathBuf>,
    /// Give every encrypted zvol the agent made a new key of its own at
    /// start (README, "Encryption keys"); needs the key-encryption key.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub change_volume_keys: bool,
    /// The gRPC server's limits.
    pub limits: Limits,
}

/// The gRPC server's limits (see `crate::limits`). A key left out takes
/// its default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Limits {
    /// The largest request message, in bytes; a larger one is refused with
    /// RESOURCE_EXHAUSTED before it is read. Default 4 MiB.
    pub max_message_bytes: usize,
    /// Requests served at once across all connections; one more is refused
    /// with RESOURCE_EXHAUSTED. Default 256.
    pub max_concurrent_requests: usize,
    /// Each RPC's deadline in seconds (a shorter client deadline wins).
    /// Default 300.
    pub request_timeout_seconds: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_message_bytes: 4 << 20,
            max_concurrent_requests: 256,
            request_timeout_seconds: 300,
        }
    }
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            name: None,
            backends: Vec::new(),
            listen: SocketAddr::from(([0, 0, 0, 0], 9500)),
            state_dir: "/var/lib/pillar-csi/agent".into(),
            tls: TlsConfig::default(),
            insecure_plaintext: false,
            nvmeof: Listener {
                address: IpAddr::from([0, 0, 0, 0]),
                port: 4420,
            },
            iscsi: Listener {
                address: IpAddr::from([0, 0, 0, 0]),
                port: 3260,
            },
            nfs: Listener {
                address: IpAddr::from([0, 0, 0, 0]),
                port: 2049,
            },
            resync_interval_seconds: 60,
            recovery_trust_anchor: None,
            key_encryption_key_file: None,
            previous_key_encryption_key_file: None,
            change_volume_keys: false,
            limits: Limits::default(),
        }
    }
}

/// The YAML file as written: every key optional. A key left out takes the
/// default of [`AgentConfig::default`]; so does a listener field left out.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileConfig {
    name: Option<String>,
    #[serde(default, with = "serde_yaml::with::singleton_map_recursive")]
    backends: Option<Vec<BackendConfig>>,
    listen: Option<SocketAddr>,
    state_dir: Option<PathBuf>,
    tls: Option<TlsConfig>,
    insecure_plaintext: Option<bool>,
    nvmeof: Option<FileListener>,
    iscsi: Option<FileListener>,
    nfs: Option<FileListener>,
    resync_interval_seconds: Option<u64>,
    recovery_trust_anchor: Option<PathBuf>,
    key_encryption_key_file: Option<PathBuf>,
    previous_key_encryption_key_file: Option<PathBuf>,
    change_volume_keys: Option<bool>,
    limits: Option<Limits>,
}

/// A listener in the file: either field may be left out.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileListener {
    address: Option<IpAddr>,
    port: Option<u16>,
}

impl FileListener {
    fn over(self, default: Listener) -> Listener {
        Listener {
            address: self.address.unwrap_or(default.address),
            port: self.port.unwrap_or(default.port),
        }
    }
}

impl BackendConfig {
    /// Parses a `--backend` flag: `zfs=<pool>[/<parentDataset>]`,
    /// `zfs-dataset=<pool>[/<parentDataset>]`, `lvm=<vg>[/<thinPool>]` or
    /// `directory=<name>:<absolute path>` (names are checked by
    /// [`AgentConfig::validate`]).
    pub fn from_flag(spec: &str) -> Result<Self, ConfigError> {
        let (kind, name) = spec.split_once('=').ok_or_else(|| {
            ConfigError(vec![format!(
                "--backend {spec:?}: expected zfs=<pool>[/<parentDataset>], zfs-dataset=<pool>[/<parentDataset>], lvm=<vg>[/<thinPool>] or directory=<name>:<absolute path>"
            )])
        })?;
        let (first, rest) = match name.split_once('/') {
            Some((a, b)) => (a.to_owned(), Some(b.to_owned())),
            None => (name.to_owned(), None),
        };
        match kind {
            "zfs" => Ok(BackendConfig::Zfs {
                pool: first,
                parent_dataset: rest,
            }),
            "zfs-dataset" => Ok(BackendConfig::ZfsDataset {
                pool: first,
                parent_dataset: rest,
            }),
            "lvm" => Ok(BackendConfig::Lvm {
                volume_group: first,
                thin_pool: rest,
            }),
            // `directory=<name>:/<path>`: the path is absolute.
            "directory" => match name.split_once(":/") {
                Some((backend, path)) => Ok(BackendConfig::Directory {
                    name: backend.to_owned(),
                    path: PathBuf::from(format!("/{path}")),
                }),
                None => Err(ConfigError(vec![format!(
                    "--backend {spec:?}: expected directory=<name>:<absolute path>"
                )])),
            },
            other => Err(ConfigError(vec![format!(
                "--backend {spec:?}: unknown kind {other:?} (zfs, zfs-dataset, lvm or directory)"
            )])),
        }
    }
}

/// A configuration that cannot run, with everything wrong in it.
#[derive(Debug, thiserror::Error)]
#[error("invalid agent configuration: {}", .0.join("; "))]
pub struct ConfigError(pub Vec<String>);

impl AgentConfig {
    /// Reads a YAML file; unknown keys are refused, keys left out take
    /// their defaults (an empty file is the default configuration).
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        let file: Option<FileConfig> = serde_yaml::from_str(text)
            .map_err(|e| ConfigError(vec![format!("config file: {e}")]))?;
        let file = file.unwrap_or_default();
        let d = Self::default();
        Ok(Self {
            name: file.name.or(d.name),
            backends: file.backends.unwrap_or(d.backends),
            listen: file.listen.unwrap_or(d.listen),
            state_dir: file.state_dir.unwrap_or(d.state_dir),
            tls: file.tls.unwrap_or(d.tls),
            insecure_plaintext: file.insecure_plaintext.unwrap_or(d.insecure_plaintext),
            nvmeof: file.nvmeof.map_or(d.nvmeof, |l| l.over(d.nvmeof)),
            iscsi: file.iscsi.map_or(d.iscsi, |l| l.over(d.iscsi)),
            nfs: file.nfs.map_or(d.nfs, |l| l.over(d.nfs)),
            resync_interval_seconds: file
                .resync_interval_seconds
                .unwrap_or(d.resync_interval_seconds),
            recovery_trust_anchor: file.recovery_trust_anchor,
            key_encryption_key_file: file.key_encryption_key_file,
            previous_key_encryption_key_file: file.previous_key_encryption_key_file,
            change_volume_keys: file.change_volume_keys.unwrap_or(d.change_volume_keys),
            limits: file.limits.unwrap_or(d.limits),
        })
    }

    /// Applies the `--backend` flags: when any is given they replace the
    /// file's backends (flags override the file); none leaves them as they are.
    pub fn override_backends(&mut self, flags: &[String]) -> Result<(), ConfigError> {
        if flags.is_empty() {
            return Ok(());
        }
        self.backends = flags
            .iter()
            .map(|f| BackendConfig::from_flag(f))
            .collect::<Result<_, _>>()?;
        Ok(())
    }

    /// The resync interval, if any.
    pub fn resync_interval(&self) -> Option<Duration> {
        (self.resync_interval_seconds > 0)
            .then(|| Duration::from_secs(self.resync_interval_seconds))
    }

    /// Checks the whole configuration; a half-valid one is refused with every problem named.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        if let Some(Err(e)) = self.name.as_deref().map(crate::export::TargetNames::new) {
            problems.push(e.to_string());
        }
        if self.backends.is_empty() {
            problems
                .push("no backend configured (give at least one zfs or lvm backend)".to_owned());
        }
        let mut names = std::collections::BTreeMap::<String, Vec<&str>>::new();
        for b in &self.backends {
            let (kind, name, sub) = match b {
                BackendConfig::Zfs {
                    pool,
                    parent_dataset,
                } => ("zfs pool", pool, parent_dataset),
                BackendConfig::ZfsDataset {
                    pool,
                    parent_dataset,
                } => ("zfs-dataset pool", pool, parent_dataset),
                BackendConfig::Lvm {
                    volume_group,
                    thin_pool,
                } => ("lvm volume group", volume_group, thin_pool),
                BackendConfig::Directory { name, path } => {
                    if !path.is_absolute() {
                        problems.push(format!(
                            "directory backend {name:?}: path {} is not absolute",
                            path.display()
                        ));
                    }
                    ("directory backend", name, &None)
                }
            };
            if !is_simple_name(name) {
                problems.push(format!("{kind} {name:?} is not a valid name"));
            }
            if let Some(sub) = sub {
                let ok = match b {
                    BackendConfig::Zfs { .. } | BackendConfig::ZfsDataset { .. } => {
                        sub.split('/').all(is_simple_name)
                    }
                    BackendConfig::Lvm { .. } | BackendConfig::Directory { .. } => {
                        is_simple_name(sub)
                    }
                };
                if !ok {
                    problems.push(format!("{kind} {name:?}: {sub:?} is not a valid name"));
                }
            }
            // Volume IDs name their pool or VG first: names are unique,
            // except that one pool may hold zvols and filesystems, a
            // backend of each.
            let alone = |k: &str| k.starts_with("lvm") || k.starts_with("directory");
            let seen: &mut Vec<&str> = names.entry(name.clone()).or_default();
            let clash = seen.iter().any(|k| *k == kind || alone(k) || alone(kind));
            seen.push(kind);
            if clash {
                problems.push(format!("{kind} {name:?} is configured twice"));
            }
        }
        let tls = [&self.tls.cert, &self.tls.key, &self.tls.client_ca];
        let given = tls.iter().filter(|p| p.is_some()).count();
        match (self.insecure_plaintext, given) {
            (true, 0) => {}
            (true, _) => problems.push("both --insecure-plaintext and TLS files are given; choose one".into()),
            (false, 3) => {
                for path in tls.into_iter().flatten() {
                    if let Err(e) = std::fs::metadata(path) {
                        problems.push(format!("TLS file {}: {e}", path.display()));
                    }
                }
            }
            (false, 0) => problems.push(
                "no TLS configured: give a server certificate, key and client CA, or --insecure-plaintext for a lab".into(),
            ),
            (false, _) => problems.push(
                "TLS needs all three of the server certificate, its key and the client CA".into(),
            ),
        }
        for (what, l) in [
            ("nvmeof", self.nvmeof),
            ("iscsi", self.iscsi),
            ("nfs", self.nfs),
        ] {
            if l.port == 0 {
                problems.push(format!("{what} port must not be 0"));
            }
        }
        if self.recovery_trust_anchor.is_some() && self.insecure_plaintext {
            problems.push(
                "--recovery-trust-anchor needs mTLS: the server TLS key signs recovery snapshots and plaintext callers are refused; remove --insecure-plaintext or the trust anchor".into(),
            );
        }
        if self.previous_key_encryption_key_file.is_some() && self.key_encryption_key_file.is_none()
        {
            problems.push(
                "--previous-key-encryption-key-file needs --key-encryption-key-file: the previous key-encryption key only opens, the current one seals".into(),
            );
        }
        if self.change_volume_keys && self.key_encryption_key_file.is_none() {
            problems.push(
                "--change-volume-keys needs --key-encryption-key-file: each new volume key is sealed under it".into(),
            );
        }
        let l = self.limits;
        for (key, value) in [
            ("maxMessageBytes", l.max_message_bytes as u64),
            ("maxConcurrentRequests", l.max_concurrent_requests as u64),
            ("requestTimeoutSeconds", l.request_timeout_seconds),
        ] {
            if value == 0 {
                problems.push(format!("limits.{key} must be greater than 0"));
            }
        }
        if !self.state_dir.is_absolute() {
            problems.push(format!(
                "state directory {} must be an absolute path",
                self.state_dir.display()
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError(problems))
        }
    }
}

/// Letters, digits and `- _ . :`, not starting with `-`, not `.`/`..`.
fn is_simple_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 127
        && !s.starts_with('-')
        && s != "."
        && s != ".."
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
