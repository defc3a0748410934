//! The controller's reconcilers, run by the leader beside the CSI service
//! (level-triggered: each pass reads what is and makes it what should be):
//!
//! - [`storage_class`]: each PillarStorageClass generates and owns its
//!   StorageClass;
//! - [`agent_health`]: each PillarAgent's `Ready` condition from its HealthCheck;
//! - [`resync`]: every recorded export sent again with ReconcileState;
//! - [`reaper`]: the abandoned-volume reaper (records of claims deleted
//!   before their volume was provisioned);
//! - [`leader`]: Lease-based leader election, so only one replica runs them.
//!
//! [`Reconcilers::run`] runs the StorageClass, health and reaper passes
//! every `interval`, and the ReconcileState resync on gaining leadership
//! (controller start) and then every `sync_period`.
pub mod agent_health;
pub mod leader;
pub mod reaper;
pub mod resync;
pub mod storage_class;

use crate::controller::agents::Agents;
use crate::metrics::Metrics;
use api::crd::Condition;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How often the passes run.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    /// StorageClasses, agent health and the reaper.
    pub interval: Duration,
    /// The ReconcileState resync (also run on gaining leadership).
    pub sync_period: Duration,
    /// Whether this controller serves the files identity too: StorageClasses
    /// of filesystem classes are generated only then.
    pub files: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            interval: Duration::from_secs(30),
            sync_period: Duration::from_secs(300),
            files: false,
        }
    }
}

/// The reconcilers of one controller process.
pub struct Reconcilers {
    client: kube::Client,
    agents: Agents,
    metrics: Arc<Metrics>,
    settings: Settings,
}

/// Reconciler names, as the metrics label them.
pub mod names {
    /// [`super::storage_class`].
    pub const STORAGE_CLASSES: &str = "storage-classes";
    /// [`super::agent_health`].
    pub const AGENT_HEALTH: &str = "agent-health";
    /// [`super::resync`].
    pub const RESYNC: &str = "resync";
    /// [`super::reaper`].
    pub const REAPER: &str = "reaper";
}

/// Parses a duration flag: a number with `s`, `m` or `h` (`90s`, `5m`,
/// `1h`), or plain seconds; the error names the value.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let (digits, unit) = match t.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => t.split_at(i),
        None => (t, "s"),
    };
    let n: u64 = digits.parse().map_err(|_| {
        format!("duration {text:?}: expected a number with s, m or h, e.g. 30s or 5m")
    })?;
    let secs = match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => {
            return Err(format!(
                "duration {text:?}: unknown unit {unit:?}; use s, m or h"
            ))
        }
    };
    if secs == 0 {
        return Err(format!("duration {text:?} must be at least 1s"));
    }
    Ok(Duration::from_secs(secs))
}

/// A `Ready` condition; `last_transition_time` is kept from `previous`
/// when the status did not change.
pub fn ready_condition(
    previous: &[Condition],
    ready: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
) -> Condition {
    let status = if ready { "True" } else { "False" };
    let old = previous.iter().find(|c| c.type_ == "Ready");
    let since = match old {
        Some(c) if c.status == status => c.last_transition_time.clone(),
        _ => None,
    };
    Condition {
        type_: "Ready".into(),
        status: status.into(),
        reason: reason.into(),
        message,
        last_transition_time: since
            .or_else(|| Some(k8s_openapi::jiff::Timestamp::now().to_string())),
        observed_generation: generation,
    }
}

/// Whether `new` differs from the `Ready` condition in `previous` in
/// anything but its time.
pub fn condition_changed(previous: &[Condition], new: &Condition) -> bool {
    match previous.iter().find(|c| c.type_ == "Ready") {
        None => true,
        Some(c) => {
            c.status != new.status
                || c.reason != new.reason
                || c.message != new.message
                || c.observed_generation != new.observed_generation
        }
    }
}

impl Reconcilers {
    /// Reconcilers over `client`, reaching agents through `agents`.
    pub fn new(
        client: kube::Client,
        agents: Agents,
        metrics: Arc<Metrics>,
        settings: Settings,
    ) -> Self {
        Reconcilers {
            client,
            agents,
            metrics,
            settings,
        }
    }

    /// The metrics the passes report to.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    async fn counted(&self, name: &str, pass: impl Future<Output = u64>) {
        let errors = pass.await;
        if errors > 0 {
            tracing::warn!(reconciler = name, errors, "reconcile pass left errors");
        }
        self.metrics.pass(name, errors);
    }

    /// One round: StorageClasses, agent health, the resync when `resync`,
    /// then the reaper.
    pub async fn round(&self, resync: bool) {
        self.counted(names::STORAGE_CLASSES, self.storage_classes())
            .await;
        self.counted(names::AGENT_HEALTH, self.agent_health()).await;
        if resync {
            self.counted(names::RESYNC, self.resync()).await;
        }
        self.counted(names::REAPER, self.reap()).await;
    }

    /// Runs rounds while `leading` says so, until its sender is dropped. A
    /// round in progress stops when leadership is lost; leadership gained
    /// (again) starts with a resync.
    pub async fn run(&self, mut leading: watch::Receiver<bool>) {
        let mut last_resync: Option<Instant> = None;
        loop {
            while !*leading.borrow_and_update() {
                self.metrics.set_leader(false);
                last_resync = None;
                if leading.changed().await.is_err() {
                    return;
                }
            }
            self.metrics.set_leader(true);
            let due = last_resync.is_none_or(|t| t.elapsed() >= self.settings.sync_period);
            tokio::select! {
                _ = self.round(due) => {
                    if due {
                        last_resync = Some(Instant::now());
                    }
                }
                gone = lost(&mut leading) => {
                    if gone { return; }
                    continue;
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(self.settings.interval) => {}
                gone = lost(&mut leading) => {
                    if gone { return; }
                }
            }
        }
    }
}

/// Resolves when leadership is lost (false) or the sender is gone (true).
async fn lost(leading: &mut watch::Receiver<bool>) -> bool {
    loop {
        if leading.changed().await.is_err() {
            return true;
        }
        if !*leading.borrow_and_update() {
            return false;
        }
    }
}

/// An error with its causes, `a: b: c`, for the passes' warnings: kube's
/// errors say what failed only in their sources (`client error (Connect)`
/// alone does not tell a refused connection from a refused certificate).
pub fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_warning_names_every_cause() {
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("client error (Connect)")
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let e = Outer(std::io::Error::other(
            "invalid peer certificate: CaUsedAsEndEntity",
        ));
        assert_eq!(
            with_causes(&e),
            "client error (Connect): invalid peer certificate: CaUsedAsEndEntity"
        );
    }

    #[test]
    fn durations_take_units_and_refuse_nonsense() {
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("15"), Ok(Duration::from_secs(15)));
        assert!(parse_duration("0s").is_err_and(|e| e.contains("at least 1s")));
        assert!(parse_duration("5d").is_err_and(|e| e.contains("\"d\"")));
        assert!(parse_duration("m").is_err_and(|e| e.contains("\"m\"")));
    }

    #[test]
    fn a_condition_keeps_its_transition_time_while_its_status_holds() {
        let first = ready_condition(&[], true, "Healthy", "ok".into(), None);
        let mut old = first.clone();
        old.last_transition_time = Some("2026-01-01T00:00:00Z".into());
        let again = ready_condition(&[old.clone()], true, "Healthy", "ok".into(), None);
        assert_eq!(again.last_transition_time, old.last_transition_time);
        assert!(!condition_changed(&[old.clone()], &again));
        let down = ready_condition(&[old.clone()], false, "Unreachable", "x".into(), None);
        assert_ne!(down.last_transition_time, old.last_transition_time);
        assert!(condition_changed(&[old], &down));
    }
}
