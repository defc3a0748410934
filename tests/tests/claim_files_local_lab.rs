//! Node-local directory volumes (PillarProtocol `local`) against the real
//! thing: the agent's directory backend and the node plugin share the lab
//! guest, as a storage node that also runs pods does. The real
//! external-provisioner reads the generated StorageClass's
//! `allowedTopologies` and the files identity's topology capability, and
//! kube-controller-manager binds the claim; the PV's node affinity names
//! the agent's node. The node bind-mounts the directory (no NFS export is
//! made), its pods see the project limit as the filesystem's size and meet
//! it with ENOSPC, a read-only publish is a read-only bind, an expansion
//! raises the limit; a publish to another node, a requisite without the
//! node, and stages naming a path outside `--local-root`, a directory the
//! node lacks or mount options are refused.
//!
//! Run with `tests/lab/run tests -- claim_files_local`.
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams};
use pillar_csi_lab::{
    claim_bed::ClaimBed,
    claim_life::NAMESPACE,
    claim_requests::{capability, create_volume, stage_volume, ClaimRef},
    csi::csi_pb as pb,
    files_bed::{claim, rwx, volume_of},
    k8s::{until, ControllerManager, Sidecars},
    nfs::{exported, fill, within},
    node_bed::mounted,
    project_fs::project_of,
    Result,
};
use std::time::Duration;
use tonic::Code;

const MIB: u64 = 1 << 20;
const KEY: &str = "topology.files.pillar-csi.bhyoo.com/node";
/// How long kube-controller-manager and the provisioner may take for a step.
const STEP: Duration = Duration::from_secs(180);

/// kubelet's NodeGetVolumeStats of `volume_id` published at `at`.
fn stats_request(volume_id: &str, at: &std::path::Path) -> pb::NodeGetVolumeStatsRequest {
    pb::NodeGetVolumeStatsRequest {
        volume_id: volume_id.to_owned(),
        volume_path: at.display().to_string(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn claim_files_local_volume_pinned_to_its_node_and_bind_mounted() -> Result<()> {
    let bed = ClaimBed::start_files("flocal").await?;
    let files = bed.files.as_ref().ok_or("no files side")?;
    let dirs = &files.directories;
    let node_name = bed.plugin.node_name.clone();
    let dir = bed.path("local");
    std::fs::create_dir_all(&dir)?;
    let _kcm = ControllerManager::start(&bed.server, &dir).await?;
    let _sidecars = Sidecars::start_on(&bed.server, &files.controller_socket, &dir).await?;

    // The node reports its node under the topology key; the generated
    // StorageClass allows the agent's node only.
    let mut node = files.node_client().await?;
    let info = node
        .node_get_info(pb::NodeGetInfoRequest {})
        .await?
        .into_inner();
    let segments = info.accessible_topology.ok_or("no topology")?.segments;
    assert_eq!(segments.get(KEY), Some(&node_name), "{segments:?}");
    let sc = bed.storage_class(&files.local_class).await?;
    assert_eq!(sc.provisioner, "files.pillar-csi.bhyoo.com");
    let terms = sc
        .allowed_topologies
        .clone()
        .ok_or("no allowedTopologies")?;
    let expr = &terms[0].match_label_expressions.clone().unwrap_or_default()[0];
    assert_eq!(
        (expr.key.as_str(), expr.values.clone()),
        (KEY, vec![node_name.clone()])
    );

    // A claim: provisioned by the real external-provisioner, bound by
    // kube-controller-manager; its PV is pinned to the node.
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(bed.admin.clone(), NAMESPACE);
    let pvs = Api::<PersistentVolume>::all(bed.admin.clone());
    let pv_name = claim(&bed.admin, "near", &files.local_class.storage_class, &[]).await?;
    let pv = until("PV of near Bound", STEP, || {
        let (pvs, name) = (pvs.clone(), pv_name.clone());
        async move {
            let pv = pvs.get_opt(&name).await?;
            let bound = pv
                .as_ref()
                .and_then(|p| p.status.as_ref())
                .and_then(|s| s.phase.as_deref())
                == Some("Bound");
            Ok(pv.filter(|_| bound))
        }
    })
    .await?;
    let spec = pv.spec.ok_or("no PV spec")?;
    let required = spec
        .node_affinity
        .and_then(|a| a.required)
        .ok_or("the PV has no required node affinity")?;
    let term = &required.node_selector_terms[0];
    let expr = &term.match_expressions.clone().unwrap_or_default()[0];
    assert_eq!(
        (
            expr.key.as_str(),
            expr.operator.as_str(),
            expr.values.clone()
        ),
        (KEY, "In", Some(vec![node_name.clone()]))
    );
    let csi = spec.csi.ok_or("no CSI source")?;
    assert!(
        csi.volume_handle.contains("/local/directory/dirs/"),
        "{}",
        csi.volume_handle
    );
    let volume = volume_of(&csi);
    let leaf = volume.volume_id.rsplit('/').next().unwrap_or_default();
    let path = dirs.root.join(leaf);
    assert!(path.is_dir(), "{} made", path.display());
    let project = project_of(&path)?;
    assert_eq!(dirs.fs.xfs_limit(project)?, 32 * MIB);

    // A CreateVolume whose requisite leaves the node out: refused, nothing made.
    let mut controller = files.controller_client().await?;
    let params = sc.parameters.clone().unwrap_or_default();
    let elsewhere = bed.lab.unique("elsewhere");
    let other_pv = format!("pvc-{elsewhere}");
    let mut create = create_volume(
        &params,
        ClaimRef {
            namespace: NAMESPACE,
            name: &elsewhere,
            pv: &other_pv,
        },
        32 * MIB,
        "",
    );
    create.volume_capabilities = vec![rwx(create.volume_capabilities[0].clone())];
    create.accessibility_requirements = Some(pb::TopologyRequirement {
        requisite: vec![pb::Topology {
            segments: [(KEY.to_owned(), "lab-node-2".to_owned())].into(),
        }],
        preferred: Vec::new(),
    });
    let children = dirs.children_count()?;
    let refused = controller
        .create_volume(create)
        .await
        .expect_err("the volume cannot be on lab-node-2");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused
            .message()
            .contains("none of the 1 requisite topologies"),
        "{refused:?}"
    );
    assert_eq!(dirs.children_count()?, children, "a refusal made nothing");

    // ControllerPublishVolume to another node: refused.
    let cap = rwx(capability(""));
    let refused = controller
        .controller_publish_volume(pb::ControllerPublishVolumeRequest {
            volume_id: volume.volume_id.clone(),
            node_id: "lab-node-2/127.0.0.2".into(),
            volume_capability: Some(cap.clone()),
            volume_context: volume.volume_context.clone(),
            ..Default::default()
        })
        .await
        .expect_err("another node cannot mount it");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(
        refused
            .message()
            .contains(&format!("it is node-local to node {node_name}")),
        "{refused:?}"
    );

    // NodeStageVolume refusals, nothing mounted: a forged publish context
    // naming a path outside --local-root, or a directory this node does
    // not have; mount options, which a bind mount does not take.
    let forged_at = bed.path("forged-staging");
    let context_naming = |target: &str| {
        [
            ("protocol", "local"),
            ("address", "127.0.0.1"),
            ("port", "0"),
            ("target", target),
            ("lun", "0"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    };
    let absent = dirs.root.join("not-here");
    let with_options = {
        let mut c = cap.clone();
        if let Some(pb::volume_capability::AccessType::Mount(m)) = &mut c.access_type {
            m.mount_flags = vec!["noatime".into()];
        }
        c
    };
    for (target, capability, code, needle) in [
        ("/etc", cap.clone(), Code::InvalidArgument, "--local-root"),
        (
            absent.to_str().ok_or("path")?,
            cap.clone(),
            Code::FailedPrecondition,
            "is not on this node",
        ),
        (
            path.to_str().ok_or("path")?,
            with_options,
            Code::InvalidArgument,
            "are not applied to it",
        ),
    ] {
        let mut forged = stage_volume(&volume, &context_naming(target), &forged_at, "");
        forged.volume_capability = Some(capability);
        let refused = node
            .node_stage_volume(forged)
            .await
            .expect_err("the stage must be refused");
        assert_eq!(refused.code(), code, "{target}: {refused:?}");
        assert!(refused.message().contains(needle), "{refused:?}");
        assert!(mounted(&forged_at)?.is_none());
    }
    assert!(!absent.exists(), "a refusal made nothing");

    // Published to its node and staged: the directory bound, not exported.
    let staging = bed.path("local-staging");
    let context = files.publish_and_stage(&volume, &staging).await?;
    assert_eq!(context.get("protocol").map(String::as_str), Some("local"));
    assert_eq!(
        context.get("target").map(String::as_str),
        Some(path.to_string_lossy().as_ref())
    );
    let shown = path.to_string_lossy().into_owned();
    assert!(
        !exported()?.lines().any(|l| l.starts_with(&shown)),
        "a node-local volume is never exported"
    );
    let line = mounted(&staging)?.ok_or("nothing bound at staging")?;
    assert!(line.contains(&format!(" /volumes/{leaf} ")), "{line}");
    assert!(line.contains(" - xfs "), "{line}");

    // A pod writes through its bind; the data is the directory's, the
    // project limit is the size it sees and the wall it meets.
    let target = bed.path("local-pod");
    node.node_publish_volume(pb::NodePublishVolumeRequest {
        volume_id: volume.volume_id.clone(),
        publish_context: context.clone(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    })
    .await?;
    std::fs::write(target.join("hello"), b"from a pod on the node")?;
    assert_eq!(
        std::fs::read(path.join("hello"))?,
        b"from a pod on the node"
    );
    let stats = stats_request(&volume.volume_id, &target);
    let stats = node
        .node_get_volume_stats(stats.clone())
        .await?
        .into_inner();
    let usage = stats.usage.first().ok_or("no usage")?;
    assert_eq!(usage.total, (32 * MIB) as i64, "{stats:?}");
    assert!(
        stats.volume_condition.as_ref().is_none_or(|c| !c.abnormal),
        "{stats:?}"
    );
    let big = target.join("big");
    let err = within(Duration::from_secs(120), move || fill(&big, 40))
        .expect_err("40 MiB cannot fit in 32 MiB");
    assert_eq!(err.raw_os_error(), Some(28), "ENOSPC, got {err}");
    std::fs::remove_file(path.join("big"))?;

    // A read-only publish beside it: a read-only bind, a write refused (EROFS).
    let reader = bed.path("local-reader");
    node.node_publish_volume(pb::NodePublishVolumeRequest {
        volume_id: volume.volume_id.clone(),
        publish_context: context.clone(),
        staging_target_path: staging.display().to_string(),
        target_path: reader.display().to_string(),
        volume_capability: Some(cap.clone()),
        readonly: true,
        ..Default::default()
    })
    .await?;
    assert_eq!(
        std::fs::read(reader.join("hello"))?,
        b"from a pod on the node"
    );
    let err = std::fs::write(reader.join("nope"), b"x").expect_err("read-only");
    assert_eq!(err.raw_os_error(), Some(30), "EROFS, got {err}");

    // ControllerExpandVolume raises the project's limit; no node step, the
    // pod's statfs follows at once. ABORTED (the record changed under the
    // call: the controller's reconcilers run beside it) is retried, as the
    // external-resizer does.
    let expand = pb::ControllerExpandVolumeRequest {
        volume_id: volume.volume_id.clone(),
        capacity_range: pillar_csi_lab::claim_requests::range(48 * MIB),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    };
    let mut attempts = 0;
    let grown = loop {
        attempts += 1;
        match controller.controller_expand_volume(expand.clone()).await {
            Err(e) if e.code() == Code::Aborted && attempts < 10 => {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            answer => break answer?.into_inner(),
        }
    };
    assert_eq!(grown.capacity_bytes, (48 * MIB) as i64);
    assert!(!grown.node_expansion_required);
    assert_eq!(dirs.fs.xfs_limit(project)?, 48 * MIB);
    let stats = node
        .node_get_volume_stats(stats_request(&volume.volume_id, &target))
        .await?
        .into_inner();
    assert_eq!(
        stats.usage.first().ok_or("no usage")?.total,
        (48 * MIB) as i64,
        "{stats:?}"
    );

    // Unpublished and unstaged: the binds go, the directory and its data stay.
    for at in [&target, &reader] {
        node.node_unpublish_volume(pb::NodeUnpublishVolumeRequest {
            volume_id: volume.volume_id.clone(),
            target_path: at.display().to_string(),
        })
        .await?;
    }
    files
        .unstage_and_unpublish(&volume.volume_id, &staging)
        .await?;
    assert!(mounted(&staging)?.is_none(), "staging unbound");
    assert_eq!(
        std::fs::read(path.join("hello"))?,
        b"from a pod on the node"
    );

    // The claim deleted (reclaim Delete): the external-provisioner's
    // DeleteVolume removes the directory and its project's limit.
    pvcs.delete("near", &DeleteParams::default()).await?;
    until("PV of near deleted", STEP, || {
        let (pvs, name) = (pvs.clone(), pv_name.clone());
        async move { Ok(pvs.get_opt(&name).await?.is_none().then_some(())) }
    })
    .await?;
    assert!(!path.exists(), "{shown} removed");
    assert_eq!(dirs.fs.xfs_limit(project)?, 0);
    Ok(())
}
