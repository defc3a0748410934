//! ExportVolume, UnexportVolume, AllowInitiator and DenyInitiator, and the
//! export steps other operations share.
use super::{blocking, recorded, Agent};
use crate::{
    adopt::OwnExports,
    backend::BackendKind,
    error::AgentError,
    export::{ExportInfo, Protocol},
    fence::{Call, Token},
    marks::{BackendRecord, ExportRecord, FenceMark},
    volume::{truncate, VolumeId},
};
use std::{path::Path, sync::Arc, time::Instant};
use tracing::{info, warn};

/// The longest initiator name accepted (an NQN's limit).
const MAX_INITIATOR: usize = 223;
/// The longest CHAP user name or secret LIO holds.
const MAX_CHAP: usize = 255;

/// Refuses CHAP where it cannot apply (NVMe/TCP; an iSCSI export without an
/// ACL, since LIO checks CHAP per node ACL) or that LIO cannot hold.
pub(crate) fn check_chap(protocol: Protocol, record: &ExportRecord) -> Result<(), AgentError> {
    let Some(chap) = &record.chap else {
        return Ok(());
    };
    if protocol != Protocol::Iscsi {
        return Err(AgentError::InvalidArgument(format!(
            "chap: CHAP is for iSCSI exports, not {}",
            protocol.as_str()
        )));
    }
    if !record.acl {
        return Err(AgentError::InvalidArgument(
            "chap: CHAP needs acl_enabled (LIO checks CHAP per allowed initiator)".into(),
        ));
    }
    for (field, value) in [("username", &chap.username), ("password", &chap.password)] {
        if value.is_empty()
            || value.len() > MAX_CHAP
            || !value.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(AgentError::InvalidArgument(format!(
                "chap.{field}: must be 1 to {MAX_CHAP} printable ASCII characters without spaces ({} bytes given)",
                value.len()
            )));
        }
    }
    Ok(())
}

/// Refuses a transport the volume cannot be served over: a block volume
/// over NVMe/TCP or iSCSI only, a filesystem over NFS, and a directory also
/// node-local.
fn check_transport(
    id: &VolumeId,
    location: &BackendRecord,
    protocol: Protocol,
) -> Result<(), AgentError> {
    let directory = matches!(location, BackendRecord::Directory { .. });
    match (location.is_filesystem(), protocol) {
        (true, Protocol::Nfs) | (false, Protocol::NvmeofTcp | Protocol::Iscsi) => Ok(()),
        (true, Protocol::Local) if directory => Ok(()),
        (true, Protocol::Local) => Err(AgentError::InvalidArgument(format!(
            "volume {id} is a ZFS filesystem: it is exported over nfs; only a directory is served node-local"
        ))),
        (true, _) => Err(AgentError::InvalidArgument(format!(
            "volume {id} is a filesystem: it is exported over nfs{}, not {}",
            if directory { " or local" } else { "" },
            protocol.as_str()
        ))),
        (false, _) => Err(AgentError::InvalidArgument(format!(
            "volume {id} is a block volume: it is exported over nvmeof-tcp or iscsi, not {}",
            protocol.as_str()
        ))),
    }
}

impl Agent {
    fn check_initiators<'a>(
        &self,
        protocol: Protocol,
        initiators: impl IntoIterator<Item = &'a String>,
    ) -> Result<(), AgentError> {
        let exporter = self.exporter(protocol)?;
        for i in initiators {
            if i.len() > MAX_INITIATOR {
                return Err(AgentError::InvalidArgument(format!(
                    "initiator {:?} is {} bytes long, at most {MAX_INITIATOR} are allowed",
                    truncate(i),
                    i.len()
                )));
            }
            exporter.check_initiator(i)?;
        }
        Ok(())
    }

    async fn apply_export(
        &self,
        id: &VolumeId,
        protocol: Protocol,
        device: &Path,
        record: &ExportRecord,
    ) -> Result<ExportInfo, AgentError> {
        let exporter = self.exporter(protocol)?;
        let (vid, dev, rec) = (id.clone(), device.to_path_buf(), record.clone());
        let info = blocking(move || exporter.export(&vid, &dev, &rec)).await?;
        crate::crash::point("export-applied");
        Ok(info)
    }

    /// Applies `record`; when that fails, puts back `previous` (the recorded
    /// export) or removes what the failed apply left half-made, so a failed
    /// request leaves the kernel as its record says.
    async fn apply_or_undo(
        &self,
        id: &VolumeId,
        protocol: Protocol,
        device: &Path,
        record: &ExportRecord,
        previous: Option<&ExportRecord>,
    ) -> Result<ExportInfo, AgentError> {
        let failed = match self.apply_export(id, protocol, device, record).await {
            Ok(info) => return Ok(info),
            Err(e) => e,
        };
        let undone = match previous {
            Some(previous) => self
                .apply_export(id, protocol, device, previous)
                .await
                .map(|_| ()),
            None => {
                let (exporter, vid) = (self.exporter(protocol)?, id.clone());
                let target = record.target.clone();
                blocking(move || exporter.unexport(&vid, target.as_deref())).await
            }
        };
        if let Err(undo) = undone {
            // DeleteVolume and ReleaseVolume remove the agent's exports
            // whatever the mark says, so nothing stays behind for good.
            warn!(volume = %id, error = %undo, "could not undo a failed export");
        }
        Err(failed)
    }

    /// Removes every export of `id` that this agent's exporters could have
    /// made, recorded in `mark` or not: an export interrupted before its
    /// mark was written is removed too.
    pub(super) async fn unexport_all(
        &self,
        id: &VolumeId,
        mark: &FenceMark,
    ) -> Result<(), AgentError> {
        for (protocol, exporter) in &self.exporters {
            let recorded = mark
                .exports
                .get(protocol.as_str())
                .and_then(|r| r.target.clone());
            let (exporter, vid) = (exporter.clone(), id.clone());
            blocking(move || exporter.unexport(&vid, recorded.as_deref())).await?;
        }
        Ok(())
    }

    /// The names of every kernel object this agent's exporters may have
    /// made for `id`: not foreign users of its device.
    pub(super) fn own_exports(&self, id: &VolumeId) -> OwnExports {
        OwnExports {
            names: self
                .exporters
                .values()
                .flat_map(|e| e.own_names(id))
                .collect(),
        }
    }

    /// Applies every export `mark` records for the volume at `location`.
    pub(super) async fn export_all(
        &self,
        id: &VolumeId,
        location: &BackendRecord,
        mark: &FenceMark,
    ) -> Result<u32, AgentError> {
        if mark.exports.is_empty() {
            return Ok(0);
        }
        let device = self.device_path_of(id, location).await?;
        let mut applied = 0;
        for (name, record) in &mark.exports {
            let protocol = Protocol::parse(name).ok_or_else(|| {
                AgentError::Internal(format!("volume {id}: mark names unknown protocol {name:?}"))
            })?;
            self.apply_export(id, protocol, &device, record).await?;
            applied += 1;
        }
        Ok(applied)
    }

    /// ExportVolume.
    pub async fn export_volume(
        self: &Arc<Self>,
        id: &str,
        kind: Option<BackendKind>,
        protocol: Protocol,
        record: ExportRecord,
        token: Option<&Token>,
    ) -> Result<ExportInfo, AgentError> {
        let id = VolumeId::parse(id)?;
        self.backend(&id, kind)?.locate(&id)?;
        check_chap(protocol, &record)?;
        self.check_initiators(protocol, &record.allowed_initiators)?;
        let token = token.cloned();
        self.detached(move |agent| async move {
            agent.export_admitted(id, protocol, record, token).await
        })
        .await
    }

    async fn export_admitted(
        &self,
        id: VolumeId,
        protocol: Protocol,
        record: ExportRecord,
        token: Option<Token>,
    ) -> Result<ExportInfo, AgentError> {
        let started = Instant::now();
        let mut txn = self.begin(&id, token.as_ref(), Call::Other).await?;
        let location = recorded(&id, &txn.mark)?;
        check_transport(&id, &location, protocol)?;
        let device = self.device_path_of(&id, &location).await?;
        let previous = txn.mark.exports.get(protocol.as_str()).cloned();
        // An export keeps the name it was made under (a legacy one too); a
        // new one gets this agent's name for it.
        let mut record = record;
        record.target = match &previous {
            Some(p) => p.target.clone(),
            None => Some(self.exporter(protocol)?.new_target(&id)),
        };
        let apply_started = Instant::now();
        let info = self
            .apply_or_undo(&id, protocol, &device, &record, previous.as_ref())
            .await?;
        let apply_ms = apply_started.elapsed().as_millis();
        txn.mark
            .exports
            .insert(protocol.as_str().to_owned(), record);
        txn.commit().await?;
        info!(
            volume = %id,
            protocol = protocol.as_str(),
            target = %info.target_id,
            apply_ms,
            total_ms = started.elapsed().as_millis(),
            "volume exported"
        );
        Ok(info)
    }

    /// UnexportVolume.
    pub async fn unexport_volume(
        self: &Arc<Self>,
        id: &str,
        protocol: Protocol,
        token: Option<&Token>,
    ) -> Result<(), AgentError> {
        let id = VolumeId::parse(id)?;
        self.backend(&id, None)?;
        let exporter = self.exporter(protocol)?;
        let token = token.cloned();
        self.detached(move |agent| async move {
            let mut txn = agent.begin(&id, token.as_ref(), Call::Other).await?;
            let vid = id.clone();
            let recorded = txn
                .mark
                .exports
                .get(protocol.as_str())
                .and_then(|r| r.target.clone());
            blocking(move || exporter.unexport(&vid, recorded.as_deref())).await?;
            crate::crash::point("unexport-done");
            txn.mark.exports.remove(protocol.as_str());
            txn.commit().await
        })
        .await
    }

    /// AllowInitiator (`allow` true) or DenyInitiator (`allow` false).
    pub async fn set_initiator(
        self: &Arc<Self>,
        id: &str,
        protocol: Protocol,
        initiator: &str,
        allow: bool,
        token: Option<&Token>,
    ) -> Result<(), AgentError> {
        let id = VolumeId::parse(id)?;
        self.backend(&id, None)?;
        let initiator = initiator.to_owned();
        self.check_initiators(protocol, [&initiator])?;
        let token = token.cloned();
        self.detached(move |agent| async move {
            agent
                .set_initiator_admitted(id, protocol, initiator, allow, token)
                .await
        })
        .await
    }

    async fn set_initiator_admitted(
        &self,
        id: VolumeId,
        protocol: Protocol,
        initiator: String,
        allow: bool,
        token: Option<Token>,
    ) -> Result<(), AgentError> {
        let started = Instant::now();
        let mut txn = self.begin(&id, token.as_ref(), Call::Other).await?;
        let not_exported = || {
            AgentError::FailedPrecondition(format!(
                "volume {id} is not exported over {}",
                protocol.as_str()
            ))
        };
        // Denying an initiator of a volume not exported over `protocol`
        // asks for what already holds (nothing is admitted): success, so a
        // Publish whose export never landed can be undone. A volume the
        // agent holds records the token's generation, which an older
        // ExportVolume is then refused under; no mark is made for one it
        // does not hold.
        let Some(location) = txn.mark.backend.clone() else {
            return if allow { Err(not_exported()) } else { Ok(()) };
        };
        let Some(previous) = txn.mark.exports.get(protocol.as_str()).cloned() else {
            if allow {
                return Err(not_exported());
            }
            txn.commit().await?;
            info!(volume = %id, protocol = protocol.as_str(), initiator = %initiator,
                "initiator denied: the volume is not exported over the protocol");
            return Ok(());
        };
        let mut record = previous.clone();
        if allow {
            record.allowed_initiators.insert(initiator.clone());
        } else {
            record.allowed_initiators.remove(&initiator);
        }
        let device = self.device_path_of(&id, &location).await?;
        let apply_started = Instant::now();
        self.apply_or_undo(&id, protocol, &device, &record, Some(&previous))
            .await?;
        let apply_ms = apply_started.elapsed().as_millis();
        txn.mark
            .exports
            .insert(protocol.as_str().to_owned(), record);
        txn.commit().await?;
        info!(
            volume = %id,
            protocol = protocol.as_str(),
            initiator = %initiator,
            allow,
            apply_ms,
            total_ms = started.elapsed().as_millis(),
            "initiator access changed"
        );
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::marks::ChapRecord;

    fn record(acl: bool, username: &str, password: &str) -> ExportRecord {
        ExportRecord {
            acl,
            allowed_initiators: ["iqn.2003-01.org.example:a".to_owned()].into(),
            chap: Some(ChapRecord {
                username: username.into(),
                password: password.into(),
            }),
            target: None,
        }
    }

    #[test]
    fn transports_follow_the_volume_kind() {
        let id = VolumeId::parse("dirs/pvc-1").unwrap();
        let directory = BackendRecord::Directory {
            path: "/srv/xfs/volumes/pvc-1".into(),
            inode: None,
            project: None,
        };
        let dataset = BackendRecord::Dataset {
            dataset: "tank/share/pvc-1".into(),
            guid: None,
        };
        let zvol = BackendRecord::Zvol {
            dataset: "tank/k8s/pvc-1".into(),
            guid: None,
        };
        for (location, protocol) in [
            (&directory, Protocol::Nfs),
            (&directory, Protocol::Local),
            (&dataset, Protocol::Nfs),
            (&zvol, Protocol::NvmeofTcp),
            (&zvol, Protocol::Iscsi),
        ] {
            assert!(
                check_transport(&id, location, protocol).is_ok(),
                "{protocol:?}"
            );
        }
        for (location, protocol, needle) in [
            (
                &dataset,
                Protocol::Local,
                "only a directory is served node-local",
            ),
            (
                &directory,
                Protocol::Iscsi,
                "exported over nfs or local, not iscsi",
            ),
            (
                &dataset,
                Protocol::NvmeofTcp,
                "exported over nfs, not nvmeof-tcp",
            ),
            (
                &zvol,
                Protocol::Local,
                "block volume: it is exported over nvmeof-tcp or iscsi, not local",
            ),
            (&zvol, Protocol::Nfs, "not nfs"),
        ] {
            let e = check_transport(&id, location, protocol)
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle), "{protocol:?}: {e}");
        }
    }

    #[test]
    fn chap_is_refused_where_it_cannot_apply_and_named() {
        let good = record(true, "user", "secret123456");
        assert!(check_chap(Protocol::Iscsi, &good).is_ok());
        let no_chap = ExportRecord {
            chap: None,
            ..good.clone()
        };
        assert!(check_chap(Protocol::NvmeofTcp, &no_chap).is_ok());
        let cases = [
            (Protocol::NvmeofTcp, good.clone(), "not nvmeof-tcp"),
            (
                Protocol::Iscsi,
                record(false, "user", "secret123456"),
                "acl_enabled",
            ),
            (
                Protocol::Iscsi,
                record(true, "", "secret123456"),
                "chap.username",
            ),
            (
                Protocol::Iscsi,
                record(true, "user", "has space"),
                "chap.password",
            ),
            (
                Protocol::Iscsi,
                record(true, "user", &"x".repeat(256)),
                "256 bytes",
            ),
        ];
        for (protocol, r, needle) in cases {
            match check_chap(protocol, &r) {
                Err(AgentError::InvalidArgument(m)) => assert!(m.contains(needle), "{m}"),
                other => panic!("{needle}: {other:?}"),
            }
        }
        // The secret never shows in Debug output (logs).
        assert!(!format!("{good:?}").contains("secret123456"));
    }
}
