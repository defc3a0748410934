//! The bare liblvm2cmd call under each operation, for benchmarks to time
//! the floor.
//!
//! An [`Lvm`](super::Lvm) request is one or more `lvm2_run` calls plus what
//! the service adds around them: the hop to its worker thread and back,
//! the command line built from checked values, the reading of the report
//! or of the new LV's device in sysfs. A [`RawLvm`] is the call alone: it
//! owns a liblvm2cmd handle on the calling thread and runs the command
//! line it is given, so a benchmark can time the same command both ways
//! and see what the service costs above the library.
//!
//! liblvm2cmd allows one handle per process: a `RawLvm` cannot start while
//! an [`Lvm`](super::Lvm) service runs, nor a service while a `RawLvm`
//! lives ([`Error::AlreadyRunning`]).
//!
//! ```no_run
//! use sys::lvm::{floor::{command_line, RawLvm}, LvName, Request, VgName};
//!
//! let mut raw = RawLvm::start()?;
//! let (vg, lv) = (VgName::new("data-vg")?, LvName::new("scratch")?);
//! let create = Request::CreateLinear { vg: vg.clone(), lv: lv.clone(), size: 4 << 20 };
//! raw.run(&command_line(&create))?;
//! raw.run(&format!("lvremove -y {vg}/{lv}"))?;
//! drop(raw); // lvm2_exit; an `Lvm` service may start now
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
use super::{
    error::Error,
    ffi::{Handle, Outcome},
    worker, Claim, Request,
};
use std::ffi::CString;

/// The command line of the LVM command at the heart of `request`, exactly
/// as the [`Lvm`](super::Lvm) worker runs it: time it with [`RawLvm::run`]
/// for the floor of the request. Reports some requests run before or after
/// it (a thin create's check of its pool, an extend's read-back) are not
/// part of it; they are what the service adds.
pub fn command_line(request: &Request) -> String {
    worker::command(request).line()
}

/// A command that did not succeed: `lvm2_run`'s code and LVM's error lines.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{command}` failed with code {code}: {}", messages.join("; "))]
pub struct Failed {
    /// The command line.
    pub command: String,
    /// `lvm2_run`'s code (0 when the line held a NUL byte and was not run).
    pub code: i32,
    /// The lines LVM logged as errors, in order.
    pub messages: Vec<String>,
}

/// A liblvm2cmd handle on the calling thread, with no service around it.
/// Not `Send`: it is used and released on the thread that started it.
pub struct RawLvm {
    // Dropped in this order: the handle (lvm2_exit), then the claim.
    handle: Handle,
    _claim: Claim,
}

impl std::fmt::Debug for RawLvm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawLvm").finish_non_exhaustive()
    }
}

impl RawLvm {
    /// Initialises liblvm2cmd on this thread; [`Error::AlreadyRunning`]
    /// while an [`Lvm`](super::Lvm) service or another `RawLvm` holds it,
    /// [`Error::Init`] when `lvm2_init` fails.
    pub fn start() -> Result<Self, Error> {
        let claim = Claim::take()?;
        let handle = Handle::init().ok_or(Error::Init)?;
        Ok(Self {
            handle,
            _claim: claim,
        })
    }

    /// Runs one LVM command line as `lvm2_run` takes it (`lvs -a vg`; no
    /// quoting is applied) and returns the lines it printed as output, or
    /// its code and error lines when it did not succeed.
    pub fn run(&mut self, cmdline: &str) -> Result<Vec<String>, Failed> {
        let failed = |code, messages| Failed {
            command: cmdline.to_owned(),
            code,
            messages,
        };
        let line = CString::new(cmdline)
            .map_err(|_| failed(0, vec!["the command line holds a NUL byte".into()]))?;
        let Outcome { code, lines } = self.handle.run(&line);
        let print = lvm_sys::LVM2_LOG_PRINT as i32;
        if code != lvm_sys::LVM2_COMMAND_SUCCEEDED as i32 {
            let errors = lines.into_iter().filter(|l| l.level < print);
            return Err(failed(code, errors.map(|l| l.text).collect()));
        }
        Ok(lines
            .into_iter()
            .filter(|l| l.level == print)
            .map(|l| l.text)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lvm::{LvName, Lvm, VgName};

    #[test]
    fn the_floor_runs_the_workers_command_line() -> Result<(), Box<dyn std::error::Error>> {
        let (vg, lv) = (VgName::new("labvg")?, LvName::new("pvc-1")?);
        let create = Request::CreateLinear {
            vg: vg.clone(),
            lv: lv.clone(),
            size: 4 << 20,
        };
        assert_eq!(
            command_line(&create),
            "lvcreate -y --type linear -n pvc-1 -L 4194304b labvg"
        );
        let uuid = crate::lvm::LvmUuid::new("7PfhgY-xJRY-sfrw-hcr0-Z1KJ-QmEr-26wILP")?;
        assert_eq!(
            command_line(&Request::Remove { vg, lv, uuid }),
            "lvremove -y --select lv_uuid=7PfhgY-xJRY-sfrw-hcr0-Z1KJ-QmEr-26wILP labvg/pvc-1"
        );
        Ok(())
    }

    // One test, as the claim is the process's: tests in parallel would race.
    #[test]
    fn the_floor_and_the_service_never_share_liblvm2cmd() {
        let held = Claim::take().expect("no one holds the claim yet");
        assert!(matches!(RawLvm::start(), Err(Error::AlreadyRunning)));
        assert!(matches!(Lvm::start(), Err(Error::AlreadyRunning)));
        assert!(matches!(Claim::take(), Err(Error::AlreadyRunning)));
        drop(held);
        let again = Claim::take().expect("the claim is given back on drop");
        drop(again);
    }
}
