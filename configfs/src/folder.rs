//! A folder of a configfs tree held open, and the readers shared with [`Tree`].
//!
//! Every read names its file relative to a directory descriptor: the folder's
//! own for a [`Folder`], the working directory with an absolute path for a
//! [`Tree`]. A file is read with plain `read(2)` calls until end of file, with
//! no `stat`, since configfs reports every attribute as one page long whatever
//! it holds.
use crate::{
    error::{Error, StepKind},
    tree::{escapes, normalize, Tree},
};
use rustix::{
    fs::{openat, readlinkat, statat, AtFlags, Dir, FileType, Mode, OFlags},
    io::Errno,
};
use std::{
    ffi::OsString,
    io,
    os::{
        fd::{AsFd, BorrowedFd, OwnedFd},
        unix::ffi::OsStringExt,
    },
    path::{Path, PathBuf},
};

/// A folder of a configfs tree (an object, a group or a folder of links),
/// opened once so that reads inside it are looked up from it rather than from
/// the filesystem root each time.
///
/// Reading many objects through their folders costs one short path lookup per
/// file instead of a walk of the whole path. Paths given to its methods are
/// relative to the folder and are checked like [`Tree::path`]: they cannot
/// leave it. The folder stays valid while it is open; if the kernel object is
/// removed meanwhile, reads inside it fail with `ENOENT`.
#[derive(Debug)]
pub struct Folder {
    fd: OwnedFd,
    path: PathBuf,
    root: PathBuf,
}

impl Tree {
    /// Opens the folder at `rel` (relative to the root); `None` if it is absent.
    pub fn folder(&self, rel: &str) -> Result<Option<Folder>, Error> {
        let path = self.path(rel)?;
        Folder::open(rustix::fs::CWD, &path, path.clone(), self.root())
    }
}

impl Folder {
    fn open(
        dir: BorrowedFd<'_>,
        at: &Path,
        path: PathBuf,
        root: &Path,
    ) -> Result<Option<Self>, Error> {
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        match openat(dir, at, flags, Mode::empty()) {
            Ok(fd) => Ok(Some(Self {
                fd,
                path,
                root: root.to_path_buf(),
            })),
            Err(Errno::NOENT) => Ok(None),
            Err(e) => Err(io_error(StepKind::Read, path, e)),
        }
    }

    /// The folder's full path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The full path of `rel` inside this folder, refusing anything that
    /// would leave it.
    fn full(&self, rel: &str) -> Result<PathBuf, Error> {
        if escapes(rel) {
            return Err(Error::Escape {
                root: self.path.clone(),
                rel: rel.to_owned(),
            });
        }
        Ok(self.path.join(rel))
    }

    /// Opens the folder at `rel` inside this one; `None` if it is absent.
    pub fn folder(&self, rel: &str) -> Result<Option<Folder>, Error> {
        let path = self.full(rel)?;
        Folder::open(self.fd.as_fd(), Path::new(rel), path, &self.root)
    }

    /// Reads an attribute, without its trailing newline.
    pub fn read_attr(&self, rel: &str) -> Result<String, Error> {
        let path = self.full(rel)?;
        read_attr_at(self.fd.as_fd(), Path::new(rel), path)
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
        parsed(value, self.path.join(rel), expected, parse)
    }

    /// The names of the entries (objects or links) in this folder, sorted.
    pub fn list(&self) -> Result<Vec<String>, Error> {
        children_at(self.fd.as_fd(), Path::new("."), self.path.clone())
    }

    /// [`Folder::list`] (sorted by name), each name with its inode number. configfs gives a
    /// folder made again a new inode, so an unchanged number is the same
    /// object as at an earlier listing.
    pub fn list_with_inodes(&self) -> Result<Vec<(String, u64)>, Error> {
        entries_at(self.fd.as_fd(), Path::new("."), self.path.clone())
    }

    /// The names of the entries (objects or links) in the folder at `rel`,
    /// sorted; an absent folder has none.
    pub fn children(&self, rel: &str) -> Result<Vec<String>, Error> {
        let path = self.full(rel)?;
        children_at(self.fd.as_fd(), Path::new(rel), path)
    }

    /// Where the link at `rel` points, relative to the tree's root when it
    /// points inside the tree.
    pub fn link_target(&self, rel: &str) -> Result<PathBuf, Error> {
        let path = self.full(rel)?;
        link_target_at(self.fd.as_fd(), Path::new(rel), path, &self.root)
    }

    /// Whether `rel` exists inside this folder.
    pub fn exists(&self, rel: &str) -> bool {
        !escapes(rel) && exists_at(self.fd.as_fd(), Path::new(rel))
    }
}

pub(crate) fn io_error(kind: StepKind, path: PathBuf, e: Errno) -> Error {
    Error::Io {
        kind,
        path,
        source: io::Error::from(e),
    }
}

pub(crate) fn absent_is_none(read: Result<String, Error>) -> Result<Option<String>, Error> {
    match read {
        Err(Error::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => Ok(None),
        other => other.map(Some),
    }
}

pub(crate) fn parsed<T>(
    value: String,
    path: PathBuf,
    expected: &str,
    parse: impl FnOnce(&str) -> Option<T>,
) -> Result<T, Error> {
    parse(value.trim()).ok_or_else(|| Error::Parse {
        path,
        why: format!("expected {expected}"),
        value,
    })
}

/// Reads the file `at` (relative to `dir`) to its end; `path` names it in errors.
pub(crate) fn read_attr_at(dir: BorrowedFd<'_>, at: &Path, path: PathBuf) -> Result<String, Error> {
    let read = || -> Result<Vec<u8>, Errno> {
        let fd = openat(dir, at, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())?;
        // configfs attributes hold at most a page: one read, and one that
        // sees the end.
        let mut buf = vec![0u8; 4096];
        let mut len = 0;
        loop {
            if len == buf.len() {
                buf.resize(len * 2, 0);
            }
            match rustix::io::read(&fd, &mut buf[len..]) {
                Ok(0) => break,
                Ok(n) => len += n,
                Err(Errno::INTR) => {}
                Err(e) => return Err(e),
            }
        }
        buf.truncate(len);
        Ok(buf)
    };
    match read() {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            Ok(text.strip_suffix('\n').unwrap_or(&text).to_owned())
        }
        Err(e) => Err(io_error(StepKind::Read, path, e)),
    }
}

/// The sorted names of the folders and links in the folder `at` (relative to
/// `dir`); none if it is absent. `path` names it in errors.
pub(crate) fn children_at(
    dir: BorrowedFd<'_>,
    at: &Path,
    path: PathBuf,
) -> Result<Vec<String>, Error> {
    Ok(entries_at(dir, at, path)?
        .into_iter()
        .map(|(name, _)| name)
        .collect())
}

/// [`children_at`], each name with the inode number the listing gives it.
fn entries_at(dir: BorrowedFd<'_>, at: &Path, path: PathBuf) -> Result<Vec<(String, u64)>, Error> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let fd = match openat(dir, at, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(Vec::new()),
        Err(e) => return Err(io_error(StepKind::List, path, e)),
    };
    let mut entries = Dir::new(fd).map_err(|e| io_error(StepKind::List, path.clone(), e))?;
    let mut names = Vec::new();
    while let Some(entry) = entries.read() {
        let entry = entry.map_err(|e| io_error(StepKind::List, path.clone(), e))?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        let name = String::from_utf8_lossy(name).into_owned();
        let ty = match entry.file_type() {
            // A filesystem that does not give types in its listing.
            FileType::Unknown => {
                let fd = entries
                    .fd()
                    .map_err(|e| io_error(StepKind::List, path.clone(), e))?;
                statat(fd, name.as_str(), AtFlags::SYMLINK_NOFOLLOW)
                    .map(|st| FileType::from_raw_mode(st.st_mode))
                    .map_err(|e| io_error(StepKind::List, path.join(&name), e))?
            }
            ty => ty,
        };
        if matches!(ty, FileType::Directory | FileType::Symlink) {
            names.push((name, entry.ino()));
        }
    }
    names.sort();
    Ok(names)
}

/// Where the link `at` (relative to `dir`) points, relative to `root` when it
/// points inside it; `path` is the link's full path.
pub(crate) fn link_target_at(
    dir: BorrowedFd<'_>,
    at: &Path,
    path: PathBuf,
    root: &Path,
) -> Result<PathBuf, Error> {
    let target = match readlinkat(dir, at, Vec::new()) {
        Ok(t) => PathBuf::from(OsString::from_vec(t.into_bytes())),
        Err(e) => return Err(io_error(StepKind::Read, path, e)),
    };
    let absolute = if target.is_absolute() {
        target
    } else {
        path.parent().unwrap_or(root).join(target)
    };
    let normal = normalize(&absolute);
    Ok(normal
        .strip_prefix(root)
        .map(Path::to_path_buf)
        .unwrap_or(normal))
}

/// Whether `at` (relative to `dir`) exists, without following a last link.
pub(crate) fn exists_at(dir: BorrowedFd<'_>, at: &Path) -> bool {
    statat(dir, at, AtFlags::SYMLINK_NOFOLLOW).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{fs, os::unix::fs::symlink};

    #[test]
    fn reads_inside_an_open_folder_like_the_tree() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let root = dir.path();
        fs::create_dir_all(root.join("objs/a/child"))?;
        fs::create_dir_all(root.join("links"))?;
        fs::write(root.join("objs/a/attr"), "42\n")?;
        // Longer than the first read's buffer.
        fs::write(root.join("objs/a/big"), "x".repeat(10_000))?;
        symlink(root.join("objs/a"), root.join("links/absolute"))?;
        symlink("../objs/a", root.join("links/relative"))?;
        let t = Tree::at(root);

        let a = t.folder("objs/a")?.ok_or("objs/a not opened")?;
        assert_eq!(a.path(), root.join("objs/a"));
        assert_eq!(a.read_attr("attr")?, "42");
        assert_eq!(a.read_attr("big")?.len(), 10_000);
        assert_eq!(a.read_attr_opt("absent")?, None);
        assert_eq!(
            a.parse_attr("attr", "a number", |v| v.parse::<u32>().ok())?,
            42
        );
        assert_eq!(a.list()?, vec!["child".to_owned()]);
        assert!(a.exists("attr") && a.exists("child") && !a.exists("absent"));
        assert!(a.folder("absent")?.is_none());
        for bad in ["", "..", "../a", "/etc", "child/", "./attr"] {
            assert!(
                matches!(a.read_attr(bad), Err(Error::Escape { .. })),
                "{bad:?}"
            );
            assert!(!a.exists(bad), "{bad:?}");
        }

        let objs = t.folder("objs")?.ok_or("objs not opened")?;
        let child = objs.folder("a/child")?.ok_or("a/child not opened")?;
        assert_eq!(child.list()?, Vec::<String>::new());
        assert_eq!(objs.children("a")?, vec!["child".to_owned()]);
        assert_eq!(objs.children("absent")?, Vec::<String>::new());

        let links = t.folder("links")?.ok_or("links not opened")?;
        assert_eq!(
            links.list()?,
            vec!["absolute".to_owned(), "relative".to_owned()]
        );
        for name in ["absolute", "relative"] {
            assert_eq!(links.link_target(name)?, PathBuf::from("objs/a"));
            assert_eq!(
                t.link_target(&format!("links/{name}"))?,
                PathBuf::from("objs/a")
            );
        }
        // Reads through a link in the middle of the path, as the tree does.
        assert_eq!(links.read_attr("relative/attr")?, "42");

        let err = a.read_attr("child").err().ok_or("read a folder")?;
        assert_eq!(
            err.step().map(|s| s.1.to_path_buf()),
            Some(root.join("objs/a/child"))
        );
        Ok(())
    }
}
