//! zvol block devices that udev left without their `/dev/zvol/<name>` link,
//! and the nudge that asks udev for them again (see [`crate::udev`]).
use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    sync::atomic::{AtomicUsize, Ordering},
    sync::Mutex,
    time::Instant,
};

/// The zvol whole-disk devices (`zd0`, `zd16`, ...) under `sys_block`
/// (`/sys/class/block`) that no symlink under `dev_zvol` (`/dev/zvol`)
/// resolves to, as their sysfs paths.
pub(crate) fn unlinked_zvol_devices(sys_block: &Path, dev_zvol: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(sys_block) else {
        return Vec::new();
    };
    let mut linked = BTreeSet::new();
    collect_link_targets(dev_zvol, &mut linked);
    let mut out: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            is_zvol_disk(&name) && !linked.contains(name.as_ref())
        })
        .map(|e| e.path())
        .collect();
    out.sort();
    out
}

/// The device names (`zd0`) the symlinks under `dir` resolve to.
fn collect_link_targets(dir: &Path, out: &mut BTreeSet<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            collect_link_targets(&entry.path(), out);
        } else if kind.is_symlink() {
            if let Some(name) = entry
                .path()
                .canonicalize()
                .ok()
                .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
            {
                out.insert(name);
            }
        }
    }
}

/// How many waits for a zvol's node are in progress in this process.
static WAITERS: AtomicUsize = AtomicUsize::new(0);

/// One wait for a zvol's node in progress, while it lives.
pub(crate) struct Waiting;

impl Waiting {
    pub(crate) fn start() -> Self {
        WAITERS.fetch_add(1, Ordering::SeqCst);
        Waiting
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        WAITERS.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How many times each zvol device was asked for again after udev handled
/// its event without the link, since it last had its link.
static RELINKS: Mutex<BTreeMap<String, u32>> = Mutex::new(BTreeMap::new());

/// At most this many asks per zvol device in a row: a device whose link
/// udev never makes is not asked for for ever.
const MAX_RELINKS: u32 = 3;

/// Watches udev's events (see [`crate::udev::watch`]): a zvol disk whose
/// `add` or `change` event udev has handled without a `/dev/zvol` link
/// (its `zvol_id` could not open the new device while ZFS's namespace lock
/// was taken, which many creates at once do) is asked for again at once,
/// instead of when udev's queue has emptied. Only while this process waits
/// for a zvol's node ([`Waiting`]): the process does not act on other
/// tools' zvols when it has none of its own in flight.
pub(crate) fn relink_lost(event: &udev::Event) {
    if WAITERS.load(Ordering::SeqCst) == 0 {
        return;
    }
    let name = event.sysname().to_string_lossy();
    let handled = matches!(
        event.event_type(),
        udev::EventType::Add | udev::EventType::Change
    );
    if !handled || !is_zvol_disk(&name) || event.devtype() != Some("disk".as_ref()) {
        return;
    }
    let linked = event.property_value("DEVLINKS").is_some_and(|links| {
        links
            .to_string_lossy()
            .split_whitespace()
            .any(|l| l.starts_with("/dev/zvol/"))
    });
    let mut relinks = RELINKS.lock().unwrap_or_else(|e| e.into_inner());
    if linked {
        relinks.remove(name.as_ref());
        return;
    }
    let asked = relinks.entry(name.into_owned()).or_insert(0);
    if *asked >= MAX_RELINKS {
        return;
    }
    *asked += 1;
    retrigger_logged(event.syspath());
}

/// Asks udev again for the zvol device at `sysfs`, and logs it.
fn retrigger_logged(sysfs: &Path) {
    match crate::udev::retrigger(sysfs) {
        Ok(()) => {
            tracing::info!(device = %sysfs.display(), "asked udev again for a zvol without its /dev/zvol link")
        }
        Err(e) => {
            tracing::warn!(device = %sysfs.display(), error = %e, "could not retrigger udev")
        }
    }
}

/// Whether `name` is a zvol's whole disk (`zd0`, `zd16`; not `zd16p1`).
fn is_zvol_disk(name: &str) -> bool {
    name.strip_prefix("zd")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// When the last sweep ran; many waiters share one sweep per period.
static LAST_SWEEP: Mutex<Option<Instant>> = Mutex::new(None);

/// Asks udev again for every zvol device without its link, at most once per
/// [`crate::udev::NUDGE_EVERY`] in this process however many waiters call,
/// and only while udev's event queue is empty: a device whose event is still
/// queued is not lost, and asking again would only add to udev's work (in the
/// lab, retriggering queued devices made 50 concurrent creates 5x slower).
pub(crate) fn nudge_unlinked_zvols() {
    if crate::udev::events_queued() {
        return;
    }
    {
        let mut last = LAST_SWEEP.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|t| t.elapsed() < crate::udev::NUDGE_EVERY) {
            return;
        }
        *last = Some(Instant::now());
    }
    for dev in unlinked_zvol_devices(Path::new("/sys/class/block"), Path::new("/dev/zvol")) {
        retrigger_logged(&dev);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{fs, os::unix::fs::symlink};

    #[test]
    fn only_whole_zvol_disks_without_a_link_are_found() -> std::io::Result<()> {
        let root = std::env::temp_dir().join(format!("zvol-nodes-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let (sys, dev, zvol) = (root.join("sys"), root.join("dev"), root.join("dev/zvol"));
        fs::create_dir_all(&dev)?;
        for d in ["zd0", "zd16", "zd16p1", "zd32", "sda", "zdx"] {
            fs::create_dir_all(sys.join(d))?;
            fs::write(dev.join(d), b"")?;
        }
        fs::create_dir_all(zvol.join("pool/parent"))?;
        symlink(dev.join("zd0"), zvol.join("pool/parent/a"))?;
        symlink(dev.join("zd16p1"), zvol.join("pool/parent/b-part1"))?;
        symlink(dev.join("gone"), zvol.join("pool/dangling"))?;
        let found = unlinked_zvol_devices(&sys, &zvol);
        assert_eq!(found, vec![sys.join("zd16"), sys.join("zd32")]);
        fs::remove_dir_all(&root)
    }
}
