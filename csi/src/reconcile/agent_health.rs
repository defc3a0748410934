//! PillarAgent `Ready`: each pass calls every agent's HealthCheck (and
//! GetCapabilities for `status.agentVersion`) and sets the condition:
//!
//! - `True`, reason `Healthy`: the agent answered and every component
//!   (nvmet, LIO, pools, VGs, its state folder) is healthy;
//! - `False`, reason `Unhealthy`: it answered, naming the unhealthy components;
//! - `False`, reason `Unreachable`: no answer; the message names the
//!   address and the cause.
//!
//! The outcome is also the `pillar_csi_agent_reachable` metric.
use super::{condition_changed, ready_condition, Reconcilers};
use api::crd::PillarAgent;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::ResourceExt;
use pillar_csi_proto::agent::v1 as pb;
use std::collections::BTreeSet;
use std::time::Duration;

/// How long one agent's HealthCheck may take.
pub const TIMEOUT: Duration = Duration::from_secs(10);

impl Reconcilers {
    /// One pass over every PillarAgent; returns how many statuses could
    /// not be written (an unreachable agent is a result, not an error).
    pub async fn agent_health(&self) -> u64 {
        let api = Api::<PillarAgent>::all(self.client.clone());
        let agents = match api.list(&ListParams::default()).await {
            Ok(l) => l.items,
            Err(e) => {
                tracing::warn!(error = %super::with_causes(&e), "list PillarAgents");
                return 1;
            }
        };
        let names: BTreeSet<String> = agents.iter().map(|a| a.name_any()).collect();
        for known in self.metrics.agents().keys() {
            if !names.contains(known) {
                self.metrics.forget_agent(known);
            }
        }
        let mut errors = 0;
        for agent in agents {
            let (healthy, reason, message, version) = self.probe(&agent).await;
            self.metrics.set_agent_reachable(&agent.name_any(), healthy);
            let status = agent.status.clone().unwrap_or_default();
            let condition = ready_condition(
                &status.conditions,
                healthy,
                reason,
                message,
                agent.metadata.generation,
            );
            let version = version.or(status.agent_version.clone());
            if !condition_changed(&status.conditions, &condition) && version == status.agent_version
            {
                continue;
            }
            let patch = serde_json::json!({
                "status": {"conditions": [condition], "agentVersion": version}
            });
            if let Err(e) = api
                .patch_status(
                    &agent.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
            {
                tracing::warn!(agent = %agent.name_any(), error = %super::with_causes(&e), "write PillarAgent status");
                errors += 1;
            }
        }
        errors
    }

    /// `(healthy, reason, message, version)` of one agent.
    async fn probe(&self, agent: &PillarAgent) -> (bool, &'static str, String, Option<String>) {
        let at = format!("{}:{}", agent.spec.address, agent.spec.port);
        let unreachable = |why: String| {
            (
                false,
                "Unreachable",
                format!("HealthCheck of the agent at {at} failed: {why}"),
                None,
            )
        };
        let mut client = match self.agents.client(agent) {
            Ok(c) => c,
            Err(e) => return unreachable(e.to_string()),
        };
        let answer = tokio::time::timeout(
            TIMEOUT,
            client.client.health_check(pb::HealthCheckRequest {}),
        )
        .await;
        let health = match answer {
            Err(_) => return unreachable(format!("no answer within {} s", TIMEOUT.as_secs())),
            Ok(Err(status)) => {
                return unreachable(format!("{:?}: {}", status.code(), status.message()))
            }
            Ok(Ok(r)) => r.into_inner(),
        };
        let version = tokio::time::timeout(
            TIMEOUT,
            client
                .client
                .get_capabilities(pb::GetCapabilitiesRequest {}),
        )
        .await
        .ok()
        .and_then(Result::ok)
        .map(|r| r.into_inner().agent_version)
        .filter(|v| !v.is_empty());
        let sick: Vec<String> = health
            .components
            .iter()
            .filter(|c| !c.healthy)
            .map(|c| format!("{}: {}", c.name, c.message))
            .collect();
        if health.healthy && sick.is_empty() {
            (
                true,
                "Healthy",
                format!(
                    "the agent at {at} answered HealthCheck: {} components healthy",
                    health.components.len()
                ),
                version,
            )
        } else {
            (
                false,
                "Unhealthy",
                format!(
                    "the agent at {at} reports unhealthy components: {}",
                    if sick.is_empty() {
                        "(none named)".to_owned()
                    } else {
                        sick.join("; ")
                    }
                ),
                version,
            )
        }
    }
}
