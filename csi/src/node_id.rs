//! The CSI node ID: `<node name>/<host NQN>/<initiator IQN>`.
//!
//! The controller must open an ACL for the node that a volume is published
//! to: its NVMe host NQN (NVMe/TCP) or its iSCSI initiator IQN. The node ID is
//! the one value the CSI contract hands from NodeGetInfo to
//! ControllerPublishVolume (kubelet stores it in the CSINode object; the
//! external-attacher passes it on), so the names travel inside it:
//!
//! - no Kubernetes API access is needed on the node, and no race between the
//!   plugin's start and an annotation write;
//! - topology segments cannot carry them (label values allow no `:`);
//! - none of the three parts can contain `/`: a node name is a DNS subdomain,
//!   and NQNs and IQNs become configfs directory names on the target.
//!
//! CSI bounds the node ID to 256 bytes; [`NodeId::new`] refuses longer ones.
//!
//! The filesystem identity (`files.pillar-csi.bhyoo.com`) has its own node
//! ID, `<node name>/<address>` ([`FilesNodeId`]): an NFS export admits its
//! clients by address, so the address the node mounts from travels in it.

use std::fmt;

/// The most bytes CSI allows in a node ID.
pub const MAX_LEN: usize = 256;

/// A worker node's name and initiator identities.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeId {
    name: String,
    host_nqn: String,
    initiator_iqn: String,
}

/// A node ID that cannot be built or parsed; the message names the part.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid node ID {value:?}: {reason}")]
pub struct InvalidNodeId {
    /// The offending value (a part, or the whole ID).
    pub value: String,
    /// What is wrong with it.
    pub reason: String,
}

fn invalid(value: &str, reason: impl Into<String>) -> InvalidNodeId {
    InvalidNodeId {
        value: value.to_owned(),
        reason: reason.into(),
    }
}

fn check_part(what: &str, value: &str, prefix: &str) -> Result<(), InvalidNodeId> {
    if value.is_empty() {
        return Err(invalid(value, format!("the {what} is empty")));
    }
    if value.contains('/') || value.chars().any(char::is_whitespace) {
        return Err(invalid(
            value,
            format!("the {what} contains '/' or whitespace"),
        ));
    }
    if !value.starts_with(prefix) {
        return Err(invalid(
            value,
            format!("the {what} does not start with {prefix:?}"),
        ));
    }
    Ok(())
}

impl NodeId {
    /// Builds a node ID, checking each part and the total length.
    pub fn new(name: &str, host_nqn: &str, initiator_iqn: &str) -> Result<Self, InvalidNodeId> {
        check_part("node name", name, "")?;
        check_part("host NQN", host_nqn, "nqn.")?;
        check_part("initiator IQN", initiator_iqn, "iqn.")?;
        let id = NodeId {
            name: name.to_owned(),
            host_nqn: host_nqn.to_owned(),
            initiator_iqn: initiator_iqn.to_owned(),
        };
        let len = id.to_string().len();
        if len > MAX_LEN {
            return Err(invalid(
                &id.to_string(),
                format!("{len} bytes, CSI allows at most {MAX_LEN}"),
            ));
        }
        Ok(id)
    }

    /// Parses what [`NodeId`]'s `Display` wrote.
    pub fn parse(value: &str) -> Result<Self, InvalidNodeId> {
        let mut parts = value.split('/');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(name), Some(nqn), Some(iqn), None) => NodeId::new(name, nqn, iqn),
            _ => Err(invalid(
                value,
                "expected <node name>/<host NQN>/<initiator IQN>",
            )),
        }
    }

    /// The Kubernetes node name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The NVMe host NQN (`/etc/nvme/hostnqn`).
    pub fn host_nqn(&self) -> &str {
        &self.host_nqn
    }

    /// The iSCSI initiator IQN (`/etc/iscsi/initiatorname.iscsi`).
    pub fn initiator_iqn(&self) -> &str {
        &self.initiator_iqn
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.name, self.host_nqn, self.initiator_iqn)
    }
}

/// A worker node's name and the address its NFS mounts come from: the
/// filesystem identity's node ID, `<node name>/<address>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FilesNodeId {
    name: String,
    address: std::net::IpAddr,
}

impl FilesNodeId {
    /// Builds a files node ID; the address must name one host.
    pub fn new(name: &str, address: std::net::IpAddr) -> Result<Self, InvalidNodeId> {
        check_part("node name", name, "")?;
        if address.is_unspecified() || address.is_multicast() {
            return Err(invalid(
                &address.to_string(),
                "the node's NFS client address must be one host's address",
            ));
        }
        Ok(Self {
            name: name.to_owned(),
            address,
        })
    }

    /// Parses what [`FilesNodeId`]'s `Display` wrote.
    pub fn parse(value: &str) -> Result<Self, InvalidNodeId> {
        let shape = || invalid(value, "expected <node name>/<NFS client address>");
        let (name, address) = value.split_once('/').ok_or_else(shape)?;
        let address = address.parse().map_err(|_| shape())?;
        Self::new(name, address)
    }

    /// The Kubernetes node name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The address the node's NFS mounts come from.
    pub fn address(&self) -> std::net::IpAddr {
        self.address
    }
}

impl fmt::Display for FilesNodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.name, self.address)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_files_node_id_carries_the_nfs_client_address() {
        let id = FilesNodeId::new("worker-1", "192.0.2.9".parse().expect("ip")).expect("valid");
        assert_eq!(id.to_string(), "worker-1/192.0.2.9");
        assert_eq!(FilesNodeId::parse("worker-1/192.0.2.9"), Ok(id));
        let v6 = FilesNodeId::parse("w/2001:db8::9").expect("IPv6");
        assert_eq!(v6.address().to_string(), "2001:db8::9");
        for bad in ["worker-1", "worker-1/host-1", "w/0.0.0.0", "/192.0.2.9"] {
            assert!(FilesNodeId::parse(bad).is_err(), "{bad}");
        }
        assert!(FilesNodeId::parse(&format!("worker-1/{NQN}/{IQN}")).is_err());
    }

    const NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:0f6a8e4c-2b1d-4c55-9a4e-6c1f0e5d7a21";
    const IQN: &str = "iqn.1993-08.org.debian:01:5e2f9a1b7c3d";

    #[test]
    fn a_node_id_round_trips() {
        let id = NodeId::new("worker-1", NQN, IQN).expect("valid");
        let text = id.to_string();
        assert_eq!(text, format!("worker-1/{NQN}/{IQN}"));
        assert_eq!(NodeId::parse(&text), Ok(id));
    }

    #[test]
    fn malformed_node_ids_are_refused_naming_the_part() {
        let e = NodeId::parse("worker-1").expect_err("one part");
        assert!(e.reason.contains("expected <node name>"), "{e}");
        let e = NodeId::parse(&format!("worker-1/{NQN}/{IQN}/x")).expect_err("four parts");
        assert!(e.reason.contains("expected"), "{e}");
        let e = NodeId::new("worker-1", "host-1", IQN).expect_err("not an NQN");
        assert!(e.reason.contains("host NQN"), "{e}");
        let e = NodeId::new("worker-1", NQN, "").expect_err("empty IQN");
        assert!(e.reason.contains("initiator IQN is empty"), "{e}");
        let e = NodeId::new("worker 1", NQN, IQN).expect_err("space");
        assert!(e.reason.contains("node name"), "{e}");
    }

    #[test]
    fn a_node_id_over_256_bytes_is_refused() {
        let name = "n".repeat(200);
        let e = NodeId::new(&name, NQN, IQN).expect_err("too long");
        assert!(e.reason.contains("at most 256"), "{e}");
    }
}
