//! The demo: a volume's lifecycle through the agent in the kernel lab, each
//! step with what the kernel shows. Run with `make demo`.
//!
//! The agent binary runs in the lab kernel with a ZFS and an LVM backend; the
//! demo is its gRPC client and, with the kernel's NVMe/TCP and iSCSI
//! initiators, the worker node.
use pillar_csi_lab::{
    agent::{AgentConfig, AgentProcess, Client, ZfsParent},
    block::{pattern, read_at, write_at},
    iscsi, nvme, run, Lab, Result,
};
use pillar_csi_proto::agent::v1 as pb;
use std::{fs, path::Path};

const HOST: &str = "nqn.2026-01.com.bhyoo.pillar-csi:demo-worker";

fn fence(generation: u64) -> Option<pb::FenceToken> {
    Some(pb::FenceToken {
        volume_uid: "demo-pvc-uid".into(),
        generation,
    })
}

fn sectors(dev: &Path) -> Result<u64> {
    let name = fs::canonicalize(dev)?;
    let name = name
        .file_name()
        .ok_or("no device name")?
        .to_string_lossy()
        .into_owned();
    Ok(fs::read_to_string(format!("/sys/class/block/{name}/size"))?
        .trim()
        .parse()?)
}

async fn zvol_over_nvme(client: &mut Client, parent: &ZfsParent, lab: &Lab) -> Result<()> {
    let volume_id = format!("{}/demo-vol", parent.pool);
    let created = client
        .create_volume(pb::CreateVolumeRequest {
            volume_id: volume_id.clone(),
            backend_type: pb::BackendType::ZfsZvol as i32,
            capacity_bytes: 256 << 20,
            fence: fence(1),
            zfs_properties: [("compression".to_owned(), "lz4".to_owned())].into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    let volsize = run(
        "zfs",
        &[
            "get",
            "-Hp",
            "-o",
            "value",
            "volsize",
            &format!("{}/demo-vol", parent.dataset()),
        ],
    )?;
    println!(
        "1. CreateVolume {volume_id}: {} bytes at {} (zfs reports volsize {})",
        created.capacity_bytes,
        created.device_path,
        volsize.trim()
    );

    let export = client
        .export_volume(pb::ExportVolumeRequest {
            volume_id: volume_id.clone(),
            backend_type: pb::BackendType::ZfsZvol as i32,
            protocol_type: pb::ProtocolType::NvmeofTcp as i32,
            fence: fence(2),
            acl_enabled: true,
            allowed_initiators: vec![HOST.into()],
            chap: None,
        })
        .await?
        .into_inner();
    let sub = nvmet::Nvmet::open()?.read()?;
    let nqn = nvmet::Nqn::new(&export.target_id)?;
    let present = &sub.subsystems[&nqn];
    println!(
        "2. ExportVolume over NVMe/TCP: {} on {}:{} namespace {}; configfs: device_path={} allowed_hosts={:?}",
        export.target_id,
        export.address,
        export.port,
        export.lun,
        present.namespaces.values().next().map(|n| n.device_path.display().to_string()).unwrap_or_default(),
        present.allowed_hosts.iter().map(|h| h.to_string()).collect::<Vec<_>>()
    );

    let conn = nvme::Connection::tcp(&export.address, export.port as u16, &export.target_id, HOST)?;
    let disk = conn.namespace_device(export.lun)?;
    println!(
        "3. worker connected as {HOST}: {} ({} bytes)",
        disk.display(),
        sectors(&disk)? * 512
    );
    run("mkfs.ext4", &["-q", "-F", &disk.to_string_lossy()])?;
    let mnt = lab.work.join("demo-mnt");
    fs::create_dir_all(&mnt)?;
    run("mount", &[&disk.to_string_lossy(), &mnt.to_string_lossy()])?;
    let data = pattern(2026, 8 << 20);
    fs::write(mnt.join("data.bin"), &data)?;
    run("umount", &[&mnt.to_string_lossy()])?;
    run("mount", &[&disk.to_string_lossy(), &mnt.to_string_lossy()])?;
    let back = fs::read(mnt.join("data.bin"))?;
    run("umount", &[&mnt.to_string_lossy()])?;
    println!(
        "4. mkfs.ext4, mount, wrote {} bytes to data.bin, remounted, read {} bytes back: {}",
        data.len(),
        back.len(),
        if back == data {
            "identical"
        } else {
            "DIFFERENT"
        }
    );
    if back != data {
        return Err("the file read back differs".into());
    }

    let before = sectors(&disk)? * 512;
    let expanded = client
        .expand_volume(pb::ExpandVolumeRequest {
            volume_id: volume_id.clone(),
            backend_type: pb::BackendType::ZfsZvol as i32,
            requested_bytes: 512 << 20,
            fence: fence(2),
        })
        .await?
        .into_inner();
    std::thread::sleep(std::time::Duration::from_secs(1));
    println!(
        "5. ExpandVolume to {} bytes: the connected worker's {} went from {before} to {} bytes",
        expanded.capacity_bytes,
        disk.display(),
        sectors(&disk)? * 512
    );

    drop(conn);
    client
        .unexport_volume(pb::UnexportVolumeRequest {
            volume_id: volume_id.clone(),
            protocol_type: pb::ProtocolType::NvmeofTcp as i32,
            fence: fence(3),
        })
        .await?;
    let left = nvmet::Nvmet::open()?.read()?;
    println!(
        "6. disconnected, UnexportVolume: subsystems left in configfs: {}",
        left.subsystems.len()
    );
    client
        .delete_volume(pb::DeleteVolumeRequest {
            volume_id: volume_id.clone(),
            backend_type: pb::BackendType::ZfsZvol as i32,
            fence: fence(3),
        })
        .await?;
    let gone = run(
        "zfs",
        &["list", "-H", "-o", "name", "-r", &parent.dataset()],
    )?;
    println!(
        "7. DeleteVolume: datasets under {}: {:?}",
        parent.dataset(),
        gone.lines().collect::<Vec<_>>()
    );
    let stale = client
        .create_volume(pb::CreateVolumeRequest {
            volume_id,
            backend_type: pb::BackendType::ZfsZvol as i32,
            capacity_bytes: 1 << 20,
            fence: fence(3),
            ..Default::default()
        })
        .await;
    println!(
        "   the ended lifecycle's token is refused: {}",
        stale
            .err()
            .map(|s| format!("{:?}: {}", s.code(), s.message()))
            .unwrap_or_else(|| "ACCEPTED (wrong)".into())
    );
    Ok(())
}

async fn thin_lv_over_iscsi(client: &mut Client, lab: &Lab, iscsi_port: u16) -> Result<()> {
    let volume_id = format!("{}/demo-lv", lab.vg);
    let initiator = iscsi::initiator_name()?;
    let created = client
        .create_volume(pb::CreateVolumeRequest {
            volume_id: volume_id.clone(),
            backend_type: pb::BackendType::Lvm as i32,
            capacity_bytes: 128 << 20,
            fence: fence(1),
            lvm_provisioning: pb::LvmProvisioning::Thin as i32,
            ..Default::default()
        })
        .await?
        .into_inner();
    let lvs = run(
        "lvs",
        &[
            "--noheadings",
            "-o",
            "lv_name,segtype,pool_lv,lv_size",
            "--units",
            "b",
            &volume_id,
        ],
    )?;
    println!(
        "8. CreateVolume {volume_id} (thin): {} bytes at {}; lvs: {}",
        created.capacity_bytes,
        created.device_path,
        lvs.trim()
    );
    let export = client
        .export_volume(pb::ExportVolumeRequest {
            volume_id: volume_id.clone(),
            backend_type: pb::BackendType::Lvm as i32,
            protocol_type: pb::ProtocolType::Iscsi as i32,
            fence: fence(2),
            acl_enabled: true,
            allowed_initiators: vec![initiator.clone()],
            chap: None,
        })
        .await?
        .into_inner();
    let portal = format!("127.0.0.1:{iscsi_port}");
    println!(
        "9. ExportVolume over iSCSI: {} on {portal} LUN {} for {initiator}",
        export.target_id, export.lun
    );
    let session = iscsi::Session::login(&export.target_id, &portal, None)?;
    let disk = session.disk(export.lun as u16)?;
    let data = pattern(7, 4 << 20);
    write_at(&disk, 0, &data)?;
    let back = read_at(&disk, 0, data.len())?;
    let direct = read_at(Path::new(&created.device_path), 0, data.len())?;
    println!(
        "10. logged in: {}; wrote {} bytes, read back {}: {}; on the LV itself: {}",
        disk.display(),
        data.len(),
        back.len(),
        if back == data {
            "identical"
        } else {
            "DIFFERENT"
        },
        if direct == data {
            "identical"
        } else {
            "DIFFERENT"
        }
    );
    if back != data || direct != data {
        return Err("data read back differs".into());
    }
    drop(session);
    client
        .delete_volume(pb::DeleteVolumeRequest {
            volume_id: volume_id.clone(),
            backend_type: pb::BackendType::Lvm as i32,
            fence: fence(2),
        })
        .await?;
    let left = lio::Lio::open()?.read()?;
    let lv_gone = run("lvs", &[&volume_id]).is_err();
    println!(
        "11. logged out, DeleteVolume (exports removed first): LIO targets left {}, LV gone: {lv_gone}",
        left.targets.len()
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let lab = Lab::get();
    let parent = ZfsParent::create(&lab, "demo")?;
    let backends = vec![
        parent.backend(),
        format!("lvm={}/{}", lab.vg, lab.thin_pool),
    ];
    let agent = AgentProcess::start(AgentConfig::new(&lab, "demo", backends, 4420, 3260)?).await?;
    println!(
        "0. pillar-csi agent serving on {} (healthy: {})",
        agent.addr(),
        agent
            .health()
            .components
            .iter()
            .map(|c| format!("{}={}", c.name, c.healthy))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let mut client = agent.client().await?;
    zvol_over_nvme(&mut client, &parent, &lab).await?;
    thin_lv_over_iscsi(&mut client, &lab, 3260).await?;
    Ok(())
}
