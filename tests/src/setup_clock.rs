//! How long a lab test spent setting up its world (beds, clusters, the
//! guides' world) before doing what it tests, for the lab's time report
//! (`tests/lab/report`).
//!
//! A [`SetupClock`] started at the top of a setup function appends one row
//! to `$PILLAR_LAB_WORK/setup-times` when it is dropped: the test binary's
//! target name, the step, its seconds and its depth (a step started inside
//! another, such as kube-controller-manager inside a cluster's start, has
//! depth 1 and is not counted twice). Outside the lab it records nothing.
use std::{
    io::Write,
    sync::atomic::{AtomicUsize, Ordering},
    time::Instant,
};

/// Setup steps running now (lab test binaries run one test at a time).
static DEPTH: AtomicUsize = AtomicUsize::new(0);

/// One setup step being timed; recorded when dropped, failed or not.
pub struct SetupClock {
    step: &'static str,
    start: Instant,
    depth: usize,
}

/// Starts timing `step` (for example `"ClaimBed::start"`).
pub fn start(step: &'static str) -> SetupClock {
    SetupClock {
        step,
        start: Instant::now(),
        depth: DEPTH.fetch_add(1, Ordering::SeqCst),
    }
}

/// The running test binary's target name: its file name less cargo's hash.
fn target_name() -> Option<String> {
    let exe = std::env::current_exe().ok()?;
    let name = exe.file_name()?.to_str()?;
    Some(match name.rsplit_once('-') {
        Some((target, _hash)) => target.to_owned(),
        None => name.to_owned(),
    })
}

impl Drop for SetupClock {
    fn drop(&mut self) {
        DEPTH.fetch_sub(1, Ordering::SeqCst);
        let (Some(work), Some(target)) = (std::env::var_os("PILLAR_LAB_WORK"), target_name())
        else {
            return;
        };
        let row = format!(
            "{target}\t{}\t{:.1}\t{}\n",
            self.step,
            self.start.elapsed().as_secs_f64(),
            self.depth
        );
        // A report row lost to a full disk is no reason to fail a test.
        let _ = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(std::path::Path::new(&work).join("setup-times"))
            .and_then(|mut f| f.write_all(row.as_bytes()));
    }
}
