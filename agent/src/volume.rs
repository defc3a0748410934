//! Agent volume IDs and the names of their exports.
use crate::error::AgentError;

/// The longest volume ID accepted (ZFS names are at most 255 bytes).
pub const MAX_VOLUME_ID: usize = 255;

/// A checked agent volume ID: `<pool>/<name>` or `<vg>/<lv>`.
///
/// Exactly two non-empty components of ASCII letters, digits and `- _ . :`
/// (the intersection of the ZFS and LVM name rules the ID can carry), neither
/// `.` nor `..`; the backend then applies its own stricter rules.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VolumeId {
    id: String,
    split: usize,
}

impl VolumeId {
    /// Checks `id`; the error names what is wrong.
    pub fn parse(id: &str) -> Result<Self, AgentError> {
        let bad = |why: String| {
            AgentError::InvalidArgument(format!("volume_id {:?}: {why}", truncate(id)))
        };
        if id.is_empty() {
            return Err(bad("is empty".into()));
        }
        if id.len() > MAX_VOLUME_ID {
            return Err(bad(format!(
                "is {} bytes long, at most {MAX_VOLUME_ID} are allowed",
                id.len()
            )));
        }
        let (first, second) = id
            .split_once('/')
            .ok_or_else(|| bad("must be <pool>/<name> or <vg>/<lv>".into()))?;
        for part in [first, second] {
            if part.is_empty() {
                return Err(bad("has an empty component".into()));
            }
            if part == "." || part == ".." {
                return Err(bad(format!("component {part:?} is not a name")));
            }
            if let Some(c) = part
                .chars()
                .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':')))
            {
                return Err(bad(format!(
                    "contains invalid character {c:?}{}",
                    if c == '/' {
                        " (exactly one '/' separates the two components)"
                    } else {
                        ""
                    }
                )));
            }
        }
        Ok(Self {
            id: id.to_owned(),
            split: first.len(),
        })
    }

    /// The whole ID.
    pub fn as_str(&self) -> &str {
        &self.id
    }

    /// The pool or volume group.
    pub fn pool(&self) -> &str {
        &self.id[..self.split]
    }

    /// The zvol or LV name.
    pub fn name(&self) -> &str {
        &self.id[self.split + 1..]
    }

    /// A name for the volume's export targets, valid in both an NQN and an
    /// RFC 3720 IQN (lowercase letters, digits, `-` and `.`): the ID folded to
    /// that alphabet, with a hash of the exact ID so folded IDs cannot collide.
    pub fn target_suffix(&self) -> String {
        format!(
            "{}-{:08x}",
            fold_to_target_name(&self.id),
            api::names::fnv1a(api::names::FNV1A_BASIS, self.id.as_bytes()) as u32
        )
    }
}

/// `text` in the alphabet valid in both an NQN and an RFC 3720 IQN:
/// lowercase letters, digits, `-` and `.` (`/` becomes `.`, anything else
/// `-`).
pub fn fold_to_target_name(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '-' | '.' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            '/' => '.',
            _ => '-',
        })
        .collect()
}

impl std::fmt::Display for VolumeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.id)
    }
}

/// The start of a hostile string, for error messages (never echo 4 KiB back).
pub fn truncate(s: &str) -> String {
    let cut: String = s.chars().take(64).collect();
    if cut.len() < s.len() {
        format!("{cut}...")
    } else {
        cut
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_ids_are_refused_with_the_reason() {
        for (id, why) in [
            ("", "is empty"),
            ("../x", "not a name"),
            ("a/../../b", "invalid character '/'"),
            ("a\0b/c", "invalid character '\\0'"),
            ("a/b\n", "invalid character '\\n'"),
            ("tank", "must be <pool>/<name>"),
            ("tank/", "empty component"),
            ("/x", "empty component"),
            ("tank/a@snap", "invalid character '@'"),
        ] {
            let e = VolumeId::parse(id).expect_err(id).to_string();
            assert!(e.contains(why), "{id:?}: {e}");
        }
        let long = "a".repeat(4096);
        let e = VolumeId::parse(&long).expect_err("long").to_string();
        assert!(e.contains("4096 bytes") && e.len() < 200, "{e}");
    }

    #[test]
    fn ids_split_and_name_targets() -> Result<(), AgentError> {
        let v = VolumeId::parse("Data-VG/legacy_1")?;
        assert_eq!((v.pool(), v.name()), ("Data-VG", "legacy_1"));
        let s = v.target_suffix();
        assert!(
            s.starts_with("data-vg.legacy-1-") && s.len() == "data-vg.legacy-1-".len() + 8,
            "{s}"
        );
        assert_ne!(s, VolumeId::parse("data-vg/legacy_1")?.target_suffix());
        Ok(())
    }
}
