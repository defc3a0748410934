//! The demo: a claim's life through controller, agent and node in the
//! kernel lab, each step with what the kernel and the API server show. Run
//! with `make demo`.
//!
//! The lab runner starts a real kube-apiserver on the host; in the lab
//! kernel run the agent (ZFS pool, LVM thin pool, nvmet, LIO) over mTLS,
//! `pillar-csi controller` against that API server and `pillar-csi node`.
//! The demo plays the user, the CSI sidecars and kubelet with the calls
//! they make: the same code as the `claim_` lab test
//! (`pillar_csi_lab::claim_life`).
use pillar_csi_lab::{claim_bed::ClaimBed, claim_cases::every_case, Result};

#[tokio::main]
async fn main() -> Result<()> {
    println!("Setting up: the CRDs, the agent, the controller, the node plugin, and");
    println!("the PillarAgent/PillarStore/PillarProtocol/PillarStorageClass objects.");
    let bed = ClaimBed::start("demo").await?;
    for line in bed.describe() {
        println!("  {line}");
    }
    let outcome = every_case(&bed).await;
    match &outcome {
        Ok(()) => {
            println!("\nEvery claim lived and was deleted; nothing is left on the storage side.")
        }
        Err(e) => eprintln!("\nthe demo failed: {e}\n{}", bed.logs()),
    }
    outcome
}
