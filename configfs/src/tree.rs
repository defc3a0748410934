//! A configfs tree rooted at one folder: ordered plans of steps, and readers.
use crate::{
    error::{Error, StepKind},
    folder::{absent_is_none, children_at, exists_at, link_target_at, parsed, read_attr_at},
};
use rustix::fs::{mkdirat, openat, symlinkat, unlinkat, AtFlags, Mode, OFlags, CWD};
use std::{
    borrow::Cow,
    ffi::OsString,
    fs, io,
    os::{
        fd::{AsFd, BorrowedFd},
        unix::ffi::{OsStrExt, OsStringExt},
    },
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

    /// What the step does and the path it acts on (a link's own path).
    fn acts_on(&self) -> (StepKind, &str) {
        match self {
            Step::Mkdir(p) => (StepKind::Mkdir, p),
            Step::Write { path, .. } => (StepKind::Write, path),
            Step::Symlink { link, .. } => (StepKind::Symlink, link),
            Step::Unlink(p) => (StepKind::Unlink, p),
            Step::Rmdir(p) => (StepKind::Rmdir, p),
        }
    }

    /// The paths the step names: the one it acts on, and a link's target.
    fn paths(&self) -> impl Iterator<Item = &str> {
        let target = match self {
            Step::Symlink { target, .. } => Some(target.as_str()),
            _ => None,
        };
        std::iter::once(self.acts_on().1).chain(target)
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
        self.check(rel)?;
        Ok(self.whole(rel))
    }

    /// Refuses `rel` if it would leave the tree.
    fn check(&self, rel: &str) -> Result<(), Error> {
        if escapes(rel) {
            return Err(Error::Escape {
                root: self.root.clone(),
                rel: rel.to_owned(),
            });
        }
        Ok(())
    }

    /// The root and `rel` joined by one `/`: the bytes copied once, where
    /// [`Path::join`] parses both (about a thousand instructions a path,
    /// more than the user-space side of the system call made with it).
    fn whole(&self, rel: &str) -> PathBuf {
        let root = self.root.as_os_str().as_bytes();
        let mut bytes = Vec::with_capacity(root.len() + 1 + rel.len());
        bytes.extend_from_slice(root);
        if !root.ends_with(b"/") {
            bytes.push(b'/');
        }
        bytes.extend_from_slice(rel.as_bytes());
        PathBuf::from(OsString::from_vec(bytes))
    }

    /// Runs `steps` in order, stopping at the first refused one.
    ///
    /// Every path is checked before any step runs: a plan with a path that
    /// would leave the tree changes nothing. A run of several steps opens
    /// the root once and names each object relative to it (`mkdirat`,
    /// `openat`, `symlinkat`, `unlinkat`), so the kernel walks only the
    /// part of each path inside the tree; a run of one step walks its whole
    /// path instead, one system call in all. A link's target is given
    /// whole, as configfs looks it up from the working directory.
    pub fn run(&self, steps: &[Step]) -> Result<(), Error> {
        steps
            .iter()
            .flat_map(Step::paths)
            .try_for_each(|rel| self.check(rel))?;
        let root = match steps {
            [] | [_] => None,
            [first, ..] => {
                // A missing root fails the first step, as a walk from `/` would.
                let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
                let fd = openat(CWD, &self.root, flags, Mode::empty())
                    .map_err(|e| self.step_error(first, e.into()))?;
                Some(fd)
            }
        };
        let root = root.as_ref().map(|fd| fd.as_fd());
        steps.iter().try_for_each(|s| {
            self.run_step(root, s).map_err(|e| self.step_error(s, e))?;
            if let Some(hook) = &self.hook {
                hook(s);
            }
            Ok(())
        })
    }

    /// Runs `step` from `root` when it is open, else from the working
    /// directory with whole paths.
    fn run_step(&self, root: Option<BorrowedFd<'_>>, step: &Step) -> io::Result<()> {
        let dir = root.unwrap_or(CWD);
        let at = |rel| self.step_path(root.is_some(), rel);
        match step {
            Step::Mkdir(p) => Ok(mkdirat(dir, &*at(p), Mode::from_raw_mode(0o777))?),
            Step::Write { path, value } => write_once(dir, &at(path), value.as_bytes()),
            Step::Symlink { target, link } => Ok(symlinkat(self.whole(target), dir, &*at(link))?),
            Step::Unlink(p) => Ok(unlinkat(dir, &*at(p), AtFlags::empty())?),
            Step::Rmdir(p) => Ok(unlinkat(dir, &*at(p), AtFlags::REMOVEDIR)?),
        }
    }

    /// `rel` as a step names it: as it is from the open root, else whole.
    fn step_path<'a>(&self, from_root: bool, rel: &'a str) -> Cow<'a, Path> {
        if from_root {
            Cow::Borrowed(Path::new(rel))
        } else {
            Cow::Owned(self.whole(rel))
        }
    }

    /// The error of `step` refused with `source`, naming its full path.
    fn step_error(&self, step: &Step, source: io::Error) -> Error {
        let (kind, rel) = step.acts_on();
        Error::Io {
            kind,
            path: self.whole(rel),
            source,
        }
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
        parsed(value, self.whole(rel), expected, parse)
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
///
/// Every step of a run is checked, a dozen paths per export: [`memchr`]
/// finds the NUL and the slashes a machine word or vector at a time, and
/// only the components between the slashes are compared (a third fewer
/// instructions than splitting the text at each `/`).
pub(crate) fn escapes(rel: &str) -> bool {
    let bytes = rel.as_bytes();
    if memchr::memchr(0, bytes).is_some() {
        return true;
    }
    // An absolute path starts with an empty component.
    let mut start = 0;
    for end in memchr::memchr_iter(b'/', bytes).chain([bytes.len()]) {
        if matches!(&bytes[start..end], b"" | b"." | b"..") {
            return true;
        }
        start = end + 1;
    }
    false
}

/// The kernel's ERESTARTSYS, which a configfs store can hand to user space
/// unrestarted: ZFS's zvol open returns it while another thread holds the
/// pool namespace lock (creating zvols, syncing), so enabling an nvmet
/// namespace or a LIO iblock object on a zvol fails with it while other
/// zvols of the pool are being created.
const ERESTARTSYS: i32 = 512;

/// How long a write refused with [`ERESTARTSYS`] is tried again.
const RESTART_FOR: std::time::Duration = std::time::Duration::from_secs(10);

/// Writes the whole value to the attribute `at` (relative to `dir`) in one
/// `write(2)`, as configfs stores expect; a write the kernel asked to
/// restart ([`ERESTARTSYS`]) is made again, for up to [`RESTART_FOR`].
fn write_once(dir: BorrowedFd<'_>, at: &Path, value: &[u8]) -> io::Result<()> {
    let mut first_refusal = None;
    loop {
        match write_whole(dir, at, value) {
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

fn write_whole(dir: BorrowedFd<'_>, at: &Path, value: &[u8]) -> io::Result<()> {
    let file = openat(dir, at, OFlags::WRONLY | OFlags::CLOEXEC, Mode::empty())?;
    let written = rustix::io::write(&file, value)?;
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
    use proptest::strategy::Strategy as _;

    #[test]
    fn paths_cannot_leave_the_tree() {
        let t = Tree::at("/cfg");
        for bad in ["", "..", "a/../../b", "/etc", "a//b", "a/./b", "a\0b", "a/"] {
            assert!(matches!(t.path(bad), Err(Error::Escape { .. })), "{bad:?}");
        }
        assert_eq!(t.path("a/b").ok(), Some(PathBuf::from("/cfg/a/b")));
        let slashed = Tree::at("/cfg/").path("a/b").map(PathBuf::into_os_string);
        assert_eq!(slashed.ok(), Some("/cfg/a/b".into()));
    }

    proptest::proptest! {
        /// The scan agrees with the rule it implements: a NUL, or an
        /// empty, `.` or `..` component between the slashes.
        #[test]
        fn escapes_is_the_component_rule(
            rel in proptest::collection::vec(
                proptest::sample::select(vec!["", ".", "..", "...", "a", ".a", "a.", "a\0"]),
                1..5,
            )
            .prop_map(|components: Vec<&str>| components.join("/"))
        ) {
            let rule = rel.contains('\0')
                || rel.split('/').any(|c| c.is_empty() || c == "." || c == "..");
            proptest::prop_assert_eq!(escapes(&rel), rule, "{:?}", rel);
        }
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

    #[test]
    fn a_plan_with_a_path_leaving_the_tree_runs_no_step() -> Result<(), Box<dyn std::error::Error>>
    {
        let dir = tempfile::tempdir()?;
        let t = Tree::at(dir.path().join("root"));
        fs::create_dir(t.root())?;
        for bad in [Step::mkdir("a/../../b"), Step::symlink("../x", "link")] {
            let err = t
                .run(&[Step::mkdir("first"), bad.clone()])
                .err()
                .ok_or(format!("{bad:?} ran"))?;
            assert!(matches!(err, Error::Escape { .. }), "{err}");
            assert!(!t.exists("first"), "a step ran before {bad:?} was refused");
        }
        assert!(!dir.path().join("b").exists() && !dir.path().join("x").exists());
        // A missing root fails the first step, naming its whole path, in a
        // run of one step (a whole path) and of several (the root opened).
        let gone = Tree::at(dir.path().join("gone"));
        let one = [Step::mkdir("a")];
        let two = [Step::mkdir("a"), Step::mkdir("a/b")];
        for steps in [&one[..], &two[..]] {
            let err = gone.run(steps).err().ok_or("ran without a root")?;
            assert_eq!(err.errno(), Some(2));
            assert_eq!(
                err.step().map(|(k, p)| (k, p.to_path_buf())),
                Some((StepKind::Mkdir, dir.path().join("gone/a")))
            );
        }
        Ok(())
    }
}
