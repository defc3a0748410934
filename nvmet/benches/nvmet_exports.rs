//! Benchmark in the kernel lab: 500 NVMe exports applied and read back through
//! this crate, against the same objects written by per-object shell commands
//! (mkdir / echo / ln, as a hand-written script or nvmetcli's users do).
//!
//! Run with `make bench FILTER=nvmet`. Absolute times under TCG mean little;
//! the ratios and the per-export cost at each size (linearity) are the result.
//!
//! Read-back is measured at 100, 250 and 500 exports in the same run, on the
//! way up (as exports are applied) and on the way down (as they are torn
//! down). The lab guest shares a loaded 2-core host, so one timing can be
//! inflated several times by the host alone: our reads are timed in samples
//! of equal work (5 reads of 100 exports, 2 of 250, 1 of 500), repeated, the
//! best and the median of each pass are reported, and linearity is judged on
//! the best of both passes. The shell peer's reads take minutes, so they run
//! once, at 100 and 250 exports, and at 500 only when that fits a time box.
//!
//! Then the floor and the peers run the way the CSI drivers serve requests:
//! one export and one unexport as the agent makes them (its calls into this
//! crate per ExportVolume / UnexportVolume) against the same objects made
//! bare in-process (`std::fs` calls only: the kernel's work), in
//! alternating blocks; one `bash` process per export, one after another
//! (a CLI driver serving requests in turn) and `CONCURRENT` at once (a CLI
//! driver serving concurrent requests), against ours from as many threads.
use nvmet::{Namespace, Nqn, Nsid, Nvmet, Port, PortId, State, Step, Subsystem, Teardown};
use pillar_csi_lab::{bench, block::wait_for, run, Lab, Result};
use std::{
    fmt::Write as _,
    net::{Ipv4Addr, SocketAddr},
    path::Path,
    time::{Duration, Instant},
};

const EXPORTS: usize = 500;
const PORT: PortId = PortId(30);
/// Sizes at which the state is read back.
const SIZES: [usize; 3] = [100, 250, EXPORTS];
/// Repeats of each of our reads (best and median reported).
const REPEATS: usize = 5;
/// The longest the shell peer's read at 500 may be expected to take (twice
/// its read at 250) for it to run.
const SHELL_READ_BOX: Duration = Duration::from_secs(240);

fn nqn(i: usize) -> Result<Nqn> {
    Ok(Nqn::new(&format!(
        "nqn.2026-01.com.bhyoo.pillar-csi.bench:vol{i}"
    ))?)
}

fn one_export(i: usize, device: &str) -> Result<State> {
    export_state(&nqn(i)?, device)
}

/// The state the agent applies for one export (agent/src/export/nvmeof.rs):
/// subsystem `name` admitting any host with namespace 1 on `device`, and
/// its link on the shared port.
fn export_state(name: &Nqn, device: &str) -> Result<State> {
    let mut sub = Subsystem {
        allow_any_host: true,
        ..Default::default()
    };
    sub.namespaces.insert(
        Nsid::new(1)?,
        Namespace {
            device_path: device.into(),
            enabled: true,
            ..Default::default()
        },
    );
    // The address built, not parsed, as the agent builds it.
    let mut port = Port::tcp(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 4430));
    // Each export adds its link; the other exports' links stay.
    port.subsystems.insert(name.clone());
    let mut state = State::default();
    state.subsystems.insert(name.clone(), sub);
    state.ports.insert(PORT, port);
    Ok(state)
}

/// The steps of one export on port `PORT` (which exists): subsystem `name`
/// admitting any host, namespace 1 on `device` enabled, the port's link.
fn export_steps(name: &Nqn, device: &str) -> Vec<Step> {
    let dir = format!("subsystems/{name}");
    vec![
        Step::mkdir(&dir),
        Step::write(format!("{dir}/attr_allow_any_host"), "1"),
        Step::mkdir(format!("{dir}/namespaces/1")),
        Step::write(format!("{dir}/namespaces/1/device_path"), device),
        Step::write(format!("{dir}/namespaces/1/enable"), "1"),
        Step::symlink(&dir, format!("ports/{PORT}/subsystems/{name}")),
    ]
}

/// The steps that remove an export of [`export_steps`], in the kernel's
/// order (the ones this crate's teardown takes).
fn unexport_steps(name: &Nqn) -> Vec<Step> {
    let dir = format!("subsystems/{name}");
    vec![
        Step::unlink(format!("ports/{PORT}/subsystems/{name}")),
        Step::write(format!("{dir}/namespaces/1/enable"), "0"),
        Step::rmdir(format!("{dir}/namespaces/1")),
        Step::rmdir(dir),
    ]
}

fn port_steps() -> Vec<Step> {
    let dir = format!("ports/{PORT}");
    vec![
        Step::mkdir(&dir),
        Step::write(format!("{dir}/addr_trtype"), "tcp"),
        Step::write(format!("{dir}/addr_adrfam"), "ipv4"),
        Step::write(format!("{dir}/addr_traddr"), "127.0.0.1"),
        Step::write(format!("{dir}/addr_trsvcid"), "4430"),
    ]
}

fn shell_script(device: &str, range: std::ops::Range<usize>) -> Result<String> {
    let mut steps = if range.start == 0 {
        port_steps()
    } else {
        Vec::new()
    };
    for i in range {
        steps.extend(export_steps(&nqn(i)?, device));
    }
    bench::shell_script(Path::new(nvmet::DEFAULT_ROOT), &steps)
}

const SHELL_READ: &str = r#"cd /sys/kernel/config/nvmet
for s in subsystems/*; do
  cat "$s/attr_allow_any_host" "$s/attr_serial" "$s/attr_model" >/dev/null
  for n in "$s"/namespaces/*; do cat "$n/device_path" "$n/device_uuid" "$n/device_nguid" "$n/enable" >/dev/null; done
  ls "$s/allowed_hosts" >/dev/null
done
for p in ports/*; do
  cat "$p/addr_trtype" "$p/addr_traddr" "$p/addr_trsvcid" >/dev/null
  for l in "$p"/subsystems/*; do readlink "$l" >/dev/null; done
done
"#;

fn bash(script: &str) -> Result<Duration> {
    bench::bash(script)
}

fn ms(d: Duration) -> f64 {
    bench::ms(d)
}

/// Reads the whole state back in `REPEATS` samples, checking it holds `size`
/// exports; the time per read of each sample, fastest first.
///
/// A sample is 500 exports' worth of reading (5 reads at 100, 2 at 250, 1 at
/// 500), so that every sample lasts about as long whatever the size: a
/// longer sample is more likely to be hit by a burst of host load, which
/// would bias the best of the samples at the larger sizes upwards.
fn ours_read(target: &Nvmet, size: usize) -> Result<Vec<Duration>> {
    let reads_per_sample = u32::try_from(EXPORTS / size)?;
    let mut times = Vec::with_capacity(REPEATS);
    for _ in 0..REPEATS {
        let start = Instant::now();
        for _ in 0..reads_per_sample {
            let read = target.read()?;
            let linked = read.ports.get(&PORT).map_or(0, |p| p.subsystems.len());
            if read.subsystems.len() != size || linked != size {
                return Err(format!(
                    "read back {} subsystems and {linked} port links, expected {size}",
                    read.subsystems.len()
                )
                .into());
            }
        }
        times.push(start.elapsed() / reads_per_sample);
    }
    times.sort();
    Ok(times)
}

/// The mean time of `f` over `n` calls, in microseconds.
fn micros(n: u32, mut f: impl FnMut() -> std::io::Result<()>) -> Result<f64> {
    let start = Instant::now();
    for _ in 0..n {
        f()?;
    }
    Ok(start.elapsed().as_secs_f64() * 1e6 / f64::from(n))
}

/// The two parts, each selected by the filter on its own name
/// (`nvmet_exports` selects both): the 500 exports and their read-back, and
/// the floor and the peers.
fn main() -> Result<()> {
    let scale = bench::selected("nvmet_exports_500");
    let floor = bench::selected("nvmet_exports_floor");
    if !scale && !floor {
        return Ok(());
    }
    println!("nvmet_exports: {}", bench::conditions());
    let lab = Lab::get();
    let ds = format!("{}/{}", lab.pool, lab.unique("bench-nvmet"));
    run("zfs", &["create", "-V", "16M", &ds])?;
    let device = format!("/dev/zvol/{ds}");
    wait_for(device.as_ref(), Duration::from_secs(20))?;
    let target = Nvmet::open()?;
    if scale {
        at_scale(&target, &device)?;
    }
    if floor {
        floor_and_peers(&target, &device)?;
    }
    println!("nvmet_exports: done; {}", bench::conditions());
    run("zfs", &["destroy", &ds])?;
    Ok(())
}

/// 500 exports applied and read back, by us and by the shell peer.
fn at_scale(target: &Nvmet, device: &str) -> Result<()> {
    let half = EXPORTS / 2;

    // Ours: one apply per export, as the agent exports volumes one by one;
    // the state is read back (untimed for the apply) at each size on the way
    // up, and again on the way down as the exports are torn down in three
    // steps, so that a change of the host's load during the run shows as a
    // difference between the two passes rather than as a size effect.
    let mut ours_halves = [Duration::ZERO; 2];
    let mut rising = Vec::new();
    for i in 0..EXPORTS {
        let desired = one_export(i, device)?;
        let start = Instant::now();
        target.apply(&desired)?;
        ours_halves[i / half] += start.elapsed();
        if SIZES.contains(&(i + 1)) {
            rising.push(ours_read(target, i + 1)?);
        }
    }
    // The kernel's own lookup: a file of the first subsystem created against
    // one of the last, with 500 subsystems present, in alternating rounds.
    let attr = |i: usize| -> Result<String> {
        Ok(format!(
            "/sys/kernel/config/nvmet/subsystems/{}/attr_allow_any_host",
            nqn(i)?
        ))
    };
    let (first, last) = (attr(0)?, attr(EXPORTS - 1)?);
    let (mut lookup_first, mut lookup_last) = (f64::MAX, f64::MAX);
    for _ in 0..10 {
        lookup_first = lookup_first.min(micros(200, || std::fs::read(&first).map(drop))?);
        lookup_last = lookup_last.min(micros(200, || std::fs::read(&last).map(drop))?);
    }
    let mut falling = vec![Vec::new(); SIZES.len()];
    let mut ours_teardown = Duration::ZERO;
    for k in (0..SIZES.len()).rev() {
        let from = if k == 0 { 0 } else { SIZES[k - 1] };
        let down = Teardown {
            subsystems: (from..SIZES[k]).map(nqn).collect::<Result<_>>()?,
            ports: if k == 0 {
                [PORT].into()
            } else {
                Default::default()
            },
            hosts: Default::default(),
        };
        let start = Instant::now();
        target.teardown(&down)?;
        ours_teardown += start.elapsed();
        if k > 0 {
            falling[k - 1] = ours_read(target, SIZES[k - 1])?;
        }
    }
    // At 500 the two passes are one: the falling pass has what the rising had.
    falling[SIZES.len() - 1] = rising[SIZES.len() - 1].clone();
    let all = Teardown {
        subsystems: (0..EXPORTS).map(nqn).collect::<Result<_>>()?,
        ports: [PORT].into(),
        hosts: Default::default(),
    };

    // The shell peer: the same exports in the same halves (the first half in
    // two scripts, to read back at 100), read back by a shell loop.
    let mut shell_halves = [Duration::ZERO; 2];
    let mut shell_reads: Vec<Option<Duration>> = Vec::new();
    let mut made = 0;
    for size in SIZES {
        shell_halves[made / half] += bash(&shell_script(device, made..size)?)?;
        made = size;
        let boxed = match shell_reads.last() {
            Some(Some(prev)) => *prev * 2 > SHELL_READ_BOX,
            _ => false,
        };
        shell_reads.push(if size == EXPORTS && boxed {
            None
        } else {
            Some(bash(SHELL_READ)?)
        });
    }
    let check = target.read()?;
    if check.subsystems.len() != EXPORTS {
        return Err("the shell script did not create every export".into());
    }
    target.teardown(&all)?;

    let ours = ours_halves[0] + ours_halves[1];
    let shell = shell_halves[0] + shell_halves[1];
    println!("nvmet_exports: {EXPORTS} NVMe/TCP exports (subsystem, namespace, port link)");
    println!(
        "  apply  ours {:8.1} ms ({:.2} ms/export; first half {:.2}, second half {:.2})",
        ms(ours),
        ms(ours) / EXPORTS as f64,
        ms(ours_halves[0]) / half as f64,
        ms(ours_halves[1]) / half as f64
    );
    println!(
        "  apply  shell {:7.1} ms ({:.2} ms/export; first half {:.2}, second half {:.2})",
        ms(shell),
        ms(shell) / EXPORTS as f64,
        ms(shell_halves[0]) / half as f64,
        ms(shell_halves[1]) / half as f64
    );
    let per = |d: Duration, size: usize| ms(d) / size as f64;
    let median = |t: &[Duration]| t[t.len() / 2];
    let mut line = format!(
        "  read   ours  ms/export, best (median) of {REPEATS} samples of {EXPORTS} exports' worth, rising pass then falling pass"
    );
    for (k, size) in SIZES.iter().enumerate() {
        write!(
            line,
            " | {size}: {:.3} ({:.3}), {:.3} ({:.3})",
            per(rising[k][0], *size),
            per(median(&rising[k]), *size),
            per(falling[k][0], *size),
            per(median(&falling[k]), *size)
        )?;
    }
    println!("{line}");
    // The best of both passes at each size: the least disturbed by the host.
    let best: Vec<Duration> = (0..SIZES.len())
        .map(|k| rising[k][0].min(falling[k][0]))
        .collect();
    let mut line = String::from("  read   ours  best of both passes");
    for (k, size) in SIZES.iter().enumerate() {
        write!(
            line,
            " | {size}: {:.1} ms, {:.3} ms/export",
            ms(best[k]),
            per(best[k], *size)
        )?;
    }
    println!("{line}");
    let mut line = String::from("  read   shell (once)");
    for (size, r) in SIZES.iter().zip(&shell_reads) {
        match r {
            Some(d) => write!(
                line,
                " | {size}: {:.1} ms, {:.3} ms/export",
                ms(*d),
                per(*d, *size)
            )?,
            None => write!(
                line,
                " | {size}: skipped (over the {} s box)",
                SHELL_READ_BOX.as_secs()
            )?,
        }
    }
    println!("{line}");
    // Per-export cost at one size over the one before: 1.00 is linear.
    let growth = |a: usize, b: usize, cost: &dyn Fn(usize) -> Option<f64>| match (cost(a), cost(b))
    {
        (Some(x), Some(y)) => format!("{:.2}", y / x),
        _ => "-".to_owned(),
    };
    let ours_best = |k: usize| Some(per(best[k], SIZES[k]));
    let shell_cost = |k: usize| shell_reads[k].map(|d| per(d, SIZES[k]));
    println!(
        "  read   linearity, per-export cost 250/100 and 500/250 (1.00 = linear): ours (best of both passes) {} {}; shell {} {}",
        growth(0, 1, &ours_best),
        growth(1, 2, &ours_best),
        growth(0, 1, &shell_cost),
        growth(1, 2, &shell_cost)
    );
    println!(
        "  kernel lookup at {EXPORTS}, best of 10 alternating rounds: open+read attr_allow_any_host of the first subsystem {lookup_first:.1} us, of the last {lookup_last:.1} us (last/first {:.2})",
        lookup_last / lookup_first
    );
    println!(
        "  teardown ours {:.1} ms ({:.2} ms/export, in three steps: 250, 150, 100)",
        ms(ours_teardown),
        ms(ours_teardown) / EXPORTS as f64
    );
    let read_vs = |k: usize| {
        shell_reads[k].map_or("-".to_owned(), |d| format!("{:.2}x", ms(d) / ms(best[k])))
    };
    println!(
        "  ratio shell/ours: apply {:.2}x, read at 100 {}, at 250 {}, at 500 {}; apply linearity (second half / first half per export): ours {:.2}, shell {:.2}",
        ms(shell) / ms(ours),
        read_vs(0),
        read_vs(1),
        read_vs(2),
        ms(ours_halves[1]) / ms(ours_halves[0]),
        ms(shell_halves[1]) / ms(shell_halves[0]),
    );
    Ok(())
}

/// Blocks of the floor comparison, and exports in each block: an export
/// takes about a millisecond in the lab, so many short blocks, compared in
/// pairs.
const BLOCKS: usize = 40;
const PER_BLOCK: usize = 5;
/// Exports made at once by the concurrent peer and by ours.
const CONCURRENT: usize = 50;
const BENCH_NQN: &str = "nqn.2026-01.com.bhyoo.pillar-csi.bench:";

/// The exports of the floor and peer part: subsystem `<set>-<k>` on the
/// zvol, linked to port `PORT`.
struct Exports<'a> {
    target: &'a Nvmet,
    device: &'a str,
    /// The port check the agent's exporter keeps.
    port_check: nvmet::PortCheck,
}

impl Exports<'_> {
    fn name(set: &str, k: usize) -> Result<Nqn> {
        Ok(Nqn::new(&format!("{BENCH_NQN}{set}-{k}"))?)
    }
}

impl bench::Exports for Exports<'_> {
    fn root(&self) -> &Path {
        Path::new(nvmet::DEFAULT_ROOT)
    }

    /// As the agent per ExportVolume (its calls into this crate,
    /// agent/src/export/nvmeof.rs): one plan from one read (the port read
    /// whole when its check is due), which moves the port when it must and
    /// cuts off hosts losing access, then its steps.
    fn export(&self, set: &str, k: usize) -> Result<()> {
        let name = Self::name(set, k)?;
        let desired = export_state(&name, self.device)?;
        let planned = self
            .target
            .plan_subsystem(&name, desired, |_| false, &self.port_check)?;
        self.target.run_subsystem_plan(&planned, &self.port_check)?;
        Ok(())
    }

    /// As the agent per UnexportVolume: the hosts the subsystem allows,
    /// then its teardown.
    fn unexport(&self, set: &str, k: usize) -> Result<()> {
        let name = Self::name(set, k)?;
        self.target
            .tree()
            .children(&format!("subsystems/{name}/allowed_hosts"))?;
        self.target.teardown(&Teardown {
            subsystems: [name].into(),
            ..Default::default()
        })?;
        Ok(())
    }

    fn export_steps(&self, set: &str, k: usize) -> Result<Vec<Step>> {
        Ok(export_steps(&Self::name(set, k)?, self.device))
    }

    fn unexport_steps(&self, set: &str, k: usize) -> Result<Vec<Step>> {
        Ok(unexport_steps(&Self::name(set, k)?))
    }

    fn present(&self, set: &str) -> Result<usize> {
        let state = self.target.read()?;
        let prefix = format!("{BENCH_NQN}{set}-");
        let linked = state.ports.get(&PORT).map(|p| &p.subsystems);
        Ok(state
            .subsystems
            .iter()
            .filter(|(n, s)| {
                n.as_str().starts_with(&prefix)
                    && s.namespaces.len() == 1
                    && linked.is_some_and(|l| l.contains(*n))
            })
            .count())
    }
}

/// The floor of one export and one unexport, and the peers one process per
/// export, in turn and at once (see [`bench::floor_and_peers`]), on port
/// `PORT` made for it.
fn floor_and_peers(target: &Nvmet, device: &str) -> Result<()> {
    let exports = Exports {
        target,
        device,
        port_check: Default::default(),
    };
    bench::bare(Path::new(nvmet::DEFAULT_ROOT), &port_steps())?;
    let figures = bench::floor_and_peers(&exports, BLOCKS, PER_BLOCK, CONCURRENT);
    target.teardown(&Teardown {
        ports: [PORT].into(),
        ..Default::default()
    })?;
    let figures = figures?;
    println!(
        "  floor  {} exports of ours and {} bare, in {BLOCKS} alternating blocks",
        figures.export.n, figures.export.n
    );
    for line in figures.lines("  floor  ") {
        println!("{line}");
    }
    Ok(())
}
