//! The sealed keys of imported encrypted zvols (README, "Encryption keys").
//!
//! A zvol the agent created keeps its sealed key in its own user property;
//! an imported one is never given a property (docs/import-zvol.md), so its
//! key, sealed under the agent's key-encryption key like any other, is kept
//! here instead: one file per encryption root, named by the root's GUID, in
//! the folder `keys` of the agent's state folder (0700, files 0600, written
//! atomically). Nothing in it is a key in clear. A file goes once no zvol
//! has its GUID any more.
use crate::durable::{self, DurableError};
use std::{
    fs, io,
    path::{Path, PathBuf},
};

/// The folder of sealed keys under the state folder.
pub const FOLDER: &str = "keys";
/// The file name suffix: `<guid>.sealed-key`.
const SUFFIX: &str = ".sealed-key";

/// The store of sealed keys of imported zvols.
#[derive(Debug, Clone)]
pub struct ImportedKeys {
    dir: PathBuf,
}

impl ImportedKeys {
    /// Opens the folder `keys` under `state_dir`, which the first kept key
    /// creates: an agent that imports no encrypted zvol has none.
    pub fn open(state_dir: &Path) -> Result<Self, DurableError> {
        let dir = state_dir.join(FOLDER);
        if dir.is_dir() {
            durable::remove_stale_temporaries(&dir)?;
        }
        Ok(Self { dir })
    }

    fn path(&self, guid: u64) -> PathBuf {
        self.dir.join(format!("{guid}{SUFFIX}"))
    }

    /// The sealed key of the encryption root with GUID `guid`, if kept.
    pub fn get(&self, guid: u64) -> Result<Option<String>, DurableError> {
        let path = self.path(guid);
        match fs::read_to_string(&path) {
            Ok(sealed) => Ok(Some(sealed.trim_end().to_owned())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(durable::io_err(&path)(e)),
        }
    }

    /// Keeps `sealed` for the encryption root with GUID `guid`, replacing
    /// what was kept.
    pub fn put(&self, guid: u64, sealed: &str) -> Result<(), DurableError> {
        durable::create_private_dir(&self.dir)?;
        durable::replace(&self.dir, &self.path(guid), sealed.as_bytes(), || {})
    }

    /// Forgets the sealed key of GUID `guid`; absent is fine.
    pub fn remove(&self, guid: u64) -> Result<(), DurableError> {
        durable::remove(&self.dir, &self.path(guid))
    }

    /// The GUIDs with a sealed key kept, sorted.
    pub fn guids(&self) -> Result<Vec<u64>, DurableError> {
        let mut guids = Vec::new();
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(guids),
            Err(e) => return Err(durable::io_err(&self.dir)(e)),
        };
        for entry in entries {
            let entry = entry.map_err(durable::io_err(&self.dir))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(guid) = name.strip_suffix(SUFFIX).and_then(|g| g.parse().ok()) {
                guids.push(guid);
            }
        }
        guids.sort_unstable();
        Ok(guids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_kept_replaced_listed_and_removed() -> Result<(), Box<dyn std::error::Error>> {
        let state = tempfile::tempdir()?;
        let keys = ImportedKeys::open(state.path())?;
        assert!(
            !state.path().join(FOLDER).exists(),
            "no folder before a key"
        );
        assert_eq!(keys.guids()?, Vec::<u64>::new());
        assert_eq!(keys.get(7)?, None);
        keys.remove(7)?;
        keys.put(7, "sealed-one")?;
        keys.put(12345678901234567890, "sealed-two")?;
        keys.put(7, "sealed-three")?;
        assert_eq!(keys.get(7)?.as_deref(), Some("sealed-three"));
        assert_eq!(keys.guids()?, vec![7, 12345678901234567890]);
        keys.remove(7)?;
        keys.remove(7)?;
        assert_eq!(keys.guids()?, vec![12345678901234567890]);
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| fs::metadata(p).map(|m| m.permissions().mode() & 0o777);
        assert_eq!(mode(&state.path().join(FOLDER))?, 0o700);
        assert_eq!(
            mode(
                &state
                    .path()
                    .join(FOLDER)
                    .join("12345678901234567890.sealed-key")
            )?,
            0o600
        );
        // Another open finds what was kept, and a folder entry that is no
        // key is not listed.
        fs::write(state.path().join(FOLDER).join("notes.txt"), "x")?;
        let again = ImportedKeys::open(state.path())?;
        assert_eq!(again.guids()?, vec![12345678901234567890]);
        Ok(())
    }
}
