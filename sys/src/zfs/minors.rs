//! A zvol's kernel device node, `/dev/zdN`, found without waiting for udev.
//!
//! The kernel (devtmpfs) makes `/dev/zdN` as soon as ZFS adds a zvol's disk.
//! udev's `/dev/zvol/<name>` link comes only once udev has run its rules for
//! the device: with many zvols at once, seconds later, and for some not at
//! all (see [`super::nodes`]). Which dataset a `zd` device serves is the
//! kernel's answer to `BLKZNAME` on it, the question `zvol_id` asks for udev.
//!
//! Each node is asked once. The answers are kept per node name together with
//! the node's inode number, which devtmpfs gives anew to every device it
//! adds, so a name the kernel hands to another zvol is asked again. Waiters
//! share the asking: each takes the next node that nobody has asked yet.
use std::{
    collections::{BTreeMap, BTreeSet},
    fs::{self, File},
    io,
    os::unix::fs::DirEntryExt,
    path::{Path, PathBuf},
    sync::{Mutex, MutexGuard},
    time::Duration,
};

/// How long a waiter sleeps between two looks for new nodes.
pub(crate) const POLL: Duration = Duration::from_millis(5);

/// A `zd` node under `/dev`: its name (`zd16`) and inode number.
type Node = (String, u64);

/// What is known of the `zd` nodes under one `/dev`.
#[derive(Debug, Default)]
pub(crate) struct Minors {
    /// The dataset each node was found to serve, by node.
    known: BTreeMap<Node, String>,
    /// The nodes some waiter is asking now.
    asking: BTreeSet<Node>,
}

/// The answers of this process, for the real `/dev`.
static MINORS: Mutex<Minors> = Mutex::new(Minors {
    known: BTreeMap::new(),
    asking: BTreeSet::new(),
});

fn lock(minors: &Mutex<Minors>) -> MutexGuard<'_, Minors> {
    minors.lock().unwrap_or_else(|e| e.into_inner())
}

/// The node `/dev/zdN` of the zvol `dataset`, if the kernel has made it.
pub(crate) fn find_node(dataset: &str) -> Option<PathBuf> {
    find(&MINORS, Path::new("/dev"), dataset, ask_kernel)
}

/// Asks the zvol device at `node` which dataset it serves.
fn ask_kernel(node: &Path) -> io::Result<String> {
    let device = File::open(node)?;
    super::ffi::zvol_name(&device).map_err(io::Error::from_raw_os_error)
}

/// The zvol whole-disk nodes under `dev` (`zd0`, `zd16`; not `zd16p1`).
fn zvol_nodes(dev: &Path) -> Vec<Node> {
    let Ok(entries) = fs::read_dir(dev) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            super::nodes::is_zvol_disk(&name).then(|| (name, e.ino()))
        })
        .collect()
}

/// The node under `dev` that serves `dataset`, asking each node not yet
/// known with `ask` (one at a time, the others' asks in flight skipped).
/// A node whose ask fails (a new zvol's first open fails while ZFS's
/// namespace lock is taken) is asked again at the next call.
fn find(
    shared: &Mutex<Minors>,
    dev: &Path,
    dataset: &str,
    ask: impl Fn(&Path) -> io::Result<String>,
) -> Option<PathBuf> {
    let present = zvol_nodes(dev);
    let mut failed = BTreeSet::new();
    loop {
        let next = {
            let mut minors = lock(shared);
            minors.known.retain(|node, _| present.contains(node));
            if let Some(((name, _), _)) = minors.known.iter().find(|(_, d)| *d == dataset) {
                return Some(dev.join(name));
            }
            let next = present
                .iter()
                .find(|&n| {
                    !minors.known.contains_key(n)
                        && !minors.asking.contains(n)
                        && !failed.contains(n)
                })?
                .clone();
            minors.asking.insert(next.clone());
            next
        };
        let answer = ask(&dev.join(&next.0));
        let mut minors = lock(shared);
        minors.asking.remove(&next);
        match answer {
            Ok(served) => {
                minors.known.insert(next, served);
            }
            Err(e) => {
                tracing::debug!(node = %next.0, error = %e, "could not ask a zvol device its name");
                failed.insert(next);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{cell::RefCell, os::unix::fs::MetadataExt};

    struct Dev(PathBuf);

    impl Dev {
        fn new(tag: &str) -> io::Result<Self> {
            let root = std::env::temp_dir().join(format!("minors-{tag}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&root);
            fs::create_dir_all(&root)?;
            Ok(Self(root))
        }

        /// A stand-in node whose content is the dataset it serves.
        fn add(&self, node: &str, dataset: &str) -> io::Result<()> {
            fs::write(self.0.join(node), dataset)
        }
    }

    impl Drop for Dev {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn each_node_is_asked_once_and_a_reused_name_again() -> io::Result<()> {
        let dev = Dev::new("reuse")?;
        dev.add("zd0", "p/a")?;
        dev.add("zd16", "p/b")?;
        dev.add("zd16p1", "p/b-part")?;
        dev.add("sda", "p/c")?;
        let asked = RefCell::new(Vec::new());
        let ask = |node: &Path| {
            asked.borrow_mut().push(node.to_path_buf());
            fs::read_to_string(node)
        };
        let minors = Mutex::new(Minors::default());
        assert_eq!(find(&minors, &dev.0, "p/b", ask), Some(dev.0.join("zd16")));
        assert_eq!(find(&minors, &dev.0, "p/a", ask), Some(dev.0.join("zd0")));
        assert_eq!(find(&minors, &dev.0, "p/c", ask), None, "sda is no zvol");
        assert_eq!(asked.borrow().len(), 2, "{:?}", asked.borrow());

        // The kernel gives zd16 to another zvol: a new node, a new inode
        // (made while the old one lives, so the two inodes differ).
        let before = fs::metadata(dev.0.join("zd16"))?.ino();
        dev.add("new", "p/d")?;
        fs::rename(dev.0.join("new"), dev.0.join("zd16"))?;
        assert_ne!(fs::metadata(dev.0.join("zd16"))?.ino(), before);
        assert_eq!(find(&minors, &dev.0, "p/b", ask), None, "p/b is gone");
        assert_eq!(find(&minors, &dev.0, "p/d", ask), Some(dev.0.join("zd16")));
        assert_eq!(asked.borrow().len(), 3, "{:?}", asked.borrow());
        Ok(())
    }

    #[test]
    fn a_failed_ask_is_tried_again_at_the_next_call_only() -> io::Result<()> {
        let dev = Dev::new("retry")?;
        dev.add("zd0", "p/a")?;
        let tries = RefCell::new(0);
        let busy_once = |node: &Path| {
            *tries.borrow_mut() += 1;
            if *tries.borrow() == 1 {
                Err(io::Error::from_raw_os_error(512))
            } else {
                fs::read_to_string(node)
            }
        };
        let minors = Mutex::new(Minors::default());
        assert_eq!(find(&minors, &dev.0, "p/a", busy_once), None);
        assert_eq!(*tries.borrow(), 1);
        assert_eq!(
            find(&minors, &dev.0, "p/a", busy_once),
            Some(dev.0.join("zd0"))
        );
        assert_eq!(*tries.borrow(), 2);
        Ok(())
    }

    #[test]
    fn a_node_another_waiter_is_asking_is_left_to_it() -> io::Result<()> {
        let dev = Dev::new("shared")?;
        dev.add("zd0", "p/a")?;
        let node = zvol_nodes(&dev.0).remove(0);
        let minors = Mutex::new(Minors::default());
        lock(&minors).asking.insert(node.clone());
        let never = |_: &Path| -> io::Result<String> { panic!("asked a node in flight") };
        assert_eq!(find(&minors, &dev.0, "p/a", never), None);
        // The other waiter's answer arrives.
        lock(&minors).asking.remove(&node);
        lock(&minors).known.insert(node, "p/a".into());
        assert_eq!(find(&minors, &dev.0, "p/a", never), Some(dev.0.join("zd0")));
        Ok(())
    }
}
