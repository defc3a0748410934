//! The kernel NFS server's caches of exports and clients.
//!
//! nfsd keeps what `rpc.mountd` told it (which client may use which export,
//! and the export each file handle names) in caches whose entries hold a
//! reference to the exported filesystem's mount. `exportfs -r` changes the
//! table but leaves entries a client used in them until they expire: a
//! removed client is served from them, and an unmount of the filesystem
//! after its export went is refused as busy. [`flush_caches`] marks every
//! entry expired as `exportfs -f` does, in process; [`purge_caches`] also
//! has the kernel remove them now, as an unmount needs.
use std::{io, path::Path};

/// The caches flushed: clients' admissions, exports, file-handle keys.
pub const CACHES: [&str; 3] = ["auth.unix.ip", "nfsd.export", "nfsd.fh"];

/// Empties the kernel NFS server's client and export caches (writes the
/// time now to each one's `flush` under `/proc/net/rpc`). nfsd asks mountd
/// again on each client's next call. A host without the NFS server (no
/// such files) has nothing cached: that is success.
pub fn flush_caches() -> io::Result<()> {
    flush_caches_in(Path::new("/proc/net/rpc"))
}

/// [`flush_caches`] of the caches under `root`.
pub fn flush_caches_in(root: &Path) -> io::Result<()> {
    CACHES
        .iter()
        .try_for_each(|cache| write_flush(&root.join(cache).join("flush")))
}

/// [`flush_caches`] so that the kernel also removes the flushed entries
/// (and drops their references to exported mounts) now, as an unmount
/// needs: a flush only marks entries expired, and the kernel removes them
/// at once only when its flush time is not ahead of the clock. Each flush
/// within one second moves that time a second ahead (`exportfs -r` flushes
/// too), so a cache whose flush time is ahead is waited for, up to
/// `limit` in all, before it is flushed.
pub fn purge_caches(limit: std::time::Duration) -> io::Result<()> {
    purge_caches_in(Path::new("/proc/net/rpc"), limit)
}

/// [`purge_caches`] of the caches under `root`.
pub fn purge_caches_in(root: &Path, limit: std::time::Duration) -> io::Result<()> {
    let deadline = std::time::Instant::now() + limit;
    for cache in CACHES {
        let flush = root.join(cache).join("flush");
        // The kernel removes the flushed entries at once only when it
        // took the flush time as the clock's (none ahead of it): a flush
        // by someone else in the same second moves it ahead, and the
        // entries then stay until the clock catches up and a flush or
        // the cache's cleaner runs (up to 30 s later). So: wait until
        // the flush time is behind the clock, flush, and do it again
        // while the time it set is ahead.
        while let Some(ahead) = flush_time(&flush)? {
            while now_seconds() <= ahead && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            write_flush(&flush)?;
            let took = flush_time(&flush)?.is_none_or(|set| set <= now_seconds());
            if took || std::time::Instant::now() >= deadline {
                break;
            }
        }
    }
    Ok(())
}

/// The flush time of a cache's `flush` file, in seconds of the wall
/// clock; `None` when the server has no such cache.
fn flush_time(flush: &Path) -> io::Result<Option<u64>> {
    match std::fs::read_to_string(flush) {
        Ok(text) => Ok(Some(text.trim().parse::<u64>().unwrap_or_default())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("{}: {e}", flush.display()),
        )),
    }
}

/// Writes the time now to one cache's `flush` file (the kernel takes its
/// own clock; a missing file is success).
fn write_flush(flush: &Path) -> io::Result<()> {
    match std::fs::write(flush, format!("{}\n", now_seconds())) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("{}: {e}", flush.display()),
        )),
    }
}

fn now_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    type Result = std::result::Result<(), Box<dyn std::error::Error>>;

    #[test]
    fn each_cache_is_flushed_and_a_missing_server_is_success() -> Result {
        let dir = tempfile::tempdir()?;
        flush_caches_in(dir.path())?;
        for cache in CACHES {
            std::fs::create_dir_all(dir.path().join(cache))?;
        }
        flush_caches_in(dir.path())?;
        for cache in CACHES {
            let written = std::fs::read_to_string(dir.path().join(cache).join("flush"))?;
            assert!(written.trim().parse::<u64>()? > 1_700_000_000, "{written}");
        }
        Ok(())
    }

    #[test]
    fn a_purge_waits_for_a_flush_time_ahead_of_the_clock() -> Result {
        let dir = tempfile::tempdir()?;
        let cache = dir.path().join("nfsd.export");
        std::fs::create_dir_all(&cache)?;
        // A flush time two seconds ahead: the purge waits until it passed.
        let ahead = now_seconds() + 2;
        std::fs::write(cache.join("flush"), format!("{ahead}\n"))?;
        purge_caches_in(dir.path(), std::time::Duration::from_secs(10))?;
        let written: u64 = std::fs::read_to_string(cache.join("flush"))?
            .trim()
            .parse()?;
        assert!(written > ahead, "flushed at {written}, after {ahead}");
        // With no time to wait, it flushes at once.
        let far = now_seconds() + 3600;
        std::fs::write(cache.join("flush"), format!("{far}\n"))?;
        let start = std::time::Instant::now();
        purge_caches_in(dir.path(), std::time::Duration::ZERO)?;
        assert!(start.elapsed() < std::time::Duration::from_secs(1));
        Ok(())
    }
}
