//! The names in each HBA folder, listed once and then checked instead of
//! listed again.
//!
//! Finding a storage object by name means looking in every HBA folder (an
//! object's folder is `core/<hba>/<name>`, and nothing maps a name to its
//! HBA), so every export and unexport looked into all of them: four system
//! calls per HBA (open, two directory reads, close). A listing kept from
//! before is still exact when the folder's link count (two plus one per
//! object folder) says it holds as many objects as the listing and every
//! name listed is still there: two calls per HBA. Anything else, including
//! a filesystem that does not count subfolders in the link count, lists
//! the folder again.
use crate::error::Error;
use configfs::Folder;
use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Mutex,
};

/// The last listing of each HBA folder under `core`, by folder name.
#[derive(Debug, Default)]
pub(crate) struct HbaListings {
    listed: Mutex<BTreeMap<String, Listing>>,
}

/// A clone keeps no listing: it lists every folder on its first look.
impl Clone for HbaListings {
    fn clone(&self) -> Self {
        Self::default()
    }
}

#[derive(Debug)]
struct Listing {
    link_count: u64,
    names: Vec<String>,
}

impl HbaListings {
    /// The names in the HBA folder `hba` of `core`, sorted, from the kept
    /// listing when it is still exact, else listed (and kept).
    pub fn children(&self, core: &Folder, hba: &str) -> Result<Vec<String>, Error> {
        let Some(link_count) = core.link_count(hba)? else {
            return Ok(Vec::new());
        };
        let mut listed = self.listed.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(kept) = listed.get(hba) {
            let same_count = kept.link_count == link_count
                && link_count.checked_sub(2) == Some(kept.names.len() as u64);
            if same_count
                && kept
                    .names
                    .iter()
                    .all(|n| core.exists(&format!("{hba}/{n}")))
            {
                return Ok(kept.names.clone());
            }
        }
        let names = core.children(hba)?;
        listed.insert(
            hba.to_owned(),
            Listing {
                link_count,
                names: names.clone(),
            },
        );
        Ok(names)
    }

    /// Forgets the listings of HBA folders not in `present` (removed since).
    pub fn keep_only(&self, present: &BTreeSet<&str>) {
        let mut listed = self.listed.lock().unwrap_or_else(|e| e.into_inner());
        listed.retain(|hba, _| present.contains(hba.as_str()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use configfs::Tree;
    use std::fs;

    #[test]
    fn a_kept_listing_is_used_only_while_it_is_exact() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        fs::create_dir_all(dir.path().join("core/iblock_0/a"))?;
        let core = Tree::at(dir.path())
            .folder("core")?
            .ok_or("core not opened")?;
        let listings = HbaListings::default();
        assert_eq!(listings.children(&core, "iblock_0")?, ["a"]);
        // The same object removed and another made: the count is the same,
        // the listed name is gone, so the folder is listed again.
        fs::remove_dir(dir.path().join("core/iblock_0/a"))?;
        fs::create_dir(dir.path().join("core/iblock_0/b"))?;
        assert_eq!(listings.children(&core, "iblock_0")?, ["b"]);
        // An object added: the count changed.
        fs::create_dir(dir.path().join("core/iblock_0/c"))?;
        assert_eq!(listings.children(&core, "iblock_0")?, ["b", "c"]);
        fs::remove_dir(dir.path().join("core/iblock_0/b"))?;
        fs::remove_dir(dir.path().join("core/iblock_0/c"))?;
        assert!(listings.children(&core, "iblock_0")?.is_empty());
        assert!(listings.children(&core, "iblock_9")?.is_empty());
        listings.keep_only(&BTreeSet::new());
        assert!(listings
            .listed
            .lock()
            .map_err(|e| e.to_string())?
            .is_empty());
        Ok(())
    }
}
