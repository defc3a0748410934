//! InspectVolume: what the storage node observes about an LV, read-only.
use super::{blocking, Agent};
use crate::{
    adopt::{usage, OwnExports},
    backend::BackendKind,
    error::AgentError,
    marks::FenceMark,
    volume::VolumeId,
};
use std::collections::BTreeMap;

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
        let at = backend.locate(&id)?;
        let _guard = self.locks.lock(id.as_str()).await;
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
        let own = OwnExports::of(&id);
        let (usage, probe, allowed) = blocking(move || {
            let u = usage(&device)?;
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
