//! A claim's life the way a cluster runs it: the API server (on the host),
//! `pillar-csi controller`, the real agent (ZFS, LVM, nvmet, LIO) over
//! mTLS and `pillar-csi node`, with this test in the roles of the user,
//! the external-provisioner, -attacher and -resizer and kubelet
//! (`pillar_csi_lab::claim_life`, which the demo runs too). One bed serves
//! every case, so the processes start once.
//!
//! Run with `make lab FILTER=claim_` (the runner starts the API server).
use pillar_csi_lab::{claim_bed::ClaimBed, claim_cases::every_case, Result};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn claim_zvol_nvme_tcp_lv_iscsi_and_an_imported_zvol() -> Result<()> {
    let bed = ClaimBed::start("claim").await?;
    let outcome = every_case(&bed).await;
    if let Err(e) = &outcome {
        eprintln!("{e}\n{}", bed.logs());
    }
    outcome
}
