//! Configfs exports against their floor and their peers: steps made bare
//! (the floor) or by a shell script (the peer), rounds that alternate what
//! they time, and the driver the nvmet and LIO benches share.
use super::{ms, percentile, processes_at_once, threads_at_once, Floor, Pairs};
use crate::Result;
use nvmet::Step;
use std::{
    fmt::Write as _,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};
/// Makes `steps` under `root` with plain `std::fs` calls (`create_dir`,
/// `write`, `symlink`, `remove_file`, `remove_dir`), in order: the bare
/// kernel work of a configfs change, with no reads, no planning and no
/// checks. The floor an operation of ours is measured against.
pub fn bare(root: &Path, steps: &[Step]) -> Result<()> {
    for step in steps {
        match step {
            Step::Mkdir(p) => std::fs::create_dir(root.join(p))?,
            Step::Write { path, value } => write_restarting(&root.join(path), value)?,
            Step::Symlink { target, link } => {
                std::os::unix::fs::symlink(root.join(target), root.join(link))?;
            }
            Step::Unlink(p) => std::fs::remove_file(root.join(p))?,
            Step::Rmdir(p) => std::fs::remove_dir(root.join(p))?,
        }
    }
    Ok(())
}

/// Writes `value` to the configfs attribute `path`, again while the kernel
/// answers ERESTARTSYS (nvmet's namespace enable does while a new zvol's
/// first open cannot take ZFS's namespace lock), for up to 10 s.
pub fn write_restarting(path: &Path, value: &str) -> Result<()> {
    const ERESTARTSYS: i32 = 512;
    let start = Instant::now();
    loop {
        match std::fs::write(path, value) {
            Err(e) if e.raw_os_error() == Some(ERESTARTSYS) && start.elapsed() < RESTARTS_FOR => {
                std::thread::sleep(Duration::from_millis(20));
            }
            other => return Ok(other?),
        }
    }
}

/// How long [`write_restarting`] writes again.
const RESTARTS_FOR: Duration = Duration::from_secs(10);

/// `steps` under `root` as a shell script of one command per object
/// (`mkdir`, `echo -n ... >`, `ln -s`, `rm`, `rmdir`), as hand-written
/// scripts and the CLI drivers' shell-outs make them; it stops at the first
/// failure.
pub fn shell_script(root: &Path, steps: &[Step]) -> Result<String> {
    let root = root.display();
    let mut s = String::from("set -e\n");
    for step in steps {
        match step {
            Step::Mkdir(p) => writeln!(s, "mkdir '{root}/{p}'")?,
            Step::Write { path, value } => writeln!(s, "echo -n '{value}' > '{root}/{path}'")?,
            Step::Symlink { target, link } => {
                writeln!(s, "ln -s '{root}/{target}' '{root}/{link}'")?
            }
            Step::Unlink(p) => writeln!(s, "rm '{root}/{p}'")?,
            Step::Rmdir(p) => writeln!(s, "rmdir '{root}/{p}'")?,
        }
    }
    Ok(s)
}

/// Runs `script` with one `bash`, fed on standard input (a long script does
/// not fit in an argument); the wall time, process start included.
pub fn bash(script: &str) -> Result<Duration> {
    use std::io::Write;
    let start = Instant::now();
    let mut child = Command::new("bash")
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .ok_or("no stdin for bash")?
        .write_all(script.as_bytes())?;
    let out = child.wait_with_output()?;
    let took = start.elapsed();
    if !out.status.success() {
        return Err(format!(
            "shell script failed: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )
        .into());
    }
    Ok(took)
}

/// `bash -c script`, for [`processes_at_once`].
pub fn bash_command(script: &str) -> Command {
    let mut c = Command::new("bash");
    c.arg("-c").arg(script);
    c
}

/// Times each of `work` over `blocks` blocks of `per_block` operations,
/// the works alternating inside every round and the one that goes first
/// rotating from round to round, so that a change of the host's load hits
/// them all alike. Operation `k` (0 to `blocks * per_block`) of each work
/// is `work[w](k)`; the time of each block of each work.
pub fn alternating(
    blocks: usize,
    per_block: usize,
    work: &mut [&mut dyn FnMut(usize) -> Result<()>],
) -> Result<Vec<Vec<Duration>>> {
    let mut times = vec![Vec::with_capacity(blocks); work.len()];
    for b in 0..blocks {
        for j in 0..work.len() {
            let w = (b + j) % work.len();
            let start = Instant::now();
            for k in b * per_block..(b + 1) * per_block {
                work[w](k)?;
            }
            times[w].push(start.elapsed());
        }
    }
    Ok(times)
}

/// Ours (the blocks of `times[0]`) against the floor (`times[1]`) as
/// [`alternating`] timed them, `n` operations each.
fn paired_floor(times: &[Vec<Duration>], n: usize) -> Result<Floor> {
    let [ours, floor] = times else {
        return Err(format!("{} works timed, expected ours and the floor", times.len()).into());
    };
    Ok(Floor {
        ours: ours.iter().sum(),
        floor: floor.iter().sum(),
        n,
        pairs: Pairs::of(ours, floor),
    })
}

/// One kind of export a benchmark compares with its floor and its peers:
/// export `k` of a set (`"ours"`, `"floor"`, `"shell"`, `"threads"`), made
/// by us as the agent makes it, or as configfs steps. Exports of different
/// sets, and of one set, are distinct objects (and devices, where the
/// kernel opens them exclusively) that may all be present at once.
pub trait Exports: Sync {
    /// The configfs tree the steps are relative to.
    fn root(&self) -> &Path;
    /// Ours: export `k` of `set` as the agent makes it per ExportVolume.
    fn export(&self, set: &str, k: usize) -> Result<()>;
    /// Ours: its removal as the agent makes it per UnexportVolume.
    fn unexport(&self, set: &str, k: usize) -> Result<()>;
    /// The configfs steps that make export `k` of `set`.
    fn export_steps(&self, set: &str, k: usize) -> Result<Vec<Step>>;
    /// The configfs steps that remove it.
    fn unexport_steps(&self, set: &str, k: usize) -> Result<Vec<Step>>;
    /// How many exports of `set` are present, whole.
    fn present(&self, set: &str) -> Result<usize>;
}

/// The floor and peer figures of [`floor_and_peers`].
#[derive(Debug, Clone)]
pub struct PeerFigures {
    /// One export as the agent makes it against the bare steps.
    pub export: Floor,
    /// One unexport against the bare steps.
    pub unexport: Floor,
    /// Exports made by one `bash` per export, one after another.
    pub shell_in_turn: Duration,
    /// Exports made by one `bash` per export, all at once.
    pub shell_at_once: Duration,
    /// Ours from one thread per export, released at once.
    pub ours_at_once: Duration,
    /// Each thread's own time in that run.
    pub ours_each: Vec<Duration>,
    /// Ours from one thread per export, serialised by one lock as the
    /// agent serialises its configfs changes.
    pub ours_locked: Duration,
    /// Exports in each of the peer runs.
    pub concurrent: usize,
}

impl PeerFigures {
    /// The figures as report lines, each starting with `prefix`.
    pub fn lines(&self, prefix: &str) -> Vec<String> {
        let n = self.concurrent;
        let per = |d: Duration, k: usize| ms(d) / k.max(1) as f64;
        let ours = per(self.export.ours, self.export.n);
        vec![
            format!("{prefix}export as the agent makes it: {}", self.export.line()),
            format!("{prefix}unexport as the agent makes it: {}", self.unexport.line()),
            format!(
                "{prefix}in turn: one bash per export, {n} one after another {:.1} ms ({:.2} ms/export); ours as the agent {ours:.2} ms/export: shell/ours {:.2}x",
                ms(self.shell_in_turn),
                per(self.shell_in_turn, n),
                per(self.shell_in_turn, n) / ours
            ),
            format!(
                "{prefix}at once: {n} bash processes {:.1} ms; ours from {n} threads {:.1} ms (each p50 {:.2} ms, max {:.2} ms); through one lock, as the agent serialises, {:.1} ms: shell/ours {:.2}x, shell/ours-through-the-lock {:.2}x",
                ms(self.shell_at_once),
                ms(self.ours_at_once),
                ms(percentile(&self.ours_each, 50.0)),
                ms(percentile(&self.ours_each, 100.0)),
                ms(self.ours_locked),
                ms(self.shell_at_once) / ms(self.ours_at_once),
                ms(self.shell_at_once) / ms(self.ours_locked)
            ),
        ]
    }
}

/// The floor of one export and of one unexport, `blocks` alternating
/// blocks of `per_block` each (the last `blocks * per_block` of ours and
/// of the floor present together at the top); then the peers the way CLI
/// drivers serve requests: one `bash` per export (the steps as
/// [`shell_script`]), `concurrent` one after another and `concurrent` at
/// once, against ours from as many threads, as they come and through one
/// lock. Every run is checked and removed again (untimed). Export 0 of set
/// `"anchor"`, made first and removed last, keeps the port or portal
/// listening throughout, so that no timed operation starts or stops the
/// listener (the kernel does when the first export links to it and the
/// last one goes).
pub fn floor_and_peers(
    e: &impl Exports,
    blocks: usize,
    per_block: usize,
    concurrent: usize,
) -> Result<PeerFigures> {
    let n = blocks * per_block;
    let steps = |up: bool| -> Result<Vec<Vec<Step>>> {
        (0..n)
            .map(|k| {
                if up {
                    e.export_steps("floor", k)
                } else {
                    e.unexport_steps("floor", k)
                }
            })
            .collect()
    };
    let (floor_up, floor_down) = (steps(true)?, steps(false)?);
    e.export("anchor", 0)?;
    let figures =
        floor_and_peers_anchored(e, blocks, per_block, concurrent, &floor_up, &floor_down);
    e.unexport("anchor", 0)?;
    figures
}

fn floor_and_peers_anchored(
    e: &impl Exports,
    blocks: usize,
    per_block: usize,
    concurrent: usize,
    floor_up: &[Vec<Step>],
    floor_down: &[Vec<Step>],
) -> Result<PeerFigures> {
    let n = blocks * per_block;
    let expect = |set: &str, want: usize| -> Result<()> {
        let got = e.present(set)?;
        if got == want {
            Ok(())
        } else {
            Err(format!("{got} exports of set {set} present, expected {want}").into())
        }
    };
    let up = alternating(
        blocks,
        per_block,
        &mut [&mut |k| e.export("ours", k), &mut |k| {
            bare(e.root(), &floor_up[k])
        }],
    )?;
    expect("ours", n)?;
    expect("floor", n)?;
    let down = alternating(
        blocks,
        per_block,
        &mut [&mut |k| e.unexport("ours", k), &mut |k| {
            bare(e.root(), &floor_down[k])
        }],
    )?;
    expect("ours", 0)?;
    expect("floor", 0)?;

    let scripts = (0..concurrent)
        .map(|k| shell_script(e.root(), &e.export_steps("shell", k)?))
        .collect::<Result<Vec<_>>>()?;
    let clear = |set: &str| -> Result<()> {
        (0..concurrent).try_for_each(|k| e.unexport(set, k))?;
        expect(set, 0)
    };
    let start = Instant::now();
    for s in &scripts {
        bash(s)?;
    }
    let shell_in_turn = start.elapsed();
    expect("shell", concurrent)?;
    clear("shell")?;
    let shell_at_once = processes_at_once(scripts.iter().map(|s| bash_command(s)).collect())?;
    expect("shell", concurrent)?;
    clear("shell")?;
    let (ours_at_once, ours_each) = threads_at_once(concurrent, |k| e.export("threads", k))?;
    expect("threads", concurrent)?;
    clear("threads")?;
    let lock = std::sync::Mutex::new(());
    let (ours_locked, _) = threads_at_once(concurrent, |k| {
        let _serial = lock.lock().map_err(|_| "lock poisoned")?;
        e.export("threads", k)
    })?;
    expect("threads", concurrent)?;
    clear("threads")?;
    Ok(PeerFigures {
        export: paired_floor(&up, n)?,
        unexport: paired_floor(&down, n)?,
        shell_in_turn,
        shell_at_once,
        ours_at_once,
        ours_each,
        ours_locked,
        concurrent,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_steps_and_their_script_make_the_same_tree() -> Result<()> {
        let steps = [
            Step::mkdir("obj"),
            Step::write("obj/attr", "1"),
            Step::symlink("obj", "link"),
        ];
        let (a, b) = (tempfile::tempdir()?, tempfile::tempdir()?);
        bare(a.path(), &steps)?;
        bash(&shell_script(b.path(), &steps)?)?;
        for dir in [a.path(), b.path()] {
            assert_eq!(std::fs::read_to_string(dir.join("link/attr"))?, "1");
        }
        let undo = [Step::unlink("link"), Step::rmdir("obj")];
        bare(a.path(), &[Step::write("obj/attr", "2")])?;
        std::fs::remove_file(a.path().join("obj/attr"))?;
        bare(a.path(), &undo)?;
        assert!(!a.path().join("obj").exists());
        Ok(())
    }

    #[test]
    fn alternating_rounds_give_each_work_every_operation() -> Result<()> {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let times = alternating(
            3,
            2,
            &mut [
                &mut |k| {
                    a.push(k);
                    Ok(())
                },
                &mut |k| {
                    b.push(k);
                    Ok(())
                },
            ],
        )?;
        assert_eq!(times.len(), 2);
        assert!(times.iter().all(|blocks| blocks.len() == 3));
        assert_eq!(a, (0..6).collect::<Vec<_>>());
        assert_eq!(b, a);
        Ok(())
    }

    #[test]
    fn one_slow_block_moves_the_total_but_not_the_median_pair() -> Result<()> {
        let ms = Duration::from_millis;
        let ours = [ms(11), ms(11), ms(30), ms(11), ms(11)];
        let floor = [ms(10); 5];
        let floor = paired_floor(&[ours.to_vec(), floor.to_vec()], 25)?;
        assert!(floor.ratio() > 1.4, "{}", floor.ratio());
        let pairs = floor.pairs.ok_or("no pairs")?;
        assert_eq!(pairs.count, 5);
        assert!((pairs.median - 1.1).abs() < 1e-9, "{pairs:?}");
        assert!((pairs.low - 1.1).abs() < 1e-9 && (pairs.high - 3.0).abs() < 1e-9);
        assert!(paired_floor(&[ours.to_vec()], 5).is_err());
        Ok(())
    }

    #[test]
    fn an_even_number_of_pairs_has_the_middle_two_for_median() {
        let ms = Duration::from_millis;
        let pairs = Pairs::of(&[ms(10), ms(30)], &[ms(10), ms(10)]);
        assert!(pairs.is_some_and(|p| (p.median - 2.0).abs() < 1e-9));
        assert!(Pairs::of(&[], &[]).is_none());
    }
}
