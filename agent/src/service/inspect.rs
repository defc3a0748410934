//! InspectVolume: what the storage node observes about an LV, read-only.
use super::{blocking, Agent};
use crate::{
    adopt::OwnExports,
    backend::{Backend, BackendKind},
    error::AgentError,
    export::Protocol,
    marks::FenceMark,
    volume::VolumeId,
};
use std::{collections::BTreeMap, sync::Arc};

/// What InspectVolume observed.
#[derive(Debug, Clone)]
pub struct Inspection {
    /// The LVM report of the LV.
    pub lv: sys::lvm::Lv,
    /// Why this backend would not adopt it, if it would not.
    pub layout_refusal: Option<String>,
    /// Who uses the device.
    pub usage: sys::block::Usage,
    /// The signature probe.
    pub probe: sys::blkid::Probe,
    /// The agent's mark, if any.
    pub mark: Option<FenceMark>,
    /// The names of the agent's own exports of this volume.
    pub own: OwnExports,
    /// For each nvmet subsystem exporting the LV: allow_any_host and its allowed hosts.
    pub nvmet_allowed: BTreeMap<String, (bool, Vec<String>)>,
}

/// An export configured in a kernel target for the LV.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedExport {
    /// The target.
    pub protocol: Protocol,
    /// Subsystem NQN (nvmet) or `<hba>/<storage object>` (LIO).
    pub target_id: String,
    /// The agent's own export, recorded in the mark.
    pub managed: bool,
    /// Any initiator may connect.
    pub allow_any_host: bool,
    /// The initiators allowed to connect.
    pub allowed_hosts: Vec<String>,
}

impl ObservedExport {
    /// Whether any initiator may connect.
    pub fn admits(&self) -> bool {
        self.allow_any_host || !self.allowed_hosts.is_empty()
    }
}

impl Inspection {
    /// The exports of the LV: nvmet as configfs shows them; LIO with the
    /// ACL the mark records for the agent's own (a foreign LIO export's ACL
    /// is not read and shows as admitting nobody).
    pub fn exports(&self) -> Vec<ObservedExport> {
        let recorded = |p: Protocol| {
            self.mark
                .as_ref()
                .and_then(|m| m.exports.get(p.as_str()).cloned())
        };
        let mut exports = Vec::new();
        for n in &self.usage.nvmet {
            let (allow_any_host, allowed_hosts) = self
                .nvmet_allowed
                .get(&n.subsystem)
                .cloned()
                .unwrap_or_default();
            exports.push(ObservedExport {
                protocol: Protocol::NvmeofTcp,
                target_id: n.subsystem.clone(),
                managed: self.own.contains(&n.subsystem) && recorded(Protocol::NvmeofTcp).is_some(),
                allowed_hosts,
                allow_any_host,
            });
        }
        for l in &self.usage.lio {
            let own = if self.own.contains(&l.name) {
                recorded(Protocol::Iscsi)
            } else {
                None
            };
            exports.push(ObservedExport {
                protocol: Protocol::Iscsi,
                target_id: format!("{}/{}", l.backstore, l.name),
                managed: own.is_some(),
                allow_any_host: own.as_ref().is_some_and(|r| !r.acl),
                allowed_hosts: own
                    .map(|r| r.allowed_initiators.into_iter().collect())
                    .unwrap_or_default(),
            });
        }
        exports
    }
}

/// The configfs folder of nvmet subsystems.
const NVMET_SUBSYSTEMS: &str = "/sys/kernel/config/nvmet/subsystems";

/// `attr_allow_any_host` and the `allowed_hosts` of one nvmet subsystem, as
/// configfs shows them (unreadable entries read as none).
fn nvmet_allowed(nqn: &str) -> (bool, Vec<String>) {
    let dir = std::path::Path::new(NVMET_SUBSYSTEMS).join(nqn);
    let any = std::fs::read_to_string(dir.join("attr_allow_any_host"))
        .map(|s| s.trim() == "1")
        .unwrap_or(false);
    let mut hosts: Vec<String> = std::fs::read_dir(dir.join("allowed_hosts"))
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    hosts.sort();
    (any, hosts)
}

impl Agent {
    /// InspectVolume: what the storage node observes about an LV and the
    /// agent's record of it. Read-only; takes no token.
    pub async fn inspect_volume(
        &self,
        id: &str,
        kind: Option<BackendKind>,
    ) -> Result<Inspection, AgentError> {
        let id = VolumeId::parse(id)?;
        if kind == Some(BackendKind::Zvol) {
            return Err(AgentError::Unimplemented(
                "InspectVolume supports BACKEND_TYPE_LVM only".into(),
            ));
        }
        let backend = self.backend(&id, kind)?;
        if backend.kind() != BackendKind::Lvm {
            return Err(AgentError::Unimplemented(
                "InspectVolume supports BACKEND_TYPE_LVM only".into(),
            ));
        }
        let _guard = self.locks.lock(id.as_str()).await;
        self.observe_lv(&id, &backend).await
    }

    /// What the storage node observes about the LV of `id` now, and its
    /// mark; the caller holds the volume's lock.
    pub(super) async fn observe_lv(
        &self,
        id: &VolumeId,
        backend: &Arc<dyn Backend>,
    ) -> Result<Inspection, AgentError> {
        let at = backend.locate(id)?;
        let marks = self.marks.clone();
        let key = id.as_str().to_owned();
        let mark = blocking(move || Ok(marks.load(&key)?)).await?;
        let b = backend.clone();
        let lv = blocking(move || b.report_lv(&at)).await?.ok_or_else(|| {
            AgentError::FailedPrecondition(format!("volume {id}: logical volume {id} is missing"))
        })?;
        let layout_refusal = backend.layout_refusal(&lv);
        let device = lv
            .path
            .clone()
            .unwrap_or_else(|| format!("/dev/{}/{}", lv.vg.as_str(), lv.name).into());
        let own = self.own_exports(id);
        let b = backend.clone();
        let (usage, probe, allowed) = blocking(move || {
            let u = b.device_usage(&device)?;
            let p = sys::blkid::probe(&device);
            let allowed: BTreeMap<String, (bool, Vec<String>)> = u
                .nvmet
                .iter()
                .map(|n| (n.subsystem.clone(), nvmet_allowed(&n.subsystem)))
                .collect();
            Ok::<_, AgentError>((u, p, allowed))
        })
        .await?;
        Ok(Inspection {
            lv,
            layout_refusal,
            usage,
            probe,
            mark,
            own,
            nvmet_allowed: allowed,
        })
    }
}
