//! One checked path component of a configfs tree.
use std::fmt;

/// Why a name cannot be one configfs path component.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The name is empty.
    #[error("name is empty")]
    Empty,
    /// The name is longer than the object allows.
    #[error("name is {len} bytes long, at most {max} are allowed")]
    TooLong {
        /// Length of the rejected name in bytes.
        len: usize,
        /// The limit for this kind of name.
        max: usize,
    },
    /// The name is `.` or `..`.
    #[error("name {0:?} refers to a directory, not an object")]
    DotName(String),
    /// The name contains a character configfs names may not hold here.
    #[error("name contains {found:?} at byte {at}; only printable ASCII without '/' or spaces is allowed")]
    BadChar {
        /// The offending character.
        found: char,
        /// Its byte offset in the name.
        at: usize,
    },
}

/// A single path component that is safe to join onto a configfs path.
///
/// It is non-empty, at most `max` bytes, not `.` or `..`, and consists of
/// printable ASCII other than `/` and space: no NUL, newline or other control
/// character, so it can neither climb out of the tree nor split an attribute
/// write.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Component(String);

impl Component {
    /// Checks `name` and wraps it; `max` is the longest name the object allows.
    pub fn new(name: &str, max: usize) -> Result<Self, NameError> {
        if name.is_empty() {
            return Err(NameError::Empty);
        }
        if name.len() > max {
            return Err(NameError::TooLong {
                len: name.len(),
                max,
            });
        }
        if name == "." || name == ".." {
            return Err(NameError::DotName(name.to_owned()));
        }
        if let Some((at, found)) = name
            .char_indices()
            .find(|&(_, c)| !c.is_ascii_graphic() || c == '/')
        {
            return Err(NameError::BadChar { found, at });
        }
        Ok(Self(name.to_owned()))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Component {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for Component {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rejects_each_escape() {
        assert_eq!(Component::new("", 10), Err(NameError::Empty));
        assert_eq!(
            Component::new("..", 10),
            Err(NameError::DotName("..".into()))
        );
        assert_eq!(Component::new(".", 10), Err(NameError::DotName(".".into())));
        assert_eq!(
            Component::new("a/b", 10),
            Err(NameError::BadChar { found: '/', at: 1 })
        );
        assert_eq!(
            Component::new("a\0", 10),
            Err(NameError::BadChar { found: '\0', at: 1 })
        );
        assert_eq!(
            Component::new("a\nb", 10),
            Err(NameError::BadChar { found: '\n', at: 1 })
        );
        assert_eq!(
            Component::new("abc", 2),
            Err(NameError::TooLong { len: 3, max: 2 })
        );
        assert!(Component::new("é", 10).is_err());
        assert_eq!(
            Component::new("a.b:c-d_e", 10).map(|c| c.0),
            Ok("a.b:c-d_e".into())
        );
    }

    proptest! {
        #[test]
        fn accepted_names_stay_one_component(s in "\\PC{0,40}") {
            if let Ok(c) = Component::new(&s, 64) {
                let joined = std::path::Path::new("/root").join(c.as_str());
                prop_assert_eq!(joined.parent(), Some(std::path::Path::new("/root")));
                prop_assert!(c.as_str() != "." && c.as_str() != "..");
                prop_assert!(!c.as_str().contains(['/', '\0', '\n', ' ']));
            }
        }
    }
}
