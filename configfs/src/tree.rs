//! A configfs tree rooted at one folder: ordered plans of steps, and readers.
use crate::{
    error::{Error, StepKind},
    folder::{absent_is_none, children_at, exists_at, link_target_at, parsed, read_attr_at},
};
use rustix::fs::CWD;
use std::{
    fs,
    io::{self, Write},
    os::unix::fs::symlink,
    path::{Component as PathComponent, Path, PathBuf},
    sync::Arc,
};

/// One change to a configfs tree, with paths relative to the tree's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Create an object directory.
    Mkdir(String),
    /// Write `value` to an attribute in one `write(2)`.
    Write {
        /// The attribute's path.
        path: String,
        /// The text written.
        value: String,
    },
    /// Create the link `link` pointing at the object `target`.
    Symlink {
        /// The object linked to.
        target: String,
        /// The link created.
        link: String,
    },
    /// Remove the link at this path.
    Unlink(String),
    /// Remove an object directory (its own children must be gone first).
    Rmdir(String),
}

impl Step {
    /// A [`Step::Mkdir`].
    pub fn mkdir(path: impl Into<String>) -> Self {
        Step::Mkdir(path.into())
    }
    /// A [`Step::Write`].
    pub fn write(path: impl Into<String>, value: impl Into<String>) -> Self {
        Step::Write {
            path: path.into(),
            value: value.into(),
        }
    }
    /// A [`Step::Symlink`].
    pub fn symlink(target: impl Into<String>, link: impl Into<String>) -> Self {
        Step::Symlink {
            target: target.into(),
            link: link.into(),
        }
    }
    /// A [`Step::Unlink`].
    pub fn unlink(path: impl Into<String>) -> Self {
        Step::Unlink(path.into())
    }
    /// A [`Step::Rmdir`].
    pub fn rmdir(path: impl Into<String>) -> Self {
        Step::Rmdir(path.into())
    }
}

/// Called after each step a [`Tree`] runs succeeds: a test build's crash
/// points observe the plan step by step without this crate knowing them.
pub type StepHook = Arc<dyn Fn(&Step) + Send + Sync>;

/// A configfs tree (for example `/sys/kernel/config/nvmet`).
#[derive(Clone)]
pub struct Tree {
    root: PathBuf,
    hook: Option<StepHook>,
}

impl std::fmt::Debug for Tree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tree")
            .field("root", &self.root)
            .field("hook", &self.hook.is_some())
            .finish()
    }
}

impl Tree {
    /// Opens the tree at `root`, checking that a configfs is mounted above it
    /// and that the root exists (its kernel module is loaded).
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, Error> {
        let root = root.into();
        let mounts = fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let mounted = mounts.lines().any(|line| {
            let mut f = line.split_whitespace();
            let (_, point, fstype) = (f.next(), f.next(), f.next());
            fstype == Some("configfs") && point.is_some_and(|p| root.starts_with(p))
        });
        if !mounted {
            return Err(Error::RootMissing {
                why: "no configfs is mounted above it (mount -t configfs none /sys/kernel/config)"
                    .into(),
                root,
            });
        }
        if !root.is_dir() {
            return Err(Error::RootMissing {
                why: "configfs is mounted but this folder is missing: load the kernel module that provides it".into(),
                root,
            });
        }
        Ok(Self { root, hook: None })
    }

    /// A tree at `root` without checking for a configfs mount: for tools that
    /// inspect a copy of a tree, and for tests.
    pub fn at(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            hook: None,
        }
    }

    /// The tree calling `hook` after every step it runs succeeds.
    pub fn with_step_hook(mut self, hook: StepHook) -> Self {
        self.hook = Some(hook);
        self
    }

    /// The root folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The full path of `rel`, refusing anything that would leave the tree.
    pub fn path(&self, rel: &str) -> Result<PathBuf, Error> {
        if escapes(rel) {
            return Err(Error::Escape {
                root: self.root.clone(),
                rel: rel.to_owned(),
            });
        }
        Ok(self.root.join(rel))
    }

    /// Runs `steps` in order, stopping at the first refused one.
    pub fn run(&self, steps: &[Step]) -> Result<(), Error> {
        steps.iter().try_for_each(|s| {
            self.run_step(s)?;
            if let Some(hook) = &self.hook {
                hook(s);
            }
            Ok(())
        })
    }

    fn run_step(&self, step: &Step) -> Result<(), Error> {
        let (kind, path, result) = match step {
            Step::Mkdir(p) => {
                let path = self.path(p)?;
                let r = fs::create_dir(&path);
                (StepKind::Mkdir, path, r)
            }
            Step::Write { path, value } => {
                let path = self.path(path)?;
                let r = write_once(&path, value.as_bytes());
                (StepKind::Write, path, r)
            }
            Step::Symlink { target, link } => {
                let target = self.path(target)?;
                let path = self.path(link)?;
                let r = symlink(&target, &path);
                (StepKind::Symlink, path, r)
            }
            Step::Unlink(p) => {
                let path = self.path(p)?;
                let r = fs::remove_file(&path);
                (StepKind::Unlink, path, r)
            }
            Step::Rmdir(p) => {
                let path = self.path(p)?;
                let r = fs::remove_dir(&path);
                (StepKind::Rmdir, path, r)
            }
        };
        result.map_err(|source| Error::Io { kind, path, source })
    }

    /// Reads an attribute, without its trailing newline.
    pub fn read_attr(&self, rel: &str) -> Result<String, Error> {
        let path = self.path(rel)?;
        read_attr_at(CWD, &path, path.clone())
    }

    /// Reads an attribute that an older kernel may not have: `None` if absent.
    pub fn read_attr_opt(&self, rel: &str) -> Result<Option<String>, Error> {
        absent_is_none(self.read_attr(rel))
    }

    /// Reads an attribute and parses it with `parse`, naming what was expected on failure.
    pub fn parse_attr<T>(
        &self,
        rel: &str,
        expected: &str,
        parse: impl FnOnce(&str) -> Option<T>,
    ) -> Result<T, Error> {
        let value = self.read_attr(rel)?;
        parsed(value, self.root.join(rel), expected, parse)
    }

    /// The names of the entries (objects or links) in a folder, sorted; an
    /// absent folder has none.
    pub fn children(&self, rel: &str) -> Result<Vec<String>, Error> {
        let path = self.path(rel)?;
        children_at(CWD, &path, path.clone())
    }

    /// Where a link points, relative to the root when it points inside the tree.
    pub fn link_target(&self, rel: &str) -> Result<PathBuf, Error> {
        let path = self.path(rel)?;
        link_target_at(CWD, &path, path.clone(), &self.root)
    }

    /// Whether `rel` exists.
    pub fn exists(&self, rel: &str) -> bool {
        self.path(rel).is_ok_and(|p| exists_at(CWD, &p))
    }
}

/// Whether a relative path would leave the folder it is joined to: empty, a
/// NUL, an absolute path, or an empty, `.` or `..` component.
pub(crate) fn escapes(rel: &str) -> bool {
    // An absolute path starts with an empty component; one pass over the
    // components sees every case.
    rel.contains('\0')
        || rel
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
}

/// The kernel's ERESTARTSYS, which a configfs store can hand to user space
/// unrestarted: ZFS's zvol open returns it while another thread holds the
/// pool namespace lock (creating zvols, syncing), so enabling an nvmet
/// namespace or a LIO iblock object on a zvol fails with it while other
/// zvols of the pool are being created.
const ERESTARTSYS: i32 = 512;

/// How long a write refused with [`ERESTARTSYS`] is tried again.
const RESTART_FOR: std::time::Duration = std::time::Duration::from_secs(10);

/// Writes the whole value in one `write(2)`, as configfs stores expect; a
/// write the kernel asked to restart ([`ERESTARTSYS`]) is made again, for up
/// to [`RESTART_FOR`].
fn write_once(path: &Path, value: &[u8]) -> io::Result<()> {
    let mut first_refusal = None;
    loop {
        match write_whole(path, value) {
            Err(e)
                if e.raw_os_error() == Some(ERESTARTSYS)
                    && first_refusal
                        .get_or_insert_with(std::time::Instant::now)
                        .elapsed()
                        < RESTART_FOR =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

fn write_whole(path: &Path, value: &[u8]) -> io::Result<()> {
    let mut file = fs::OpenOptions::new().write(true).open(path)?;
    let written = file.write(value)?;
    if written != value.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            format!("short write: {written} of {} bytes", value.len()),
        ));
    }
    Ok(())
}

/// Folds `.` and `..` lexically (configfs links never point through other links).
pub(crate) fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            PathComponent::ParentDir => {
                out.pop();
            }
            PathComponent::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_cannot_leave_the_tree() {
        let t = Tree::at("/cfg");
        for bad in ["", "..", "a/../../b", "/etc", "a//b", "a/./b", "a\0b", "a/"] {
            assert!(matches!(t.path(bad), Err(Error::Escape { .. })), "{bad:?}");
        }
        assert_eq!(t.path("a/b").ok(), Some(PathBuf::from("/cfg/a/b")));
    }

    #[test]
    fn runs_steps_in_order_and_reports_the_failing_path() -> Result<(), Box<dyn std::error::Error>>
    {
        let dir = tempfile::tempdir()?;
        let t = Tree::at(dir.path());
        fs::write(dir.path().join("attr"), "")?;
        t.run(&[
            Step::mkdir("obj"),
            Step::mkdir("obj/child"),
            Step::write("attr", "42\n"),
            Step::symlink("obj", "link"),
        ])?;
        assert_eq!(t.read_attr("attr")?, "42");
        assert_eq!(t.link_target("link")?, PathBuf::from("obj"));
        assert_eq!(t.children("obj")?, vec!["child".to_owned()]);
        assert_eq!(t.children("absent")?, Vec::<String>::new());
        let err = t
            .run(&[Step::unlink("link"), Step::rmdir("missing")])
            .err()
            .ok_or("rmdir of a missing folder succeeded")?;
        assert_eq!(err.errno(), Some(2));
        assert_eq!(
            err.step().map(|s| s.1.to_path_buf()),
            Some(dir.path().join("missing"))
        );
        assert!(!t.exists("link"), "the step before the failure ran");
        Ok(())
    }
}
