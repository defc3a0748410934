//! A claim's life the way a cluster runs it: the API server (on the host),
//! `pillar-csi controller`, the real agent (ZFS, LVM, nvmet, LIO) over
//! mTLS and `pillar-csi node`, with this test in the roles of the user,
//! the external-provisioner, -attacher and -resizer and kubelet
//! (`pillar_csi_lab::claim_life`). One bed serves every case, so the
//! processes start once.
//!
//! Run with `make lab FILTER=claim_` (the runner starts the API server).
use pillar_csi_lab::{
    claim_bed::ClaimBed,
    claim_life::{legacy_zvol, life, Claim},
    Result,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn claim_zvol_nvme_tcp_lv_iscsi_and_an_imported_zvol() -> Result<()> {
    let bed = ClaimBed::start("claim").await?;
    let cases = async {
        life(
            &bed,
            &Claim {
                name: "zvol-nvme".into(),
                class: bed.zvol_nvme.clone(),
                bytes: 64 << 20,
                grown: Some(128 << 20),
                import: None,
            },
        )
        .await?;
        life(
            &bed,
            &Claim {
                name: "lv-iscsi".into(),
                class: bed.lv_iscsi.clone(),
                bytes: 320 << 20,
                grown: Some(400 << 20),
                import: None,
            },
        )
        .await?;
        let legacy = legacy_zvol(&bed, "legacy-data", 96 << 20)?;
        life(
            &bed,
            &Claim {
                name: "imported".into(),
                class: bed.zvol_iscsi.clone(),
                bytes: 64 << 20,
                grown: None,
                import: Some(legacy),
            },
        )
        .await
    };
    let outcome: Result<()> = cases.await;
    if let Err(e) = &outcome {
        eprintln!("{e}\n{}", bed.logs());
    }
    outcome
}
