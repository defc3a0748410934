use super::*;

#[test]
fn every_crd_is_cluster_scoped_kept_and_named_by_plural_and_group() {
    let all = crds();
    let names: Vec<String> = all.iter().map(file_name).collect();
    assert_eq!(
        names,
        [
            "pillaragents.pillar-csi.bhyoo.com.yaml",
            "pillarstores.pillar-csi.bhyoo.com.yaml",
            "pillarprotocols.pillar-csi.bhyoo.com.yaml",
            "pillarstorageclasses.pillar-csi.bhyoo.com.yaml",
            "pillarvolumestates.pillar-csi.bhyoo.com.yaml",
            "pillarvolumereservations.pillar-csi.bhyoo.com.yaml",
            "pillarsnapshots.pillar-csi.bhyoo.com.yaml",
        ]
    );
    for crd in &all {
        assert_eq!(crd.spec.scope, "Cluster");
        assert_eq!(crd.spec.group, GROUP);
        assert_eq!(crd.spec.versions.len(), 1);
        assert_eq!(crd.spec.versions[0].name, VERSION);
        let keep = crd.metadata.annotations.as_ref().unwrap();
        assert_eq!(keep.get(HELM_KEEP.0).map(String::as_str), Some("keep"));
    }
}

#[test]
fn the_volume_state_has_its_short_name_and_status_subresource() {
    let crd = PillarVolumeState::crd();
    assert_eq!(
        crd.spec.names.short_names.as_deref(),
        Some(&["pvst".to_owned()][..])
    );
    let v = &crd.spec.versions[0];
    assert!(v.subresources.as_ref().unwrap().status.is_some());
    let cols: Vec<&str> = v
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| c.json_path.as_str())
        .collect();
    assert!(cols.contains(&".status.phase"), "{cols:?}");
}

#[test]
fn the_snapshot_record_has_its_short_name_status_and_id_fields() {
    let crd = PillarSnapshot::crd();
    assert_eq!(
        crd.spec.names.short_names.as_deref(),
        Some(&["psnap".to_owned()][..])
    );
    assert!(crd.spec.versions[0]
        .subresources
        .as_ref()
        .unwrap()
        .status
        .is_some());
    let record = PillarSnapshot::new(
        "snapcontent-1",
        PillarSnapshotSpec {
            source_volume_id: "storage-1/nvmeof-tcp/zfs-zvol/tank/pvc-1".into(),
            source_agent_volume_id: "tank/pvc-1".into(),
            agent_ref: "storage-1".into(),
            backend_type: crate::tokens::Backend::ZfsZvol,
        },
    );
    let json = serde_json::to_value(&record).unwrap();
    assert_eq!(
        json["spec"]["sourceVolumeID"],
        "storage-1/nvmeof-tcp/zfs-zvol/tank/pvc-1"
    );
    assert_eq!(json["spec"]["sourceAgentVolumeID"], "tank/pvc-1");
    assert_eq!(json["spec"]["backendType"], "zfs-zvol");
    let status = serde_json::to_value(PillarSnapshotStatus {
        snapshot_id: Some("x".into()),
        ready_to_use: Some(true),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(
        status,
        serde_json::json!({"snapshotID": "x", "readyToUse": true})
    );
}

#[test]
fn spec_field_names_are_those_the_spec_reads_with_jq() {
    let state = PillarVolumeState::new(
        "pvc-1",
        PillarVolumeStateSpec {
            volume_id: "storage-1/nvmeof-tcp/lvm-lv/data-vg/legacy".into(),
            agent_volume_id: "data-vg/legacy".into(),
            agent_ref: "storage-1".into(),
            backend_type: crate::tokens::Backend::LvmLv,
            protocol_type: crate::tokens::Protocol::NvmeofTcp,
            capacity_bytes: 1 << 30,
            claim_ref: Some(ClaimRef {
                uid: "u".into(),
                namespace: "db".into(),
                name: "data-legacy".into(),
            }),
            imported_from: None,
            lvm_source: Some(LvmSource {
                volume_group: "data-vg".into(),
                logical_volume: "legacy".into(),
                volume_group_uuid: "a".into(),
                logical_volume_uuid: "b".into(),
                preserve_original: true,
            }),
            resolved: None,
            export_spec: None,
            recovery: None,
        },
    );
    let json = serde_json::to_value(&state).unwrap();
    let spec = &json["spec"];
    assert_eq!(
        spec["volumeID"],
        "storage-1/nvmeof-tcp/lvm-lv/data-vg/legacy"
    );
    assert_eq!(spec["agentVolumeID"], "data-vg/legacy");
    assert_eq!(spec["agentRef"], "storage-1");
    assert_eq!(spec["backendType"], "lvm-lv");
    assert_eq!(spec["protocolType"], "nvmeof-tcp");
    assert_eq!(spec["claimRef"]["namespace"], "db");
    assert_eq!(spec["lvmSource"]["logicalVolumeUUID"], "b");
    assert_eq!(spec["lvmSource"]["volumeGroupUUID"], "a");
    assert_eq!(spec["lvmSource"]["preserveOriginal"], true);
    assert_eq!(json["apiVersion"], "pillar-csi.bhyoo.com/v1alpha1");
}

#[test]
fn the_spec_examples_of_upgrade_md_parse() {
    let store: PillarStore = serde_yaml::from_str(
        "apiVersion: pillar-csi.bhyoo.com/v1alpha1\nkind: PillarStore\nmetadata: {name: storage-1-hot}\nspec:\n  agentRef: storage-1\n  backend:\n    zfs:\n      pool: tank\n      parentDataset: k8s\n",
    )
    .unwrap();
    let zfs = store.spec.backend.zfs.unwrap();
    assert_eq!(
        (zfs.pool.as_str(), zfs.parent_dataset.as_deref()),
        ("tank", Some("k8s"))
    );
    let proto: PillarProtocol = serde_yaml::from_str(
        "apiVersion: pillar-csi.bhyoo.com/v1alpha1\nkind: PillarProtocol\nmetadata: {name: nvmeof-default}\nspec:\n  protocol:\n    nvmeofTcp:\n      port: 4420\n      acl: true\n",
    )
    .unwrap();
    assert_eq!(proto.spec.protocol.nvmeof_tcp.unwrap().port, 4420);
    let class: PillarStorageClass = serde_yaml::from_str(
        "apiVersion: pillar-csi.bhyoo.com/v1alpha1\nkind: PillarStorageClass\nmetadata: {name: hot}\nspec:\n  storeRef: storage-1-hot\n  protocolRef: nvmeof-default\n  storageClass:\n    name: pillar-hot\n  filesystem:\n    fsType: xfs\n",
    )
    .unwrap();
    assert_eq!(class.spec.storage_class.name, "pillar-hot");
    assert_eq!(class.spec.filesystem.unwrap().fs_type, FsType::Xfs);
}

#[test]
fn schemas_use_no_cel_rules() {
    for crd in crds() {
        let yaml = to_yaml(&crd).unwrap();
        assert!(
            !yaml.contains("x-kubernetes-validations"),
            "{}",
            file_name(&crd)
        );
        assert!(yaml.starts_with("# Generated from the Rust types"));
    }
}

/// The README's objects in the block after `<!-- file: <name> -->`, as an
/// operator applies them.
fn readme_objects(name: &str) -> Vec<serde_yaml::Value> {
    let readme = include_str!("../../../README.md");
    let block = readme
        .split(&format!("<!-- file: {name} -->\n```yaml\n"))
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .unwrap_or_else(|| panic!("README.md has the {name} block"));
    block
        .split("\n---\n")
        .map(|doc| serde_yaml::from_str(doc).unwrap())
        .collect()
}

#[test]
fn the_readme_examples_of_filesystem_adoption_parse() {
    let docs = readme_objects("files-objects.yaml");
    assert_eq!(docs.len(), 3);
    let store: PillarStore = serde_yaml::from_value(docs[0].clone()).unwrap();
    let fs = store.spec.backend.zfs_dataset.unwrap();
    assert_eq!(
        (fs.pool.as_str(), fs.parent_dataset.as_deref()),
        ("tank", Some("share"))
    );
    assert!(store.spec.backend.zfs.is_none() && store.spec.backend.lvm.is_none());
    let proto: PillarProtocol = serde_yaml::from_value(docs[1].clone()).unwrap();
    assert_eq!(proto.spec.protocol.nfs, Some(NfsProtocol {}));
    let class: PillarStorageClass = serde_yaml::from_value(docs[2].clone()).unwrap();
    assert_eq!(
        (
            class.spec.store_ref.as_str(),
            class.spec.protocol_ref.as_str()
        ),
        ("storage-1-share", "nfs")
    );
    assert_eq!(
        class.spec.storage_class.reclaim_policy,
        Some(ReclaimPolicy::Retain)
    );
}

#[test]
fn the_readme_example_of_node_local_volumes_parses() {
    let docs = readme_objects("local-objects.yaml");
    assert_eq!(docs.len(), 4);
    let agent: PillarAgent = serde_yaml::from_value(docs[0].clone()).unwrap();
    assert_eq!(agent.spec.node_name.as_deref(), Some("worker-3"));
    let store: PillarStore = serde_yaml::from_value(docs[1].clone()).unwrap();
    assert_eq!(store.spec.backend.directory.unwrap().name, "dirs");
    let proto: PillarProtocol = serde_yaml::from_value(docs[2].clone()).unwrap();
    assert_eq!(proto.spec.protocol.local, Some(LocalProtocol {}));
    assert!(proto.spec.protocol.nfs.is_none());
    let class: PillarStorageClass = serde_yaml::from_value(docs[3].clone()).unwrap();
    assert_eq!(
        (
            class.spec.store_ref.as_str(),
            class.spec.protocol_ref.as_str()
        ),
        ("worker-3-dirs", "local")
    );
    assert_eq!(
        class.spec.storage_class.volume_binding_mode,
        Some(VolumeBindingMode::WaitForFirstConsumer)
    );
}
