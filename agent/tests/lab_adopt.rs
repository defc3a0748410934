//! Adoption in the kernel lab: zvol import, LV adoption under both policies,
//! every agent-side refusal produced by its real cause, and InspectVolume
//! compared with what the kernel shows. Most tests run the agent in-process
//! over the real backends (libzfs, liblvm2cmd) and kernel targets (nvmet,
//! LIO); the `adopt_lv_grpc_*` and `adopt_lv_inspect_json_*` tests run the
//! `pillar-csi agent` binary and call it over gRPC, the last through an
//! independent Python client (`tests/lab/agent_json.py`) in place of grpcurl.
//!
//! Run with `tests/lab/run tests -- adopt_`.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use api::annotations::LvPolicy;
use pillar_csi_agent::{error::AgentError, export::Protocol, marks::ExportRecord};
use pillar_csi_lab::{
    agent::{pb, AgentProcess},
    cmd::run,
    env::Lab,
    nvme::Connection,
};
use std::{
    fs,
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
};

mod common;
use common::{grpc::*, *};

// ---------------------------------------------------------------- zvols

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the kernel lab"]
async fn adopt_zvol_with_ext4_and_old_driver_properties_serves_its_data() -> R {
    let lab = Lab::get();
    let parent = lab.unique("adoptz");
    let p = format!("{}/{parent}", lab.pool);
    let ds = format!("{p}/pvc-legacy");
    sh(&format!("zfs create {p} && zfs create -V 64M {ds} && zfs set democratic-csi:managed_resource=true democratic-csi:volume_context_provisioner_identity=old {ds}"));
    settle();
    let dev = format!("/dev/zvol/{ds}");
    let mnt = mkdir_tmp();
    let m = mnt.display();
    sh(&format!("mkfs.ext4 -q {dev} && mount {dev} {m} && printf 'data of the old driver\\n' > {m}/hello.txt && umount {m}"));
    let props = |ds: &str| {
        sh(&format!(
            "zfs get -Hp -o property,value volsize,volmode,democratic-csi:managed_resource,democratic-csi:volume_context_provisioner_identity {ds}"
        ))
    };
    let before = props(&ds);

    let f = zfs_agent(&lab, &parent);
    let id = format!("{}/pvc-legacy", lab.pool);
    let state = import_zvol(&f, &id, &ds, 32 << 20, "uid-z1").await?;
    assert_eq!(
        state.capacity_bytes,
        64 << 20,
        "the PV gets the zvol's size"
    );
    // A retry of the same import under the same lifecycle returns the volume.
    assert_eq!(import_zvol(&f, &id, &ds, 32 << 20, "uid-z1").await?, state);

    let rec = ExportRecord {
        acl: true,
        allowed_initiators: [HOST_NQN.to_owned()].into(),
        chap: None,
        target: None,
    };
    let info = f
        .agent
        .export_volume(
            &id,
            None,
            Protocol::NvmeofTcp,
            rec,
            Some(&token("uid-z1", 1)),
        )
        .await?;
    {
        let conn = Connection::tcp("127.0.0.1", 4420, &info.target_id, HOST_NQN)?;
        let remote = conn.namespace_device(1)?;
        let rmnt = mkdir_tmp();
        sh(&format!("mount {} {}", remote.display(), rmnt.display()));
        let text = fs::read_to_string(rmnt.join("hello.txt"));
        sh(&format!("umount {}", rmnt.display()));
        assert_eq!(text?, "data of the old driver\n");
    }
    assert_eq!(
        props(&ds),
        before,
        "volsize and user properties are untouched"
    );

    f.agent
        .delete_volume(&id, None, Some(&token("uid-z1", 1)))
        .await?;
    assert!(
        run("zfs", &["list", &ds]).is_err(),
        "an imported zvol is ordinary: DeleteVolume destroys it"
    );
    sh(&format!("zfs destroy -r {p}"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the kernel lab"]
async fn adopt_zvol_refusals_come_from_their_real_causes() -> R {
    let lab = Lab::get();
    let parent = lab.unique("adoptr");
    let pool = &lab.pool;
    let p = format!("{pool}/{parent}");
    let v = format!("{p}/v1");
    sh(&format!(
        "zfs create {p} && zfs create -V 16M {v} && zfs create {p}/fs1 && zfs snapshot {v}@s && zfs create -V 16M -o volmode=none {p}/nodev"
    ));
    settle();
    let dev = format!("/dev/zvol/{v}");
    let f = zfs_agent(&lab, &parent);
    let id = format!("{pool}/v1");
    let refused = |vid: &str, why: String| format!("import of volume {vid} refused: {why}");

    // missing
    assert_eq!(
        refusal(
            import_zvol(
                &f,
                &format!("{pool}/nope"),
                &format!("{p}/nope"),
                1 << 20,
                "u"
            )
            .await
        ),
        refused(
            &format!("{pool}/nope"),
            format!("missing: dataset {p}/nope does not exist")
        )
    );
    // a filesystem dataset
    assert_eq!(
        refusal(import_zvol(&f, &format!("{pool}/fs1"), &format!("{p}/fs1"), 1 << 20, "u").await),
        refused(&format!("{pool}/fs1"), format!("wrong type: dataset {p}/fs1 has type filesystem, only ZFS volumes (zvols) can be imported"))
    );
    // a snapshot
    assert_eq!(
        refusal(import_zvol(&f, &id, &format!("{v}@s"), 1 << 20, "u").await),
        refused(&id, format!("wrong type: dataset {v}@s has type snapshot, only ZFS volumes (zvols) can be imported"))
    );
    // volmode=none: no block device
    assert_eq!(
        refusal(
            import_zvol(
                &f,
                &format!("{pool}/nodev"),
                &format!("{p}/nodev"),
                1 << 20,
                "u"
            )
            .await
        ),
        refused(
            &format!("{pool}/nodev"),
            format!("missing: block device /dev/zvol/{p}/nodev is not present on the storage node")
        )
    );
    // bigger than volsize
    assert_eq!(
        refusal(import_zvol(&f, &id, &v, 32 << 20, "u").await),
        refused(&id, format!("too small: dataset {v} is {} bytes, requested capacity is {} bytes; import never resizes", 16u64 << 20, 32u64 << 20))
    );
    // parent dataset mismatch: a sibling, a deeper zvol, a pool-root zvol
    for (named, parent_named) in [
        (
            format!("{pool}/{parent}-other/v1"),
            format!("{pool}/{parent}-other"),
        ),
        (format!("{p}/a/v1"), format!("{p}/a")),
        (format!("{pool}/v1"), pool.clone()),
    ] {
        let e = import_zvol(&f, &id, &named, 1 << 20, "u")
            .await
            .unwrap_err();
        assert!(matches!(e, AgentError::FailedPrecondition(_)));
        assert_eq!(
            e.to_string(),
            format!("volume {id}: requested ZFS parent dataset {parent_named} does not match the agent backend's configured ZFS parent dataset {p}")
        );
    }
    // layout: the volume ID resolves to another dataset than the one named
    assert_eq!(
        refusal(import_zvol(&f, &format!("{pool}/v2"), &v, 1 << 20, "u").await),
        refused(
            &format!("{pool}/v2"),
            format!("layout: expected dataset {v} does not match the resolved dataset {p}/v2")
        )
    );

    // mounted
    let mnt = mkdir_tmp();
    sh(&format!(
        "mkfs.ext4 -q {dev} && mount {dev} {}",
        mnt.display()
    ));
    let r = import_zvol(&f, &id, &v, 1 << 20, "u").await;
    sh(&format!("umount {}", mnt.display()));
    assert_eq!(
        refusal(r),
        refused(
            &id,
            format!(
                "in use: device {dev} is mounted at {}; unmount it first",
                mnt.display()
            )
        )
    );

    // a LIO backstore left by an old driver
    let core = format!(
        "/sys/kernel/config/target/core/iblock_71/old-{}",
        std::process::id()
    );
    sh(&format!(
        "mkdir -p {core} && echo udev_path={dev} > {core}/control && printf %s {dev} > {core}/udev_path && echo 1 > {core}/enable"
    ));
    let r = import_zvol(&f, &id, &v, 1 << 20, "u").await;
    sh(&format!(
        "rmdir {core} && rmdir /sys/kernel/config/target/core/iblock_71"
    ));
    assert_eq!(
        refusal(r),
        refused(&id, format!("in use: LIO backstore iblock_71/old-{} still points at {dev}; remove the old driver's export (targetcli delete) first", std::process::id()))
    );

    // an nvmet namespace left by an old driver
    let nqn = format!("nqn.2014-08.org.example:old-{}", std::process::id());
    let sub = format!("/sys/kernel/config/nvmet/subsystems/{nqn}");
    sh(&format!(
        "mkdir {sub} && mkdir {sub}/namespaces/1 && printf %s {dev} > {sub}/namespaces/1/device_path && echo 1 > {sub}/namespaces/1/enable"
    ));
    let r = import_zvol(&f, &id, &v, 1 << 20, "u").await;
    sh(&format!(
        "echo 0 > {sub}/namespaces/1/enable && rmdir {sub}/namespaces/1 && rmdir {sub}"
    ));
    assert_eq!(
        refusal(r),
        refused(&id, format!("in use: nvmet subsystem {nqn} namespace 1 still exports {dev}; remove the export first"))
    );

    // a device-mapper device stacked on it
    let dm = format!("adopt-old-{}", std::process::id());
    sh(&format!(
        "dmsetup create {dm} --table '0 32768 linear {dev} 0'"
    ));
    let r = import_zvol(&f, &id, &v, 1 << 20, "u").await;
    sh(&format!("dmsetup remove {dm}"));
    assert_eq!(
        refusal(r),
        refused(&id, format!("in use: device {dev} has device-mapper holders in sysfs; release the holding device first"))
    );

    // held exclusively by another opener
    let held = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc_o_excl())
        .open(&dev)?;
    let r = import_zvol(&f, &id, &v, 1 << 20, "u").await;
    drop(held);
    assert_eq!(
        refusal(r),
        refused(&id, format!("in use: device {dev} is held exclusively on the storage node (mounted, exported, or opened by another consumer)"))
    );

    // Nothing was recorded by any refusal; once free the import succeeds.
    assert!(f.agent.marks().volume_ids()?.is_empty());
    import_zvol(&f, &id, &v, 1 << 20, "u").await?;
    let vs = sh(&format!("zfs get -Hp -o value volsize {v}"));
    assert_eq!(vs.trim(), (16u64 << 20).to_string());
    // A later import naming another zvol under the same lifecycle is refused.
    sh(&format!("zfs create -V 16M {p}/v3"));
    assert_eq!(
        refusal(import_zvol(&f, &id, &format!("{p}/v3"), 1 << 20, "u").await),
        refused(
            &id,
            format!("already imported from zvol {v}; the import source cannot be changed")
        )
    );
    f.agent
        .release_volume(&id, None, Some(&token("u", 1)))
        .await?;
    sh(&format!("zfs destroy -r {p}"));
    drop(f.state);
    Ok(())
}

/// `O_EXCL` as the kernel defines it on x86-64 and arm64.
fn libc_o_excl() -> i32 {
    0o200
}

// ---------------------------------------------------------------- LVs

fn lv_exists(vg: &str, lv: &str) -> bool {
    run("lvs", &[&format!("{vg}/{lv}")]).is_ok()
}

fn make_lv_with_xfs(vg: &str, lv: &str) {
    sh(&format!("lvcreate -q -y -L 320M -n {lv} {vg}"));
    settle();
    let mnt = mkdir_tmp();
    let dev = format!("/dev/{vg}/{lv}");
    sh(&format!(
        "mkfs.xfs -q {dev} && mount {dev} {m} && printf 'legacy data\\n' > {m}/data.txt && umount {m}",
        m = mnt.display()
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the kernel lab"]
async fn adopt_lv_preserve_original_survives_delete_and_pins_identity() -> R {
    let lab = Lab::get();
    let vg = lab.vg.clone();
    let name = lab.unique("legacy").replace('-', "_");
    make_lv_with_xfs(&vg, &name);
    let dev = format!("/dev/{vg}/{name}");
    let id = format!("{vg}/{name}");
    let ident = lv_identity(&vg, &name);
    let f = lvm_agent(&lab, false);

    let state = import_lv(&f, &ident, LvPolicy::PreserveOriginal, 100 << 20, "uid-p1").await?;
    assert_eq!(state.capacity_bytes, 320 << 20);

    // InspectVolume on the idle LV, compared with the kernel.
    let i = f.agent.inspect_volume(&id, None).await?;
    assert_eq!(i.lv.uuid.as_str(), ident.lv_uuid.as_str());
    assert_eq!(i.lv.vg_uuid.as_str(), ident.vg_uuid.as_str());
    assert!(i.usage.mounts.is_empty() && i.usage.holders.is_empty());
    assert!(i.usage.lio.is_empty() && i.usage.nvmet.is_empty());
    assert_eq!(i.usage.exclusive, sys::block::Exclusive::Free);
    let blkid_type = sh(&format!("blkid -p -o value -s TYPE {dev}"));
    assert_eq!(
        i.probe,
        sys::blkid::Probe::Filesystem {
            fs_type: blkid_type.trim().to_owned()
        }
    );
    let mark = i.mark.clone().expect("a mark");
    assert_eq!(mark.fence.live.as_ref().unwrap().volume_uid, "uid-p1");

    // Exported: InspectVolume lists the export with its allowed host, as configfs shows.
    let rec = ExportRecord {
        acl: true,
        allowed_initiators: [HOST_NQN.to_owned()].into(),
        chap: None,
        target: None,
    };
    let info = f
        .agent
        .export_volume(
            &id,
            None,
            Protocol::NvmeofTcp,
            rec,
            Some(&token("uid-p1", 2)),
        )
        .await?;
    let i = f.agent.inspect_volume(&id, None).await?;
    assert_eq!(i.usage.nvmet.len(), 1);
    assert_eq!(i.usage.nvmet[0].subsystem, info.target_id);
    let hosts = sh(&format!(
        "ls /sys/kernel/config/nvmet/subsystems/{}/allowed_hosts",
        info.target_id
    ));
    assert_eq!(
        i.nvmet_allowed[&info.target_id].1,
        hosts
            .split_whitespace()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    );
    assert_eq!(
        i.nvmet_allowed[&info.target_id].1,
        vec![HOST_NQN.to_owned()]
    );

    // PreserveOriginal is never resized.
    let e = f
        .agent
        .expand_volume(&id, None, 400 << 20, Some(&token("uid-p1", 2)))
        .await
        .unwrap_err();
    assert!(matches!(e, AgentError::FailedPrecondition(_)));
    assert!(
        e.to_string()
            .starts_with(&format!("cannot expand volume {id}: ")),
        "{e}"
    );
    assert_eq!(
        sh(&format!(
            "lvs --noheadings --units b --nosuffix -o lv_size {id}"
        ))
        .trim(),
        (320u64 << 20).to_string()
    );

    // DeleteVolume removes the export and ends the lifecycle; the LV and its data stay.
    f.agent
        .delete_volume(&id, None, Some(&token("uid-p1", 2)))
        .await?;
    assert!(lv_exists(&vg, &name));
    assert_eq!(lv_identity(&vg, &name), ident);
    assert!(!Path::new(&format!(
        "/sys/kernel/config/nvmet/subsystems/{}",
        info.target_id
    ))
    .exists());
    assert_eq!(read_file_on(&dev, "data.txt"), "legacy data\n");
    // That DeleteVolume destroyed nothing: its identical retry is refused
    // like any request with the ended token (spec: only a Managed volume's
    // DeleteVolume is repeatable), and the refusal changes nothing.
    let ended = f.agent.marks().load(&id)?;
    let retry = f
        .agent
        .delete_volume(&id, None, Some(&token("uid-p1", 2)))
        .await
        .unwrap_err();
    assert!(
        matches!(retry, AgentError::FailedPrecondition(_)),
        "{retry:?}"
    );
    assert_eq!(f.agent.marks().load(&id)?, ended);
    assert!(lv_exists(&vg, &name));

    let i = f.agent.inspect_volume(&id, None).await?;
    let mark = i.mark.expect("the mark survives");
    assert!(mark.fence.live.is_none() && mark.fence.ended_uids.contains("uid-p1"));
    assert!(mark.adopted.as_ref().is_some_and(|a| a.preserves()));

    // After the lifecycle ended: Managed, or other UUIDs, are refused.
    let pinned = format!("import of volume {id} refused: pinned: ");
    let e = refusal(import_lv(&f, &ident, LvPolicy::Managed, 1 << 20, "uid-p2").await);
    assert!(e.starts_with(&pinned), "{e}");
    let mut other = ident.clone();
    other.lv_uuid = sys::lvm::LvmUuid::new("AAAAAA-AAAA-AAAA-AAAA-AAAA-AAAA-AAAAAA")?;
    let e = refusal(import_lv(&f, &other, LvPolicy::PreserveOriginal, 1 << 20, "uid-p2").await);
    assert!(e.starts_with(&pinned), "{e}");

    // The same pin opens a new lifecycle; ReleaseVolume verifies and keeps the LV.
    import_lv(&f, &ident, LvPolicy::PreserveOriginal, 1 << 20, "uid-p2").await?;
    // Release refuses while the LV is mounted, and changes nothing.
    let mnt = mkdir_tmp();
    sh(&format!("mount {dev} {}", mnt.display()));
    let i = f.agent.inspect_volume(&id, None).await?;
    assert_eq!(i.usage.mounts.len(), 1);
    assert_eq!(i.usage.mounts[0].mount_point, mnt);
    assert_eq!(i.usage.exclusive, sys::block::Exclusive::Busy);
    let e = f
        .agent
        .release_volume(&id, None, Some(&token("uid-p2", 1)))
        .await
        .unwrap_err();
    sh(&format!("umount {}", mnt.display()));
    assert_eq!(
        e.to_string(),
        format!("release of volume {id} refused: in use: device {dev} is mounted at {}; unmount it first", mnt.display())
    );
    let m = f.agent.marks().load(&id)?.unwrap();
    assert_eq!(m.fence.live.as_ref().unwrap().volume_uid, "uid-p2");
    f.agent
        .release_volume(&id, None, Some(&token("uid-p2", 1)))
        .await?;
    assert!(lv_exists(&vg, &name));
    sh(&format!("lvremove -q -y {id}"));
    Ok(())
}

/// What `blkid -p` (the CLI, an independent witness) reports as TYPE.
fn blkid_type(dev: &str) -> String {
    sh(&format!("blkid -p -o value -s TYPE {dev}"))
        .trim()
        .to_owned()
}

/// The import's in-process libblkid probe is recorded in the mark: the
/// filesystem an LV and a zvol hold, as the `blkid -p` CLI names it, and a
/// blank zvol as blank; none of it refuses the import. The PreserveOriginal
/// LV's DeleteVolume destroys nothing, so its identical retry is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the kernel lab"]
async fn adopt_probe_records_what_blkid_finds_on_an_lv_and_a_zvol() -> R {
    use pillar_csi_agent::marks::ProbeRecord;
    let lab = Lab::get();

    // An LV holding xfs, adopted PreserveOriginal.
    let vg = lab.vg.clone();
    let name = lab.unique("probed").replace('-', "_");
    make_lv_with_xfs(&vg, &name);
    let id = format!("{vg}/{name}");
    let ident = lv_identity(&vg, &name);
    let f = lvm_agent(&lab, false);
    import_lv(&f, &ident, LvPolicy::PreserveOriginal, 1 << 20, "uid-b1").await?;
    let witness = blkid_type(&format!("/dev/{id}"));
    assert_eq!(witness, "xfs");
    let mark = f.agent.marks().load(&id)?.unwrap();
    assert_eq!(
        mark.import_probe,
        Some(ProbeRecord::Filesystem {
            filesystem_type: witness
        })
    );
    let on_disk: serde_json::Value =
        serde_json::from_slice(&fs::read(f.state.path().join("agent").join(format!(
            "{}.mark.json",
            pillar_csi_agent::marks::encode(&id)
        )))?)?;
    assert_eq!(
        on_disk["importProbe"],
        serde_json::json!({"state": "filesystem", "filesystemType": "xfs"}),
        "{on_disk}"
    );
    f.agent
        .delete_volume(&id, None, Some(&token("uid-b1", 1)))
        .await?;
    let after = f.agent.marks().load(&id)?;
    let retry = f
        .agent
        .delete_volume(&id, None, Some(&token("uid-b1", 1)))
        .await
        .unwrap_err();
    assert_eq!(
        retry.to_string(),
        format!("stale fencing token for volume {id}: lifecycle uid-b1 has ended")
    );
    assert!(matches!(retry, AgentError::FailedPrecondition(_)));
    assert_eq!(
        f.agent.marks().load(&id)?,
        after,
        "the refusal changes nothing"
    );
    assert!(lv_exists(&vg, &name), "PreserveOriginal: the LV stays");
    sh(&format!("lvremove -q -y {id}"));

    // Zvols: one holding ext4, one blank.
    let parent = lab.unique("probez");
    let p = format!("{}/{parent}", lab.pool);
    let (fs_ds, blank_ds) = (format!("{p}/with-ext4"), format!("{p}/blank"));
    sh(&format!(
        "zfs create {p} && zfs create -V 64M {fs_ds} && zfs create -V 64M {blank_ds}"
    ));
    settle();
    sh(&format!("mkfs.ext4 -q /dev/zvol/{fs_ds}"));
    let f = zfs_agent(&lab, &parent);
    let witness = blkid_type(&format!("/dev/zvol/{fs_ds}"));
    assert_eq!(witness, "ext4");
    for (ds, expected) in [
        (
            &fs_ds,
            ProbeRecord::Filesystem {
                filesystem_type: witness,
            },
        ),
        (&blank_ds, ProbeRecord::Blank),
    ] {
        let zid = format!("{}/{}", lab.pool, ds.rsplit('/').next().unwrap());
        import_zvol(&f, &zid, ds, 32 << 20, "uid-b2").await?;
        let mark = f.agent.marks().load(&zid)?.unwrap();
        assert_eq!(mark.import_probe, Some(expected), "{ds}");
        f.agent
            .delete_volume(&zid, None, Some(&token("uid-b2", 1)))
            .await?;
        // An imported zvol's DeleteVolume destroyed it: its retry succeeds.
        f.agent
            .delete_volume(&zid, None, Some(&token("uid-b2", 1)))
            .await?;
        assert!(run("zfs", &["list", ds]).is_err(), "{ds} destroyed");
    }
    sh(&format!("zfs destroy -r {p}"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the kernel lab"]
async fn adopt_lv_managed_is_destroyed_by_delete() -> R {
    let lab = Lab::get();
    let vg = lab.vg.clone();
    let name = lab.unique("managed").replace('-', "_");
    make_lv_with_xfs(&vg, &name);
    let id = format!("{vg}/{name}");
    let ident = lv_identity(&vg, &name);
    let f = lvm_agent(&lab, false);
    import_lv(&f, &ident, LvPolicy::Managed, 1 << 20, "uid-m1").await?;
    assert_eq!(
        read_file_on(&format!("/dev/{id}"), "data.txt"),
        "legacy data\n"
    );
    f.agent
        .delete_volume(&id, None, Some(&token("uid-m1", 1)))
        .await?;
    assert!(
        !lv_exists(&vg, &name),
        "Managed: DeleteVolume destroys the LV"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the kernel lab"]
async fn adopt_lv_refusals_come_from_their_real_causes() -> R {
    let lab = Lab::get();
    let vg = lab.vg.clone();
    let u = lab.unique("r").replace('-', "_");
    let f = lvm_agent(&lab, false);
    let refused = |lv: &str, why: String| format!("import of volume {vg}/{lv} refused: {why}");
    let pre = LvPolicy::PreserveOriginal;

    // re-created under the same name (the old one renamed away)
    let a = format!("a{u}");
    sh(&format!("lvcreate -q -y -L 16M -n {a} {vg}"));
    let old = lv_identity(&vg, &a);
    sh(&format!(
        "lvrename -q {vg} {a} b{u} && lvcreate -q -y -L 16M -n {a} {vg}"
    ));
    settle();
    let new = lv_identity(&vg, &a);
    assert_eq!(
        refusal(import_lv(&f, &old, pre, 1 << 20, "u").await),
        refused(&a, format!("identity: logical volume {vg}/{a} has UUID {}, not the pinned {}; it was renamed or re-created", new.lv_uuid, old.lv_uuid))
    );
    // missing (the name no longer exists)
    sh(&format!("lvremove -q -y {vg}/{a}"));
    assert_eq!(
        refusal(import_lv(&f, &old, pre, 1 << 20, "u").await),
        refused(
            &a,
            format!("missing: logical volume {vg}/{a} does not exist")
        )
    );
    // too small
    let b = format!("b{u}");
    let bi = lv_identity(&vg, &b);
    assert_eq!(
        refusal(import_lv(&f, &bi, pre, 32 << 20, "u").await),
        refused(&b, format!("too small: logical volume {vg}/{b} is {} bytes, requested capacity is {} bytes; import never resizes", 16u64 << 20, 32u64 << 20))
    );
    // a classic snapshot origin, and the snapshot itself
    let o = format!("o{u}");
    let s = format!("s{u}");
    sh(&format!(
        "lvcreate -q -y -L 16M -n {o} {vg} && lvcreate -q -y -s -L 8M -n {s} {vg}/{o}"
    ));
    assert_eq!(
        refusal(import_lv(&f, &lv_identity(&vg, &o), pre, 1 << 20, "u").await),
        refused(
            &o,
            format!(
                "layout: logical volume {vg}/{o} cannot be adopted: it is the origin of a snapshot"
            )
        )
    );
    assert_eq!(
        refusal(import_lv(&f, &lv_identity(&vg, &s), pre, 1 << 20, "u").await),
        refused(
            &s,
            format!("layout: logical volume {vg}/{s} cannot be adopted: it is a snapshot")
        )
    );
    sh(&format!("lvremove -q -y {vg}/{s} {vg}/{o}"));
    // the thin pool
    let tp = lab.thin_pool.clone();
    assert_eq!(
        refusal(import_lv(&f, &lv_identity(&vg, &tp), pre, 1 << 20, "u").await),
        refused(
            &tp,
            format!("layout: logical volume {vg}/{tp} cannot be adopted: it is a thin pool")
        )
    );
    // a thin LV, on a backend without a thin pool
    let t = format!("t{u}");
    sh(&format!("lvcreate -q -y -V 16M -T {vg}/{tp} -n {t}"));
    assert_eq!(
        refusal(import_lv(&f, &lv_identity(&vg, &t), pre, 1 << 20, "u").await),
        refused(&t, format!("layout: logical volume {vg}/{t} cannot be adopted: it is a thin LV and the backend has no thin pool"))
    );
    // ... which a backend with that thin pool adopts.
    let thin = lvm_agent(&lab, true);
    import_lv(&thin, &lv_identity(&vg, &t), pre, 1 << 20, "u").await?;
    // inactive
    let n = format!("n{u}");
    sh(&format!(
        "lvcreate -q -y -L 16M -n {n} {vg} && lvchange -q -ky {vg}/{n} && lvchange -q -an {vg}/{n}"
    ));
    let attr = sh(&format!("lvs --noheadings -o lv_attr {vg}/{n}"));
    assert_eq!(
        refusal(import_lv(&f, &lv_identity(&vg, &n), pre, 1 << 20, "u").await),
        refused(&n, format!("inactive: logical volume {vg}/{n} is not active (lv_attr {}); import never activates it", attr.trim()))
    );
    // in use: a dm device stacked on it, then held exclusively
    settle();
    let bdev = format!("/dev/{vg}/{b}");
    let dm = format!("adopt-lv-{}", std::process::id());
    sh(&format!(
        "dmsetup create {dm} --table '0 32768 linear {bdev} 0'"
    ));
    let r = import_lv(&f, &bi, pre, 1 << 20, "u").await;
    sh(&format!("dmsetup remove {dm}"));
    assert_eq!(
        refusal(r),
        refused(&b, format!("in use: device {bdev} has device-mapper holders in sysfs; release the holding device first"))
    );
    let held = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc_o_excl())
        .open(&bdev)?;
    let r = import_lv(&f, &bi, pre, 1 << 20, "u").await;
    drop(held);
    assert_eq!(
        refusal(r),
        refused(&b, format!("in use: device {bdev} is held exclusively on the storage node (mounted, exported, or opened by another consumer)"))
    );

    // InspectVolume: a missing LV, a zvol backend, a corrupt mark.
    let e = f
        .agent
        .inspect_volume(&format!("{vg}/gone{u}"), None)
        .await
        .unwrap_err();
    assert!(
        matches!(e, AgentError::FailedPrecondition(_)) && e.to_string().contains("missing"),
        "{e}"
    );
    let z = zfs_agent(&lab, "x");
    let e = z
        .agent
        .inspect_volume(&format!("{}/v", lab.pool), None)
        .await
        .unwrap_err();
    assert!(matches!(e, AgentError::Unimplemented(_)), "{e}");
    let mark = f.state.path().join("agent").join(format!(
        "{}.mark.json",
        pillar_csi_agent::marks::encode(&format!("{vg}/{b}"))
    ));
    fs::write(&mark, b"{not a mark")?;
    let e = f
        .agent
        .inspect_volume(&format!("{vg}/{b}"), None)
        .await
        .unwrap_err();
    assert!(matches!(e, AgentError::Internal(_)), "{e}");

    sh(&format!("lvremove -q -y {vg}/{b} {vg}/{t} {vg}/{n}"));
    Ok(())
}

// ---------------------------------------------------------------- over gRPC
//
// The tests below run the `pillar-csi agent` binary as a child process and
// call it over gRPC, as the controller (and an operator's grpcurl) does.

/// A volume group on its own loop device, for a test that re-creates it;
/// removed with its LVs when dropped.
struct ScratchVg {
    vg: String,
    loopdev: String,
    img: PathBuf,
}

impl ScratchVg {
    fn create(lab: &Lab) -> Self {
        let vg = lab.unique("scratchvg").replace('-', "_");
        let img = lab.work.join(format!("{vg}.img"));
        sh(&format!("truncate -s 64M {}", img.display()));
        let loopdev = sh(&format!("losetup -f --show {}", img.display()))
            .trim()
            .to_owned();
        sh(&format!(
            "pvcreate -q {loopdev} && vgcreate -q {vg} {loopdev}"
        ));
        Self { vg, loopdev, img }
    }
}

impl Drop for ScratchVg {
    fn drop(&mut self) {
        let _ = run("vgremove", &["-q", "-f", &self.vg]);
        let _ = run("pvremove", &["-q", "-f", &self.loopdev]);
        let _ = run("losetup", &["-d", &self.loopdev]);
        let _ = fs::remove_file(&self.img);
    }
}

/// A VG UUID mismatch from its real cause: the volume group was removed and
/// created again under the same name (and the LV under its old name), so the
/// pin taken before names a VG UUID that no longer exists. The refusal
/// names the VG; nothing is recorded or changed; the current identity then
/// imports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the kernel lab"]
async fn adopt_lv_grpc_refuses_the_pin_of_a_recreated_volume_group() -> R {
    let lab = Lab::get();
    let scratch = ScratchVg::create(&lab);
    let vg = scratch.vg.clone();
    sh(&format!("lvcreate -q -y -L 16M -n legacy {vg}"));
    let old = lv_identity(&vg, "legacy");
    sh(&format!(
        "vgremove -q -f {vg} && vgcreate -q {vg} {dev} && lvcreate -q -y -L 16M -n legacy {vg}",
        dev = scratch.loopdev
    ));
    settle();
    let new = lv_identity(&vg, "legacy");
    assert_ne!(old.vg_uuid, new.vg_uuid, "vgcreate gives a new VG UUID");

    let agent = agent_process(&lab, "adopt-vg", format!("lvm={vg}")).await;
    let mut client = agent.client().await?;
    let id = format!("{vg}/legacy");
    let why = format!(
        "import of volume {id} refused: identity: volume group {vg} has UUID {}, not the pinned {}; it is another volume group",
        new.vg_uuid, old.vg_uuid
    );
    // The whole old pin, and the current LV UUID with the old VG UUID: the
    // VG is checked first, so both name the volume group.
    let mut only_vg = new.clone();
    only_vg.vg_uuid = old.vg_uuid.clone();
    for pin in [&old, &only_vg] {
        let before = unchanged(&agent, &vg, "legacy");
        let r = client.create_volume(import_request(pin, "uid-vg")).await;
        let message = grpc_refusal(r);
        note(&lab, &message);
        assert_eq!(message, why);
        assert!(!mark_file(&agent, &id).exists(), "no fence mark written");
        assert_eq!(unchanged(&agent, &vg, "legacy"), before);
        assert_eq!(lv_identity(&vg, "legacy"), new);
    }
    // The current identity is adopted: the refusals came from the pin alone.
    client.create_volume(import_request(&new, "uid-vg")).await?;
    assert!(mark_file(&agent, &id).exists());
    drop(agent);
    drop(scratch);
    Ok(())
}

/// An LV used on the storage node by a LIO iblock backstore, an nvmet
/// namespace and a mount, each made directly (configfs, mount) and not by
/// the agent; the LIO and nvmet users name the LV by its /dev/<vg>/<lv>
/// path and by another name of the device (/dev/mapper, /dev/dm-N).
/// CreateVolume with import_lv over gRPC refuses with the sentence naming
/// that user, and changes nothing (no mark, the LV, configfs and the mount
/// as they were). Once the users are gone the import succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the kernel lab"]
async fn adopt_lv_grpc_refuses_lv_used_by_lio_nvmet_or_a_mount() -> R {
    let lab = Lab::get();
    let vg = lab.vg.clone();
    let name = lab.unique("busy").replace('-', "_");
    sh(&format!("lvcreate -q -y -L 32M -n {name} {vg}"));
    settle();
    let dev = format!("/dev/{vg}/{name}");
    let mnt = mkdir_tmp();
    sh(&format!(
        "mkfs.ext4 -q {dev} && mount {dev} {m} && printf 'legacy data\\n' > {m}/data.txt && umount {m}",
        m = mnt.display()
    ));
    let id = format!("{vg}/{name}");
    let ident = lv_identity(&vg, &name);
    let agent = agent_process(&lab, "adopt-busy", format!("lvm={vg}")).await;
    let mut client = agent.client().await?;
    let refused = |why: String| format!("import of volume {id} refused: {why}");
    let pid = std::process::id();

    // The LV's own path and another name of the same device, as an old
    // driver may have written it: users are matched by device number.
    let mapper = format!("/dev/mapper/{vg}-{name}");
    let dm = fs::canonicalize(&dev)?.display().to_string();

    // A LIO iblock backstore on the LV (enabled: LIO opens it).
    let hba = "/sys/kernel/config/target/core/iblock_72";
    for path in [&dev, &mapper] {
        let core = format!("{hba}/old-{pid}");
        sh(&format!(
            "mkdir -p {core} && echo udev_path={path} > {core}/control && printf %s {path} > {core}/udev_path && echo 1 > {core}/enable"
        ));
        let before = unchanged(&agent, &vg, &name);
        let r = client
            .create_volume(import_request(&ident, "uid-busy"))
            .await;
        let after = unchanged(&agent, &vg, &name);
        let marked = mark_file(&agent, &id).exists();
        sh(&format!("rmdir {core} && rmdir {hba}"));
        let message = grpc_refusal(r);
        note(&lab, &message);
        assert_eq!(
            message,
            refused(format!("in use: LIO backstore iblock_72/old-{pid} still points at {path}; remove the old driver's export (targetcli delete) first"))
        );
        assert!(!marked, "no fence mark written");
        assert_eq!(after, before);
    }

    // An nvmet namespace exporting the LV.
    let nqn = format!("nqn.2014-08.org.example:old-lv-{pid}");
    let sub = format!("/sys/kernel/config/nvmet/subsystems/{nqn}");
    for path in [&dev, &dm] {
        sh(&format!(
            "mkdir {sub} && mkdir {sub}/namespaces/1 && printf %s {path} > {sub}/namespaces/1/device_path && echo 1 > {sub}/namespaces/1/enable"
        ));
        let before = unchanged(&agent, &vg, &name);
        let r = client
            .create_volume(import_request(&ident, "uid-busy"))
            .await;
        let after = unchanged(&agent, &vg, &name);
        let marked = mark_file(&agent, &id).exists();
        sh(&format!(
            "echo 0 > {sub}/namespaces/1/enable && rmdir {sub}/namespaces/1 && rmdir {sub}"
        ));
        let message = grpc_refusal(r);
        note(&lab, &message);
        assert_eq!(
            message,
            refused(format!(
                "in use: nvmet subsystem {nqn} namespace 1 still exports {path}; remove the export first"
            ))
        );
        assert!(!marked, "no fence mark written");
        assert_eq!(after, before);
    }

    // Mounted.
    sh(&format!("mount {dev} {}", mnt.display()));
    let before = unchanged(&agent, &vg, &name);
    let r = client
        .create_volume(import_request(&ident, "uid-busy"))
        .await;
    let after = unchanged(&agent, &vg, &name);
    let marked = mark_file(&agent, &id).exists();
    let still_mounted = fs::read_to_string(mnt.join("data.txt"));
    sh(&format!("umount {}", mnt.display()));
    let message = grpc_refusal(r);
    note(&lab, &message);
    assert_eq!(
        message,
        refused(format!(
            "in use: device {dev} is mounted at {}; unmount it first",
            mnt.display()
        ))
    );
    assert!(!marked, "no fence mark written");
    assert_eq!(after, before, "the mount and everything else stay");
    assert_eq!(still_mounted?, "legacy data\n");

    // Nothing was recorded; the LV is the same; once idle it is adopted.
    assert_eq!(lv_identity(&vg, &name), ident);
    assert!(!mark_file(&agent, &id).exists());
    client
        .create_volume(import_request(&ident, "uid-busy"))
        .await?;
    assert!(mark_file(&agent, &id).exists());
    client
        .release_volume(pb::ReleaseVolumeRequest {
            volume_id: id.clone(),
            backend_type: LVM,
            fence: fence("uid-busy", 1),
        })
        .await?;
    assert_eq!(lv_identity(&vg, &name), ident);
    assert_eq!(read_file_on(&dev, "data.txt"), "legacy data\n");
    drop(agent);
    sh(&format!("lvremove -q -y {id}"));
    Ok(())
}

/// InspectVolume as the spec's grpcurl + jq commands read it: the request
/// in .proto field names, the answer as proto3 JSON with defaults, read
/// through the camelCase paths the spec's jq programs use. Each answer is
/// kept in the work folder (`inspect-<step>.json`).
fn inspect_json(lab: &Lab, agent: &AgentProcess, id: &str, step: &str) -> serde_json::Value {
    let request = format!(r#"{{"volume_id": "{id}", "backend_type": "BACKEND_TYPE_LVM"}}"#);
    let (status, out, err) = agent_json(lab, agent, &request);
    assert_eq!(status, 0, "agent_json.py failed: {err}");
    fs::write(lab.work.join(format!("inspect-{step}.json")), &out).unwrap();
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the kernel lab"]
async fn adopt_lv_inspect_json_from_an_independent_grpc_client() -> R {
    use serde_json::json;
    let lab = Lab::get();
    let vg = lab.vg.clone();
    let name = lab.unique("json").replace('-', "_");
    make_lv_with_xfs(&vg, &name);
    let id = format!("{vg}/{name}");
    let dev = format!("/dev/{id}");
    let lvs = |field: &str| {
        sh(&format!("lvs --noheadings -o {field} {id}"))
            .trim()
            .to_owned()
    };
    let (lv_uuid, vg_uuid) = (lvs("lv_uuid"), lvs("vg_uuid"));
    let fs_type = sh(&format!("blkid -p -o value -s TYPE {dev}"))
        .trim()
        .to_owned();
    let agent = agent_process(&lab, "adopt-json", format!("lvm={vg}")).await;
    let mut client = agent.client().await?;

    // Before any import: no record; the LV as lvs and blkid see it.
    let j = inspect_json(&lab, &agent, &id, "before");
    assert_eq!(j["volumeId"], json!(id));
    assert_eq!(j["fence"]["exists"], json!(false));
    assert_eq!(j["fence"]["volumeUid"], json!(""));
    assert_eq!(
        j["fence"]["generation"],
        json!("0"),
        "64-bit ints are strings"
    );
    assert_eq!(j["fence"]["endedUids"], json!([]));
    assert_eq!(j["lvm"]["identity"]["logicalVolumeUuid"], json!(lv_uuid));
    assert_eq!(j["lvm"]["identity"]["volumeGroupUuid"], json!(vg_uuid));
    assert_eq!(j["lvm"]["sizeBytes"], json!((320u64 << 20).to_string()));
    assert_eq!(j["lvm"]["exclusiveClaim"], json!("free"));
    assert_eq!(j["lvm"]["layoutRefusal"], json!(""));
    assert_eq!(j["filesystemProbeState"], json!("filesystem"));
    assert_eq!(j["filesystemType"], json!(fs_type));
    assert_eq!(j["consumers"], json!([]));
    assert_eq!(j["exports"], json!([]));

    // Imported, exported over NVMe/TCP with an ACL, one host allowed.
    let ident = lv_identity(&vg, &name);
    client
        .create_volume(import_request(&ident, "uid-json"))
        .await?;
    let target = client
        .export_volume(pb::ExportVolumeRequest {
            volume_id: id.clone(),
            backend_type: LVM,
            protocol_type: pb::ProtocolType::NvmeofTcp as i32,
            fence: fence("uid-json", 1),
            acl_enabled: true,
            allowed_initiators: vec![],
            chap: None,
        })
        .await?
        .into_inner()
        .target_id;
    client
        .allow_initiator(pb::AllowInitiatorRequest {
            volume_id: id.clone(),
            protocol_type: pb::ProtocolType::NvmeofTcp as i32,
            initiator_id: HOST_NQN.into(),
            fence: fence("uid-json", 1),
        })
        .await?;
    let j = inspect_json(&lab, &agent, &id, "exported");
    assert_eq!(j["fence"]["exists"], json!(true));
    assert_eq!(j["fence"]["ended"], json!(false));
    assert_eq!(j["fence"]["volumeUid"], json!("uid-json"));
    assert_eq!(j["fence"]["generation"], json!("1"));
    assert_eq!(j["fence"]["preserveOriginal"], json!(true));
    assert_eq!(j["fence"]["lvmSource"]["logicalVolumeUuid"], json!(lv_uuid));
    assert_eq!(j["fence"]["lvmSource"]["volumeGroupUuid"], json!(vg_uuid));
    assert_eq!(j["fence"]["lvmSource"]["logicalVolume"], json!(name));
    assert_eq!(j["lvm"]["identity"]["logicalVolumeUuid"], json!(lv_uuid));
    assert_eq!(j["filesystemProbeState"], json!("filesystem"));
    let configfs_hosts = sh(&format!(
        "ls /sys/kernel/config/nvmet/subsystems/{target}/allowed_hosts"
    ));
    assert_eq!(
        configfs_hosts.split_whitespace().collect::<Vec<_>>(),
        [HOST_NQN]
    );
    assert_eq!(
        j["exports"],
        json!([{
            "protocolType": "PROTOCOL_TYPE_NVMEOF_TCP",
            "targetId": target,
            "managed": true,
            "allowedHosts": [HOST_NQN],
            "allowAnyHost": false,
        }])
    );
    assert_eq!(j["consumers"], json!([]));

    // The lifecycle ended (PreserveOriginal: the LV stays), then mounted.
    client
        .delete_volume(pb::DeleteVolumeRequest {
            volume_id: id.clone(),
            backend_type: LVM,
            fence: fence("uid-json", 1),
        })
        .await?;
    let mnt = mkdir_tmp();
    sh(&format!("mount -o ro {dev} {}", mnt.display()));
    let j = inspect_json(&lab, &agent, &id, "ended-mounted");
    sh(&format!("umount {}", mnt.display()));
    assert_eq!(j["fence"]["exists"], json!(true));
    assert_eq!(j["fence"]["ended"], json!(true));
    assert_eq!(j["fence"]["volumeUid"], json!(""));
    assert_eq!(j["fence"]["endedUids"], json!(["uid-json"]));
    assert_eq!(j["fence"]["lvmSource"]["logicalVolumeUuid"], json!(lv_uuid));
    assert_eq!(j["exports"], json!([]));
    assert_eq!(j["lvm"]["exclusiveClaim"], json!("busy"));
    let consumers = j["consumers"].as_array().unwrap();
    assert_eq!(consumers.len(), 1, "{consumers:?}");
    assert_eq!(consumers[0]["kind"], json!("mount"));
    assert_eq!(consumers[0]["detail"], json!(mnt.display().to_string()));

    // A missing LV: FAILED_PRECONDITION mentioning missing, as grpcurl
    // reports it (exit status 64 + 9).
    let gone = format!("{vg}/gone_{name}");
    let (status, out, err) = agent_json(
        &lab,
        &agent,
        &format!(r#"{{"volume_id": "{gone}", "backend_type": "BACKEND_TYPE_LVM"}}"#),
    );
    assert_eq!(status, 64 + 9, "{out}{err}");
    assert!(err.contains("Code: FailedPrecondition"), "{err}");
    assert!(
        err.contains(&format!("volume {gone}: logical volume {gone} is missing")),
        "{err}"
    );
    drop(agent);
    sh(&format!("lvremove -q -y {id}"));
    Ok(())
}
