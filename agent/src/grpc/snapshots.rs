//! The snapshot RPCs' messages: content sources and snapshot infos.
use crate::{
    error::AgentError,
    service::{ContentSource, SnapshotInfo},
    snapshot_id::SnapshotId,
    volume::{truncate, VolumeId},
};
use pillar_csi_proto::agent::v1 as pb;
use std::time::{Duration, SystemTime};

/// The content source of a CreateVolumeRequest, if it names one.
pub(crate) fn content_source(
    r: &pb::CreateVolumeRequest,
) -> Result<Option<ContentSource>, AgentError> {
    let importing = !r.import_zvol.is_empty() || r.import_lv.is_some();
    let source = match (r.source_snapshot_id.as_str(), r.source_volume_id.as_str()) {
        ("", "") => return Ok(None),
        (snapshot, "") => ContentSource::Snapshot(SnapshotId::parse(snapshot)?),
        ("", volume) => ContentSource::Volume(VolumeId::parse(volume)?),
        _ => {
            return Err(AgentError::InvalidArgument(format!(
                "volume {}: set at most one of source_snapshot_id and source_volume_id",
                truncate(&r.volume_id)
            )))
        }
    };
    if importing {
        return Err(AgentError::InvalidArgument(format!(
            "volume {}: a content source and an import cannot be combined (an import adopts a volume as it is)",
            truncate(&r.volume_id)
        )));
    }
    Ok(Some(source))
}

/// A snapshot as the RPCs report it.
pub(crate) fn snapshot_info(s: SnapshotInfo) -> pb::SnapshotInfo {
    pb::SnapshotInfo {
        snapshot_id: s.id.to_string(),
        source_volume_id: s.id.volume().to_string(),
        snapshot_uid: s.id.uid().to_owned(),
        size_bytes: s.size_bytes,
        creation_time: Some(prost_types::Timestamp::from(
            SystemTime::UNIX_EPOCH + Duration::from_secs(s.creation),
        )),
    }
}
