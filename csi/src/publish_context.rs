//! The publish context: what ControllerPublishVolume returns and
//! NodeStageVolume (and NodePublishVolume) receive, as CSI's string map.
//!
//! | key | value |
//! | --- | --- |
//! | `protocol` | `nvmeof-tcp` or `iscsi` |
//! | `address` | the target's IP address |
//! | `port` | the target's TCP port |
//! | `target` | the subsystem NQN (NVMe/TCP) or the target IQN (iSCSI) |
//! | `lun` | the namespace ID (NVMe/TCP) or the LUN (iSCSI) |
//! | `deviceIdentity` | optional: the identity the export shows, the NVMe namespace UUID or the LUN's T10 unit serial; the node refuses a disk that shows another |
//!
//! iSCSI CHAP credentials (`chapUsername`, `chapPassword`, both or neither)
//! travel in NodeStageVolume's `secrets` (the StorageClass's
//! `csi.storage.k8s.io/node-stage-secret-*` Secret), never in the publish
//! context, which Kubernetes keeps in the VolumeAttachment's status for any
//! reader of it: a publish context carrying them is refused.

use std::collections::HashMap;
use std::net::IpAddr;

/// The key of the protocol token.
pub const PROTOCOL: &str = "protocol";
/// The key of the target's address.
pub const ADDRESS: &str = "address";
/// The key of the target's port.
pub const PORT: &str = "port";
/// The key of the subsystem NQN or target IQN.
pub const TARGET: &str = "target";
/// The key of the namespace ID or LUN.
pub const LUN: &str = "lun";
/// The key of the identity the exported device shows (optional).
pub const DEVICE_IDENTITY: &str = "deviceIdentity";
/// The key of the iSCSI CHAP user name, in NodeStageVolume's secrets.
pub const CHAP_USERNAME: &str = "chapUsername";
/// The key of the iSCSI CHAP password, in NodeStageVolume's secrets.
pub const CHAP_PASSWORD: &str = "chapPassword";

/// How the node reaches the volume: one definition, in the vocabulary crate.
pub use api::tokens::Protocol;

/// iSCSI CHAP credentials. `Debug` hides the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Chap {
    /// The user name.
    pub username: String,
    /// The secret.
    pub password: String,
}

impl std::fmt::Debug for Chap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chap")
            .field("username", &self.username)
            .field("password", &"<hidden>")
            .finish()
    }
}

impl Chap {
    /// The credentials in NodeStageVolume's `secrets`, if any (both keys
    /// or neither).
    pub fn from_secrets(
        secrets: &HashMap<String, String>,
    ) -> Result<Option<Self>, InvalidPublishContext> {
        match (secrets.get(CHAP_USERNAME), secrets.get(CHAP_PASSWORD)) {
            (None, None) => Ok(None),
            (Some(username), Some(password)) => Ok(Some(Chap {
                username: username.clone(),
                password: password.clone(),
            })),
            (Some(_), None) => Err(InvalidPublishContext {
                key: CHAP_PASSWORD,
                reason: "missing from the secrets while chapUsername is set".into(),
            }),
            (None, Some(_)) => Err(InvalidPublishContext {
                key: CHAP_USERNAME,
                reason: "missing from the secrets while chapPassword is set".into(),
            }),
        }
    }
}

/// Where and what to attach.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublishContext {
    /// NVMe/TCP or iSCSI.
    pub protocol: Protocol,
    /// The target's address.
    pub address: IpAddr,
    /// The target's TCP port.
    pub port: u16,
    /// The subsystem NQN or the target IQN.
    pub target: String,
    /// The namespace ID or the LUN.
    pub lun: u32,
    /// The identity the exported device shows initiators (the namespace
    /// UUID, the LUN's unit serial), when the agent told it: the disk the
    /// node finds must show it.
    pub device_identity: Option<String>,
    /// iSCSI CHAP, when the target requires it: from NodeStageVolume's
    /// secrets ([`Chap::from_secrets`]), never from the map.
    pub chap: Option<Chap>,
}

/// A publish context that is missing a key or holds a bad value.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("publish context key {key:?}: {reason}")]
pub struct InvalidPublishContext {
    /// The key at fault.
    pub key: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

fn get<'a>(
    map: &'a HashMap<String, String>,
    key: &'static str,
) -> Result<&'a str, InvalidPublishContext> {
    map.get(key)
        .map(String::as_str)
        .filter(|v| !v.is_empty())
        .ok_or(InvalidPublishContext {
            key,
            reason: "missing".into(),
        })
}

fn parse<T: std::str::FromStr>(
    map: &HashMap<String, String>,
    key: &'static str,
) -> Result<T, InvalidPublishContext>
where
    T::Err: std::fmt::Display,
{
    let value = get(map, key)?;
    value.parse().map_err(|e| InvalidPublishContext {
        key,
        reason: format!("{value:?}: {e}"),
    })
}

impl PublishContext {
    /// Reads the map CSI carries.
    pub fn from_map(map: &HashMap<String, String>) -> Result<Self, InvalidPublishContext> {
        let token = get(map, PROTOCOL)?;
        let protocol = Protocol::parse(token).ok_or_else(|| InvalidPublishContext {
            key: PROTOCOL,
            reason: format!("{token:?} is neither \"nvmeof-tcp\" nor \"iscsi\""),
        })?;
        for key in [CHAP_USERNAME, CHAP_PASSWORD] {
            if map.contains_key(key) {
                return Err(InvalidPublishContext {
                    key,
                    reason: "CHAP credentials are refused in the publish context (Kubernetes keeps it in the VolumeAttachment); they belong in NodeStageVolume's secrets".into(),
                });
            }
        }
        Ok(PublishContext {
            protocol,
            address: parse(map, ADDRESS)?,
            port: parse(map, PORT)?,
            target: get(map, TARGET)?.to_owned(),
            lun: parse(map, LUN)?,
            device_identity: get(map, DEVICE_IDENTITY).ok().map(str::to_owned),
            chap: None,
        })
    }

    /// Writes the map CSI carries (CHAP is never in it).
    pub fn to_map(&self) -> HashMap<String, String> {
        let mut map = HashMap::from([
            (PROTOCOL.to_owned(), self.protocol.as_str().to_owned()),
            (ADDRESS.to_owned(), self.address.to_string()),
            (PORT.to_owned(), self.port.to_string()),
            (TARGET.to_owned(), self.target.clone()),
            (LUN.to_owned(), self.lun.to_string()),
        ]);
        if let Some(identity) = &self.device_identity {
            map.insert(DEVICE_IDENTITY.to_owned(), identity.clone());
        }
        map
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nvme() -> PublishContext {
        PublishContext {
            protocol: Protocol::NvmeofTcp,
            address: "192.0.2.10".parse().expect("ip"),
            port: 4420,
            target: "nqn.2026-01.com.bhyoo.pillar-csi:tank.pvc-1".into(),
            lun: 1,
            device_identity: Some("8d1e6a1c-0c4f-8e2a-9b1d-2f0c3a4b5c6d".into()),
            chap: None,
        }
    }

    #[test]
    fn a_publish_context_round_trips() {
        let c = nvme();
        assert_eq!(PublishContext::from_map(&c.to_map()), Ok(c));
        let mut c = nvme();
        c.protocol = Protocol::Iscsi;
        c.chap = Some(Chap {
            username: "u".into(),
            password: "p".into(),
        });
        assert!(!c.to_map().contains_key(CHAP_PASSWORD), "no secret written");
        c.chap = None;
        assert_eq!(PublishContext::from_map(&c.to_map()), Ok(c.clone()));
        // A controller that does not tell the identity.
        c.device_identity = None;
        assert!(!c.to_map().contains_key(DEVICE_IDENTITY));
        assert_eq!(PublishContext::from_map(&c.to_map()), Ok(c));
    }

    #[test]
    fn chap_comes_from_the_secrets_and_its_secret_never_shows() {
        let secrets = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let chap = Chap::from_secrets(&secrets(&[(CHAP_USERNAME, "u"), (CHAP_PASSWORD, "s3cret")]))
            .expect("both keys")
            .expect("CHAP");
        assert_eq!(chap.username, "u");
        assert!(!format!("{chap:?}").contains("s3cret"), "{chap:?}");
        assert_eq!(Chap::from_secrets(&secrets(&[])), Ok(None));
        let e = Chap::from_secrets(&secrets(&[(CHAP_USERNAME, "u")])).expect_err("half");
        assert_eq!(e.key, CHAP_PASSWORD);
        let mut map = nvme().to_map();
        map.insert(CHAP_PASSWORD.to_owned(), "s3cret".to_owned());
        let e = PublishContext::from_map(&map).expect_err("CHAP in the publish context");
        assert_eq!(e.key, CHAP_PASSWORD);
        assert!(!e.to_string().contains("s3cret"), "{e}");
    }

    #[test]
    fn each_bad_key_is_named() {
        let cases: [(&str, Option<&str>, &str); 6] = [
            (PROTOCOL, Some("fc"), "neither"),
            (ADDRESS, Some("storage-1"), "storage-1"),
            (PORT, Some("70000"), "70000"),
            (LUN, None, "missing"),
            (TARGET, Some(""), "missing"),
            (CHAP_USERNAME, Some("u"), "secrets"),
        ];
        for (key, value, reason) in cases {
            let mut map = nvme().to_map();
            match value {
                Some(v) => map.insert(key.to_owned(), v.to_owned()),
                None => map.remove(key),
            };
            let e = PublishContext::from_map(&map).expect_err(key);
            assert!(e.reason.contains(reason), "{key}: {e}");
        }
    }
}
