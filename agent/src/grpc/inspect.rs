//! The wire form of an inspection (InspectVolumeResponse).
use super::convert::{lvm_identity, protocol_type};
use crate::{marks::AdoptedSource, service::Inspection};
use pillar_csi_proto::agent::v1 as pb;
use std::time::SystemTime;

/// The wire form of an inspection.
pub(crate) fn inspection(volume_id: String, i: &Inspection) -> pb::InspectVolumeResponse {
    use sys::block::Exclusive;
    let lv = &i.lv;
    let device_path = lv
        .path
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let (filesystem_probe_state, filesystem_type) = match &i.probe {
        sys::blkid::Probe::Filesystem { fs_type } => ("filesystem", fs_type.clone()),
        sys::blkid::Probe::Blank => ("blank", String::new()),
        _ => ("unknown", String::new()),
    };
    let mut consumers = Vec::new();
    for m in &i.usage.mounts {
        consumers.push(pb::VolumeConsumer {
            kind: "mount".into(),
            device: m.device.clone(),
            detail: m.mount_point.display().to_string(),
        });
    }
    for h in &i.usage.holders {
        consumers.push(pb::VolumeConsumer {
            kind: "holder".into(),
            device: h.of.clone(),
            detail: match &h.dm_name {
                Some(n) => format!("{} ({n})", h.holder),
                None => h.holder.clone(),
            },
        });
    }
    let exports = i
        .exports()
        .into_iter()
        .map(|x| pb::VolumeExport {
            protocol_type: protocol_type(x.protocol) as i32,
            target_id: x.target_id,
            managed: x.managed,
            allowed_hosts: x.allowed_hosts,
            allow_any_host: x.allow_any_host,
        })
        .collect();
    let fence = match &i.mark {
        None => pb::FenceState::default(),
        Some(m) => {
            let (lvm_source, preserve_original) = match &m.adopted {
                Some(AdoptedSource::Lv {
                    vg,
                    lv,
                    vg_uuid,
                    lv_uuid,
                    preserve_original,
                }) => (
                    Some(lvm_identity(vg, lv, vg_uuid, lv_uuid)),
                    *preserve_original,
                ),
                _ => (None, false),
            };
            pb::FenceState {
                exists: true,
                ended: m.fence.live.is_none(),
                volume_uid: m
                    .fence
                    .live
                    .as_ref()
                    .map(|l| l.volume_uid.clone())
                    .unwrap_or_default(),
                generation: m.fence.live.as_ref().map(|l| l.generation).unwrap_or(0),
                lvm_source,
                preserve_original,
                ended_uids: m.fence.ended_uids.iter().cloned().collect(),
            }
        }
    };
    pb::InspectVolumeResponse {
        volume_id,
        lvm: Some(pb::LvmObservation {
            identity: Some(lvm_identity(
                lv.vg.as_str(),
                &lv.name,
                lv.vg_uuid.as_str(),
                lv.uuid.as_str(),
            )),
            exclusive_claim: match i.usage.exclusive {
                Exclusive::Free => "free",
                Exclusive::Busy => "busy",
                Exclusive::Unknown(_) => "unknown",
            }
            .into(),
            size_bytes: lv.size,
            segtype: lv.segtype.clone(),
            lv_attr: lv.attr.raw.clone(),
            pool_lv: lv.pool_lv.clone().unwrap_or_default(),
            active: lv.attr.active,
            device_path,
            layout_refusal: i.layout_refusal.clone().unwrap_or_default(),
        }),
        filesystem_probe_state: filesystem_probe_state.into(),
        filesystem_type,
        consumers,
        exports,
        fence: Some(fence),
        observed_at: Some(prost_types::Timestamp::from(SystemTime::now())),
        snapshot: None,
    }
}
