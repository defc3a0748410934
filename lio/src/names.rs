//! Names of LIO objects: each a type that can only hold a valid value.
use configfs::{Component, NameError};
use std::{fmt, net::SocketAddr, str::FromStr};

/// Why a value cannot name a LIO object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidName {
    /// An iSCSI name broke a rule.
    #[error("invalid iSCSI name {value:?}: {why}")]
    Iqn {
        /// The rejected text.
        value: String,
        /// The rule it broke.
        why: String,
    },
    /// A storage object name broke a rule.
    #[error("invalid storage object name {value:?}: {why}")]
    StorageObject {
        /// The rejected text.
        value: String,
        /// The rule it broke.
        why: String,
    },
    /// A TPG tag outside 1..=65535.
    #[error("invalid TPG tag {0:?}: must be a number from 1 to 65535")]
    Tpgt(String),
    /// A LUN outside 0..=65535.
    #[error("invalid LUN {0:?}: must be a number from 0 to 65535")]
    Lun(String),
    /// A network portal folder name that is not `IP:port` or `[IPv6]:port`.
    #[error("invalid network portal {0:?}: must be IPv4:port or [IPv6]:port")]
    Portal(String),
}

/// The longest iSCSI name RFC 3720 allows, in bytes.
pub const IQN_MAX_LEN: usize = 223;

/// The longest storage object name this crate accepts, in bytes.
pub const STORAGE_OBJECT_MAX_LEN: usize = 128;

/// An iSCSI name (RFC 3720 section 3.2.6), for targets and initiators.
///
/// Three forms are accepted, in the lower case RFC 3720 normalises to:
/// `iqn.yyyy-mm.<reversed domain>[:<anything>]` where the reversed domain has
/// at least two labels (`iqn.2003-01.org.example:x`; `iqn.2026-01.test:x` is
/// refused, as rtslib-fb and targetcli refuse it), `eui.` and 16 hex digits,
/// and `naa.` and 16 or 32 hex digits. Only `a-z`, `0-9`, `-`, `.` and `:`
/// are allowed (no `_`, which rtslib also refuses), at most 223 bytes, so the
/// name is always one safe configfs component.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Iqn(Component);

impl Iqn {
    /// Checks and wraps an iSCSI name.
    pub fn new(value: &str) -> Result<Self, InvalidName> {
        let bad = |why: &str| InvalidName::Iqn {
            value: value.to_owned(),
            why: why.to_owned(),
        };
        let component =
            Component::new(value, IQN_MAX_LEN).map_err(|e: NameError| bad(&e.to_string()))?;
        if let Some(hex) = value.strip_prefix("eui.") {
            if hex.len() != 16 || !is_lower_hex(hex) {
                return Err(bad("an eui. name is \"eui.\" and 16 lower-case hex digits"));
            }
            return Ok(Self(component));
        }
        if let Some(hex) = value.strip_prefix("naa.") {
            if !(hex.len() == 16 || hex.len() == 32) || !is_lower_hex(hex) {
                return Err(bad(
                    "a naa. name is \"naa.\" and 16 or 32 lower-case hex digits",
                ));
            }
            return Ok(Self(component));
        }
        let rest = value
            .strip_prefix("iqn.")
            .ok_or_else(|| bad("must start with \"iqn.\", \"eui.\" or \"naa.\""))?;
        if let Some(c) = value
            .chars()
            .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || "-.:".contains(*c)))
        {
            return Err(bad(&format!(
                "contains {c:?}; only a-z, 0-9, '-', '.' and ':' are allowed"
            )));
        }
        let date = rest.get(..7).unwrap_or_default().as_bytes();
        let date_ok = date.len() == 7
            && date[..4].iter().all(u8::is_ascii_digit)
            && date[4] == b'-'
            && (b"01".as_slice()..=b"12".as_slice()).contains(&&date[5..7]);
        if !date_ok || rest.as_bytes().get(7) != Some(&b'.') {
            return Err(bad("must continue with a date \"yyyy-mm.\" after \"iqn.\""));
        }
        let authority = rest[8..].split(':').next().unwrap_or_default();
        let labels: Vec<&str> = authority.split('.').collect();
        if labels.len() < 2 || labels.iter().any(|l| l.is_empty()) {
            return Err(bad(
                "must name a reversed domain of at least two labels after the date (iqn.2003-01.org.example:...)",
            ));
        }
        Ok(Self(component))
    }

    /// Wraps a name the kernel already holds (read back from configfs): only
    /// checked to be a safe configfs component, since another writer may
    /// have used a name that breaks RFC 3720.
    pub(crate) fn from_kernel(value: &str) -> Result<Self, InvalidName> {
        Component::new(value, IQN_MAX_LEN)
            .map(Self)
            .map_err(|e| InvalidName::Iqn {
                value: value.to_owned(),
                why: e.to_string(),
            })
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

fn is_lower_hex(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl fmt::Display for Iqn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for Iqn {
    type Err = InvalidName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

/// The name of a storage object (`target/core/iblock_N/<name>`).
///
/// Printable ASCII other than `/` and space, not `.` or `..`, at most 128
/// bytes: one configfs component that also survives rtslib-fb's and
/// targetcli's parsers (no whitespace).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StorageObjectName(Component);

impl StorageObjectName {
    /// Checks and wraps a storage object name.
    pub fn new(value: &str) -> Result<Self, InvalidName> {
        Component::new(value, STORAGE_OBJECT_MAX_LEN)
            .map(Self)
            .map_err(|e| InvalidName::StorageObject {
                value: value.to_owned(),
                why: e.to_string(),
            })
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

impl fmt::Display for StorageObjectName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for StorageObjectName {
    type Err = InvalidName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

/// Plain decimal digits only: "+1", " 1", "01x" are refused.
fn decimal(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 10 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// A target portal group tag, 1 to 65535 (folder `tpgt_N`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tpgt(u16);

impl Tpgt {
    /// Checks and wraps a TPG tag.
    pub fn new(tag: u16) -> Result<Self, InvalidName> {
        if tag == 0 {
            return Err(InvalidName::Tpgt(tag.to_string()));
        }
        Ok(Self(tag))
    }

    /// The tag.
    pub fn get(self) -> u16 {
        self.0
    }

    /// Parses a folder name `tpgt_N`.
    pub(crate) fn from_dir(name: &str) -> Result<Self, InvalidName> {
        name.strip_prefix("tpgt_")
            .and_then(decimal)
            .and_then(|n| u16::try_from(n).ok())
            .ok_or_else(|| InvalidName::Tpgt(name.to_owned()))
            .and_then(Self::new)
    }
}

impl fmt::Display for Tpgt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for Tpgt {
    type Err = InvalidName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        decimal(s)
            .and_then(|n| u16::try_from(n).ok())
            .ok_or_else(|| InvalidName::Tpgt(s.to_owned()))
            .and_then(Self::new)
    }
}

/// A logical unit number, 0 to 65535 (folders `lun/lun_N` of a TPG and
/// `lun_N` of a node ACL).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lun(pub u16);

impl Lun {
    /// The folder name `lun_N`.
    pub fn dir(self) -> String {
        format!("lun_{}", self.0)
    }

    /// Parses a folder name `lun_N`.
    pub(crate) fn from_dir(name: &str) -> Result<Self, InvalidName> {
        name.strip_prefix("lun_")
            .and_then(decimal)
            .and_then(|n| u16::try_from(n).ok())
            .map(Self)
            .ok_or_else(|| InvalidName::Lun(name.to_owned()))
    }
}

impl fmt::Display for Lun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for Lun {
    type Err = InvalidName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        decimal(s)
            .and_then(|n| u16::try_from(n).ok())
            .map(Self)
            .ok_or_else(|| InvalidName::Lun(s.to_owned()))
    }
}

/// The folder name of a network portal: `IP:port`, or `[IPv6]:port`.
pub fn portal_dir(addr: &SocketAddr) -> String {
    // SocketAddr's Display already brackets IPv6 addresses; the scope ID of
    // a link-local address is written as `%N`, which the kernel accepts.
    addr.to_string()
}

/// Parses a network portal folder name.
pub(crate) fn parse_portal(name: &str) -> Result<SocketAddr, InvalidName> {
    name.parse()
        .map_err(|_| InvalidName::Portal(name.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn iqn_rules() {
        for good in [
            "iqn.2003-01.org.example.lab:initiator",
            "iqn.2003-01.org.linux-iscsi.host.x8664:sn.0123456789ab",
            "iqn.2026-01.com.bhyoo.pillar-csi:labpool.pvc-1",
            "iqn.2026-01.com.example",
            "eui.0123456789abcdef",
            "naa.5001405abcdef012",
            "naa.60014050123456789abcdef012345678",
        ] {
            assert!(Iqn::new(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "iqn.2026-01.test:x",
            "iqn.2026-01.test",
            "iqn.2026-13.org.example:x",
            "iqn.26-01.org.example:x",
            "iqn.2026-01org.example:x",
            "iqn.2026-01..example:x",
            "iqn.2026-01.org.example:a_b",
            "iqn.2026-01.org.example:A",
            "iqn.2026-01.org.example:a b",
            "iqn.2026-01.org.example:a/../b",
            "iqn.2026-01.org.example:a\nb",
            "iqn.2026-01.org.example:\0",
            "nqn.2026-01.org.example:x",
            "eui.0123",
            "eui.0123456789ABCDEF",
            "naa.0123456789abcdeg",
            "..",
        ] {
            assert!(Iqn::new(bad).is_err(), "{bad:?}");
        }
        let long = format!("iqn.2026-01.org.example:{}", "x".repeat(300));
        assert!(matches!(Iqn::new(&long), Err(InvalidName::Iqn { .. })));
    }

    #[test]
    fn number_and_portal_rules() {
        assert!(Tpgt::new(0).is_err());
        assert_eq!("1".parse::<Tpgt>().map(Tpgt::get), Ok(1));
        assert_eq!(Tpgt::from_dir("tpgt_7").map(Tpgt::get), Ok(7));
        for bad in [
            "tpgt_0",
            "tpgt_+1",
            "tpgt_65536",
            "tpgt_",
            "tpg_1",
            "tpgt_1/..",
        ] {
            assert!(Tpgt::from_dir(bad).is_err(), "{bad}");
        }
        assert_eq!(Lun::from_dir("lun_0"), Ok(Lun(0)));
        assert!(Lun::from_dir("lun_65536").is_err());
        assert!("-1".parse::<Lun>().is_err());
        let v4: SocketAddr = "127.0.0.1:3260".parse().expect("addr");
        let v6: SocketAddr = "[::1]:3260".parse().expect("addr");
        assert_eq!(portal_dir(&v4), "127.0.0.1:3260");
        assert_eq!(portal_dir(&v6), "[::1]:3260");
        assert_eq!(parse_portal("[::1]:3260"), Ok(v6));
        assert!(parse_portal("::1:3260").is_err());
    }

    proptest! {
        #[test]
        fn accepted_names_are_one_safe_component(s in "\\PC{0,300}") {
            for name in [
                Iqn::new(&s).map(|n| n.as_str().to_owned()).ok(),
                StorageObjectName::new(&s).map(|n| n.as_str().to_owned()).ok(),
            ].into_iter().flatten() {
                let joined = std::path::Path::new("/cfg").join(&name);
                prop_assert_eq!(joined.parent(), Some(std::path::Path::new("/cfg")));
                prop_assert!(name != "." && name != "..");
                prop_assert!(!name.contains(['/', '\0', '\n', ' ']));
                prop_assert!(name.len() <= IQN_MAX_LEN);
            }
            let _ = s.parse::<Tpgt>();
            let _ = s.parse::<Lun>();
            let _ = parse_portal(&s);
        }

        #[test]
        fn iqn_shaped_strings_obey_the_charset(s in "iqn\\.[0-9]{4}-[0-9]{2}\\.\\PC{0,60}") {
            if let Ok(n) = Iqn::new(&s) {
                prop_assert!(n.as_str().bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-.:".contains(&b)));
                prop_assert!(n.as_str().len() <= IQN_MAX_LEN);
            }
        }
    }
}
