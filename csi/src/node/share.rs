//! What the node does alike for both kinds of filesystem volume, an NFS
//! export and a node-local directory: each is staged by a mount of the
//! volume's share (no device), checked by what the staging path shows.
use super::error::{Error, Result};
use super::local::{bound_at, is_local};
use super::mounts::MountEntry;
use super::nfs::{export_at, is_nfs};
use super::record::StagingRecord;
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
