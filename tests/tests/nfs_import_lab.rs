//! Adoption of existing ZFS filesystems through the agent in the kernel
//! lab (`import_zfs_dataset`): each refusal of the exact quota
//! prerequisite and the other checks changes nothing, an adopted
//! filesystem is served over NFS as it was, and is never resized or
//! destroyed. Witnesses: the `zfs` CLI, `sha256sum` of the data, the NFS
//! client. Run with `tests/lab/run tests -- nfs_import_lab`.
use pillar_csi_lab::{
    agent::{pb, AgentConfig, AgentProcess},
    nfs::{exported, fill, unmount, FsParent, NfsMount, CLIENT},
    run, Lab, Result,
};
use std::path::Path;

const MIB: u64 = 1 << 20;
const DATASET: i32 = pb::BackendType::ZfsDataset as i32;
const NFS: i32 = pb::ProtocolType::Nfs as i32;

fn fence(uid: &str, generation: u64) -> Option<pb::FenceToken> {
    Some(pb::FenceToken {
        volume_uid: uid.to_owned(),
        generation,
    })
}

/// The properties an adoption must leave as they were, and the data.
fn fingerprint(ds: &str, at: &Path) -> Result<String> {
    let props = run(
        "zfs",
        &[
            "get",
            "-Hp",
            "-o",
            "property,value",
            "guid,refquota,quota,mountpoint,sharenfs,compression,readonly",
            ds,
        ],
    )?;
    let data = run("sha256sum", &[&at.join("data.bin").to_string_lossy()])?;
    Ok(format!(
        "{props}{}",
        data.split(' ').next().unwrap_or_default()
    ))
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the kernel lab"]
async fn nfs_import_lab_adopted_filesystem_refusals_and_preservation() -> Result<()> {
    let lab = Lab::get();
    let parent = FsParent::create(&lab, "nfsi")?;
    let name = lab.unique("nfsimport");
    let config = AgentConfig::new(
        &lab,
        &name,
        vec![format!("zfs-dataset={}", parent.dataset)],
        4432,
        3272,
    )?;
    let agent = AgentProcess::start(config).await?;
    let mut c = agent.client().await?;
    let pool = parent
        .dataset
        .split('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    let leaf = lab.unique("legacy");
    let ds = format!("{}/{leaf}", parent.dataset);
    let id = format!("{pool}/{leaf}");
    // An existing filesystem holding data, as another tool left it.
    run(
        "zfs",
        &["create", "-o", "refquota=40M", "-o", "sharenfs=on", &ds],
    )?;
    let at = parent.at.join(&leaf);
    fill(&at.join("data.bin"), 8)?;
    let uid = lab.unique("uid");
    let import = |dataset: &str, bytes: u64| pb::CreateVolumeRequest {
        volume_id: id.clone(),
        backend_type: DATASET,
        capacity_bytes: bytes,
        fence: fence(&uid, 1),
        import_zfs_dataset: dataset.to_owned(),
        ..Default::default()
    };
    let before = fingerprint(&ds, &at)?;

    // Each refusal names what to change, and changes nothing.
    let zvol = format!("{}/{}", parent.dataset, lab.unique("zv"));
    run("zfs", &["create", "-V", "8M", &zvol])?;
    let zvol_id = format!("{pool}/{}", zvol.rsplit('/').next().unwrap_or_default());
    let cases: Vec<(pb::CreateVolumeRequest, &str)> = vec![
        (
            import(&format!("{ds}-other"), 40 * MIB),
            "layout: expected dataset",
        ),
        (
            import(&format!("{pool}/elsewhere/{leaf}"), 40 * MIB),
            "does not match the agent backend's configured ZFS parent dataset",
        ),
        (
            import(&ds, 32 * MIB),
            "they must be equal: import never changes a quota",
        ),
        (import(&ds, 40 * MIB), "shared: filesystem"),
        (import("no-slash", 40 * MIB), "must name a ZFS dataset"),
        (
            pb::CreateVolumeRequest {
                volume_id: zvol_id,
                import_zfs_dataset: zvol.clone(),
                ..import(&ds, 8 * MIB)
            },
            "only ZFS filesystems can be imported",
        ),
    ];
    for (request, expect) in cases {
        let err = c
            .create_volume(request.clone())
            .await
            .expect_err("a refused import");
        assert!(err.message().contains(expect), "{expect:?} in {err:?}");
    }
    let missing_id = format!("{pool}/{}", lab.unique("gone"));
    let err = c
        .create_volume(pb::CreateVolumeRequest {
            volume_id: missing_id.clone(),
            import_zfs_dataset: format!(
                "{}/{}",
                parent.dataset,
                missing_id.split('/').nth(1).unwrap_or_default()
            ),
            ..import(&ds, 40 * MIB)
        })
        .await
        .expect_err("missing");
    assert!(err.message().contains("missing: dataset"), "{err:?}");
    assert_eq!(
        fingerprint(&ds, &at)?,
        before,
        "the refusals changed nothing"
    );
    run("zfs", &["set", "sharenfs=off", &ds])?;
    run("zfs", &["create", &format!("{ds}/child")])?;
    let err = c
        .create_volume(import(&ds, 40 * MIB))
        .await
        .expect_err("children");
    assert!(err.message().contains("children: filesystem"), "{err:?}");
    run("zfs", &["destroy", &format!("{ds}/child")])?;
    run("zfs", &["set", "refquota=none", &ds])?;
    let err = c
        .create_volume(import(&ds, 40 * MIB))
        .await
        .expect_err("no quota");
    assert!(err.message().contains("has no refquota"), "{err:?}");
    run("zfs", &["set", "refquota=40M", &ds])?;
    // One ZFS does not mount is refused; mounted again, it is as it was.
    run("zfs", &["set", "mountpoint=none", &ds])?;
    let err = c
        .create_volume(import(&ds, 40 * MIB))
        .await
        .expect_err("not mounted");
    assert!(err.message().contains("mountpoint: "), "{err:?}");
    run("zfs", &["inherit", "mountpoint", &ds])?;
    let before = fingerprint(&ds, &at)?;

    // Adopted: exported to a client that reads the data as it was.
    let state = c.create_volume(import(&ds, 40 * MIB)).await?.into_inner();
    assert_eq!(state.capacity_bytes, 40 * MIB);
    let info = c
        .export_volume(pb::ExportVolumeRequest {
            volume_id: id.clone(),
            backend_type: DATASET,
            protocol_type: NFS,
            fence: fence(&uid, 1),
            acl_enabled: true,
            allowed_initiators: vec![CLIENT.into()],
            chap: None,
        })
        .await?
        .into_inner();
    let mnt = lab.work.join(format!("{name}.mnt"));
    let mount = NfsMount::mount(&info.target_id, &mnt)?;
    let seen = run("sha256sum", &[&mnt.join("data.bin").to_string_lossy()])?;
    assert!(
        before.ends_with(seen.split(' ').next().unwrap_or("-")),
        "the client reads the data as it was"
    );
    drop(mount);

    // Never resized; deleted, it stays with its data and properties.
    let grow = c
        .expand_volume(pb::ExpandVolumeRequest {
            volume_id: id.clone(),
            backend_type: DATASET,
            requested_bytes: 80 * MIB,
            fence: fence(&uid, 1),
        })
        .await
        .expect_err("an adopted filesystem is never resized");
    assert!(
        grow.message()
            .contains("never resized; raise its refquota yourself"),
        "{grow:?}"
    );
    c.delete_volume(pb::DeleteVolumeRequest {
        volume_id: id.clone(),
        backend_type: DATASET,
        fence: fence(&uid, 1),
    })
    .await?;
    assert_eq!(
        fingerprint(&ds, &at)?,
        before,
        "deleted, the filesystem stays as it was"
    );
    assert!(
        !exported()?.contains(&info.target_id),
        "and is no longer exported"
    );

    // A new lifecycle adopts it again, and releases it: still there.
    let uid2 = lab.unique("uid");
    c.create_volume(pb::CreateVolumeRequest {
        fence: fence(&uid2, 1),
        ..import(&ds, 40 * MIB)
    })
    .await?;
    // The GUID is pinned: another filesystem made under its name while
    // it is renamed away is refused, and the export is not made.
    let away = format!("{ds}-away");
    unmount(&ds)?;
    run("zfs", &["rename", &ds, &away])?;
    run("zfs", &["create", "-o", "refquota=40M", &ds])?;
    let err = c
        .export_volume(pb::ExportVolumeRequest {
            volume_id: id.clone(),
            backend_type: DATASET,
            protocol_type: NFS,
            fence: fence(&uid2, 1),
            acl_enabled: true,
            allowed_initiators: vec![CLIENT.into()],
            chap: None,
        })
        .await
        .expect_err("a re-made filesystem is not the adopted one");
    assert!(err.message().contains("identity: filesystem"), "{err:?}");
    assert!(!exported()?.contains(&info.target_id), "nothing exported");
    run("zfs", &["destroy", &ds])?;
    run("zfs", &["rename", &away, &ds])?;
    run("zfs", &["mount", &ds])?;
    c.release_volume(pb::ReleaseVolumeRequest {
        volume_id: id.clone(),
        backend_type: DATASET,
        fence: fence(&uid2, 1),
    })
    .await?;
    assert_eq!(
        fingerprint(&ds, &at)?,
        before,
        "released, the filesystem stays as it was"
    );
    Ok(())
}
