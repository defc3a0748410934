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

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentConfig {
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
    /// Seconds between resyncs of exports from the marks (0: never).
    pub resync_interval_seconds: u64,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
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
            resync_interval_seconds: 60,
        }
    }
}

/// A configuration that cannot run, with everything wrong in it.
#[derive(Debug, thiserror::Error)]
#[error("invalid agent configuration: {}", .0.join("; "))]
pub struct ConfigError(pub Vec<String>);

impl AgentConfig {
    /// Reads a YAML file; unknown keys are refused.
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        serde_yaml::from_str(text).map_err(|e| ConfigError(vec![format!("config file: {e}")]))
    }

    /// The resync interval, if any.
    pub fn resync_interval(&self) -> Option<Duration> {
        (self.resync_interval_seconds > 0)
            .then(|| Duration::from_secs(self.resync_interval_seconds))
    }

    /// Checks the whole configuration; a half-valid one is refused with every problem named.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        if self.backends.is_empty() {
            problems
                .push("no backend configured (give at least one zfs or lvm backend)".to_owned());
        }
        let mut names = std::collections::BTreeSet::new();
        for b in &self.backends {
            let (kind, name, sub) = match b {
                BackendConfig::Zfs {
                    pool,
                    parent_dataset,
                } => ("zfs pool", pool, parent_dataset),
                BackendConfig::Lvm {
                    volume_group,
                    thin_pool,
                } => ("lvm volume group", volume_group, thin_pool),
            };
            if !is_simple_name(name) {
                problems.push(format!("{kind} {name:?} is not a valid name"));
            }
            if let Some(sub) = sub {
                let ok = match b {
                    BackendConfig::Zfs { .. } => sub.split('/').all(is_simple_name),
                    BackendConfig::Lvm { .. } => is_simple_name(sub),
                };
                if !ok {
                    problems.push(format!("{kind} {name:?}: {sub:?} is not a valid name"));
                }
            }
            if !names.insert(name.clone()) {
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
        for (what, l) in [("nvmeof", self.nvmeof), ("iscsi", self.iscsi)] {
            if l.port == 0 {
                problems.push(format!("{what} port must not be 0"));
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
mod tests {
    use super::*;

    #[test]
    fn yaml_in_the_helm_values_shape() -> Result<(), ConfigError> {
        let c = AgentConfig::from_yaml(
            "backends:\n  - zfs: {pool: tank, parentDataset: k8s}\n  - lvm: {volumeGroup: data-vg, thinPool: thin0}\n\
             listen: 0.0.0.0:9500\nstateDir: /var/lib/pillar-csi/agent\ninsecurePlaintext: true\n\
             nvmeof: {address: 10.0.0.1, port: 4420}\niscsi: {address: 10.0.0.1, port: 3260}\nresyncIntervalSeconds: 30\n",
        )?;
        assert_eq!(
            c.backends,
            vec![
                BackendConfig::Zfs {
                    pool: "tank".into(),
                    parent_dataset: Some("k8s".into())
                },
                BackendConfig::Lvm {
                    volume_group: "data-vg".into(),
                    thin_pool: Some("thin0".into())
                },
            ]
        );
        c.validate()?;
        assert!(AgentConfig::from_yaml("listen: 1.2.3.4:1\nbogus: 1\n").is_err());
        Ok(())
    }

    #[test]
    fn half_valid_configurations_name_every_problem() {
        let mut c = AgentConfig::default();
        c.tls.cert = Some("/nonexistent/cert.pem".into());
        c.backends.push(BackendConfig::Zfs {
            pool: "../x".into(),
            parent_dataset: None,
        });
        c.backends.push(BackendConfig::Lvm {
            volume_group: "../x".into(),
            thin_pool: Some("a/b".into()),
        });
        let e = c.validate().expect_err("invalid").to_string();
        for part in [
            "\"../x\" is not a valid name",
            "configured twice",
            "TLS needs all three",
            "\"a/b\" is not a valid name",
        ] {
            assert!(e.contains(part), "{part}: {e}");
        }
        let mut c = AgentConfig::default();
        c.backends.push(BackendConfig::Zfs {
            pool: "tank".into(),
            parent_dataset: None,
        });
        assert!(c
            .validate()
            .expect_err("no tls")
            .to_string()
            .contains("--insecure-plaintext"));
        c.insecure_plaintext = true;
        assert!(c.validate().is_ok());
    }
}
