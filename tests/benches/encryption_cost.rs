//! Benchmark in the kernel lab: what per-volume encryption costs, so users
//! know before they choose it. In one run, against one agent with a
//! key-encryption key:
//! - create + export of a 64 MiB zvol over NVMe/TCP, encrypted against
//!   plain, alternating one of each so drift hits both alike;
//! - sequential writes through NVMe/TCP to a staged raw block volume, one
//!   encrypted and one plain zvol of the same size, alternating: `dd` of
//!   random data (incompressible, so ZFS compresses nothing away) in 1 MiB
//!   direct writes, flushed at the end.
//!
//! Run with `make bench FILTER=encryption_cost`. Under TCG the guest's
//! AES is emulated: the ratios are what the result is, and a host with
//! AES-NI pays less.
use pillar_csi_lab::{
    bench::{conditions, ms, percentile, selected},
    node_bed::*,
    run, Lab, Result,
};
use std::time::{Duration, Instant};

/// Volumes of each kind created, and writes of each kind.
const ROUNDS: usize = 8;
/// The size of the created volumes.
const SMALL: u64 = 64 << 20;
/// The size of the written volumes, and how much each write round writes.
const LARGE: u64 = 128 << 20;
const WRITE_MIB: u64 = 64;

/// `dd` of `source` onto the block device at `target`: MiB per second.
fn write_rate(source: &str, target: &str) -> Result<f64> {
    let start = Instant::now();
    run(
        "dd",
        &[
            &format!("if={source}"),
            &format!("of={target}"),
            "bs=1M",
            &format!("count={WRITE_MIB}"),
            "oflag=direct",
            "conv=fsync,notrunc",
            "status=none",
        ],
    )?;
    Ok(WRITE_MIB as f64 / start.elapsed().as_secs_f64())
}

fn median_rate(rates: &mut [f64]) -> f64 {
    rates.sort_by(f64::total_cmp);
    rates[rates.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> Result<()> {
    if !selected("encryption_cost") {
        return Ok(());
    }
    let lab = Lab::get();
    let (kek, _) = key_encryption_key_file(&lab, "bench-kek")?;
    let mut b = Bench::with_agent_args("bench-enc", key_encryption_key_args(&kek)).await?;
    println!("encryption_cost: {}", conditions());

    // Create + export, alternating which kind goes first.
    let (mut plain, mut sealed) = (Vec::new(), Vec::new());
    let mut made = Vec::new();
    for round in 0..ROUNDS {
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for encrypted in order {
            let start = Instant::now();
            let v = if encrypted {
                b.encrypted_zvol(NVME, SMALL).await?
            } else {
                b.volume(ZVOL, NVME, SMALL).await?
            };
            let took = start.elapsed();
            if encrypted {
                sealed.push(took);
            } else {
                plain.push(took);
            }
            made.push(v);
        }
    }
    for v in &made {
        b.delete(v).await?;
    }
    let median = |d: &[Duration]| percentile(d, 50.0);
    let (p, s) = (median(&plain), median(&sealed));
    let create_line = format!(
        "create + export ({ROUNDS} each, median): plain {:.0} ms, encrypted {:.0} ms, encrypted / plain {:.2}x",
        ms(p),
        ms(s),
        s.as_secs_f64() / p.as_secs_f64()
    );
    println!("{create_line}");

    // Sequential writes through NVMe/TCP to a staged raw block volume.
    let source = lab.work.join("bench-random");
    run(
        "dd",
        &[
            "if=/dev/urandom",
            &format!("of={}", source.display()),
            "bs=1M",
            &format!("count={WRITE_MIB}"),
            "status=none",
        ],
    )?;
    let source = source.display().to_string();
    let mut n = b.plugin.node().await?;
    let mut targets = Vec::new();
    for encrypted in [false, true] {
        let v = if encrypted {
            b.encrypted_zvol(NVME, LARGE).await?
        } else {
            b.volume(ZVOL, NVME, LARGE).await?
        };
        let (staging, target) = (b.path("staging"), b.path("target"));
        n.node_stage_volume(stage_req(&v, &staging, block_cap()))
            .await?;
        n.node_publish_volume(publish_req(&v, &staging, &target, block_cap(), false))
            .await?;
        targets.push((v, staging, target));
    }
    let (mut plain_rates, mut sealed_rates) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS / 2 {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let rate = write_rate(&source, &targets[i].2.display().to_string())?;
            if i == 1 {
                sealed_rates.push(rate);
            } else {
                plain_rates.push(rate);
            }
        }
    }
    for (v, staging, target) in &targets {
        n.node_unpublish_volume(unpublish_req(v, target)).await?;
        n.node_unstage_volume(unstage_req(v, staging)).await?;
        b.delete(v).await?;
    }
    let (pr, sr) = (
        median_rate(&mut plain_rates),
        median_rate(&mut sealed_rates),
    );
    let write_line = format!(
        "sequential write through NVMe/TCP ({} rounds of {WRITE_MIB} MiB, median): plain {pr:.1} MiB/s, encrypted {sr:.1} MiB/s, encrypted / plain {:.2}x",
        ROUNDS / 2,
        sr / pr
    );
    println!("{write_line}");
    std::fs::write(
        lab.work.join("encryption-bench.txt"),
        format!("{}\n{create_line}\n{write_line}\n", conditions()),
    )?;
    Ok(())
}
