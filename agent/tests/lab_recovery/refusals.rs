//! Each refusal of TransferVolumeOwnership from its real cause, each shown
//! to change nothing. The inspections go through `pillar-csi recovery
//! inspect` (shown equal to the JSON client's in the procedure test) and
//! the old export is removed with the gRPC client: this test's subject is
//! the agent's refusals, not the JSON form.
use crate::common::{grpc::*, *};
use crate::setup::{refusal, *};
use pillar_csi_lab::agent::pb;
use std::time::{Duration, SystemTime};

/// Each refusal of the spec from its real cause, each shown to change
/// nothing (the state folder's bytes, the LV, nvmet and LIO configfs, the
/// mounts); then the valid grant commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the kernel lab"]
async fn recovery_refusals_come_from_their_real_causes() -> R {
    let s = setup("recrefuse").await;
    let (_, first) = s.inspect_cli("1-before");
    s.unexport_old_grpc(&first).await;
    let refused = |why: &str| format!("recovery of volume {} refused: {why}", s.id);
    let check = |name: &str, before: Unchanged, message: String, want: &str| {
        note(&s.lab, &message);
        assert!(
            message.starts_with(&refused(want)),
            "{name}: want {want:?}, got {message:?}"
        );
        assert_eq!(s.unchanged(), before, "{name} changed something");
    };

    // Expired grant: signed two hours ago (issued 2h01m ago, expired 1h ago).
    let (inspect, _) = s.inspect_cli("2-idle");
    let two_hours_ago = prost_types::Timestamp::from(SystemTime::now() - Duration::from_secs(7200));
    let expired = s.sign(
        &inspect,
        &s.operator_key,
        3,
        Some(&two_hours_ago.to_string()),
    );
    let before = s.unchanged();
    check(
        "expired",
        before,
        refusal(s.transfer(&expired).await),
        "authorization: it expired at",
    );

    // Stale snapshot (16 minutes old).
    let stale = s.sign(&stale_snapshot(&s, &inspect), &s.operator_key, 3, None);
    let before = s.unchanged();
    check(
        "stale",
        before,
        refusal(s.transfer(&stale).await),
        "snapshot: issued at",
    );

    // Wrong key: an operator key that is not in the trust anchor.
    let (other_key, _) = openssl_key(&s.dir, "not-trusted", "rsa");
    let wrong = s.sign(&inspect, &other_key, 3, None);
    let before = s.unchanged();
    check(
        "wrong key",
        before,
        refusal(s.transfer(&wrong).await),
        &format!(
            "authorization: its signature does not verify against any key of the trust anchor {}",
            s.anchor.display()
        ),
    );

    // Digest mismatch: a grant over one snapshot sent with another.
    let good = s.sign(&inspect, &s.operator_key, 3, None);
    let (inspect_b, _) = s.inspect_cli("3-other");
    let other = s.sign(&inspect_b, &s.operator_key, 3, None);
    let mixed = Signed {
        snapshot: other.snapshot.clone(),
        ..good.clone()
    };
    let before = s.unchanged();
    check(
        "digest",
        before,
        refusal(s.transfer(&mixed).await),
        "authorization: its snapshot_digest",
    );

    // The LV mounted at transfer time (the grant was signed while idle).
    let mnt = mkdir_tmp();
    sh(&format!("mount -o ro {} {}", s.dev(), mnt.display()));
    let before = s.unchanged();
    let r = s.transfer(&good).await;
    let after = s.unchanged();
    sh(&format!("umount {}", mnt.display()));
    note(&s.lab, &format!("{r:?}"));
    let message = refusal(r);
    assert_eq!(
        message,
        refused(&format!(
            "in use: device {} is mounted at {}; unmount it first",
            s.dev(),
            mnt.display()
        ))
    );
    assert_eq!(after, before, "mounted: nothing changed");

    // An export still admitting an initiator at transfer time (made by the
    // old lifecycle after the snapshot, at the same generation).
    let mut c = s.agent.client().await?;
    let info = c
        .export_volume(pb::ExportVolumeRequest {
            volume_id: s.id.clone(),
            backend_type: LVM,
            protocol_type: pb::ProtocolType::NvmeofTcp as i32,
            fence: fence(OLD, 2),
            acl_enabled: true,
            allowed_initiators: vec![HOST_NQN.into()],
            chap: None,
        })
        .await?
        .into_inner();
    let before = s.unchanged();
    check(
        "export",
        before,
        refusal(s.transfer(&good).await),
        &format!(
            "export: nvmeof-tcp target {} still admits {HOST_NQN}; unexport it under the old lifecycle's token first",
            info.target_id
        ),
    );
    let (_, exported) = s.inspect_cli("4-exported");
    s.unexport_old_grpc(&exported).await;

    // Nothing was recorded by any refusal: the valid grant now commits.
    assert_eq!(s.mark().fence.live.unwrap().volume_uid, OLD);
    let reply = s.transfer(&good).await?;
    assert_eq!(reply.outcome, pb::TransferOutcome::Committed as i32);
    // Any other grant after the commit is refused.
    let late = refusal(s.transfer(&other).await);
    note(&s.lab, &late);
    assert!(
        late.contains(&format!("lifecycle {OLD} has ended")),
        "{late}"
    );
    assert_eq!(read_file_on(&s.dev(), "data.txt"), "data before the loss\n");
    drop(s.agent);
    sh(&format!("lvremove -q -y {}", s.id));
    Ok(())
}
