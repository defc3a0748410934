//! Waiting for a device node that udev creates (`/dev/zvol/<name>`,
//! `/dev/<vg>/<lv>`, ...), with a bounded timeout.
//!
//! One udev monitor on the `block` subsystem serves every wait of the
//! process (a thread of its own reads it and wakes the waiters); a waiter
//! notes the events seen *before* it looks at the path, so an event that
//! lands between the look and the wait is not slept through; each event
//! (and, as a safety net against a monitor that misses events, every
//! [`RECHECK`]) the path is looked at again. udev sends its
//! event after its rules ran, so the symlink exists when the event arrives.
//! Where no udev monitor can be opened (no udevd, no netlink), the wait
//! falls back to looking every [`RECHECK`].
//!
//! udev can lose events: in the lab, 50 zvols created at once by 50 `zfs
//! create -V` processes left 14 of them without their `/dev/zvol` link for
//! good (the kernel device was there; udev had no record of it). A caller
//! that knows how to find such devices passes a *nudge* to
//! [`wait_for_node_nudging`], which asks udev again ([`retrigger`]) while
//! the node is missing.
//!
//! ```no_run
//! use std::time::Duration;
//! let node = sys::udev::wait_for_node("/dev/zvol/tank/vol1".as_ref(), Duration::from_secs(10))?;
//! println!("device {}", node.display());
//! # Ok::<(), sys::udev::Error>(())
//! ```
use rustix::event::{poll, PollFd, PollFlags};
use std::{
    path::{Path, PathBuf},
    sync::{Condvar, Mutex, OnceLock},
    time::{Duration, Instant},
};

/// How often the path is looked at even without an event.
pub const RECHECK: Duration = Duration::from_millis(100);

/// An error while waiting for a device node.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The node did not appear within the timeout.
    #[error("{} did not appear within {waited:?}", path.display())]
    Timeout {
        /// The node waited for.
        path: PathBuf,
        /// How long we waited.
        waited: Duration,
    },
}

/// How long a node may be missing before the first nudge, and between
/// nudges. The zvol nudge asks only when udev's queue is empty, when the
/// event it is missing is lost, not late; in the lab, 50 zvols created at
/// once through the agent lost 7 events, and their creates waited out this
/// period after the queue had emptied (it was 3 s).
pub const NUDGE_EVERY: Duration = Duration::from_secs(1);

/// Waits until `path` exists (a symlink is followed to its device), up to
/// `timeout`; returns the path of the device node it resolves to.
pub fn wait_for_node(path: &Path, timeout: Duration) -> Result<PathBuf, Error> {
    wait_for_node_nudging(path, timeout, || {})
}

/// As [`wait_for_node`], calling `nudge` every [`NUDGE_EVERY`] while the
/// node is missing (to ask udev again for events it may have lost).
pub fn wait_for_node_nudging(
    path: &Path,
    timeout: Duration,
    mut nudge: impl FnMut(),
) -> Result<PathBuf, Error> {
    let events = Events::shared();
    let start = Instant::now();
    let mut nudged = start;
    loop {
        // Which events were seen, then look: an event after the look
        // changes the count, and the wait below does not sleep through it.
        let seen = events.map(Events::count);
        if let Ok(real) = path.canonicalize() {
            return Ok(real);
        }
        let elapsed = start.elapsed();
        if elapsed >= timeout {
            return Err(Error::Timeout {
                path: path.to_owned(),
                waited: elapsed,
            });
        }
        if nudged.elapsed() >= NUDGE_EVERY {
            nudge();
            nudged = Instant::now();
        }
        let slice = (timeout - elapsed).min(RECHECK);
        match (events, seen) {
            (Some(events), Some(seen)) => events.wait_past(seen, slice),
            _ => std::thread::sleep(slice),
        }
    }
}

/// What the monitor's thread calls with every event it reads, once
/// [`watch`] set it.
type Watcher = fn(&udev::Event);
static WATCHER: Mutex<Option<Watcher>> = Mutex::new(None);

/// Has the process's udev monitor call `watcher` with every event it reads
/// (it starts the monitor if none runs yet); a later call replaces it.
pub(crate) fn watch(watcher: Watcher) {
    *WATCHER.lock().unwrap_or_else(|e| e.into_inner()) = Some(watcher);
    let _ = Events::shared();
}

/// The process's one udev monitor on the `block` subsystem, read by one
/// thread (`udev-events`, started on first use) that counts the events and
/// wakes every waiter, which then looks at its own path. With a monitor per
/// waiter, each of 50 waiters received and parsed every event of all the
/// others: in the lab, 50 zvols created at once kept the guest's CPUs busy
/// with that alone.
struct Events {
    count: Mutex<u64>,
    changed: Condvar,
}

impl Events {
    /// The shared monitor, or `None` where none can be opened (no udevd,
    /// no netlink): waiters then look every [`RECHECK`].
    fn shared() -> Option<&'static Events> {
        static SHARED: OnceLock<Option<&'static Events>> = OnceLock::new();
        *SHARED.get_or_init(|| {
            let events: &'static Events = Box::leak(Box::new(Events {
                count: Mutex::new(0),
                changed: Condvar::new(),
            }));
            let (opened, started) = std::sync::mpsc::sync_channel(1);
            std::thread::Builder::new()
                .name("udev-events".into())
                .spawn(move || {
                    let monitor = udev::MonitorBuilder::new()
                        .and_then(|b| b.match_subsystem("block"))
                        .and_then(|b| b.listen());
                    let socket = match monitor {
                        Ok(socket) => {
                            let _ = opened.send(true);
                            socket
                        }
                        Err(_) => {
                            let _ = opened.send(false);
                            return;
                        }
                    };
                    events.read(&socket);
                })
                .ok()?;
            started.recv().ok().filter(|ok| *ok).map(|_| events)
        })
    }

    /// Counts the monitor's events for ever; on a poll error other than an
    /// interruption the thread ends and waiters go on looking every
    /// [`RECHECK`].
    fn read(&self, socket: &udev::MonitorSocket) {
        loop {
            let mut fds = [PollFd::new(socket, PollFlags::IN)];
            match poll(&mut fds, None) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(_) => return,
            }
            let watcher = *WATCHER.lock().unwrap_or_else(|e| e.into_inner());
            let mut arrived = 0;
            for event in socket.iter() {
                arrived += 1;
                if let Some(watcher) = watcher {
                    watcher(&event);
                }
            }
            if arrived > 0 {
                *self.count.lock().unwrap_or_else(|e| e.into_inner()) += arrived;
                self.changed.notify_all();
            }
        }
    }

    /// The events counted so far.
    fn count(&self) -> u64 {
        *self.count.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits up to `slice` for an event past the first `seen`.
    fn wait_past(&self, seen: u64, slice: Duration) {
        let count = self.count.lock().unwrap_or_else(|e| e.into_inner());
        let _ = self
            .changed
            .wait_timeout_while(count, slice, |c| *c == seen);
    }
}

/// Whether udevd has events queued or running: it keeps `/run/udev/queue`
/// while its queue is not empty (what `udevadm settle` waits for).
pub fn events_queued() -> bool {
    Path::new("/run/udev/queue").exists()
}

/// Asks udev to process the device at `sysfs` (`/sys/class/block/<dev>`)
/// again, as `udevadm trigger --action=change` does: writes `change` to its
/// `uevent` file. The rules run again; nothing on the device changes.
pub fn retrigger(sysfs: &Path) -> std::io::Result<()> {
    std::fs::write(sysfs.join("uevent"), b"change")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_existing_path_returns_at_once_resolved() -> Result<(), Box<dyn std::error::Error>> {
        let dir = std::env::temp_dir().join(format!("udev-wait-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let target = dir.join("node");
        std::fs::write(&target, b"")?;
        let link = dir.join("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&target, &link)?;
        let got = wait_for_node(&link, Duration::from_secs(1))?;
        assert_eq!(got, target.canonicalize()?);
        std::fs::remove_dir_all(&dir)?;
        Ok(())
    }

    #[test]
    fn a_missing_path_times_out_within_bounds() {
        let start = Instant::now();
        let err = wait_for_node(
            Path::new("/dev/zvol/no-such-pool/no-such-volume"),
            Duration::from_millis(300),
        )
        .expect_err("must be refused");
        let took = start.elapsed();
        assert!(matches!(err, Error::Timeout { .. }), "{err}");
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(3),
            "{took:?}"
        );
        assert!(err
            .to_string()
            .contains("/dev/zvol/no-such-pool/no-such-volume"));
    }

    #[test]
    fn a_missing_node_is_nudged_every_period() {
        let mut nudges = 0;
        let err = wait_for_node_nudging(
            Path::new("/dev/zvol/no-such-pool/nudged"),
            NUDGE_EVERY * 2 + Duration::from_millis(500),
            || nudges += 1,
        )
        .expect_err("must time out");
        assert!(matches!(err, Error::Timeout { .. }), "{err}");
        assert_eq!(nudges, 2);
    }
}
