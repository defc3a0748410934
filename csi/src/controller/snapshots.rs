//! CreateSnapshot, DeleteSnapshot and ListSnapshots, and the content
//! source of a CreateVolume.
//!
//! CreateSnapshot writes the PillarSnapshot first; its UID names the
//! snapshot on the agent (`<agent volume ID>@pillar-snap-<uid>`), so a
//! retry after a restart converges on the same snapshot. The CSI snapshot
//! ID is `<agent>/<that agent snapshot ID>`. A record is removed only after
//! the agent answered.
use super::error::{Error, Result};
use super::listing::{page_of, TOKEN_PREFIX};
use super::naming;
use super::state::{fence, generation};
use super::{backend_type, Controller};
use crate::volume_context::Origin;
use api::crd::{PillarSnapshot, PillarSnapshotSpec, PillarSnapshotStatus, PillarVolumeState};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use pillar_csi_proto::agent::v1 as agent;
use pillar_csi_proto::csi::v1 as csi;

/// The agent's prefix of the snapshots CreateSnapshot takes.
const AGENT_SNAPSHOT_PREFIX: &str = "@pillar-snap-";

/// The CSI snapshot ID of a record: `<agent>/<source agent volume ID>@pillar-snap-<uid>`.
pub fn snapshot_id(record: &PillarSnapshot) -> String {
    format!(
        "{}/{}{AGENT_SNAPSHOT_PREFIX}{}",
        record.spec.agent_ref,
        record.spec.source_agent_volume_id,
        record.metadata.uid.as_deref().unwrap_or_default()
    )
}

/// The agent and the agent's snapshot ID a CSI snapshot ID names, `None`
/// when it cannot be one of ours.
fn split_id(id: &str) -> Option<(&str, &str)> {
    id.split_once('/')
        .filter(|(agent, rest)| !agent.is_empty() && rest.contains(AGENT_SNAPSHOT_PREFIX))
}

fn timestamp(seconds: i64) -> prost_types::Timestamp {
    prost_types::Timestamp { seconds, nanos: 0 }
}

/// The CSI form of a ready record.
fn csi_snapshot(record: &PillarSnapshot) -> csi::Snapshot {
    let status = record.status.clone().unwrap_or_default();
    csi::Snapshot {
        size_bytes: status.size_bytes.unwrap_or_default() as i64,
        snapshot_id: snapshot_id(record),
        source_volume_id: record.spec.source_volume_id.clone(),
        creation_time: Some(timestamp(status.creation_seconds.unwrap_or_default())),
        ready_to_use: status.ready_to_use == Some(true),
        group_snapshot_id: String::new(),
    }
}

/// A checked content source: what the agent's CreateVolume names, the
/// agent that holds it and its size.
pub struct Source {
    /// The PillarAgent holding the source.
    pub agent: String,
    /// The source's size: the smallest volume made from it.
    pub bytes: u64,
    /// How the node sees the new volume's data.
    pub origin: Origin,
    /// The agent's snapshot ID, or the agent's volume ID (after the
    /// origin: a snapshot or a volume).
    agent_id: String,
}

impl Source {
    /// Names the source in the agent's CreateVolume.
    pub fn apply(&self, request: &mut agent::CreateVolumeRequest) {
        match self.origin {
            Origin::Snapshot => request.source_snapshot_id = self.agent_id.clone(),
            _ => request.source_volume_id = self.agent_id.clone(),
        }
    }
}

impl Controller {
    fn snapshots_api(&self) -> Api<PillarSnapshot> {
        Api::all(self.client.clone())
    }

    async fn snapshot_records(&self) -> Result<Vec<PillarSnapshot>> {
        Ok(self
            .snapshots_api()
            .list(&ListParams::default())
            .await
            .map_err(Error::kube("list PillarSnapshots"))?
            .items)
    }

    /// The record of a CSI snapshot ID, if any.
    async fn snapshot_record(&self, id: &str) -> Result<Option<PillarSnapshot>> {
        Ok(self
            .snapshot_records()
            .await?
            .into_iter()
            .find(|r| snapshot_id(r) == id))
    }

    async fn snapshot_status(
        &self,
        record: &PillarSnapshot,
        status: PillarSnapshotStatus,
    ) -> Result<PillarSnapshot> {
        let name = record.name_any();
        self.snapshots_api()
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({
                    "metadata": {"resourceVersion": record.resource_version()},
                    "status": status,
                })),
            )
            .await
            .map_err(Error::kube(format!("update PillarSnapshot {name:?}")))
    }

    /// CreateSnapshot.
    pub async fn snapshot(&self, req: csi::CreateSnapshotRequest) -> Result<csi::Snapshot> {
        if req.name.is_empty() {
            return Err(Error::InvalidArgument(
                "the snapshot name is missing".into(),
            ));
        }
        if req.source_volume_id.is_empty() {
            return Err(Error::InvalidArgument(
                "the source volume ID is missing".into(),
            ));
        }
        let name = naming::record_name(&req.name);
        let api = self.snapshots_api();
        let found = api
            .get_opt(&name)
            .await
            .map_err(Error::kube(format!("read PillarSnapshot {name:?}")))?;
        if let Some(record) = &found {
            if !naming::is_record_of(record, &req.name) {
                return Err(Error::AlreadyExists(format!(
                    "snapshot {:?}: its record {name:?} belongs to another snapshot",
                    req.name
                )));
            }
            if record.spec.source_volume_id != req.source_volume_id {
                return Err(Error::AlreadyExists(format!(
                    "snapshot {:?} already exists of volume {}",
                    req.name, record.spec.source_volume_id
                )));
            }
            if record.status.as_ref().and_then(|s| s.ready_to_use) == Some(true) {
                return Ok(csi_snapshot(record));
            }
        }
        let source = self.ready_state(&req.source_volume_id, "snapshot").await?;
        let record = match found {
            Some(record) => record,
            None => {
                let mut record = PillarSnapshot::new(
                    &name,
                    PillarSnapshotSpec {
                        source_volume_id: req.source_volume_id.clone(),
                        source_agent_volume_id: source.spec.agent_volume_id.clone(),
                        agent_ref: source.spec.agent_ref.clone(),
                        backend_type: source.spec.backend_type,
                    },
                );
                if name != req.name {
                    record.metadata.annotations = Some(
                        [(naming::CSI_NAME.to_owned(), req.name.clone())]
                            .into_iter()
                            .collect(),
                    );
                }
                api.create(&PostParams::default(), &record)
                    .await
                    .map_err(Error::kube(format!("create PillarSnapshot {name:?}")))?
            }
        };
        if record.status.as_ref().and_then(|s| s.deleting) == Some(true) {
            return Err(Error::Aborted(format!(
                "snapshot {:?} is being deleted",
                req.name
            )));
        }
        let agent = self.agent_of(&source).await?;
        let mut client = self.agents.client(&agent)?;
        let taken = client
            .client
            .create_snapshot(agent::CreateSnapshotRequest {
                source_volume_id: source.spec.agent_volume_id.clone(),
                backend_type: backend_type(source.spec.backend_type),
                snapshot_uid: record.metadata.uid.clone().unwrap_or_default(),
                fence: Some(fence(&source, generation(&source))),
            })
            .await
            .map_err(client.fail())?
            .into_inner()
            .snapshot
            .ok_or_else(|| {
                Error::Unavailable(format!(
                    "agent {}: CreateSnapshot returned no snapshot",
                    source.spec.agent_ref
                ))
            })?;
        let record = self
            .snapshot_status(
                &record,
                PillarSnapshotStatus {
                    snapshot_id: Some(snapshot_id(&record)),
                    ready_to_use: Some(true),
                    size_bytes: Some(taken.size_bytes),
                    creation_seconds: taken.creation_time.map(|t| t.seconds),
                    deleting: None,
                },
            )
            .await?;
        Ok(csi_snapshot(&record))
    }

    /// DeleteSnapshot: the agent deletes the snapshot (one that volumes
    /// were made from goes with the last of them), then the record goes. An
    /// ID that cannot be ours, or names no agent, is success.
    pub async fn remove_snapshot(&self, id: &str) -> Result<()> {
        if id.is_empty() {
            return Err(Error::InvalidArgument("the snapshot ID is missing".into()));
        }
        let Some((agent_name, agent_snapshot)) = split_id(id) else {
            return Ok(());
        };
        let record = match self.snapshot_record(id).await? {
            Some(r) if r.status.as_ref().and_then(|s| s.deleting) != Some(true) => {
                let status = PillarSnapshotStatus {
                    deleting: Some(true),
                    ..r.status.clone().unwrap_or_default()
                };
                Some(self.snapshot_status(&r, status).await?)
            }
            other => other,
        };
        // Without a record (lost with the cluster's metadata) the agent is
        // still asked: the ID alone authorizes the deletion.
        let agent = match self.agent_named(agent_name).await {
            Ok(agent) => agent,
            Err(_) if record.is_none() => return Ok(()),
            Err(e) => return Err(e),
        };
        let mut client = self.agents.client(&agent)?;
        client
            .client
            .delete_snapshot(agent::DeleteSnapshotRequest {
                snapshot_id: agent_snapshot.to_owned(),
                backend_type: 0,
            })
            .await
            .map_err(client.fail())?;
        if let Some(record) = record {
            let name = record.name_any();
            match self
                .snapshots_api()
                .delete(&name, &DeleteParams::default())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(Error::kube(format!("delete PillarSnapshot {name:?}"))(e)),
            }
        }
        Ok(())
    }

    /// ListSnapshots of the ready records, paged by record name as
    /// ListVolumes is; an unknown snapshot or source gives an empty list.
    pub async fn list_snapshots_page(
        &self,
        req: csi::ListSnapshotsRequest,
    ) -> Result<csi::ListSnapshotsResponse> {
        let (after, max) = page_of(&req.starting_token, req.max_entries)?;
        let mut records = self.snapshot_records().await?;
        records.sort_by_key(|r| r.name_any());
        let rest: Vec<_> = records
            .iter()
            .filter(|r| {
                let status = r.status.clone().unwrap_or_default();
                status.ready_to_use == Some(true) && status.deleting != Some(true)
            })
            .filter(|r| req.snapshot_id.is_empty() || snapshot_id(r) == req.snapshot_id)
            .filter(|r| {
                req.source_volume_id.is_empty() || r.spec.source_volume_id == req.source_volume_id
            })
            .filter(|r| after.is_none_or(|after| r.name_any().as_str() > after))
            .collect();
        let page = &rest[..rest.len().min(max)];
        let next_token = match page.last() {
            Some(last) if page.len() < rest.len() => format!("{TOKEN_PREFIX}{}", last.name_any()),
            _ => String::new(),
        };
        Ok(csi::ListSnapshotsResponse {
            entries: page
                .iter()
                .map(|r| csi::list_snapshots_response::Entry {
                    snapshot: Some(csi_snapshot(r)),
                })
                .collect(),
            next_token,
        })
    }

    /// The source a CreateVolume names: a ready snapshot or a Ready volume,
    /// NOT_FOUND when there is none.
    pub async fn content_source(&self, source: &csi::VolumeContentSource) -> Result<Source> {
        use csi::volume_content_source::{SnapshotSource, Type, VolumeSource};
        match &source.r#type {
            Some(Type::Snapshot(SnapshotSource { snapshot_id: id })) => {
                let record = self
                    .snapshot_record(id)
                    .await?
                    .filter(|r| {
                        let status = r.status.clone().unwrap_or_default();
                        status.ready_to_use == Some(true) && status.deleting != Some(true)
                    })
                    .ok_or_else(|| Error::NotFound(format!("snapshot {id} does not exist")))?;
                Ok(Source {
                    agent: record.spec.agent_ref.clone(),
                    bytes: record
                        .status
                        .as_ref()
                        .and_then(|s| s.size_bytes)
                        .unwrap_or_default(),
                    origin: Origin::Snapshot,
                    agent_id: split_id(id).map(|(_, s)| s.to_owned()).unwrap_or_default(),
                })
            }
            Some(Type::Volume(VolumeSource { volume_id: id })) => {
                let state: PillarVolumeState = match self.ready_state(id, "clone").await {
                    Err(Error::NotFound(_)) => {
                        return Err(Error::NotFound(format!("volume {id} does not exist")))
                    }
                    other => other?,
                };
                Ok(Source {
                    agent: state.spec.agent_ref.clone(),
                    bytes: state.spec.capacity_bytes,
                    origin: Origin::Clone,
                    agent_id: state.spec.agent_volume_id.clone(),
                })
            }
            None => Err(Error::InvalidArgument(
                "volume_content_source names neither a snapshot nor a volume".into(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_split_only_when_they_can_be_ours() {
        assert_eq!(
            split_id("storage-1/tank/pvc-1@pillar-snap-u1"),
            Some(("storage-1", "tank/pvc-1@pillar-snap-u1"))
        );
        for id in [
            "reallyfakesnapshotid",
            "a/b",
            "/tank/v@pillar-snap-u",
            "a/tank/v@pre-pillar",
        ] {
            assert_eq!(split_id(id), None, "{id}");
        }
    }
}
