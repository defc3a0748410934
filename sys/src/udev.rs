//! Waiting for a device node that udev creates (`/dev/zvol/<name>`,
//! `/dev/<vg>/<lv>`, ...), with a bounded timeout.
//!
//! A udev monitor on the `block` subsystem is opened *before* the first look
//! at the path, so an event that lands between the look and the wait is not
//! lost; each event (and, as a safety net against a monitor that misses
//! events, every [`RECHECK`]) the path is looked at again. udev sends its
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
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use std::{
    path::{Path, PathBuf},
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
    /// Polling the udev monitor failed.
    #[error("polling the udev monitor while waiting for {}: {source}", path.display())]
    Poll {
        /// The node waited for.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// How long a node may be missing before the first nudge, and between nudges.
pub const NUDGE_EVERY: Duration = Duration::from_secs(3);

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
    // A node already there needs no monitor (a netlink socket per call
    // costs every export's device lookup a few system calls).
    if let Ok(real) = path.canonicalize() {
        return Ok(real);
    }
    let start = Instant::now();
    let mut nudged = start;
    // Listen first, then look again: no event can slip between the two.
    let monitor = udev::MonitorBuilder::new()
        .and_then(|b| b.match_subsystem("block"))
        .and_then(|b| b.listen())
        .ok();
    loop {
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
        match &monitor {
            Some(socket) => {
                let ts = Timespec {
                    tv_sec: slice.as_secs() as i64,
                    tv_nsec: i64::from(slice.subsec_nanos()),
                };
                let mut fds = [PollFd::new(socket, PollFlags::IN)];
                match poll(&mut fds, Some(&ts)) {
                    Ok(_) | Err(rustix::io::Errno::INTR) => {}
                    Err(e) => {
                        return Err(Error::Poll {
                            path: path.to_owned(),
                            source: e.into(),
                        })
                    }
                }
                // Drain what arrived; the path is looked at again above.
                for _event in socket.iter() {}
            }
            None => std::thread::sleep(slice),
        }
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
