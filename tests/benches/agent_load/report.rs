//! The agent load benchmark's report: the figures of both rounds as one
//! set of tables, and the no-growth verdict.
use crate::{Round, Rpc, BASELINE, CLIENTS};
use pillar_csi_lab::{
    bench::{fd_count, ms, percentile},
    Result,
};
use std::time::Duration;

/// RSS after round 2 may be this much above round 1's.
const RSS_SLACK: f64 = 0.10;

/// `b / a`, or NaN for a zero `a`.
fn ratio(b: f64, a: f64) -> f64 {
    if a == 0.0 {
        f64::NAN
    } else {
        b / a
    }
}

/// Prints the whole report as one table per topic.
pub fn report(n: usize, rounds: &[Round; 2], base_up: Duration, base_down: Duration) {
    let [r1, r2] = rounds;
    println!("agent_load: {n} sparse zvols x (create + export NVMe/TCP with ACL + allow one host), {CLIENTS} clients; then deny + unexport + delete");
    println!(
        "  {:<15} {:>27} {:>27} {:>13}",
        "RPC (ms)", "round 1 p50 / p99 / max", "round 2 p50 / p99 / max", "r2/r1 p50 p99"
    );
    for rpc in Rpc::ALL {
        let stats = |r: &Round| {
            let s = r.samples.get(&rpc).map(Vec::as_slice).unwrap_or(&[]);
            [50.0, 99.0, 100.0].map(|p| ms(percentile(s, p)))
        };
        let (a, b) = (stats(r1), stats(r2));
        println!(
            "  {:<15} {:>8.1} {:>8.1} {:>9.1} {:>8.1} {:>8.1} {:>9.1} {:>6.2} {:>6.2}",
            rpc.name(),
            a[0],
            a[1],
            a[2],
            b[0],
            b[1],
            b[2],
            ratio(b[0], a[0]),
            ratio(b[1], a[1])
        );
    }
    println!(
        "  {:<44} {:>10} {:>10} {:>6}",
        "wall time (s)", "round 1", "round 2", "r2/r1"
    );
    let rows = [
        ("create + export + allow, 20 clients", r1.up, r2.up),
        (
            "restart, configfs kept, until serving",
            r1.restart_kept,
            r2.restart_kept,
        ),
        (
            "restart, configfs emptied, until serving",
            r1.restart_emptied,
            r2.restart_emptied,
        ),
        ("deny + unexport + delete, 20 clients", r1.down, r2.down),
    ];
    for (label, a, b) in rows {
        let (a, b) = (a.as_secs_f64(), b.as_secs_f64());
        println!("  {label:<44} {a:>10.1} {b:>10.1} {:>6.2}", ratio(b, a));
    }
    println!(
        "  {:<44} {:>10} {:>10} {:>6} {:>6} {:>6}",
        "agent", "RSS r1 MiB", "RSS r2 MiB", "r2/r1", "fds r1", "fds r2"
    );
    let points = [
        "before the round (r1: fresh)",
        "after create + export + allow",
        "after both restarts (reconciled)",
        "after deny + unexport + delete",
    ];
    for (i, label) in points.iter().enumerate() {
        let (a, b) = (&r1.usage[i], &r2.usage[i]);
        println!(
            "  {label:<44} {:>10.1} {:>10.1} {:>6.2} {:>6} {:>6}",
            a.rss_kib as f64 / 1024.0,
            b.rss_kib as f64 / 1024.0,
            ratio(b.rss_kib as f64, a.rss_kib as f64),
            fd_count(&a.fds),
            fd_count(&b.fds)
        );
    }
    let rate = |count: usize, d: Duration| count as f64 / d.as_secs_f64();
    let base = BASELINE.min(n);
    for (label, load, seq) in [
        ("create + export + allow", r1.up, base_up),
        ("deny + unexport + delete", r1.down, base_down),
    ] {
        println!(
            "  {label}: {:.2} volumes/s with {CLIENTS} clients ({n}, round 1), {:.2} volumes/s with 1 client ({base}): {:.2}x",
            rate(n, load),
            rate(base, seq),
            ratio(rate(n, load), rate(base, seq))
        );
    }
    println!(
        "  per export at restart: {:.1} ms kept, {:.1} ms emptied (round 1)",
        ms(r1.restart_kept) / n as f64,
        ms(r1.restart_emptied) / n as f64
    );
}

/// The no-growth verdict: open descriptors equal at every comparable point
/// of the two rounds, resident memory after the restarts of round 2 within
/// [`RSS_SLACK`] of round 1's.
pub fn verdict(rounds: &[Round; 2]) -> Result<()> {
    let [r1, r2] = rounds;
    let mut problems = Vec::new();
    for i in 1..4 {
        let (a, b) = (&r1.usage[i].fds, &r2.usage[i].fds);
        if fd_count(a) != fd_count(b) {
            problems.push(format!(
                "point {i}: {} fds in round 1 ({a:?}), {} in round 2 ({b:?})",
                fd_count(a),
                fd_count(b)
            ));
        }
    }
    let (a, b) = (r1.usage[2].rss_kib, r2.usage[2].rss_kib);
    if b as f64 > a as f64 * (1.0 + RSS_SLACK) {
        problems.push(format!(
            "resident memory after the restarts grew from {a} KiB to {b} KiB"
        ));
    }
    if problems.is_empty() {
        println!("agent_load: no growth from round 1 to round 2");
        Ok(())
    } else {
        Err(problems.join("; ").into())
    }
}
