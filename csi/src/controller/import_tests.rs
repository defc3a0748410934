//! The import annotations against a store: each controller-side refusal's
//! exact text (the API-server tests show them on the claim).
#![allow(clippy::unwrap_used)]
use super::*;
use api::crd::{LvmBackend, PillarVolumeStateSpec, PillarVolumeStateStatus, Recovery, ZfsBackend};
use api::tokens::Protocol;

const VG_UUID: &str = "Xk3pQm-1aB2-c3D4-e5F6-g7H8-i9J0-Kl1mNo";
const LV_UUID: &str = "Rt7uVw-2cD3-e4F5-g6H7-i8J9-k0L1-Mn2oPq";

fn zfs(parent: Option<&str>) -> StoreBackend {
    StoreBackend {
        zfs: Some(ZfsBackend {
            pool: "hot-data".into(),
            parent_dataset: parent.map(Into::into),
        }),
        lvm: None,
        zfs_dataset: None,
        directory: None,
    }
}

fn lvm() -> StoreBackend {
    StoreBackend {
        zfs: None,
        lvm: Some(LvmBackend {
            volume_group: "data-vg".into(),
            thin_pool: None,
        }),
        zfs_dataset: None,
        directory: None,
    }
}

fn ask(pairs: &[(&str, &str)], backend: &StoreBackend) -> Result<Option<Import>> {
    let a = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    requested(&a, backend)
}

fn refusal(pairs: &[(&str, &str)], backend: &StoreBackend) -> String {
    ask(pairs, backend).unwrap_err().to_string()
}

const Z: &str = IMPORT_ZVOL_ANNOTATION;
const L: &str = IMPORT_LV_ANNOTATION;

#[test]
fn a_zvol_exactly_one_level_under_the_store_is_imported_under_its_own_name() {
    let i = ask(&[(Z, "hot-data/k8s/pvc-0d52")], &zfs(Some("k8s")))
        .unwrap()
        .unwrap();
    assert_eq!(i.agent_volume_id.to_string(), "hot-data/pvc-0d52");
    assert_eq!(i.imported_from().as_deref(), Some("hot-data/k8s/pvc-0d52"));
    assert_eq!(i.lvm_source(), None);
    let root = ask(&[(Z, "hot-data/pvc-0d52")], &zfs(None))
        .unwrap()
        .unwrap();
    assert_eq!(root.agent_volume_id.to_string(), "hot-data/pvc-0d52");
    let mut r = agent::CreateVolumeRequest::default();
    r.zfs_properties.insert("compression".into(), "lz4".into());
    i.apply(&mut r);
    assert_eq!(r.import_zvol, "hot-data/k8s/pvc-0d52");
    assert!(
        r.zfs_properties.is_empty(),
        "properties sent with an import"
    );
    assert_eq!(ask(&[], &zfs(None)).unwrap(), None);
}

fn datasets(parent: Option<&str>) -> StoreBackend {
    StoreBackend {
        zfs_dataset: zfs(parent).zfs,
        ..Default::default()
    }
}

const F: &str = IMPORT_ZFS_DATASET_ANNOTATION;

#[test]
fn a_filesystem_under_a_dataset_store_is_adopted_and_always_kept() {
    let i = ask(&[(F, "hot-data/share/media")], &datasets(Some("share")))
        .unwrap()
        .unwrap();
    assert_eq!(i.agent_volume_id.to_string(), "hot-data/media");
    assert_eq!(i.agent_volume_id.backend(), Backend::ZfsDataset);
    assert_eq!(i.what(), "filesystem \"hot-data/share/media\"");
    let mut r = agent::CreateVolumeRequest::default();
    i.apply(&mut r);
    assert_eq!(r.import_zfs_dataset, "hot-data/share/media");
    assert_eq!(r.import_zvol, "");
    assert_eq!(
        refusal(&[(F, "hot-data/share/media")], &zfs(Some("share"))),
        format!("{F} requires a zfsDataset PillarStore backend, got backend \"zfs-zvol\"")
    );
    assert_eq!(
        refusal(&[(F, "hot-data/other/media")], &datasets(Some("share"))),
        format!("{F} dataset \"hot-data/other/media\" is not under the PillarStore's parent dataset \"hot-data/share\"")
    );
    assert_eq!(
        refusal(
            &[(F, "hot-data/share/media"), (Z, "hot-data/share/x")],
            &datasets(Some("share"))
        ),
        format!("{F} and {Z} cannot be combined on one claim")
    );
    let secrets = [("key".to_owned(), "00".repeat(32))].into_iter().collect();
    let e = key_from_secrets(&secrets, &i).unwrap_err().to_string();
    assert!(e.contains("imports a filesystem, which has none"), "{e}");
}

const D: &str = IMPORT_DIRECTORY_ANNOTATION;

fn directories() -> StoreBackend {
    StoreBackend {
        directory: Some(api::crd::DirectoryBackend {
            name: "files".into(),
        }),
        ..Default::default()
    }
}

#[test]
fn a_directory_under_a_directory_store_is_adopted_by_its_name_and_always_kept() {
    let i = ask(&[(D, "/srv/files/media")], &directories())
        .unwrap()
        .unwrap();
    assert_eq!(i.agent_volume_id.to_string(), "files/media");
    assert_eq!(i.agent_volume_id.backend(), Backend::Directory);
    assert_eq!(i.what(), "directory \"/srv/files/media\"");
    assert_eq!(i.imported_from().as_deref(), Some("/srv/files/media"));
    let mut r = agent::CreateVolumeRequest::default();
    i.apply(&mut r);
    assert_eq!(
        (r.import_directory.as_str(), r.import_zfs_dataset.as_str()),
        ("/srv/files/media", "")
    );
    assert_eq!(
        refusal(&[(D, "/srv/files/media")], &datasets(Some("share"))),
        format!("{D} requires a directory PillarStore backend, got backend \"zfs-dataset\"")
    );
    assert_eq!(
        refusal(&[(D, "srv/files/media")], &directories()),
        format!("{D} must name a directory as an absolute path \"/<folder>/<name>\", got \"srv/files/media\"")
    );
    for other in [Z, L] {
        assert_eq!(
            refusal(&[(D, "/srv/files/media"), (other, "x")], &directories()),
            format!("{D} and {other} cannot be combined on one claim")
        );
    }
    assert_eq!(
        refusal(&[(D, "/srv/files/media"), (F, "x")], &directories()),
        format!("{F} and {D} cannot be combined on one claim")
    );
    let e = refusal(&[(D, "/srv/files/bad name")], &directories());
    assert!(
        e.starts_with(&format!("{D} directory \"/srv/files/bad name\": ")),
        "{e}"
    );
    let secrets = [("key".to_owned(), "00".repeat(32))].into_iter().collect();
    let e = key_from_secrets(&secrets, &i).unwrap_err().to_string();
    assert!(e.contains("imports a directory, which has none"), "{e}");
}

#[test]
fn zvol_refusals_name_the_store_s_layout() {
    let k8s = zfs(Some("k8s"));
    assert_eq!(
        refusal(&[(Z, "hot-data/k8s/x")], &lvm()),
        format!("{Z} requires a zfs.zvol PillarStore backend, got backend \"lvm-lv\"")
    );
    assert_eq!(
        refusal(&[(Z, "cold/k8s/x")], &k8s),
        format!("{Z} dataset \"cold/k8s/x\" lives in pool \"cold\" but the PillarStore selects pool \"hot-data\"")
    );
    for v in ["hot-data/k8s-other/x", "hot-data/k8s/a/b", "hot-data/x"] {
        assert_eq!(
            refusal(&[(Z, v)], &k8s),
            format!(
                "{Z} dataset {v:?} is not under the PillarStore's parent dataset \"hot-data/k8s\""
            )
        );
    }
    assert_eq!(
        refusal(&[(Z, "hot-data/k8s/x")], &zfs(None)),
        format!("{Z} dataset \"hot-data/k8s/x\" is not under the PillarStore's parent dataset \"hot-data\"")
    );
    // The value's own rules come first, with the api crate's messages.
    assert_eq!(
        refusal(&[(Z, "")], &k8s),
        format!("unsupported PVC annotation {Z:?}: value must name a ZFS dataset as \"<pool>[/<parent>]/<name>\", got empty")
    );
    assert_eq!(
        refusal(&[(Z, "hot-data//x")], &k8s),
        format!("{Z} dataset \"hot-data//x\": empty dataset component")
    );
}

#[test]
fn lv_imports_pin_names_uuids_and_policy() {
    let value = format!("data-vg/legacy:{VG_UUID}:{LV_UUID}");
    let i = ask(&[(L, &value)], &lvm()).unwrap().unwrap();
    assert_eq!(i.agent_volume_id.to_string(), "data-vg/legacy");
    let src = i.lvm_source().unwrap();
    assert!(src.preserve_original);
    assert_eq!(src.logical_volume_uuid, LV_UUID);
    let managed = ask(
        &[(L, &value), (IMPORT_LV_POLICY_ANNOTATION, "Managed")],
        &lvm(),
    )
    .unwrap()
    .unwrap();
    let mut r = agent::CreateVolumeRequest::default();
    managed.apply(&mut r);
    assert_eq!(r.import_lv_policy, "Managed");
    assert_eq!(r.import_lv.unwrap().volume_group_uuid, VG_UUID);

    assert_eq!(
        refusal(&[(L, &value)], &zfs(None)),
        format!("{L} requires an lvm PillarStore backend, got backend \"zfs-zvol\"")
    );
    let other = format!("other-vg/legacy:{VG_UUID}:{LV_UUID}");
    assert_eq!(
        refusal(&[(L, &other)], &lvm()),
        format!("{L} logical volume \"other-vg/legacy\" lives in volume group \"other-vg\" but the PillarStore selects volume group \"data-vg\"")
    );
    assert_eq!(
        refusal(&[(L, &value), (Z, "hot-data/x")], &lvm()),
        format!("{Z} and {L} cannot be combined on one claim")
    );
    assert_eq!(
        refusal(&[(IMPORT_LV_POLICY_ANNOTATION, "Managed")], &lvm()),
        format!("{IMPORT_LV_POLICY_ANNOTATION} is set without {L}")
    );
    assert!(refusal(
        &[(L, &value), (IMPORT_LV_POLICY_ANNOTATION, "managed")],
        &lvm()
    )
    .contains("case-sensitive"));
}

fn record(
    imported_from: Option<&str>,
    lvm_source: Option<LvmSource>,
    phase: Option<VolumePhase>,
) -> PillarVolumeState {
    let mut s = PillarVolumeState::new(
        "pvc-1",
        PillarVolumeStateSpec {
            volume_id: "storage-1/nvmeof-tcp/zfs-zvol/hot-data/x".into(),
            agent_volume_id: "hot-data/x".into(),
            agent_ref: "storage-1".into(),
            backend_type: Backend::ZfsZvol,
            protocol_type: Protocol::NvmeofTcp,
            capacity_bytes: 1,
            claim_ref: None,
            imported_from: imported_from.map(Into::into),
            lvm_source,
            resolved: None,
            export_spec: None,
            recovery: None,
        },
    );
    s.status = Some(PillarVolumeStateStatus {
        phase,
        ..Default::default()
    });
    s
}

#[test]
fn a_record_keeps_the_import_it_was_created_with() {
    let k8s = zfs(Some("k8s"));
    let x = ask(&[(Z, "hot-data/k8s/x")], &k8s).unwrap().unwrap();
    let y = ask(&[(Z, "hot-data/k8s/y")], &k8s).unwrap().unwrap();
    let plain = record(None, None, Some(VolumePhase::Ready));
    assert!(check_record("pvc-1", &plain, None).is_ok());
    assert_eq!(
        check_record("pvc-1", &plain, Some(&x)).unwrap_err().to_string(),
        format!("{Z}: volume \"pvc-1\" was already provisioned without an import; delete the PersistentVolumeClaim and re-create it to import a zvol")
    );
    let imported = record(Some("hot-data/k8s/x"), None, None);
    assert!(check_record("pvc-1", &imported, Some(&x)).is_ok());
    let changed = format!("{Z}: volume \"pvc-1\" already imported zvol \"hot-data/k8s/x\"; the import source cannot be changed");
    assert_eq!(
        check_record("pvc-1", &imported, Some(&y))
            .unwrap_err()
            .to_string(),
        changed
    );
    assert_eq!(
        check_record("pvc-1", &imported, None)
            .unwrap_err()
            .to_string(),
        changed
    );
}

#[test]
fn publish_and_expand_of_an_import_that_never_completed_are_refused() {
    let h = "storage-1/nvmeof-tcp/zfs-zvol/hot-data/x";
    let pending = record(Some("hot-data/k8s/x"), None, None);
    assert_eq!(
        never_adopted(h, &pending, "publish").unwrap().to_string(),
        format!(
            "cannot publish volume {h}: its import of zvol \"hot-data/k8s/x\" was never adopted"
        )
    );
    assert_eq!(completed(&pending), Some(false));
    let ready = record(Some("hot-data/k8s/x"), None, Some(VolumePhase::Ready));
    assert!(never_adopted(h, &ready, "expand").is_none());
    assert_eq!(completed(&ready), Some(true));
    let deleting = record(Some("hot-data/k8s/x"), None, Some(VolumePhase::Deleting));
    assert_eq!(completed(&deleting), Some(true));
    let plain = record(None, None, None);
    assert!(never_adopted(h, &plain, "expand").is_none());
    assert_eq!(completed(&plain), None);
}

#[test]
fn an_import_is_destroyed_only_after_its_claim_was_seen_bound() {
    let published = |mut state: PillarVolumeState, generation| {
        state
            .status
            .get_or_insert_with(Default::default)
            .publication_generation = Some(generation);
        state
    };
    let zvol = |phase| record(Some("hot-data/k8s/x"), None, phase);
    // Never completed, or completed but never published: released.
    assert!(released_on_delete(&zvol(None)));
    assert!(released_on_delete(&zvol(Some(VolumePhase::Ready))));
    assert!(!seen_bound(&zvol(Some(VolumePhase::Ready))));
    // Published (so bound): deleted, as reclaimPolicy Delete says.
    let bound = published(zvol(Some(VolumePhase::Ready)), 2);
    assert!(seen_bound(&bound));
    assert!(!released_on_delete(&bound));
    assert!(!released_on_delete(&published(
        zvol(Some(VolumePhase::Deleting)),
        2
    )));
    // Seen Bound by the reaper's pass: the mark names the record's claim.
    let mark = |uid: &str| {
        let mut state = zvol(Some(VolumePhase::Ready));
        state.spec.claim_ref = Some(api::crd::ClaimRef {
            uid: "claim-uid".into(),
            namespace: "db".into(),
            name: "data".into(),
        });
        state.metadata.annotations = Some([(BOUND_CLAIM.to_owned(), uid.to_owned())].into());
        state
    };
    assert!(seen_bound(&mark("claim-uid")));
    assert!(!released_on_delete(&mark("claim-uid")));
    assert!(!seen_bound(&mark("another-claim-uid")));
    assert!(released_on_delete(&mark("another-claim-uid")));
    // A PreserveOriginal LV is always released; a Managed one like a zvol.
    let source = |preserve_original| LvmSource {
        volume_group: "data-vg".into(),
        logical_volume: "legacy".into(),
        volume_group_uuid: VG_UUID.into(),
        logical_volume_uuid: LV_UUID.into(),
        preserve_original,
    };
    let preserved = published(
        record(None, Some(source(true)), Some(VolumePhase::Ready)),
        2,
    );
    assert!(released_on_delete(&preserved));
    let managed = published(
        record(None, Some(source(false)), Some(VolumePhase::Ready)),
        2,
    );
    assert!(!released_on_delete(&managed));
    // A created volume is deleted, published or not.
    assert!(!released_on_delete(&record(
        None,
        None,
        Some(VolumePhase::Ready)
    )));
    // A recovered LV carries its policy in spec.recovery.source, not lvmSource.
    let mut recovered = record(None, None, Some(VolumePhase::Ready));
    recovered.spec.recovery = Some(Recovery {
        old_volume_uid: "old".into(),
        old_generation: 4,
        new_generation: 5,
        source: source(true),
        new_volume_uid: None,
        authorization: None,
        authorization_digest: None,
    });
    assert!(preserves_original(&recovered));
    assert!(released_on_delete(&recovered));
    if let Some(r) = recovered.spec.recovery.as_mut() {
        r.source.preserve_original = false;
    }
    assert!(!released_on_delete(&recovered));
}

#[test]
fn the_key_of_an_encrypted_zvol_comes_from_the_secret_field_key_and_no_value_is_ever_shown() {
    let zvol = ask(&[(Z, "hot-data/k8s/pvc-0d52")], &zfs(Some("k8s")))
        .unwrap()
        .unwrap();
    let secrets = |pairs: &[(&str, &str)]| -> std::collections::HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    assert_eq!(key_from_secrets(&secrets(&[]), &zvol).unwrap(), b"");
    let digits = "0f".repeat(32);
    assert_eq!(
        key_from_secrets(&secrets(&[("key", &digits)]), &zvol).unwrap(),
        digits.as_bytes()
    );
    let wrong = key_from_secrets(&secrets(&[("passphrase", "hunter2"), ("user", "x")]), &zvol)
        .unwrap_err()
        .to_string();
    assert_eq!(
        wrong,
        "the provisioner secret has no field \"key\" (it has passphrase, user); put the zvol's key there as 64 hexadecimal digits"
    );
    assert!(!wrong.contains("hunter2"));
    let lv = ask(
        &[(L, &format!("data-vg/legacy:{VG_UUID}:{LV_UUID}"))],
        &lvm(),
    )
    .unwrap()
    .unwrap();
    let refused = key_from_secrets(&secrets(&[("key", &digits)]), &lv)
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("imports a logical volume, which has none"),
        "{refused}"
    );
    assert!(!refused.contains(&digits));
}
