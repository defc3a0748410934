//! TransferVolumeOwnership's refusals over the simulator, each from its real
//! cause and each shown to write nothing: the rows of docs/recovery.md's agent
//! refusal table that the lab's `refusals` test (windows, keys, digest, export,
//! mount, an ended lifecycle) does not produce. Snapshots are the ones
//! InspectVolume signs for a verified caller; grants are signed with the
//! trust anchor's key (`recovery::testkit`).
use super::sim::*;
use super::sim_lvm::{SimLv, VG, VG_UUID};
use super::*;
use crate::{
    backend::{CreateOptions, ImportSource},
    grpc::{inspect_answer, AgentGrpc},
    marks::ExportRecord,
    recovery::{authorize, testkit},
};
use api::{
    annotations::{LvIdentity, LvPolicy},
    names::lvm::{LvName, LvmUuid, VgName},
};
use pillar_csi_proto::agent::v1::{self as pb, agent_service_server::AgentService};
use std::time::{Duration, SystemTime};
use tonic::{Code, Request, Status};

/// The adopted LV of every test.
const LEGACY: &str = "data-vg/legacy";
/// The new lifecycle a grant names.
const NEW: &str = "9d8e7f60-0000-4000-8000-000000000002";
const LVM: Option<BackendKind> = Some(BackendKind::Lvm);

type R = Result<(), AgentError>;

fn bad(what: impl std::fmt::Display) -> AgentError {
    AgentError::Internal(what.to_string())
}

/// An agent over the simulator started with the fixtures' trust anchor and
/// server identity.
fn recovering() -> Fixture {
    fixture_with(Some(testkit::recovery()))
}

/// Imports the simulator's LV `name` (made outside pillar-csi if it does not
/// exist yet) as lifecycle `uid` at `generation`, PreserveOriginal; returns
/// its UUID.
async fn adopt(f: &Fixture, name: &str, uid: &str, generation: u64) -> Result<String, AgentError> {
    let uuid = match f.lvm.lv(name) {
        Some(lv) => lv.uuid,
        None => f.lvm.add(name, 8 << 20),
    };
    let source = ImportSource::Lv {
        identity: LvIdentity {
            vg: VgName::new(VG).map_err(bad)?,
            lv: LvName::new(name).map_err(bad)?,
            vg_uuid: LvmUuid::new(VG_UUID).map_err(bad)?,
            lv_uuid: LvmUuid::new(&uuid).map_err(bad)?,
        },
        policy: LvPolicy::PreserveOriginal,
    };
    f.agent
        .import_volume(
            &format!("{VG}/{name}"),
            LVM,
            8 << 20,
            source,
            tok(uid, generation).as_ref(),
        )
        .await?;
    Ok(uuid)
}

/// The snapshot InspectVolume signs now for a caller whose client
/// certificate was verified.
async fn snapshot(f: &Fixture, id: &str) -> Result<pb::RecoverySnapshot, AgentError> {
    let request = pb::InspectVolumeRequest {
        volume_id: id.into(),
        backend_type: pb::BackendType::Lvm as i32,
    };
    inspect_answer(&f.agent, request, true, SystemTime::now())
        .await?
        .snapshot
        .ok_or_else(|| bad(format!("{id}: InspectVolume gave no snapshot")))
}

/// The controller's request for `id`: `snapshot` and the operator's grant
/// over it of lifecycle `new_uid` at the next generation, valid from a
/// minute ago for an hour.
fn request(
    id: &str,
    snapshot: pb::RecoverySnapshot,
    new_uid: &str,
) -> Result<pb::TransferVolumeOwnershipRequest, AgentError> {
    let now = SystemTime::now();
    let authorization = authorize(
        &snapshot,
        new_uid,
        snapshot.old_generation + 1,
        (now - Duration::from_secs(60)).into(),
        (now + Duration::from_secs(3600)).into(),
        &testkit::operator(),
    )
    .map_err(bad)?;
    Ok(pb::TransferVolumeOwnershipRequest {
        volume_id: id.into(),
        backend_type: pb::BackendType::Lvm as i32,
        snapshot: Some(snapshot),
        authorization: Some(authorization),
    })
}

/// Everything a transfer could write: every file of the state folder (its
/// bytes) and the simulator's LVs, zvols and exports.
#[derive(Debug, PartialEq, Eq)]
struct State {
    files: BTreeMap<String, Vec<u8>>,
    lvs: BTreeMap<String, SimLv>,
    zvols: BTreeMap<String, u64>,
    exports: BTreeMap<String, ExportRecord>,
}

fn state(f: &Fixture) -> Result<State, AgentError> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(f._dir.path()).map_err(bad)? {
        let path = entry.map_err(bad)?.path();
        files.insert(
            path.display().to_string(),
            std::fs::read(&path).map_err(bad)?,
        );
    }
    Ok(State {
        files,
        lvs: f.lvm.lvs.lock().map_err(|_| bad("poison"))?.clone(),
        zvols: f.backend.volumes.lock().map_err(|_| bad("poison"))?.clone(),
        exports: f
            .exporter
            .exports
            .lock()
            .map_err(|_| bad("poison"))?
            .clone(),
    })
}

/// Asserts that `got` is FAILED_PRECONDITION `recovery of volume <id>
/// refused: <why>`, exactly, as the gRPC layer answers it.
fn assert_refused<T: std::fmt::Debug>(got: Result<T, Status>, id: &str, why: &str) {
    let status = got.expect_err("a refusal");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert_eq!(
        status.message(),
        format!("recovery of volume {id} refused: {why}")
    );
}

/// Sends `request` as a verified caller and asserts its refusal with `why`
/// and that it wrote nothing.
async fn refused(f: &Fixture, request: pb::TransferVolumeOwnershipRequest, why: &str) -> R {
    let before = state(f)?;
    let id = request.volume_id.clone();
    let got = f
        .agent
        .transfer_volume_ownership(request, true, SystemTime::now())
        .await;
    assert_refused(got.map_err(Status::from), &id, why);
    assert_eq!(state(f)?, before, "the refusal wrote something");
    Ok(())
}

/// Sends `request` as a verified caller and asserts that it commits.
async fn commits(f: &Fixture, request: pb::TransferVolumeOwnershipRequest) -> R {
    let got = f
        .agent
        .transfer_volume_ownership(request, true, SystemTime::now())
        .await?;
    assert!(matches!(got, Transfer::Committed(_)), "{got:?}");
    Ok(())
}

/// Row `the caller has no verified mTLS client certificate`: the gRPC layer
/// reads the peer's certificates from the request (none for a plaintext
/// caller, as here); the same request from a verified caller commits.
#[tokio::test]
async fn a_caller_without_a_verified_client_certificate_is_refused() -> R {
    let f = recovering();
    adopt(&f, "legacy", "u1", 2).await?;
    let valid = request(LEGACY, snapshot(&f, LEGACY).await?, NEW)?;
    let grpc = AgentGrpc::new(f.agent.clone(), "test");
    let before = state(&f)?;
    let got = grpc
        .transfer_volume_ownership(Request::new(valid.clone()))
        .await;
    assert_refused(
        got,
        LEGACY,
        "the caller has no verified mTLS client certificate; recovery needs mTLS",
    );
    assert_eq!(state(&f)?, before, "the refusal wrote something");
    commits(&f, valid).await
}

/// Row `the snapshot is of volume <id>`: a snapshot (and its grant) of
/// another adopted LV sent for this one.
#[tokio::test]
async fn a_snapshot_of_another_volume_is_refused() -> R {
    let f = recovering();
    adopt(&f, "legacy", "u1", 2).await?;
    adopt(&f, "other", "u9", 2).await?;
    let other = request(LEGACY, snapshot(&f, "data-vg/other").await?, NEW)?;
    refused(&f, other, "the snapshot is of volume \"data-vg/other\"").await?;
    commits(&f, request(LEGACY, snapshot(&f, LEGACY).await?, NEW)?).await
}

/// Row `the agent has no fence mark`: the state folder lost the LV's mark
/// after the snapshot (the LV survived). The fence admits the snapshot's
/// token against no mark (it would open a lifecycle), so this is the check
/// that refuses.
#[tokio::test]
async fn a_volume_without_a_fence_mark_is_refused() -> R {
    let f = recovering();
    adopt(&f, "legacy", "u1", 2).await?;
    let valid = request(LEGACY, snapshot(&f, LEGACY).await?, NEW)?;
    f.agent.marks().remove(LEGACY)?;
    refused(
        &f,
        valid,
        "the agent has no fence mark for the volume; nothing to recover",
    )
    .await
}

/// Row `not adopted`: the state folder was restored from a copy taken when
/// the volume ID held an LV the agent had created and deleted (lifecycle
/// `u0`), before an LV made outside was imported under it by `u1`, the
/// lifecycle the snapshot shows. Without a restore no mark reaches this
/// check: an adoption's pin is only dropped by the DeleteVolume that ends
/// its lifecycle, and after a lost mark a CreateVolume over the LV is
/// refused (`already exists and was not created by this agent`).
#[tokio::test]
async fn a_volume_that_is_not_an_adopted_lv_is_refused() -> R {
    let f = recovering();
    f.agent
        .create_volume(
            LEGACY,
            LVM,
            8 << 20,
            CreateOptions::default(),
            tok("u0", 1).as_ref(),
        )
        .await?;
    f.agent
        .delete_volume(LEGACY, LVM, tok("u0", 1).as_ref())
        .await?;
    let copy = f
        .agent
        .marks()
        .load(LEGACY)?
        .ok_or_else(|| bad("no mark"))?;
    assert!(
        copy.adopted.is_none() && copy.fence.live.is_none(),
        "{copy:?}"
    );
    adopt(&f, "legacy", "u1", 2).await?;
    let valid = request(LEGACY, snapshot(&f, LEGACY).await?, NEW)?;
    f.agent.marks().save(&copy)?;
    refused(
        &f,
        valid,
        "not adopted: volume data-vg/legacy is not an LV adopted through import-lv; recovery covers only those",
    )
    .await
}

/// Row `pinned`: the LV was re-created outside pillar-csi (another UUID)
/// before the inspection, so the snapshot names what lvs reports now, not
/// the LV the mark pins.
#[tokio::test]
async fn a_snapshot_of_another_lv_than_the_pin_is_refused() -> R {
    let f = recovering();
    let pinned = adopt(&f, "legacy", "u1", 2).await?;
    let now = f.lvm.add("legacy", 8 << 20);
    let snap = snapshot(&f, LEGACY).await?;
    refused(
        &f,
        request(LEGACY, snap, NEW)?,
        &format!(
            "pinned: the snapshot names data-vg/legacy:{VG_UUID}:{now} (preserve_original true), the fence mark pins data-vg/legacy:{VG_UUID}:{pinned} (PreserveOriginal)"
        ),
    )
    .await
}

/// Row `no live lifecycle`: the state folder was restored from a copy taken
/// after an earlier lifecycle (`u0`) was released and before the import the
/// snapshot shows (`u1`). With the folder as the agent left it, `u1` would
/// be live, or ended and refused by the fence (`lifecycle u1 has ended`):
/// only a mark older than the snapshot reaches this check.
#[tokio::test]
async fn a_mark_without_a_live_lifecycle_is_refused() -> R {
    let f = recovering();
    adopt(&f, "legacy", "u0", 1).await?;
    f.agent
        .release_volume(LEGACY, LVM, tok("u0", 1).as_ref())
        .await?;
    let copy = f
        .agent
        .marks()
        .load(LEGACY)?
        .ok_or_else(|| bad("no mark"))?;
    adopt(&f, "legacy", "u1", 2).await?;
    let valid = request(LEGACY, snapshot(&f, LEGACY).await?, NEW)?;
    f.agent.marks().save(&copy)?;
    refused(
        &f,
        valid,
        "no live lifecycle owns the volume (it was released or deleted); import the LV with import-lv instead",
    )
    .await
}

/// Row `the live lifecycle is <uid> at generation <g>, not the snapshot's`.
/// A generation raised after the snapshot is refused by the fence first
/// (`stale fencing token`); this check refuses a mark older than the
/// snapshot: the state folder restored from a copy taken at generation 2,
/// before an import retry at generation 3 that the snapshot shows.
#[tokio::test]
async fn a_lifecycle_that_changed_since_the_snapshot_is_refused() -> R {
    let f = recovering();
    adopt(&f, "legacy", "u1", 2).await?;
    let at_2 = request(LEGACY, snapshot(&f, LEGACY).await?, NEW)?;
    let copy = f
        .agent
        .marks()
        .load(LEGACY)?
        .ok_or_else(|| bad("no mark"))?;
    adopt(&f, "legacy", "u1", 3).await?;
    refused(
        &f,
        at_2,
        "stale fencing token for volume data-vg/legacy: generation 2 of lifecycle u1 is lower than the recorded generation 3",
    )
    .await?;
    let at_3 = request(LEGACY, snapshot(&f, LEGACY).await?, NEW)?;
    f.agent.marks().save(&copy)?;
    refused(
        &f,
        at_3,
        "the live lifecycle is u1 at generation 2, not the snapshot's u1 at 3; the state changed since the snapshot: inspect again",
    )
    .await
}

/// Row `new_volume_uid <u> is a lifecycle that has already ended`: the LV
/// was adopted by `u0`, released, adopted again by `u1`; the grant moves
/// the volume back to `u0`.
#[tokio::test]
async fn a_new_uid_that_already_ended_is_refused() -> R {
    let f = recovering();
    adopt(&f, "legacy", "u0", 1).await?;
    f.agent
        .release_volume(LEGACY, LVM, tok("u0", 1).as_ref())
        .await?;
    adopt(&f, "legacy", "u1", 2).await?;
    let snap = snapshot(&f, LEGACY).await?;
    refused(
        &f,
        request(LEGACY, snap.clone(), "u0")?,
        "new_volume_uid u0 is a lifecycle that has already ended for this volume",
    )
    .await?;
    commits(&f, request(LEGACY, snap, NEW)?).await
}

/// Row `missing:`: the LV was removed after the snapshot; once it is back
/// (same UUID) the same request commits.
#[tokio::test]
async fn a_missing_lv_is_refused() -> R {
    let f = recovering();
    adopt(&f, "legacy", "u1", 2).await?;
    let valid = request(LEGACY, snapshot(&f, LEGACY).await?, NEW)?;
    let lv = f
        .lvm
        .lvs
        .lock()
        .map_err(|_| bad("poison"))?
        .remove("legacy")
        .ok_or_else(|| bad("no LV"))?;
    refused(
        &f,
        valid.clone(),
        "missing: volume data-vg/legacy: logical volume data-vg/legacy is missing",
    )
    .await?;
    f.lvm
        .lvs
        .lock()
        .map_err(|_| bad("poison"))?
        .insert("legacy".into(), lv);
    commits(&f, valid).await
}

/// Row `identity:`: the LV was re-created (another UUID) after the
/// snapshot, which still names the pinned one.
#[tokio::test]
async fn an_lv_whose_identity_changed_is_refused() -> R {
    let f = recovering();
    let pinned = adopt(&f, "legacy", "u1", 2).await?;
    let valid = request(LEGACY, snapshot(&f, LEGACY).await?, NEW)?;
    let now = f.lvm.add("legacy", 8 << 20);
    refused(
        &f,
        valid,
        &format!(
            "identity: logical volume data-vg/legacy has UUID {now}, not the pinned {pinned}; it was renamed or re-created"
        ),
    )
    .await
}
