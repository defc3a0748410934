//! Names of nvmet objects: each a type that can only hold a valid value.
use configfs::{Component, NameError};
use std::{fmt, str::FromStr};

/// Why a value cannot name an nvmet object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidName {
    /// An NQN broke a rule.
    #[error("invalid NQN {value:?}: {why}")]
    Nqn {
        /// The rejected text.
        value: String,
        /// The rule it broke.
        why: String,
    },
    /// A namespace ID outside 1..=0xFFFFFFFE.
    #[error("invalid namespace ID {0}: must be 1 to 4294967294")]
    Nsid(u64),
    /// A port ID that is not a 16-bit number.
    #[error("invalid port ID {0:?}: must be a number from 0 to 65535")]
    PortId(String),
}

/// The longest NQN the NVMe specification allows, in bytes.
pub const NQN_MAX_LEN: usize = 223;

/// An NVMe Qualified Name, for subsystems and hosts.
///
/// It follows the NVMe base specification's format, `nqn.yyyy-mm.<reverse
/// domain>[:<anything>]`, or the UUID form `nqn.2014-08.org.nvmexpress:uuid:...`,
/// is at most 223 bytes, and is a safe configfs component (printable ASCII, no
/// `/` or space).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Nqn(Component);

impl Nqn {
    /// Checks and wraps an NQN.
    pub fn new(value: &str) -> Result<Self, InvalidName> {
        let bad = |why: String| InvalidName::Nqn {
            value: value.to_owned(),
            why,
        };
        let component =
            Component::new(value, NQN_MAX_LEN).map_err(|e: NameError| bad(e.to_string()))?;
        let rest = value
            .strip_prefix("nqn.")
            .ok_or_else(|| bad("must start with \"nqn.\"".into()))?;
        let date = rest.get(..7).unwrap_or_default().as_bytes();
        let date_ok = date.len() == 7
            && date[..4].iter().all(u8::is_ascii_digit)
            && date[4] == b'-'
            && date[5..].iter().all(u8::is_ascii_digit)
            && (b"01".as_slice()..=b"12".as_slice()).contains(&&date[5..7]);
        if !date_ok || rest.as_bytes().get(7) != Some(&b'.') {
            return Err(bad(
                "must continue with a date \"yyyy-mm.\" after \"nqn.\"".into()
            ));
        }
        let domain = rest[8..].split(':').next().unwrap_or_default();
        if domain.is_empty() || domain.starts_with('.') || domain.ends_with('.') {
            return Err(bad("must name a reverse domain after the date".into()));
        }
        Ok(Self(component))
    }

    /// Wraps a name the kernel already holds (read back from configfs). It is
    /// only checked to be a safe configfs component, since another writer may
    /// have used a name that does not follow the NVMe format.
    pub(crate) fn from_kernel(value: &str) -> Result<Self, InvalidName> {
        Component::new(value, NQN_MAX_LEN)
            .map(Self)
            .map_err(|e| InvalidName::Nqn {
                value: value.to_owned(),
                why: e.to_string(),
            })
    }

    /// The NQN as text.
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

impl fmt::Display for Nqn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for Nqn {
    type Err = InvalidName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

/// A namespace ID: 1 to 0xFFFFFFFE (0 and the broadcast value are reserved).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Nsid(u32);

impl Nsid {
    /// Checks and wraps a namespace ID.
    pub fn new(value: u64) -> Result<Self, InvalidName> {
        match u32::try_from(value) {
            Ok(v) if v != 0 && v != u32::MAX => Ok(Self(v)),
            _ => Err(InvalidName::Nsid(value)),
        }
    }

    /// The number.
    pub fn get(self) -> u32 {
        self.0
    }
}

impl fmt::Display for Nsid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for Nsid {
    type Err = InvalidName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let n = s.parse::<u64>().map_err(|_| InvalidName::Nsid(0))?;
        Self::new(n)
    }
}

/// A port ID: the name of a folder under `nvmet/ports`, a 16-bit number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortId(pub u16);

impl fmt::Display for PortId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for PortId {
    type Err = InvalidName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        // Only plain decimal digits: "+1", " 1" or "01x" are refused.
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(InvalidName::PortId(s.to_owned()));
        }
        s.parse::<u16>()
            .map(PortId)
            .map_err(|_| InvalidName::PortId(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn nqn_rules() {
        for good in [
            "nqn.2014-08.org.nvmexpress.discovery",
            "nqn.2014-08.org.nvmexpress:uuid:6a5e1f7c-0000-4000-8000-000000000001",
            "nqn.2026-01.com.bhyoo.pillar-csi:tank.k8s.pvc-1",
        ] {
            assert!(Nqn::new(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "nqn.2014-08.org.example/../x",
            "iqn.2014-08.org.example:x",
            "nqn.14-08.org.example:x",
            "nqn.2014-13.org.example:x",
            "nqn.2014-08:x",
            "nqn.2014-08.org.example:a b",
            "nqn.2014-08.org.example:a\nb",
            "nqn.2014-08.org.example:\0",
        ] {
            assert!(Nqn::new(bad).is_err(), "{bad:?}");
        }
        let long = format!("nqn.2014-08.org.example:{}", "x".repeat(4096));
        assert!(matches!(Nqn::new(&long), Err(InvalidName::Nqn { .. })));
    }

    #[test]
    fn nsid_and_port_rules() {
        assert!(Nsid::new(0).is_err());
        assert!(Nsid::new(u64::from(u32::MAX)).is_err());
        assert_eq!(Nsid::new(1).map(Nsid::get), Ok(1));
        assert!("65536".parse::<PortId>().is_err());
        assert!("+1".parse::<PortId>().is_err());
        assert!("../1".parse::<PortId>().is_err());
        assert_eq!("4420".parse::<PortId>(), Ok(PortId(4420)));
    }

    proptest! {
        #[test]
        fn any_accepted_nqn_is_one_safe_component(s in "nqn\\.[0-9]{4}-[0-9]{2}\\.\\PC{0,60}") {
            if let Ok(n) = Nqn::new(&s) {
                prop_assert!(n.as_str().len() <= NQN_MAX_LEN);
                prop_assert!(!n.as_str().contains(['/', '\0', '\n', ' ']));
            }
        }

        #[test]
        fn arbitrary_text_never_panics(s in "\\PC{0,300}") {
            let _ = Nqn::new(&s);
            let _ = s.parse::<PortId>();
            let _ = s.parse::<Nsid>();
        }
    }
}
