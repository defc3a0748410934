//! Directory volumes through the agent in the kernel lab: directories on
//! an XFS mounted with `prjquota`, each bounded by a project quota, exported
//! by the kernel NFS server to the client addresses the fence admits and
//! mounted by the kernel's NFS client (NFSv3, as tests/lab/guest says).
//! Witnesses: `xfs_quota`, `exportfs -v` and the client's own system calls.
//! Run with `tests/lab/run tests -- nfs_dir_lab`.
use pillar_csi_lab::{
    agent::{pb, AgentConfig, AgentProcess},
    nfs::{exported, fill, within, NfsMount, CLIENT},
    project_fs::{project_of, ProjectFs},
    run, Lab, Result,
};
use std::{os::unix::fs::MetadataExt, path::Path, time::Duration};
use tonic::Code;

const MIB: u64 = 1 << 20;
const DIRECTORY: i32 = pb::BackendType::Directory as i32;
const NFS: i32 = pb::ProtocolType::Nfs as i32;
/// `ENOSPC` of `asm-generic/errno-base.h`.
const ENOSPC: i32 = 28;

fn fence(uid: &str, generation: u64) -> Option<pb::FenceToken> {
    Some(pb::FenceToken {
        volume_uid: uid.to_owned(),
        generation,
    })
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the kernel lab"]
async fn nfs_dir_lab_directory_volume_bounded_exported_grown_and_removed() -> Result<()> {
    let lab = Lab::get();
    let xfs = ProjectFs::xfs(&lab, "ndir", "prjquota")?;
    let root = xfs.at.join("volumes");
    std::fs::create_dir(&root)?;
    let name = lab.unique("nfsdir");
    let config = AgentConfig::new(
        &lab,
        &name,
        vec![format!("directory=dirs:{}", root.display())],
        4441,
        3281,
    )?;
    let agent = AgentProcess::start(config).await?;
    let mut c = agent.client().await?;
    let vol = lab.unique("dvol");
    let id = format!("dirs/{vol}");
    let path = root.join(&vol);
    let uid = lab.unique("uid");
    let create = |bytes: u64| pb::CreateVolumeRequest {
        volume_id: id.clone(),
        backend_type: DIRECTORY,
        capacity_bytes: bytes,
        fence: fence(&uid, 1),
        ..Default::default()
    };

    // ZFS properties do not apply: refused, nothing made.
    let mut zfs_props = create(24 * MIB);
    zfs_props
        .zfs_properties
        .insert("compression".into(), "off".into());
    let refused = c
        .create_volume(zfs_props)
        .await
        .expect_err("ZFS properties on a directory");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(!path.exists(), "a refused create made nothing");

    // Created: a directory in a project of its own, limited to the
    // capacity, as xfs_quota and statfs see it.
    let created = c.create_volume(create(24 * MIB)).await?.into_inner();
    assert_eq!(created.capacity_bytes, 24 * MIB);
    assert!(path.is_dir());
    let project = project_of(&path)?;
    assert!(
        project >= 1 << 20,
        "a project of the agent's range: {project}"
    );
    assert_eq!(xfs.xfs_limit(project)?, 24 * MIB);
    let again = c.create_volume(create(24 * MIB)).await?.into_inner();
    assert_eq!(again.capacity_bytes, 24 * MIB, "a retry returns the volume");
    assert_eq!(project_of(&path)?, project, "and changes nothing");

    // Exported to the client; it writes until the quota stops it (XFS
    // answers ENOSPC for a project's limit, which NFS carries as is).
    let info = c
        .export_volume(pb::ExportVolumeRequest {
            volume_id: id.clone(),
            backend_type: DIRECTORY,
            protocol_type: NFS,
            fence: fence(&uid, 1),
            acl_enabled: true,
            allowed_initiators: vec![CLIENT.into()],
            chap: None,
        })
        .await?
        .into_inner();
    assert_eq!(Path::new(&info.target_id), path);
    let table = exported()?;
    let shown = path.to_string_lossy().into_owned();
    assert!(
        table
            .lines()
            .any(|l| l.starts_with(&shown) && l.contains(CLIENT)),
        "{shown} to {CLIENT} in:\n{table}"
    );
    let mnt = lab.work.join(format!("{name}.mnt"));
    let mount = NfsMount::mount(&shown, &mnt)?;
    std::fs::write(mnt.join("hello"), b"through nfs")?;
    assert_eq!(std::fs::read(path.join("hello"))?, b"through nfs");
    let big = mnt.join("big");
    let err = within(Duration::from_secs(120), move || fill(&big, 40))
        .expect_err("40 MiB into a 24 MiB project");
    assert_eq!(
        err.raw_os_error(),
        Some(ENOSPC),
        "ENOSPC over NFS, got {err}"
    );
    std::fs::remove_file(path.join("big"))?;

    // Grown: the limit and the client's statfs follow.
    let grown = c
        .expand_volume(pb::ExpandVolumeRequest {
            volume_id: id.clone(),
            backend_type: DIRECTORY,
            requested_bytes: 48 * MIB,
            fence: fence(&uid, 1),
        })
        .await?
        .into_inner();
    assert_eq!(grown.capacity_bytes, 48 * MIB);
    assert_eq!(xfs.xfs_limit(project)?, 48 * MIB);
    let statfs = run("stat", &["-f", "-c", "%b %S", &mnt.to_string_lossy()])?;
    let (blocks, size) = statfs.trim().split_once(' ').unwrap_or_default();
    assert_eq!(
        blocks.parse::<u64>()? * size.parse::<u64>()?,
        48 * MIB,
        "the client's statfs"
    );
    drop(mount);

    c.unexport_volume(pb::UnexportVolumeRequest {
        volume_id: id.clone(),
        protocol_type: NFS,
        fence: fence(&uid, 1),
    })
    .await?;
    assert!(!exported()?.contains(&shown));

    // Removed behind the agent's back and made again under the same
    // path: not the volume (the pinned inode and project), never deleted.
    let pinned_inode = std::fs::metadata(&path)?.ino();
    let moved = root.join(format!("{vol}.moved"));
    std::fs::rename(&path, &moved)?;
    std::fs::create_dir(&path)?;
    std::fs::write(path.join("other"), b"someone else's")?;
    assert_ne!(std::fs::metadata(&path)?.ino(), pinned_inode);
    let delete = pb::DeleteVolumeRequest {
        volume_id: id.clone(),
        backend_type: DIRECTORY,
        fence: fence(&uid, 1),
    };
    let impostor = c
        .delete_volume(delete.clone())
        .await
        .expect_err("another directory under the volume's path");
    assert_eq!(impostor.code(), Code::FailedPrecondition, "{impostor:?}");
    assert!(impostor.message().contains("identity:"), "{impostor:?}");
    assert_eq!(std::fs::read(path.join("other"))?, b"someone else's");
    std::fs::remove_dir_all(&path)?;
    std::fs::rename(&moved, &path)?;

    // Deleted: the tree is gone and the project's limit with it.
    std::fs::create_dir_all(path.join("a/b"))?;
    std::fs::write(path.join("a/b/c"), b"x")?;
    c.delete_volume(delete.clone()).await?;
    assert!(!path.exists(), "{} removed", path.display());
    assert_eq!(xfs.xfs_limit(project)?, 0, "the project's limit removed");
    c.delete_volume(delete)
        .await
        .map_err(|e| format!("a repeated delete succeeds: {e:?}"))?;
    drop(agent);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the kernel lab"]
async fn nfs_dir_lab_a_directory_without_project_quotas_stops_the_agent() -> Result<()> {
    let lab = Lab::get();
    let xfs = ProjectFs::xfs(&lab, "ndiroff", "defaults")?;
    let name = lab.unique("nfsdiroff");
    let config = AgentConfig::new(
        &lab,
        &name,
        vec![format!("directory=dirs:{}", xfs.at.display())],
        4442,
        3282,
    )?;
    let err = AgentProcess::start(config)
        .await
        .expect_err("an agent on a filesystem without prjquota");
    let text = err.to_string();
    assert!(text.contains("prjquota"), "{text}");
    Ok(())
}
