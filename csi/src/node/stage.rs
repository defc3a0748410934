//! NodeStageVolume and NodeUnstageVolume: attach, format when blank and
//! mount at the staging path; and undo it, ending the connection only when
//! no other staged volume uses it.
use super::error::{Error, Kind, Result};
use super::format::{device_size, ensure_filesystem, grow, grows_when_staged, Outcome};
use super::mounts::{mount_at, mount_filesystem, split_options, unmount_path};
use super::record::{Phase, StagingRecord};
use super::{Fault, Node};
use crate::publish_context::{Protocol, PublishContext};
use std::{
    path::{Path, PathBuf},
    sync::mpsc,
    time::Duration,
};
use sys::block::{DevNum, Host};

/// How long Unstage waits for an unmount (which writes the filesystem's
/// dirty data back first) before it answers: with the transport dead the
/// mount is detached lazily and the connection ended (nothing can be
/// written back any more); with it alive Unstage fails with
/// DEADLINE_EXCEEDED, keeps the connection, and kubelet's retry finds the
/// writeback further on.
pub const UNMOUNT_WAIT: Duration = Duration::from_secs(10);

/// What a volume is staged as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// A raw block device; nothing is mounted at staging.
    Block,
    /// A filesystem, mounted at staging.
    Mount {
        /// `ext4` or `xfs`.
        fs_type: String,
        /// CSI mount flags.
        flags: Vec<String>,
    },
}

/// One NodeStageVolume call, checked.
#[derive(Debug, Clone)]
pub struct StageRequest {
    /// The CSI volume ID.
    pub volume_id: String,
    /// The staging path.
    pub staging_path: PathBuf,
    /// Where to attach from.
    pub context: PublishContext,
    /// Block or filesystem.
    pub access: Access,
    /// The volume context's `existingData` (an import, an adoption, a
    /// recovery): such a volume is never formatted.
    pub existing_data: Option<String>,
}

/// The device number of a device node.
pub fn devnum(device: &Path) -> Result<DevNum> {
    Host::default()
        .device(device)
        .map(|d| d.devnum)
        .map_err(|e| Error::internal(e.to_string()))
}

impl StageRequest {
    /// The record this Stage writes (before its device is known).
    pub(super) fn record(&self) -> StagingRecord {
        let (fs_type, mount_flags) = match &self.access {
            Access::Block => (None, Vec::new()),
            Access::Mount { fs_type, flags } => (Some(fs_type.clone()), flags.clone()),
        };
        StagingRecord {
            volume_id: self.volume_id.clone(),
            staging_path: self.staging_path.clone(),
            protocol: self.context.protocol.as_str().to_owned(),
            address: self.context.address.to_string(),
            port: self.context.port,
            target: self.context.target.clone(),
            lun: self.context.lun,
            fs_type,
            mount_flags,
            device: None,
            device_id: None,
            phase: Phase::Attaching,
        }
    }
}

/// Whether a repeated Stage asks for what the record holds (the device and
/// phase aside).
pub(super) fn same_request(have: &StagingRecord, want: &StagingRecord) -> bool {
    let strip = |r: &StagingRecord| StagingRecord {
        device: None,
        device_id: None,
        phase: Phase::Attaching,
        ..r.clone()
    };
    strip(have) == strip(want)
}

/// The refusal of a Stage that asks for other than what is staged.
pub(super) fn conflict(req: &StageRequest, have: &StagingRecord, want: &StagingRecord) -> Error {
    Error::exists(format!(
        "volume {} is already staged at {} ({} {} LUN {}, {}); this call asks for {} ({} {} LUN {}, {})",
        req.volume_id,
        have.staging_path.display(),
        have.protocol,
        have.target,
        have.lun,
        have.fs_type.as_deref().unwrap_or("block"),
        want.staging_path.display(),
        want.protocol,
        want.target,
        want.lun,
        want.fs_type.as_deref().unwrap_or("block"),
    ))
}

fn connection_key(r: &StagingRecord) -> String {
    format!("{}|{}|{}|{}", r.protocol, r.address, r.port, r.target)
}

impl Node {
    /// NodeStageVolume.
    pub fn stage(&self, req: &StageRequest) -> Result<()> {
        self.volume_locks
            .with(&req.volume_id, || self.stage_locked(req))
    }

    fn stage_locked(&self, req: &StageRequest) -> Result<()> {
        match req.context.protocol {
            Protocol::Nfs => return self.stage_nfs(req),
            Protocol::Local => return self.stage_local(req),
            Protocol::NvmeofTcp | Protocol::Iscsi => {}
        }
        let want = req.record();
        let existing = self.records.load(&req.volume_id)?;
        let fresh = existing.is_none();
        let mut record = match existing {
            Some(have) if !same_request(&have, &want) => return Err(conflict(req, &have, &want)),
            Some(have) => have,
            None => want,
        };
        // Attach every time: it reuses the connection and finds the device
        // again (its name may have changed since a restart).
        let attach = self.connection_locks.with(&connection_key(&record), || {
            if record.phase == Phase::Attaching {
                self.records.save(&record)?;
            }
            Ok(self.attacher.attach(&req.context))
        })?;
        let staged = attach
            .device
            .and_then(|device| self.finish_stage(req, &mut record, &device));
        if let Err(e) = &staged {
            // kubelet calls no Unstage after a failed Stage: the node is
            // left as it was before this call.
            self.undo_stage(&record, fresh, attach.made, e);
        }
        staged
    }

    /// The rest of a Stage once the device is known: recorded, formatted
    /// when blank and mounted (a filesystem), marked Staged.
    fn finish_stage(
        &self,
        req: &StageRequest,
        record: &mut StagingRecord,
        device: &Path,
    ) -> Result<()> {
        let device_id = self.attacher.identity(device);
        if record.device.as_deref() != Some(device)
            || record.device_id != device_id
            || record.phase == Phase::Attaching
        {
            record.device = Some(device.to_owned());
            record.device_id = device_id;
            record.phase = record.phase.max_attached();
            self.records.save(record)?;
        }
        if let Access::Mount { fs_type, flags } = &req.access {
            self.mount_staging(req, device, fs_type, flags)?;
        }
        if record.phase != Phase::Staged {
            record.phase = Phase::Staged;
            self.records.save(record)?;
        }
        Ok(())
    }

    /// Undoes what a failed Stage did: the connection it made (`made`) is
    /// ended, after its staging mount if it made one; the record it wrote
    /// (`fresh`) is removed. A connection or record found is left alone.
    /// What cannot be undone is logged beside the Stage's own error.
    fn undo_stage(&self, record: &StagingRecord, fresh: bool, made: bool, failed: &Error) {
        let undo = || -> Result<()> {
            if made {
                if let Some(device) = &record.device {
                    if mount_at(&record.staging_path)?
                        .is_some_and(|m| devnum(device).is_ok_and(|d| d == m.devnum))
                    {
                        unmount_path(&record.staging_path, false)?;
                    }
                }
                self.end_connection(record)?;
            }
            if fresh {
                self.records.remove(&record.volume_id)?;
            }
            Ok(())
        };
        match undo() {
            Ok(()) => tracing::info!(made, fresh, error = %failed, "failed Stage undone"),
            Err(e) => {
                tracing::warn!(error = %e, stage_error = %failed, "could not undo a failed Stage")
            }
        }
    }

    fn mount_staging(
        &self,
        req: &StageRequest,
        device: &Path,
        fs_type: &str,
        flags: &[String],
    ) -> Result<()> {
        let mut options = split_options(flags)?;
        if fs_type == "xfs" {
            // A snapshot's restore and a clone carry their source's XFS
            // UUID, and XFS refuses a second mount of one UUID: without
            // `nouuid` a copy could not be staged on the node that stages
            // its source (nor the source beside its copy).
            options = options.with_data("nouuid");
        }
        let dev = devnum(device)?;
        if let Some(m) = mount_at(&req.staging_path)? {
            if m.devnum == dev && m.fs_type == fs_type {
                return Ok(());
            }
            return Err(Error::exists(format!(
                "{} already has {} ({}) mounted, not {} of volume {}",
                req.staging_path.display(),
                m.source,
                m.fs_type,
                device.display(),
                req.volume_id
            )));
        }
        let outcome = ensure_filesystem(device, fs_type, req.existing_data.as_deref())?;
        tracing::info!(device = %device.display(), fs_type, formatted = (outcome == Outcome::Formatted), "filesystem ready");
        if self.config.fault == Some(Fault::HangBeforeMount) {
            tracing::warn!("fault injected: hanging before the mount");
            loop {
                std::thread::park();
            }
        }
        std::fs::create_dir_all(&req.staging_path)
            .map_err(|e| Error::io(req.staging_path.display(), e))?;
        super::timed("mount", || {
            mount_filesystem(device, &req.staging_path, fs_type, &options)
        })?;
        if outcome == Outcome::Reused && grows_when_staged(req.existing_data.as_deref()) {
            grow(&req.staging_path, fs_type, device_size(device)?)?;
        }
        Ok(())
    }

    /// NodeUnstageVolume: unmounts the staging path, ends the connection if
    /// no other staged volume uses it and the device is idle, forgets the
    /// volume. A volume not staged (no record) is fine and nothing is
    /// touched; a path other than the recorded one is left alone.
    pub fn unstage(&self, volume_id: &str, staging_path: &Path) -> Result<()> {
        self.volume_locks.with(volume_id, || {
            let Some(record) = self.records.load(volume_id)? else {
                return Ok(());
            };
            if record.staging_path != staging_path {
                tracing::warn!(
                    recorded = %record.staging_path.display(),
                    "the volume is staged at another path; nothing done"
                );
                return Ok(());
            }
            self.unmount_bounded(&record)?;
            self.release(&record)
        })
    }

    /// Ends the connection of `record` unless another staged volume uses
    /// it, then forgets the volume. A connection whose device is still in
    /// use (mounted, held, open, or a filesystem still writing back) is
    /// kept and the call fails, unless its transport is dead already.
    fn release(&self, record: &StagingRecord) -> Result<()> {
        self.check_idle(record)?;
        self.end_connection(record)?;
        self.records.remove(&record.volume_id)
    }

    /// Ends the connection of `record` unless another staged volume uses it.
    fn end_connection(&self, record: &StagingRecord) -> Result<()> {
        self.connection_locks.with(&connection_key(record), || {
            let shared = self
                .records
                .all()?
                .iter()
                .any(|o| o.volume_id != record.volume_id && o.shares_connection(record));
            if shared {
                tracing::info!(target = %record.target, "connection kept: another staged volume uses it");
                return Ok(());
            }
            self.attacher.detach(record)
        })
    }

    /// Refuses to end a living connection whose device is still in use.
    fn check_idle(&self, record: &StagingRecord) -> Result<()> {
        let Some(device) = &record.device else {
            return Ok(());
        };
        if let Some(why) = self.attacher.transport_dead(record) {
            tracing::info!(device = %device.display(), why, "the transport is dead: ending it whatever uses the device");
            return Ok(());
        }
        let usage = Host::default()
            .usage(device)
            .map_err(|e| Error::internal(e.to_string()))?;
        if usage.is_idle() {
            return Ok(());
        }
        Err(Error::precondition(format!(
            "volume {}: {} is still in use ({}); its connection is kept so that nothing written is lost: NodeUnstageVolume again once it is idle",
            record.volume_id,
            device.display(),
            usage.reasons().join("; ")
        )))
    }

    /// Unmounts the staging path of `record` (none mounted is fine). An
    /// unmount still blocked after [`UNMOUNT_WAIT`] goes on in the
    /// background; with the transport dead the mount is detached lazily,
    /// with it alive this fails with DEADLINE_EXCEEDED and nothing is cut.
    fn unmount_bounded(&self, record: &StagingRecord) -> Result<()> {
        let path = &record.staging_path;
        while mount_at(path)?.is_some() {
            let (tx, rx) = mpsc::channel();
            let target = path.to_owned();
            std::thread::spawn(move || {
                let _ = tx.send(unmount_path(&target, false));
            });
            match rx.recv_timeout(UNMOUNT_WAIT) {
                Ok(result) => result?,
                Err(_) => match self.attacher.transport_dead(record) {
                    Some(why) => {
                        tracing::warn!(path = %path.display(), why, "unmount blocked and the transport is dead; detaching lazily");
                        if mount_at(path)?.is_some() {
                            unmount_path(path, true)?;
                        }
                    }
                    None => {
                        return Err(Error::new(
                            Kind::Timeout,
                            format!(
                                "unmounting {} has not finished after {UNMOUNT_WAIT:?}: the filesystem is still writing volume {} back over a live connection, which is kept; NodeUnstageVolume again later",
                                path.display(),
                                record.volume_id
                            ),
                        ))
                    }
                },
            }
        }
        Ok(())
    }
}

impl Phase {
    fn max_attached(self) -> Phase {
        match self {
            Phase::Attaching | Phase::Attached => Phase::Attached,
            Phase::Staged => Phase::Staged,
        }
    }
}
