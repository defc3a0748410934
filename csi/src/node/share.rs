//! What the node does alike for both kinds of filesystem volume, an NFS
//! export and a node-local directory: each is staged by a mount of the
//! volume's share (no device), checked by what the staging path shows.
use super::error::{Error, Result};
use super::local::{bound_at, is_local};
use super::mounts::{mount_at, MountEntry};
use super::nfs::{export_at, is_nfs};
use super::record::{Phase, StagingRecord};
use super::stage::{conflict, same_request, StageRequest};
use super::Node;
use std::path::Path;

/// Whether a staging record is a filesystem volume's (NFS or node-local).
pub fn is_share(r: &StagingRecord) -> bool {
    is_nfs(r) || is_local(r)
}

/// The staging mount of the filesystem volume of `r` at `path`, or why
/// `path` does not hold its share.
pub(super) fn share_at(
    r: &StagingRecord,
    path: &Path,
) -> Result<std::result::Result<MountEntry, String>> {
    if is_local(r) {
        bound_at(r, path)
    } else {
        export_at(r, path)
    }
}

/// The staging mount of `r`, refusing when it is gone.
pub(super) fn staged_share(r: &StagingRecord) -> Result<MountEntry> {
    share_at(r, &r.staging_path)?.map_err(|why| {
        Error::precondition(format!(
            "{why}: the staging mount is gone; NodeUnstageVolume and NodeStageVolume the volume again"
        ))
    })
}

impl Node {
    /// NodeStageVolume of a filesystem volume once its request is checked:
    /// `want` recorded before `mount` runs (a restart finds what it
    /// mounted), `mount` run only when the staging path does not hold the
    /// share already, the record forgotten again when a new stage's mount
    /// fails (kubelet calls no Unstage after a failed Stage), then marked
    /// Staged.
    pub(super) fn stage_share(
        &self,
        req: &StageRequest,
        want: StagingRecord,
        mount: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let existing = self.records.load(&req.volume_id)?;
        if let Some(have) = &existing {
            if !same_request(have, &want) {
                return Err(conflict(req, have, &want));
            }
        }
        let mut record = existing.clone().unwrap_or(want);
        if let Err(why) = share_at(&record, &req.staging_path)? {
            if mount_at(&req.staging_path)?.is_some() {
                return Err(Error::exists(why));
            }
            if existing.is_none() {
                self.records.save(&record)?;
            }
            let mounted = std::fs::create_dir_all(&req.staging_path)
                .map_err(|e| Error::io(req.staging_path.display(), e))
                .and_then(|()| mount());
            if let Err(e) = mounted {
                if existing.is_none() {
                    self.records.remove(&req.volume_id)?;
                }
                return Err(e);
            }
        }
        if record.phase != Phase::Staged {
            record.phase = Phase::Staged;
            self.records.save(&record)?;
        }
        Ok(())
    }
}
