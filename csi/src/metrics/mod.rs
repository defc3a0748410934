//! The controller's Prometheus metrics, rendered in the text exposition
//! format on `/metrics` ([`http`]):
//!
//! | name | type | labels | what |
//! | --- | --- | --- | --- |
//! | `pillar_csi_controller_rpc_total` | counter | `method`, `code` | CSI Controller RPCs answered, by gRPC code name (`OK`, `NotFound`, ...) |
//! | `pillar_csi_controller_rpc_duration_seconds` | histogram | `method`, `code` | their latency |
//! | `pillar_csi_agent_rpc_duration_seconds` | histogram | `method`, `code` | agent RPCs the controller and its reconcilers made, until the agent's answer arrived (every agent, by agent RPC method) |
//! | `pillar_csi_agent_reachable` | gauge | `agent` | 1 when the agent's last HealthCheck answered healthy, else 0 |
//! | `pillar_csi_reconcile_passes_total` | counter | `reconciler` | reconcile passes run |
//! | `pillar_csi_reconcile_errors_total` | counter | `reconciler` | objects a pass could not reconcile |
//! | `pillar_csi_leader` | gauge | | 1 while this replica holds the leader Lease (or runs without election) |
//!
//! [`metered::Metered`] counts the RPCs around the Controller service.
pub mod http;
pub mod metered;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

/// Histogram bucket bounds, in seconds.
pub const BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0,
];

#[derive(Default)]
struct Histogram {
    count: u64,
    sum: f64,
    /// Cumulative counts per bound of [`BUCKETS`].
    buckets: [u64; BUCKETS.len()],
}

impl Histogram {
    fn observe(&mut self, took: Duration) {
        let secs = took.as_secs_f64();
        self.count += 1;
        self.sum += secs;
        for (i, bound) in BUCKETS.iter().enumerate() {
            if secs <= *bound {
                self.buckets[i] += 1;
            }
        }
    }
}

/// Histograms by `(method, code)`.
type ByMethodAndCode = BTreeMap<(String, String), Histogram>;

/// Writes the histogram family `name` with its `help` line.
fn render_histograms(out: &mut String, name: &str, help: &str, family: &ByMethodAndCode) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} histogram");
    for ((method, code), h) in family {
        let labels = format!("method=\"{method}\",code=\"{code}\"");
        for (bound, n) in BUCKETS.iter().zip(h.buckets.iter()) {
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {n}");
        }
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", h.count);
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", h.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", h.count);
    }
}

#[derive(Default)]
struct Inner {
    rpcs: ByMethodAndCode,
    agent_rpcs: ByMethodAndCode,
    agents: BTreeMap<String, bool>,
    passes: BTreeMap<String, u64>,
    errors: BTreeMap<String, u64>,
    leader: bool,
}

/// The metrics of one controller process.
#[derive(Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

/// The Prometheus name of a gRPC code, as tonic spells it (`OK` for 0).
pub fn code_name(code: tonic::Code) -> String {
    match code {
        tonic::Code::Ok => "OK".into(),
        other => format!("{other:?}"),
    }
}

impl Metrics {
    fn with<T>(&self, f: impl FnOnce(&mut Inner) -> T) -> T {
        // A poisoned lock only means a panic elsewhere mid-update; the
        // counters stay usable.
        let mut guard = match self.inner.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        f(&mut guard)
    }

    /// Records one answered RPC.
    pub fn observe_rpc(&self, method: &str, code: tonic::Code, took: Duration) {
        self.with(|m| {
            m.rpcs
                .entry((method.to_owned(), code_name(code)))
                .or_default()
                .observe(took)
        });
    }

    /// Records one agent RPC, from its call until the agent's answer.
    pub fn observe_agent_rpc(&self, method: &str, code: tonic::Code, took: Duration) {
        self.with(|m| {
            m.agent_rpcs
                .entry((method.to_owned(), code_name(code)))
                .or_default()
                .observe(took)
        });
    }

    /// Records whether an agent answered its HealthCheck healthy.
    pub fn set_agent_reachable(&self, agent: &str, reachable: bool) {
        self.with(|m| m.agents.insert(agent.to_owned(), reachable));
    }

    /// Forgets an agent whose PillarAgent is gone.
    pub fn forget_agent(&self, agent: &str) {
        self.with(|m| m.agents.remove(agent));
    }

    /// The agents known, with their reachability.
    pub fn agents(&self) -> BTreeMap<String, bool> {
        self.with(|m| m.agents.clone())
    }

    /// Counts one pass of `reconciler` and the objects it failed on.
    pub fn pass(&self, reconciler: &str, errors: u64) {
        self.with(|m| {
            *m.passes.entry(reconciler.to_owned()).or_default() += 1;
            *m.errors.entry(reconciler.to_owned()).or_default() += errors;
        });
    }

    /// The passes `reconciler` has run.
    pub fn passes(&self, reconciler: &str) -> u64 {
        self.with(|m| m.passes.get(reconciler).copied().unwrap_or(0))
    }

    /// Records whether this replica leads.
    pub fn set_leader(&self, leader: bool) {
        self.with(|m| m.leader = leader);
    }

    /// The text exposition format (version 0.0.4).
    pub fn render(&self) -> String {
        self.with(|m| {
            let mut out = String::new();
            let _ = writeln!(
                out,
                "# HELP pillar_csi_controller_rpc_total CSI Controller RPCs answered, by method and gRPC code."
            );
            let _ = writeln!(out, "# TYPE pillar_csi_controller_rpc_total counter");
            for ((method, code), h) in &m.rpcs {
                let _ = writeln!(
                    out,
                    "pillar_csi_controller_rpc_total{{method=\"{method}\",code=\"{code}\"}} {}",
                    h.count
                );
            }
            render_histograms(
                &mut out,
                "pillar_csi_controller_rpc_duration_seconds",
                "CSI Controller RPC latency, by method and gRPC code.",
                &m.rpcs,
            );
            render_histograms(
                &mut out,
                "pillar_csi_agent_rpc_duration_seconds",
                "Agent RPC latency seen by the controller, by agent method and gRPC code.",
                &m.agent_rpcs,
            );
            let _ = writeln!(
                out,
                "# HELP pillar_csi_agent_reachable 1 when the agent's last HealthCheck answered healthy."
            );
            let _ = writeln!(out, "# TYPE pillar_csi_agent_reachable gauge");
            for (agent, up) in &m.agents {
                let _ = writeln!(
                    out,
                    "pillar_csi_agent_reachable{{agent=\"{}\"}} {}",
                    escape(agent),
                    u8::from(*up)
                );
            }
            let _ = writeln!(
                out,
                "# HELP pillar_csi_reconcile_passes_total Reconcile passes run, by reconciler."
            );
            let _ = writeln!(out, "# TYPE pillar_csi_reconcile_passes_total counter");
            for (r, n) in &m.passes {
                let _ = writeln!(
                    out,
                    "pillar_csi_reconcile_passes_total{{reconciler=\"{r}\"}} {n}"
                );
            }
            let _ = writeln!(
                out,
                "# HELP pillar_csi_reconcile_errors_total Objects a reconcile pass could not reconcile."
            );
            let _ = writeln!(out, "# TYPE pillar_csi_reconcile_errors_total counter");
            for (r, n) in &m.errors {
                let _ = writeln!(
                    out,
                    "pillar_csi_reconcile_errors_total{{reconciler=\"{r}\"}} {n}"
                );
            }
            let _ = writeln!(
                out,
                "# HELP pillar_csi_leader 1 while this replica runs the reconcilers."
            );
            let _ = writeln!(out, "# TYPE pillar_csi_leader gauge");
            let _ = writeln!(out, "pillar_csi_leader {}", u8::from(m.leader));
            out
        })
    }
}

/// A label value with `\`, `"` and newlines escaped.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rpcs_are_counted_by_method_and_code_with_cumulative_buckets() {
        let m = Metrics::default();
        m.observe_rpc("CreateVolume", tonic::Code::Ok, Duration::from_millis(20));
        m.observe_rpc("CreateVolume", tonic::Code::Ok, Duration::from_secs(3));
        m.observe_rpc(
            "CreateVolume",
            tonic::Code::InvalidArgument,
            Duration::from_millis(1),
        );
        m.set_agent_reachable("storage-\"1\"", false);
        let text = m.render();
        assert!(
            text.contains(
                "pillar_csi_controller_rpc_total{method=\"CreateVolume\",code=\"OK\"} 2\n"
            ),
            "{text}"
        );
        assert!(text.contains(
            "pillar_csi_controller_rpc_total{method=\"CreateVolume\",code=\"InvalidArgument\"} 1\n"
        ));
        assert!(text.contains("pillar_csi_controller_rpc_duration_seconds_bucket{method=\"CreateVolume\",code=\"OK\",le=\"0.025\"} 1\n"));
        assert!(text.contains("pillar_csi_controller_rpc_duration_seconds_bucket{method=\"CreateVolume\",code=\"OK\",le=\"10\"} 2\n"));
        assert!(text.contains("pillar_csi_agent_reachable{agent=\"storage-\\\"1\\\"\"} 0\n"));
        assert!(!text.contains("pillar_csi_agent_rpc_duration_seconds_count"));
        m.observe_agent_rpc("CreateVolume", tonic::Code::Ok, Duration::from_millis(250));
        m.observe_agent_rpc("CreateVolume", tonic::Code::Ok, Duration::from_millis(750));
        let text = m.render();
        assert!(text.contains(
            "pillar_csi_agent_rpc_duration_seconds_sum{method=\"CreateVolume\",code=\"OK\"} 1\n"
        ));
        assert!(text.contains("pillar_csi_agent_rpc_duration_seconds_bucket{method=\"CreateVolume\",code=\"OK\",le=\"0.25\"} 1\n"));
    }
}
