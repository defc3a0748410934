//! ZFS dataset and snapshot names, checked once by one function everyone
//! reuses ([`check_dataset_name`]), with the rule that failed.
//!
//! The rules are those of `spec/import-zvol.md`: a name is `/`-separated
//! components of ASCII letters, digits and `- _ . :`; no empty component,
//! no `.` or `..`, no `@`, `#`, space or non-ASCII character, and (as ZFS
//! itself requires) shorter than [`MAX_NAME_LEN`] bytes.
use std::fmt;

/// ZFS's limit on a full dataset or snapshot name, the NUL included
/// (`ZFS_MAX_DATASET_NAME_LEN`): a name has at most `MAX_NAME_LEN - 1` bytes.
pub const MAX_NAME_LEN: usize = 256;

/// Which rule a dataset or snapshot name broke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameRule {
    /// The name is empty.
    Empty,
    /// The name starts or ends with `/`.
    LeadingOrTrailingSlash,
    /// Two `/` in a row: an empty component.
    EmptyComponent,
    /// A component is `.` or `..`.
    DotComponent(String),
    /// A component holds a character outside ASCII letters, digits and
    /// `- _ . :` (`@` is a snapshot, `#` a bookmark).
    InvalidCharacter {
        /// The offending component.
        component: String,
        /// The first character not allowed.
        character: char,
    },
    /// The name has `MAX_NAME_LEN` bytes or more.
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// The name is a pool alone where a dataset below a pool is needed
    /// (`<pool>[/<parent>]/<name>`).
    NotBelowPool,
    /// A snapshot name without exactly one `@` between dataset and snapshot.
    NotASnapshot,
}

impl fmt::Display for NameRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NameRule::Empty => write!(f, "empty name"),
            NameRule::LeadingOrTrailingSlash => write!(f, "starts or ends with '/'"),
            NameRule::EmptyComponent => write!(f, "empty dataset component"),
            NameRule::DotComponent(c) => write!(f, "dataset component {c:?} is not a name"),
            NameRule::InvalidCharacter {
                component,
                character,
            } => write!(
                f,
                "dataset component {component:?} contains invalid character {character:?}"
            ),
            NameRule::TooLong { len } => write!(
                f,
                "{len} bytes long, ZFS allows at most {}",
                MAX_NAME_LEN - 1
            ),
            NameRule::NotBelowPool => {
                write!(f, "must name a dataset as \"<pool>[/<parent>]/<name>\"")
            }
            NameRule::NotASnapshot => write!(f, "must name a snapshot as \"<dataset>@<snapshot>\""),
        }
    }
}

/// A name that broke a rule: the name and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid ZFS name {name:?}: {rule}")]
pub struct InvalidName {
    /// The name as given.
    pub name: String,
    /// The rule it broke.
    pub rule: NameRule,
}

/// The one check of a dataset name (a pool, a filesystem or a volume; no
/// snapshot): `Ok` or the first rule broken.
pub fn check_dataset_name(name: &str) -> Result<(), NameRule> {
    if name.is_empty() {
        return Err(NameRule::Empty);
    }
    if name.starts_with('/') || name.ends_with('/') {
        return Err(NameRule::LeadingOrTrailingSlash);
    }
    for component in name.split('/') {
        check_component(component)?;
    }
    if name.len() >= MAX_NAME_LEN {
        return Err(NameRule::TooLong { len: name.len() });
    }
    Ok(())
}

/// One component (between `/`, or a snapshot's part after `@`).
fn check_component(component: &str) -> Result<(), NameRule> {
    if component.is_empty() {
        return Err(NameRule::EmptyComponent);
    }
    if component == "." || component == ".." {
        return Err(NameRule::DotComponent(component.to_owned()));
    }
    if let Some(character) = component
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':')))
    {
        return Err(NameRule::InvalidCharacter {
            component: component.to_owned(),
            character,
        });
    }
    Ok(())
}

/// A checked dataset name: a pool, filesystem or volume.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DatasetName(String);

impl DatasetName {
    /// Checks `name` with [`check_dataset_name`].
    pub fn new(name: &str) -> Result<Self, InvalidName> {
        check_dataset_name(name).map_err(|rule| InvalidName {
            name: name.to_owned(),
            rule,
        })?;
        Ok(Self(name.to_owned()))
    }

    /// Checks `name` and that it lies below a pool (`<pool>[/<parent>]/<name>`),
    /// as a zvol's name must.
    pub fn below_pool(name: &str) -> Result<Self, InvalidName> {
        let ds = Self::new(name)?;
        if ds.parent().is_none() {
            return Err(InvalidName {
                name: name.to_owned(),
                rule: NameRule::NotBelowPool,
            });
        }
        Ok(ds)
    }

    /// `parent/child`, checked.
    pub fn child(&self, child: &str) -> Result<Self, InvalidName> {
        Self::new(&format!("{}/{child}", self.0))
    }

    /// The name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The pool: the first component.
    pub fn pool(&self) -> &str {
        self.0.split('/').next().unwrap_or(&self.0)
    }

    /// The parent dataset, `None` for a pool.
    pub fn parent(&self) -> Option<DatasetName> {
        self.0
            .rsplit_once('/')
            .map(|(parent, _)| DatasetName(parent.to_owned()))
    }

    /// The last component.
    pub fn last(&self) -> &str {
        self.0.rsplit('/').next().unwrap_or(&self.0)
    }

    /// The snapshot `self@snap`, checked.
    pub fn snapshot(&self, snap: &str) -> Result<SnapshotName, InvalidName> {
        SnapshotName::new(&format!("{}@{snap}", self.0))
    }
}

impl fmt::Display for DatasetName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for DatasetName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// A checked snapshot name, `<dataset>@<snapshot>`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SnapshotName {
    full: String,
    at: usize,
}

impl SnapshotName {
    /// Checks `name`: a valid dataset name, one `@`, and a snapshot part that
    /// follows the component rules.
    pub fn new(name: &str) -> Result<Self, InvalidName> {
        let invalid = |rule| InvalidName {
            name: name.to_owned(),
            rule,
        };
        let Some((dataset, snap)) = name.split_once('@') else {
            return Err(invalid(NameRule::NotASnapshot));
        };
        check_dataset_name(dataset).map_err(invalid)?;
        if snap.contains('/') {
            return Err(invalid(NameRule::NotASnapshot));
        }
        check_component(snap).map_err(invalid)?;
        if name.len() >= MAX_NAME_LEN {
            return Err(invalid(NameRule::TooLong { len: name.len() }));
        }
        Ok(Self {
            full: name.to_owned(),
            at: dataset.len(),
        })
    }

    /// The whole name.
    pub fn as_str(&self) -> &str {
        &self.full
    }

    /// The dataset the snapshot is of.
    pub fn dataset(&self) -> DatasetName {
        DatasetName(self.full[..self.at].to_owned())
    }

    /// The part after `@`.
    pub fn snapshot(&self) -> &str {
        &self.full[self.at + 1..]
    }
}

impl fmt::Display for SnapshotName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.full)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn good_names_pass() {
        for n in [
            "tank",
            "tank/k8s/pvc-0d5201a5-3c1e-4c55-a2a7-3f7d3c4e9b10",
            "hot-data/a_b.c:d",
            "p/..x",
        ] {
            assert_eq!(check_dataset_name(n), Ok(()), "{n}");
        }
    }

    #[test]
    fn each_rule_is_named() {
        assert_eq!(check_dataset_name(""), Err(NameRule::Empty));
        assert_eq!(
            check_dataset_name("/tank/a"),
            Err(NameRule::LeadingOrTrailingSlash)
        );
        assert_eq!(
            check_dataset_name("tank/a/"),
            Err(NameRule::LeadingOrTrailingSlash)
        );
        assert_eq!(check_dataset_name("tank//a"), Err(NameRule::EmptyComponent));
        assert_eq!(
            check_dataset_name("tank/../a"),
            Err(NameRule::DotComponent("..".into()))
        );
        assert_eq!(
            check_dataset_name("tank/./a"),
            Err(NameRule::DotComponent(".".into()))
        );
        for (name, comp, ch) in [
            ("tank/a@s", "a@s", '@'),
            ("tank/a#b", "a#b", '#'),
            ("tank/a b", "a b", ' '),
            ("tank/zvöl", "zvöl", 'ö'),
            ("tank/a\nb", "a\nb", '\n'),
        ] {
            assert_eq!(
                check_dataset_name(name),
                Err(NameRule::InvalidCharacter {
                    component: comp.into(),
                    character: ch
                }),
                "{name:?}"
            );
        }
        let long = format!("tank/{}", "a".repeat(MAX_NAME_LEN));
        assert!(matches!(
            check_dataset_name(&long),
            Err(NameRule::TooLong { .. })
        ));
    }

    #[test]
    fn messages_name_the_dataset_and_rule() {
        let e = DatasetName::new("tank//x").expect_err("must be refused");
        assert_eq!(
            e.to_string(),
            "invalid ZFS name \"tank//x\": empty dataset component"
        );
        let e = DatasetName::new("tank/a@b").expect_err("must be refused");
        assert!(e.to_string().contains("contains invalid character '@'"));
        let e = DatasetName::below_pool("tank").expect_err("must be refused");
        assert_eq!(e.rule, NameRule::NotBelowPool);
    }

    #[test]
    fn parts() -> Result<(), InvalidName> {
        let d = DatasetName::new("tank/k8s/vol")?;
        assert_eq!(d.pool(), "tank");
        assert_eq!(d.parent(), Some(DatasetName::new("tank/k8s")?));
        assert_eq!(d.last(), "vol");
        assert_eq!(DatasetName::new("tank")?.parent(), None);
        let s = d.snapshot("s1")?;
        assert_eq!((s.dataset(), s.snapshot()), (d.clone(), "s1"));
        assert_eq!(s.as_str(), "tank/k8s/vol@s1");
        assert_eq!(
            SnapshotName::new("tank/v")
                .expect_err("must be refused")
                .rule,
            NameRule::NotASnapshot
        );
        assert_eq!(
            SnapshotName::new("tank/v@a@b")
                .expect_err("must be refused")
                .rule,
            NameRule::InvalidCharacter {
                component: "a@b".into(),
                character: '@'
            }
        );
        assert_eq!(
            SnapshotName::new("tank/v@")
                .expect_err("must be refused")
                .rule,
            NameRule::EmptyComponent
        );
        Ok(())
    }

    proptest! {
        #[test]
        fn accepted_names_are_safe(s in "\\PC{0,40}") {
            if check_dataset_name(&s).is_ok() {
                prop_assert!(s.is_ascii());
                prop_assert!(!s.contains(['@', '#', ' ', '\0', '\n']));
                prop_assert!(s.split('/').all(|c| !c.is_empty() && c != "." && c != ".."));
            }
        }

        #[test]
        fn names_of_allowed_characters_pass(parts in proptest::collection::vec("[A-Za-z0-9_:-][A-Za-z0-9._:-]{0,10}", 1..5)) {
            let name = parts.join("/");
            prop_assert_eq!(check_dataset_name(&name), Ok(()));
        }
    }
}
