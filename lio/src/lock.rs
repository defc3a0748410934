//! rtslib-fb's backstore lock: an exclusive `flock` on its lock file, held
//! while a new HBA index is chosen and created.
//!
//! A handle opens the file once and keeps it open, so that taking the lock
//! costs one `flock` and one `fstat` instead of a path walk, a `mkdir` and an
//! `open` (about 3 ms of an iSCSI export's 45 in the lab). `flock` excludes
//! other open files only, so the handle's own threads take a mutex first. A
//! file removed since it was opened (its link count is zero) is opened again
//! by its path: a lock on a file no longer there excludes no one.
use crate::error::Error;
use std::{
    fs,
    path::PathBuf,
    sync::{Mutex, MutexGuard},
};

/// The lock file of a handle (shared by its clones), open once taken.
#[derive(Debug)]
pub(crate) struct LockFile {
    path: PathBuf,
    open: Mutex<Option<fs::File>>,
}

/// The backstore lock, taken; released when dropped.
#[derive(Debug)]
pub(crate) struct BackstoreLock<'a> {
    file: MutexGuard<'a, Option<fs::File>>,
}

impl LockFile {
    /// The lock file at `path`, opened when first taken.
    pub(crate) fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            open: Mutex::new(None),
        }
    }

    /// Takes the lock: this handle's other threads wait on the mutex,
    /// other processes (and other handles) on the `flock`.
    pub(crate) fn take(&self) -> Result<BackstoreLock<'_>, Error> {
        let mut file = self.open.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let held = match file.take() {
                Some(f) => f,
                None => self.open()?,
            };
            rustix::fs::flock(&held, rustix::fs::FlockOperation::LockExclusive)
                .map_err(|e| self.error(e.into()))?;
            let linked = rustix::fs::fstat(&held)
                .map_err(|e| self.error(e.into()))?
                .st_nlink
                > 0;
            if linked {
                *file = Some(held);
                return Ok(BackstoreLock { file });
            }
            // Removed meanwhile: dropping it releases its lock.
        }
    }

    /// Opens (creates) the lock file, its folder made when missing.
    fn open(&self) -> Result<fs::File, Error> {
        let options = || {
            let mut o = fs::OpenOptions::new();
            o.create(true).truncate(false).write(true);
            o
        };
        match options().open(&self.path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if let Some(dir) = self.path.parent() {
                    fs::create_dir_all(dir).map_err(|e| self.error(e))?;
                }
                options().open(&self.path).map_err(|e| self.error(e))
            }
            opened => opened.map_err(|e| self.error(e)),
        }
    }

    fn error(&self, source: std::io::Error) -> Error {
        Error::Lock {
            path: self.path.clone(),
            source,
        }
    }
}

impl Drop for BackstoreLock<'_> {
    fn drop(&mut self) {
        if let Some(file) = self.file.as_ref() {
            // Closing the file would release it too; it stays open for the
            // next take.
            let _ = rustix::fs::flock(file, rustix::fs::FlockOperation::Unlock);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn locked_elsewhere(path: &Path) -> Result<bool, Box<dyn std::error::Error>> {
        let other = fs::File::open(path)?;
        match rustix::fs::flock(&other, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(false),
            Err(rustix::io::Errno::WOULDBLOCK) => Ok(true),
            Err(e) => Err(e.into()),
        }
    }

    #[test]
    fn the_lock_excludes_other_files_until_dropped_and_survives_removal(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("run/lock");
        let lock = LockFile::new(&path);
        {
            let _held = lock.take()?;
            assert!(
                locked_elsewhere(&path)?,
                "the folder is made, the file locked"
            );
        }
        assert!(!locked_elsewhere(&path)?, "released when dropped");
        // Removed while not held: the next take locks the file now there.
        fs::remove_file(&path)?;
        fs::write(&path, "")?;
        let _held = lock.take()?;
        assert!(locked_elsewhere(&path)?);
        Ok(())
    }

    #[test]
    fn the_handles_threads_take_it_one_at_a_time() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let lock = LockFile::new(dir.path().join("lock"));
        let inside = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            let threads: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| -> Result<(), Error> {
                        for _ in 0..50 {
                            let _held = lock.take()?;
                            let now = inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            assert_eq!(now, 0, "two threads held the lock");
                            std::thread::yield_now();
                            inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                        }
                        Ok(())
                    })
                })
                .collect();
            threads.into_iter().try_for_each(|t| {
                t.join()
                    .map_err(|_| "a thread panicked")?
                    .map_err(Into::into)
            })
        })
    }
}
