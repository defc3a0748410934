//! `sys::zfs` against the kernel's own cost and against the `zfs` CLI, in
//! the kernel lab (`make bench FILTER=zfs`). Under TCG the guest is 10-30x
//! slower than a real machine, so every figure is a ratio between two ways
//! of doing the same work in the same run:
//!
//! 1. single operations (create thick, create sparse, destroy, volsize,
//!    the GUID an identity check reads),
//!    each against its floor, the bare libzfs_core call or ioctl through
//!    [`sys::zfs::floor`] (goal: at most 1.15x), and against the CLI run one
//!    at a time (reported as it comes);
//! 2. N creates at once: `sys::zfs` from N threads against N `zfs create -V`
//!    processes at once (as the Go and JavaScript drivers serve concurrent
//!    requests; goal: at least 2x), N bare creates at once (the floor) and N
//!    sequential `zfs create -V`.
//!
//! Each kind of work alternates between the ways in blocks of ten, the
//! first of them rotating from block to block, so that drift of the host
//! and udev's work after a settle hit all of them. Exits non-zero when a goal is
//! missed, after printing every figure.
use pillar_csi_lab::{
    bench::{conditions, ms, processes_at_once, threads_at_once, Floor},
    run, Lab, Result,
};
use std::{
    process::Command,
    sync::Arc,
    time::{Duration, Instant},
};
use sys::zfs::{floor::BareCalls, DatasetName, Provisioning, Zfs, ZvolSpec};

/// Volumes of each single-operation series, and creates at once.
const N: usize = 50;
const BLOCK: usize = 10;
const SIZE: u64 = 16 << 20;
/// The goal of N creates at once against N CLI processes at once.
const AT_ONCE_GOAL: f64 = 2.0;

/// Lets udev finish with the devices of earlier steps, so that its probes
/// do not run inside the next timed step (test set-up, not product code).
fn settle() -> Result<()> {
    run("udevadm", &["settle", "--timeout=60"])?;
    Ok(())
}

/// `zfs destroy`, tried again while the kernel reports the new volume busy
/// (udev probes it for a moment), as `sys::zfs` does.
fn cli_destroy(ds: &str) -> Result<()> {
    let start = Instant::now();
    loop {
        match run("zfs", &["destroy", ds]) {
            Ok(_) => return Ok(()),
            Err(e) if e.why.contains("busy") && start.elapsed() < sys::zfs::BUSY_GRACE => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The three ways, each timed over the same number of operations.
/// How many times each volume is read per way: a read takes about 10 ms
/// in the lab, and 50 of them moved by 15% between runs.
const READ_ROUNDS: usize = 4;

/// A read of one volume: its size, or its GUID alone.
#[derive(Clone, Copy)]
enum Read {
    Volsize,
    Guid,
}

impl Read {
    fn property(self) -> &'static str {
        match self {
            Read::Volsize => "volsize",
            Read::Guid => "guid",
        }
    }
}

#[derive(Default)]
struct Three {
    ours: Duration,
    floor: Duration,
    cli: Duration,
    n: usize,
}

impl Three {
    fn floor(&self) -> Floor {
        Floor {
            ours: self.ours,
            floor: self.floor,
            n: self.n,
            pairs: None,
        }
    }

    fn print(&self, what: &str) {
        let per = |d: Duration| ms(d) / self.n as f64;
        println!("  {what}: {}", self.floor().line());
        println!(
            "    CLI one at a time {:.2} ms/op: {:.2}x ours",
            per(self.cli),
            self.cli.as_secs_f64() / self.ours.as_secs_f64()
        );
    }
}

/// Runs the three ways of one block in an order that rotates with the
/// block, so that none always goes first (after udev settled) or last.
fn in_turn(block: usize, ways: [&mut dyn FnMut() -> Result<()>; 3]) -> Result<()> {
    for j in 0..3 {
        (ways[(block + j) % 3])()?;
    }
    Ok(())
}

fn timed(total: &mut Duration, f: impl FnOnce() -> Result<()>) -> Result<()> {
    let t = Instant::now();
    f()?;
    *total += t.elapsed();
    Ok(())
}

struct Bench {
    zfs: Arc<Zfs>,
    bare: BareCalls,
    parent: String,
}

impl Bench {
    fn name(&self, prefix: &str, i: usize) -> Result<DatasetName> {
        Ok(DatasetName::new(&format!("{}/{prefix}-{i}", self.parent))?)
    }

    /// N creates and N destroys of each way, in alternating blocks; the
    /// creates and the destroys timed apart.
    fn create_destroy(&self, provisioning: Provisioning) -> Result<(Three, Three)> {
        let tag = match provisioning {
            Provisioning::Thick => "t",
            Provisioning::Sparse => "s",
        };
        let sparse = provisioning == Provisioning::Sparse;
        // The floor is given the reservation ours computes (once, here).
        let probe = self.name(&format!("probe-{tag}"), 0)?;
        let mut spec = ZvolSpec::new(probe.clone(), SIZE);
        spec.provisioning = provisioning;
        self.zfs.create_zvol(&spec)?;
        let resv = match self.zfs.property(&probe, "refreservation")? {
            Some(r) if !sparse => Some(r.parse::<u64>()?),
            _ => None,
        };
        settle()?;
        self.zfs.destroy(&probe)?;
        let (mut create, mut destroy) = (Three::default(), Three::default());
        for block in 0..N / BLOCK {
            let names = |way: &str| -> Result<Vec<DatasetName>> {
                (0..BLOCK)
                    .map(|i| self.name(&format!("{way}{tag}{block}"), i))
                    .collect()
            };
            let (ours, floor, cli) = (names("o")?, names("f")?, names("c")?);
            let args: &[&str] = if sparse {
                &["create", "-s", "-V", "16M"]
            } else {
                &["create", "-V", "16M"]
            };
            in_turn(
                block,
                [
                    &mut || {
                        for n in &ours {
                            let mut spec = ZvolSpec::new(n.clone(), SIZE);
                            spec.provisioning = provisioning;
                            timed(&mut create.ours, || Ok(self.zfs.create_zvol(&spec)?))?;
                        }
                        Ok(())
                    },
                    &mut || {
                        for n in &floor {
                            timed(&mut create.floor, || {
                                Ok(self.bare.create_zvol(n.as_str(), SIZE, resv)?)
                            })?;
                        }
                        Ok(())
                    },
                    &mut || {
                        for n in &cli {
                            let args: Vec<&str> =
                                args.iter().copied().chain([n.as_str()]).collect();
                            timed(&mut create.cli, || Ok(run("zfs", &args).map(drop)?))?;
                        }
                        Ok(())
                    },
                ],
            )?;
            // udev's probes of the new devices end before the destroys.
            settle()?;
            in_turn(
                block,
                [
                    &mut || {
                        for n in &ours {
                            timed(&mut destroy.ours, || Ok(self.zfs.destroy(n)?))?;
                        }
                        Ok(())
                    },
                    &mut || {
                        for n in &floor {
                            timed(&mut destroy.floor, || Ok(self.bare.destroy(n.as_str())?))?;
                        }
                        Ok(())
                    },
                    &mut || {
                        for n in &cli {
                            timed(&mut destroy.cli, || cli_destroy(n.as_str()))?;
                        }
                        Ok(())
                    },
                ],
            )?;
            settle()?;
        }
        create.n = N;
        destroy.n = N;
        Ok((create, destroy))
    }

    /// `read` of N volumes in alternating blocks, each volume read
    /// [`READ_ROUNDS`] times: ours, the bare ioctl and `zfs get`.
    fn read(&self, read: Read) -> Result<Three> {
        let prefix = match read {
            Read::Volsize => "vs",
            Read::Guid => "vg",
        };
        let names: Vec<DatasetName> = (0..N)
            .map(|i| self.name(prefix, i))
            .collect::<Result<_>>()?;
        for n in &names {
            let mut s = ZvolSpec::new(n.clone(), SIZE);
            s.provisioning = Provisioning::Sparse;
            self.zfs.create_zvol(&s)?;
        }
        settle()?;
        let mut three = Three {
            n: N * READ_ROUNDS,
            ..Default::default()
        };
        let mut buffer = Vec::new();
        for (i, block) in names.chunks(BLOCK).enumerate() {
            in_turn(
                i,
                [
                    &mut || {
                        for n in block.iter().cycle().take(block.len() * READ_ROUNDS) {
                            timed(&mut three.ours, || {
                                match read {
                                    Read::Volsize => {
                                        let size = self.zfs.volsize(n)?;
                                        if size != SIZE {
                                            return Err(format!("{n}: volsize {size}").into());
                                        }
                                    }
                                    Read::Guid => {
                                        self.zfs.volume_guid(n)?;
                                    }
                                }
                                Ok(())
                            })?;
                        }
                        Ok(())
                    },
                    &mut || {
                        for n in block.iter().cycle().take(block.len() * READ_ROUNDS) {
                            timed(&mut three.floor, || {
                                match read {
                                    Read::Volsize => {
                                        self.bare.stats(n.as_str(), &mut buffer)?;
                                    }
                                    Read::Guid => {
                                        self.bare.fast_stats(n.as_str())?;
                                    }
                                }
                                Ok(())
                            })?;
                        }
                        Ok(())
                    },
                    &mut || {
                        for n in block.iter().cycle().take(block.len() * READ_ROUNDS) {
                            timed(&mut three.cli, || {
                                let out = run(
                                    "zfs",
                                    &["get", "-Hp", "-o", "value", read.property(), n.as_str()],
                                )?;
                                out.trim().parse::<u64>()?;
                                Ok(())
                            })?;
                        }
                        Ok(())
                    },
                ],
            )?;
        }
        for n in &names {
            self.zfs.destroy(n)?;
        }
        Ok(three)
    }

    /// N creates at once, each way; the wall times and the slowest of ours.
    fn at_once(&self) -> Result<()> {
        let way = |prefix: &str| -> Result<Vec<DatasetName>> {
            (0..N).map(|i| self.name(prefix, i)).collect()
        };
        let (ours, floor, cli, seq) = (way("ao")?, way("af")?, way("ac")?, way("as")?);
        settle()?;
        let (ours_wall, each) = threads_at_once(N, |i| {
            Ok(self
                .zfs
                .create_zvol(&ZvolSpec::new(ours[i].clone(), SIZE))?)
        })?;
        settle()?;
        let resv = self
            .zfs
            .property(&ours[0], "refreservation")?
            .map(|r| r.parse::<u64>())
            .transpose()?;
        let (floor_wall, _) = threads_at_once(N, |i| {
            Ok(self.bare.create_zvol(floor[i].as_str(), SIZE, resv)?)
        })?;
        settle()?;
        let commands = cli
            .iter()
            .map(|n| {
                let mut c = Command::new("zfs");
                c.args(["create", "-V", "16M", n.as_str()]);
                c
            })
            .collect();
        let cli_wall = processes_at_once(commands)?;
        settle()?;
        let t = Instant::now();
        for n in &seq {
            run("zfs", &["create", "-V", "16M", n.as_str()])?;
        }
        let seq_wall = t.elapsed();
        // How many transaction groups each way's creates landed in.
        let txgs = |names: &[DatasetName]| -> Result<usize> {
            let mut set = std::collections::BTreeSet::new();
            for n in names {
                set.insert(self.zfs.property(n, "createtxg")?.unwrap_or_default());
            }
            Ok(set.len())
        };
        let slowest = each.iter().max().copied().unwrap_or_default();
        let ratio = cli_wall.as_secs_f64() / ours_wall.as_secs_f64();
        println!("2. {N} thick creates at once");
        println!(
            "  sys::zfs from {N} threads {:.0} ms (slowest single create {:.0} ms, {} txgs)",
            ms(ours_wall),
            ms(slowest),
            txgs(&ours)?
        );
        println!(
            "  floor, {N} bare lzc_create at once {:.0} ms: ours {:.2}x the floor",
            ms(floor_wall),
            ours_wall.as_secs_f64() / floor_wall.as_secs_f64()
        );
        println!(
            "  {N} `zfs create -V` processes at once {:.0} ms ({} txgs): {ratio:.2}x ours (goal >= {AT_ONCE_GOAL}x)",
            ms(cli_wall),
            txgs(&cli)?
        );
        println!(
            "  {N} `zfs create -V` one at a time {:.0} ms ({} txgs): {:.2}x ours",
            ms(seq_wall),
            txgs(&seq)?,
            seq_wall.as_secs_f64() / ours_wall.as_secs_f64()
        );
        settle()?;
        for n in ours.iter().chain(&floor).chain(&cli).chain(&seq) {
            self.zfs.destroy(n)?;
        }
        if ratio < AT_ONCE_GOAL {
            return Err(format!(
                "{N} creates at once {ratio:.2}x the CLI at once < {AT_ONCE_GOAL}x"
            )
            .into());
        }
        Ok(())
    }
}

fn main() -> Result<()> {
    if !pillar_csi_lab::bench::selected("zfs") {
        return Ok(());
    }
    let lab = Lab::get();
    let zfs = Arc::new(Zfs::open()?);
    let parent = format!("{}/{}", lab.pool, lab.unique("bench"));
    run("zfs", &["create", &parent])?;
    println!(
        "zfs bench: {parent} (userland {}, kernel {})",
        zfs.versions().userland,
        zfs.versions().kernel
    );
    println!("  {}", conditions());
    let bench = Bench {
        zfs,
        bare: BareCalls::open()?,
        parent: parent.clone(),
    };
    let mut missed = Vec::new();

    println!("1. single operations, {N} of each way, in blocks of {BLOCK}");
    for provisioning in [Provisioning::Thick, Provisioning::Sparse] {
        let what = match provisioning {
            Provisioning::Thick => "thick",
            Provisioning::Sparse => "sparse",
        };
        let (create, destroy) = bench.create_destroy(provisioning)?;
        create.print(&format!("create, {what}"));
        destroy.print(&format!("destroy, {what}"));
        for (op, three) in [("create", &create), ("destroy", &destroy)] {
            if !three.floor().met() {
                missed.push(format!(
                    "{op} {what} {:.2}x the floor",
                    three.floor().ratio()
                ));
            }
        }
    }
    for read in [Read::Volsize, Read::Guid] {
        let three = bench.read(read)?;
        three.print(read.property());
        if !three.floor().met() {
            missed.push(format!(
                "{} {:.2}x the floor",
                read.property(),
                three.floor().ratio()
            ));
        }
    }
    if let Err(e) = bench.at_once() {
        missed.push(e.to_string());
    }
    println!("  {}", conditions());

    run("zfs", &["destroy", "-r", &parent])?;
    if missed.is_empty() {
        println!("zfs bench: every goal met");
        Ok(())
    } else {
        println!("zfs bench: goals missed: {}", missed.join("; "));
        Err(missed.join("; ").into())
    }
}
