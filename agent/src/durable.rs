//! Files the agent keeps in its state folder, written so that a crash
//! leaves either the old content or the new one: a temporary file of this
//! write alone, fsync, rename over the file, fsync of the folder. Fence
//! marks ([`crate::marks`]) and the sealed keys of imported zvols
//! ([`crate::imported_keys`]) are written this way.
use std::{
    fs,
    io::{self, Write},
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
};

/// Where a durable write stopped.
#[derive(Debug, thiserror::Error)]
pub enum DurableError {
    /// The file system refused; the old content (if any) is in place.
    #[error("{path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The new file was renamed into place, but the folder could not be
    /// made durable: whether it survives a crash is unknown.
    #[error("{path} was renamed into place but not made durable: {source}")]
    Unsynced {
        /// The folder.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// The error of an I/O call on `path`.
pub fn io_err(path: &Path) -> impl FnOnce(io::Error) -> DurableError + '_ {
    move |source| DurableError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Makes the entries of folder `dir` durable.
pub fn sync_dir(dir: &Path) -> Result<(), DurableError> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))
}

/// Creates folder `dir` (mode 0700) when it is missing, durably in its
/// parent.
pub fn create_private_dir(dir: &Path) -> Result<(), DurableError> {
    use std::os::unix::fs::DirBuilderExt;
    let existed = dir.is_dir();
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io_err(dir))?;
    if !existed {
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent)?;
        }
    }
    Ok(())
}

/// Replaces file `path` (in folder `dir`, mode 0600) by `body` atomically
/// and durably. Each write has a temporary file of its own (`.<name>.<pid>.
/// <n>.tmp`), so two writes at once never share one. `before_rename` runs
/// between the write and the rename (a test crash point).
pub fn replace(
    dir: &Path,
    path: &Path,
    body: &[u8],
    before_rename: impl FnOnce(),
) -> Result<(), DurableError> {
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let tmp = dir.join(format!(
        ".{}.{}.{}.tmp",
        path.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default(),
        std::process::id(),
        WRITES.fetch_add(1, Ordering::Relaxed)
    ));
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io_err(&tmp))?;
        f.write_all(body).map_err(io_err(&tmp))?;
        f.sync_all().map_err(io_err(&tmp))?;
    }
    before_rename();
    fs::rename(&tmp, path).map_err(io_err(path))?;
    sync_dir(dir).map_err(|e| match e {
        DurableError::Io { path, source } => DurableError::Unsynced { path, source },
        other => other,
    })
}

/// Removes file `path` of folder `dir` durably; absent is fine.
pub fn remove(dir: &Path, path: &Path) -> Result<(), DurableError> {
    match fs::remove_file(path) {
        Ok(()) => sync_dir(dir),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err(path)(e)),
    }
}

/// Removes the temporary files of writes a killed process never renamed
/// into place (this process has written none yet in `dir`).
pub fn remove_stale_temporaries(dir: &Path) -> Result<(), DurableError> {
    let mut removed = false;
    for entry in fs::read_dir(dir).map_err(io_err(dir))? {
        let entry = entry.map_err(io_err(dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') && name.ends_with(".tmp") {
            let path = entry.path();
            fs::remove_file(&path).map_err(io_err(&path))?;
            removed = true;
        }
    }
    if removed {
        sync_dir(dir)?;
    }
    Ok(())
}
