//! ListVolumes and GetCapacity.
use super::error::{Error, Result};
use super::naming;
use super::resolve::{self, backend_of, pool_of};
use super::{backend_type, Controller};
use api::crd::{PillarAgent, PillarStore};
use kube::api::{Api, ListParams};
use kube::ResourceExt;
use pillar_csi_proto::agent::v1 as agent;
use pillar_csi_proto::csi::v1 as csi;

/// What starts a ListVolumes `next_token`, before the record name the
/// next page starts after.
pub const TOKEN_PREFIX: &str = "after:";

/// A page request: the record name its starting token names (`None` for
/// the first page; a token of another form is ABORTED, as CSI asks) and
/// the most entries it takes (0 or negative: all).
pub fn page_of(starting_token: &str, max_entries: i32) -> Result<(Option<&str>, usize)> {
    let after = match starting_token {
        "" => None,
        token => Some(
            token
                .strip_prefix(TOKEN_PREFIX)
                .filter(|name| naming::is_object_name(name))
                .ok_or_else(|| {
                    Error::Aborted(format!(
                        "starting token {token:?} is not one this controller issued"
                    ))
                })?,
        ),
    };
    let max = match usize::try_from(max_entries) {
        Ok(0) | Err(_) => usize::MAX,
        Ok(n) => n,
    };
    Ok((after, max))
}

impl Controller {
    /// ListVolumes, paged by record name: a page's `next_token` is
    /// [`TOKEN_PREFIX`] and the name of its last record, and the next page
    /// starts after that name, so a record deleted or added between two
    /// pages neither skips nor repeats one. A token of another form is
    /// ABORTED, as CSI asks.
    pub async fn list(&self, req: csi::ListVolumesRequest) -> Result<csi::ListVolumesResponse> {
        let (after, max) = page_of(&req.starting_token, req.max_entries)?;
        let states = self.states.list().await?;
        let rest: Vec<_> = states
            .iter()
            .filter(|s| after.is_none_or(|after| s.name_any().as_str() > after))
            .collect();
        let page = &rest[..rest.len().min(max)];
        let next_token = match page.last() {
            Some(last) if page.len() < rest.len() => format!("{TOKEN_PREFIX}{}", last.name_any()),
            _ => String::new(),
        };
        let entries = page
            .iter()
            .map(|s| csi::list_volumes_response::Entry {
                volume: Some(csi::Volume {
                    capacity_bytes: s.spec.capacity_bytes as i64,
                    volume_id: s.spec.volume_id.clone(),
                    ..Default::default()
                }),
                status: Some(csi::list_volumes_response::VolumeStatus {
                    published_node_ids: s
                        .status
                        .as_ref()
                        .map(|st| {
                            st.published_nodes
                                .iter()
                                .map(|n| n.node_id.clone())
                                .collect()
                        })
                        .unwrap_or_default(),
                    volume_condition: None,
                }),
            })
            .collect();
        Ok(csi::ListVolumesResponse {
            entries,
            next_token,
        })
    }

    async fn store_capacity(&self, store: &PillarStore, agent: &PillarAgent) -> Result<u64> {
        let backend = backend_of(&store.name_any(), &store.spec.backend)?;
        let mut client = self.agents.client(agent)?;
        let answer = client
            .client
            .get_capacity(agent::GetCapacityRequest {
                backend_type: backend_type(backend),
                pool: pool_of(&store.spec.backend).unwrap_or_default(),
            })
            .await
            .map_err(client.fail())?
            .into_inner();
        Ok(answer.available_bytes)
    }

    /// GetCapacity: the available bytes of the class's store; without a
    /// class, the sum over every PillarStore whose agent answers (a store
    /// whose agent is missing or unreachable has no capacity to offer now,
    /// and must not hide the others'); an error only when no store answers.
    pub async fn capacity(&self, req: csi::GetCapacityRequest) -> Result<u64> {
        if req.parameters.contains_key(resolve::CLASS_PARAMETER) {
            let class = resolve::class_name(&req.parameters)?;
            let place = resolve::placement(&self.client, class).await?;
            return self.store_capacity(&place.store, &place.agent).await;
        }
        let stores = Api::<PillarStore>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .map_err(Error::kube("list PillarStores"))?;
        let (mut total, mut answered, mut first_error) = (0u64, false, None);
        for store in &stores.items {
            let bytes = match self.agent_named(&store.spec.agent_ref).await {
                Ok(agent) => self.store_capacity(store, &agent).await,
                Err(e) => Err(e),
            };
            match bytes {
                Ok(bytes) => {
                    total = total.saturating_add(bytes);
                    answered = true;
                }
                Err(e) => {
                    tracing::warn!(store = %store.name_any(), error = %e, "GetCapacity: store left out of the sum");
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) if !answered => Err(e),
            _ => Ok(total),
        }
    }
}
