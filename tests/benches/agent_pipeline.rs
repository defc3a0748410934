//! Benchmark in the kernel lab: the agent's pipeline against its peers.
//!
//! 1. 50 zvols created, exported over NVMe/TCP with an ACL and an initiator
//!    allowed, through the agent's gRPC API: all 50 at once, and one at a
//!    time; against the same done one volume at a time by `zfs create -V`
//!    subprocesses and per-object shell writes to configfs.
//! 2. Restart reconciliation: the agent killed, configfs emptied, the agent
//!    started again re-creating every export from its fence marks (at half
//!    and at all of the exports, for linearity); against writing the same
//!    configfs state directly with a shell script.
//! 3. The agent's resident memory when idle.
//!
//! Run with `make bench FILTER=agent`. Absolute times under TCG mean little;
//! the ratios are the result.
use pillar_csi_lab::{
    agent::{AgentConfig, AgentProcess, Client, ZfsParent},
    bench::{empty_nvmet, ms, rss_kib},
    run, Lab, Result,
};
use pillar_csi_proto::agent::v1 as pb;
use std::{
    fmt::Write as _,
    io::Write as _,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

const PIPELINE: usize = 50;
const RESTART: usize = 500;
const HOST: &str = "nqn.2026-01.com.bhyoo.pillar-csi.bench:host";
const SIZE: u64 = 1 << 20;

fn fence(i: usize) -> Option<pb::FenceToken> {
    Some(pb::FenceToken {
        volume_uid: format!("uid-{i}"),
        generation: 1,
    })
}

async fn pipeline(mut client: Client, pool: String, name: String, i: usize) -> Result<()> {
    let volume_id = format!("{pool}/{name}");
    client
        .create_volume(pb::CreateVolumeRequest {
            volume_id: volume_id.clone(),
            backend_type: pb::BackendType::ZfsZvol as i32,
            capacity_bytes: SIZE,
            fence: fence(i),
            zfs_properties: [("sparse".to_owned(), "true".to_owned())].into(),
            ..Default::default()
        })
        .await?;
    client
        .export_volume(pb::ExportVolumeRequest {
            volume_id: volume_id.clone(),
            backend_type: pb::BackendType::ZfsZvol as i32,
            protocol_type: pb::ProtocolType::NvmeofTcp as i32,
            fence: fence(i),
            acl_enabled: true,
            allowed_initiators: vec![],
            chap: None,
        })
        .await?;
    client
        .allow_initiator(pb::AllowInitiatorRequest {
            volume_id,
            protocol_type: pb::ProtocolType::NvmeofTcp as i32,
            initiator_id: HOST.into(),
            fence: fence(i),
        })
        .await?;
    Ok(())
}

/// Runs `script` with bash on standard input; returns the wall time.
fn bash(script: &str) -> Result<Duration> {
    let start = Instant::now();
    let mut child = Command::new("bash").stdin(Stdio::piped()).spawn()?;
    child
        .stdin
        .take()
        .ok_or("no stdin")?
        .write_all(script.as_bytes())?;
    let status = child.wait()?;
    if !status.success() {
        return Err(format!("shell script failed: {status}").into());
    }
    Ok(start.elapsed())
}

/// The configfs writes of one NVMe/TCP export with an ACL, as a script would make them.
fn export_script(s: &mut String, nqn: &str, device: &str, port: u16) -> Result<()> {
    let n = "/sys/kernel/config/nvmet";
    writeln!(
        s,
        "mkdir {n}/subsystems/{nqn} {n}/subsystems/{nqn}/namespaces/1"
    )?;
    writeln!(
        s,
        "echo -n {device} > {n}/subsystems/{nqn}/namespaces/1/device_path"
    )?;
    writeln!(s, "echo 1 > {n}/subsystems/{nqn}/namespaces/1/enable")?;
    writeln!(s, "[ -d {n}/hosts/{HOST} ] || mkdir {n}/hosts/{HOST}")?;
    writeln!(
        s,
        "ln -s {n}/hosts/{HOST} {n}/subsystems/{nqn}/allowed_hosts/{HOST}"
    )?;
    writeln!(
        s,
        "ln -s {n}/subsystems/{nqn} {n}/ports/{port}/subsystems/{nqn}"
    )?;
    Ok(())
}

fn port_script(s: &mut String, port: u16, tcp: u16) -> Result<()> {
    let p = format!("/sys/kernel/config/nvmet/ports/{port}");
    writeln!(
        s,
        "mkdir {p}; echo tcp > {p}/addr_trtype; echo ipv4 > {p}/addr_adrfam"
    )?;
    writeln!(
        s,
        "echo 127.0.0.1 > {p}/addr_traddr; echo {tcp} > {p}/addr_trsvcid"
    )?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    if !pillar_csi_lab::bench::selected("agent_pipeline") {
        return Ok(());
    }
    let lab = Lab::get();
    let parent = ZfsParent::create(&lab, "bench-agent")?;
    let mut config = AgentConfig::new(&lab, "bench", vec![parent.backend()], 4450, 3270)?;
    // No periodic resync: it would put back what the bench empties between steps.
    config.resync_interval_seconds = Some(0);
    // The fence marks on the guest's own filesystem, where the agent keeps
    // them in production (/var/lib/pillar-csi), not on the 9p share of the
    // lab's work folder, whose fsyncs cost tens of milliseconds when the
    // host is busy.
    config.state_dir = std::path::PathBuf::from("/var/lib/pillar-csi/bench-agent");
    std::fs::create_dir_all(&config.state_dir)?;
    let mut agent = AgentProcess::start(config).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle_kib = agent.pid().map(rss_kib).transpose()?.unwrap_or(0);

    // 1. The pipeline: all at once, then one at a time.
    let mut client = agent.client().await?;
    let start = Instant::now();
    let tasks: Vec<_> = (0..PIPELINE)
        .map(|i| {
            tokio::spawn(pipeline(
                client.clone(),
                parent.pool.clone(),
                format!("c{i}"),
                i,
            ))
        })
        .collect();
    for t in tasks {
        t.await.map_err(|e| e.to_string())??;
    }
    let concurrent = start.elapsed();
    let start = Instant::now();
    for i in 0..PIPELINE {
        pipeline(
            client.clone(),
            parent.pool.clone(),
            format!("s{i}"),
            PIPELINE + i,
        )
        .await?;
    }
    let sequential = start.elapsed();

    // The peers: one volume at a time, zfs create -V then configfs writes.
    let mut setup = String::from("set -e\n");
    port_script(&mut setup, 40, 4451)?;
    bash(&setup)?;
    let start = Instant::now();
    for i in 0..PIPELINE {
        let ds = format!("{}/p{i}", parent.dataset());
        run("zfs", &["create", "-s", "-V", "1M", &ds])?;
        run("udevadm", &["settle"])?;
        let mut s = String::from("set -e\n");
        export_script(
            &mut s,
            &format!("nqn.2026-01.com.bhyoo.pillar-csi.bench:p{i}"),
            &format!("/dev/zvol/{ds}"),
            40,
        )?;
        bash(&s)?;
    }
    let peers = start.elapsed();
    println!(
        "agent_pipeline: {PIPELINE} x (create zvol + export NVMe/TCP with ACL + allow initiator)"
    );
    println!(
        "  agent, all at once  {:9.1} ms ({:.1} ms/volume)",
        ms(concurrent),
        ms(concurrent) / PIPELINE as f64
    );
    println!(
        "  agent, one at a time {:8.1} ms ({:.1} ms/volume)",
        ms(sequential),
        ms(sequential) / PIPELINE as f64
    );
    println!(
        "  zfs create -V + shell configfs writes, one at a time {:.1} ms ({:.1} ms/volume)",
        ms(peers),
        ms(peers) / PIPELINE as f64
    );
    println!(
        "  ratio peers/agent: all at once {:.2}x, one at a time {:.2}x",
        ms(peers) / ms(concurrent),
        ms(peers) / ms(sequential)
    );
    empty_nvmet()?;

    // 2. Restart reconciliation at half and all of RESTART exports.
    let mut volumes = 2 * PIPELINE;
    let mut restart = Vec::new();
    for target in [RESTART / 2, RESTART] {
        let tasks: Vec<_> = (volumes..target.max(volumes))
            .map(|i| {
                tokio::spawn(pipeline(
                    client.clone(),
                    parent.pool.clone(),
                    format!("r{i}"),
                    10_000 + i,
                ))
            })
            .collect();
        for t in tasks {
            t.await.map_err(|e| e.to_string())??;
        }
        volumes = volumes.max(target);
        // Every volume the agent made has a mark with its export.
        let exports = volumes;
        agent.kill()?;
        empty_nvmet()?;
        let start = Instant::now();
        agent.restart().await?;
        let took = start.elapsed();
        // The restarted agent listens on a new port.
        client = agent.client().await?;
        let back = nvmet::Nvmet::open()?.read()?.subsystems.len();
        if back != exports {
            return Err(format!("restart re-created {back} of {exports} exports").into());
        }
        // The same state written directly.
        empty_nvmet()?;
        let mut s = String::from("set -e\n");
        port_script(&mut s, 1, 4450)?;
        for i in 0..exports {
            export_script(
                &mut s,
                &format!("nqn.2026-01.com.bhyoo.pillar-csi.bench:d{i}"),
                &format!("/dev/zvol/{}/c0", parent.dataset()),
                1,
            )?;
        }
        let direct = bash(&s)?;
        empty_nvmet()?;
        restart.push((exports, took, direct));
    }
    println!("agent_pipeline: restart reconciliation (kill -9, configfs emptied, agent started until it answers)");
    for (n, took, direct) in &restart {
        println!(
            "  {n:4} exports: agent {:9.1} ms ({:.2} ms/export); direct shell writes {:9.1} ms ({:.2} ms/export); agent/direct {:.2}x",
            ms(*took),
            ms(*took) / *n as f64,
            ms(*direct),
            ms(*direct) / *n as f64,
            ms(*took) / ms(*direct)
        );
    }
    if let [(n1, t1, _), (n2, t2, _)] = restart.as_slice() {
        println!(
            "  linearity: time ratio {:.2} for {:.2}x the exports",
            ms(*t2) / ms(*t1),
            *n2 as f64 / *n1 as f64
        );
    }
    println!(
        "agent_pipeline: idle resident memory {:.1} MiB",
        idle_kib as f64 / 1024.0
    );
    agent.kill()?;
    Ok(())
}
