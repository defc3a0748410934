//! Native encryption of volumes: one raw 256-bit wrapping key per volume
//! (`encryption=aes-256-gcm`, `keyformat=raw`), given with the create and
//! then loaded, checked, unloaded and changed through libzfs_core, never
//! through a `zfs` process, a key file or a command line. ZFS wraps each
//! dataset's own master key with it, so a change of key rewrites no data.
//!
//! A [`RawKey`] is zeroed when dropped and never printed; the copies the
//! calls hand to libzfs_core are zeroed after them too. (libzfs_core copies
//! the key into the ioctl's argument list and frees that list without
//! zeroing it, as `zfs load-key` does: a limit of the library.)
use super::*;
use ffi::KEY_LEN;
use zeroize::Zeroizing;

/// The properties of an encrypted create, as `zfs create -o` takes them.
pub(super) const ENCRYPTED: [(&str, &str); 3] = [
    ("encryption", "aes-256-gcm"),
    ("keyformat", "raw"),
    ("keylocation", "prompt"),
];

/// The properties only [`Zfs::create_encrypted_zvol`] sets.
pub(super) const ENCRYPTION_PROPERTIES: [&str; 4] =
    ["encryption", "keyformat", "keylocation", "pbkdf2iters"];

/// `EACCES` (Linux): the key does not open the dataset, or none is loaded.
const EACCES: c_int = 13;

/// A raw ZFS wrapping key: [`RawKey::LEN`] bytes, zeroed when dropped,
/// never printed (its `Debug` shows no byte).
pub struct RawKey(Zeroizing<[u8; KEY_LEN]>);

impl RawKey {
    /// The length of a raw key in bytes.
    pub const LEN: usize = KEY_LEN;

    /// A key of exactly [`RawKey::LEN`] bytes; `None` for another length.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        let array: [u8; KEY_LEN] = bytes.try_into().ok()?;
        Some(Self(Zeroizing::new(array)))
    }

    /// Its bytes (to seal it, or to hand it on).
    pub fn bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }

    /// A copy for one libzfs_core call, which takes a mutable buffer.
    pub(super) fn copy(&self) -> Zeroizing<[u8; KEY_LEN]> {
        Zeroizing::new(*self.0)
    }
}

impl fmt::Debug for RawKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RawKey(<redacted>)")
    }
}

/// Whether a dataset's key is loaded (`keystatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyStatus {
    /// The dataset is not encrypted.
    NotEncrypted,
    /// Its key is loaded: its data can be read (a volume has its device).
    Available,
    /// Its key is not loaded: a volume has no device node.
    Unavailable,
}

impl Zfs {
    /// Creates an encrypted volume (see [`Zfs::create_zvol`] for the
    /// checks): `encryption=aes-256-gcm`, `keyformat=raw`,
    /// `keylocation=prompt`, with `key` as its wrapping key, which is loaded
    /// when the create returns. `spec.properties` may not set the
    /// encryption properties themselves.
    pub fn create_encrypted_zvol(&self, spec: &ZvolSpec, key: &RawKey) -> Result<(), Error> {
        self.create_volume(spec, Some(key))
    }

    /// Loads the key of encrypted dataset `name`; a volume's device node
    /// appears. A key already loaded is left as it is (`Ok`; the kernel does
    /// not compare it then). A key that is not the dataset's is
    /// [`Error::WrongKey`] and changes nothing.
    pub fn load_key(&self, name: &DatasetName, key: &RawKey) -> Result<(), Error> {
        let ds = name.as_str();
        let c_name = c_string(ds, ds)?;
        match self.lzc.load_key(&c_name, false, &mut key.copy()) {
            Ok(()) | Err(errno::EEXIST) => Ok(()),
            Err(e) => Err(key_error(ds, "load key of", e)),
        }
    }

    /// Checks `key` against encrypted dataset `name` without loading it
    /// (`lzc_load_key` with `noop`): `Ok` when it is the dataset's key,
    /// [`Error::WrongKey`] when not. Nothing is loaded or changed either way.
    pub fn check_key(&self, name: &DatasetName, key: &RawKey) -> Result<(), Error> {
        let ds = name.as_str();
        let c_name = c_string(ds, ds)?;
        self.lzc
            .load_key(&c_name, true, &mut key.copy())
            .map_err(|e| key_error(ds, "check key of", e))
    }

    /// Unloads the key of encrypted dataset `name`; a volume's device node
    /// goes. A key not loaded is `Ok`; a volume in use is [`Error::Busy`].
    pub fn unload_key(&self, name: &DatasetName) -> Result<(), Error> {
        let ds = name.as_str();
        let c_name = c_string(ds, ds)?;
        match self.lzc.unload_key(&c_name) {
            Ok(()) | Err(EACCES) => Ok(()),
            Err(e) => Err(key_error(ds, "unload key of", e)),
        }
    }

    /// Changes the wrapping key of encrypted dataset `name` to `new`; its
    /// key must be loaded. The data is not rewritten; the old key stops
    /// opening the dataset.
    pub fn change_key(&self, name: &DatasetName, new: &RawKey) -> Result<(), Error> {
        let ds = name.as_str();
        let c_name = c_string(ds, ds)?;
        let props = {
            let lib = self.lib();
            let mut nv = new_nvlist(ds)?;
            translate_encryption(&lib, ds, &mut nv, true)?;
            nv
        };
        self.lzc
            .change_key(&c_name, &props, &mut new.copy())
            .map_err(|e| match e {
                EACCES => Error::KeyNotLoaded {
                    dataset: ds.to_owned(),
                },
                e => key_error(ds, "change key of", e),
            })
    }

    /// Whether the key of dataset `name` is loaded (`keystatus`).
    pub fn key_status(&self, name: &DatasetName) -> Result<KeyStatus, Error> {
        Ok(match self.property(name, "keystatus")?.as_deref() {
            Some("available") => KeyStatus::Available,
            Some("unavailable") => KeyStatus::Unavailable,
            _ => KeyStatus::NotEncrypted,
        })
    }
}

/// The error of a key call's errno.
fn key_error(ds: &str, op: &'static str, e: c_int) -> Error {
    match e {
        EACCES => Error::WrongKey {
            dataset: ds.to_owned(),
        },
        errno::ENOENT => Error::NotFound {
            dataset: ds.to_owned(),
        },
        e => kernel(ds, op, e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raw_key_is_exactly_32_bytes_and_never_printed() {
        assert!(RawKey::from_slice(&[7; 31]).is_none());
        assert!(RawKey::from_slice(&[7; 33]).is_none());
        let key = RawKey::from_slice(&[0xab; 32]).expect("32 bytes");
        assert_eq!(key.bytes(), &[0xab; 32]);
        let shown = format!("{key:?}");
        assert_eq!(shown, "RawKey(<redacted>)");
        assert!(!shown.contains("ab") && !shown.contains("171"));
    }

    #[test]
    fn the_encryption_properties_are_the_ones_only_an_encrypted_create_sets() {
        for (name, _) in ENCRYPTED {
            assert!(ENCRYPTION_PROPERTIES.contains(&name), "{name}");
        }
    }
}
