//! Filesystem volumes through the agent in the kernel lab: ZFS filesystems
//! bounded by their refquota, exported by the kernel NFS server to the
//! client addresses the fence admits, mounted by the kernel's NFS client
//! (NFSv3 in the lab: see tests/lab/guest). Witnesses: the `zfs` CLI,
//! `exportfs -v` (the kernel's table as mountd holds it) and the client's
//! own system calls. Run with `tests/lab/run tests -- nfs_agent_lab`.
use pillar_csi_lab::{
    agent::{pb, AgentConfig, AgentProcess},
    nfs::{exported, fill, holders, unmount, within, zget, FsParent, NfsMount, CLIENT},
    run, Lab, Result,
};
use std::{path::Path, time::Duration};
use tonic::Code;

const MIB: u64 = 1 << 20;
const DATASET: i32 = pb::BackendType::ZfsDataset as i32;
const NFS: i32 = pb::ProtocolType::Nfs as i32;
const NVME: i32 = pb::ProtocolType::NvmeofTcp as i32;

fn fence(uid: &str, generation: u64) -> Option<pb::FenceToken> {
    Some(pb::FenceToken {
        volume_uid: uid.to_owned(),
        generation,
    })
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the kernel lab"]
async fn nfs_agent_lab_filesystem_volume_exported_fenced_and_destroyed() -> Result<()> {
    let lab = Lab::get();
    let parent = FsParent::create(&lab, "nfsa")?;
    let name = lab.unique("nfsagent");
    let config = AgentConfig::new(
        &lab,
        &name,
        vec![format!("zfs-dataset={}", parent.dataset)],
        4431,
        3271,
    )?;
    let mut agent = AgentProcess::start(config).await?;
    let health = agent.health().clone();
    assert!(
        health
            .components
            .iter()
            .any(|c| c.name == "nfsd" && c.healthy),
        "the NFS server is a healthy component: {health:?}"
    );
    let mut c = agent.client().await?;
    let pool = parent
        .dataset
        .split('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    let id = format!("{pool}/{}", lab.unique("fsvol"));
    let volume = format!(
        "{}/{}",
        parent.dataset,
        id.split('/').nth(1).unwrap_or_default()
    );
    let uid = lab.unique("uid");

    // Created: a filesystem with its refquota, mounted under the parent.
    let created = c
        .create_volume(pb::CreateVolumeRequest {
            volume_id: id.clone(),
            backend_type: DATASET,
            capacity_bytes: 48 * MIB,
            fence: fence(&uid, 1),
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(created.capacity_bytes, 48 * MIB);
    assert_eq!(zget(&volume, "type")?, "filesystem");
    assert_eq!(zget(&volume, "refquota")?, (48 * MIB).to_string());
    assert_eq!(zget(&volume, "mounted")?, "yes");
    let path = zget(&volume, "mountpoint")?;
    assert_eq!(
        Path::new(&path),
        parent.at.join(id.split('/').nth(1).unwrap_or_default())
    );

    // A filesystem is not served as a block device.
    let nvme = c
        .export_volume(pb::ExportVolumeRequest {
            volume_id: id.clone(),
            backend_type: DATASET,
            protocol_type: NVME,
            fence: fence(&uid, 1),
            acl_enabled: true,
            allowed_initiators: vec!["nqn.2014-08.org.example:host".into()],
            chap: None,
        })
        .await
        .expect_err("a filesystem over NVMe/TCP must be refused");
    assert_eq!(nvme.code(), Code::InvalidArgument, "{nvme:?}");
    assert!(nvme.message().contains("is a filesystem"), "{nvme:?}");
    let export = |clients: Vec<String>| pb::ExportVolumeRequest {
        volume_id: id.clone(),
        backend_type: DATASET,
        protocol_type: NFS,
        fence: fence(&uid, 1),
        acl_enabled: true,
        allowed_initiators: clients,
        chap: None,
    };
    let bad = c
        .export_volume(export(vec!["10.0.0.0/8".into()]))
        .await
        .expect_err("a network is not a client address");
    assert_eq!(bad.code(), Code::InvalidArgument, "{bad:?}");
    assert!(
        !exported()?.contains(&path),
        "a refused export changed nothing"
    );

    // Exported to the client; the kernel's table has it, though another
    // exports file names a filesystem destroyed outside pillar-csi
    // (exportfs -r then fails on that line alone).
    let stale = format!("/etc/exports.d/pillar-csi@{name}@gone.exports");
    std::fs::write(
        &stale,
        format!("/run/pillar-lab-fs/{name}-gone {CLIENT}(rw,sync,no_subtree_check)\n"),
    )?;
    let exported_beside = c.export_volume(export(vec![CLIENT.into()])).await;
    std::fs::remove_file(&stale)?;
    let info = exported_beside?.into_inner();
    assert_eq!(info.target_id, path);
    let table = exported()?;
    assert!(
        table
            .lines()
            .any(|l| l.starts_with(&path) && l.contains(CLIENT)),
        "{path} to {CLIENT} in:\n{table}"
    );

    // The client writes through NFS; the bytes are the filesystem's.
    let mnt = lab.work.join(format!("{name}.mnt"));
    let mount = NfsMount::mount(&path, &mnt)?;
    std::fs::write(mnt.join("hello"), b"through nfs")?;
    assert_eq!(
        std::fs::read(Path::new(&path).join("hello"))?,
        b"through nfs"
    );
    // The quota holds over NFS: a write past it fails with EDQUOT.
    let big = mnt.join("big");
    let err = within(Duration::from_secs(120), move || fill(&big, 64))
        .expect_err("64 MiB into a 48 MiB refquota");
    assert_eq!(err.raw_os_error(), Some(122), "EDQUOT over NFS, got {err}");
    // Freed on the storage node: an unlink through NFS of a filesystem at
    // its quota can itself fail with EDQUOT (seen here; see the note of
    // issue 43).
    std::fs::remove_file(Path::new(&path).join("big"))?;

    // Grown: the client sees the new size.
    c.expand_volume(pb::ExpandVolumeRequest {
        volume_id: id.clone(),
        backend_type: DATASET,
        requested_bytes: 96 * MIB,
        fence: fence(&uid, 1),
    })
    .await?;
    assert_eq!(zget(&volume, "refquota")?, (96 * MIB).to_string());
    let statfs = run("stat", &["-f", "-c", "%b %S", &mnt.to_string_lossy()])?;
    let (blocks, size) = statfs.trim().split_once(' ').unwrap_or_default();
    let total = blocks.parse::<u64>()? * size.parse::<u64>()?;
    assert!(
        total > 64 * MIB && total <= 96 * MIB,
        "the client sees the grown quota: {total} bytes"
    );

    // Denied: the client's calls fail at once, the data stays.
    c.deny_initiator(pb::DenyInitiatorRequest {
        volume_id: id.clone(),
        protocol_type: NFS,
        initiator_id: CLIENT.into(),
        fence: fence(&uid, 1),
    })
    .await?;
    assert!(!exported()?.contains(&path), "no client left in the table");
    let denied = mnt.join("after-deny");
    let write = within(Duration::from_secs(60), move || {
        std::fs::write(&denied, b"must not land")
    });
    let refused = write.expect_err("a denied client cannot write");
    println!("nfs_agent_lab: the denied client's write failed with {refused}");
    assert_ne!(
        refused.kind(),
        std::io::ErrorKind::TimedOut,
        "the denied client's write fails, it does not hang"
    );
    assert!(!Path::new(&path).join("after-deny").exists());
    drop(mount);

    // A storage node that lost the export and the mount (its exports
    // file gone with a reinstalled /etc, the filesystem unmounted): the
    // restarted agent mounts and exports again from its marks.
    c.allow_initiator(pb::AllowInitiatorRequest {
        volume_id: id.clone(),
        protocol_type: NFS,
        initiator_id: CLIENT.into(),
        fence: fence(&uid, 1),
    })
    .await?;
    agent.kill()?;
    let file = format!("/etc/exports.d/pillar-csi@{}.exports", id.replace('/', "@"));
    assert!(Path::new(&file).exists(), "{file}");
    std::fs::remove_file(&file)?;
    // exportfs -r alone leaves the kernel's caches holding the mount.
    run("exportfs", &["-r"])?;
    unmount(&volume)?;
    assert!(!exported()?.contains(&path));
    agent.restart().await?;
    assert_eq!(zget(&volume, "mounted")?, "yes", "mounted again at start");
    assert!(exported()?.contains(&path), "exported again at start");
    let mut c = agent.client().await?;
    let again = NfsMount::mount(&path, &mnt)?;
    assert_eq!(std::fs::read(mnt.join("hello"))?, b"through nfs");
    drop(again);

    // Unexported, then destroyed with its mount.
    c.unexport_volume(pb::UnexportVolumeRequest {
        volume_id: id.clone(),
        protocol_type: NFS,
        fence: fence(&uid, 1),
    })
    .await?;
    assert!(!exported()?.contains(&path));
    assert!(std::fs::read_dir("/etc/exports.d")?.flatten().all(|e| !e
        .file_name()
        .to_string_lossy()
        .contains(id.split('/').nth(1).unwrap_or("-"))));
    let delete = pb::DeleteVolumeRequest {
        volume_id: id.clone(),
        backend_type: DATASET,
        fence: fence(&uid, 1),
    };
    if let Err(e) = c.delete_volume(delete).await {
        return Err(format!("{e:?}; {}", holders(&volume)).into());
    }
    assert!(
        run("zfs", &["list", &volume]).is_err(),
        "{volume} destroyed"
    );
    Ok(())
}
