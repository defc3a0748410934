//! udev's `/dev/zvol/<name>` links of this process's zvols, asked for again
//! when udev lost them.
//!
//! The process itself uses the kernel's node (see [`super::minors`]) and
//! does not wait for the link, but operators and other tools look for it.
//! udev loses links when many zvols appear at once: its `zvol_id` cannot
//! open a new zvol while ZFS's namespace lock is taken.
use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    sync::atomic::{AtomicUsize, Ordering},
    sync::Mutex,
};

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

/// The zvol devices whose links this process looks after.
#[derive(Debug, Default)]
struct Links {
    /// Devices (`zd16`) found through the kernel before udev linked them.
    expected: BTreeSet<String>,
    /// How many times each device was asked for again, since it last had
    /// its link.
    asked: BTreeMap<String, u32>,
}

static LINKS: Mutex<Links> = Mutex::new(Links {
    expected: BTreeSet::new(),
    asked: BTreeMap::new(),
});

/// At most this many asks per zvol device in a row: a device whose link
/// udev never makes is not asked for for ever.
const MAX_RELINKS: u32 = 3;

/// Marks the zvol device at `node` (`/dev/zd16`), which this process found
/// before udev linked it, as one whose link [`relink_lost`] looks after.
pub(crate) fn expect_link(node: &Path) {
    if let Some(name) = node.file_name().and_then(|n| n.to_str()) {
        lock().expected.insert(name.to_owned());
    }
}

fn lock() -> std::sync::MutexGuard<'static, Links> {
    LINKS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Watches udev's events (see [`crate::udev::watch`]): a zvol disk whose
/// `add` or `change` event udev has handled without a `/dev/zvol` link is
/// asked for again at once. Only for the devices this process found before
/// their link ([`expect_link`]), and any zvol while the process waits for a
/// zvol's node ([`Waiting`]): the process leaves other tools' zvols alone
/// when it has none of its own in flight.
pub(crate) fn relink_lost(event: &udev::Event) {
    let name = event.sysname().to_string_lossy();
    if !is_zvol_disk(&name) || event.devtype() != Some("disk".as_ref()) {
        return;
    }
    let mut links = lock();
    let kind = event.event_type();
    if kind == udev::EventType::Remove {
        links.expected.remove(name.as_ref());
        links.asked.remove(name.as_ref());
        return;
    }
    if !matches!(kind, udev::EventType::Add | udev::EventType::Change) {
        return;
    }
    let linked = event.property_value("DEVLINKS").is_some_and(|links| {
        links
            .to_string_lossy()
            .split_whitespace()
            .any(|l| l.starts_with("/dev/zvol/"))
    });
    if linked {
        links.expected.remove(name.as_ref());
        links.asked.remove(name.as_ref());
        return;
    }
    if WAITERS.load(Ordering::SeqCst) == 0 && !links.expected.contains(name.as_ref()) {
        return;
    }
    let asked = links.asked.entry(name.to_string()).or_insert(0);
    if *asked >= MAX_RELINKS {
        links.expected.remove(name.as_ref());
        return;
    }
    *asked += 1;
    drop(links);
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
pub(crate) fn is_zvol_disk(name: &str) -> bool {
    name.strip_prefix("zd")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_whole_zvol_disks_count() {
        for (name, disk) in [
            ("zd0", true),
            ("zd16", true),
            ("zd16p1", false),
            ("zd", false),
            ("zdx", false),
            ("sda", false),
        ] {
            assert_eq!(is_zvol_disk(name), disk, "{name}");
        }
    }
}
