//! The `pillar-csi controller` binary killed with SIGKILL in the middle of
//! a provision, against a real kube-apiserver 1.20 and the simulated agent
//! behind mTLS (see `common`): once after the PillarVolumeState is written
//! and while the agent's CreateVolume has not run, once after the agent
//! created the volume and before the controller heard back. A new process
//! is started and the provisioner's retry of the same CreateVolume (what
//! external-provisioner does) converges each time to one record, one
//! volume and one handle.
mod common;

use api::crd::VolumePhase;
use common::*;
use pillar_csi_lab::csi::CsiProcess;
use pillar_csi_proto::csi::v1::controller_client::ControllerClient;
use std::ffi::OsString;
use std::path::Path;
use std::time::{Duration, Instant};

/// Starts the controller binary as its ServiceAccount, reaching the agent
/// over mTLS with the bed's certificates.
async fn start_controller(bed: &Bed, dir: &Path) -> Result<CsiProcess> {
    let args: Vec<OsString> = vec![
        "controller".into(),
        "--kubeconfig".into(),
        bed.server
            .kubeconfig_of("pillar-csi-controller")
            .into_os_string(),
        "--agent-tls-cert".into(),
        bed.certs.controller.cert.clone().into_os_string(),
        "--agent-tls-key".into(),
        bed.certs.controller.key.clone().into_os_string(),
        "--agent-tls-ca".into(),
        bed.certs.ca.pem.cert.clone().into_os_string(),
    ];
    CsiProcess::start(
        &args,
        &dir.join("csi.sock"),
        &dir.join("controller.log"),
        &[],
    )
    .await
}

/// Waits (30 s at most) until the agent was asked `method` `count` times.
async fn wait_for_calls(bed: &Bed, method: &str, count: usize) -> Result {
    let start = Instant::now();
    loop {
        let seen = bed
            .agent_calls_since(0)
            .iter()
            .filter(|m| **m == method)
            .count();
        if seen >= count {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(30) {
            return Err(format!("the agent saw {seen} {method}, not {count}, in 30 s").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Provisions a claim with the controller killed while CreateVolume is held
/// at `hold`; then a new controller answers the retry. Returns how many
/// zvols the agent held between the kill and the retry.
async fn provision_through_a_kill(bed: &Bed, claim_name: &str, hold: Hold) -> Result<usize> {
    let dir = tempfile::tempdir()?;
    let pv = claim(bed, "db", claim_name, &[]).await?;
    let request = create_request(&pv, 64 << 20, "hot", "db", claim_name);
    let zvols_before = bed.zvols();
    let creates_before = bed
        .agent_calls_since(0)
        .iter()
        .filter(|m| **m == "create_volume")
        .count();

    let mut first = start_controller(bed, dir.path()).await?;
    bed.hold.send_replace(hold);
    let mut client = ControllerClient::new(first.channel().await?);
    let sent = request.clone();
    let call = tokio::spawn(async move { client.create_volume(sent).await });
    wait_for_calls(bed, "create_volume", creates_before + 1).await?;
    if hold == Hold::Reply {
        // The reply is held only once the agent has created the volume.
        let start = Instant::now();
        while bed.zvols() == zvols_before && start.elapsed() < Duration::from_secs(30) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let record = state(bed, &pv)
        .await?
        .ok_or("no record before the agent call")?;
    assert_ne!(
        record.status.as_ref().and_then(|s| s.phase),
        Some(VolumePhase::Ready),
        "the agent has not answered yet"
    );
    first.kill()?;
    let died = call.await?;
    assert!(died.is_err(), "the killed controller answered: {died:?}");
    bed.hold.send_replace(Hold::None);
    let held_between = bed.zvols();

    let second = start_controller(bed, dir.path()).await?;
    let volume = ControllerClient::new(second.channel().await?)
        .create_volume(request.clone())
        .await?
        .into_inner()
        .volume
        .ok_or("no volume in the retry's reply")?;
    let record = state(bed, &pv).await?.ok_or("the record vanished")?;
    assert_eq!(volume.volume_id, record.spec.volume_id);
    assert_eq!(volume.capacity_bytes, 64 << 20);
    assert_eq!(
        record.status.as_ref().and_then(|s| s.phase),
        Some(VolumePhase::Ready)
    );
    // The same retry once more, as a provisioner that lost the reply.
    let again = ControllerClient::new(second.channel().await?)
        .create_volume(request)
        .await?
        .into_inner()
        .volume
        .ok_or("no volume in the second retry's reply")?;
    assert_eq!(again.volume_id, volume.volume_id);
    Ok(held_between)
}

#[tokio::test]
async fn a_controller_killed_mid_provision_converges_to_one_volume() -> Result {
    let bed = bed().await?;
    bed.server.kubectl(&["create", "namespace", "db"])?;

    // Killed after the record is written, the agent's CreateVolume not run.
    let held = provision_through_a_kill(&bed, "before-agent", Hold::Request).await?;
    println!("killed before the agent's create: the agent then held {held} zvol(s)");
    assert!(held <= 1);
    assert_eq!(states(&bed).await?.len(), 1);
    assert_eq!(bed.zvols(), 1, "one zvol for the one claim");

    // Killed after the agent created the volume, before the reply.
    let held = provision_through_a_kill(&bed, "after-agent", Hold::Reply).await?;
    assert_eq!(held, 2, "the agent had created the second claim's zvol");
    assert_eq!(states(&bed).await?.len(), 2);
    assert_eq!(bed.zvols(), 2, "one zvol per claim, none doubled");
    assert_eq!(bed.destroyed(), 0, "nothing destroyed on the way");
    Ok(())
}
