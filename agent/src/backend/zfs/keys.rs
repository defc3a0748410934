//! Encrypted zvols (README, "Encryption keys"): a new one gets a random
//! key of its own, sealed under the agent's key-encryption key into the
//! zvol's user property; a zvol whose key is not loaded (after a reboot)
//! gets it loaded from that property before its device is used; during a
//! rotation of the key-encryption key, every seal is made again under the
//! new one (a change of the zvol's own key is [`super::key_change`]). An
//! imported encrypted zvol gets no property: its key, checked against it
//! first, is kept sealed in the agent's state folder
//! ([`crate::imported_keys`]).
use super::ZfsBackend;
use crate::{
    adopt::refused, backend::ImportKey, error::AgentError, marks::BackendRecord, sealed_key,
    volume::VolumeId,
};
use sys::zfs::{DatasetName, KeyStatus, RawKey, ZvolSpec};

impl ZfsBackend {
    /// Creates the zvol of `spec` encrypted with a new random key, sealed
    /// into [`sealed_key::PROPERTY`] in the same create call.
    pub(super) fn create_encrypted(&self, mut spec: ZvolSpec) -> Result<(), AgentError> {
        let keks = self.keks.as_ref().ok_or_else(|| {
            AgentError::FailedPrecondition(format!(
                "zvol {}: encryption was asked for, and this agent has no key-encryption key (start it with --key-encryption-key-file)",
                spec.name
            ))
        })?;
        let key = sealed_key::Kek::new_volume_key().map_err(sealing(&spec.name))?;
        let sealed = keks.current().seal(&key).map_err(sealing(&spec.name))?;
        spec.properties
            .push((sealed_key::PROPERTY.to_owned(), sealed));
        Ok(self.zfs.create_encrypted_zvol(&spec, &key)?)
    }

    /// Whether the zvol `name` is encrypted.
    pub(super) fn encrypted(&self, name: &DatasetName) -> Result<bool, AgentError> {
        Ok(self.zfs.key_status(name)? != KeyStatus::NotEncrypted)
    }

    /// Makes sure the key of zvol `name` is loaded, so that it has a device
    /// node: a plain zvol, or one whose device node is there, needs nothing
    /// (no call to ZFS). Otherwise the key of its encryption root (itself,
    /// or the origin a restore or clone shares its key with) is opened
    /// from the root's sealed key and loaded. A key that cannot be opened
    /// leaves the zvol without a device, and says why.
    pub(super) fn ensure_key(&self, name: &DatasetName) -> Result<(), AgentError> {
        if sys::zfs::Zfs::device_path(name).exists()
            || self.zfs.key_status(name)? != KeyStatus::Unavailable
        {
            return Ok(());
        }
        let root = match self.zfs.property(name, "encryptionroot")? {
            Some(root) if !root.is_empty() => DatasetName::new(&root)
                .map_err(|e| AgentError::Internal(format!("zvol {name}: encryptionroot: {e}")))?,
            _ => name.clone(),
        };
        let unloadable = |why: String| {
            AgentError::FailedPrecondition(format!(
                "zvol {name} is encrypted and its key is not loaded: {why}; it stays without a device and unexported"
            ))
        };
        if let Err(e) = self.settle_key_change(&root) {
            tracing::warn!(volume = %name, root = %root, error = %e, "an interrupted change of its key could not be settled; its sealed key is tried");
        }
        let sealed = match self.zfs.property(&root, sealed_key::PROPERTY)? {
            Some(sealed) => sealed,
            None => self.imported_sealed_key(&root)?.ok_or_else(|| {
                unloadable(format!(
                    "its encryption root {root} has no {} and was not imported with its key (a key pillar-csi does not hold): load it yourself",
                    sealed_key::PROPERTY
                ))
            })?,
        };
        let keks = self.keks.as_ref().ok_or_else(|| {
            unloadable(
                "this agent has no key-encryption key (start it with --key-encryption-key-file)"
                    .into(),
            )
        })?;
        let (key, _): (RawKey, _) = keks.open(&sealed).map_err(|e| unloadable(e.to_string()))?;
        self.zfs.load_key(&root, &key)?;
        tracing::info!(volume = %name, root = %root, "loaded the key of an encrypted zvol");
        Ok(())
    }

    /// The sealed key kept for imported encryption root `root`, if any.
    fn imported_sealed_key(&self, root: &DatasetName) -> Result<Option<String>, AgentError> {
        let Some(imported) = &self.imported else {
            return Ok(None);
        };
        let Some(guid) = self
            .zfs
            .property(root, "guid")?
            .and_then(|g| g.parse::<u64>().ok())
        else {
            return Ok(None);
        };
        imported
            .get(guid)
            .map_err(|e| AgentError::Internal(format!("zvol {root}: sealed key: {e}")))
    }

    /// The key an import of zvol `name` gives, checked against the zvol
    /// without loading it (nothing changes here): `None` for a plain zvol
    /// given none, the raw key for an encrypted zvol that is its own
    /// encryption root and that the key opens; every other case is refused
    /// (README, "Encryption keys"; docs/import-zvol.md).
    pub(super) fn checked_import_key(
        &self,
        id: &VolumeId,
        name: &DatasetName,
        key: Option<&ImportKey>,
    ) -> Result<Option<RawKey>, AgentError> {
        let refuse = |why: String| refused(id, why);
        if self.zfs.key_status(name)? == KeyStatus::NotEncrypted {
            return match key {
                Some(_) => Err(refuse(format!(
                    "not encrypted: zvol {name} is not encrypted, and a key was given for it; import it through a StorageClass that names no key Secret"
                ))),
                None => Ok(None),
            };
        }
        let root = self
            .zfs
            .property(name, "encryptionroot")?
            .unwrap_or_default();
        if root != name.as_str() {
            return Err(refuse(format!(
                "shared key: zvol {name} takes its key from encryption root {root}; pillar-csi imports only zvols that are their own encryption root"
            )));
        }
        let Some(key) = key else {
            return Err(refuse(format!(
                "key missing: zvol {name} is encrypted and no key was given; name the Secret that holds its key (pillar-csi loads it again after a reboot)"
            )));
        };
        if self.keks.is_none() || self.imported.is_none() {
            return Err(refuse(format!(
                "key missing: zvol {name} is encrypted and this agent has no key-encryption key to keep its key under (start it with --key-encryption-key-file)"
            )));
        }
        let format = self.zfs.property(name, "keyformat")?.unwrap_or_default();
        if format != "raw" && format != "hex" {
            return Err(refuse(format!(
                "key format not supported: zvol {name} has keyformat={format}; pillar-csi imports keys of keyformat=raw or keyformat=hex"
            )));
        }
        let raw = wrapping_key(key.bytes()).ok_or_else(|| {
            refuse(format!(
                "wrong key: the key given for zvol {name} is neither {} bytes nor {} hexadecimal digits; nothing was loaded or changed",
                RawKey::LEN,
                2 * RawKey::LEN
            ))
        })?;
        match self.zfs.check_key(name, &raw) {
            Ok(()) => Ok(Some(raw)),
            Err(sys::zfs::Error::WrongKey { .. }) => Err(refuse(format!(
                "wrong key: the key given does not open zvol {name}; nothing was loaded or changed"
            ))),
            Err(e) => Err(e.into()),
        }
    }

    /// Keeps the key of imported zvol `name` (pinned in `record`) sealed
    /// under the current key-encryption key, by its GUID.
    pub(super) fn keep_imported_key(
        &self,
        name: &DatasetName,
        record: &BackendRecord,
        key: &RawKey,
    ) -> Result<(), AgentError> {
        let (Some(keks), Some(imported), Some(guid)) =
            (&self.keks, &self.imported, pinned_guid(record))
        else {
            return Err(AgentError::Internal(format!(
                "zvol {name}: an imported key cannot be kept without a key-encryption key, a key folder and a GUID"
            )));
        };
        let sealed = keks.current().seal(key).map_err(sealing(name))?;
        imported
            .put(guid, &sealed)
            .map_err(|e| AgentError::Internal(format!("zvol {name}: sealed key: {e}")))
    }

    /// Forgets the sealed key kept for the zvol `record` pinned, once the
    /// zvol is destroyed (none kept is fine).
    pub(super) fn forget_imported_key(&self, record: &BackendRecord) -> Result<(), AgentError> {
        match (&self.imported, pinned_guid(record)) {
            (Some(imported), Some(guid)) => imported
                .remove(guid)
                .map_err(|e| AgentError::Internal(format!("{record}: sealed key: {e}"))),
            _ => Ok(()),
        }
    }

    /// [`crate::backend::Backend::reseal_keys`]: each zvol under the parent
    /// whose sealed key the previous KEK sealed gets it sealed under the
    /// current one, in one property write, and each imported zvol's kept
    /// key likewise in one file write (both atomic: a crash leaves the old
    /// seal, which the previous KEK still opens). No key is loaded or
    /// changed.
    pub(super) fn reseal_all(&self) -> (u32, Vec<String>) {
        let Some(keks) = &self.keks else {
            return (0, Vec::new());
        };
        let zvols = match self.zfs.list_zvols(&self.parent) {
            Ok(zvols) => zvols,
            Err(e) => return (0, vec![format!("{}: {e}", self.parent)]),
        };
        let (mut resealed, mut failed) = (0, Vec::new());
        let mut count = |what: String, outcome: Result<bool, String>| match outcome {
            Ok(true) => resealed += 1,
            Ok(false) => {}
            Err(e) => failed.push(format!("{what}: {e}")),
        };
        for name in zvols {
            let outcome = self
                .zfs
                .property(&name, sealed_key::PROPERTY)
                .map_err(|e| e.to_string())
                .and_then(|sealed| match sealed.map(|s| sealed_again(keks, &s)) {
                    Some(Ok(Some(again))) => self
                        .zfs
                        .set_property(&name, sealed_key::PROPERTY, &again)
                        .map(|()| true)
                        .map_err(|e| e.to_string()),
                    Some(Ok(None)) | None => Ok(false),
                    Some(Err(e)) => Err(e),
                });
            count(name.to_string(), outcome);
        }
        let imported = self.imported.as_ref();
        for guid in imported.and_then(|i| i.guids().ok()).unwrap_or_default() {
            let outcome = match imported.map(|i| (i, i.get(guid))) {
                Some((i, Ok(Some(sealed)))) => match sealed_again(keks, &sealed) {
                    Ok(Some(again)) => i
                        .put(guid, &again)
                        .map(|()| true)
                        .map_err(|e| e.to_string()),
                    Ok(None) => Ok(false),
                    Err(e) => Err(e),
                },
                Some((_, Err(e))) => Err(e.to_string()),
                _ => Ok(false),
            };
            count(format!("imported zvol key of GUID {guid}"), outcome);
        }
        (resealed, failed)
    }
}

/// `sealed` sealed again under the current KEK when the previous one
/// sealed it; `None` when the current one did.
fn sealed_again(keks: &sealed_key::Keks, sealed: &str) -> Result<Option<String>, String> {
    let (key, stale): (RawKey, _) = keks.open(sealed).map_err(|e| e.to_string())?;
    if !stale {
        return Ok(None);
    }
    keks.current()
        .seal(&key)
        .map(Some)
        .map_err(|e| e.to_string())
}

/// The GUID a record pinned, if any.
fn pinned_guid(record: &BackendRecord) -> Option<u64> {
    match record {
        BackendRecord::Zvol {
            guid: Some(guid), ..
        } => guid.parse().ok(),
        _ => None,
    }
}

/// The 32-byte wrapping key of a `keyformat=raw` or `keyformat=hex` zvol
/// from what an import gives: the 32 bytes themselves, or them as 64
/// hexadecimal digits (what a Secret carries through CSI, whose secrets are
/// text). The lengths differ, so neither is taken for the other.
fn wrapping_key(given: &[u8]) -> Option<RawKey> {
    match given.len() {
        RawKey::LEN => RawKey::from_slice(given),
        _ => hex_key(given),
    }
}

/// A key as 64 hexadecimal digits (one newline may follow, as `openssl
/// rand -hex 32 > file` writes it), as its 32 raw bytes.
fn hex_key(text: &[u8]) -> Option<RawKey> {
    let text = text.strip_suffix(b"\n").unwrap_or(text);
    if text.len() != 2 * RawKey::LEN {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut bytes = zeroize::Zeroizing::new([0u8; RawKey::LEN]);
    for (i, pair) in text.chunks(2).enumerate() {
        bytes[i] = (digit(pair[0])? << 4) | digit(pair[1])?;
    }
    RawKey::from_slice(&bytes[..])
}

/// The error of a key that could not be made or sealed.
fn sealing(name: &DatasetName) -> impl Fn(sealed_key::SealError) -> AgentError + '_ {
    move |e| AgentError::Internal(format!("zvol {name}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_keys_are_64_digits_with_one_newline_at_most() {
        let digits = b"00112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF";
        let key = hex_key(digits).expect("64 digits");
        assert_eq!(key.bytes()[..3], [0x00, 0x11, 0x22]);
        assert_eq!(key.bytes()[31], 0xff);
        let mut line = digits.to_vec();
        line.push(b'\n');
        assert_eq!(hex_key(&line).map(|k| *k.bytes()), Some(*key.bytes()));
        line.push(b'\n');
        assert!(hex_key(&line).is_none(), "two newlines");
        assert!(hex_key(&digits[..62]).is_none(), "31 bytes");
        let mut bad = digits.to_vec();
        bad[5] = b'g';
        assert!(hex_key(&bad).is_none(), "not a digit");
        bad[5] = b'+';
        assert!(hex_key(&bad).is_none(), "a sign is no digit");
    }

    #[test]
    fn a_wrapping_key_is_32_bytes_or_64_digits() {
        let raw = [0xabu8; 32];
        let from_raw = wrapping_key(&raw).map(|k| *k.bytes());
        assert_eq!(from_raw, Some(raw));
        let digits = "ab".repeat(32);
        assert_eq!(
            wrapping_key(digits.as_bytes()).map(|k| *k.bytes()),
            Some(raw)
        );
        assert!(wrapping_key(&[1; 31]).is_none());
        assert!(wrapping_key(&[b'a'; 33]).is_none());
        assert!(wrapping_key(b"").is_none());
    }
}
