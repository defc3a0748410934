//! The service's logic over the simulator: fencing, idempotency and locking.
use super::sim::*;
use super::*;
use crate::{
    backend::{Backend, BackendKind, CreateOptions},
    marks::ExportRecord,
};

#[tokio::test]
async fn fencing_end_to_end() -> Result<(), AgentError> {
    let f = fixture();
    let a = &f.agent;
    let missing = a
        .create_volume("tank/v", None, 10, CreateOptions::default(), None)
        .await;
    assert!(matches!(missing, Err(AgentError::FailedPrecondition(_))));
    assert_eq!(
        a.marks().volume_ids()?,
        Vec::<String>::new(),
        "a refused call writes no mark"
    );

    a.create_volume(
        "tank/v",
        None,
        10,
        CreateOptions::default(),
        tok("u1", 1).as_ref(),
    )
    .await?;
    a.export_volume(
        "tank/v",
        None,
        Protocol::NvmeofTcp,
        acl(),
        tok("u1", 3).as_ref(),
    )
    .await?;
    let before = a.marks().load("tank/v")?;
    let stale = a
        .unexport_volume("tank/v", Protocol::NvmeofTcp, tok("u1", 2).as_ref())
        .await;
    assert!(
        matches!(&stale, Err(AgentError::FailedPrecondition(m)) if m.starts_with("stale fencing token")),
        "{stale:?}"
    );
    let other = a.delete_volume("tank/v", None, tok("u2", 9).as_ref()).await;
    assert!(
        matches!(&other, Err(AgentError::FailedPrecondition(m)) if m.contains("owned by live lifecycle u1"))
    );
    assert_eq!(a.marks().load("tank/v")?, before, "refusals change nothing");
    assert!(f
        .exporter
        .exports
        .lock()
        .map_err(|_| AgentError::Internal("poison".into()))?
        .contains_key("tank/v"));

    a.delete_volume("tank/v", None, tok("u1", 3).as_ref())
        .await?;
    assert_eq!(
        *f.backend
            .destroyed
            .lock()
            .map_err(|_| AgentError::Internal("poison".into()))?,
        1
    );
    assert!(
        f.exporter
            .exports
            .lock()
            .map_err(|_| AgentError::Internal("poison".into()))?
            .is_empty(),
        "delete removed the export"
    );
    a.delete_volume("tank/v", None, tok("u1", 3).as_ref())
        .await?;
    assert_eq!(
        *f.backend
            .destroyed
            .lock()
            .map_err(|_| AgentError::Internal("poison".into()))?,
        1,
        "a retried delete touches nothing"
    );
    let ended = a
        .export_volume(
            "tank/v",
            None,
            Protocol::NvmeofTcp,
            acl(),
            tok("u1", 4).as_ref(),
        )
        .await;
    assert!(matches!(ended, Err(AgentError::FailedPrecondition(m)) if m.contains("has ended")));
    a.create_volume(
        "tank/v",
        None,
        10,
        CreateOptions::default(),
        tok("u3", 1).as_ref(),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn volumes_this_agent_did_not_create_are_left_alone() -> Result<(), AgentError> {
    let f = fixture();
    let a = &f.agent;
    let foreign = BackendRecord::Zvol {
        dataset: "tank/k8s/foreign".into(),
        guid: None,
    };
    f.backend.create(&foreign, 10, &CreateOptions::default())?;
    let export = a
        .export_volume(
            "tank/foreign",
            None,
            Protocol::NvmeofTcp,
            acl(),
            tok("u1", 1).as_ref(),
        )
        .await;
    assert!(
        matches!(export, Err(AgentError::FailedPrecondition(m)) if m.contains("not created by this agent"))
    );
    let expand = a
        .expand_volume("tank/foreign", None, 20, tok("u1", 1).as_ref())
        .await;
    assert!(matches!(expand, Err(AgentError::FailedPrecondition(_))));
    a.delete_volume("tank/foreign", None, tok("u1", 1).as_ref())
        .await?;
    assert!(
        f.backend.lookup(&foreign)?.is_some(),
        "delete destroyed a volume it never created"
    );
    assert_eq!(
        *f.backend
            .destroyed
            .lock()
            .map_err(|_| AgentError::Internal("poison".into()))?,
        0
    );
    Ok(())
}

#[tokio::test]
async fn concurrent_identical_creates_make_one_volume() -> Result<(), AgentError> {
    let f = fixture();
    let calls = (0..16).map(|_| {
        let a = f.agent.clone();
        tokio::spawn(async move {
            a.create_volume(
                "tank/same",
                None,
                10,
                CreateOptions::default(),
                tok("u1", 1).as_ref(),
            )
            .await
        })
    });
    for c in calls.collect::<Vec<_>>() {
        c.await??;
    }
    assert_eq!(
        *f.backend
            .created
            .lock()
            .map_err(|_| AgentError::Internal("poison".into()))?,
        1
    );
    Ok(())
}

#[tokio::test]
async fn bad_input_is_refused_before_anything() -> Result<(), AgentError> {
    let f = fixture();
    let a = &f.agent;
    for id in [
        "../x",
        "a/../../b",
        "tank/a\0",
        "tank/a\n",
        &"x".repeat(4096),
        "other/v",
    ] {
        let r = a
            .create_volume(
                id,
                None,
                10,
                CreateOptions::default(),
                tok("u1", 1).as_ref(),
            )
            .await;
        assert!(
            matches!(r, Err(AgentError::InvalidArgument(_))),
            "{id:?}: {r:?}"
        );
    }
    f.backend
        .fail_next
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let failed = a
        .create_volume(
            "tank/v",
            None,
            10,
            CreateOptions::default(),
            tok("u1", 1).as_ref(),
        )
        .await;
    assert!(
        matches!(failed, Err(AgentError::InvalidArgument(_))),
        "{failed:?}"
    );
    assert_eq!(
        a.marks().volume_ids()?,
        Vec::<String>::new(),
        "a failed create leaves no mark"
    );
    let zero = a
        .create_volume(
            "tank/v",
            None,
            0,
            CreateOptions::default(),
            tok("u1", 1).as_ref(),
        )
        .await;
    assert!(matches!(zero, Err(AgentError::InvalidArgument(m)) if m.contains("capacity_bytes")));
    let lvm = a
        .create_volume(
            "tank/v",
            Some(BackendKind::Lvm),
            10,
            CreateOptions::default(),
            tok("u1", 1).as_ref(),
        )
        .await;
    assert!(matches!(lvm, Err(AgentError::InvalidArgument(_))));
    let bad_host = ExportRecord {
        acl: true,
        allowed_initiators: ["not an nqn".to_owned()].into(),
        chap: None,
        target: None,
    };
    let r = a
        .export_volume(
            "tank/v",
            None,
            Protocol::NvmeofTcp,
            bad_host,
            tok("u1", 1).as_ref(),
        )
        .await;
    assert!(matches!(r, Err(AgentError::InvalidArgument(_))));
    assert_eq!(a.marks().volume_ids()?, Vec::<String>::new());
    Ok(())
}

#[tokio::test]
async fn restart_recreates_exports_and_skips_corrupt_marks() -> Result<(), AgentError> {
    let f = fixture();
    let a = &f.agent;
    for v in ["tank/a", "tank/b"] {
        a.create_volume(v, None, 10, CreateOptions::default(), tok(v, 1).as_ref())
            .await?;
        a.export_volume(v, None, Protocol::NvmeofTcp, acl(), tok(v, 1).as_ref())
            .await?;
    }
    f.exporter
        .exports
        .lock()
        .map_err(|_| AgentError::Internal("poison".into()))?
        .clear();
    std::fs::write(
        a.marks()
            .dir()
            .join(format!("{}.mark.json", crate::marks::encode("tank/b"))),
        b"garbage",
    )
    .map_err(|e| AgentError::Internal(e.to_string()))?;
    let r = a.reconcile_from_marks().await?;
    assert_eq!(r.applied, 1);
    assert!(
        r.failed.len() == 1 && r.failed[0].contains("tank/b") && r.failed[0].contains("corrupt"),
        "{r:?}"
    );
    let restored = f
        .exporter
        .exports
        .lock()
        .map_err(|_| AgentError::Internal("poison".into()))?
        .get("tank/a")
        .cloned();
    assert_eq!(restored, Some(exported_acl("tank/a")));
    let corrupt = a
        .unexport_volume("tank/b", Protocol::NvmeofTcp, tok("tank/b", 1).as_ref())
        .await;
    assert!(matches!(corrupt, Err(AgentError::Internal(_))));
    Ok(())
}

#[tokio::test]
async fn calls_for_a_pool_no_backend_serves_are_refused_and_record_nothing(
) -> Result<(), AgentError> {
    let f = fixture();
    let a = &f.agent;
    let results = [
        a.unexport_volume("other/v", Protocol::NvmeofTcp, tok("u1", 1).as_ref())
            .await,
        a.set_initiator(
            "other/v",
            Protocol::NvmeofTcp,
            HOST,
            true,
            tok("u1", 1).as_ref(),
        )
        .await,
        a.set_initiator(
            "other/v",
            Protocol::NvmeofTcp,
            HOST,
            false,
            tok("u1", 1).as_ref(),
        )
        .await,
    ];
    for r in results {
        assert!(
            matches!(&r, Err(AgentError::InvalidArgument(m)) if m.contains("no backend")),
            "{r:?}"
        );
    }
    assert_eq!(a.marks().volume_ids()?, Vec::<String>::new());
    Ok(())
}

#[tokio::test]
async fn denying_an_initiator_of_a_volume_not_exported_succeeds_and_fences(
) -> Result<(), AgentError> {
    let f = fixture();
    let a = &f.agent;
    a.create_volume(
        "tank/v",
        None,
        10,
        CreateOptions::default(),
        tok("u1", 1).as_ref(),
    )
    .await?;
    // A Publish raised the generation to 2, its ExportVolume never came.
    let allow = a
        .set_initiator(
            "tank/v",
            Protocol::NvmeofTcp,
            HOST,
            true,
            tok("u1", 2).as_ref(),
        )
        .await;
    assert!(
        matches!(&allow, Err(AgentError::FailedPrecondition(m)) if m.contains("not exported")),
        "{allow:?}"
    );
    // Its Unpublish, at generation 3: nothing to cut off, done.
    a.set_initiator(
        "tank/v",
        Protocol::NvmeofTcp,
        HOST,
        false,
        tok("u1", 3).as_ref(),
    )
    .await?;
    // The generation is recorded: the lost Publish's export is refused.
    let late = a
        .export_volume(
            "tank/v",
            None,
            Protocol::NvmeofTcp,
            acl(),
            tok("u1", 2).as_ref(),
        )
        .await;
    assert!(
        matches!(&late, Err(AgentError::FailedPrecondition(_))),
        "{late:?}"
    );
    assert!(f
        .exporter
        .exports
        .lock()
        .map_err(|_| AgentError::Internal("poison".into()))?
        .is_empty());
    // A volume the agent does not hold: nothing admitted, no mark made.
    a.set_initiator(
        "tank/none",
        Protocol::NvmeofTcp,
        HOST,
        false,
        tok("u9", 1).as_ref(),
    )
    .await?;
    assert_eq!(a.marks().volume_ids()?, vec!["tank/v".to_owned()]);
    Ok(())
}

/// Issue 39, hole 6: a new export is made under the agent's own target
/// name and the mark records it; an export a mark records without a name
/// (written before names carried the agent) keeps the legacy name through
/// ACL changes, re-exports and a restart's reconcile, so no upgrade renames
/// a live target under its hosts.
#[tokio::test]
async fn exports_keep_the_target_name_they_were_made_under() -> Result<(), AgentError> {
    let f = fixture();
    let a = &f.agent;
    let kernel = |v: &str| {
        f.exporter
            .exports
            .lock()
            .map_err(|_| AgentError::Internal("poison".into()))
            .map(|e| e.get(v).and_then(|r| r.target.clone()))
    };
    a.create_volume(
        "tank/new",
        None,
        10,
        CreateOptions::default(),
        tok("n", 1).as_ref(),
    )
    .await?;
    let info = a
        .export_volume(
            "tank/new",
            None,
            Protocol::NvmeofTcp,
            acl(),
            tok("n", 1).as_ref(),
        )
        .await?;
    assert_eq!(info.target_id, "sim:tank/new");
    assert_eq!(kernel("tank/new")?.as_deref(), Some("sim:tank/new"));
    let mark = a
        .marks()
        .load("tank/new")?
        .ok_or_else(|| AgentError::Internal("no mark".into()))?;
    assert_eq!(
        mark.exports["nvmeof-tcp"].target.as_deref(),
        Some("sim:tank/new")
    );

    a.create_volume(
        "tank/old",
        None,
        10,
        CreateOptions::default(),
        tok("o", 1).as_ref(),
    )
    .await?;
    a.export_volume(
        "tank/old",
        None,
        Protocol::NvmeofTcp,
        acl(),
        tok("o", 1).as_ref(),
    )
    .await?;
    // The mark as an agent before this change wrote it: no target name.
    let file = a
        .marks()
        .dir()
        .join(format!("{}.mark.json", crate::marks::encode("tank/old")));
    let text = std::fs::read_to_string(&file).map_err(|e| AgentError::Internal(e.to_string()))?;
    let mut json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| AgentError::Internal(e.to_string()))?;
    let record = json["exports"]["nvmeof-tcp"]
        .as_object_mut()
        .ok_or_else(|| AgentError::Internal(format!("no export in {text}")))?;
    assert_eq!(record.remove("target"), Some("sim:tank/old".into()));
    std::fs::write(&file, json.to_string()).map_err(|e| AgentError::Internal(e.to_string()))?;
    a.set_initiator(
        "tank/old",
        Protocol::NvmeofTcp,
        "nqn.2026-01.org.example:b",
        true,
        tok("o", 1).as_ref(),
    )
    .await?;
    assert_eq!(kernel("tank/old")?, None, "the legacy name is kept");
    let info = a
        .export_volume(
            "tank/old",
            None,
            Protocol::NvmeofTcp,
            acl(),
            tok("o", 1).as_ref(),
        )
        .await?;
    assert_eq!(info.target_id, "tank/old", "the simulator's legacy name");
    f.exporter
        .exports
        .lock()
        .map_err(|_| AgentError::Internal("poison".into()))?
        .clear();
    assert_eq!(a.reconcile_from_marks().await?.applied, 2);
    assert_eq!(kernel("tank/old")?, None);
    assert_eq!(kernel("tank/new")?.as_deref(), Some("sim:tank/new"));
    Ok(())
}
