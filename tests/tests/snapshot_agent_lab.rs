//! Snapshots and clones through the agent on the lab's real ZFS and LVM
//! thin pool: the data
//! a snapshot and each clone hold, every order of deleting a source volume,
//! its snapshot, a clone of the snapshot and a clone of the volume on ZFS,
//! and on LVM, whose thin snapshots depend on nothing, each object first
//! and last once (each
//! object keeps its data until deleted, and at the end nothing is left:
//! no dataset, no snapshot, no record), the refusals around snapshots the
//! agent did not take, and retries. Run with `tests/lab/run tests --
//! snapshot_agent`.
use pillar_csi_lab::{
    agent::{pb, AgentConfig, AgentProcess, Client, ZfsParent},
    block::{pattern, read_at, write_at},
    run, Lab, Result,
};
use std::path::Path;
use tonic::Code;

const NVME_PORT: u16 = 4436;
const ISCSI_PORT: u16 = 3276;
const ZVOL: i32 = pb::BackendType::ZfsZvol as i32;
const LVM: i32 = pb::BackendType::Lvm as i32;
const SIZE: u64 = 16 << 20;
const CHUNK: usize = 64 << 10;

fn fence(uid: &str) -> Option<pb::FenceToken> {
    Some(pb::FenceToken {
        volume_uid: uid.to_owned(),
        generation: 1,
    })
}

fn create(id: &str, uid: &str, bytes: u64) -> pb::CreateVolumeRequest {
    pb::CreateVolumeRequest {
        volume_id: id.to_owned(),
        backend_type: 0,
        capacity_bytes: bytes,
        fence: fence(uid),
        zfs_properties: [("sparse".to_owned(), "true".to_owned())].into(),
        ..Default::default()
    }
}

/// One object of the dependency graph under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Object {
    /// The source volume V.
    Source,
    /// Its snapshot S (taken while V held pattern 1).
    Snapshot,
    /// A volume restored from S (pattern 1, then written with pattern 3).
    Restored,
    /// A volume cloned from V (pattern 2, V's data when cloned).
    Cloned,
}

/// The four objects of one order, with their IDs and what each must read.
struct Graph {
    kind: i32,
    source: String,
    source_uid: String,
    snapshot: String,
    restored: String,
    restored_uid: String,
    cloned: String,
    cloned_uid: String,
}

async fn make_graph(c: &mut Client, lab: &Lab, tag: &str) -> Result<Graph> {
    make_graph_in(c, lab, &lab.pool, ZVOL, tag).await
}

/// The graph in `pool` (a ZFS pool or the VG) of backend `kind`.
async fn make_graph_in(
    c: &mut Client,
    lab: &Lab,
    pool: &str,
    kind: i32,
    tag: &str,
) -> Result<Graph> {
    let id = |n: &str| format!("{pool}/{}", lab.unique(&format!("{tag}-{n}")));
    let (source, restored, cloned) = (id("v"), id("r"), id("k"));
    let (source_uid, restored_uid, cloned_uid) =
        (lab.unique("uv"), lab.unique("ur"), lab.unique("uk"));
    let v = c
        .create_volume(create(&source, &source_uid, SIZE))
        .await?
        .into_inner();
    let dev = Path::new(&v.device_path);
    write_at(dev, 0, &pattern(1, CHUNK))?;
    let snap = c
        .create_snapshot(pb::CreateSnapshotRequest {
            source_volume_id: source.clone(),
            backend_type: kind,
            snapshot_uid: lab.unique("s"),
            fence: fence(&source_uid),
        })
        .await?
        .into_inner()
        .snapshot
        .ok_or("CreateSnapshot returned no snapshot")?;
    write_at(dev, 0, &pattern(2, CHUNK))?;
    let mut r = create(&restored, &restored_uid, SIZE);
    r.source_snapshot_id = snap.snapshot_id.clone();
    let r = c.create_volume(r).await?.into_inner();
    assert_eq!(
        read_at(Path::new(&r.device_path), 0, CHUNK)?,
        pattern(1, CHUNK)
    );
    write_at(Path::new(&r.device_path), 0, &pattern(3, CHUNK))?;
    let mut k = create(&cloned, &cloned_uid, SIZE);
    k.source_volume_id = source.clone();
    let k = c.create_volume(k).await?.into_inner();
    assert_eq!(
        read_at(Path::new(&k.device_path), 0, CHUNK)?,
        pattern(2, CHUNK)
    );
    Ok(Graph {
        kind,
        source,
        source_uid,
        snapshot: snap.snapshot_id,
        restored,
        restored_uid,
        cloned,
        cloned_uid,
    })
}

/// The device of a volume the agent lists with a backend volume.
async fn device(c: &mut Client, id: &str) -> Result<String> {
    let listed = c
        .list_volumes(pb::ListVolumesRequest {})
        .await?
        .into_inner();
    let v = listed
        .volumes
        .into_iter()
        .find(|v| v.volume_id == id)
        .ok_or_else(|| format!("{id} not listed"))?;
    Ok(v.device_path)
}

async fn delete(c: &mut Client, g: &Graph, o: Object) -> Result<()> {
    let volume = |id: &str, uid: &str| pb::DeleteVolumeRequest {
        volume_id: id.to_owned(),
        backend_type: g.kind,
        fence: fence(uid),
    };
    match o {
        Object::Source => c.delete_volume(volume(&g.source, &g.source_uid)).await?,
        Object::Restored => {
            c.delete_volume(volume(&g.restored, &g.restored_uid))
                .await?
        }
        Object::Cloned => c.delete_volume(volume(&g.cloned, &g.cloned_uid)).await?,
        Object::Snapshot => {
            c.delete_snapshot(pb::DeleteSnapshotRequest {
                snapshot_id: g.snapshot.clone(),
                backend_type: g.kind,
            })
            .await?;
            // Deleted means no longer listed, whatever depends on it.
            let left = c
                .list_snapshots(pb::ListSnapshotsRequest {
                    source_volume_id: g.source.clone(),
                })
                .await?
                .into_inner();
            assert!(left.snapshots.is_empty(), "{left:?}");
            return Ok(());
        }
    };
    Ok(())
}

/// Every object not yet deleted still reads its own data.
async fn check_alive(c: &mut Client, g: &Graph, alive: &[Object]) -> Result<()> {
    for o in alive {
        let (id, seed) = match o {
            Object::Source => (&g.source, 2),
            Object::Restored => (&g.restored, 3),
            Object::Cloned => (&g.cloned, 2),
            Object::Snapshot => {
                let listed = c
                    .list_snapshots(pb::ListSnapshotsRequest {
                        source_volume_id: g.source.clone(),
                    })
                    .await?
                    .into_inner();
                assert_eq!(listed.snapshots.len(), 1, "{listed:?}");
                continue;
            }
        };
        let dev = device(c, id).await?;
        assert_eq!(
            read_at(Path::new(&dev), 0, CHUNK)?,
            pattern(seed, CHUNK),
            "{o:?} ({id}) lost its data"
        );
    }
    Ok(())
}

fn permutations(items: &[Object]) -> Vec<Vec<Object>> {
    if items.len() <= 1 {
        return vec![items.to_vec()];
    }
    let mut out = Vec::new();
    for (i, first) in items.iter().enumerate() {
        let mut rest = items.to_vec();
        rest.remove(i);
        for mut tail in permutations(&rest) {
            tail.insert(0, *first);
            out.push(tail);
        }
    }
    out
}

async fn agent(lab: &Lab, name: &str) -> Result<(ZfsParent, AgentProcess)> {
    let parent = ZfsParent::create(lab, name)?;
    let config = AgentConfig::new(
        lab,
        &lab.unique(name),
        vec![parent.backend()],
        NVME_PORT,
        ISCSI_PORT,
    )?;
    Ok((parent, AgentProcess::start(config).await?))
}

/// The LVs of the lab's VG whose names start with `prefix`.
fn lvs_named(lab: &Lab, prefix: &str) -> Result<Vec<String>> {
    Ok(run("lvs", &["--noheadings", "-o", "lv_name", &lab.vg])?
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with(prefix))
        .map(str::to_owned)
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn snapshot_agent_every_deletion_order_keeps_data_and_leaks_nothing() -> Result<()> {
    let lab = Lab::get();
    let parent = ZfsParent::create(&lab, "snap-orders")?;
    let config = AgentConfig::zvols_and_thin_lvs(
        &lab,
        &lab.unique("snap-orders"),
        &parent,
        NVME_PORT,
        ISCSI_PORT,
    )?;
    let agent = AgentProcess::start(config).await?;
    let mut c = agent.client().await?;
    let all = [
        Object::Source,
        Object::Snapshot,
        Object::Restored,
        Object::Cloned,
    ];
    let orders = permutations(&all);
    assert_eq!(orders.len(), 24);
    // On ZFS every order: a clone keeps its origin snapshot, a snapshot its
    // volume. A thin LVM snapshot or clone depends on nothing on the
    // storage, so there the four rotations (each object deleted first
    // once, and last once) exercise the agent's records.
    let rotations: Vec<Vec<Object>> = (0..all.len())
        .map(|i| {
            all.iter()
                .cycle()
                .skip(i)
                .take(all.len())
                .copied()
                .collect()
        })
        .collect();
    let lvm_tag = lab.unique("lo");
    for (pool, kind, name, orders) in [
        (lab.pool.as_str(), ZVOL, "zfs", &orders),
        (lab.vg.as_str(), LVM, "lvm thin", &rotations),
    ] {
        for (n, order) in orders.iter().enumerate() {
            let tag = format!("{lvm_tag}-{n}");
            let g = make_graph_in(&mut c, &lab, pool, kind, &tag).await?;
            let mut alive = all.to_vec();
            for o in order {
                delete(&mut c, &g, *o).await?;
                alive.retain(|a| a != o);
                check_alive(&mut c, &g, &alive).await?;
            }
            let left = if kind == ZVOL {
                parent.children()?
            } else {
                lvs_named(&lab, &tag)?
            };
            assert!(left.is_empty(), "{name} order {order:?} left {left:?}");
            println!("{name} order {n:2}: {order:?}: every object kept its data until deleted; nothing left");
        }
    }
    let snaps = c
        .list_snapshots(pb::ListSnapshotsRequest::default())
        .await?
        .into_inner();
    assert!(snaps.snapshots.is_empty(), "{snaps:?}");
    assert!(lvs_named(&lab, &lvm_tag)?.is_empty());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn snapshot_agent_refusals_and_retries_change_nothing() -> Result<()> {
    let lab = Lab::get();
    let (parent, agent) = agent(&lab, "snap-refusals").await?;
    let mut c = agent.client().await?;
    let g = make_graph(&mut c, &lab, "rf").await?;
    let name = g.source.rsplit('/').next().unwrap_or_default();
    let dataset = format!("{}/{name}", parent.dataset());

    // A repeated CreateSnapshot returns the snapshot taken first.
    let uid = g
        .snapshot
        .rsplit_once("pillar-snap-")
        .map(|(_, u)| u.to_owned())
        .ok_or("snapshot id")?;
    let again = c
        .create_snapshot(pb::CreateSnapshotRequest {
            source_volume_id: g.source.clone(),
            backend_type: ZVOL,
            snapshot_uid: uid.clone(),
            fence: fence(&g.source_uid),
        })
        .await?
        .into_inner()
        .snapshot
        .ok_or("no snapshot")?;
    assert_eq!(again.snapshot_id, g.snapshot);
    assert_eq!(again.size_bytes, SIZE);

    // A stale or foreign token takes no snapshot.
    let e = c
        .create_snapshot(pb::CreateSnapshotRequest {
            source_volume_id: g.source.clone(),
            backend_type: ZVOL,
            snapshot_uid: lab.unique("s2"),
            fence: fence("someone-else"),
        })
        .await
        .expect_err("another lifecycle");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e}");

    // A clone smaller than its snapshot: OUT_OF_RANGE, nothing made.
    let before = parent.children()?;
    let small = format!("{}/{}", lab.pool, lab.unique("rf-small"));
    let mut r = create(&small, &lab.unique("usmall"), SIZE / 2);
    r.source_snapshot_id = g.snapshot.clone();
    let e = c.create_volume(r).await.expect_err("too small");
    assert_eq!(e.code(), Code::OutOfRange, "{e}");
    // A source that does not exist: NOT_FOUND.
    let mut r = create(&small, &lab.unique("usmall2"), SIZE);
    r.source_snapshot_id = format!("{}@pillar-snap-nothing", g.source);
    let e = c.create_volume(r).await.expect_err("no such snapshot");
    assert_eq!(e.code(), Code::NotFound, "{e}");
    assert_eq!(parent.children()?, before);

    // A larger clone is grown; its data is the snapshot's.
    let big = format!("{}/{}", lab.pool, lab.unique("rf-big"));
    let big_uid = lab.unique("ubig");
    let mut r = create(&big, &big_uid, 2 * SIZE);
    r.source_snapshot_id = g.snapshot.clone();
    let made = c.create_volume(r.clone()).await?.into_inner();
    assert_eq!(made.capacity_bytes, 2 * SIZE);
    assert_eq!(
        read_at(Path::new(&made.device_path), 0, CHUNK)?,
        pattern(1, CHUNK)
    );
    // The snapshot deleted, a retry of that clone still returns it.
    c.delete_snapshot(pb::DeleteSnapshotRequest {
        snapshot_id: g.snapshot.clone(),
        backend_type: ZVOL,
    })
    .await?;
    assert_eq!(c.create_volume(r.clone()).await?.into_inner(), made);
    // A new clone of the deleted snapshot is refused.
    let mut late = create(&small, &lab.unique("ulate"), SIZE);
    late.source_snapshot_id = g.snapshot.clone();
    assert_eq!(
        c.create_volume(late).await.expect_err("deleted").code(),
        Code::NotFound
    );
    // The same ID asked with another source: ALREADY_EXISTS.
    let mut other = r.clone();
    other.source_snapshot_id.clear();
    other.source_volume_id = g.source.clone();
    assert_eq!(
        c.create_volume(other)
            .await
            .expect_err("other source")
            .code(),
        Code::AlreadyExists
    );
    // DeleteSnapshot again: success, nothing changes.
    c.delete_snapshot(pb::DeleteSnapshotRequest {
        snapshot_id: g.snapshot.clone(),
        backend_type: ZVOL,
    })
    .await?;

    // An operator's own snapshot of the source: the agent never deletes
    // it, and the source's DeleteVolume is refused naming it.
    let theirs = format!("{}@pre-pillar", g.source);
    let pre = format!("{dataset}@pre-pillar");
    run("zfs", &["snapshot", &pre])?;
    let mine_by_hand = format!("{dataset}@pillar-snap-by-hand");
    run("zfs", &["snapshot", &mine_by_hand])?;
    let e = c
        .delete_snapshot(pb::DeleteSnapshotRequest {
            snapshot_id: format!("{}@pillar-snap-by-hand", g.source),
            backend_type: ZVOL,
        })
        .await
        .expect_err("not taken by the agent");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
    assert!(e.message().contains("not taken by this agent"), "{e}");
    let e = c
        .delete_snapshot(pb::DeleteSnapshotRequest {
            snapshot_id: theirs.clone(),
            backend_type: ZVOL,
        })
        .await
        .expect_err("not a pillar snapshot name");
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    let before = parent.children()?;
    let e = c
        .delete_volume(pb::DeleteVolumeRequest {
            volume_id: g.source.clone(),
            backend_type: ZVOL,
            fence: fence(&g.source_uid),
        })
        .await
        .expect_err("a snapshot the agent did not take");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e}");
    assert!(e.message().contains("pre-pillar"), "{e}");
    assert_eq!(parent.children()?, before, "nothing changed");
    assert!(Path::new(&device(&mut c, &g.source).await?).exists());

    // The operator removes theirs; everything then goes in any order.
    run("zfs", &["destroy", &pre])?;
    run("zfs", &["destroy", &mine_by_hand])?;
    for (id, uid) in [
        (&g.source, &g.source_uid),
        (&g.restored, &g.restored_uid),
        (&big, &big_uid),
        (&g.cloned, &g.cloned_uid),
    ] {
        c.delete_volume(pb::DeleteVolumeRequest {
            volume_id: id.clone(),
            backend_type: ZVOL,
            fence: fence(uid),
        })
        .await?;
    }
    assert_eq!(parent.children()?, Vec::<String>::new());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn snapshot_agent_restart_collects_a_source_whose_last_snapshot_went_while_down() -> Result<()>
{
    let lab = Lab::get();
    let (parent, mut agent) = agent(&lab, "snap-restart").await?;
    let mut c = agent.client().await?;
    let g = make_graph(&mut c, &lab, "rs").await?;
    let dataset = |id: &str| {
        format!(
            "{}/{}",
            parent.dataset(),
            id.rsplit('/').next().unwrap_or_default()
        )
    };
    let source = dataset(&g.source);
    let source_dev = device(&mut c, &g.source).await?;

    // The source deleted while snapshots of it remain: kept, hidden.
    delete(&mut c, &g, Object::Source).await?;
    assert_eq!(zget(&source, "volmode")?, "none");
    assert_eq!(zget(&source, "refreservation")?, "0");
    assert!(!Path::new(&source_dev).exists(), "{source_dev} still there");
    // Its snapshot deleted while the restored volume uses it: marked.
    delete(&mut c, &g, Object::Snapshot).await?;
    let snap = format!(
        "{source}@{}",
        g.snapshot.rsplit('@').next().unwrap_or_default()
    );
    assert_eq!(zget(&snap, "defer_destroy")?, "on");

    // While the agent is down, both clones go by hand: the kernel takes the
    // deferred snapshot with the restored volume, the clone-from-volume's
    // snapshot with the clone; the source is left with none.
    agent.kill()?;
    run("zfs", &["destroy", &dataset(&g.restored)])?;
    run("zfs", &["destroy", &dataset(&g.cloned)])?;
    assert_eq!(
        run(
            "zfs",
            &["list", "-H", "-o", "name", "-t", "snapshot", "-r", &source]
        )?
        .trim(),
        ""
    );
    assert!(parent.children()?.iter().any(|l| l.starts_with(&source)));

    // The restarted agent collects the source before it serves.
    agent.restart().await?;
    assert_eq!(parent.children()?, Vec::<String>::new());
    let mut c = agent.client().await?;
    // The clones' records point at nothing: their deletes succeed.
    delete(&mut c, &g, Object::Restored).await?;
    delete(&mut c, &g, Object::Cloned).await?;
    let listed = c
        .list_volumes(pb::ListVolumesRequest {})
        .await?
        .into_inner();
    assert!(
        listed
            .volumes
            .iter()
            .all(|v| v.ended && v.capacity_bytes == 0),
        "{listed:?}"
    );
    assert!(agent
        .log()
        .contains("volume kept for its snapshots destroyed"));
    Ok(())
}

/// `zfs get -Hp -o value <prop> <ds>`.
fn zget(ds: &str, prop: &str) -> Result<String> {
    Ok(run("zfs", &["get", "-Hp", "-o", "value", prop, ds])?
        .trim()
        .to_owned())
}
