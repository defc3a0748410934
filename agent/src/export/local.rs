//! Node-local exports: a directory volume of an agent whose node also runs
//! pods, bind-mounted by that node's plugin. There is no kernel target to
//! make: the export is the volume's record in its fence mark (the node
//! names admitted, under the volume's fencing token), and what it answers
//! is the directory's path.
use super::{ExportInfo, Exporter, Protocol};
use crate::{config::Listener, error::AgentError, marks::ExportRecord, volume::VolumeId};
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

/// The longest Kubernetes node name (a DNS subdomain).
const MAX_NODE_NAME: usize = 253;

/// The exporter of node-local directory volumes.
#[derive(Debug, Default)]
pub struct LocalExporter;

/// Whether `name` is a Kubernetes node name: a DNS-1123 subdomain (lower
/// case letters, digits, `-` and `.`, each label starting and ending with a
/// letter or digit).
fn is_node_name(name: &str) -> bool {
    let label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    name.len() <= MAX_NODE_NAME && name.split('.').all(label)
}

impl Exporter for LocalExporter {
    fn protocol(&self) -> Protocol {
        Protocol::Local
    }

    fn check_initiator(&self, initiator: &str) -> Result<(), AgentError> {
        if is_node_name(initiator) {
            return Ok(());
        }
        Err(AgentError::InvalidArgument(format!(
            "initiator {initiator:?}: a node-local volume's initiator is a Kubernetes node name (lower case letters, digits, '-' and '.')"
        )))
    }

    fn new_target(&self, volume: &VolumeId) -> String {
        volume.to_string()
    }

    fn own_names(&self, volume: &VolumeId) -> Vec<String> {
        vec![volume.to_string()]
    }

    fn export(
        &self,
        _volume: &VolumeId,
        device: &Path,
        record: &ExportRecord,
    ) -> Result<ExportInfo, AgentError> {
        if !record.acl {
            return Err(AgentError::InvalidArgument(
                "a node-local export names the node that mounts it: acl_enabled must be true"
                    .into(),
            ));
        }
        Ok(ExportInfo {
            target_id: device.to_string_lossy().into_owned(),
            // Nothing listens: the node mounts the path itself.
            listener: Listener {
                address: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                port: 0,
            },
            lun: 0,
            device_identity: String::new(),
        })
    }

    fn unexport(&self, _volume: &VolumeId, _recorded: Option<&str>) -> Result<(), AgentError> {
        Ok(())
    }

    fn revalidate(&self, _volume: &VolumeId, _record: &ExportRecord) -> Result<(), AgentError> {
        // A new project limit reaches the node's statfs at once.
        Ok(())
    }

    fn health(&self) -> Result<(), AgentError> {
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn initiators_are_node_names() {
        let e = LocalExporter;
        for ok in ["worker-1", "node.example.com", "a", "10-0-0-1"] {
            assert!(e.check_initiator(ok).is_ok(), "{ok}");
        }
        let long = "a".repeat(64);
        for bad in [
            "",
            "Worker",
            "-a",
            "a-",
            "a..b",
            "10.0.0.1/24",
            "a b",
            long.as_str(),
        ] {
            let err = e.check_initiator(bad).unwrap_err().to_string();
            assert!(err.contains("Kubernetes node name"), "{bad}: {err}");
        }
    }

    #[test]
    fn an_export_without_acl_is_refused_and_one_with_it_answers_the_path() {
        let e = LocalExporter;
        let volume = VolumeId::parse("dirs/pvc-1").unwrap();
        let mut record = ExportRecord {
            acl: false,
            allowed_initiators: ["worker-1".to_string()].into(),
            chap: None,
            target: None,
        };
        let dir = Path::new("/srv/xfs/volumes/pvc-1");
        assert!(e.export(&volume, dir, &record).is_err());
        record.acl = true;
        let info = e.export(&volume, dir, &record).unwrap();
        assert_eq!(info.target_id, "/srv/xfs/volumes/pvc-1");
        assert_eq!(info.listener.port, 0);
    }
}
