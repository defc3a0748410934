//! Ways to break the agent's promises found by trying it from outside, each
//! shown over the simulator (the kernel's part is proven by the lab tests).
use super::sim::*;
use super::*;
use crate::{
    backend::{CreateOptions, ImportSource},
    marks::ExportRecord,
};
use std::{sync::atomic::Ordering, time::Duration};

fn exported(f: &Fixture, id: &str) -> Result<Option<ExportRecord>, AgentError> {
    Ok(f.exporter
        .exports
        .lock()
        .map_err(|_| AgentError::Internal("poison".into()))?
        .get(id)
        .cloned())
}

/// A zvol made outside the agent (`tank/k8s/old`), imported as `tank/old` by
/// lifecycle `uid`; returns the import source.
async fn imported(f: &Fixture, uid: &str) -> Result<ImportSource, AgentError> {
    let at = BackendRecord::Zvol {
        dataset: "tank/k8s/old".into(),
        guid: None,
    };
    f.backend.create(&at, 10, &CreateOptions::default())?;
    let source = ImportSource::Zvol {
        dataset: "tank/k8s/old".into(),
        key: None,
    };
    f.agent
        .import_volume("tank/old", None, 10, source.clone(), tok(uid, 1).as_ref())
        .await?;
    Ok(source)
}

async fn created(f: &Fixture, id: &str, uid: &str) -> Result<(), AgentError> {
    f.agent
        .create_volume(id, None, 10, CreateOptions::default(), tok(uid, 1).as_ref())
        .await
        .map(|_| ())
}

/// Hole 1: the client of an ExportVolume gives up while the export is still
/// being applied; a ReleaseVolume that follows must see the export's outcome,
/// never run beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_export_keeps_the_volume_lock_until_its_mark_is_written(
) -> Result<(), AgentError> {
    let f = fixture();
    let a = &f.agent;
    created(&f, "tank/v", "u1").await?;
    f.exporter.delay_ms.store(400, Ordering::SeqCst);
    let cancelled = tokio::time::timeout(
        Duration::from_millis(50),
        a.export_volume(
            "tank/v",
            None,
            Protocol::NvmeofTcp,
            acl(),
            tok("u1", 2).as_ref(),
        ),
    )
    .await;
    assert!(
        cancelled.is_err(),
        "the client gave up before the export ended"
    );
    a.release_volume("tank/v", None, tok("u1", 2).as_ref())
        .await?;
    // Whatever was still running of the export has ended by now.
    tokio::time::sleep(Duration::from_millis(800)).await;
    // Release ran after the export's mark was written, so it removed it.
    assert_eq!(
        exported(&f, "tank/v")?,
        None,
        "an export outlived its lifecycle"
    );
    let mark = a
        .marks()
        .load("tank/v")?
        .ok_or(AgentError::Internal("no mark".into()))?;
    assert!(
        mark.exports.is_empty() && mark.fence.live.is_none(),
        "{mark:?}"
    );
    Ok(())
}

/// Hole 2: an export that fails halfway leaves nothing behind, and an export
/// the mark never recorded (the agent died before writing it) does not stop
/// DeleteVolume from removing it.
#[tokio::test]
async fn a_half_done_export_is_undone_and_an_unrecorded_one_is_removed_by_delete(
) -> Result<(), AgentError> {
    let f = fixture();
    let a = &f.agent;
    created(&f, "tank/v", "u1").await?;
    f.exporter.fail_halfway.store(true, Ordering::SeqCst);
    let failed = a
        .export_volume(
            "tank/v",
            None,
            Protocol::NvmeofTcp,
            acl(),
            tok("u1", 1).as_ref(),
        )
        .await;
    assert!(matches!(failed, Err(AgentError::Internal(m)) if m.contains("Cannot assign")));
    assert_eq!(exported(&f, "tank/v")?, None, "the half-made export stayed");
    let mark = a
        .marks()
        .load("tank/v")?
        .ok_or(AgentError::Internal("no mark".into()))?;
    assert!(mark.exports.is_empty(), "a failed export was recorded");

    // An export applied whose mark was never written (kill -9 in between).
    f.exporter
        .exports
        .lock()
        .map_err(|_| AgentError::Internal("poison".into()))?
        .insert("tank/v".into(), acl());
    a.delete_volume("tank/v", None, tok("u1", 1).as_ref())
        .await?;
    assert_eq!(
        exported(&f, "tank/v")?,
        None,
        "delete left an unrecorded export"
    );
    Ok(())
}

/// Hole 2, the update case: a failed ACL change puts the recorded ACL back.
#[tokio::test]
async fn a_failed_acl_change_puts_the_recorded_acl_back() -> Result<(), AgentError> {
    let f = fixture();
    let a = &f.agent;
    created(&f, "tank/v", "u1").await?;
    a.export_volume(
        "tank/v",
        None,
        Protocol::NvmeofTcp,
        acl(),
        tok("u1", 1).as_ref(),
    )
    .await?;
    f.exporter.fail_halfway.store(true, Ordering::SeqCst);
    let other = "nqn.2026-01.org.example:other";
    let r = a
        .set_initiator(
            "tank/v",
            Protocol::NvmeofTcp,
            other,
            true,
            tok("u1", 1).as_ref(),
        )
        .await;
    assert!(r.is_err());
    assert_eq!(
        exported(&f, "tank/v")?,
        Some(exported_acl("tank/v")),
        "the kernel kept the refused ACL"
    );
    Ok(())
}

/// Hole 4: an adopted volume released by one lifecycle is not served to the
/// next one without a new import (and its checks).
#[tokio::test]
async fn a_released_adopted_volume_is_not_exported_without_a_new_import() -> Result<(), AgentError>
{
    let f = fixture();
    let a = &f.agent;
    let source = imported(&f, "u1").await?;
    a.export_volume(
        "tank/old",
        None,
        Protocol::NvmeofTcp,
        acl(),
        tok("u1", 1).as_ref(),
    )
    .await?;
    a.release_volume("tank/old", None, tok("u1", 1).as_ref())
        .await?;
    let again = a
        .export_volume(
            "tank/old",
            None,
            Protocol::NvmeofTcp,
            acl(),
            tok("u2", 1).as_ref(),
        )
        .await;
    assert!(
        matches!(&again, Err(AgentError::FailedPrecondition(m)) if m.contains("import it again")),
        "{again:?}"
    );
    assert_eq!(exported(&f, "tank/old")?, None);
    a.import_volume("tank/old", None, 10, source, tok("u2", 1).as_ref())
        .await?;
    a.export_volume(
        "tank/old",
        None,
        Protocol::NvmeofTcp,
        acl(),
        tok("u2", 1).as_ref(),
    )
    .await?;
    assert_eq!(exported(&f, "tank/old")?, Some(exported_acl("tank/old")));
    Ok(())
}

/// Hole 6: a create whose backend made the volume and then failed keeps the
/// volume recorded, so the retry finishes it.
#[tokio::test]
async fn a_create_that_failed_after_making_the_volume_keeps_it_recorded() -> Result<(), AgentError>
{
    let f = fixture();
    let a = &f.agent;
    f.backend.fail_after_create.store(true, Ordering::SeqCst);
    let first = created(&f, "tank/v", "u1").await;
    assert!(matches!(first, Err(AgentError::Internal(_))), "{first:?}");
    let mark = a
        .marks()
        .load("tank/v")?
        .ok_or(AgentError::Internal("the intent was dropped".into()))?;
    assert!(mark.backend.is_some(), "{mark:?}");
    created(&f, "tank/v", "u1").await?;
    assert_eq!(
        *f.backend
            .created
            .lock()
            .map_err(|_| AgentError::Internal("poison".into()))?,
        1,
        "the retry made a second volume"
    );
    Ok(())
}

/// An import retry under the live lifecycle records the newer generation it carries.
#[tokio::test]
async fn an_import_retry_records_its_newer_generation() -> Result<(), AgentError> {
    let f = fixture();
    let a = &f.agent;
    let source = imported(&f, "u1").await?;
    a.import_volume("tank/old", None, 10, source, tok("u1", 4).as_ref())
        .await?;
    let stale = a
        .export_volume(
            "tank/old",
            None,
            Protocol::NvmeofTcp,
            acl(),
            tok("u1", 3).as_ref(),
        )
        .await;
    assert!(
        matches!(&stale, Err(AgentError::FailedPrecondition(m)) if m.starts_with("stale fencing token")),
        "{stale:?}"
    );
    Ok(())
}
