//! Wire values to the agent's types and back: enums, tokens, sources.
use crate::{
    backend::{BackendKind, ImportKey, ImportSource},
    error::AgentError,
    export::Protocol,
    fence::Token,
    marks::{ChapRecord, ExportRecord},
    volume::truncate,
};
use pillar_csi_proto::agent::v1 as pb;

pub(crate) fn backend_kind(value: i32) -> Result<Option<BackendKind>, AgentError> {
    match pb::BackendType::try_from(value) {
        Ok(pb::BackendType::Unspecified) => Ok(None),
        Ok(pb::BackendType::ZfsZvol) => Ok(Some(BackendKind::Zvol)),
        Ok(pb::BackendType::Lvm) => Ok(Some(BackendKind::Lvm)),
        Ok(pb::BackendType::ZfsDataset) => Ok(Some(BackendKind::Dataset)),
        Ok(pb::BackendType::Directory) => Ok(Some(BackendKind::Directory)),
        Err(_) => Err(AgentError::InvalidArgument(format!(
            "backend_type {value} is not a known BackendType"
        ))),
    }
}

pub(crate) fn backend_type(kind: BackendKind) -> pb::BackendType {
    match kind {
        BackendKind::Zvol => pb::BackendType::ZfsZvol,
        BackendKind::Lvm => pb::BackendType::Lvm,
        BackendKind::Dataset => pb::BackendType::ZfsDataset,
        BackendKind::Directory => pb::BackendType::Directory,
    }
}

pub(crate) fn protocol(value: i32) -> Result<Protocol, AgentError> {
    match pb::ProtocolType::try_from(value) {
        Ok(pb::ProtocolType::NvmeofTcp) => Ok(Protocol::NvmeofTcp),
        Ok(pb::ProtocolType::Iscsi) => Ok(Protocol::Iscsi),
        Ok(pb::ProtocolType::Nfs) => Ok(Protocol::Nfs),
        Ok(pb::ProtocolType::Local) => Ok(Protocol::Local),
        Ok(pb::ProtocolType::Unspecified) => Err(AgentError::InvalidArgument(
            "protocol_type is required (PROTOCOL_TYPE_NVMEOF_TCP, PROTOCOL_TYPE_ISCSI, PROTOCOL_TYPE_NFS or PROTOCOL_TYPE_LOCAL)".into(),
        )),
        Err(_) => Err(AgentError::InvalidArgument(format!(
            "protocol_type {value} is not a known ProtocolType"
        ))),
    }
}

pub(crate) fn protocol_type(p: Protocol) -> pb::ProtocolType {
    match p {
        Protocol::NvmeofTcp => pb::ProtocolType::NvmeofTcp,
        Protocol::Iscsi => pb::ProtocolType::Iscsi,
        Protocol::Nfs => pb::ProtocolType::Nfs,
        Protocol::Local => pb::ProtocolType::Local,
    }
}

pub(crate) fn token(fence: Option<pb::FenceToken>) -> Option<Token> {
    fence.map(|f| Token {
        volume_uid: f.volume_uid,
        generation: f.generation,
    })
}

pub(crate) fn export_record(
    acl: bool,
    initiators: Vec<String>,
    chap: Option<pb::IscsiChap>,
) -> ExportRecord {
    ExportRecord {
        acl,
        allowed_initiators: initiators.into_iter().collect(),
        chap: chap.map(|c| ChapRecord {
            username: c.username,
            password: c.password,
        }),
        target: None,
    }
}

/// The import source of a CreateVolumeRequest, if it names one.
pub(crate) fn import_source(
    r: &pb::CreateVolumeRequest,
) -> Result<Option<ImportSource>, AgentError> {
    if !r.import_zvol_key.is_empty() && r.import_zvol.is_empty() {
        return Err(AgentError::InvalidArgument(format!(
            "volume {}: import_zvol_key is the key of an imported zvol; it needs import_zvol",
            truncate(&r.volume_id)
        )));
    }
    let filesystem = [
        (!r.import_zfs_dataset.is_empty()).then(|| ImportSource::Dataset {
            dataset: r.import_zfs_dataset.clone(),
        }),
        (!r.import_directory.is_empty()).then(|| ImportSource::Directory {
            path: r.import_directory.clone(),
        }),
    ];
    let named = filesystem.iter().flatten().count()
        + usize::from(!r.import_zvol.is_empty())
        + usize::from(r.import_lv.is_some());
    if let Some(source) = filesystem.into_iter().flatten().next() {
        if named > 1 {
            return Err(AgentError::InvalidArgument(format!(
                "volume {}: set at most one of import_zvol, import_lv, import_zfs_dataset and import_directory",
                truncate(&r.volume_id)
            )));
        }
        return Ok(Some(source));
    }
    match (&r.import_zvol, &r.import_lv) {
        (z, Some(_)) if !z.is_empty() => Err(AgentError::InvalidArgument(format!(
            "volume {}: set at most one of import_zvol and import_lv",
            truncate(&r.volume_id)
        ))),
        (z, None) if !z.is_empty() => Ok(Some(ImportSource::Zvol {
            dataset: z.clone(),
            key: (!r.import_zvol_key.is_empty()).then(|| ImportKey::new(r.import_zvol_key.clone())),
        })),
        (_, Some(lv)) => {
            let value = format!(
                "{}/{}:{}:{}",
                lv.volume_group, lv.logical_volume, lv.volume_group_uuid, lv.logical_volume_uuid
            );
            let identity = api::annotations::parse_import_lv(&value).map_err(|e| {
                AgentError::InvalidArgument(format!(
                    "volume {}: import_lv: {e}",
                    truncate(&r.volume_id)
                ))
            })?;
            let policy = match r.import_lv_policy.as_str() {
                "" => api::annotations::LvPolicy::PreserveOriginal,
                other => api::annotations::parse_import_lv_policy(Some(other)).map_err(|e| {
                    AgentError::InvalidArgument(format!(
                        "volume {}: import_lv_policy: {e}",
                        truncate(&r.volume_id)
                    ))
                })?,
            };
            Ok(Some(ImportSource::Lv { identity, policy }))
        }
        _ => Ok(None),
    }
}

pub(crate) fn lvm_identity(vg: &str, lv: &str, vg_uuid: &str, lv_uuid: &str) -> pb::LvmIdentity {
    pb::LvmIdentity {
        volume_group: vg.to_owned(),
        logical_volume: lv.to_owned(),
        volume_group_uuid: vg_uuid.to_owned(),
        logical_volume_uuid: lv_uuid.to_owned(),
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    const VG_UUID: &str = "Xk3pQm-1aB2-c3D4-e5F6-g7H8-i9J0-Kl1mNo";
    const LV_UUID: &str = "Rt7uVw-2cD3-e4F5-g6H7-i8J9-k0L1-Mn2oPq";

    fn request(zvol: &str, lv: Option<(&str, &str)>, policy: &str) -> pb::CreateVolumeRequest {
        pb::CreateVolumeRequest {
            volume_id: "data-vg/legacy".into(),
            import_zvol: zvol.into(),
            import_lv: lv.map(|(vg, lv)| lvm_identity(vg, lv, VG_UUID, LV_UUID)),
            import_lv_policy: policy.into(),
            ..Default::default()
        }
    }

    #[test]
    fn import_fields_become_one_checked_source() -> Result<(), AgentError> {
        assert_eq!(import_source(&request("", None, ""))?, None);
        assert_eq!(
            import_source(&request("tank/k8s/v", None, ""))?,
            Some(ImportSource::Zvol {
                dataset: "tank/k8s/v".into(),
                key: None,
            })
        );
        let keyed = pb::CreateVolumeRequest {
            import_zvol_key: vec![7; 32],
            ..request("tank/k8s/v", None, "")
        };
        assert_eq!(
            import_source(&keyed)?,
            Some(ImportSource::Zvol {
                dataset: "tank/k8s/v".into(),
                key: Some(ImportKey::new(vec![7; 32])),
            })
        );
        assert!(
            !format!("{:?}", import_source(&keyed)?).contains("7, 7"),
            "the key is never printed"
        );
        let Some(ImportSource::Lv { identity, policy }) =
            import_source(&request("", Some(("data-vg", "legacy")), ""))?
        else {
            panic!("an LV source");
        };
        assert_eq!(identity.lv_uuid.as_str(), LV_UUID);
        assert_eq!(policy, api::annotations::LvPolicy::PreserveOriginal);
        assert!(matches!(
            import_source(&request("", Some(("data-vg", "legacy")), "Managed"))?,
            Some(ImportSource::Lv {
                policy: api::annotations::LvPolicy::Managed,
                ..
            })
        ));
        let directory = pb::CreateVolumeRequest {
            import_directory: "/srv/files/legacy".into(),
            ..request("", None, "")
        };
        assert_eq!(
            import_source(&directory)?,
            Some(ImportSource::Directory {
                path: "/srv/files/legacy".into()
            })
        );
        for bad in [
            pb::CreateVolumeRequest {
                import_zfs_dataset: "tank/k8s/v".into(),
                ..directory.clone()
            },
            pb::CreateVolumeRequest {
                import_zvol: "tank/k8s/v".into(),
                ..directory.clone()
            },
            request("tank/k8s/v", Some(("data-vg", "legacy")), ""),
            request("", Some(("data-vg", "legacy")), "managed"),
            request("", Some(("data-vg", "a/b")), ""),
            request("", Some(("data vg", "legacy")), ""),
            pb::CreateVolumeRequest {
                import_zvol_key: vec![7; 32],
                ..request("", Some(("data-vg", "legacy")), "")
            },
        ] {
            assert!(
                matches!(import_source(&bad), Err(AgentError::InvalidArgument(_))),
                "{bad:?}"
            );
        }
        Ok(())
    }
}
