//! Volume keys at rest (README, "Encryption keys"): each encrypted zvol's
//! raw key is sealed with AES-256-GCM under the key-encryption key (KEK)
//! only the agent's pod receives, and the sealed text is what the zvol's
//! user property [`PROPERTY`] holds. Nothing else the agent writes carries
//! a key: opened keys live in [`RawKey`]s, zeroed when dropped.
//!
//! The sealed text is `v1:<KEK id>:<base64 of nonce, ciphertext and tag>`.
//! The KEK id (the first 8 bytes of the KEK's SHA-256, in hex) names the
//! KEK that sealed it, so that an agent given another KEK says so instead
//! of failing to authenticate.
use base64::{engine::general_purpose::STANDARD, Engine};
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use std::{fmt, path::Path};
use sys::zfs::RawKey;
use zeroize::Zeroizing;

/// The zvol user property that holds its sealed key.
pub const PROPERTY: &str = "pillar-csi.bhyoo.com:sealed-key";

/// The zvol user property that holds its new sealed key while its key is
/// being changed (`backend::zfs::key_change`).
pub const NEXT_PROPERTY: &str = "pillar-csi.bhyoo.com:sealed-key-next";

/// The properties only the agent sets.
pub const PROPERTIES: [&str; 2] = [PROPERTY, NEXT_PROPERTY];

/// The format of the sealed text.
const VERSION: &str = "v1";

/// What the seal authenticates besides the key: the format, so that a
/// sealed text of another use of the same KEK cannot pass for a key.
const AAD: &[u8] = b"pillar-csi.bhyoo.com:sealed-key v1";

/// Why a key could not be sealed or opened, or the KEK not loaded. No
/// variant carries key material.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SealError {
    /// The KEK file is missing, unreadable or not 32 bytes.
    #[error("key-encryption key {path}: {why}")]
    Kek {
        /// The file.
        path: String,
        /// What is wrong with it.
        why: String,
    },
    /// The sealed text is not of the form `v1:<KEK id>:<base64>`.
    #[error("the sealed key is not in the v1 form: {0}")]
    Malformed(String),
    /// Another KEK sealed it.
    #[error("the key was sealed under key-encryption key {sealed_by}, but this agent has {have}")]
    OtherKek {
        /// The id in the sealed text.
        sealed_by: String,
        /// The id of the agent's KEK.
        have: String,
    },
    /// The seal does not authenticate: the text was changed.
    #[error("the sealed key does not authenticate under key-encryption key {0}: it was changed or damaged")]
    Damaged(String),
    /// The system's random generator failed.
    #[error("no random bytes from the system: {0}")]
    Random(String),
}

/// The key-encryption key: 32 bytes, kept only in memory.
pub struct Kek {
    id: String,
    key: LessSafeKey,
}

impl fmt::Debug for Kek {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kek").field("id", &self.id).finish()
    }
}

impl Kek {
    /// Reads the KEK from `path`: exactly 32 bytes (the value of a
    /// Kubernetes Secret's key, mounted as a file).
    pub fn load(path: &Path) -> Result<Self, SealError> {
        let error = |why: String| SealError::Kek {
            path: path.display().to_string(),
            why,
        };
        let bytes = Zeroizing::new(std::fs::read(path).map_err(|e| error(e.to_string()))?);
        Self::from_bytes(&bytes).map_err(|len| {
            error(format!(
                "{len} bytes; a key-encryption key is 32 random bytes"
            ))
        })
    }

    /// A KEK of these 32 bytes; `Err` with the length otherwise.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, usize> {
        if bytes.len() != 32 {
            return Err(bytes.len());
        }
        let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
        let id = digest.as_ref()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let key = UnboundKey::new(&AES_256_GCM, bytes).map_err(|_| bytes.len())?;
        Ok(Self {
            id,
            key: LessSafeKey::new(key),
        })
    }

    /// Its id: the first 8 bytes of its SHA-256, in hex.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// A new random volume key.
    pub fn new_volume_key() -> Result<RawKey, SealError> {
        let mut bytes = Zeroizing::new([0u8; RawKey::LEN]);
        SystemRandom::new()
            .fill(bytes.as_mut())
            .map_err(|e| SealError::Random(e.to_string()))?;
        Ok(RawKey::from_slice(bytes.as_ref()).expect("RawKey::LEN bytes"))
    }

    /// `key` sealed under this KEK, with a fresh random nonce.
    pub fn seal(&self, key: &RawKey) -> Result<String, SealError> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|e| SealError::Random(e.to_string()))?;
        let mut sealed = Zeroizing::new(key.bytes().to_vec());
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(AAD),
                &mut *sealed,
            )
            .map_err(|_| SealError::Random("sealing failed".into()))?;
        let mut text = nonce.to_vec();
        text.extend_from_slice(&sealed);
        Ok(format!("{VERSION}:{}:{}", self.id, STANDARD.encode(text)))
    }

    /// The key sealed in `text`; an error names why it cannot be opened.
    pub fn open(&self, text: &str) -> Result<RawKey, SealError> {
        let mut parts = text.splitn(3, ':');
        let (Some(VERSION), Some(id), Some(body)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(SealError::Malformed(format!("{} characters", text.len())));
        };
        if id != self.id {
            return Err(SealError::OtherKek {
                sealed_by: id.to_owned(),
                have: self.id.clone(),
            });
        }
        let mut bytes = Zeroizing::new(
            STANDARD
                .decode(body)
                .map_err(|e| SealError::Malformed(e.to_string()))?,
        );
        if bytes.len() != NONCE_LEN + RawKey::LEN + AES_256_GCM.tag_len() {
            return Err(SealError::Malformed(format!(
                "{} sealed bytes",
                bytes.len()
            )));
        }
        let (nonce, sealed) = bytes.split_at_mut(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce)
            .map_err(|_| SealError::Malformed("nonce".into()))?;
        let opened = self
            .key
            .open_in_place(nonce, Aad::from(AAD), sealed)
            .map_err(|_| SealError::Damaged(self.id.clone()))?;
        RawKey::from_slice(opened).ok_or_else(|| SealError::Malformed("key length".into()))
    }
}

/// The agent's key-encryption keys: the current one, which seals every new
/// key and every re-seal, and, while the KEK is being rotated, the previous
/// one, which still opens what it sealed.
#[derive(Debug)]
pub struct Keks {
    current: Kek,
    previous: Option<Kek>,
}

impl Keks {
    /// The current KEK and, during a rotation, the previous one.
    pub fn new(current: Kek, previous: Option<Kek>) -> Self {
        Self { current, previous }
    }

    /// The KEK that seals.
    pub fn current(&self) -> &Kek {
        &self.current
    }

    /// The key sealed in `text`, and whether the previous KEK sealed it
    /// (so that it is to be sealed again under the current one).
    pub fn open(&self, text: &str) -> Result<(RawKey, bool), SealError> {
        match (self.current.open(text), &self.previous) {
            (Err(SealError::OtherKek { sealed_by, .. }), Some(previous))
                if sealed_by == previous.id =>
            {
                Ok((previous.open(text)?, true))
            }
            (opened, _) => opened.map(|key| (key, false)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kek(byte: u8) -> Kek {
        Kek::from_bytes(&[byte; 32]).expect("32 bytes")
    }

    #[test]
    fn a_sealed_key_opens_to_itself_and_shows_no_key_byte() {
        let kek = kek(1);
        let key = RawKey::from_slice(&[0x42; 32]).expect("key");
        let sealed = kek.seal(&key).expect("seal");
        assert!(sealed.starts_with(&format!("v1:{}:", kek.id())), "{sealed}");
        assert!(!sealed.contains(&STANDARD.encode([0x42; 32])), "{sealed}");
        assert_eq!(kek.open(&sealed).expect("open").bytes(), key.bytes());
        // A fresh nonce each time: two seals of one key differ.
        assert_ne!(kek.seal(&key).expect("seal"), sealed);
    }

    #[test]
    fn another_kek_a_changed_text_and_junk_are_named() {
        let key = Kek::new_volume_key().expect("random");
        let sealed = kek(1).seal(&key).expect("seal");
        match kek(2).open(&sealed) {
            Err(SealError::OtherKek { sealed_by, have }) => {
                assert_eq!(sealed_by, kek(1).id());
                assert_eq!(have, kek(2).id());
            }
            other => panic!("{other:?}"),
        }
        let (head, body) = sealed.rsplit_once(':').expect("form");
        let mut raw = STANDARD.decode(body).expect("base64");
        raw[20] ^= 1;
        let changed = format!("{head}:{}", STANDARD.encode(raw));
        assert_eq!(
            kek(1).open(&changed).err(),
            Some(SealError::Damaged(kek(1).id().to_owned()))
        );
        for junk in ["", "v2:x:y", "v1:only", &format!("v1:{}:!!", kek(1).id())] {
            assert!(
                matches!(kek(1).open(junk), Err(SealError::Malformed(_))),
                "{junk:?}"
            );
        }
    }

    #[test]
    fn a_kek_file_must_be_32_bytes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("kek");
        std::fs::write(&path, [9u8; 31]).expect("write");
        let e = Kek::load(&path).expect_err("31 bytes");
        assert!(e.to_string().contains("31 bytes"), "{e}");
        std::fs::write(&path, [9u8; 32]).expect("write");
        assert_eq!(Kek::load(&path).expect("32 bytes").id(), kek(9).id());
        let e = Kek::load(&dir.path().join("missing")).expect_err("missing");
        assert!(matches!(e, SealError::Kek { .. }), "{e}");
    }

    #[test]
    fn volume_keys_are_random() {
        let a = Kek::new_volume_key().expect("random");
        let b = Kek::new_volume_key().expect("random");
        assert_ne!(a.bytes(), b.bytes());
    }

    #[test]
    fn during_a_rotation_the_previous_kek_still_opens_what_it_sealed() {
        let key = Kek::new_volume_key().expect("random");
        let old = kek(1).seal(&key).expect("seal");
        let new = kek(2).seal(&key).expect("seal");
        let rotating = Keks::new(kek(2), Some(kek(1)));
        let (opened, stale) = rotating.open(&old).expect("old");
        assert!(stale && opened.bytes() == key.bytes());
        let (opened, stale) = rotating.open(&new).expect("new");
        assert!(!stale && opened.bytes() == key.bytes());
        assert!(matches!(
            rotating.open(&kek(3).seal(&key).expect("seal")),
            Err(SealError::OtherKek { .. })
        ));
        assert!(matches!(
            Keks::new(kek(2), None).open(&old),
            Err(SealError::OtherKek { .. })
        ));
    }
}
