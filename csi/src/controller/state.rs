//! The PillarVolumeState store: the controller's record of each volume, and
//! the fence token it yields.
//!
//! Status changes carry the `metadata.resourceVersion` they were computed
//! from, so two controllers (or two calls) that raced get a conflict
//! (ABORTED, the CO retries) instead of overwriting each other.
use super::error::{Error, Result};
use api::crd::{PillarVolumeState, PillarVolumeStateStatus};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use pillar_csi_proto::agent::v1::FenceToken;

/// The PillarVolumeState objects of the cluster.
#[derive(Clone)]
pub struct States {
    api: Api<PillarVolumeState>,
}

/// The fence token of a volume: its record's UID and publication generation.
pub fn fence(state: &PillarVolumeState, generation: u64) -> FenceToken {
    FenceToken {
        volume_uid: state.metadata.uid.clone().unwrap_or_default(),
        generation,
    }
}

/// The publication generation of a record (absent = 0).
pub fn generation(state: &PillarVolumeState) -> u64 {
    state
        .status
        .as_ref()
        .and_then(|s| s.publication_generation)
        .unwrap_or(0)
}

/// A compare-and-swap write's error: ABORTED when the record changed
/// since it was read (the CO retries), else the API error.
fn conflict<'a>(name: &'a str, what: &'a str) -> impl FnOnce(kube::Error) -> Error + 'a {
    move |e| match e {
        kube::Error::Api(s) if s.code == 409 => Error::Aborted(format!(
            "PillarVolumeState {name:?} changed while this call ran; retry"
        )),
        e => Error::kube(format!("{what} PillarVolumeState {name:?}"))(e),
    }
}

impl States {
    /// The store over `client`.
    pub fn new(client: kube::Client) -> Self {
        States {
            api: Api::all(client),
        }
    }

    /// The record named `name`, if any.
    pub async fn get(&self, name: &str) -> Result<Option<PillarVolumeState>> {
        self.api
            .get_opt(name)
            .await
            .map_err(Error::kube(format!("read PillarVolumeState {name:?}")))
    }

    /// Every record, sorted by name.
    pub async fn list(&self) -> Result<Vec<PillarVolumeState>> {
        let mut all = self
            .api
            .list(&ListParams::default())
            .await
            .map_err(Error::kube("list PillarVolumeStates"))?
            .items;
        all.sort_by_key(|s| s.name_any());
        Ok(all)
    }

    /// The record whose `spec.volumeID` is `handle`.
    pub async fn by_handle(&self, handle: &str) -> Result<Option<PillarVolumeState>> {
        Ok(self
            .list()
            .await?
            .into_iter()
            .find(|s| s.spec.volume_id == handle))
    }

    /// Creates a record; an existing one of the same name is returned as it is.
    pub async fn create(&self, state: &PillarVolumeState) -> Result<PillarVolumeState> {
        let name = state.name_any();
        match self.api.create(&PostParams::default(), state).await {
            Ok(s) => Ok(s),
            Err(kube::Error::Api(e)) if e.code == 409 => self.get(&name).await?.ok_or_else(|| {
                Error::Aborted(format!("PillarVolumeState {name:?} vanished while created"))
            }),
            Err(e) => Err(Error::kube(format!("create PillarVolumeState {name:?}"))(e)),
        }
    }

    /// Replaces the status of `state` as read (conflict when it changed since).
    pub async fn set_status(
        &self,
        state: &PillarVolumeState,
        status: PillarVolumeStateStatus,
    ) -> Result<PillarVolumeState> {
        let name = state.name_any();
        // Every field named, so that a field left empty is removed by the
        // merge patch rather than left as it was.
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": state.metadata.resource_version},
            "status": {
                "publicationGeneration": status.publication_generation,
                "publishedNodes": status.published_nodes,
                "deleting": status.deleting,
                "phase": status.phase,
                "message": status.message,
            },
        });
        self.api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(conflict(&name, "write the status of"))
    }

    /// Merges `spec` (a JSON object of spec fields) into the record as
    /// read (conflict when it changed since): for fields computed from the
    /// record, which a concurrent writer's change would make stale.
    pub async fn swap_spec(
        &self,
        state: &PillarVolumeState,
        spec: serde_json::Value,
    ) -> Result<PillarVolumeState> {
        let name = state.name_any();
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": state.metadata.resource_version},
            "spec": spec,
        });
        self.api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(conflict(&name, "update"))
    }

    /// Merges `spec` (a JSON object of spec fields) into the record.
    pub async fn patch_spec(
        &self,
        state: &PillarVolumeState,
        spec: serde_json::Value,
    ) -> Result<PillarVolumeState> {
        let name = state.name_any();
        self.api
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(&serde_json::json!({ "spec": spec })),
            )
            .await
            .map_err(Error::kube(format!("update PillarVolumeState {name:?}")))
    }

    /// Deletes the record (already gone is fine).
    pub async fn delete(&self, state: &PillarVolumeState) -> Result<()> {
        let name = state.name_any();
        match self.api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(Error::kube(format!("delete PillarVolumeState {name:?}"))(e)),
        }
    }
}
