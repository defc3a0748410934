//! What each iblock HBA folder held when this handle last listed it, so a
//! plan does not list every HBA folder again for each export.
//!
//! configfs gives a folder made again a new inode number, and rtslib (like
//! this crate) makes one HBA folder per storage object and removes the two
//! together: an HBA folder whose inode number is the one of its last
//! listing holds what it held then. The folders this handle's own steps
//! touch are forgotten after each run, whatever its outcome.
use crate::error::Error;
use configfs::{Folder, Step};
use std::{collections::BTreeMap, sync::Mutex};

/// The last listing of each HBA folder of `core`, by folder name.
#[derive(Debug, Default)]
pub(crate) struct Listings {
    by_folder: Mutex<BTreeMap<String, (u64, Vec<String>)>>,
}

impl Listings {
    /// The entries of HBA folder `hba` of `core`, whose inode number is
    /// `ino`: its last listing when the number is the same, else a new one.
    /// An empty folder is not kept: it is a creation under way (another
    /// writer's, between the HBA folder and its object) or a leftover to
    /// remove, and is listed every time.
    pub(crate) fn children(
        &self,
        core: &Folder,
        hba: &str,
        ino: u64,
    ) -> Result<Vec<String>, Error> {
        if let Some((known, names)) = self.lock().get(hba) {
            if *known == ino {
                return Ok(names.clone());
            }
        }
        let names = core.children(hba)?;
        if !names.is_empty() {
            self.lock().insert(hba.to_owned(), (ino, names.clone()));
        }
        Ok(names)
    }

    /// Forgets every listing.
    pub(crate) fn forget_all(&self) {
        self.lock().clear();
    }

    /// Keeps only the HBA folders `present` names (sorted by name, as
    /// [`Folder::list_with_inodes`] gives them).
    pub(crate) fn keep_only(&self, present: &[(String, u64)]) {
        self.lock().retain(|hba, _| {
            present
                .binary_search_by(|(name, _)| name.as_str().cmp(hba))
                .is_ok()
        });
    }

    /// Forgets the HBA folders that `steps` make, change or remove.
    pub(crate) fn forget_touched(&self, steps: &[Step]) {
        let mut by_folder = self.lock();
        for step in steps {
            let touched = match step {
                Step::Mkdir(p) | Step::Rmdir(p) | Step::Unlink(p) => p,
                Step::Write { path, .. } => path,
                Step::Symlink { link, .. } => link,
            };
            if let Some(hba) = touched
                .strip_prefix("core/")
                .and_then(|r| r.split('/').next())
            {
                by_folder.remove(hba);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, (u64, Vec<String>)>> {
        self.by_folder.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use configfs::Tree;
    use std::fs;

    #[test]
    fn a_folder_is_listed_again_when_made_again_or_touched(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        fs::create_dir_all(dir.path().join("core/iblock_0/a"))?;
        let tree = Tree::at(dir.path());
        let core = tree.folder("core")?.ok_or("no core")?;
        let listings = Listings::default();
        let ino = |core: &Folder| -> Result<u64, Error> { Ok(core.list_with_inodes()?[0].1) };
        assert_eq!(listings.children(&core, "iblock_0", ino(&core)?)?, ["a"]);
        // Another object put into the same folder is not seen: the rule is
        // one object per HBA folder.
        fs::create_dir(dir.path().join("core/iblock_0/b"))?;
        assert_eq!(listings.children(&core, "iblock_0", ino(&core)?)?, ["a"]);
        // A step of this handle under the folder forgets it.
        listings.forget_touched(&[Step::rmdir("core/iblock_0/b")]);
        assert_eq!(
            listings.children(&core, "iblock_0", ino(&core)?)?,
            ["a", "b"]
        );
        // The folder made again (a new inode) is listed again.
        fs::create_dir(dir.path().join("core/new"))?;
        fs::remove_dir_all(dir.path().join("core/iblock_0"))?;
        fs::rename(
            dir.path().join("core/new"),
            dir.path().join("core/iblock_0"),
        )?;
        assert_eq!(
            listings.children(&core, "iblock_0", ino(&core)?)?,
            Vec::<String>::new()
        );
        // An empty folder is not kept: what another writer puts into it
        // next is seen.
        fs::create_dir(dir.path().join("core/iblock_0/c"))?;
        assert_eq!(listings.children(&core, "iblock_0", ino(&core)?)?, ["c"]);
        // A folder gone is dropped; a failed scan forgets them all.
        fs::create_dir(dir.path().join("core/iblock_1"))?;
        listings.keep_only(&core.list_with_inodes()?);
        assert!(listings.lock().contains_key("iblock_0"));
        listings.keep_only(&[]);
        assert!(listings.lock().is_empty());
        listings.children(&core, "iblock_0", ino(&core)?)?;
        assert!(!listings.lock().is_empty());
        listings.forget_all();
        assert!(listings.lock().is_empty());
        Ok(())
    }
}
