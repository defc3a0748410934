//! The generated CRDs (the chart's files) against a real kube-apiserver
//! 1.20: installed, every kind created and read back, the PillarVolumeState
//! status subresource, schema refusals, and the printer columns kubectl
//! shows.
use api::crd::*;
use api::tokens::{Backend, Protocol};
use kube::api::{Api, Patch, PatchParams, PostParams};
use pillar_csi_lab::apiserver::ApiServer;

type Result<T = ()> = pillar_csi_lab::Result<T>;

/// Installs the chart's CRDs, checking there are seven.
async fn install_crds(server: &ApiServer) -> Result {
    let names = server.install_chart_crds().await?;
    assert_eq!(names.len(), 7, "{names:?}");
    Ok(())
}

fn volume_state(name: &str) -> PillarVolumeState {
    PillarVolumeState::new(
        name,
        PillarVolumeStateSpec {
            volume_id: "storage-1/nvmeof-tcp/lvm-lv/data-vg/legacy".into(),
            agent_volume_id: "data-vg/legacy".into(),
            agent_ref: "storage-1".into(),
            backend_type: Backend::LvmLv,
            protocol_type: Protocol::NvmeofTcp,
            capacity_bytes: 20 << 30,
            claim_ref: Some(ClaimRef {
                uid: "0d5201a5-3c1e-4c55-a2a7-3f7d3c4e9b10".into(),
                namespace: "db".into(),
                name: "data-legacy".into(),
            }),
            imported_from: None,
            lvm_source: Some(LvmSource {
                volume_group: "data-vg".into(),
                logical_volume: "legacy".into(),
                volume_group_uuid: "Xk3pQm-1aB2-c3D4-e5F6-g7H8-i9J0-Kl1mNo".into(),
                logical_volume_uuid: "Rt7uVw-2cD3-e4F5-g6H7-i8J9-k0L1-Mn2oPq".into(),
                preserve_original: true,
            }),
            resolved: None,
            export_spec: Some(ExportSpec {
                acl_enabled: true,
                allowed_initiators: vec![],
            }),
            recovery: None,
        },
    )
}

#[tokio::test]
async fn the_chart_crds_serve_every_kind_on_a_real_api_server() -> Result {
    let server = ApiServer::start()?;
    let client = server.client().await?;
    install_crds(&server).await?;
    let pp = PostParams::default();

    let agents: Api<PillarAgent> = Api::all(client.clone());
    let agent = PillarAgent::new(
        "storage-1",
        PillarAgentSpec {
            address: "192.0.2.10".into(),
            port: 9500,
            tls_server_name: Some("pillar-csi-agent.pillar-csi.svc".into()),
            node_name: None,
        },
    );
    assert_eq!(agents.create(&pp, &agent).await?.spec, agent.spec);

    let stores: Api<PillarStore> = Api::all(client.clone());
    for (name, backend) in [
        (
            "storage-1-hot",
            StoreBackend {
                zfs: Some(ZfsBackend {
                    pool: "tank".into(),
                    parent_dataset: Some("k8s".into()),
                }),
                lvm: None,
                zfs_dataset: None,
                directory: None,
            },
        ),
        (
            "storage-1-lvm",
            StoreBackend {
                zfs: None,
                lvm: Some(LvmBackend {
                    volume_group: "data-vg".into(),
                    thin_pool: Some("thin0".into()),
                }),
                zfs_dataset: None,
                directory: None,
            },
        ),
    ] {
        let store = PillarStore::new(
            name,
            PillarStoreSpec {
                agent_ref: "storage-1".into(),
                backend,
            },
        );
        assert_eq!(stores.create(&pp, &store).await?.spec, store.spec);
    }

    // A PillarProtocol written as the spec's YAML, with the port defaulted
    // by the schema when left out.
    let protocols: Api<PillarProtocol> = Api::all(client.clone());
    let nvme: PillarProtocol = serde_yaml::from_str(
        "apiVersion: pillar-csi.bhyoo.com/v1alpha1\nkind: PillarProtocol\nmetadata: {name: nvmeof-default}\nspec:\n  protocol:\n    nvmeofTcp: {acl: true}\n",
    )?;
    let created = protocols.create(&pp, &nvme).await?;
    assert_eq!(created.spec.protocol.nvmeof_tcp.map(|p| p.port), Some(4420));

    let classes: Api<PillarStorageClass> = Api::all(client.clone());
    let class = PillarStorageClass::new(
        "hot",
        PillarStorageClassSpec {
            store_ref: "storage-1-hot".into(),
            protocol_ref: "nvmeof-default".into(),
            storage_class: StorageClassTemplate {
                name: "pillar-hot".into(),
                reclaim_policy: Some(ReclaimPolicy::Retain),
                volume_binding_mode: None,
                allow_volume_expansion: None,
            },
            filesystem: Some(Filesystem {
                fs_type: FsType::Xfs,
            }),
            allowed_claim_zfs_properties: vec!["compression".into()],
            encrypted: false,
            import_keys: false,
        },
    );
    assert_eq!(classes.create(&pp, &class).await?.spec, class.spec);

    // The PillarVolumeState: spec as written; status only through its
    // subresource.
    let states: Api<PillarVolumeState> = Api::all(client.clone());
    let mut state = volume_state("pvc-0d5201a5");
    state.status = Some(PillarVolumeStateStatus {
        publication_generation: Some(9),
        ..Default::default()
    });
    let created = states.create(&pp, &state).await?;
    assert_eq!(created.spec, state.spec);
    assert_eq!(
        created.status.and_then(|s| s.publication_generation),
        None,
        "a create must not write the status of a resource with a status subresource"
    );
    let status = serde_json::json!({"status": {
        "publicationGeneration": 3,
        "publishedNodes": [{"nodeID": "worker-1/nqn.2014-08.org.nvmexpress:uuid:1/iqn.1993-08.org.debian:01:1", "generation": 3}],
        "phase": "Ready",
    }});
    let patched = states
        .patch_status(
            "pvc-0d5201a5",
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await?;
    let s = patched
        .status
        .clone()
        .ok_or("no status after patch_status")?;
    assert_eq!(s.publication_generation, Some(3));
    assert_eq!(s.phase, Some(VolumePhase::Ready));
    assert_eq!(s.published_nodes.len(), 1);
    // A status written through the main resource is ignored.
    let ignored = serde_json::json!({"status": {"publicationGeneration": 99}});
    let after = states
        .patch(
            "pvc-0d5201a5",
            &PatchParams::default(),
            &Patch::Merge(&ignored),
        )
        .await?;
    assert_eq!(after.status.and_then(|s| s.publication_generation), Some(3));

    let reservations: Api<PillarVolumeReservation> = Api::all(client.clone());
    let reservation = PillarVolumeReservation::new(
        "storage-1.data-vg.legacy",
        PillarVolumeReservationSpec {
            claim_ref: ClaimRef {
                uid: "0d5201a5-3c1e-4c55-a2a7-3f7d3c4e9b10".into(),
                namespace: "db".into(),
                name: "data-legacy".into(),
            },
            owner_volume: "pvc-0d5201a5".into(),
            agent_ref: "storage-1".into(),
            agent_volume_id: "data-vg/legacy".into(),
        },
    );
    assert_eq!(
        reservations.create(&pp, &reservation).await?.spec,
        reservation.spec
    );

    // A snapshot record, its status through the subresource.
    let snapshots: Api<PillarSnapshot> = Api::all(client.clone());
    let record = PillarSnapshot::new(
        "snapcontent-1",
        PillarSnapshotSpec {
            source_volume_id: "storage-1/nvmeof-tcp/zfs-zvol/tank/pvc-1".into(),
            source_agent_volume_id: "tank/pvc-1".into(),
            agent_ref: "storage-1".into(),
            backend_type: Backend::ZfsZvol,
        },
    );
    assert_eq!(snapshots.create(&pp, &record).await?.spec, record.spec);
    let status = serde_json::json!({"status": {"readyToUse": true, "sizeBytes": 1u64 << 30}});
    let ready = snapshots
        .patch_status(
            "snapcontent-1",
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await?;
    assert_eq!(ready.status.and_then(|s| s.size_bytes), Some(1 << 30));
    let columns = server.kubectl(&["get", "psnap"])?;
    assert!(
        columns
            .lines()
            .next()
            .unwrap_or("")
            .split_whitespace()
            .eq(["NAME", "AGENT", "SOURCE", "READY", "SIZE", "AGE"]),
        "{columns}"
    );

    // What the spec's commands read, through kubectl.
    let wide = server.kubectl(&["get", "pvst", "-o", "wide"])?;
    let header: Vec<&str> = wide
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        [
            "NAME",
            "AGENT",
            "AGENTVOLUME",
            "BACKEND",
            "PROTOCOL",
            "CAPACITY",
            "PHASE",
            "GENERATION",
            "IMPORTED",
            "AGE"
        ],
        "{wide}"
    );
    let row: Vec<&str> = wide
        .lines()
        .nth(1)
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(
        &row[..8],
        [
            "pvc-0d5201a5",
            "storage-1",
            "data-vg/legacy",
            "lvm-lv",
            "nvmeof-tcp",
            "21474836480",
            "Ready",
            "3"
        ],
        "{wide}"
    );
    let custom = server.kubectl(&[
        "get",
        "pillarvolumestate",
        "-o",
        "custom-columns=NAME:.metadata.name,SOURCE:.spec.lvmSource.logicalVolumeUUID,PRESERVE:.spec.lvmSource.preserveOriginal",
        "--no-headers",
    ])?;
    assert_eq!(
        custom.split_whitespace().collect::<Vec<_>>(),
        [
            "pvc-0d5201a5",
            "Rt7uVw-2cD3-e4F5-g6H7-i8J9-k0L1-Mn2oPq",
            "true"
        ]
    );
    let all = server.kubectl(&[
        "get",
        "pillaragent,pillarstore,pillarprotocol,pillarstorageclass",
    ])?;
    for name in [
        "pillaragent.pillar-csi.bhyoo.com/storage-1",
        "pillarstore.pillar-csi.bhyoo.com/storage-1-hot",
        "pillarprotocol.pillar-csi.bhyoo.com/nvmeof-default",
        "pillarstorageclass.pillar-csi.bhyoo.com/hot",
    ] {
        assert!(all.contains(name), "{name} missing from:\n{all}");
    }
    assert_eq!(all.matches("READY").count(), 4, "{all}");
    let reserved = server.kubectl(&["get", "pillarvolumereservation", "--no-headers"])?;
    assert!(
        reserved.contains("db")
            && reserved.contains("data-legacy")
            && reserved.contains("pvc-0d5201a5"),
        "{reserved}"
    );
    Ok(())
}

#[tokio::test]
async fn the_schemas_refuse_bad_values_and_change_nothing() -> Result {
    let server = ApiServer::start()?;
    install_crds(&server).await?;
    let raw = |body: &str| -> Result<String> {
        let path = server.dir().join("bad.yaml");
        std::fs::write(&path, body)?;
        let path = path.to_string_lossy().into_owned();
        match server.kubectl(&["create", "--validate=false", "-f", &path]) {
            Ok(out) => Err(format!("accepted: {out}").into()),
            Err(e) => Ok(e.to_string()),
        }
    };
    let e = raw("apiVersion: pillar-csi.bhyoo.com/v1alpha1\nkind: PillarVolumeState\nmetadata: {name: bad-backend}\nspec: {volumeID: a/b/c/d, agentVolumeID: c/d, agentRef: a, backendType: zfs, protocolType: iscsi}\n")?;
    assert!(e.contains("spec.backendType"), "{e}");
    let e = raw("apiVersion: pillar-csi.bhyoo.com/v1alpha1\nkind: PillarAgent\nmetadata: {name: bad-port}\nspec: {address: 192.0.2.1, port: 70000}\n")?;
    assert!(e.contains("spec.port"), "{e}");
    let e = raw("apiVersion: pillar-csi.bhyoo.com/v1alpha1\nkind: PillarStorageClass\nmetadata: {name: bad-fs}\nspec: {storeRef: s, protocolRef: p, storageClass: {name: x}, filesystem: {fsType: btrfs}}\n")?;
    assert!(e.contains("spec.filesystem.fsType"), "{e}");
    let e = raw("apiVersion: pillar-csi.bhyoo.com/v1alpha1\nkind: PillarStore\nmetadata: {name: no-agent}\nspec: {backend: {zfs: {pool: tank}}}\n")?;
    assert!(e.contains("spec.agentRef"), "{e}");
    let left = server.kubectl(&[
        "get",
        "pvst,pillaragent,pillarstorageclass,pillarstore",
        "--no-headers",
    ])?;
    assert_eq!(left.trim(), "", "a refused object was stored");
    Ok(())
}
