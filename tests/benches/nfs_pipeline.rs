//! Benchmark in the kernel lab: filesystem volumes made and exported over
//! NFS through the agent, against what a driver that shells out does.
//!
//! 20 volumes, each a ZFS filesystem with a 64 MiB refquota exported over
//! NFS to one client address:
//! - the agent: CreateVolume then ExportVolume through its gRPC API
//!   (libzfs_core's create and libzfs's mount in process, the volume's
//!   exports file and `exportfs -r`), all 20 at once and one at a time;
//! - the peers: one `bash` per volume running `zfs create -o refquota=64M`
//!   and `exportfs -o ... <client>:<path>` (what democratic-csi's and
//!   similar drivers' shell-outs amount to), 20 processes at once and one
//!   at a time.
//!
//! Run with `make bench FILTER=nfs_pipeline`. Absolute times under TCG mean
//! little; the ratios, measured in one run, are the result.
use pillar_csi_lab::{
    agent::{AgentConfig, AgentProcess, Client},
    bench::{bash, bash_command, conditions, ms, processes_at_once},
    nfs::{FsParent, CLIENT},
    Lab, Result,
};
use pillar_csi_proto::agent::v1 as pb;
use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

const VOLUMES: usize = 20;
const SIZE: u64 = 64 << 20;
const OPTIONS: &str = "rw,sync,no_subtree_check,no_root_squash";

fn fence(i: usize) -> Option<pb::FenceToken> {
    Some(pb::FenceToken {
        volume_uid: format!("uid-{i}"),
        generation: 1,
    })
}

/// CreateVolume and ExportVolume of volume `name`.
async fn through_agent(mut c: Client, id: String, i: usize) -> Result<()> {
    c.create_volume(pb::CreateVolumeRequest {
        volume_id: id.clone(),
        backend_type: pb::BackendType::ZfsDataset as i32,
        capacity_bytes: SIZE,
        fence: fence(i),
        ..Default::default()
    })
    .await?;
    c.export_volume(pb::ExportVolumeRequest {
        volume_id: id,
        backend_type: pb::BackendType::ZfsDataset as i32,
        protocol_type: pb::ProtocolType::Nfs as i32,
        fence: fence(i),
        acl_enabled: true,
        allowed_initiators: vec![CLIENT.into()],
        chap: None,
    })
    .await?;
    Ok(())
}

/// Removes every volume the agent made, through its API.
async fn agent_cleanup(c: &mut Client, ids: &[String]) -> Result<()> {
    for (i, id) in ids.iter().enumerate() {
        c.delete_volume(pb::DeleteVolumeRequest {
            volume_id: id.clone(),
            backend_type: pb::BackendType::ZfsDataset as i32,
            fence: fence(i),
        })
        .await?;
    }
    Ok(())
}

/// The shell-out of one peer volume.
fn peer_script(dataset: &str, path: &str) -> String {
    format!(
        "set -e; zfs create -o refquota={SIZE} {dataset}; exportfs -o {OPTIONS} {CLIENT}:{path}"
    )
}

/// Unexports and destroys the peers' volumes (`exportfs -u` does not find
/// an export by the address it was made for: exportfs names the client by
/// its host name; the agent's volumes are gone by then).
fn peer_cleanup(datasets: &[(String, String)]) -> Result<()> {
    let mut script = String::from("set -e\nexportfs -ua\n");
    for (dataset, _) in datasets {
        script.push_str(&format!("zfs destroy {dataset}\n"));
    }
    bash(&script)?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    if !pillar_csi_lab::bench::selected("nfs_pipeline") {
        return Ok(());
    }
    let lab = Lab::get();
    let made = FsParent::create(&lab, "bench-nfs")?;
    let (parent, at) = (made.dataset.clone(), made.at.clone());
    let mut config = AgentConfig::new(
        &lab,
        "bench-nfs",
        vec![format!("zfs-dataset={parent}")],
        4451,
        3273,
    )?;
    config.resync_interval_seconds = Some(0);
    // The marks on the guest's own filesystem, as in production (the
    // lab's work folder is a 9p share whose fsyncs are slow).
    config.state_dir = PathBuf::from("/var/lib/pillar-csi/bench-nfs");
    std::fs::create_dir_all(&config.state_dir)?;
    let agent = AgentProcess::start(config).await?;
    let mut client = agent.client().await?;
    let pool = lab.pool.clone();
    println!("nfs_pipeline: {}", conditions());

    // The agent, all at once, then one at a time.
    let at_once: Vec<String> = (0..VOLUMES).map(|i| format!("{pool}/a{i}")).collect();
    let start = Instant::now();
    let tasks: Vec<_> = at_once
        .iter()
        .enumerate()
        .map(|(i, id)| tokio::spawn(through_agent(client.clone(), id.clone(), i)))
        .collect();
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    let agent_at_once = start.elapsed();
    agent_cleanup(&mut client, &at_once).await?;
    let one_by_one: Vec<String> = (0..VOLUMES).map(|i| format!("{pool}/s{i}")).collect();
    let start = Instant::now();
    for (i, id) in one_by_one.iter().enumerate() {
        through_agent(client.clone(), id.clone(), i).await?;
    }
    let agent_serial = start.elapsed();
    agent_cleanup(&mut client, &one_by_one).await?;

    // The peers, all at once, then one at a time.
    let peers = |prefix: &str| -> Vec<(String, String)> {
        (0..VOLUMES)
            .map(|i| {
                (
                    format!("{parent}/{prefix}{i}"),
                    at.join(format!("{prefix}{i}")).display().to_string(),
                )
            })
            .collect()
    };
    let batch = peers("pa");
    let peers_at_once = processes_at_once(
        batch
            .iter()
            .map(|(d, p)| bash_command(&peer_script(d, p)))
            .collect(),
    )?;
    peer_cleanup(&batch)?;
    let serial = peers("ps");
    let mut peers_serial = Duration::ZERO;
    for (d, p) in &serial {
        peers_serial += bash(&peer_script(d, p))?;
    }
    peer_cleanup(&serial)?;

    let row = |what: &str, agent: Duration, peers: Duration| {
        println!(
            "nfs_pipeline: {VOLUMES} filesystems created and exported {what}: agent {:.0} ms, zfs create + exportfs {:.0} ms: agent {:.2}x faster",
            ms(agent),
            ms(peers),
            peers.as_secs_f64() / agent.as_secs_f64()
        );
    };
    row("at once", agent_at_once, peers_at_once);
    row("one at a time", agent_serial, peers_serial);
    Ok(())
}
