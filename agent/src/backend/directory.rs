//! Directories on a storage node's XFS filesystem, each bounded by a
//! project quota the kernel enforces (`sys::quota`): filesystem volumes
//! exported over NFS, like ZFS filesystems, where the node has no ZFS.
//!
//! XFS only: ext4 keeps project quotas too, but lets a writer with
//! CAP_SYS_RESOURCE past them, and NFS exports carry a client's root as
//! root (`no_root_squash`), so a pod running as root would fill the
//! filesystem (sys/tests/quota_lab.rs shows both).
//!
//! A volume `<name>/<vol>` of the backend `name` is the directory
//! `<path>/<vol>`, in a project of its own whose hard limit is the volume's
//! capacity. The project ID is chosen when the volume is made (a hash of
//! the volume ID, the next free one on a collision) and pinned in the
//! volume's mark with the directory's inode, so a directory removed and
//! made again under the same name is never taken for the volume.
//!
//! An existing directory is adopted as it is (`import_directory`): in a
//! project of its own whose hard limit is already the volume's capacity,
//! pinned the same way, never chmod-ed, resized or removed.
use super::{Backend, BackendKind, Capacity, CreateOptions, ImportSource, VolumeState};
use crate::{adopt::refused, error::AgentError, marks::BackendRecord, volume::VolumeId};
use std::{
    fs,
    os::unix::fs::{DirBuilderExt, MetadataExt},
    path::{Path, PathBuf},
    sync::Mutex,
};
use sys::quota;

/// The first project ID this backend hands out: lower ones are left to
/// the operator's own projects (`/etc/projid` conventions start at 1).
const FIRST_PROJECT: u32 = 1 << 20;
/// `XFS_SUPER_MAGIC` of `linux/magic.h` ("XFSB").
const XFS_SUPER_MAGIC: u64 = 0x5846_5342;
/// How many project IDs the hash spreads over.
const PROJECT_SPAN: u32 = 1 << 30;

/// One backend of directories under `path`.
#[derive(Debug)]
pub struct DirectoryBackend {
    name: String,
    root: PathBuf,
    /// Held while a new volume's project ID is chosen and assigned, so two
    /// creates never take the same free ID.
    allocating: Mutex<()>,
}

fn quota_error(e: quota::Error) -> AgentError {
    match e {
        quota::Error::NotEnforced { .. } => AgentError::FailedPrecondition(e.to_string()),
        quota::Error::UnalignedLimit { .. } => AgentError::InvalidArgument(e.to_string()),
        quota::Error::Io { .. } => AgentError::Internal(e.to_string()),
    }
}

fn io_error(what: &str, path: &Path, e: std::io::Error) -> AgentError {
    let text = format!("{what} {}: {e}", path.display());
    match e.raw_os_error() {
        Some(code)
            if code == rustix::io::Errno::NOSPC.raw_os_error()
                || code == rustix::io::Errno::DQUOT.raw_os_error() =>
        {
            AgentError::ResourceExhausted(text)
        }
        _ => AgentError::Internal(text),
    }
}

/// The project ID a volume ID hashes to (FNV-1a), before collisions.
fn hashed_project(id: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in id.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    FIRST_PROJECT + h % PROJECT_SPAN
}

/// Whether `project` is one this backend hands out.
fn ours(project: u32) -> bool {
    (FIRST_PROJECT..FIRST_PROJECT + PROJECT_SPAN).contains(&project)
}

/// Capacities are whole 4 KiB blocks: XFS keeps limits in filesystem
/// blocks, so a limit that is not one would read back changed.
fn round_up(bytes: u64) -> u64 {
    bytes.div_ceil(4096).max(1) * 4096
}

impl DirectoryBackend {
    /// A backend named `name` for directories under `path`, which must be
    /// an absolute path to a directory on an XFS that enforces project
    /// quotas (checked now, so a wrong mount fails the start).
    pub fn new(name: &str, path: &Path) -> Result<Self, AgentError> {
        if !path.is_absolute() {
            return Err(AgentError::InvalidArgument(format!(
                "directory backend {name}: path {} is not absolute",
                path.display()
            )));
        }
        if !fs::metadata(path).map(|m| m.is_dir()).unwrap_or(false) {
            return Err(AgentError::FailedPrecondition(format!(
                "directory backend {name}: {} is not a directory",
                path.display()
            )));
        }
        let fs_type = rustix::fs::statfs(path)
            .map_err(|e| io_error("statfs", path, e.into()))?
            .f_type;
        if fs_type as u64 != XFS_SUPER_MAGIC {
            return Err(AgentError::FailedPrecondition(format!(
                "directory backend {name}: {} is not on XFS (filesystem magic {fs_type:#x}); directory volumes need XFS mounted with prjquota",
                path.display()
            )));
        }
        quota::usage(path, 0).map_err(quota_error)?;
        Ok(Self {
            name: name.to_owned(),
            root: path.to_owned(),
            allocating: Mutex::new(()),
        })
    }

    fn path(at: &BackendRecord) -> Result<PathBuf, AgentError> {
        match at {
            BackendRecord::Directory { path, .. } => Ok(PathBuf::from(path)),
            other => Err(AgentError::Internal(format!(
                "directory backend asked about {other:?}"
            ))),
        }
    }

    /// The directory now at `at`'s path, its inode and project (`None`:
    /// there is none), refused when it is not the one `at` pinned.
    fn identified(&self, at: &BackendRecord) -> Result<Option<(u64, u32)>, AgentError> {
        let path = Self::path(at)?;
        let meta = match fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_error("stat", &path, e)),
        };
        if !meta.is_dir() {
            return Err(AgentError::FailedPrecondition(format!(
                "identity: {} is not a directory",
                path.display()
            )));
        }
        let project = quota::project(&path).map_err(quota_error)?.id;
        if let BackendRecord::Directory {
            inode: Some(inode),
            project: Some(pinned),
            ..
        } = at
        {
            if (meta.ino(), project) != (*inode, *pinned) {
                return Err(AgentError::FailedPrecondition(format!(
                    "identity: directory {} has inode {} and project {project}, not the pinned inode {inode} and project {pinned}; it was removed or re-made",
                    path.display(),
                    meta.ino()
                )));
            }
        }
        Ok(Some((meta.ino(), project)))
    }

    fn record(path: &Path, inode: u64, project: u32) -> BackendRecord {
        BackendRecord::Directory {
            path: path.to_string_lossy().into_owned(),
            inode: Some(inode),
            project: Some(project),
        }
    }

    fn state(&self, path: &Path, project: u32) -> Result<VolumeState, AgentError> {
        Ok(VolumeState {
            capacity_bytes: quota::usage(path, project)
                .map_err(quota_error)?
                .limit_bytes,
            device_path: path.to_owned(),
        })
    }

    /// A project ID no directory nor limit uses yet, from the volume ID's
    /// hash on.
    fn free_project(&self, id: &str) -> Result<u32, AgentError> {
        let mut project = hashed_project(id);
        for _ in 0..1024 {
            if quota::usage(&self.root, project).map_err(quota_error)? == quota::Usage::default() {
                return Ok(project);
            }
            project = FIRST_PROJECT + (project - FIRST_PROJECT + 1) % PROJECT_SPAN;
        }
        Err(AgentError::ResourceExhausted(format!(
            "directory backend {}: no free project ID near {}",
            self.name,
            hashed_project(id)
        )))
    }

    /// Adopts the existing directory `raw` names for `id` after read-only
    /// checks, each refusal a FAILED_PRECONDITION naming what to change:
    /// layout, existence, type, the backend's own filesystem, and the exact
    /// quota prerequisite (a project with the inherit flag whose hard limit
    /// equals the requested capacity). Nothing is set, moved or removed.
    fn adopt(
        &self,
        id: &VolumeId,
        raw: &str,
        bytes: u64,
    ) -> Result<(BackendRecord, VolumeState), AgentError> {
        let named = api::annotations::parse_import_directory(raw)
            .map_err(|e| AgentError::InvalidArgument(format!("volume {id}: {e}")))?;
        let resolved = Self::path(&self.locate(id)?)?;
        if Path::new(named.parent()) != self.root {
            return Err(AgentError::FailedPrecondition(format!(
                "volume {id}: requested directory {named} is not directly under the directory backend {}'s path {}",
                self.name,
                self.root.display()
            )));
        }
        if Path::new(named.as_str()) != resolved {
            return Err(refused(
                id,
                format!(
                    "layout: expected directory {named} does not match the resolved directory {}",
                    resolved.display()
                ),
            ));
        }
        let meta = match fs::symlink_metadata(&resolved) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(refused(
                    id,
                    format!("missing: directory {named} does not exist"),
                ))
            }
            other => other.map_err(|e| io_error("stat", &resolved, e))?,
        };
        if !meta.is_dir() {
            return Err(refused(
                id,
                format!("wrong type: {named} is not a directory (a symbolic link is not followed); only directories can be imported"),
            ));
        }
        let root_device = fs::metadata(&self.root)
            .map_err(|e| io_error("stat", &self.root, e))?
            .dev();
        if meta.dev() != root_device {
            return Err(refused(
                id,
                format!("mount: {named} is another filesystem mounted on the backend's; only a directory of the backend's own XFS is bounded by its quota"),
            ));
        }
        let project = quota::project(&resolved).map_err(quota_error)?;
        if project.id == 0 {
            return Err(refused(
                id,
                format!("quota: directory {named} is in no project; put it in a project of its own whose hard limit is {bytes} bytes (the requested capacity) first: import never sets a quota"),
            ));
        }
        if !project.inherit {
            return Err(refused(
                id,
                format!("quota: directory {named} is in project {} without the inherit flag, so what is made inside it escapes the limit; set it (xfs_quota -x -c 'project -s ...') first", project.id),
            ));
        }
        let limit = quota::usage(&resolved, project.id)
            .map_err(quota_error)?
            .limit_bytes;
        if limit != bytes {
            return Err(refused(
                id,
                format!(
                    "quota: project {} of directory {named} has a hard limit of {limit} bytes, requested capacity is {bytes} bytes; they must be equal: import never changes a quota",
                    project.id
                ),
            ));
        }
        let state = self.state(&resolved, project.id)?;
        Ok((Self::record(&resolved, meta.ino(), project.id), state))
    }

    /// Removes the tree at `dir` without leaving its filesystem: an entry
    /// on another device (a mount inside) is refused before anything of
    /// that subtree is removed; symbolic links are removed, never followed.
    fn remove_tree(dir: &Path, device: u64) -> Result<(), AgentError> {
        for entry in fs::read_dir(dir).map_err(|e| io_error("read", dir, e))? {
            let path = entry.map_err(|e| io_error("read", dir, e))?.path();
            let meta = fs::symlink_metadata(&path).map_err(|e| io_error("stat", &path, e))?;
            if meta.dev() != device {
                return Err(AgentError::FailedPrecondition(format!(
                    "{} is another filesystem mounted inside the volume; unmount it first",
                    path.display()
                )));
            }
            if meta.is_dir() {
                Self::remove_tree(&path, device)?;
            } else {
                fs::remove_file(&path).map_err(|e| io_error("remove", &path, e))?;
            }
        }
        fs::remove_dir(dir).map_err(|e| io_error("remove", dir, e))
    }
}

impl Backend for DirectoryBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Directory
    }

    fn pool(&self) -> &str {
        &self.name
    }

    fn locate(&self, id: &VolumeId) -> Result<BackendRecord, AgentError> {
        Ok(BackendRecord::Directory {
            path: self.root.join(id.name()).to_string_lossy().into_owned(),
            inode: None,
            project: None,
        })
    }

    fn create(
        &self,
        at: &BackendRecord,
        bytes: u64,
        options: &CreateOptions,
    ) -> Result<(BackendRecord, VolumeState), AgentError> {
        let path = Self::path(at)?;
        if options.encrypted || options.thin.is_some() || !options.zfs_properties.is_empty() {
            return Err(AgentError::InvalidArgument(format!(
                "directory {}: encryption, LVM provisioning and ZFS properties do not apply to directory volumes",
                path.display()
            )));
        }
        let bytes = round_up(bytes);
        let (inode, project) = match self.identified(at)? {
            // Made before (a retry, or a crash between the steps below).
            Some((inode, project)) if ours(project) => (inode, project),
            Some((_, project)) if project != 0 => {
                return Err(AgentError::FailedPrecondition(format!(
                    "directory {} exists in project {project}, which this agent does not hand out; it is not a volume of this agent (adopt it with import_directory)",
                    path.display()
                )))
            }
            found => {
                let _one = self.allocating.lock().unwrap_or_else(|p| p.into_inner());
                // A directory in no project is taken only empty (this
                // agent's own, made before a crash): one that holds data
                // is an operator's.
                if found.is_some()
                    && fs::read_dir(&path)
                        .map_err(|e| io_error("read", &path, e))?
                        .next()
                        .is_some()
                {
                    return Err(AgentError::FailedPrecondition(format!(
                        "directory {} exists, holds data and is in no project; it is not a volume of this agent",
                        path.display()
                    )));
                }
                if found.is_none() {
                    fs::DirBuilder::new()
                        .mode(0o755)
                        .create(&path)
                        .map_err(|e| io_error("create", &path, e))?;
                }
                let inode = fs::symlink_metadata(&path)
                    .map_err(|e| io_error("stat", &path, e))?
                    .ino();
                let id = path.to_string_lossy();
                let project = self.free_project(&id)?;
                quota::assign(&path, project).map_err(quota_error)?;
                (inode, project)
            }
        };
        let limit = quota::usage(&path, project)
            .map_err(quota_error)?
            .limit_bytes;
        if limit == 0 {
            quota::set_limit(&path, project, bytes).map_err(quota_error)?;
        } else if limit < bytes {
            return Err(AgentError::AlreadyExists(format!(
                "directory {} exists with a project quota of {limit} bytes, less than the {bytes} requested",
                path.display()
            )));
        }
        let state = self.state(&path, project)?;
        Ok((Self::record(&path, inode, project), state))
    }

    fn lookup(&self, at: &BackendRecord) -> Result<Option<VolumeState>, AgentError> {
        let path = Self::path(at)?;
        match self.identified(at)? {
            Some((_, project)) => self.state(&path, project).map(Some),
            None => Ok(None),
        }
    }

    fn destroy(&self, at: &BackendRecord) -> Result<(), AgentError> {
        let path = Self::path(at)?;
        let Some((_, project)) = self.identified(at)? else {
            return Ok(());
        };
        let device = fs::symlink_metadata(&path)
            .map_err(|e| io_error("stat", &path, e))?
            .dev();
        Self::remove_tree(&path, device)?;
        // The project's limit goes with it, so its ID is free again.
        if project != 0 {
            quota::set_limit(&self.root, project, 0).map_err(quota_error)?;
        }
        Ok(())
    }

    fn expand(&self, at: &BackendRecord, bytes: u64) -> Result<u64, AgentError> {
        let path = Self::path(at)?;
        let (_, project) = self.identified(at)?.ok_or_else(|| {
            AgentError::NotFound(format!("directory {} does not exist", path.display()))
        })?;
        let current = quota::usage(&path, project)
            .map_err(quota_error)?
            .limit_bytes;
        let bytes = round_up(bytes);
        if bytes <= current {
            return Ok(current);
        }
        quota::set_limit(&path, project, bytes).map_err(quota_error)?;
        Ok(quota::usage(&path, project)
            .map_err(quota_error)?
            .limit_bytes)
    }

    fn import(
        &self,
        id: &VolumeId,
        source: &ImportSource,
        bytes: u64,
    ) -> Result<(BackendRecord, VolumeState), AgentError> {
        match source {
            ImportSource::Directory { path } => self.adopt(id, path, bytes),
            _ => Err(AgentError::InvalidArgument(format!(
                "volume {id}: a directory backend imports directories only (import_directory)"
            ))),
        }
    }

    fn capacity(&self) -> Result<Capacity, AgentError> {
        let st = rustix::fs::statvfs(&self.root)
            .map_err(|e| io_error("statvfs", &self.root, e.into()))?;
        let unit = st.f_frsize.max(1);
        Ok(Capacity {
            total_bytes: st.f_blocks * unit,
            available_bytes: st.f_bavail * unit,
            used_bytes: (st.f_blocks - st.f_bfree) * unit,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn project_ids_are_spread_above_the_operators_own() {
        let a = hashed_project("files/vol-a");
        let b = hashed_project("files/vol-b");
        assert_ne!(a, b);
        for p in [a, b, hashed_project("")] {
            assert!(ours(p), "{p}");
        }
        assert!(!ours(0) && !ours(FIRST_PROJECT - 1) && !ours(FIRST_PROJECT + PROJECT_SPAN));
        assert_eq!(a, hashed_project("files/vol-a"), "the same ID each time");
    }

    #[test]
    fn capacities_are_whole_blocks() {
        assert_eq!(round_up(1), 4096);
        assert_eq!(round_up(0), 4096);
        assert_eq!(round_up(1 << 30), 1 << 30);
        assert_eq!(round_up((1 << 20) + 1), (1 << 20) + 4096);
    }

    #[test]
    fn a_relative_or_missing_path_is_refused_at_start() {
        let err = DirectoryBackend::new("files", Path::new("srv/files")).expect_err("relative");
        assert!(err.to_string().contains("is not absolute"), "{err}");
        let err =
            DirectoryBackend::new("files", Path::new("/nonexistent/files")).expect_err("missing");
        assert!(err.to_string().contains("is not a directory"), "{err}");
    }

    #[test]
    fn a_directory_off_xfs_is_refused_at_start() {
        // The tests' temporary folder is never an XFS with prjquota.
        let dir = tempfile::tempdir().expect("tempdir");
        let err = DirectoryBackend::new("files", dir.path()).expect_err("not XFS");
        assert!(matches!(err, AgentError::FailedPrecondition(_)), "{err:?}");
        assert!(err.to_string().contains("prjquota"), "{err}");
    }
}
