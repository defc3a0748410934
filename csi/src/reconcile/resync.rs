//! The ReconcileState resync: for each PillarAgent, the recorded export of
//! every volume it holds is sent again with ReconcileState, so an export
//! lost on the storage node (configfs is volatile; an operator removed it)
//! is made again with its recorded ACL. Each export carries the record's
//! fence token (its UID and `status.publicationGeneration`), so the agent
//! refuses a record that is no longer the volume's owner.
//!
//! Sent: records that are `Ready`, not being deleted, not in a recovery
//! (`spec.recovery` or `RecoveryPending`), with a `spec.exportSpec` and a
//! publication generation above 0 (the volume was exported by
//! ControllerPublishVolume at least once; a volume never published has no
//! export to restore, and an export made for it would serve nobody's
//! publication). The allowed initiators are `spec.exportSpec.allowedInitiators`
//! (the published nodes' host NQNs or IQNs, written by publish and unpublish).
use super::Reconcilers;
use crate::controller::{protocol_type, state};
use api::crd::{PillarAgent, PillarVolumeState, VolumePhase};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::ResourceExt;
use pillar_csi_proto::agent::v1 as pb;
use std::collections::BTreeMap;

/// The export a record wants its agent to keep, if it is to be resynced.
pub fn desired_export(record: &PillarVolumeState) -> Option<pb::DesiredExport> {
    let status = record.status.clone().unwrap_or_default();
    if record.spec.recovery.is_some()
        || status.phase != Some(VolumePhase::Ready)
        || status.deleting == Some(true)
        || state::generation(record) == 0
    {
        return None;
    }
    let spec = record.spec.export_spec.as_ref()?;
    Some(pb::DesiredExport {
        volume_id: record.spec.agent_volume_id.clone(),
        protocol_type: protocol_type(record.spec.protocol_type),
        fence: Some(state::fence(record, state::generation(record))),
        acl_enabled: spec.acl_enabled,
        allowed_initiators: spec.allowed_initiators.clone(),
        // The controller exports without CHAP (publish.rs), so the export
        // it restores has none either.
        chap: None,
    })
}

impl Reconcilers {
    /// One resync of every agent; returns the number of agents that could
    /// not be reached plus the exports they refused.
    pub async fn resync(&self) -> u64 {
        let agents = match Api::<PillarAgent>::all(self.client.clone())
            .list(&ListParams::default())
            .await
        {
            Ok(l) => l.items,
            Err(e) => {
                tracing::warn!(error = %super::with_causes(&e), "resync: list PillarAgents");
                return 1;
            }
        };
        let records = match Api::<PillarVolumeState>::all(self.client.clone())
            .list(&ListParams::default())
            .await
        {
            Ok(l) => l.items,
            Err(e) => {
                tracing::warn!(error = %super::with_causes(&e), "resync: list PillarVolumeStates");
                return 1;
            }
        };
        let mut by_agent: BTreeMap<String, Vec<(&PillarVolumeState, pb::DesiredExport)>> =
            BTreeMap::new();
        for record in &records {
            if let Some(export) = desired_export(record) {
                by_agent
                    .entry(record.spec.agent_ref.clone())
                    .or_default()
                    .push((record, export));
            }
        }
        let mut errors = 0;
        for agent in agents {
            let Some(sent) = by_agent.remove(&agent.name_any()) else {
                continue;
            };
            let count = sent.len();
            let exports = sent.iter().map(|(_, e)| e.clone()).collect();
            let mut client = match self.agents.client(&agent) {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(agent = %agent.name_any(), error = %super::with_causes(&e), "resync");
                    errors += 1;
                    continue;
                }
            };
            match client
                .client
                .reconcile_state(pb::ReconcileStateRequest { exports })
                .await
            {
                Ok(answer) => {
                    let answer = answer.into_inner();
                    for refused in &answer.refused {
                        tracing::warn!(agent = %agent.name_any(), refused, "resync: export refused");
                    }
                    tracing::info!(
                        agent = %agent.name_any(),
                        sent = count,
                        applied = answer.repaired,
                        refused = answer.refused.len(),
                        "resync"
                    );
                    errors += answer.refused.len() as u64;
                    self.show_refusals(&agent.name_any(), &sent, &answer.refusals)
                        .await;
                }
                Err(status) => {
                    tracing::warn!(agent = %agent.name_any(), code = ?status.code(), message = status.message(), "resync: ReconcileState failed");
                    errors += 1;
                }
            }
        }
        for (agent, exports) in by_agent {
            tracing::warn!(
                agent,
                exports = exports.len(),
                "resync: records name a PillarAgent that does not exist"
            );
            errors += 1;
        }
        errors
    }

    /// Shows each refusal on its volume's record (`status.message`), and
    /// clears the message of an earlier resync from a record whose export
    /// was made this time. A record that cannot be written is logged.
    async fn show_refusals(
        &self,
        agent: &str,
        sent: &[(&PillarVolumeState, pb::DesiredExport)],
        refusals: &[pb::RefusedExport],
    ) {
        let api = Api::<PillarVolumeState>::all(self.client.clone());
        for (record, export) in sent {
            let refused = refusals.iter().find(|r| r.volume_id == export.volume_id);
            let shown = record.status.as_ref().and_then(|s| s.message.as_deref());
            let wanted = refused.map(|r| refusal_message(agent, &r.message));
            let stale = shown.is_some_and(|m| m.starts_with(REFUSAL_PREFIX));
            if wanted.as_deref() == shown || (wanted.is_none() && !stale) {
                continue;
            }
            let patch = serde_json::json!({"status": {"message": wanted}});
            if let Err(e) = api
                .patch_status(
                    &record.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
            {
                tracing::warn!(volume = %record.name_any(), error = %super::with_causes(&e), "resync: could not write the refusal on the record");
            }
        }
    }
}

/// How a resync's refusal starts on a record's `status.message`.
const REFUSAL_PREFIX: &str = "resync: ";

/// The record's message for a refusal of `agent`.
fn refusal_message(agent: &str, why: &str) -> String {
    format!("{REFUSAL_PREFIX}agent {agent} could not restore the export: {why}")
}
