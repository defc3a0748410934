//! PillarVolumeReservations: an imported zvol or adopted LV reserved for
//! one claim before the agent is called, so that two claims cannot import
//! the same volume.
//!
//! A reservation's name is derived from the agent and the agent volume ID,
//! so taking one is a single create that the API server lets only one
//! claim win. The controller never releases a reservation on its own (it
//! cannot tell a controller that crashed from one that is only paused and
//! could still reach the agent): it is removed with the claim's volume, by
//! DeleteVolume after the agent answered, or by hand (spec/import-zvol.md,
//! "Release a stale reservation").
use super::error::{Error, Result};
use super::import::Import;
use api::crd::{ClaimRef, PillarVolumeReservation, PillarVolumeReservationSpec, PillarVolumeState};
use kube::api::{Api, DeleteParams, PostParams};
use kube::ResourceExt;

/// The PillarVolumeReservation objects of the cluster.
#[derive(Clone)]
pub struct Reservations {
    api: Api<PillarVolumeReservation>,
}

/// The reservation's name for a volume of an agent: a readable part and a
/// digest of the exact pair ([`super::naming::derived`]), so that two
/// volumes whose names differ only in case or punctuation never share one
/// (the reservation's spec names the volume in full and is compared).
pub fn name_for(agent: &str, agent_volume_id: &str) -> String {
    super::naming::derived(&format!("{agent}/{agent_volume_id}"), 200)
}

impl Reservations {
    /// The store over `client`.
    pub fn new(client: kube::Client) -> Self {
        Reservations {
            api: Api::all(client),
        }
    }

    /// The reservation of a volume of an agent, if any.
    pub async fn get(
        &self,
        agent: &str,
        agent_volume_id: &str,
    ) -> Result<Option<PillarVolumeReservation>> {
        let name = name_for(agent, agent_volume_id);
        self.api.get_opt(&name).await.map_err(Error::kube(format!(
            "read PillarVolumeReservation {name:?}"
        )))
    }

    /// Refuses when another volume's claim holds the reservation.
    pub fn check(
        import: &Import,
        owner_volume: &str,
        held: Option<&PillarVolumeReservation>,
    ) -> Result<()> {
        let Some(r) = held else { return Ok(()) };
        if r.spec.owner_volume == owner_volume {
            return Ok(());
        }
        let name = r.name_any();
        Err(Error::FailedPrecondition(format!(
            "{}: {} is reserved by volume {} of claim {}/{} (PillarVolumeReservation {name}); delete that claim first, or, after verifying that claim and its PillarVolumeState no longer exist, release the reservation with `kubectl delete pillarvolumereservation {name}`",
            import.annotation(),
            import.what(),
            r.spec.owner_volume,
            r.spec.claim_ref.namespace,
            r.spec.claim_ref.name,
        )))
    }

    /// Takes the reservation for `owner_volume` of `claim` (already held by
    /// it is fine); another owner's is refused, naming it.
    pub async fn take(
        &self,
        import: &Import,
        agent: &str,
        owner_volume: &str,
        claim: &ClaimRef,
    ) -> Result<PillarVolumeReservation> {
        let id = import.agent_volume_id.to_string();
        let name = name_for(agent, &id);
        let mut wanted = PillarVolumeReservation::new(
            &name,
            PillarVolumeReservationSpec {
                claim_ref: claim.clone(),
                owner_volume: owner_volume.to_owned(),
                agent_ref: agent.to_owned(),
                agent_volume_id: id.clone(),
            },
        );
        wanted.metadata.labels = None;
        let held = match self.api.create(&PostParams::default(), &wanted).await {
            Ok(r) => return Ok(r),
            Err(kube::Error::Api(e)) if e.code == 409 => self.get(agent, &id).await?,
            Err(e) => {
                return Err(Error::kube(format!(
                    "create PillarVolumeReservation {name:?}"
                ))(e))
            }
        };
        let held = held.ok_or_else(|| {
            Error::Aborted(format!(
                "PillarVolumeReservation {name:?} vanished while taken; retry"
            ))
        })?;
        Self::check(import, owner_volume, Some(&held))?;
        Ok(held)
    }

    /// Removes the reservation `state`'s volume holds, if it holds one (a
    /// reservation of another volume stays).
    pub async fn release_for(&self, state: &PillarVolumeState) -> Result<()> {
        let Some(held) = self
            .get(&state.spec.agent_ref, &state.spec.agent_volume_id)
            .await?
        else {
            return Ok(());
        };
        if held.spec.owner_volume != state.name_any() {
            return Ok(());
        }
        let name = held.name_any();
        match self.api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(Error::kube(format!(
                "delete PillarVolumeReservation {name:?}"
            ))(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_valid_and_never_shared_by_two_volumes() {
        let a = name_for("storage-1", "tank/pvc-0d52:x_y.Z");
        assert!(a.len() <= 253, "{a}");
        assert!(
            a.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'),
            "{a}"
        );
        assert!(a.starts_with("storage-1-tank-pvc-0d52-x-y-z-"), "{a}");
        // Only case or punctuation differs: other digests.
        assert_ne!(a, name_for("storage-1", "tank/pvc-0d52:x_y.z"));
        assert_ne!(
            name_for("storage-1", "tank/a_b"),
            name_for("storage-1", "tank/a.b")
        );
        assert_eq!(a, name_for("storage-1", "tank/pvc-0d52:x_y.Z"));
        // Names are durable: the same as every earlier release made.
        assert_eq!(a, "storage-1-tank-pvc-0d52-x-y-z-90d8bbbe98751cc1");
        let long = name_for("s", &format!("tank/{}", "a".repeat(255)));
        assert!(long.len() <= 253, "{}", long.len());
    }
}
