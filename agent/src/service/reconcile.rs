//! Restart and periodic reconciliation from the marks, and ReconcileState.
use super::{blocking, Agent};
use crate::{
    error::AgentError,
    export::Protocol,
    fence::Token,
    marks::ExportRecord,
    volume::{truncate, VolumeId},
};
use std::sync::Arc;
use tokio::{sync::Semaphore, task::JoinSet};
use tracing::warn;

/// How many volumes are reconciled at once: a volume whose device node is
/// slow to appear does not hold up the others.
const RECONCILE_PARALLEL: usize = 16;

/// The outcome of re-creating exports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// Exports applied (created, repaired or already in place).
    pub applied: u32,
    /// Volumes or exports that could not be handled, with the reason.
    pub failed: Vec<String>,
    /// ReconcileState's refusals: each volume ID, whole, with the reason.
    pub refusals: Vec<(String, String)>,
}

impl Agent {
    /// Re-creates every recorded export of live lifecycles (after a restart,
    /// and periodically), several volumes at once. Removes nothing; a corrupt
    /// mark is reported and its volume left alone.
    pub async fn reconcile_from_marks(self: &Arc<Self>) -> Result<Reconciled, AgentError> {
        let marks = self.marks.clone();
        let ids = blocking(move || Ok(marks.volume_ids()?)).await?;
        let permits = Arc::new(Semaphore::new(RECONCILE_PARALLEL));
        let mut tasks = JoinSet::new();
        for raw in ids {
            let (agent, permits) = (self.clone(), permits.clone());
            tasks.spawn(async move {
                let _permit = permits.acquire_owned().await;
                let result = agent.reconcile_one(&raw).await;
                (raw, result)
            });
        }
        let mut out = Reconciled::default();
        while let Some(joined) = tasks.join_next().await {
            match joined? {
                (_, Ok(n)) => out.applied += n,
                (raw, Err(e)) => {
                    warn!(volume = %raw, error = %e, "could not reconcile exports");
                    out.failed.push(format!("{raw}: {e}"));
                }
            }
        }
        out.failed.sort();
        Ok(out)
    }

    /// Re-applies the recorded exports of one volume, under its lock.
    async fn reconcile_one(&self, raw: &str) -> Result<u32, AgentError> {
        let id = VolumeId::parse(raw)?;
        let _guard = self.locks.lock(id.as_str()).await;
        let (marks, key) = (self.marks.clone(), raw.to_owned());
        let Some(mark) = blocking(move || Ok(marks.load(&key)?)).await? else {
            return Ok(0);
        };
        let applied = match (&mark.fence.live, &mark.backend) {
            (Some(_), Some(location)) => self.export_all(&id, location, &mark).await?,
            _ => 0,
        };
        crate::crash::point("reconcile-volume-done");
        Ok(applied)
    }

    /// ReconcileState: the controller's desired exports, each admitted by its token.
    pub async fn reconcile_exports(
        self: &Arc<Self>,
        desired: Vec<(String, Protocol, ExportRecord, Option<Token>)>,
    ) -> Reconciled {
        let mut out = Reconciled::default();
        for (id, protocol, record, token) in desired {
            match self
                .export_volume(&id, None, protocol, record, token.as_ref())
                .await
            {
                Ok(_) => out.applied += 1,
                Err(e) => {
                    out.failed.push(format!("{}: {e}", truncate(&id)));
                    out.refusals.push((id, e.to_string()));
                }
            }
        }
        out
    }
}
