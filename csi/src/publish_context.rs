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
//! | `chapUsername`, `chapPassword` | iSCSI CHAP, both or neither |

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
/// The key of the iSCSI CHAP user name.
pub const CHAP_USERNAME: &str = "chapUsername";
/// The key of the iSCSI CHAP password.
pub const CHAP_PASSWORD: &str = "chapPassword";

/// How the node reaches the volume: one definition, in the vocabulary crate.
pub use api::tokens::Protocol;

/// iSCSI CHAP credentials.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chap {
    /// The user name.
    pub username: String,
    /// The secret.
    pub password: String,
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
    /// iSCSI CHAP, when the target requires it.
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
        let chap = match (map.get(CHAP_USERNAME), map.get(CHAP_PASSWORD)) {
            (None, None) => None,
            (Some(username), Some(password)) => Some(Chap {
                username: username.clone(),
                password: password.clone(),
            }),
            (Some(_), None) => Err(InvalidPublishContext {
                key: CHAP_PASSWORD,
                reason: "missing while chapUsername is set".into(),
            })?,
            (None, Some(_)) => Err(InvalidPublishContext {
                key: CHAP_USERNAME,
                reason: "missing while chapPassword is set".into(),
            })?,
        };
        Ok(PublishContext {
            protocol,
            address: parse(map, ADDRESS)?,
            port: parse(map, PORT)?,
            target: get(map, TARGET)?.to_owned(),
            lun: parse(map, LUN)?,
            chap,
        })
    }

    /// Writes the map CSI carries.
    pub fn to_map(&self) -> HashMap<String, String> {
        let mut map = HashMap::from([
            (PROTOCOL.to_owned(), self.protocol.as_str().to_owned()),
            (ADDRESS.to_owned(), self.address.to_string()),
            (PORT.to_owned(), self.port.to_string()),
            (TARGET.to_owned(), self.target.clone()),
            (LUN.to_owned(), self.lun.to_string()),
        ]);
        if let Some(chap) = &self.chap {
            map.insert(CHAP_USERNAME.to_owned(), chap.username.clone());
            map.insert(CHAP_PASSWORD.to_owned(), chap.password.clone());
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
        assert_eq!(PublishContext::from_map(&c.to_map()), Ok(c));
    }

    #[test]
    fn each_bad_key_is_named() {
        let cases: [(&str, Option<&str>, &str); 6] = [
            (PROTOCOL, Some("fc"), "neither"),
            (ADDRESS, Some("storage-1"), "storage-1"),
            (PORT, Some("70000"), "70000"),
            (LUN, None, "missing"),
            (TARGET, Some(""), "missing"),
            (CHAP_USERNAME, Some("u"), "missing while chapUsername"),
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
