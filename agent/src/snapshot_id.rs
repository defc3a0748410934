//! Snapshot IDs: `<volume_id>@pillar-snap-<snapshot_uid>`.
use crate::{error::AgentError, volume::VolumeId};
use std::fmt;

/// The prefix of every snapshot CreateSnapshot takes, so none can take the
/// name of an operator's own (`@pre-pillar`).
pub const SNAPSHOT_PREFIX: &str = "pillar-snap-";
/// The prefix of the snapshot a clone-from-volume takes of its source.
pub const CLONE_PREFIX: &str = "pillar-clone-";
/// The longest snapshot UID accepted.
pub const MAX_UID: usize = 64;

/// A checked snapshot ID.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct SnapshotId {
    volume: VolumeId,
    uid: String,
}

/// Checks a snapshot UID: 1 to [`MAX_UID`] ASCII letters, digits and `-`.
pub fn check_uid(field: &str, uid: &str) -> Result<(), AgentError> {
    let bad = |why: &str| AgentError::InvalidArgument(format!("{field} {uid:?}: {why}"));
    if uid.is_empty() {
        return Err(bad("is empty"));
    }
    if uid.len() > MAX_UID {
        return Err(bad(&format!("is longer than {MAX_UID} bytes")));
    }
    if let Some(c) = uid
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '-'))
    {
        return Err(bad(&format!(
            "contains {c:?}; only ASCII letters, digits and '-' are allowed"
        )));
    }
    Ok(())
}

impl SnapshotId {
    /// The ID of the snapshot of `volume` owned by `uid`.
    pub fn new(volume: VolumeId, uid: &str) -> Result<Self, AgentError> {
        check_uid("snapshot_uid", uid)?;
        Ok(Self {
            volume,
            uid: uid.to_owned(),
        })
    }

    /// Parses `<volume_id>@pillar-snap-<uid>`; the error names what is wrong.
    pub fn parse(id: &str) -> Result<Self, AgentError> {
        let (volume, name) = id.split_once('@').ok_or_else(|| {
            AgentError::InvalidArgument(format!(
                "snapshot_id {:?}: must be <volume_id>@{SNAPSHOT_PREFIX}<snapshot_uid>",
                crate::volume::truncate(id)
            ))
        })?;
        let uid = name.strip_prefix(SNAPSHOT_PREFIX).ok_or_else(|| {
            AgentError::InvalidArgument(format!(
                "snapshot_id {:?}: the snapshot name must start with {SNAPSHOT_PREFIX} (this agent deletes only the snapshots it takes)",
                crate::volume::truncate(id)
            ))
        })?;
        Self::new(VolumeId::parse(volume)?, uid)
    }

    /// The source volume.
    pub fn volume(&self) -> &VolumeId {
        &self.volume
    }

    /// The owner's UID.
    pub fn uid(&self) -> &str {
        &self.uid
    }

    /// The snapshot's name on the backend (after `@`).
    pub fn name(&self) -> String {
        format!("{SNAPSHOT_PREFIX}{}", self.uid)
    }
}

impl fmt::Display for SnapshotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.volume, self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_names_what_is_wrong() {
        let id = SnapshotId::parse("tank/pvc-1@pillar-snap-0a1b-2c").expect("valid");
        assert_eq!(id.volume().as_str(), "tank/pvc-1");
        assert_eq!(id.uid(), "0a1b-2c");
        assert_eq!(id.to_string(), "tank/pvc-1@pillar-snap-0a1b-2c");
        for (bad, says) in [
            ("tank/pvc-1", "must be <volume_id>@"),
            ("tank/pvc-1@pre-pillar", "must start with pillar-snap-"),
            ("tank/pvc-1@pillar-snap-", "is empty"),
            ("tank/pvc-1@pillar-snap-a@b", "contains '@'"),
            ("tank/pvc-1@pillar-snap-a_b", "contains '_'"),
            ("tank@pillar-snap-a", "volume_id"),
        ] {
            let e = SnapshotId::parse(bad).expect_err(bad);
            assert!(
                matches!(e, AgentError::InvalidArgument(_)) && e.to_string().contains(says),
                "{bad}: {e}"
            );
        }
        let long = "a".repeat(MAX_UID + 1);
        assert!(SnapshotId::parse(&format!("tank/v@pillar-snap-{long}")).is_err());
    }
}
