//! Imports through PVC annotations against a real kube-apiserver 1.20 and
//! the simulated agent behind mTLS (see `common`): zvols (`import-zvol`),
//! LVs (`import-lv`, PreserveOriginal and Managed), the reservation, every
//! controller-side refusal row of spec/import-zvol.md and
//! spec/adopt-lvm-lv.md as the claim's event, and the `filesystem` and
//! `backend` annotations.
mod common;

use api::crd::*;
use common::*;
use csi::controller::import;
use csi::controller::reservations::name_for;
use csi::node_id::NodeId;
use kube::api::{Api, PostParams};
use pillar_csi_agent::service::sim_lvm;
use pillar_csi_proto::csi::v1 as pb;
use pillar_csi_proto::csi::v1::controller_server::Controller as _;
use tonic::{Code, Request};

const NQN: &str = "nqn.2014-08.org.nvmexpress:uuid:0f6a8e4c-2b1d-4c55-9a4e-6c1f0e5d7a21";
const IQN: &str = "iqn.1993-08.org.debian:01:5e2f9a1b7c3d";
const ZVOL: &str = "pillar-csi.bhyoo.com/import-zvol";
const LV: &str = "pillar-csi.bhyoo.com/import-lv";
const POLICY: &str = "pillar-csi.bhyoo.com/import-lv-policy";
const FS: &str = "pillar-csi.bhyoo.com/filesystem";
const BACKEND: &str = "pillar-csi.bhyoo.com/backend";
const MIB: u64 = 1 << 20;

async fn create(bed: &Bed, pv: &str, bytes: u64, class: &str, claim: &str) -> Result<pb::Volume> {
    Ok(bed
        .controller
        .create_volume(Request::new(create_request(
            pv,
            bytes as i64,
            class,
            "db",
            claim,
        )))
        .await?
        .into_inner()
        .volume
        .ok_or("no volume")?)
}

async fn refused(bed: &Bed, pv: &str, bytes: u64, class: &str, claim: &str) -> tonic::Status {
    match bed
        .controller
        .create_volume(Request::new(create_request(
            pv,
            bytes as i64,
            class,
            "db",
            claim,
        )))
        .await
    {
        Ok(v) => panic!("claim {claim} was provisioned: {v:?}"),
        Err(e) => e,
    }
}

async fn delete(bed: &Bed, handle: &str) -> std::result::Result<(), tonic::Status> {
    bed.controller
        .delete_volume(Request::new(pb::DeleteVolumeRequest {
            volume_id: handle.into(),
            ..Default::default()
        }))
        .await
        .map(|_| ())
}

fn publish(handle: &str, node: &NodeId) -> pb::ControllerPublishVolumeRequest {
    pb::ControllerPublishVolumeRequest {
        volume_id: handle.into(),
        node_id: node.to_string(),
        volume_capability: Some(mount_cap("")),
        ..Default::default()
    }
}

fn expand(handle: &str, bytes: u64) -> pb::ControllerExpandVolumeRequest {
    pb::ControllerExpandVolumeRequest {
        volume_id: handle.into(),
        capacity_range: Some(pb::CapacityRange {
            required_bytes: bytes as i64,
            limit_bytes: 0,
        }),
        volume_capability: Some(mount_cap("")),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_zvol_is_imported_with_its_own_size_published_unpublished_and_deleted() -> Result {
    let bed = bed().await?;
    bed.server.kubectl(&["create", "namespace", "db"])?;
    bed.add_zvol("legacy", 256 * MIB);
    let pv = claim(
        &bed,
        "db",
        "data-postgres-0",
        &[
            (ZVOL, "tank/k8s/legacy"),
            (FS, "fsType: ext4\n"),
            (BACKEND, "zfs:\n  properties:\n    compression: zstd\n"),
        ],
    )
    .await?;
    let volume = create(&bed, &pv, 64 * MIB, "hot", "data-postgres-0").await?;
    let handle = "storage-1/nvmeof-tcp/zfs-zvol/tank/legacy";
    assert_eq!(volume.volume_id, handle);
    // The PV gets the zvol's size, larger than the request.
    assert_eq!(volume.capacity_bytes, (256 * MIB) as i64);
    assert_eq!(
        volume.volume_context.get("fsType").map(String::as_str),
        Some("ext4")
    );
    // The node never formats an imported zvol, even one that probes blank.
    assert_eq!(
        volume
            .volume_context
            .get("existingData")
            .map(String::as_str),
        Some("import-zvol")
    );
    let record = state(&bed, &pv).await?.ok_or("no record")?;
    assert_eq!(
        record.spec.imported_from.as_deref(),
        Some("tank/k8s/legacy")
    );
    assert_eq!(record.spec.agent_volume_id, "tank/legacy");
    assert_eq!(record.spec.capacity_bytes, 256 * MIB);
    assert_eq!(
        record.status.as_ref().and_then(|s| s.phase),
        Some(VolumePhase::Ready)
    );
    // The agent was asked to import, with nothing of the backend annotation.
    let asked = bed.last_create().ok_or("no CreateVolume")?;
    assert_eq!(asked.import_zvol, "tank/k8s/legacy");
    assert!(asked.zfs_properties.is_empty(), "{asked:?}");
    assert_eq!(
        *bed.fixture.backend.created.lock().map_err(|_| "poison")?,
        0
    );
    // The reservation, taken before the agent call, names the claim.
    let held = reservations(&bed).await?;
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].spec.owner_volume, pv);
    assert_eq!(held[0].spec.agent_volume_id, "tank/legacy");
    assert_eq!(held[0].spec.claim_ref.name, "data-postgres-0");
    assert_eq!(
        held[0].metadata.name.as_deref(),
        Some(name_for("storage-1", "tank/legacy").as_str())
    );
    // A retry is the same volume.
    let again = create(&bed, &pv, 64 * MIB, "hot", "data-postgres-0").await?;
    assert_eq!(again.capacity_bytes, (256 * MIB) as i64);

    let node = NodeId::new("worker-a", NQN, IQN)?;
    bed.controller
        .controller_publish_volume(Request::new(publish(handle, &node)))
        .await?;
    bed.controller
        .controller_unpublish_volume(Request::new(pb::ControllerUnpublishVolumeRequest {
            volume_id: handle.into(),
            node_id: node.to_string(),
            ..Default::default()
        }))
        .await?;
    // reclaimPolicy Delete: deleting an imported zvol destroys it.
    delete(&bed, handle).await?;
    assert_eq!(bed.zvol("legacy"), None);
    assert_eq!(bed.destroyed(), 1);
    assert!(state(&bed, &pv).await?.is_none());
    assert!(reservations(&bed).await?.is_empty());
    Ok(())
}

/// A row of the spec's Refusals tables that the controller answers before
/// anything is written: the claim's annotations, its class, the message.
struct Row {
    annotations: Vec<(&'static str, String)>,
    class: &'static str,
    message: String,
}

fn row(annotations: &[(&'static str, &str)], class: &'static str, message: String) -> Row {
    Row {
        annotations: annotations
            .iter()
            .map(|(k, v)| (*k, (*v).to_owned()))
            .collect(),
        class,
        message,
    }
}

#[tokio::test]
async fn every_controller_side_refusal_is_the_claim_s_event_and_writes_nothing() -> Result {
    let bed = bed().await?;
    bed.server.kubectl(&["create", "namespace", "db"])?;
    // The causes that need state: a zvol another claim imported, and a
    // stale reservation of a controller that stopped before its record.
    bed.add_zvol("taken", 64 * MIB);
    let owner = claim(&bed, "db", "owner", &[(ZVOL, "tank/k8s/taken")]).await?;
    create(&bed, &owner, 64 * MIB, "hot", "owner").await?;
    bed.add_zvol("stale", 64 * MIB);
    let stale = name_for("storage-1", "tank/stale");
    Api::<PillarVolumeReservation>::all(bed.client.clone())
        .create(
            &PostParams::default(),
            &PillarVolumeReservation::new(
                &stale,
                PillarVolumeReservationSpec {
                    claim_ref: ClaimRef {
                        uid: "0d5201a5-3c1e-4c55-a2a7-3f7d3c4e9b10".into(),
                        namespace: "db".into(),
                        name: "gone".into(),
                    },
                    owner_volume: "pvc-0d5201a5-3c1e-4c55-a2a7-3f7d3c4e9b10".into(),
                    agent_ref: "storage-1".into(),
                    agent_volume_id: "tank/stale".into(),
                },
            ),
        )
        .await?;
    let lv = format!(
        "data-vg/legacy:{}:LvSimA-0000-0000-0000-0000-0000-000009",
        sim_lvm::VG_UUID
    );
    let other_vg = format!(
        "other-vg/legacy:{}:LvSimA-0000-0000-0000-0000-0000-000009",
        sim_lvm::VG_UUID
    );
    let form = "\"<pool>[/<parent>]/<name>\"";
    let rows = vec![
        row(&[(ZVOL, "")], "hot", format!("unsupported PVC annotation \"{ZVOL}\": value must name a ZFS dataset as {form}, got empty")),
        row(&[(ZVOL, "tank")], "hot", format!("{ZVOL} must name a ZFS dataset as {form}, got \"tank\"")),
        row(&[(ZVOL, "/tank/k8s/x")], "hot", format!("{ZVOL} must name a ZFS dataset as {form}, got \"/tank/k8s/x\"")),
        row(&[(ZVOL, "tank/k8s/x/")], "hot", format!("{ZVOL} must name a ZFS dataset as {form}, got \"tank/k8s/x/\"")),
        row(&[(ZVOL, "tank//x")], "hot", format!("{ZVOL} dataset \"tank//x\": empty dataset component")),
        row(&[(ZVOL, "tank/../x")], "hot", format!("{ZVOL} dataset \"tank/../x\": dataset component \"..\" is not a name")),
        row(&[(ZVOL, "tank/k8s/x@pre-pillar")], "hot", format!("{ZVOL} dataset \"tank/k8s/x@pre-pillar\": dataset component \"x@pre-pillar\" contains invalid character '@'")),
        row(&[(ZVOL, "tank/k8s/x")], "lvm", format!("{ZVOL} requires a zfs.zvol PillarStore backend, got backend \"lvm-lv\"")),
        row(&[(ZVOL, "hot-data/k8s/x")], "hot", format!("{ZVOL} dataset \"hot-data/k8s/x\" lives in pool \"hot-data\" but the PillarStore selects pool \"tank\"")),
        row(&[(ZVOL, "tank/k8s-other/x")], "hot", format!("{ZVOL} dataset \"tank/k8s-other/x\" is not under the PillarStore's parent dataset \"tank/k8s\"")),
        row(&[(ZVOL, "tank/k8s/a/b")], "hot", format!("{ZVOL} dataset \"tank/k8s/a/b\" is not under the PillarStore's parent dataset \"tank/k8s\"")),
        row(&[(ZVOL, "tank/x")], "hot", format!("{ZVOL} dataset \"tank/x\" is not under the PillarStore's parent dataset \"tank/k8s\"")),
        row(&[(ZVOL, "tank/k8s/taken")], "hot", format!("{ZVOL}: zvol \"tank/k8s/taken\" is already managed by volume storage-1/nvmeof-tcp/zfs-zvol/tank/taken (PillarVolumeState {owner}); delete that volume first")),
        row(&[(ZVOL, "tank/k8s/stale")], "hot", format!("{ZVOL}: zvol \"tank/k8s/stale\" is reserved by volume pvc-0d5201a5-3c1e-4c55-a2a7-3f7d3c4e9b10 of claim db/gone (PillarVolumeReservation {stale}); delete that claim first, or, after verifying that claim and its PillarVolumeState no longer exist, release the reservation with `kubectl delete pillarvolumereservation {stale}`")),
        // adopt-lvm-lv.md: the controller's rows.
        row(&[(LV, "")], "lvm", format!("unsupported PVC annotation \"{LV}\": value must name a logical volume as \"<vg>/<lv>:<vg_uuid>:<lv_uuid>\", got empty")),
        row(&[(LV, "data-vg/legacy")], "lvm", format!("{LV} must name a logical volume as \"<vg>/<lv>:<vg_uuid>:<lv_uuid>\", got \"data-vg/legacy\"")),
        row(&[(LV, &lv)], "hot", format!("{LV} requires an lvm PillarStore backend, got backend \"zfs-zvol\"")),
        row(&[(LV, &other_vg)], "lvm", format!("{LV} logical volume \"other-vg/legacy\" lives in volume group \"other-vg\" but the PillarStore selects volume group \"data-vg\"")),
        row(&[(LV, &lv), (POLICY, "managed")], "lvm", format!("{POLICY} must be \"PreserveOriginal\" or \"Managed\" (case-sensitive), got \"managed\"")),
        row(&[(POLICY, "Managed")], "lvm", format!("{POLICY} is set without {LV}")),
        row(&[(LV, &lv), (ZVOL, "tank/k8s/x")], "lvm", format!("{ZVOL} and {LV} cannot be combined on one claim")),
        // The settings annotations.
        row(&[(FS, "fsType: btrfs")], "hot", format!("{FS}: fsType must be \"ext4\" or \"xfs\", got \"btrfs\"")),
        row(&[(BACKEND, "zfs: {parentDataset: other}")], "hot", format!("{BACKEND}: zfs.parentDataset is structural and cannot be set per volume")),
        row(&[(BACKEND, "lvm: {provisioningMode: linear}")], "hot", format!("{BACKEND}: the claim sets lvm but the PillarStore \"storage-1-hot\" has a zfs backend")),
        // #40 hole 7: a claim sets only the ZFS properties its class lists.
        row(&[(BACKEND, "zfs: {properties: {compression: lz4, dedup: on}}")], "hot", format!("{BACKEND}: ZFS property \"dedup\" may not be set by a claim of PillarStorageClass \"hot\" (allowed: \"compression\", \"volblocksize\"; the class's allowedClaimZfsProperties lists what claims may set)")),
    ];
    let records = states(&bed).await?.len();
    let held = reservations(&bed).await?.len();
    let calls = bed.agent_calls();
    for (n, r) in rows.iter().enumerate() {
        let name = format!("claim-{n}");
        let annotations: Vec<(&str, &str)> = r
            .annotations
            .iter()
            .map(|(k, v)| (*k, v.as_str()))
            .collect();
        let pv = claim(&bed, "db", &name, &annotations).await?;
        let e = refused(&bed, &pv, 64 * MIB, r.class, &name).await;
        assert_eq!(e.message(), r.message, "row {n}");
        assert!(
            matches!(e.code(), Code::InvalidArgument | Code::FailedPrecondition),
            "row {n}: {e:?}"
        );
        assert_eq!(
            warnings(&bed, "db", &name).await?,
            vec![r.message.clone()],
            "row {n}"
        );
        assert!(state(&bed, &pv).await?.is_none(), "row {n} wrote a record");
    }
    assert_eq!(states(&bed).await?.len(), records, "a record was written");
    assert_eq!(
        reservations(&bed).await?.len(),
        held,
        "a reservation was written"
    );
    assert_eq!(bed.agent_calls_since(calls), Vec::<&str>::new());

    // Release a stale reservation (by hand, as the spec says): the claim's
    // retry then proceeds.
    bed.server
        .kubectl(&["delete", "pillarvolumereservation", &stale])?;
    let retry = claim(&bed, "db", "after-release", &[(ZVOL, "tank/k8s/stale")]).await?;
    create(&bed, &retry, 64 * MIB, "hot", "after-release").await?;
    Ok(())
}

#[tokio::test]
async fn an_annotation_added_or_changed_after_provisioning_started_is_refused() -> Result {
    let bed = bed().await?;
    bed.server.kubectl(&["create", "namespace", "db"])?;
    bed.add_zvol("a", 64 * MIB);
    bed.add_zvol("b", 64 * MIB);
    // Provisioning started without an import: the record exists (the agent
    // cannot be reached, so it stays Pending).
    let plain = claim(&bed, "db", "plain", &[]).await?;
    bed.agent_at(1)?;
    let e = refused(&bed, &plain, 64 * MIB, "hot", "plain").await;
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    bed.agent_at(bed.agent_port)?;
    bed.server.kubectl(&[
        "-n",
        "db",
        "annotate",
        "pvc",
        "plain",
        &format!("{ZVOL}=tank/k8s/a"),
    ])?;
    let calls = bed.agent_calls();
    let e = refused(&bed, &plain, 64 * MIB, "hot", "plain").await;
    assert_eq!(bed.agent_calls_since(calls), Vec::<&str>::new());
    let added = format!("{ZVOL}: volume \"{plain}\" was already provisioned without an import; delete the PersistentVolumeClaim and re-create it to import a zvol");
    assert_eq!(e.message(), added);
    assert_eq!(warnings(&bed, "db", "plain").await?.last(), Some(&added));

    // The import started with tank/k8s/a, then the value changed.
    let moved = claim(&bed, "db", "moved", &[(ZVOL, "tank/k8s/a")]).await?;
    let calls_before = bed.agent_calls();
    create(&bed, &moved, 64 * MIB, "hot", "moved").await?;
    assert_eq!(bed.agent_calls_since(calls_before), vec!["create_volume"]);
    bed.server.kubectl(&[
        "-n",
        "db",
        "annotate",
        "--overwrite",
        "pvc",
        "moved",
        &format!("{ZVOL}=tank/k8s/b"),
    ])?;
    let after = bed.agent_calls();
    let e = refused(&bed, &moved, 64 * MIB, "hot", "moved").await;
    let changed = format!("{ZVOL}: volume \"{moved}\" already imported zvol \"tank/k8s/a\"; the import source cannot be changed");
    assert_eq!(e.message(), changed);
    assert_eq!(warnings(&bed, "db", "moved").await?, vec![changed]);
    assert_eq!(bed.agent_calls_since(after), Vec::<&str>::new());
    assert_eq!(
        state(&bed, &moved)
            .await?
            .and_then(|s| s.spec.imported_from)
            .as_deref(),
        Some("tank/k8s/a")
    );
    Ok(())
}

#[tokio::test]
async fn a_second_claim_is_refused_naming_the_owner_until_the_owner_s_volume_is_deleted() -> Result
{
    let bed = bed().await?;
    bed.server.kubectl(&["create", "namespace", "db"])?;
    bed.add_zvol("shared", 128 * MIB);
    // The first claim's import cannot reach the agent: its record and
    // reservation stay, the import never completes.
    let first = claim(&bed, "db", "first", &[(ZVOL, "tank/k8s/shared")]).await?;
    bed.agent_at(1)?;
    let e = refused(&bed, &first, 64 * MIB, "hot", "first").await;
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    let record = state(&bed, &first)
        .await?
        .ok_or("no record before the agent call")?;
    let handle = record.spec.volume_id.clone();
    assert_eq!(reservations(&bed).await?.len(), 1);
    bed.agent_at(bed.agent_port)?;

    // The second claim is refused, naming the first one's volume.
    let second = claim(&bed, "db", "second", &[(ZVOL, "tank/k8s/shared")]).await?;
    let e = refused(&bed, &second, 64 * MIB, "hot", "second").await;
    let managed = format!("{ZVOL}: zvol \"tank/k8s/shared\" is already managed by volume {handle} (PillarVolumeState {first}); delete that volume first");
    assert_eq!(e.message(), managed);
    assert_eq!(warnings(&bed, "db", "second").await?, vec![managed.clone()]);
    // Nothing is released automatically: a second refusal, same owner.
    let e = refused(&bed, &second, 64 * MIB, "hot", "second").await;
    assert_eq!(e.message(), managed);
    let held = reservations(&bed).await?;
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].spec.owner_volume, first);

    // The first claim is deleted while the agent cannot be reached:
    // UNAVAILABLE, and the records stay for the retry.
    bed.agent_at(1)?;
    let e = delete(&bed, &handle).await.expect_err("agent down");
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(state(&bed, &first).await?.is_some());
    assert_eq!(reservations(&bed).await?.len(), 1);
    bed.agent_at(bed.agent_port)?;
    // The retry: the agent forgets the claim (ReleaseVolume), nothing is
    // destroyed, the records go.
    let calls = bed.agent_calls();
    delete(&bed, &handle).await?;
    assert_eq!(bed.agent_calls_since(calls), vec!["release_volume"]);
    assert_eq!(bed.zvol("shared"), Some(128 * MIB));
    assert_eq!(bed.destroyed(), 0);
    assert!(state(&bed, &first).await?.is_none());
    assert!(reservations(&bed).await?.is_empty());

    // The second claim's retry proceeds.
    let volume = create(&bed, &second, 64 * MIB, "hot", "second").await?;
    assert_eq!(volume.capacity_bytes, (128 * MIB) as i64);
    let held = reservations(&bed).await?;
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].spec.owner_volume, second);
    Ok(())
}

fn lv_value(name: &str, uuid: &str) -> String {
    format!("{}/{name}:{}:{uuid}", sim_lvm::VG, sim_lvm::VG_UUID)
}

#[tokio::test]
async fn an_import_the_agent_refused_is_never_published_expanded_or_destroyed() -> Result {
    let bed = bed().await?;
    bed.server.kubectl(&["create", "namespace", "db"])?;
    let uuid = bed.fixture.lvm.add("small", 32 * MIB);
    let pv = claim(&bed, "db", "small", &[(LV, &lv_value("small", &uuid))]).await?;
    let e = refused(&bed, &pv, 64 * MIB, "lvm", "small").await;
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    let agent_text = format!("import of volume data-vg/small refused: too small: logical volume data-vg/small is {} bytes, requested capacity is {} bytes; import never resizes", 32 * MIB, 64 * MIB);
    // The gRPC answer names the agent; the claim's event is the agent's
    // row of the spec, verbatim.
    assert_eq!(e.message(), format!("agent storage-1: {agent_text}"));
    assert_eq!(warnings(&bed, "db", "small").await?, vec![agent_text]);
    let record = state(&bed, &pv).await?.ok_or("no record")?;
    let source = record.spec.lvm_source.clone().ok_or("no lvmSource")?;
    assert_eq!(
        (
            source.logical_volume_uuid.as_str(),
            source.preserve_original
        ),
        (uuid.as_str(), true)
    );
    let handle = record.spec.volume_id.clone();
    assert_eq!(handle, "storage-1/nvmeof-tcp/lvm-lv/data-vg/small");

    let never = |action: &str| {
        format!("cannot {action} volume {handle}: its import of logical volume \"data-vg/small\" ({}:{uuid}, PreserveOriginal) was never adopted", sim_lvm::VG_UUID)
    };
    let node = NodeId::new("worker-a", NQN, IQN)?;
    let e = bed
        .controller
        .controller_publish_volume(Request::new(publish(&handle, &node)))
        .await
        .expect_err("publish of an import that never completed");
    assert_eq!(
        (e.code(), e.message()),
        (Code::FailedPrecondition, never("publish").as_str())
    );
    let e = bed
        .controller
        .controller_expand_volume(Request::new(expand(&handle, 128 * MIB)))
        .await
        .expect_err("expand of an import that never completed");
    assert_eq!(
        (e.code(), e.message()),
        (Code::FailedPrecondition, never("expand").as_str())
    );

    let calls = bed.agent_calls();
    delete(&bed, &handle).await?;
    assert_eq!(bed.agent_calls_since(calls), vec!["release_volume"]);
    assert_eq!(bed.fixture.lvm.lv("small").map(|l| l.bytes), Some(32 * MIB));
    assert_eq!(bed.destroyed(), 0);
    assert!(state(&bed, &pv).await?.is_none());
    assert!(reservations(&bed).await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn preserved_lvs_are_released_and_managed_lvs_deleted() -> Result {
    let bed = bed().await?;
    bed.server.kubectl(&["create", "namespace", "db"])?;
    let kept = bed.fixture.lvm.add("kept", 96 * MIB);
    let owned = bed.fixture.lvm.add("owned", 80 * MIB);
    let pv_kept = claim(&bed, "db", "kept", &[(LV, &lv_value("kept", &kept))]).await?;
    let pv_owned = claim(
        &bed,
        "db",
        "owned",
        &[(LV, &lv_value("owned", &owned)), (POLICY, "Managed")],
    )
    .await?;

    let v = create(&bed, &pv_kept, 64 * MIB, "lvm", "kept").await?;
    assert_eq!(v.capacity_bytes, (96 * MIB) as i64);
    assert_eq!(v.volume_id, "storage-1/nvmeof-tcp/lvm-lv/data-vg/kept");
    assert_eq!(
        v.volume_context.get("fsType").map(String::as_str),
        Some("ext4")
    );
    assert_eq!(
        v.volume_context.get("existingData").map(String::as_str),
        Some("import-lv")
    );
    let asked = bed.last_create().ok_or("no CreateVolume")?;
    let pinned = asked.import_lv.clone().ok_or("no import_lv")?;
    assert_eq!(
        (
            pinned.logical_volume.as_str(),
            pinned.logical_volume_uuid.as_str()
        ),
        ("kept", kept.as_str())
    );
    assert_eq!(asked.import_lv_policy, "PreserveOriginal");
    let record = state(&bed, &pv_kept).await?.ok_or("no record")?;
    assert_eq!(
        record.spec.lvm_source,
        Some(LvmSource {
            volume_group: "data-vg".into(),
            logical_volume: "kept".into(),
            volume_group_uuid: sim_lvm::VG_UUID.into(),
            logical_volume_uuid: kept.clone(),
            preserve_original: true,
        })
    );
    let v2 = create(&bed, &pv_owned, 64 * MIB, "lvm", "owned").await?;
    assert_eq!(v2.capacity_bytes, (80 * MIB) as i64);
    assert_eq!(
        bed.last_create().map(|c| c.import_lv_policy),
        Some("Managed".into())
    );
    assert_eq!(
        state(&bed, &pv_owned)
            .await?
            .and_then(|s| s.spec.lvm_source)
            .map(|s| s.preserve_original),
        Some(false)
    );

    // A PreserveOriginal volume is never resized: the agent's refusal.
    let e = bed
        .controller
        .controller_expand_volume(Request::new(expand(&v.volume_id, 128 * MIB)))
        .await
        .expect_err("expand of a PreserveOriginal LV");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert_eq!(
        e.message(),
        format!(
            "agent storage-1: cannot expand volume data-vg/kept: it is the adopted logical volume data-vg/kept:{}:{kept} (PreserveOriginal) kept PreserveOriginal, which is never resized; copy the data into a larger volume instead",
            sim_lvm::VG_UUID
        )
    );
    assert_eq!(bed.fixture.lvm.lv("kept").map(|l| l.bytes), Some(96 * MIB));
    // The Managed one grows.
    let grown = bed
        .controller
        .controller_expand_volume(Request::new(expand(&v2.volume_id, 128 * MIB)))
        .await?
        .into_inner();
    assert_eq!(grown.capacity_bytes, (128 * MIB) as i64);

    // The Managed LV is used (published, so its claim was bound) ...
    let node = NodeId::new("worker-a", NQN, IQN)?;
    bed.controller
        .controller_publish_volume(Request::new(publish(&v2.volume_id, &node)))
        .await?;
    bed.controller
        .controller_unpublish_volume(Request::new(pb::ControllerUnpublishVolumeRequest {
            volume_id: v2.volume_id.clone(),
            node_id: node.to_string(),
            ..Default::default()
        }))
        .await?;
    // ... then DeleteVolume: ReleaseVolume for PreserveOriginal (the LV
    // stays), DeleteVolume for Managed (the LV goes).
    let calls = bed.agent_calls();
    delete(&bed, &v.volume_id).await?;
    assert_eq!(bed.agent_calls_since(calls), vec!["release_volume"]);
    assert_eq!(bed.fixture.lvm.lv("kept").map(|l| l.uuid), Some(kept));
    let calls = bed.agent_calls();
    delete(&bed, &v2.volume_id).await?;
    assert_eq!(bed.agent_calls_since(calls), vec!["delete_volume"]);
    assert_eq!(bed.fixture.lvm.lv("owned"), None);
    assert!(states(&bed).await?.is_empty());
    assert!(reservations(&bed).await?.is_empty());
    Ok(())
}

#[tokio::test]
async fn filesystem_and_backend_annotations_shape_a_new_volume() -> Result {
    let bed = bed().await?;
    bed.server.kubectl(&["create", "namespace", "db"])?;
    let pv = claim(
        &bed,
        "db",
        "tuned",
        &[
            (FS, "fsType: ext4\n"),
            (
                BACKEND,
                "zfs:\n  properties:\n    compression: zstd\n    volblocksize: 16384\n",
            ),
        ],
    )
    .await?;
    let v = create(&bed, &pv, 64 * MIB, "hot", "tuned").await?;
    // The class says xfs; the claim's annotation wins.
    assert_eq!(
        v.volume_context.get("fsType").map(String::as_str),
        Some("ext4")
    );
    let record = state(&bed, &pv).await?.ok_or("no record")?;
    assert_eq!(
        record
            .spec
            .resolved
            .and_then(|r| r.filesystem)
            .map(|f| f.fs_type),
        Some(FsType::Ext4)
    );
    let asked = bed.last_create().ok_or("no CreateVolume")?;
    assert_eq!(asked.import_zvol, "");
    assert_eq!(
        asked.zfs_properties.get("compression").map(String::as_str),
        Some("zstd")
    );
    assert_eq!(
        asked.zfs_properties.get("volblocksize").map(String::as_str),
        Some("16384")
    );
    assert!(
        reservations(&bed).await?.is_empty(),
        "a new volume reserved something"
    );

    // Without the annotation: the class's filesystem, no properties.
    let plain = claim(&bed, "db", "plain", &[]).await?;
    let v = create(&bed, &plain, 64 * MIB, "hot", "plain").await?;
    assert_eq!(
        v.volume_context.get("fsType").map(String::as_str),
        Some("xfs")
    );
    assert!(bed
        .last_create()
        .ok_or("no CreateVolume")?
        .zfs_properties
        .is_empty());

    // A raw block claim cannot name a filesystem.
    let block = claim(&bed, "db", "raw", &[(FS, "fsType: xfs")]).await?;
    let mut request = create_request(&block, (64 * MIB) as i64, "hot", "db", "raw");
    request.volume_capabilities[0].access_type = Some(pb::volume_capability::AccessType::Block(
        pb::volume_capability::BlockVolume {},
    ));
    let e = bed
        .controller
        .create_volume(Request::new(request))
        .await
        .expect_err("filesystem on a block claim");
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(
        warnings(&bed, "db", "raw").await?,
        vec![e.message().to_owned()]
    );
    assert!(e.message().starts_with(FS), "{}", e.message());
    Ok(())
}

#[tokio::test]
async fn a_retry_after_the_claim_was_deleted_or_re_created_is_refused_and_the_import_released(
) -> Result {
    let bed = bed().await?;
    bed.server.kubectl(&["create", "namespace", "db"])?;
    bed.add_zvol("orphan", 96 * MIB);
    let pv = claim(&bed, "db", "orphan", &[(ZVOL, "tank/k8s/orphan")]).await?;
    bed.agent_at(1)?;
    let e = refused(&bed, &pv, 64 * MIB, "hot", "orphan").await;
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    bed.agent_at(bed.agent_port)?;
    let gone = format!("volume {pv:?} is not provisioned for a claim that is gone: its records are removed without destroying an imported volume");
    // The claim goes; the provisioner's retry is refused (FAILED_PRECONDITION,
    // final) before the agent is called: the import is not completed for a
    // claim that can never bind to it.
    bed.delete_claim("db", "orphan").await?;
    let calls = bed.agent_calls();
    let e = refused(&bed, &pv, 64 * MIB, "hot", "orphan").await;
    assert_eq!(
        (e.code(), e.message()),
        (
            Code::FailedPrecondition,
            format!("PersistentVolumeClaim db/orphan does not exist; {gone}").as_str()
        )
    );
    // The user re-creates the claim under its name (the spec's step 5):
    // the old claim's retry does not take the new claim for its own, and
    // posts nothing on it.
    let again = claim(&bed, "db", "orphan", &[(ZVOL, "tank/k8s/orphan")]).await?;
    let uid = again.trim_start_matches("pvc-");
    let seen = warnings(&bed, "db", "orphan").await?.len();
    let e = refused(&bed, &pv, 64 * MIB, "hot", "orphan").await;
    assert_eq!(
        (e.code(), e.message()),
        (
            Code::FailedPrecondition,
            format!("PersistentVolumeClaim db/orphan is not the claim of volume {pv:?}: its UID is {uid} (the claim was deleted and re-created); {gone}").as_str()
        )
    );
    assert_eq!(warnings(&bed, "db", "orphan").await?.len(), seen);
    assert_eq!(bed.agent_calls_since(calls), Vec::<&str>::new());
    let record = state(&bed, &pv).await?.ok_or("the old record went")?;
    assert_eq!(import::completed(&record), Some(false));
    // The new claim waits for the old records, which the reaper removes:
    // ReleaseVolume, nothing destroyed.
    let e = refused(&bed, &again, 64 * MIB, "hot", "orphan").await;
    assert!(
        e.message().contains("is already managed by volume"),
        "{e:?}"
    );
    let calls = bed.agent_calls();
    assert_eq!(bed.reconcilers().await?.reap().await, 0);
    assert_eq!(
        bed.agent_calls_since(calls),
        vec!["list_volumes", "release_volume"]
    );
    assert!(state(&bed, &pv).await?.is_none());
    assert_eq!(bed.zvol("orphan"), Some(96 * MIB));
    assert_eq!(bed.destroyed(), 0);
    // The new claim imports the zvol.
    let volume = create(&bed, &again, 64 * MIB, "hot", "orphan").await?;
    assert_eq!(volume.capacity_bytes, (96 * MIB) as i64);
    let held = reservations(&bed).await?;
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].spec.owner_volume, again);
    // A claim that never existed is still refused, naming it.
    let e = refused(&bed, "pvc-none", 64 * MIB, "hot", "never").await;
    assert_eq!(e.message(), "PersistentVolumeClaim db/never does not exist");
    Ok(())
}

/// CSI: a volume larger than `limit_bytes` is OUT_OF_RANGE. An import
/// never resizes, so a zvol larger than the claim's limit is refused after
/// the agent's first answer, the import is released (nothing destroyed)
/// and the record, never Ready, is left to the reaper.
#[tokio::test]
async fn an_import_larger_than_the_limit_is_out_of_range_and_released() -> Result {
    let bed = bed().await?;
    bed.server.kubectl(&["create", "namespace", "db"])?;
    bed.add_zvol("big", 256 * MIB);
    let pv = claim(&bed, "db", "big", &[(ZVOL, "tank/k8s/big")]).await?;
    let mut request = create_request(&pv, (64 * MIB) as i64, "hot", "db", "big");
    request.capacity_range = Some(pb::CapacityRange {
        required_bytes: (64 * MIB) as i64,
        limit_bytes: (128 * MIB) as i64,
    });
    let calls = bed.agent_calls();
    let e = bed
        .controller
        .create_volume(Request::new(request))
        .await
        .expect_err("an import larger than limit_bytes");
    assert_eq!(
        (e.code(), e.message()),
        (
            Code::OutOfRange,
            format!(
                "volume {pv:?}: the imported volume tank/big is {} bytes, more than limit_bytes {}; it is released, not resized",
                256 * MIB,
                128 * MIB
            )
            .as_str()
        )
    );
    assert_eq!(
        bed.agent_calls_since(calls),
        vec!["create_volume", "release_volume"]
    );
    assert_eq!(bed.zvol("big"), Some(256 * MIB));
    assert_eq!(bed.destroyed(), 0);
    let record = state(&bed, &pv).await?.ok_or("the record went")?;
    assert_eq!(import::completed(&record), Some(false));
    Ok(())
}
