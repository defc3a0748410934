//! Node-local filesystem volumes (protocol `local`): a directory of the
//! agent on this very node, which NodeStageVolume bind-mounts at the
//! staging path; NodePublishVolume then binds the staging mount into pods
//! as for an NFS volume. The directory's path is the publish context's
//! target, and it is staged only when it lies under one of the node
//! plugin's `--local-root` folders (the directory backends' paths the
//! chart shares with it): a publish context naming another path is
//! refused, never bound.
//!
//! The staging mount is this volume's when the staging path shows the
//! directory itself: the same device and inode as the recorded path.
use super::error::{Error, Result};
use super::mounts::{bind, mount_at, MountEntry};
use super::record::StagingRecord;
use super::stage::{Access, StageRequest};
use super::Node;
use crate::publish_context::Protocol;
use std::os::unix::fs::MetadataExt;
use std::path::{Component, Path, PathBuf};

/// Whether a staging record is a node-local volume's.
pub fn is_local(r: &StagingRecord) -> bool {
    r.protocol == Protocol::Local.as_str()
}

/// The directory of a node-local volume, refused unless it is an absolute
/// plain path strictly under one of `roots`.
pub fn source_in(volume_id: &str, target: &str, roots: &[PathBuf]) -> Result<PathBuf> {
    let path = Path::new(target);
    // Rebuilt from its components, a plain path is unchanged (no `.`,
    // `..`, doubled or trailing slash).
    let rebuilt: PathBuf = path.components().collect();
    let plain = path.is_absolute()
        && rebuilt.as_os_str() == path.as_os_str()
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    let under = roots
        .iter()
        .any(|root| path != root.as_path() && path.starts_with(root));
    if plain && under {
        return Ok(path.to_owned());
    }
    Err(Error::invalid(format!(
        "volume {volume_id} is node-local at {target:?}, which is not a plain path under a folder this node plugin serves ({}): start it with --local-root naming the agent's directory backend path",
        if roots.is_empty() {
            "none".to_owned()
        } else {
            roots
                .iter()
                .map(|r| r.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        }
    )))
}

/// The staging mount of the node-local volume of `r` at `path`, or why
/// `path` does not show its directory.
pub(super) fn bound_at(
    r: &StagingRecord,
    path: &Path,
) -> Result<std::result::Result<MountEntry, String>> {
    let Some(m) = mount_at(path)? else {
        return Ok(Err(format!(
            "nothing is mounted at {}, where the directory {} of volume {} should be",
            path.display(),
            r.target,
            r.volume_id
        )));
    };
    let id = |p: &Path| std::fs::metadata(p).map(|m| (m.dev(), m.ino()));
    Ok(match (id(path), id(Path::new(&r.target))) {
        (Ok(at), Ok(want)) if at == want => Ok(m),
        (_, Err(e)) => Err(format!(
            "the directory {} of volume {} cannot be read: {e}",
            r.target, r.volume_id
        )),
        _ => Err(format!(
            "{} has {} ({}) mounted, not the directory {} of volume {}",
            path.display(),
            m.source,
            m.root.display(),
            r.target,
            r.volume_id
        )),
    })
}

impl Node {
    /// NodeStageVolume of a node-local volume: its directory bound at the
    /// staging path, recorded before the mount (a restart finds what it
    /// bound).
    pub(super) fn stage_local(&self, req: &StageRequest) -> Result<()> {
        let Access::Mount { flags, .. } = &req.access else {
            return Err(Error::invalid(format!(
                "volume {} is a node-local directory: it cannot be staged as a block device",
                req.volume_id
            )));
        };
        if !flags.is_empty() {
            return Err(Error::invalid(format!(
                "volume {} is a node-local directory, bind-mounted: mount options {flags:?} are not applied to it (ask NodePublishVolume for a read-only mount)",
                req.volume_id
            )));
        }
        let source = source_in(
            &req.volume_id,
            &req.context.target,
            &self.config.local_roots,
        )?;
        let want = StagingRecord {
            fs_type: Some("bind".into()),
            ..req.record()
        };
        self.stage_share(req, want, || {
            // Not followed: a symbolic link there is not the volume.
            if !std::fs::symlink_metadata(&source).is_ok_and(|m| m.is_dir()) {
                return Err(Error::precondition(format!(
                    "volume {}: its directory {} is not on this node (or is not a directory): a node-local volume is staged only on its agent's node",
                    req.volume_id,
                    source.display()
                )));
            }
            super::timed("bind", || bind(&source, &req.staging_path, false))
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_paths_under_a_root_are_staged() {
        let roots = vec![PathBuf::from("/srv/xfs/volumes")];
        let ok = source_in("v", "/srv/xfs/volumes/pvc-1", &roots).unwrap();
        assert_eq!(ok, Path::new("/srv/xfs/volumes/pvc-1"));
        for bad in [
            "/srv/xfs/volumes",
            "/srv/xfs/volumes/../../etc",
            "/srv/xfs/volumes/./pvc-1",
            "/srv/xfs/volumes//pvc-1",
            "/srv/xfs/volumes/pvc-1/",
            "srv/xfs/volumes/pvc-1",
            "/srv/xfs/volumes-2/pvc-1",
            "/etc",
            "",
        ] {
            let e = source_in("v", bad, &roots).unwrap_err();
            assert!(e.message.contains("--local-root"), "{bad}: {}", e.message);
        }
        let e = source_in("v", "/srv/xfs/volumes/pvc-1", &[]).unwrap_err();
        assert!(e.message.contains("(none)"), "{}", e.message);
    }
}
