//! NVMe/TCP exports through the kernel nvmet target.
use super::identity::StableIdentity;
use super::names::{TargetNames, NQN_PREFIX};
use super::{ExportInfo, Exporter, Protocol};
use crate::{config::Listener, error::AgentError, marks::ExportRecord, volume::VolumeId};
use nvmet::{
    Namespace, Nqn, Nsid, Nvmet, Port, PortCheck, PortId, State, Subsystem, SubsystemPlan, Teardown,
};
use std::{collections::BTreeSet, path::Path, sync::RwLock};
use tracing::info;

const NSID: u32 = 1;

/// NVMe/TCP exports through the kernel nvmet target: one subsystem per
/// volume (namespace 1), all linked to one port.
#[derive(Debug)]
pub struct NvmetExporter {
    target: Nvmet,
    listener: Listener,
    port: PortId,
    names: TargetNames,
    /// Changes to different subsystems run side by side (read); a change
    /// that makes or moves the port, makes a host object or removes one
    /// runs alone (write), so that no export sees a shared object change
    /// under it and two exports never race to make the same one.
    apply: RwLock<()>,
    /// When the port was last read whole (see [`PortCheck`]).
    port_check: PortCheck,
}

impl NvmetExporter {
    /// An exporter on `target` listening on `listener` through port
    /// `port`, naming new subsystems with `names`.
    pub fn new(target: Nvmet, listener: Listener, port: PortId, names: TargetNames) -> Self {
        #[cfg(feature = "crash-points")]
        let target = target.with_step_hook(std::sync::Arc::new(|s| {
            crate::crash::configfs_step(crate::crash::Target::Nvmet, s)
        }));
        Self {
            target,
            listener,
            port,
            names,
            apply: RwLock::new(()),
            port_check: PortCheck::default(),
        }
    }

    /// The subsystem NQN of the export `record` describes.
    pub fn nqn_of(volume: &VolumeId, record: &ExportRecord) -> Result<Nqn, AgentError> {
        let name = match &record.target {
            Some(name) => name.clone(),
            None => TargetNames::legacy_nqn(volume),
        };
        Ok(Nqn::new(&name)?)
    }

    /// The hosts subsystem `nqn` allows now, as configfs lists them.
    fn allowed_hosts(&self, nqn: &Nqn) -> Result<BTreeSet<Nqn>, AgentError> {
        let names = self
            .target
            .tree()
            .children(&format!("subsystems/{nqn}/allowed_hosts"))
            .map_err(nvmet::Error::from)?;
        Ok(names.iter().filter_map(|h| Nqn::new(h).ok()).collect())
    }

    /// Removes the host objects among `candidates` (hosts a subsystem of
    /// this agent stopped allowing) that no subsystem allows any more, so
    /// an unexport or a narrowed ACL leaves no orphaned host behind.
    fn remove_unused_hosts(&self, candidates: BTreeSet<Nqn>) -> Result<(), AgentError> {
        if candidates.is_empty() {
            return Ok(());
        }
        let tree = self.target.tree();
        let subsystems = tree.children("subsystems").map_err(nvmet::Error::from)?;
        let unused: BTreeSet<Nqn> = candidates
            .into_iter()
            .filter(|h| {
                !subsystems
                    .iter()
                    .any(|s| tree.exists(&format!("subsystems/{s}/allowed_hosts/{h}")))
            })
            .collect();
        if !unused.is_empty() {
            self.target.teardown(&Teardown {
                hosts: unused,
                ..Default::default()
            })?;
        }
        Ok(())
    }

    /// Runs `f` alone: no other change of this exporter runs meanwhile.
    fn alone<T>(&self, f: impl FnOnce() -> Result<T, AgentError>) -> Result<T, AgentError> {
        let _guard = self
            .apply
            .write()
            .map_err(|_| AgentError::Internal("nvmet exporter lock poisoned".into()))?;
        f()
    }

    /// Runs `f` beside other changes of other subsystems, never beside one
    /// that runs [`Self::alone`].
    fn beside_others<T>(&self, f: impl FnOnce() -> Result<T, AgentError>) -> Result<T, AgentError> {
        let _guard = self
            .apply
            .read()
            .map_err(|_| AgentError::Internal("nvmet exporter lock poisoned".into()))?;
        f()
    }

    /// Applies `desired` (subsystem `nqn` on this exporter's port), cutting
    /// off hosts that lose access; when the port must move (it is
    /// half-made from a failed start, or the agent now listens elsewhere),
    /// this agent's subsystems linked to it move with it, and another
    /// tool's makes the plan refuse instead of cutting its hosts off (the
    /// port is read whole every [`PortCheck::EVERY`] and after a failure).
    /// The plan is made from one read beside other changes; when it touches
    /// only `nqn`'s own objects it runs there, else it is made again and
    /// run alone.
    fn apply_subsystem(&self, nqn: &Nqn, desired: &State) -> Result<SubsystemPlan, AgentError> {
        let plan = || {
            let own = |n: &Nqn| n.as_str().starts_with(NQN_PREFIX);
            self.target
                .plan_subsystem(nqn, desired.clone(), own, &self.port_check)
        };
        let run = |planned: &SubsystemPlan| -> Result<(), AgentError> {
            Ok(self.target.run_subsystem_plan(planned, &self.port_check)?)
        };
        let shared = self.beside_others(|| {
            let planned = plan()?;
            if !planned.plan.only_subsystem(nqn) {
                return Ok(None);
            }
            match run(&planned) {
                Ok(()) => Ok(Some(planned)),
                // A run on trusted ports failed: the port may be gone
                // (removed by another tool). Planned again, alone, from a
                // whole read of the ports; any other failure comes back.
                Err(e) if planned.trusted_ports() => {
                    info!(subsystem = %nqn, error = %e, "export planned on a trusted port failed; planning it again from a read of the ports");
                    Ok(None)
                }
                Err(e) => Err(e),
            }
        })?;
        match shared {
            Some(planned) => Ok(planned),
            None => self.alone(|| {
                let planned = plan()?;
                run(&planned)?;
                Ok(planned)
            }),
        }
    }
}

impl Exporter for NvmetExporter {
    fn protocol(&self) -> Protocol {
        Protocol::NvmeofTcp
    }

    fn check_initiator(&self, initiator: &str) -> Result<(), AgentError> {
        Nqn::new(initiator)
            .map(|_| ())
            .map_err(|e| AgentError::InvalidArgument(format!("initiator_id: {e}")))
    }

    fn new_target(&self, volume: &VolumeId) -> String {
        self.names.nqn(volume)
    }

    fn own_names(&self, volume: &VolumeId) -> Vec<String> {
        vec![self.names.nqn(volume), TargetNames::legacy_nqn(volume)]
    }

    fn export(
        &self,
        volume: &VolumeId,
        device: &Path,
        record: &ExportRecord,
    ) -> Result<ExportInfo, AgentError> {
        let nqn = Self::nqn_of(volume, record)?;
        let hosts: BTreeSet<Nqn> = if record.acl {
            record
                .allowed_initiators
                .iter()
                .map(|h| {
                    Nqn::new(h).map_err(|e| AgentError::InvalidArgument(format!("initiator: {e}")))
                })
                .collect::<Result<_, _>>()?
        } else {
            Default::default()
        };
        // The stable identity is given to objects being made; one that
        // exists keeps what it shows (an export made before this identity
        // existed keeps its kernel-chosen one until the objects are made
        // again: changing a live namespace's identity drops it on hosts).
        let identity = StableIdentity::of(nqn.as_str());
        let sub_dir = format!("subsystems/{nqn}");
        let tree = self.target.tree();
        let ns_made = tree.exists(&format!("{sub_dir}/namespaces/{NSID}"));
        let mut sub = Subsystem {
            allow_any_host: !record.acl,
            allowed_hosts: hosts.clone(),
            serial: (!tree.exists(&sub_dir)).then(|| identity.serial.clone()),
            ..Default::default()
        };
        sub.namespaces.insert(
            Nsid::new(u64::from(NSID))?,
            Namespace {
                device_path: device.to_path_buf(),
                uuid: (!ns_made).then(|| identity.uuid.clone()),
                nguid: (!ns_made).then(|| identity.nguid.clone()),
                enabled: true,
            },
        );
        let mut port = Port::tcp(std::net::SocketAddr::new(
            self.listener.address,
            self.listener.port,
        ));
        port.subsystems.insert(nqn.clone());
        let mut desired = State::default();
        desired.subsystems.insert(nqn.clone(), sub);
        desired.ports.insert(self.port, port);
        // Hosts that lose access are cut off before this returns: the
        // subsystem is unlinked from its port (the kernel deletes its
        // controllers there), its ACL changed, and linked back. After the
        // apply the subsystem allows exactly `hosts`.
        let SubsystemPlan {
            plan,
            allowed_before,
            ..
        } = self.apply_subsystem(&nqn, &desired)?;
        let dropped: BTreeSet<Nqn> = allowed_before.difference(&hosts).cloned().collect();
        if !dropped.is_empty() {
            self.alone(|| self.remove_unused_hosts(dropped))?;
        }
        if !plan.cut_off.is_empty() {
            info!(volume = %volume, subsystem = %nqn, "controllers cut off: access narrowed, subsystem relinked to its ports");
        }
        let device_identity = self
            .target
            .tree()
            .read_attr(&format!("{sub_dir}/namespaces/{NSID}/device_uuid"))
            .map_err(nvmet::Error::from)?;
        Ok(ExportInfo {
            target_id: nqn.to_string(),
            listener: self.listener,
            lun: NSID,
            device_identity: device_identity.trim().to_owned(),
        })
    }

    fn unexport(&self, volume: &VolumeId, recorded: Option<&str>) -> Result<(), AgentError> {
        let tree = self.target.tree();
        let nqns: BTreeSet<Nqn> = recorded
            .map(str::to_owned)
            .into_iter()
            .chain(self.own_names(volume))
            .filter_map(|name| Nqn::new(&name).ok())
            .filter(|nqn| tree.exists(&format!("subsystems/{nqn}")))
            .collect();
        if nqns.is_empty() {
            return Ok(());
        }
        // The teardown removes only the subsystems' own objects; the host
        // objects they no longer need go alone.
        let allowed = self.beside_others(|| {
            let mut allowed = BTreeSet::new();
            for nqn in &nqns {
                allowed.extend(self.allowed_hosts(nqn)?);
            }
            self.target.teardown(&Teardown {
                subsystems: nqns,
                ..Default::default()
            })?;
            Ok(allowed)
        })?;
        self.alone(|| self.remove_unused_hosts(allowed))
    }

    fn revalidate(&self, volume: &VolumeId, record: &ExportRecord) -> Result<(), AgentError> {
        let nqn = Self::nqn_of(volume, record)?;
        if !self.target.tree().exists(&format!("subsystems/{nqn}")) {
            return Ok(());
        }
        Ok(self
            .target
            .revalidate_size(&nqn, Nsid::new(u64::from(NSID))?)?)
    }

    fn health(&self) -> Result<(), AgentError> {
        Nvmet::open_at(self.target.tree().root())?;
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn hosts_no_subsystem_allows_any_more_are_removed() {
        // A plain folder stands in for configfs (paths only): subsystem `t`
        // still allows h2; h1 was allowed by a subsystem just torn down;
        // h3 is not a candidate (another tool's, say) and stays.
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for h in ["h1", "h2", "h3"] {
            fs::create_dir_all(root.join(format!("hosts/nqn.2026-01.org.example:{h}"))).unwrap();
        }
        fs::create_dir_all(root.join("subsystems/nqn.2026-01.org.example:t/allowed_hosts"))
            .unwrap();
        let t_dir = root.join("subsystems/nqn.2026-01.org.example:t");
        fs::write(t_dir.join("attr_allow_any_host"), "0\n").unwrap();
        std::os::unix::fs::symlink(
            root.join("hosts/nqn.2026-01.org.example:h2"),
            root.join(
                "subsystems/nqn.2026-01.org.example:t/allowed_hosts/nqn.2026-01.org.example:h2",
            ),
        )
        .unwrap();
        let exporter = NvmetExporter::new(
            Nvmet::with_tree(configfs::Tree::at(root)),
            Listener {
                address: "127.0.0.1".parse().unwrap(),
                port: 4420,
            },
            PortId(1),
            TargetNames::new("test").unwrap(),
        );
        let nqn = |h: &str| Nqn::new(&format!("nqn.2026-01.org.example:{h}")).unwrap();
        let t = nqn("t");
        assert_eq!(exporter.allowed_hosts(&t).unwrap(), [nqn("h2")].into());
        exporter
            .remove_unused_hosts([nqn("h1"), nqn("h2")].into())
            .unwrap();
        let left: Vec<_> = fs::read_dir(root.join("hosts"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        assert_eq!(
            left,
            ["nqn.2026-01.org.example:h2", "nqn.2026-01.org.example:h3"]
        );
    }
}
