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
/// `EXDEV` of `asm-generic/errno-base.h`.
const EXDEV: i32 = 18;

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

/// What an adoption must leave as it was: the directory's inode, mode,
/// owner and project, the project's limit, and the data.
fn fingerprint(xfs: &ProjectFs, dir: &Path) -> Result<String> {
    let meta = std::fs::symlink_metadata(dir)?;
    let project = project_of(dir)?;
    let data = run("sha256sum", &[&dir.join("data.bin").to_string_lossy()])?;
    Ok(format!(
        "inode {} mode {:o} owner {}:{} project {project} limit {} data {}",
        meta.ino(),
        meta.mode(),
        meta.uid(),
        meta.gid(),
        xfs.xfs_limit(project)?,
        data.split(' ').next().unwrap_or_default()
    ))
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the kernel lab"]
async fn nfs_dir_lab_adopted_directory_refusals_and_preservation() -> Result<()> {
    let lab = Lab::get();
    let xfs = ProjectFs::xfs(&lab, "ndirimp", "prjquota")?;
    let root = xfs.at.join("volumes");
    std::fs::create_dir(&root)?;
    let name = lab.unique("nfsdirimp");
    let config = AgentConfig::new(
        &lab,
        &name,
        vec![format!("directory=dirs:{}", root.display())],
        4443,
        3283,
    )?;
    let agent = AgentProcess::start(config).await?;
    let mut c = agent.client().await?;
    // An existing directory holding data, as another tool left it: its
    // own mode and owner, in no project yet.
    let leaf = lab.unique("legacy");
    let dir = root.join(&leaf);
    std::fs::create_dir(&dir)?;
    fill(&dir.join("data.bin"), 8)?;
    run("chown", &["-R", "1234:1234", &dir.to_string_lossy()])?;
    run("chmod", &["0750", &dir.to_string_lossy()])?;
    let id = format!("dirs/{leaf}");
    let uid = lab.unique("uid");
    let import = |path: &Path, bytes: u64| pb::CreateVolumeRequest {
        volume_id: id.clone(),
        backend_type: DIRECTORY,
        capacity_bytes: bytes,
        fence: fence(&uid, 1),
        import_directory: path.to_string_lossy().into_owned(),
        ..Default::default()
    };
    let refused = |request: pb::CreateVolumeRequest, expect: &'static str| {
        let mut c = c.clone();
        async move {
            let err = c
                .create_volume(request)
                .await
                .expect_err("a refused import");
            assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
            assert!(err.message().contains(expect), "{expect:?} in {err:?}");
        }
    };

    // The exact quota prerequisite, step by step as an operator meets it;
    // each refusal names what to change and changes nothing.
    let before = fingerprint(&xfs, &dir)?;
    refused(import(&dir, 40 * MIB), "is in no project").await;
    run("xfs_io", &["-c", "chproj 77", &dir.to_string_lossy()])?;
    refused(import(&dir, 40 * MIB), "without the inherit flag").await;
    xfs.xfs_project(&dir, 77, 40)?;
    let prepared = fingerprint(&xfs, &dir)?;
    assert_eq!(
        before.replace("project 0 limit 0", "project 77 limit 41943040"),
        prepared,
        "the operator's xfs_quota changed the project and its limit only"
    );
    // XFS keeps the tree in its project, as the README says: a rename into
    // it from another project (the filesystem's root, project 0) is
    // refused with EXDEV, so `mv` copies and the copy is counted.
    let outside = xfs.at.join(format!("{leaf}.outside"));
    std::fs::write(&outside, b"elsewhere")?;
    let moved = std::fs::rename(&outside, dir.join("moved")).expect_err("a rename across projects");
    assert_eq!(moved.raw_os_error(), Some(EXDEV), "EXDEV, got {moved}");
    std::fs::remove_file(&outside)?;
    refused(
        import(&dir, 32 * MIB),
        "has a hard limit of 41943040 bytes, requested capacity is 33554432 bytes; they must be equal",
    )
    .await;
    let elsewhere = xfs.at.join(&leaf);
    std::fs::create_dir(&elsewhere)?;
    refused(import(&elsewhere, 40 * MIB), "is not directly under").await;
    refused(
        import(&root.join(format!("{leaf}-other")), 40 * MIB),
        "layout: expected directory",
    )
    .await;
    let gone = lab.unique("gone");
    refused(
        pb::CreateVolumeRequest {
            volume_id: format!("dirs/{gone}"),
            ..import(&root.join(&gone), 40 * MIB)
        },
        "missing: directory",
    )
    .await;
    let link = lab.unique("link");
    std::os::unix::fs::symlink(&dir, root.join(&link))?;
    refused(
        pb::CreateVolumeRequest {
            volume_id: format!("dirs/{link}"),
            ..import(&root.join(&link), 40 * MIB)
        },
        "wrong type:",
    )
    .await;
    // Another filesystem mounted on a directory under the backend's path
    // is not bounded by the backend's quota.
    let mounted = lab.unique("mounted");
    let other_fs = root.join(&mounted);
    std::fs::create_dir(&other_fs)?;
    run(
        "mount",
        &[
            "-t",
            "tmpfs",
            "-o",
            "size=8m",
            "tmpfs",
            &other_fs.to_string_lossy(),
        ],
    )?;
    refused(
        pb::CreateVolumeRequest {
            volume_id: format!("dirs/{mounted}"),
            ..import(&other_fs, 40 * MIB)
        },
        "mount: ",
    )
    .await;
    run("umount", &[&other_fs.to_string_lossy()])?;
    let bad = c
        .create_volume(import(Path::new("relative/dir"), 40 * MIB))
        .await
        .expect_err("a relative path");
    assert_eq!(bad.code(), Code::InvalidArgument, "{bad:?}");
    // A plain create never takes an operator's directory in a project.
    let plain = c
        .create_volume(pb::CreateVolumeRequest {
            import_directory: String::new(),
            ..import(&dir, 40 * MIB)
        })
        .await
        .expect_err("an operator's directory is not a new volume");
    assert_eq!(plain.code(), Code::AlreadyExists, "{plain:?}");
    assert!(plain.message().contains("import it instead"), "{plain:?}");
    assert_eq!(
        fingerprint(&xfs, &dir)?,
        prepared,
        "refusals changed nothing"
    );

    // Adopted: exported, the client reads the data as it was and is
    // stopped by the project's limit.
    let state = c.create_volume(import(&dir, 40 * MIB)).await?.into_inner();
    assert_eq!(state.capacity_bytes, 40 * MIB);
    let again = c.create_volume(import(&dir, 40 * MIB)).await?.into_inner();
    assert_eq!(again.capacity_bytes, 40 * MIB, "a retry returns the volume");
    let export = |uid: &str| pb::ExportVolumeRequest {
        volume_id: id.clone(),
        backend_type: DIRECTORY,
        protocol_type: NFS,
        fence: fence(uid, 1),
        acl_enabled: true,
        allowed_initiators: vec![CLIENT.into()],
        chap: None,
    };
    let info = c.export_volume(export(&uid)).await?.into_inner();
    assert_eq!(Path::new(&info.target_id), dir);
    let mnt = lab.work.join(format!("{name}.mnt"));
    let mount = NfsMount::mount(&info.target_id, &mnt)?;
    let seen = run("sha256sum", &[&mnt.join("data.bin").to_string_lossy()])?;
    assert!(
        prepared.ends_with(seen.split(' ').next().unwrap_or("-")),
        "the client reads the data as it was"
    );
    let big = mnt.join("big");
    let err = within(Duration::from_secs(120), move || fill(&big, 40))
        .expect_err("40 MiB more into a 40 MiB project holding 8");
    assert_eq!(err.raw_os_error(), Some(ENOSPC), "got {err}");
    std::fs::remove_file(dir.join("big"))?;
    drop(mount);

    // Never resized; deleted, it stays as it was and is no longer served.
    let grow = c
        .expand_volume(pb::ExpandVolumeRequest {
            volume_id: id.clone(),
            backend_type: DIRECTORY,
            requested_bytes: 80 * MIB,
            fence: fence(&uid, 1),
        })
        .await
        .expect_err("an adopted directory is never resized");
    assert!(
        grow.message().contains("raise its project's hard limit"),
        "{grow:?}"
    );
    c.delete_volume(pb::DeleteVolumeRequest {
        volume_id: id.clone(),
        backend_type: DIRECTORY,
        fence: fence(&uid, 1),
    })
    .await?;
    assert_eq!(
        fingerprint(&xfs, &dir)?,
        prepared,
        "deleted, kept as it was"
    );
    assert!(!exported()?.contains(&info.target_id), "and not exported");
    let plain = c
        .create_volume(pb::CreateVolumeRequest {
            import_directory: String::new(),
            fence: fence(&lab.unique("uid"), 1),
            ..import(&dir, 40 * MIB)
        })
        .await
        .expect_err("the pin outlives the lifecycle");
    assert!(
        plain.message().contains("always kept as it is"),
        "{plain:?}"
    );

    // A new lifecycle adopts it again. Its inode is pinned: another
    // directory made under its name, even in the same project, is not
    // the adopted one, and is not exported.
    let uid2 = lab.unique("uid");
    c.create_volume(pb::CreateVolumeRequest {
        fence: fence(&uid2, 1),
        ..import(&dir, 40 * MIB)
    })
    .await?;
    let away = root.join(format!("{leaf}.away"));
    std::fs::rename(&dir, &away)?;
    std::fs::create_dir(&dir)?;
    xfs.xfs_project(&dir, 77, 40)?;
    let err = c
        .export_volume(export(&uid2))
        .await
        .expect_err("a re-made directory is not the adopted one");
    assert!(err.message().contains("identity: directory"), "{err:?}");
    assert!(!exported()?.contains(&info.target_id), "nothing exported");
    std::fs::remove_dir(&dir)?;
    std::fs::rename(&away, &dir)?;
    c.release_volume(pb::ReleaseVolumeRequest {
        volume_id: id.clone(),
        backend_type: DIRECTORY,
        fence: fence(&uid2, 1),
    })
    .await?;
    assert_eq!(
        fingerprint(&xfs, &dir)?,
        prepared,
        "released, kept as it was"
    );
    drop(agent);
    Ok(())
}
