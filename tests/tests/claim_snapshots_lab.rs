//! Snapshots and clones through the real Kubernetes components (issue 42):
//! external-snapshotter's snapshot-controller and csi-snapshotter, the
//! provisioner restoring and cloning claims, kube-controller-manager,
//! against the lab's API server; the test plays the user and kubelet
//! ([`pillar_csi_lab::k8s_cluster`]). On a zvol (NVMe/TCP, ext4) and a
//! thin LV (iSCSI, xfs): write, snapshot, write more, restore into a larger
//! claim and clone the claim, read both back, then delete the objects in
//! an order that leaves dependents behind each time (the source first on
//! ZFS, the snapshot first on LVM), and check that every volume and
//! snapshot is gone from the storage at the end.
//!
//! Run with `tests/lab/run tests -- claim_snapshots`.
use api::crd::PillarSnapshot;
use kube::api::{DeleteParams, DynamicObject, ListParams, PostParams};
use pillar_csi_lab::{
    block::pattern,
    claim_bed::{ClaimBed, Class},
    claim_witness::Storage,
    k8s_cluster::{from, Cluster},
    node_bed::df_size,
    run, Result,
};
use serde_json::json;
use std::{fs, io::Write, path::Path};

/// The VolumeSnapshotClass the chart makes with its default values.
const SNAPSHOT_CLASS: &str = "pillar-csi";

/// The order in which one scenario deletes its objects.
#[derive(Debug, Clone, Copy)]
enum Object {
    /// The claim the snapshot was taken of.
    Source,
    /// The VolumeSnapshot.
    Snapshot,
    /// The claim restored from the snapshot.
    Restored,
    /// The claim cloned from the source claim.
    Copy,
}

/// One class's scenario.
struct Scenario<'a> {
    tag: &'a str,
    class: &'a Class,
    /// The source's size and the restore's (larger).
    sizes: (u64, u64),
    deletions: [Object; 4],
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn claim_snapshots_restore_and_clone_through_the_real_snapshotter() -> Result<()> {
    let bed = ClaimBed::start("snap").await?;
    let cluster = Cluster::start(&bed).await?;
    let snapshot_class: DynamicObject = from(json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
        "metadata": {"name": SNAPSHOT_CLASS},
        "driver": "pillar-csi.bhyoo.com", "deletionPolicy": "Delete",
    }))?;
    cluster
        .snapshot_api("VolumeSnapshotClass")
        .create(&PostParams::default(), &snapshot_class)
        .await?;
    use Object::*;
    for scenario in [
        Scenario {
            tag: "zvol",
            class: &bed.objects.zvol_nvme,
            sizes: (64 << 20, 128 << 20),
            deletions: [Source, Snapshot, Copy, Restored],
        },
        Scenario {
            tag: "lv",
            class: &bed.objects.lv_iscsi,
            sizes: (320 << 20, 400 << 20),
            deletions: [Snapshot, Restored, Source, Copy],
        },
    ] {
        scenario.run(&cluster).await?;
    }
    cluster
        .snapshot_api("VolumeSnapshotClass")
        .delete(SNAPSHOT_CLASS, &DeleteParams::default())
        .await?;
    cluster.stop().await
}

impl Scenario<'_> {
    async fn run(&self, cluster: &Cluster<'_>) -> Result<()> {
        let bed = cluster.bed();
        let tag = self.tag;
        let (source_name, snap_name) = (format!("{tag}-source"), format!("{tag}-snap"));
        let (restored_name, copy_name) = (format!("{tag}-restored"), format!("{tag}-copy"));
        let mib = |b: u64| format!("{}Mi", b >> 20);
        bed.storage_class(self.class).await?;
        let class = &self.class.storage_class;
        let parent = format!("{}/{}", bed.parent.pool, bed.parent.name);
        // What earlier tests of this guest left is not this scenario's.
        let before = storage_names(&bed.lab, &parent)?;
        let made = || -> Result<Vec<String>> {
            let now = storage_names(&bed.lab, &parent)?;
            Ok(now.into_iter().filter(|n| !before.contains(n)).collect())
        };

        println!("\n== {tag}: {class} ({})", self.class.fs_type);
        println!(
            " 1. [user] PVC {source_name} ({}), Pod writer",
            mib(self.sizes.0)
        );
        cluster
            .claim(&source_name, class, &mib(self.sizes.0), None)
            .await?;
        let source_pv = cluster.bound(&source_name).await?;
        let writer = format!("{tag}-writer");
        cluster.pod(&writer, &[&source_name]).await?;
        let va = cluster.attached(&source_pv).await?;
        let source = cluster
            .stage_and_publish(&source_pv, &va, self.class.fs_type, &source_name)
            .await?;
        cluster.report_in_use(&[&source.handle]).await?;
        let (first, second, more) = (pattern(1, 1 << 20), pattern(2, 1 << 20), pattern(3, 4096));
        write_synced(&source.target.join("a"), &first)?;

        println!(" 2. [user] VolumeSnapshot {snap_name} of {source_name}");
        let snapshot: DynamicObject = from(json!({
            "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
            "metadata": {"name": snap_name},
            "spec": {"volumeSnapshotClassName": SNAPSHOT_CLASS,
                "source": {"persistentVolumeClaimName": source_name}},
        }))?;
        let snapshots = cluster.snapshot_api("VolumeSnapshot");
        snapshots.create(&PostParams::default(), &snapshot).await?;
        let content_name = cluster
            .until(&format!("VolumeSnapshot {snap_name} readyToUse"), || {
                let snapshots = snapshots.clone();
                let name = snap_name.clone();
                async move {
                    let s = snapshots.get(&name).await?;
                    let status = &s.data["status"];
                    Ok((status["readyToUse"] == true)
                        .then(|| status["boundVolumeSnapshotContentName"].as_str())
                        .flatten()
                        .map(str::to_owned))
                }
            })
            .await?;
        let content = cluster
            .snapshot_api("VolumeSnapshotContent")
            .get(&content_name)
            .await?;
        let snapshot_handle = content.data["status"]["snapshotHandle"]
            .as_str()
            .ok_or("VolumeSnapshotContent without a snapshotHandle")?
            .to_owned();
        assert_eq!(
            content.data["status"]["restoreSize"].as_u64(),
            Some(self.sizes.0),
            "{content:?}"
        );
        let records = cluster
            .api::<PillarSnapshot>()
            .list(&ListParams::default())
            .await?;
        assert!(
            records
                .items
                .iter()
                .any(|r| r.status.as_ref().and_then(|s| s.snapshot_id.as_deref())
                    == Some(snapshot_handle.as_str())),
            "a PillarSnapshot records {snapshot_handle}"
        );
        let snapshot_on_disk = snapshot_handle
            .rsplit('@')
            .next()
            .unwrap_or_default()
            .to_owned();
        assert!(
            made()?.contains(&snapshot_on_disk),
            "the storage holds snapshot {snapshot_on_disk}"
        );
        println!("      {content_name}: handle {snapshot_handle}");

        println!(" 3. [user] more writes into {source_name}; PVC {restored_name} ({}) from the snapshot, PVC {copy_name} from {source_name}", mib(self.sizes.1));
        write_synced(&source.target.join("a"), &second)?;
        write_synced(&source.target.join("b"), &more)?;
        cluster
            .claim(
                &restored_name,
                class,
                &mib(self.sizes.1),
                Some(json!({"apiGroup": "snapshot.storage.k8s.io",
                    "kind": "VolumeSnapshot", "name": snap_name})),
            )
            .await?;
        cluster
            .claim(
                &copy_name,
                class,
                &mib(self.sizes.0),
                Some(json!({"kind": "PersistentVolumeClaim", "name": source_name})),
            )
            .await?;
        let restored_pv = cluster.bound(&restored_name).await?;
        let copy_pv = cluster.bound(&copy_name).await?;

        println!(" 4. [user] Pod reader of both; [kubelet, played] stage and publish them");
        let reader = format!("{tag}-reader");
        cluster.pod(&reader, &[&restored_name, &copy_name]).await?;
        let mut mounted = vec![source.clone()];
        for (name, pv) in [(&restored_name, &restored_pv), (&copy_name, &copy_pv)] {
            let va = cluster.attached(pv).await?;
            mounted.push(
                cluster
                    .stage_and_publish(pv, &va, self.class.fs_type, name)
                    .await?,
            );
            let handles: Vec<&str> = mounted.iter().map(|m| m.handle.as_str()).collect();
            cluster.report_in_use(&handles).await?;
        }
        let (restored, copy) = (&mounted[1], &mounted[2]);
        assert_eq!(
            fs::read(restored.target.join("a"))?,
            first,
            "the restore holds the data as of the snapshot"
        );
        assert!(
            !restored.target.join("b").exists(),
            "the restore holds nothing written after the snapshot"
        );
        let restored_size = df_size(&restored.target)?;
        assert!(
            restored_size > self.sizes.0,
            "the restore's filesystem grew to the larger claim: {restored_size} bytes"
        );
        assert_eq!(fs::read(copy.target.join("a"))?, second, "the clone");
        assert_eq!(fs::read(copy.target.join("b"))?, more, "the clone");
        println!(
            "      {restored_name}: a as of the snapshot, no b, {} MiB filesystem; {copy_name}: a and b as of the clone",
            restored_size >> 20
        );

        println!(" 5. [user] Pods deleted");
        cluster.delete_pod(&writer).await?;
        cluster.delete_pod(&reader).await?;
        for m in &mounted {
            cluster.unpublish_and_unstage(m).await?;
        }
        cluster.report_in_use(&[]).await?;
        for pv in [&source_pv, &restored_pv, &copy_pv] {
            cluster.detached(pv).await?;
        }

        println!(" 6. [user] deletions in the order {:?}", self.deletions);
        let storages = mounted
            .iter()
            .map(|m| Storage::of(&m.handle, &parent))
            .collect::<Result<Vec<_>>>()?;
        for object in self.deletions {
            match object {
                Object::Source => cluster.delete_claim(&source_name, &source_pv).await?,
                Object::Restored => cluster.delete_claim(&restored_name, &restored_pv).await?,
                Object::Copy => cluster.delete_claim(&copy_name, &copy_pv).await?,
                Object::Snapshot => {
                    snapshots
                        .delete(&snap_name, &DeleteParams::default())
                        .await?;
                    let contents = cluster.snapshot_api("VolumeSnapshotContent");
                    cluster
                        .until(&format!("VolumeSnapshotContent {content_name} gone"), || {
                            let (contents, name) = (contents.clone(), content_name.clone());
                            async move { Ok(contents.get_opt(&name).await?.is_none().then_some(())) }
                        })
                        .await?;
                }
            }
            println!("      {object:?} deleted; on the storage: {:?}", made()?);
        }
        let left = made()?;
        assert!(
            left.is_empty(),
            "every volume and snapshot is gone from the storage: {left:?}"
        );
        for storage in &storages {
            assert_eq!(storage.size()?, None, "{storage} is gone");
        }
        Ok(())
    }
}

/// Writes `data` to `path` and makes it durable (a snapshot taken next
/// holds it).
fn write_synced(path: &Path, data: &[u8]) -> Result<()> {
    let mut file = fs::File::create(path)?;
    file.write_all(data)?;
    file.sync_all()?;
    Ok(())
}

/// The names pillar-csi made on the storage: the datasets and snapshots
/// under the zvols' `parent` (their last path part) and the LVs of the
/// lab's VG but its thin pool.
fn storage_names(lab: &pillar_csi_lab::Lab, parent: &str) -> Result<Vec<String>> {
    let zfs = run(
        "zfs",
        &["list", "-H", "-o", "name", "-t", "all", "-r", parent],
    )?;
    let lvs = run("lvs", &["--noheadings", "-o", "lv_name", &lab.vg])?;
    Ok(zfs
        .lines()
        .filter(|l| *l != parent)
        .map(|l| l.rsplit(['/', '@']).next().unwrap_or(l).to_owned())
        .chain(
            lvs.lines()
                .map(|l| l.trim().to_owned())
                .filter(|l| !l.is_empty() && *l != lab.thin_pool),
        )
        .collect())
}
