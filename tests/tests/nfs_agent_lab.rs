//! Filesystem volumes through the agent in the kernel lab: ZFS filesystems
//! bounded by their refquota, exported by the kernel NFS server to the
//! client addresses the fence admits, mounted by the kernel's NFS client
//! (NFSv3 in the lab: see tests/lab/guest).
//! Witnesses: the `zfs` CLI, `exportfs -v` (the kernel's table as mountd
//! holds it) and the client's own system calls. Run with
//! `tests/lab/run tests -- nfs_agent_lab`.
use pillar_csi_lab::{
    agent::{pb, AgentConfig, AgentProcess},
    run, Lab, Result,
};
use std::{
    io::Write,
    path::{Path, PathBuf},
    time::Duration,
};
use tonic::Code;

const MIB: u64 = 1 << 20;
const DATASET: i32 = pb::BackendType::ZfsDataset as i32;
const NFS: i32 = pb::ProtocolType::Nfs as i32;
const NVME: i32 = pb::ProtocolType::NvmeofTcp as i32;
/// The client: the guest itself, over loopback.
const CLIENT: &str = "127.0.0.1";

fn fence(uid: &str, generation: u64) -> Option<pb::FenceToken> {
    Some(pb::FenceToken {
        volume_uid: uid.to_owned(),
        generation,
    })
}

fn zget(ds: &str, prop: &str) -> Result<String> {
    Ok(run("zfs", &["get", "-Hp", "-o", "value", prop, ds])?
        .trim()
        .to_owned())
}

/// A parent filesystem mounted under `/run` (the lab's pool mounts
/// nothing), destroyed with everything below it when dropped.
struct Parent {
    dataset: String,
    at: PathBuf,
}

impl Parent {
    fn create(lab: &Lab, prefix: &str) -> Result<Self> {
        let unique = lab.unique(prefix);
        let at = PathBuf::from("/run/pillar-lab-fs").join(&unique);
        let dataset = format!("{}/{unique}", lab.pool);
        run(
            "zfs",
            &[
                "create",
                "-o",
                &format!("mountpoint={}", at.display()),
                &dataset,
            ],
        )?;
        Ok(Self { dataset, at })
    }
}

impl Drop for Parent {
    fn drop(&mut self) {
        let _ = run("zfs", &["destroy", "-r", "-f", &self.dataset]);
    }
}

/// The kernel's export table as `exportfs -v` prints it, one export per
/// line (it wraps long ones).
fn exported() -> Result<String> {
    Ok(run("exportfs", &["-v"])?.replace("\n\t\t", " "))
}

/// An NFSv3 mount of `path` from the guest's own server at `at` (see
/// tests/lab/guest: NFSv4 walks from a root this guest cannot export),
/// hard, with short retries so a refused client fails fast; no lock
/// manager (rpc.statd does not run in the lab).
struct NfsMount(PathBuf);

impl NfsMount {
    fn mount(path: &str, at: &Path) -> Result<Self> {
        std::fs::create_dir_all(at)?;
        run(
            "mount",
            &[
                "-t",
                "nfs",
                "-o",
                "vers=3,proto=tcp,mountproto=tcp,nolock,hard,timeo=50,retrans=2",
                &format!("{CLIENT}:{path}"),
                &at.to_string_lossy(),
            ],
        )?;
        Ok(Self(at.to_owned()))
    }
}

impl Drop for NfsMount {
    fn drop(&mut self) {
        // A plain unmount, so the client is gone when it returns (a lazy
        // one could keep retrying its writes into the next steps).
        let at = self.0.to_string_lossy().into_owned();
        if let Err(e) = run("umount", &[&at]) {
            println!("nfs_agent_lab: umount {at}: {e}; detaching it");
            let _ = run("umount", &["-f", "-l", &at]);
        }
    }
}

/// `zfs unmount`, tried again after the NFS server's caches are purged:
/// they hold the mount of a filesystem a client used.
fn unmount(ds: &str) -> Result<()> {
    let mut tries = 0;
    loop {
        match run("zfs", &["unmount", ds]) {
            Err(e) if tries < 3 && e.to_string().contains("busy") => {
                tries += 1;
                sys::nfsd::purge_caches(Duration::from_secs(20))?;
            }
            Err(e) => return Err(format!("{e}; {}", holders(ds)).into()),
            Ok(_) => return Ok(()),
        }
    }
}

/// What may hold the mount of `ds`: processes with a file or folder in it,
/// and the NFS server's cache entries naming it.
fn holders(ds: &str) -> String {
    let at = zget(ds, "mountpoint").unwrap_or_default();
    let mut found = Vec::new();
    for p in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let pid = p.file_name().to_string_lossy().into_owned();
        let links = std::fs::read_dir(p.path().join("fd"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|f| f.path())
            .chain([p.path().join("cwd"), p.path().join("root")]);
        for l in links {
            if let Ok(t) = std::fs::read_link(&l) {
                if t.starts_with(&at) {
                    let comm = std::fs::read_to_string(p.path().join("comm")).unwrap_or_default();
                    found.push(format!("{pid} ({}) {}", comm.trim(), t.display()));
                }
            }
        }
    }
    for cache in ["nfsd.export", "nfsd.fh"] {
        let content =
            std::fs::read_to_string(format!("/proc/net/rpc/{cache}/content")).unwrap_or_default();
        found.extend(
            content
                .lines()
                .filter(|l| l.contains(&at))
                .map(|l| format!("{cache}: {l}")),
        );
    }
    format!("held by: [{}]", found.join("; "))
}

/// Runs `f` on another thread; its result, or an error after `limit`
/// (a call that hangs on a hard mount is a failure too).
fn within<T: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).unwrap_or_else(|_| {
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer in {limit:?}"),
        ))
    })
}

/// Writes `mib` MiB of incompressible bytes to `path` and syncs them.
fn fill(path: &Path, mib: u64) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    let mut block = vec![0u8; MIB as usize];
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..mib {
        for b in block.iter_mut() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *b = state as u8;
        }
        f.write_all(&block)?;
    }
    f.sync_all()
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the kernel lab"]
async fn nfs_agent_lab_filesystem_volume_exported_fenced_and_destroyed() -> Result<()> {
    let lab = Lab::get();
    let parent = Parent::create(&lab, "nfsa")?;
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

    // Exported to the client; the kernel's table has it.
    let info = c
        .export_volume(export(vec![CLIENT.into()]))
        .await?
        .into_inner();
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
async fn nfs_agent_lab_adopted_filesystem_refusals_and_preservation() -> Result<()> {
    let lab = Lab::get();
    let parent = Parent::create(&lab, "nfsi")?;
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
    assert!(grow.message().contains("never resized"), "{grow:?}");
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
