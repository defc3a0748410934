//! `sys::lvm` against its floor and against the LVM CLI, in the kernel lab
//! (`tests/lab/run bench -- lvm`). Under TCG absolute times mean little, so
//! each figure is compared with another way of doing the same work in the
//! same run, as a ratio:
//!
//! 1. the floor: each single operation (linear create and remove, thin
//!    create and remove, a report of one LV) through `sys::lvm` against the
//!    bare `lvm2_run` of the same command line ([`sys::lvm::floor`]), in
//!    alternating blocks so that drift hits both (goal: ours <= 1.15x the
//!    floor);
//! 2. sequential `lvcreate` + `lvremove` processes, in the same blocks;
//! 3. the peers as they run: `AT_ONCE` creates (then removes) from as many
//!    threads at once through `sys::lvm` against as many `lvcreate`
//!    (`lvremove`) processes at once;
//! 4. JSON reports of the VG's LVs through `sys::lvm` (parsed into typed
//!    values) against `lvs` processes (their output parsed with serde_json).
//!
//! Prints every figure, then fails if an operation missed the floor goal.
use pillar_csi_lab::{
    bench::{conditions, ms, processes_at_once, selected, threads_at_once, Floor},
    run, Lab, Result,
};
use std::{
    process::Command,
    sync::OnceLock,
    time::{Duration, Instant},
};
use sys::lvm::{
    floor::{command_line, RawLvm},
    parse_lvs, LvName, Lvm, LvmUuid, Request, VgName,
};

/// Alternating blocks of each side.
const BLOCKS: usize = 5;
/// Linear create + remove pairs per block and side.
const LINEAR: usize = 10;
/// Thin create + remove pairs per block and side.
const THIN: usize = 4;
/// Reports of one LV per block and side.
const LV_REPORTS: usize = 20;
/// Reports of the VG's LVs per side, in blocks of 20.
const REPORTS: usize = 200;
/// Creates (and removes) at once.
const AT_ONCE: usize = 20;
/// Bytes of each LV (the CLI is given the same size).
const SIZE: u64 = 4 << 20;
const FIELDS: &str = "vg_name,lv_name,vg_uuid,lv_uuid,lv_attr,segtype,pool_lv,origin,lv_size,data_percent,metadata_percent,lv_path,lv_layout,lv_role";

/// Ours against the floor for each single operation, over the same counts.
struct Floors {
    linear_create: Floor,
    linear_remove: Floor,
    thin_create: Floor,
    thin_remove: Floor,
    lv_report: Floor,
}

/// The same place in the alternation for each side: the VG, the thin pool
/// and the block number (for names).
struct Block<'a> {
    lab: &'a Lab,
    vg: &'a VgName,
    pool: &'a LvName,
    n: usize,
}

impl Block<'_> {
    fn name(&self, what: &str) -> Result<LvName> {
        Ok(LvName::new(&self.lab.unique(&format!("{what}{}", self.n)))?)
    }

    fn create(&self, thin: bool, lv: &LvName) -> Request {
        let (vg, lv) = (self.vg.clone(), lv.clone());
        if thin {
            let pool = self.pool.clone();
            Request::CreateThin {
                vg,
                pool,
                lv,
                size: SIZE,
            }
        } else {
            Request::CreateLinear { vg, lv, size: SIZE }
        }
    }
}

impl Floors {
    fn new() -> Self {
        let zero = Floor {
            ours: Duration::ZERO,
            floor: Duration::ZERO,
            n: 0,
            pairs: None,
        };
        Self {
            linear_create: zero,
            linear_remove: zero,
            thin_create: zero,
            thin_remove: zero,
            lv_report: zero,
        }
    }
}

/// Runs `f`, adding the time it took to `total`.
fn timed<T>(total: &mut Duration, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let out = f();
    *total += t.elapsed();
    out
}

/// One block of ours: a fresh service (its first command untimed, as the
/// floor's), then the operations as the agent calls them.
fn ours(b: &Block, f: &mut Floors) -> Result<()> {
    let lvm = Lvm::start()?;
    lvm.lv(b.vg, b.pool)?;
    for (thin, count) in [(false, LINEAR), (true, THIN)] {
        let (create, remove) = if thin {
            (&mut f.thin_create.ours, &mut f.thin_remove.ours)
        } else {
            (&mut f.linear_create.ours, &mut f.linear_remove.ours)
        };
        for _ in 0..count {
            let n = b.name("o")?;
            let c = timed(create, || {
                if thin {
                    lvm.create_thin(b.vg, b.pool, &n, SIZE)
                } else {
                    lvm.create_linear(b.vg, &n, SIZE)
                }
            })?;
            // The untimed report the floor needs for the UUID, here too, so
            // that udev has as long on both sides to finish with the new
            // device before it is removed; it checks the create's answer.
            let lv = lvm.lv(b.vg, &n)?;
            if lv.uuid != c.uuid || lv.size != c.size {
                return Err(format!("the create gave {c:?}, the report {lv:?}").into());
            }
            timed(remove, || lvm.remove(b.vg, &n, &c.uuid))?;
        }
    }
    for _ in 0..LV_REPORTS {
        timed(&mut f.lv_report.ours, || lvm.lv(b.vg, b.pool))?;
    }
    Ok(())
}

/// One block of the floor: the same command lines through a bare handle.
fn floor(b: &Block, f: &mut Floors) -> Result<()> {
    let mut raw = RawLvm::start()?;
    let report = command_line(&Request::Lv(b.vg.clone(), b.pool.clone()));
    raw.run(&report)?;
    for (thin, count) in [(false, LINEAR), (true, THIN)] {
        let (create, remove) = if thin {
            (&mut f.thin_create.floor, &mut f.thin_remove.floor)
        } else {
            (&mut f.linear_create.floor, &mut f.linear_remove.floor)
        };
        for _ in 0..count {
            let n = b.name("f")?;
            let line = command_line(&b.create(thin, &n));
            timed(create, || raw.run(&line))?;
            // The UUID to pin, read untimed (ours reads it too, as a check).
            let lines = raw.run(&command_line(&Request::Lv(b.vg.clone(), n.clone())))?;
            let uuid = parse_lvs(&lines)?
                .into_iter()
                .find(|l| l.name == n.as_str())
                .map(|l| l.uuid)
                .ok_or_else(|| format!("{}/{n} is not in its report", b.vg))?;
            let line = command_line(&Request::Remove {
                vg: b.vg.clone(),
                lv: n,
                uuid,
            });
            timed(remove, || raw.run(&line))?;
        }
    }
    for _ in 0..LV_REPORTS {
        timed(&mut f.lv_report.floor, || raw.run(&report))?;
    }
    Ok(())
}

/// An LVM CLI command (without its warnings about inherited descriptors).
fn cli(program: &str, args: &[&str]) -> Command {
    let mut c = Command::new(program);
    c.args(args).env("LVM_SUPPRESS_FD_WARNINGS", "1");
    c
}

/// One block of sequential `lvcreate` + `lvremove` processes (linear).
fn processes(b: &Block, create: &mut Duration, remove: &mut Duration) -> Result<()> {
    let size = format!("{SIZE}b");
    for _ in 0..LINEAR {
        let n = b.name("p")?;
        timed(create, || {
            run(
                "lvcreate",
                &["-y", "-n", n.as_str(), "-L", &size, b.vg.as_str()],
            )
        })?;
        timed(remove, || {
            run("lvremove", &["-y", &format!("{}/{n}", b.vg)])
        })?;
    }
    Ok(())
}

/// Lets udev finish the events of the creates and removes so far, so that
/// its work does not land in the next timed step.
fn settle() {
    let _ = run("udevadm", &["settle", "--timeout=60"]);
}

/// `AT_ONCE` creates, then removes, from as many threads at once through
/// one service, against as many `lvcreate`, then `lvremove`, processes at
/// once: the walls of (ours create, ours remove, CLI create, CLI remove).
fn at_once(lab: &Lab, vg: &VgName) -> Result<[Duration; 4]> {
    let names = (0..AT_ONCE)
        .map(|_| LvName::new(&lab.unique("co")))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let uuids: Vec<OnceLock<LvmUuid>> = (0..AT_ONCE).map(|_| OnceLock::new()).collect();
    let lvm = Lvm::start()?;
    lvm.vg(vg)?;
    settle();
    let (ours_create, _) = threads_at_once(AT_ONCE, |i| {
        let c = lvm.create_linear(vg, &names[i], SIZE)?;
        let _ = uuids[i].set(c.uuid);
        Ok(())
    })?;
    settle();
    let (ours_remove, _) = threads_at_once(AT_ONCE, |i| {
        let uuid = uuids[i].get().ok_or("a create gave no UUID")?;
        Ok(lvm.remove(vg, &names[i], uuid)?)
    })?;
    drop(lvm);
    settle();
    let names: Vec<String> = (0..AT_ONCE).map(|_| lab.unique("cp")).collect();
    let size = format!("{SIZE}b");
    let cli_create = processes_at_once(
        names
            .iter()
            .map(|n| cli("lvcreate", &["-y", "-n", n, "-L", &size, vg.as_str()]))
            .collect(),
    )?;
    settle();
    let cli_remove = processes_at_once(
        names
            .iter()
            .map(|n| cli("lvremove", &["-y", &format!("{vg}/{n}")]))
            .collect(),
    )?;
    settle();
    Ok([ours_create, ours_remove, cli_create, cli_remove])
}

/// `REPORTS` reports of the VG's LVs through `sys::lvm` and through `lvs`
/// processes: (ours, processes, LVs seen).
fn reports(vg: &VgName) -> Result<(Duration, Duration, usize)> {
    let lvm = Lvm::start()?;
    let (mut ours, mut theirs) = (Duration::ZERO, Duration::ZERO);
    let mut seen = (0, 0);
    for _ in 0..REPORTS / 20 {
        for _ in 0..20 {
            seen.0 = timed(&mut ours, || lvm.lvs(vg))?.len();
        }
        for _ in 0..20 {
            let args = [
                "-a",
                "--reportformat",
                "json",
                "--units",
                "b",
                "--nosuffix",
                "-o",
                FIELDS,
                vg.as_str(),
            ];
            let t = Instant::now();
            let doc: serde_json::Value = serde_json::from_str(&run("lvs", &args)?)?;
            seen.1 = doc["report"][0]["lv"].as_array().map_or(0, Vec::len);
            theirs += t.elapsed();
        }
    }
    if seen.0 != seen.1 {
        return Err(format!("the two ways saw {} and {} LVs", seen.0, seen.1).into());
    }
    Ok((ours, theirs, seen.0))
}

fn main() -> Result<()> {
    if !selected("lvm") {
        return Ok(());
    }
    let lab = Lab::get();
    let vg = VgName::new(&lab.vg)?;
    let pool = LvName::new(&lab.thin_pool)?;
    println!("lvm bench (lab guest under TCG; compare ratios, not times)");
    println!("  conditions: {}", conditions());

    // Warm both paths (page cache, udev, modules) before timing.
    let mut f = Floors::new();
    let warm = Block {
        lab: &lab,
        vg: &vg,
        pool: &pool,
        n: 0,
    };
    let (mut create, mut remove) = (Duration::ZERO, Duration::ZERO);
    processes(&warm, &mut create, &mut remove)?;
    ours(&warm, &mut f)?;
    floor(&warm, &mut f)?;
    f = Floors::new();
    let (mut create, mut remove) = (Duration::ZERO, Duration::ZERO);

    // 1 and 2: ours, the floor and the processes in alternating blocks.
    for n in 1..=BLOCKS {
        let b = Block {
            lab: &lab,
            vg: &vg,
            pool: &pool,
            n,
        };
        settle();
        ours(&b, &mut f)?;
        settle();
        floor(&b, &mut f)?;
        settle();
        processes(&b, &mut create, &mut remove)?;
    }
    f.linear_create.n = BLOCKS * LINEAR;
    f.linear_remove.n = BLOCKS * LINEAR;
    f.thin_create.n = BLOCKS * THIN;
    f.thin_remove.n = BLOCKS * THIN;
    f.lv_report.n = BLOCKS * LV_REPORTS;
    let mut missed = Vec::new();
    println!("1. single operations against the floor (the bare lvm2_run of the same command line)");
    for (what, op) in [
        ("linear create", &f.linear_create),
        ("linear remove", &f.linear_remove),
        ("thin create", &f.thin_create),
        ("thin remove", &f.thin_remove),
        ("one-LV report", &f.lv_report),
    ] {
        println!("  {what} x{}: {}", op.n, op.line());
        if !op.met() {
            missed.push(format!("{what} {:.2}x the floor", op.ratio()));
        }
    }

    let pairs = BLOCKS * LINEAR;
    let per = |d: Duration| ms(d) / pairs as f64;
    let ours_pair = f.linear_create.ours + f.linear_remove.ours;
    println!("2. sequential linear create + remove x{pairs}");
    println!(
        "  sys::lvm: create {:.1} ms/op, remove {:.1} ms/op; floor: create {:.1} ms/op, remove {:.1} ms/op; lvcreate {:.1} ms/op, lvremove {:.1} ms/op",
        per(f.linear_create.ours),
        per(f.linear_remove.ours),
        per(f.linear_create.floor),
        per(f.linear_remove.floor),
        per(create),
        per(remove)
    );
    println!(
        "  processes / sys::lvm: {:.2}x (target >= 1.3x)",
        (create + remove).as_secs_f64() / ours_pair.as_secs_f64()
    );

    settle();
    let [oc, or, cc, cr] = at_once(&lab, &vg)?;
    println!(
        "3. {AT_ONCE} at once: threads through one sys::lvm service against as many processes"
    );
    for (what, ours, theirs) in [("create", oc, cc), ("remove", or, cr)] {
        println!(
            "  {what}: sys::lvm wall {:.0} ms ({:.1} ms/op), lv{what} processes wall {:.0} ms ({:.1} ms/op): processes / sys::lvm {:.2}x",
            ms(ours),
            ms(ours) / AT_ONCE as f64,
            ms(theirs),
            ms(theirs) / AT_ONCE as f64,
            theirs.as_secs_f64() / ours.as_secs_f64()
        );
    }

    let (ours, theirs, lvs) = reports(&vg)?;
    println!("4. reports of the VG's LVs x{REPORTS} ({lvs} LVs each)");
    println!(
        "  sys::lvm {:.2} ms each, lvs processes {:.2} ms each: processes / sys::lvm {:.2}x (target >= 4x)",
        ms(ours) / REPORTS as f64,
        ms(theirs) / REPORTS as f64,
        theirs.as_secs_f64() / ours.as_secs_f64()
    );
    println!("  conditions at the end: {}", conditions());
    if missed.is_empty() {
        println!("lvm bench: every operation within the floor goal");
        Ok(())
    } else {
        println!("lvm bench: floor goal missed: {}", missed.join("; "));
        Err(missed.join("; ").into())
    }
}
