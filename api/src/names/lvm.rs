//! VG and LV names, LVM UUIDs and sizes: checked values that are safe to put
//! on an LVM command line.
use std::fmt;

/// Which kind of LVM object a name is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NameKind {
    /// A volume group.
    Vg,
    /// A logical volume.
    Lv,
}

impl fmt::Display for NameKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NameKind::Vg => "VG",
            NameKind::Lv => "LV",
        })
    }
}

/// The LVM naming rule a name breaks (lvm(8) "VALID NAMES", and the
/// reserved words of LVM's own `apply_lvname_restrictions`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameRule {
    /// The name is empty.
    #[error("it is empty")]
    Empty,
    /// The name is longer than LVM's 127 bytes.
    #[error("it is {0} bytes long; at most {MAX_NAME_LEN} are allowed")]
    TooLong(usize),
    /// A character outside `a-z A-Z 0-9 + _ . -`.
    #[error("{0:?} is not allowed; only a-z A-Z 0-9 + _ . - are")]
    BadChar(char),
    /// A leading hyphen (it would read as a command option).
    #[error("it begins with a hyphen")]
    LeadingHyphen,
    /// `.` or `..`.
    #[error("\".\" and \"..\" are reserved")]
    Dots,
    /// An LV name beginning with a prefix LVM reserves (`snapshot`, `pvmove`).
    #[error("LV names beginning with {0:?} are reserved by LVM")]
    ReservedPrefix(&'static str),
    /// An LV name containing a suffix LVM uses for its internal LVs.
    #[error("LV names containing {0:?} are reserved for LVM's internal volumes")]
    ReservedPart(&'static str),
}

/// The longest VG or LV name LVM accepts, in bytes (`NAME_LEN - 1`).
pub const MAX_NAME_LEN: usize = 127;

const LV_RESERVED_PREFIXES: [&str; 2] = ["snapshot", "pvmove"];
const LV_RESERVED_PARTS: [&str; 17] = [
    "_cdata", "_cmeta", "_corig", "_cpool", "_cvol", "_imeta", "_iorig", "_mimage", "_mlog",
    "_pmspare", "_rimage", "_rmeta", "_tdata", "_tmeta", "_vdata", "_vorigin", "_wcorig",
];

/// Checks `value` against LVM's rules for a VG or LV name and returns the
/// first rule it breaks. This is the one place those rules live: [`VgName`]
/// and [`LvName`] use it, and so can any caller that wants to check a name
/// (a PVC annotation, a Helm value) before it reaches LVM.
///
/// ```
/// use api::names::lvm::{check_name, NameKind, NameRule};
/// assert_eq!(check_name(NameKind::Lv, "pvc-1234"), Ok(()));
/// assert_eq!(check_name(NameKind::Lv, "-y"), Err(NameRule::LeadingHyphen));
/// assert_eq!(check_name(NameKind::Lv, "a_tmeta"), Err(NameRule::ReservedPart("_tmeta")));
/// assert_eq!(check_name(NameKind::Vg, "snapshot0"), Ok(()));
/// ```
pub fn check_name(kind: NameKind, value: &str) -> Result<(), NameRule> {
    if value.is_empty() {
        return Err(NameRule::Empty);
    }
    if value.len() > MAX_NAME_LEN {
        return Err(NameRule::TooLong(value.len()));
    }
    if let Some(c) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '_' | '.' | '-')))
    {
        return Err(NameRule::BadChar(c));
    }
    if value.starts_with('-') {
        return Err(NameRule::LeadingHyphen);
    }
    if value == "." || value == ".." {
        return Err(NameRule::Dots);
    }
    if kind == NameKind::Lv {
        if let Some(p) = LV_RESERVED_PREFIXES.iter().find(|p| value.starts_with(*p)) {
            return Err(NameRule::ReservedPrefix(p));
        }
        if let Some(p) = LV_RESERVED_PARTS.iter().find(|p| value.contains(*p)) {
            return Err(NameRule::ReservedPart(p));
        }
    }
    Ok(())
}

/// A value that cannot name a VG or LV, with the rule it breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {kind} name {value:?}: {rule}")]
pub struct InvalidName {
    /// VG or LV.
    pub kind: NameKind,
    /// The rejected text.
    pub value: String,
    /// The rule it breaks.
    pub rule: NameRule,
}

macro_rules! name_type {
    ($(#[$doc:meta])* $ty:ident, $kind:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $ty(String);

        impl $ty {
            /// Checks `value` with [`check_name`] and wraps it.
            pub fn new(value: &str) -> Result<Self, InvalidName> {
                check_name($kind, value).map_err(|rule| InvalidName {
                    kind: $kind,
                    value: value.to_owned(),
                    rule,
                })?;
                Ok(Self(value.to_owned()))
            }

            /// The name as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::str::FromStr for $ty {
            type Err = InvalidName;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::new(s)
            }
        }

        impl AsRef<str> for $ty {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

name_type!(
    /// A volume group name that follows LVM's rules.
    VgName,
    NameKind::Vg
);
name_type!(
    /// A logical volume name that follows LVM's rules for a new LV (so
    /// never an internal LV such as `pool_tdata`).
    LvName,
    NameKind::Lv
);

/// An LVM UUID as LVM prints it: 32 characters of `0-9 a-z A-Z`, shown in
/// groups of 6-4-4-4-4-4-6 joined by hyphens.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LvmUuid(String);

/// A value that is not an LVM UUID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid LVM UUID {value:?}: expected 32 characters of 0-9 a-z A-Z in groups of 6-4-4-4-4-4-6 joined by hyphens")]
pub struct InvalidUuid {
    /// The rejected text.
    pub value: String,
}

impl LvmUuid {
    /// Checks and wraps a UUID in LVM's printed form.
    pub fn new(value: &str) -> Result<Self, InvalidUuid> {
        let groups: Vec<&str> = value.split('-').collect();
        let lens: Vec<usize> = groups.iter().map(|g| g.len()).collect();
        let ok = lens == [6, 4, 4, 4, 4, 4, 6]
            && groups
                .iter()
                .all(|g| g.bytes().all(|b| b.is_ascii_alphanumeric()));
        if ok {
            Ok(Self(value.to_owned()))
        } else {
            Err(InvalidUuid {
                value: value.to_owned(),
            })
        }
    }

    /// The UUID as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for LvmUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for LvmUuid {
    type Err = InvalidUuid;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_lvm_rules() {
        for ok in ["a", "pvc-0d1e", "A.b+c_d-9", "x".repeat(127).as_str()] {
            assert_eq!(check_name(NameKind::Lv, ok), Ok(()), "{ok}");
            assert_eq!(check_name(NameKind::Vg, ok), Ok(()), "{ok}");
        }
        let cases: &[(&str, NameRule)] = &[
            ("", NameRule::Empty),
            ("-L1G", NameRule::LeadingHyphen),
            ("--yes", NameRule::LeadingHyphen),
            (".", NameRule::Dots),
            ("..", NameRule::Dots),
            ("a b", NameRule::BadChar(' ')),
            ("a/b", NameRule::BadChar('/')),
            ("a#b", NameRule::BadChar('#')),
            ("a\"b", NameRule::BadChar('"')),
            ("a'b", NameRule::BadChar('\'')),
            ("a\nb", NameRule::BadChar('\n')),
            ("é", NameRule::BadChar('é')),
        ];
        for (value, rule) in cases {
            assert_eq!(
                check_name(NameKind::Lv, value).as_ref(),
                Err(rule),
                "{value:?}"
            );
            assert_eq!(
                check_name(NameKind::Vg, value).as_ref(),
                Err(rule),
                "{value:?}"
            );
        }
        assert_eq!(
            check_name(NameKind::Vg, &"v".repeat(128)),
            Err(NameRule::TooLong(128))
        );
    }

    #[test]
    fn lv_names_avoid_lvm_reserved_words_but_vg_names_may_use_them() {
        assert_eq!(
            check_name(NameKind::Lv, "snapshot1"),
            Err(NameRule::ReservedPrefix("snapshot"))
        );
        assert_eq!(
            check_name(NameKind::Lv, "pvmove0"),
            Err(NameRule::ReservedPrefix("pvmove"))
        );
        assert_eq!(
            check_name(NameKind::Lv, "thin0_tdata"),
            Err(NameRule::ReservedPart("_tdata"))
        );
        assert_eq!(
            check_name(NameKind::Lv, "x_rimage_0"),
            Err(NameRule::ReservedPart("_rimage"))
        );
        assert_eq!(check_name(NameKind::Lv, "mysnapshot"), Ok(()));
        assert_eq!(check_name(NameKind::Vg, "snapshot"), Ok(()));
        assert_eq!(check_name(NameKind::Vg, "vg_tdata"), Ok(()));
    }

    #[test]
    fn typed_names_report_kind_value_and_rule() {
        let err = LvName::new("-an").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid LV name \"-an\": it begins with a hyphen"
        );
        let err = VgName::new("vg 0").unwrap_err();
        assert_eq!((err.kind, err.rule), (NameKind::Vg, NameRule::BadChar(' ')));
        assert_eq!(VgName::new("labvg").unwrap().as_str(), "labvg");
    }

    #[test]
    fn uuids_must_have_lvm_shape() {
        let good = "Xk3pQm-1aB2-c3D4-e5F6-g7H8-i9J0-Kl1mNo";
        assert_eq!(LvmUuid::new(good).unwrap().as_str(), good);
        for bad in [
            "",
            "Xk3pQm1aB2c3D4e5F6g7H8i9J0Kl1mNo",
            "Xk3pQm-1aB2-c3D4-e5F6-g7H8-i9J0-Kl1mN",
            "Xk3pQm-1aB2-c3D4-e5F6-g7H8-i9J0-Kl1m o",
            "Xk3pQm-1aB2-c3D4-e5F6-g7H8-i9J0-Kl1mNo-",
            "-Xk3pQ-1aB2-c3D4-e5F6-g7H8-i9J0-Kl1mNo",
        ] {
            assert!(LvmUuid::new(bad).is_err(), "{bad:?}");
        }
    }
}
