//! A change of each encrypted zvol's own key (README, "Encryption keys",
//! rotation): a new random key replaces the one the agent made, with
//! `lzc_change_key`, which re-wraps the zvol's master key and rewrites no
//! data. Three writes make one change, each atomic, in an order that leaves
//! a key that opens the zvol after a crash at any point:
//!
//! 1. the new key, sealed, into [`sealed_key::NEXT_PROPERTY`];
//! 2. the change itself (from then on only the new key opens the zvol);
//! 3. the new sealed key into [`sealed_key::PROPERTY`], then
//!    [`sealed_key::NEXT_PROPERTY`] removed.
//!
//! A zvol found with [`sealed_key::NEXT_PROPERTY`] had a change interrupted: the key
//! that opens it decides whether step 2 happened, and the properties are
//! settled to say so before its key is loaded or changed again.
use super::ZfsBackend;
use crate::{
    error::AgentError,
    sealed_key::{self, NEXT_PROPERTY},
};
use sys::zfs::{DatasetName, Error as ZfsError, RawKey};

impl ZfsBackend {
    /// [`crate::backend::Backend::change_volume_keys`]: each zvol under the
    /// parent that is its own encryption root and holds its sealed key
    /// (an encrypted zvol the agent made; restores and clones share their
    /// source's key) gets a new key. Imported zvols keep theirs.
    pub(super) fn change_all_keys(&self) -> (u32, Vec<String>) {
        if self.keks.is_none() {
            return (0, Vec::new());
        }
        let zvols = match self.zfs.list_zvols(&self.parent) {
            Ok(zvols) => zvols,
            Err(e) => return (0, vec![format!("{}: {e}", self.parent)]),
        };
        let (mut changed, mut failed) = (0, Vec::new());
        for name in zvols {
            match self.change_own_key(&name) {
                Ok(true) => changed += 1,
                Ok(false) => {}
                Err(e) => failed.push(format!("{name}: {e}")),
            }
        }
        (changed, failed)
    }

    /// Changes the key of zvol `name` when it is an encryption root with a
    /// sealed key; `false` when it is not.
    fn change_own_key(&self, name: &DatasetName) -> Result<bool, AgentError> {
        let Some(keks) = &self.keks else {
            return Ok(false);
        };
        if self.zfs.property(name, sealed_key::PROPERTY)?.is_none()
            || self.zfs.property(name, "encryptionroot")?.as_deref() != Some(name.as_str())
        {
            return Ok(false);
        }
        let was_loaded = self.zfs.key_status(name)? == sys::zfs::KeyStatus::Available;
        self.ensure_key(name)?;
        let changed = self.change_loaded_key(name, keks);
        if !was_loaded {
            // As it was found: a volume not in use keeps no key loaded.
            if let Err(e) = self.zfs.unload_key(name) {
                tracing::warn!(volume = %name, error = %e, "the key loaded for its change could not be unloaded");
            }
        }
        changed
    }

    /// The three writes of a change of the loaded key of `name` (after
    /// settling an interrupted one).
    fn change_loaded_key(
        &self,
        name: &DatasetName,
        keks: &sealed_key::Keks,
    ) -> Result<bool, AgentError> {
        self.settle_key_change(name)?;
        let sealing = |e: sealed_key::SealError| AgentError::Internal(format!("zvol {name}: {e}"));
        let key = sealed_key::Kek::new_volume_key().map_err(sealing)?;
        let sealed = keks.current().seal(&key).map_err(sealing)?;
        self.zfs.set_property(name, NEXT_PROPERTY, &sealed)?;
        self.zfs.change_key(name, &key)?;
        self.zfs.set_property(name, sealed_key::PROPERTY, &sealed)?;
        self.zfs.inherit_property(name, NEXT_PROPERTY)?;
        tracing::info!(volume = %name, "changed the key of an encrypted zvol");
        Ok(true)
    }

    /// Settles a change of the key of encryption root `root` that was
    /// interrupted (it holds [`NEXT_PROPERTY`]): when the new key opens it
    /// the change was made, and the new key becomes its sealed key;
    /// otherwise the change was not made, and the new key goes. Nothing to
    /// do without [`NEXT_PROPERTY`].
    pub(super) fn settle_key_change(&self, root: &DatasetName) -> Result<(), AgentError> {
        let Some(next) = self.zfs.property(root, NEXT_PROPERTY)? else {
            return Ok(());
        };
        let keks = self.keks.as_ref().ok_or_else(|| {
            AgentError::FailedPrecondition(format!(
                "zvol {root}: a change of its key was interrupted, and this agent has no key-encryption key to settle it"
            ))
        })?;
        let (key, _): (RawKey, _) = keks.open(&next).map_err(|e| {
            AgentError::FailedPrecondition(format!("zvol {root}: {NEXT_PROPERTY}: {e}"))
        })?;
        match self.zfs.check_key(root, &key) {
            Ok(()) => {
                self.zfs.set_property(root, sealed_key::PROPERTY, &next)?;
                tracing::info!(volume = %root, "an interrupted change of its key was made: its new key is kept");
            }
            Err(ZfsError::WrongKey { .. }) => {
                tracing::info!(volume = %root, "an interrupted change of its key was not made: its key stays");
            }
            Err(e) => return Err(e.into()),
        }
        self.zfs.inherit_property(root, NEXT_PROPERTY)?;
        Ok(())
    }
}
