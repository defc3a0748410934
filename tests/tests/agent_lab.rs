//! The agent end to end in the kernel lab: the `pillar-csi agent` binary runs
//! as a child process, a Rust gRPC client drives it, the kernel NVMe/TCP
//! initiator and open-iscsi connect to what it exports, and the ZFS CLI and
//! the configfs trees (read with the nvmet and lio crates) are the witnesses.
//! Run with `tests/lab/run tests -- agent_`.
use pillar_csi_lab::{
    agent::{pb, AgentConfig, AgentProcess, Client, ClientTls, ServerTls, ZfsParent},
    block::{pattern, read_at, write_at},
    iscsi::{self, Iface, Session},
    mount::Mounted,
    nvme::Connection,
    run,
    tls::Ca,
    Lab, Result,
};
use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
};
use tonic::{Code, Status};

/// NVMe/TCP and iSCSI ports of the agents under test (on 127.0.0.1), apart
/// from the ports the nvmet and lio lab tests use.
const NVME_PORT: u16 = 4430;
const ISCSI_PORT: u16 = 3270;
/// The size of the test volumes.
const SIZE: u64 = 64 << 20;
/// The nvmet port ID the agent's listener uses.
const AGENT_NVMET_PORT: nvmet::PortId = nvmet::PortId(1);

fn fence(uid: &str, generation: u64) -> Option<pb::FenceToken> {
    Some(pb::FenceToken {
        volume_uid: uid.to_owned(),
        generation,
    })
}

fn host_nqn(lab: &Lab, name: &str) -> String {
    format!("nqn.2026-01.com.bhyoo.pillar-csi.lab:{}", lab.unique(name))
}

const ZVOL: i32 = pb::BackendType::ZfsZvol as i32;
const NVME: i32 = pb::ProtocolType::NvmeofTcp as i32;
const ISCSI: i32 = pb::ProtocolType::Iscsi as i32;

/// A plaintext agent over a fresh parent dataset.
async fn plaintext_agent(lab: &Lab, name: &str) -> Result<(ZfsParent, AgentProcess)> {
    let parent = ZfsParent::create(lab, name)?;
    let config = AgentConfig::new(
        lab,
        &lab.unique(name),
        vec![parent.backend()],
        NVME_PORT,
        ISCSI_PORT,
    )?;
    let agent = AgentProcess::start(config).await?;
    assert!(
        agent.health().healthy,
        "a fresh agent reports healthy: {:?}",
        agent.health()
    );
    Ok((parent, agent))
}

fn create_request(id: &str, fence: Option<pb::FenceToken>) -> pb::CreateVolumeRequest {
    pb::CreateVolumeRequest {
        volume_id: id.to_owned(),
        backend_type: ZVOL,
        capacity_bytes: SIZE,
        fence,
        ..Default::default()
    }
}

fn export_request(
    id: &str,
    protocol: i32,
    initiators: &[&str],
    fence: Option<pb::FenceToken>,
) -> pb::ExportVolumeRequest {
    pb::ExportVolumeRequest {
        volume_id: id.to_owned(),
        backend_type: ZVOL,
        protocol_type: protocol,
        fence,
        acl_enabled: true,
        allowed_initiators: initiators.iter().map(|s| (*s).to_owned()).collect(),
        chap: None,
    }
}

/// The error of `r`, checked to have `code` and to mention `needle`.
fn refused<T: std::fmt::Debug>(
    r: std::result::Result<tonic::Response<T>, Status>,
    code: Code,
    needle: &str,
    what: &str,
) -> Result<String> {
    match r {
        Ok(v) => Err(format!("{what}: accepted ({:?}), expected {code:?}", v.get_ref()).into()),
        Err(s) if s.code() == code && s.message().contains(needle) => Ok(s.message().to_owned()),
        Err(s) => Err(format!(
            "{what}: got {:?} {:?}, expected {code:?} mentioning {needle:?}",
            s.code(),
            s.message()
        )
        .into()),
    }
}

/// Everything a refused request must leave as it was: the datasets under
/// the test's parent, the nvmet and LIO configfs trees, and the agent's
/// fence marks (names and bytes).
#[derive(Debug, PartialEq)]
struct Witness {
    zfs: Vec<String>,
    nvmet: nvmet::State,
    lio: lio::State,
    marks: Vec<(String, Vec<u8>)>,
}

fn witness(parent: &ZfsParent, state_dir: &Path) -> Result<Witness> {
    let mut marks = Vec::new();
    for entry in fs::read_dir(state_dir)? {
        let entry = entry?;
        marks.push((
            entry.file_name().to_string_lossy().into_owned(),
            fs::read(entry.path())?,
        ));
    }
    marks.sort();
    Ok(Witness {
        zfs: parent.children()?,
        nvmet: nvmet::Nvmet::open()?.read()?,
        lio: lio::Lio::open()?.read()?,
        marks,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn agent_plaintext_zvol_round_trip_over_nvme_tcp_and_iscsi() -> Result<()> {
    let lab = Lab::get();
    let (parent, agent) = plaintext_agent(&lab, "agent-rt").await?;
    let mut c = agent.client().await?;

    let caps = c
        .get_capabilities(pb::GetCapabilitiesRequest {})
        .await?
        .into_inner();
    assert_eq!(caps.backend_types, vec![ZVOL], "{caps:?}");
    let protocols: BTreeSet<i32> = caps.protocol_types.iter().copied().collect();
    assert_eq!(protocols, [NVME, ISCSI].into(), "{caps:?}");
    assert!(!caps.agent_version.is_empty());
    let capacity = c
        .get_capacity(pb::GetCapacityRequest {
            backend_type: ZVOL,
            pool: lab.pool.clone(),
        })
        .await?
        .into_inner();
    assert!(
        capacity.total_bytes > SIZE && capacity.available_bytes > SIZE,
        "{capacity:?}"
    );

    // CreateVolume: a zvol under the parent dataset; a repeat is the same volume.
    let name = lab.unique("vol");
    let id = format!("{}/{name}", lab.pool);
    let dataset = format!("{}/{name}", parent.dataset());
    let uid = lab.unique("uid");
    let created = c
        .create_volume(create_request(&id, fence(&uid, 1)))
        .await?
        .into_inner();
    assert_eq!(created.volume_id, id);
    assert_eq!(created.capacity_bytes, SIZE);
    assert_eq!(created.device_path, format!("/dev/zvol/{dataset}"));
    assert!(Path::new(&created.device_path).exists());
    assert_eq!(
        parent.children()?,
        vec![format!("{dataset}\tvolume\t{SIZE}")],
        "zfs list shows exactly the new zvol"
    );
    let again = c
        .create_volume(create_request(&id, fence(&uid, 1)))
        .await?
        .into_inner();
    assert_eq!(
        again, created,
        "a repeated CreateVolume returns the same volume"
    );
    assert_eq!(parent.children()?.len(), 1);
    let listed = c
        .list_volumes(pb::ListVolumesRequest {})
        .await?
        .into_inner();
    let v = listed
        .volumes
        .iter()
        .find(|v| v.volume_id == id)
        .ok_or("ListVolumes does not show the new volume")?;
    assert_eq!(
        (v.backend_type, v.capacity_bytes, v.ended, v.fence.clone()),
        (ZVOL, SIZE, false, fence(&uid, 1))
    );

    // NVMe/TCP with an ACL: host A from the export, host B by AllowInitiator.
    let host_a = host_nqn(&lab, "host-a");
    let host_b = host_nqn(&lab, "host-b");
    let stranger = host_nqn(&lab, "host-stranger");
    let exported = c
        .export_volume(export_request(&id, NVME, &[&host_a], fence(&uid, 2)))
        .await?
        .into_inner();
    assert_eq!(
        (exported.address.as_str(), exported.port, exported.lun),
        ("127.0.0.1", u32::from(NVME_PORT), 1)
    );
    c.allow_initiator(pb::AllowInitiatorRequest {
        volume_id: id.clone(),
        protocol_type: NVME,
        initiator_id: host_b.clone(),
        fence: fence(&uid, 2),
    })
    .await?;
    let nqn = nvmet::Nqn::new(&exported.target_id)?;
    let present = nvmet::Nvmet::open()?.read()?;
    let sub = present
        .subsystems
        .get(&nqn)
        .ok_or("the subsystem is not in configfs")?;
    assert!(!sub.allow_any_host);
    assert_eq!(
        sub.allowed_hosts,
        [nvmet::Nqn::new(&host_a)?, nvmet::Nqn::new(&host_b)?].into()
    );
    let ns = &sub.namespaces[&nvmet::Nsid::new(1)?];
    assert_eq!(
        (ns.device_path.clone(), ns.enabled),
        (PathBuf::from(&created.device_path), true)
    );
    let port = &present.ports[&AGENT_NVMET_PORT];
    assert_eq!(port.address, Some(([127, 0, 0, 1], NVME_PORT).into()));
    assert!(port.subsystems.contains(&nqn));

    assert!(
        Connection::tcp("127.0.0.1", NVME_PORT, nqn.as_str(), &stranger).is_err(),
        "a host that was never allowed connected"
    );
    let text = pattern(1, 256 << 10);
    let mnt = lab.work.join(lab.unique("mnt"));
    {
        let conn = Connection::tcp("127.0.0.1", NVME_PORT, nqn.as_str(), &host_b)?;
        let disk = conn.namespace_device(1)?;
        run("mkfs.ext4", &["-q", "-F", &disk.to_string_lossy()])?;
        let m = Mounted::mount(&disk, mnt.clone(), "rw")?;
        fs::write(mnt.join("over-nvme"), &text)?;
        m.unmount()?;
    }
    {
        let conn = Connection::tcp("127.0.0.1", NVME_PORT, nqn.as_str(), &host_a)?;
        let disk = conn.namespace_device(1)?;
        let m = Mounted::mount(&disk, mnt.clone(), "ro")?;
        assert!(
            fs::read(mnt.join("over-nvme"))? == text,
            "the file reads back over NVMe/TCP"
        );
        m.unmount()?;
    }
    c.deny_initiator(pb::DenyInitiatorRequest {
        volume_id: id.clone(),
        protocol_type: NVME,
        initiator_id: host_b.clone(),
        fence: fence(&uid, 2),
    })
    .await?;
    assert!(
        Connection::tcp("127.0.0.1", NVME_PORT, nqn.as_str(), &host_b).is_err(),
        "a denied host connected"
    );
    c.unexport_volume(pb::UnexportVolumeRequest {
        volume_id: id.clone(),
        protocol_type: NVME,
        fence: fence(&uid, 2),
    })
    .await?;
    let present = nvmet::Nvmet::open()?.read()?;
    assert!(!present.subsystems.contains_key(&nqn));
    assert!(present
        .ports
        .get(&AGENT_NVMET_PORT)
        .is_none_or(|p| !p.subsystems.contains(&nqn)));

    // iSCSI with an ACL for the guest's initiator name.
    let iqn = iscsi::initiator_name()?;
    let exported = c
        .export_volume(export_request(&id, ISCSI, &[&iqn], fence(&uid, 3)))
        .await?
        .into_inner();
    assert_eq!(
        (exported.address.as_str(), exported.port, exported.lun),
        ("127.0.0.1", u32::from(ISCSI_PORT), 0)
    );
    let target = lio::Iqn::new(&exported.target_id)?;
    let present = lio::Lio::open()?.read()?;
    let tpg = present
        .targets
        .get(&target)
        .and_then(|t| t.tpgs.values().next())
        .ok_or("the iSCSI target is not in configfs")?;
    assert!(tpg.enabled);
    assert_eq!(
        tpg.acls.keys().map(|a| a.as_str()).collect::<Vec<_>>(),
        vec![iqn.as_str()]
    );
    assert!(tpg.portals.contains(&([127, 0, 0, 1], ISCSI_PORT).into()));
    let object = &tpg.luns[&lio::Lun(0)].storage_object;
    assert_eq!(
        present.storage_objects[object].udev_path,
        PathBuf::from(&created.device_path)
    );

    let portal = format!("127.0.0.1:{ISCSI_PORT}");
    let other = Iface::new(
        &lab.unique("agent-other"),
        &format!("iqn.2003-01.org.example.lab:{}", lab.unique("other")),
    )?;
    assert!(
        Session::login(target.as_str(), &portal, Some(&other)).is_err(),
        "an initiator outside the ACL logged in"
    );
    let more = pattern(2, 128 << 10);
    {
        let session = Session::login(target.as_str(), &portal, None)?;
        let disk = session.disk(0)?;
        let m = Mounted::mount(&disk, mnt.clone(), "rw")?;
        assert!(
            fs::read(mnt.join("over-nvme"))? == text,
            "the file written over NVMe/TCP reads back over iSCSI"
        );
        fs::write(mnt.join("over-iscsi"), &more)?;
        m.unmount()?;
    }
    c.unexport_volume(pb::UnexportVolumeRequest {
        volume_id: id.clone(),
        protocol_type: ISCSI,
        fence: fence(&uid, 3),
    })
    .await?;
    let present = lio::Lio::open()?.read()?;
    assert!(!present.targets.contains_key(&target));
    assert!(!present.storage_objects.contains_key(object));
    // The bytes are on the zvol itself.
    {
        let m = Mounted::mount(Path::new(&created.device_path), mnt.clone(), "ro")?;
        assert!(fs::read(mnt.join("over-nvme"))? == text);
        assert!(fs::read(mnt.join("over-iscsi"))? == more);
        m.unmount()?;
    }

    // DeleteVolume: the zvol is gone; the identical retry succeeds.
    let delete = pb::DeleteVolumeRequest {
        volume_id: id.clone(),
        backend_type: ZVOL,
        fence: fence(&uid, 3),
    };
    c.delete_volume(delete.clone()).await?;
    assert_eq!(parent.children()?, Vec::<String>::new(), "the zvol is gone");
    assert!(!Path::new(&created.device_path).exists());
    c.delete_volume(delete).await?;
    let listed = c
        .list_volumes(pb::ListVolumesRequest {})
        .await?
        .into_inner();
    assert!(
        listed.volumes.iter().all(|v| v.volume_id != id || v.ended),
        "{listed:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn agent_mtls_admits_only_clients_of_its_ca() -> Result<()> {
    let lab = Lab::get();
    let pki = lab.work.join(lab.unique("pki"));
    let ca = Ca::new(&pki, "agent-ca")?;
    let server = ca.server("agent", [127, 0, 0, 1].into())?;
    let controller = ca.client("controller")?;
    let other_ca = Ca::new(&pki, "other-ca")?;
    let intruder = other_ca.client("intruder")?;

    let parent = ZfsParent::create(&lab, "agent-tls")?;
    let mut config = AgentConfig::new(
        &lab,
        &lab.unique("agent-tls"),
        vec![parent.backend()],
        NVME_PORT,
        ISCSI_PORT,
    )?;
    let good = ClientTls {
        server_ca: ca.pem.cert.clone(),
        identity: Some(controller),
    };
    config.tls = Some((
        ServerTls {
            identity: server,
            client_ca: ca.pem.cert.clone(),
        },
        good.clone(),
    ));
    let agent = AgentProcess::start(config).await?;
    assert!(agent.health().healthy, "{:?}", agent.health());
    let addr = agent.addr();

    // The client with a certificate from the agent's CA works.
    let mut c = pillar_csi_lab::agent::connect(addr, Some(&good)).await?;
    let caps = c
        .get_capabilities(pb::GetCapabilitiesRequest {})
        .await?
        .into_inner();
    assert_eq!(caps.backend_types, vec![ZVOL]);
    let name = lab.unique("vol");
    let id = format!("{}/{name}", lab.pool);
    let uid = lab.unique("uid");
    c.create_volume(create_request(&id, fence(&uid, 1))).await?;
    assert_eq!(
        parent.children()?,
        vec![format!("{}/{name}\tvolume\t{SIZE}", parent.dataset())]
    );

    // Every other client is refused, and creates nothing.
    let refused_clients = [
        (
            "no client certificate",
            Some(ClientTls {
                server_ca: ca.pem.cert.clone(),
                identity: None,
            }),
        ),
        (
            "a client certificate from another CA",
            Some(ClientTls {
                server_ca: ca.pem.cert.clone(),
                identity: Some(intruder.clone()),
            }),
        ),
        ("plaintext", None),
    ];
    for (what, tls) in refused_clients {
        let other_id = format!("{}/{}", lab.pool, lab.unique("intruder"));
        let attempt = async {
            let mut c = pillar_csi_lab::agent::connect(addr, tls.as_ref()).await?;
            c.get_capabilities(pb::GetCapabilitiesRequest {}).await?;
            Result::<()>::Ok(())
        };
        assert!(attempt.await.is_err(), "{what}: GetCapabilities answered");
        let attempt = async {
            let mut c = pillar_csi_lab::agent::connect(addr, tls.as_ref()).await?;
            c.create_volume(create_request(&other_id, fence("intruder", 1)))
                .await?;
            Result::<()>::Ok(())
        };
        assert!(attempt.await.is_err(), "{what}: CreateVolume answered");
    }
    // A client that does not trust the agent's CA refuses the server.
    let distrustful = ClientTls {
        server_ca: other_ca.pem.cert.clone(),
        identity: Some(intruder),
    };
    let attempt = async {
        let mut c = pillar_csi_lab::agent::connect(addr, Some(&distrustful)).await?;
        c.get_capabilities(pb::GetCapabilitiesRequest {}).await?;
        Result::<()>::Ok(())
    };
    assert!(
        attempt.await.is_err(),
        "a client trusting another CA accepted the agent"
    );
    assert_eq!(
        parent.children()?.len(),
        1,
        "refused clients created nothing"
    );

    // The good client still works: delete, then the zvol is gone.
    c.delete_volume(pb::DeleteVolumeRequest {
        volume_id: id,
        backend_type: ZVOL,
        fence: fence(&uid, 1),
    })
    .await?;
    assert_eq!(parent.children()?, Vec::<String>::new());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn agent_restart_re_creates_exports_emptied_from_configfs() -> Result<()> {
    let lab = Lab::get();
    let (parent, mut agent) = plaintext_agent(&lab, "agent-reboot").await?;
    let mut c = agent.client().await?;
    let uid_n = lab.unique("uid");
    let uid_i = lab.unique("uid");
    let id_n = format!("{}/{}", lab.pool, lab.unique("vol-nvme"));
    let id_i = format!("{}/{}", lab.pool, lab.unique("vol-iscsi"));
    let dev_n = c
        .create_volume(create_request(&id_n, fence(&uid_n, 1)))
        .await?
        .into_inner()
        .device_path;
    let dev_i = c
        .create_volume(create_request(&id_i, fence(&uid_i, 1)))
        .await?
        .into_inner()
        .device_path;
    let host = host_nqn(&lab, "host");
    let iqn = iscsi::initiator_name()?;
    let nqn = c
        .export_volume(export_request(&id_n, NVME, &[&host], fence(&uid_n, 1)))
        .await?
        .into_inner()
        .target_id;
    let target = c
        .export_volume(export_request(&id_i, ISCSI, &[&iqn], fence(&uid_i, 1)))
        .await?
        .into_inner()
        .target_id;
    let portal = format!("127.0.0.1:{ISCSI_PORT}");

    // Data written through both initiators, then disconnected.
    let data_n = pattern(11, 1 << 20);
    let data_i = pattern(12, 1 << 20);
    {
        let conn = Connection::tcp("127.0.0.1", NVME_PORT, &nqn, &host)?;
        write_at(&conn.namespace_device(1)?, 1 << 20, &data_n)?;
    }
    {
        let session = Session::login(&target, &portal, None)?;
        write_at(&session.disk(0)?, 1 << 20, &data_i)?;
    }

    // What the exports look like in configfs.
    let nvmet = nvmet::Nvmet::open()?;
    let lio = lio::Lio::open()?;
    let nqn_t = nvmet::Nqn::new(&nqn)?;
    let iqn_t = lio::Iqn::new(&target)?;
    let sub_before = nvmet.read()?.subsystems[&nqn_t].clone();
    let target_before = lio.read()?.targets[&iqn_t].clone();

    // A storage-node reboot: the agent dies, configfs is emptied.
    agent.kill()?;
    let object = lio
        .read()?
        .storage_objects
        .into_iter()
        .find(|(_, o)| o.udev_path == Path::new(&dev_i))
        .map(|(name, _)| name)
        .ok_or("no LIO storage object serves the iSCSI volume")?;
    nvmet.teardown(&nvmet::Teardown {
        subsystems: [nqn_t.clone()].into(),
        ports: [AGENT_NVMET_PORT].into(),
        hosts: [nvmet::Nqn::new(&host)?].into(),
    })?;
    lio.teardown(&lio::Teardown {
        targets: [iqn_t.clone()].into(),
        storage_objects: [object].into(),
    })?;
    let emptied_n = nvmet.read()?;
    let emptied_i = lio.read()?;
    assert!(
        !emptied_n.subsystems.contains_key(&nqn_t)
            && !emptied_n.ports.contains_key(&AGENT_NVMET_PORT)
    );
    assert!(!emptied_i.targets.contains_key(&iqn_t));
    assert!(
        Connection::tcp("127.0.0.1", NVME_PORT, &nqn, &host).is_err(),
        "connected to an export that was removed"
    );

    // The agent starts again from its state folder: the exports are back.
    agent.restart().await?;
    assert!(agent.health().healthy, "{:?}", agent.health());
    let present = nvmet.read()?;
    let sub = present
        .subsystems
        .get(&nqn_t)
        .ok_or("the NVMe/TCP export did not come back")?;
    assert_eq!(
        (
            sub.allow_any_host,
            &sub.allowed_hosts,
            sub.namespaces
                .iter()
                .map(|(id, ns)| (*id, ns.device_path.clone(), ns.enabled))
                .collect::<Vec<_>>()
        ),
        (
            sub_before.allow_any_host,
            &sub_before.allowed_hosts,
            sub_before
                .namespaces
                .iter()
                .map(|(id, ns)| (*id, ns.device_path.clone(), ns.enabled))
                .collect::<Vec<_>>()
        )
    );
    let port = &present.ports[&AGENT_NVMET_PORT];
    assert_eq!(port.address, Some(([127, 0, 0, 1], NVME_PORT).into()));
    assert!(port.subsystems.contains(&nqn_t));
    let present = lio.read()?;
    let target_after = present
        .targets
        .get(&iqn_t)
        .ok_or("the iSCSI export did not come back")?;
    // Compared without the read-back LUN link names and HBA indexes.
    let shape = |t: &lio::Target| {
        t.tpgs
            .iter()
            .map(|(tag, tpg)| {
                (
                    *tag,
                    tpg.enabled,
                    tpg.attributes,
                    tpg.portals.clone(),
                    tpg.acls.keys().cloned().collect::<Vec<_>>(),
                    tpg.luns
                        .iter()
                        .map(|(lun, l)| (*lun, l.storage_object.clone()))
                        .collect::<Vec<_>>(),
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(shape(target_after), shape(&target_before));
    let served = &target_after.tpgs.values().next().ok_or("no TPG")?.luns[&lio::Lun(0)];
    assert_eq!(
        present.storage_objects[&served.storage_object].udev_path,
        Path::new(&dev_i)
    );

    // The initiators reconnect and the data is intact.
    {
        let conn = Connection::tcp("127.0.0.1", NVME_PORT, &nqn, &host)?;
        assert!(
            read_at(&conn.namespace_device(1)?, 1 << 20, data_n.len())? == data_n,
            "NVMe/TCP data after the restart"
        );
    }
    {
        let session = Session::login(&target, &portal, None)?;
        assert!(
            read_at(&session.disk(0)?, 1 << 20, data_i.len())? == data_i,
            "iSCSI data after the restart"
        );
    }
    assert!(
        agent.log().contains("exports re-created from fence marks"),
        "the agent logs the restore"
    );

    // Clean up through the restarted agent.
    let mut c = agent.client().await?;
    for (id, uid, dev) in [(&id_n, &uid_n, &dev_n), (&id_i, &uid_i, &dev_i)] {
        c.delete_volume(pb::DeleteVolumeRequest {
            volume_id: id.clone(),
            backend_type: ZVOL,
            fence: fence(uid, 1),
        })
        .await?;
        assert!(!Path::new(dev).exists());
    }
    assert!(!nvmet.read()?.subsystems.contains_key(&nqn_t));
    assert!(!lio.read()?.targets.contains_key(&iqn_t));
    assert_eq!(parent.children()?, Vec::<String>::new());
    Ok(())
}

/// Every mutating RPC for `id` with `fence`, each otherwise well formed.
async fn every_mutation(
    c: &mut Client,
    id: &str,
    fence: Option<pb::FenceToken>,
    initiator: &str,
) -> Vec<(&'static str, std::result::Result<(), Status>)> {
    let f = || fence.clone();
    vec![
        (
            "CreateVolume",
            c.create_volume(create_request(id, f())).await.map(drop),
        ),
        (
            "ExpandVolume",
            c.expand_volume(pb::ExpandVolumeRequest {
                volume_id: id.to_owned(),
                backend_type: ZVOL,
                requested_bytes: 2 * SIZE,
                fence: f(),
            })
            .await
            .map(drop),
        ),
        (
            "ExportVolume",
            c.export_volume(export_request(id, NVME, &[initiator], f()))
                .await
                .map(drop),
        ),
        (
            "AllowInitiator",
            c.allow_initiator(pb::AllowInitiatorRequest {
                volume_id: id.to_owned(),
                protocol_type: NVME,
                initiator_id: initiator.to_owned(),
                fence: f(),
            })
            .await
            .map(drop),
        ),
        (
            "DenyInitiator",
            c.deny_initiator(pb::DenyInitiatorRequest {
                volume_id: id.to_owned(),
                protocol_type: NVME,
                initiator_id: initiator.to_owned(),
                fence: f(),
            })
            .await
            .map(drop),
        ),
        (
            "UnexportVolume",
            c.unexport_volume(pb::UnexportVolumeRequest {
                volume_id: id.to_owned(),
                protocol_type: NVME,
                fence: f(),
            })
            .await
            .map(drop),
        ),
        (
            "ReleaseVolume",
            c.release_volume(pb::ReleaseVolumeRequest {
                volume_id: id.to_owned(),
                backend_type: ZVOL,
                fence: f(),
            })
            .await
            .map(drop),
        ),
        (
            "DeleteVolume",
            c.delete_volume(pb::DeleteVolumeRequest {
                volume_id: id.to_owned(),
                backend_type: ZVOL,
                fence: f(),
            })
            .await
            .map(drop),
        ),
    ]
}

/// Checks that every result is refused with `code` and a message containing `needle`.
fn all_refused(
    results: Vec<(&'static str, std::result::Result<(), Status>)>,
    code: Code,
    needle: &str,
    case: &str,
) -> Result<()> {
    let mut wrong = Vec::new();
    for (rpc, r) in results {
        match r {
            Err(s) if s.code() == code && s.message().contains(needle) => {
                assert!(
                    s.message().len() < 1024,
                    "{rpc} {case}: the refusal echoes a long input ({} bytes)",
                    s.message().len()
                );
            }
            Err(s) => wrong.push(format!("{rpc}: {:?} {:?}", s.code(), s.message())),
            Ok(()) => wrong.push(format!("{rpc}: accepted")),
        }
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{case}: expected {code:?} mentioning {needle:?}; got:\n  {}",
            wrong.join("\n  ")
        )
        .into())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn agent_fencing_refuses_stale_and_ended_tokens_and_changes_nothing() -> Result<()> {
    let lab = Lab::get();
    let (parent, agent) = plaintext_agent(&lab, "agent-fence").await?;
    let state_dir = agent.config().state_dir.clone();
    let mut c = agent.client().await?;
    let id = format!("{}/{}", lab.pool, lab.unique("vol"));
    let uid = lab.unique("uid-a");
    let host_a = host_nqn(&lab, "host-a");
    let host_b = host_nqn(&lab, "host-b");
    c.create_volume(create_request(&id, fence(&uid, 5))).await?;
    c.export_volume(export_request(&id, NVME, &[&host_a], fence(&uid, 5)))
        .await?;

    let before = witness(&parent, &state_dir)?;
    assert_eq!(before.zfs.len(), 1);
    // A lower generation of the live lifecycle.
    let results = every_mutation(&mut c, &id, fence(&uid, 4), &host_b).await;
    all_refused(
        results,
        Code::FailedPrecondition,
        "stale fencing token",
        "generation 4 < 5",
    )?;
    assert_eq!(
        witness(&parent, &state_dir)?,
        before,
        "a stale token changed something"
    );
    // Another lifecycle while this one is live: refused naming the owner.
    let results = every_mutation(&mut c, &id, fence("intruder-uid", 9), &host_b).await;
    all_refused(results, Code::FailedPrecondition, &uid, "another uid")?;
    // No fence at all, and a fence without a uid.
    let results = every_mutation(&mut c, &id, None, &host_b).await;
    all_refused(
        results,
        Code::FailedPrecondition,
        "fencing token",
        "no fence",
    )?;
    let results = every_mutation(&mut c, &id, fence("", 5), &host_b).await;
    all_refused(
        results,
        Code::FailedPrecondition,
        "fencing token",
        "empty volume_uid",
    )?;
    assert_eq!(
        witness(&parent, &state_dir)?,
        before,
        "a refused token changed something"
    );

    // A higher generation is admitted and becomes the recorded one.
    c.allow_initiator(pb::AllowInitiatorRequest {
        volume_id: id.clone(),
        protocol_type: NVME,
        initiator_id: host_b.clone(),
        fence: fence(&uid, 6),
    })
    .await?;
    let after = witness(&parent, &state_dir)?;
    assert_ne!(
        after.nvmet, before.nvmet,
        "AllowInitiator at generation 6 applied"
    );
    refused(
        c.deny_initiator(pb::DenyInitiatorRequest {
            volume_id: id.clone(),
            protocol_type: NVME,
            initiator_id: host_b.clone(),
            fence: fence(&uid, 5),
        })
        .await,
        Code::FailedPrecondition,
        "stale fencing token",
        "generation 5 after 6",
    )?;
    assert_eq!(witness(&parent, &state_dir)?, after);

    // DeleteVolume ends the lifecycle: the export and zvol go; the identical
    // retry succeeds; any other call with the ended uid is refused.
    let delete = pb::DeleteVolumeRequest {
        volume_id: id.clone(),
        backend_type: ZVOL,
        fence: fence(&uid, 6),
    };
    c.delete_volume(delete.clone()).await?;
    let deleted = witness(&parent, &state_dir)?;
    assert!(deleted.zfs.is_empty(), "{:?}", deleted.zfs);
    assert!(
        deleted.nvmet.subsystems.len() < after.nvmet.subsystems.len(),
        "the export went with the volume"
    );
    c.delete_volume(delete).await?;
    assert_eq!(
        witness(&parent, &state_dir)?,
        deleted,
        "the retry touched something"
    );
    let results = every_mutation(&mut c, &id, fence(&uid, 7), &host_b).await;
    all_refused(results, Code::FailedPrecondition, "has ended", "ended uid")?;
    assert_eq!(
        witness(&parent, &state_dir)?,
        deleted,
        "an ended token changed something"
    );

    // A new lifecycle may use the volume ID again.
    let uid_c = lab.unique("uid-c");
    c.create_volume(create_request(&id, fence(&uid_c, 1)))
        .await?;
    assert_eq!(parent.children()?.len(), 1);

    // ReleaseVolume ends a lifecycle too, and leaves the zvol in place.
    c.release_volume(pb::ReleaseVolumeRequest {
        volume_id: id.clone(),
        backend_type: ZVOL,
        fence: fence(&uid_c, 1),
    })
    .await?;
    let released = witness(&parent, &state_dir)?;
    assert_eq!(released.zfs.len(), 1, "ReleaseVolume keeps the zvol");
    let results = every_mutation(&mut c, &id, fence(&uid_c, 2), &host_b).await;
    all_refused(
        results,
        Code::FailedPrecondition,
        "has ended",
        "released uid",
    )?;
    assert_eq!(witness(&parent, &state_dir)?, released);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn agent_hostile_input_is_invalid_argument_and_creates_nothing() -> Result<()> {
    let lab = Lab::get();
    let (parent, agent) = plaintext_agent(&lab, "agent-hostile").await?;
    let state_dir = agent.config().state_dir.clone();
    let mut c = agent.client().await?;
    let host = host_nqn(&lab, "host");
    let uid = lab.unique("uid");
    let pool = &lab.pool;
    let before = witness(&parent, &state_dir)?;

    let long = "a".repeat(4096);
    let hostile_ids = [
        ("../x".to_owned(), "volume_id"),
        ("a/../../b".to_owned(), "volume_id"),
        (format!("{pool}/../x"), "volume_id"),
        (format!("{pool}/a\0b"), "volume_id"),
        (format!("{pool}/x\n"), "volume_id"),
        (format!("{pool}/{long}"), "volume_id"),
        (long.clone(), "volume_id"),
        (String::new(), "volume_id"),
        (pool.clone(), "volume_id"),
        (format!("{pool}/"), "volume_id"),
        ("/x".to_owned(), "volume_id"),
        (format!("{pool}/x@snap"), "volume_id"),
        (format!("{pool}/x/y"), "volume_id"),
        // Well formed, but no backend of this agent serves that pool.
        ("otherpool/x".to_owned(), "no backend"),
    ];
    for (id, needle) in &hostile_ids {
        let results = every_mutation(&mut c, id, fence(&uid, 1), &host).await;
        all_refused(
            results,
            Code::InvalidArgument,
            needle,
            &format!("volume_id {:?}", pillar_truncate(id)),
        )?;
    }
    assert_eq!(
        witness(&parent, &state_dir)?,
        before,
        "hostile volume IDs changed something"
    );

    // Malformed fields on a well-formed ID of a volume that does not exist.
    let id = format!("{pool}/{}", lab.unique("vol"));
    let create = |f: &dyn Fn(&mut pb::CreateVolumeRequest)| {
        let mut r = create_request(&id, fence(&uid, 1));
        f(&mut r);
        r
    };
    let cases: Vec<(&str, pb::CreateVolumeRequest, &str)> = vec![
        (
            "zero size",
            create(&|r| r.capacity_bytes = 0),
            "capacity_bytes",
        ),
        (
            "unknown backend_type",
            create(&|r| r.backend_type = 99),
            "backend_type",
        ),
        (
            "LVM backend_type for a pool",
            create(&|r| r.backend_type = pb::BackendType::Lvm as i32),
            "backend_type",
        ),
        (
            "unknown lvm_provisioning",
            create(&|r| r.lvm_provisioning = 7),
            "lvm_provisioning",
        ),
        (
            "sparse=maybe",
            create(&|r| {
                r.zfs_properties.insert("sparse".into(), "maybe".into());
            }),
            "sparse",
        ),
        (
            "volblocksize=lots",
            create(&|r| {
                r.zfs_properties
                    .insert("volblocksize".into(), "lots".into());
            }),
            "volblocksize",
        ),
    ];
    for (what, request, needle) in cases {
        refused(
            c.create_volume(request).await,
            Code::InvalidArgument,
            needle,
            what,
        )?;
    }
    refused(
        c.expand_volume(pb::ExpandVolumeRequest {
            volume_id: id.clone(),
            backend_type: ZVOL,
            requested_bytes: 0,
            fence: fence(&uid, 1),
        })
        .await,
        Code::InvalidArgument,
        "requested_bytes",
        "ExpandVolume to 0 bytes",
    )?;
    for protocol in [0, 9] {
        refused(
            c.export_volume(export_request(&id, protocol, &[&host], fence(&uid, 1)))
                .await,
            Code::InvalidArgument,
            "protocol_type",
            &format!("ExportVolume protocol_type {protocol}"),
        )?;
        refused(
            c.unexport_volume(pb::UnexportVolumeRequest {
                volume_id: id.clone(),
                protocol_type: protocol,
                fence: fence(&uid, 1),
            })
            .await,
            Code::InvalidArgument,
            "protocol_type",
            &format!("UnexportVolume protocol_type {protocol}"),
        )?;
    }
    let hostile_initiators = [
        "../x".to_owned(),
        "a/../../b".to_owned(),
        format!("{host}\0x"),
        format!("{host}\n"),
        format!("nqn.2026-01.com.bhyoo.pillar-csi.lab:{long}"),
        String::new(),
    ];
    for initiator in &hostile_initiators {
        for protocol in [NVME, ISCSI] {
            let case = format!(
                "initiator {:?} over protocol {protocol}",
                pillar_truncate(initiator)
            );
            refused(
                c.export_volume(export_request(&id, protocol, &[initiator], fence(&uid, 1)))
                    .await,
                Code::InvalidArgument,
                "initiator",
                &format!("ExportVolume {case}"),
            )?;
            refused(
                c.allow_initiator(pb::AllowInitiatorRequest {
                    volume_id: id.clone(),
                    protocol_type: protocol,
                    initiator_id: initiator.clone(),
                    fence: fence(&uid, 1),
                })
                .await,
                Code::InvalidArgument,
                "initiator",
                &format!("AllowInitiator {case}"),
            )?;
            refused(
                c.deny_initiator(pb::DenyInitiatorRequest {
                    volume_id: id.clone(),
                    protocol_type: protocol,
                    initiator_id: initiator.clone(),
                    fence: fence(&uid, 1),
                })
                .await,
                Code::InvalidArgument,
                "initiator",
                &format!("DenyInitiator {case}"),
            )?;
        }
    }
    // A host NQN is not an iSCSI initiator name.
    refused(
        c.export_volume(export_request(&id, ISCSI, &[&host], fence(&uid, 1)))
            .await,
        Code::InvalidArgument,
        "initiator",
        "an NQN as an iSCSI initiator",
    )?;
    // Missing fence on a well-formed request: FAILED_PRECONDITION.
    let results = every_mutation(&mut c, &id, None, &host).await;
    all_refused(
        results,
        Code::FailedPrecondition,
        "fencing token",
        "no fence",
    )?;
    // ReconcileState: an unknown protocol is refused as a whole; hostile IDs
    // are listed as refused.
    refused(
        c.reconcile_state(pb::ReconcileStateRequest {
            exports: vec![pb::DesiredExport {
                volume_id: id.clone(),
                protocol_type: 0,
                fence: fence(&uid, 1),
                acl_enabled: true,
                allowed_initiators: vec![host.clone()],
                chap: None,
            }],
        })
        .await,
        Code::InvalidArgument,
        "protocol_type",
        "ReconcileState protocol_type 0",
    )?;
    let reply = c
        .reconcile_state(pb::ReconcileStateRequest {
            exports: hostile_ids
                .iter()
                .map(|(id, _)| pb::DesiredExport {
                    volume_id: id.clone(),
                    protocol_type: NVME,
                    fence: fence(&uid, 1),
                    acl_enabled: true,
                    allowed_initiators: vec![host.clone()],
                    chap: None,
                })
                .collect(),
        })
        .await?
        .into_inner();
    assert_eq!(reply.repaired, 0, "{reply:?}");
    assert_eq!(reply.refused.len(), hostile_ids.len(), "{reply:?}");
    assert!(reply.refused.iter().all(|r| r.len() < 1024), "{reply:?}");

    assert_eq!(
        witness(&parent, &state_dir)?,
        before,
        "malformed requests changed something"
    );
    assert!(
        fs::read_dir(&state_dir)?.next().is_none(),
        "a refused request left a fence mark"
    );
    Ok(())
}

/// The first 40 characters of a hostile string, for test messages.
fn pillar_truncate(s: &str) -> String {
    s.chars().take(40).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn agent_sixteen_concurrent_identical_creates_make_one_zvol() -> Result<()> {
    let lab = Lab::get();
    let (parent, agent) = plaintext_agent(&lab, "agent-race").await?;
    let name = lab.unique("vol");
    let id = format!("{}/{name}", lab.pool);
    let uid = lab.unique("uid");
    let mut calls = Vec::new();
    for _ in 0..16 {
        // Separate connections, so the calls reach the agent at once.
        let mut c = agent.client().await?;
        let request = create_request(&id, fence(&uid, 1));
        calls.push(tokio::spawn(async move {
            c.create_volume(request).await.map(|r| r.into_inner())
        }));
    }
    let mut replies = Vec::new();
    for call in calls {
        replies.push(call.await??);
    }
    assert!(
        replies.windows(2).all(|w| w[0] == w[1]),
        "every call returns the same volume: {replies:?}"
    );
    assert_eq!(replies[0].capacity_bytes, SIZE);
    assert_eq!(
        parent.children()?,
        vec![format!("{}/{name}\tvolume\t{SIZE}", parent.dataset())],
        "exactly one zvol"
    );
    let mut c = agent.client().await?;
    c.delete_volume(pb::DeleteVolumeRequest {
        volume_id: id,
        backend_type: ZVOL,
        fence: fence(&uid, 1),
    })
    .await?;
    assert_eq!(parent.children()?, Vec::<String>::new());
    Ok(())
}

/// `lv_name,segtype,pool_lv,lv_size` of every LV of `vg` named `lv` (empty when gone).
fn lvs(vg: &str, lv: &str) -> Result<Vec<String>> {
    let out = run(
        "lvs",
        &[
            "--noheadings",
            "--separator",
            ",",
            "--units",
            "b",
            "--nosuffix",
            "-o",
            "lv_name,segtype,pool_lv,lv_size",
            vg,
        ],
    )?;
    Ok(out
        .lines()
        .map(|l| l.trim().to_owned())
        .filter(|l| l.split(',').next() == Some(lv))
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn agent_lvm_linear_and_thin_lvs_round_trip_over_nvme_tcp_and_iscsi() -> Result<()> {
    let lab = Lab::get();
    let config = AgentConfig::new(
        &lab,
        &lab.unique("agent-lvm"),
        vec![format!("lvm={}/{}", lab.vg, lab.thin_pool)],
        NVME_PORT,
        ISCSI_PORT,
    )?;
    let agent = AgentProcess::start(config).await?;
    assert!(agent.health().healthy, "{:?}", agent.health());
    let mut c = agent.client().await?;
    let caps = c
        .get_capabilities(pb::GetCapabilitiesRequest {})
        .await?
        .into_inner();
    assert_eq!(caps.backend_types, vec![pb::BackendType::Lvm as i32]);
    let lvm = pb::BackendType::Lvm as i32;
    let host = host_nqn(&lab, "host");
    let iqn = iscsi::initiator_name()?;
    let portal = format!("127.0.0.1:{ISCSI_PORT}");

    for (provisioning, segtype, pool_lv) in [
        (pb::LvmProvisioning::Linear, "linear", ""),
        (pb::LvmProvisioning::Thin, "thin", lab.thin_pool.as_str()),
    ] {
        let name = lab.unique(segtype);
        let id = format!("{}/{name}", lab.vg);
        let uid = lab.unique("uid");
        let request = pb::CreateVolumeRequest {
            volume_id: id.clone(),
            backend_type: lvm,
            capacity_bytes: SIZE,
            fence: fence(&uid, 1),
            lvm_provisioning: provisioning as i32,
            ..Default::default()
        };
        let created = c.create_volume(request.clone()).await?.into_inner();
        assert_eq!(created.capacity_bytes, SIZE, "{segtype}");
        assert!(Path::new(&created.device_path).exists(), "{created:?}");
        assert_eq!(
            lvs(&lab.vg, &name)?,
            vec![format!("{name},{segtype},{pool_lv},{SIZE}")],
            "lvs shows the new {segtype} LV"
        );
        assert_eq!(c.create_volume(request).await?.into_inner(), created);

        // NVMe/TCP: write through the kernel initiator, read back.
        let mut export = export_request(&id, NVME, &[&host], fence(&uid, 1));
        export.backend_type = lvm;
        let nqn = c.export_volume(export).await?.into_inner().target_id;
        assert!(
            Connection::tcp(
                "127.0.0.1",
                NVME_PORT,
                &nqn,
                &host_nqn(&lab, "host-stranger")
            )
            .is_err(),
            "{segtype}: a host outside the ACL connected"
        );
        let data = pattern(21, 1 << 20);
        {
            let conn = Connection::tcp("127.0.0.1", NVME_PORT, &nqn, &host)?;
            let disk = conn.namespace_device(1)?;
            write_at(&disk, 2 << 20, &data)?;
            assert!(read_at(&disk, 2 << 20, data.len())? == data, "{segtype}");
        }
        c.unexport_volume(pb::UnexportVolumeRequest {
            volume_id: id.clone(),
            protocol_type: NVME,
            fence: fence(&uid, 1),
        })
        .await?;
        assert!(!nvmet::Nvmet::open()?
            .read()?
            .subsystems
            .contains_key(&nvmet::Nqn::new(&nqn)?));

        // iSCSI: the same bytes read back through open-iscsi.
        let mut export = export_request(&id, ISCSI, &[&iqn], fence(&uid, 1));
        export.backend_type = lvm;
        let target = c.export_volume(export).await?.into_inner().target_id;
        {
            let session = Session::login(&target, &portal, None)?;
            assert!(
                read_at(&session.disk(0)?, 2 << 20, data.len())? == data,
                "{segtype}: the bytes written over NVMe/TCP read back over iSCSI"
            );
        }
        c.unexport_volume(pb::UnexportVolumeRequest {
            volume_id: id.clone(),
            protocol_type: ISCSI,
            fence: fence(&uid, 1),
        })
        .await?;
        assert!(!lio::Lio::open()?
            .read()?
            .targets
            .contains_key(&lio::Iqn::new(&target)?));

        let delete = pb::DeleteVolumeRequest {
            volume_id: id.clone(),
            backend_type: lvm,
            fence: fence(&uid, 1),
        };
        c.delete_volume(delete.clone()).await?;
        assert_eq!(
            lvs(&lab.vg, &name)?,
            Vec::<String>::new(),
            "{segtype} LV gone"
        );
        c.delete_volume(delete).await?;
    }
    let thin_pool = lvs(&lab.vg, &lab.thin_pool)?;
    assert_eq!(thin_pool.len(), 1, "the thin pool stays: {thin_pool:?}");
    Ok(())
}

/// Waits up to `limit` for `check` to return true, polling every 250 ms.
async fn eventually(
    limit: std::time::Duration,
    mut check: impl FnMut() -> Result<bool>,
) -> Result<bool> {
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if check()? {
            return Ok(true);
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    check()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the kernel lab"]
async fn agent_periodic_resync_repairs_out_of_band_changes_and_leaves_others_alone() -> Result<()> {
    let lab = Lab::get();
    let parent = ZfsParent::create(&lab, "agent-resync")?;
    let mut config = AgentConfig::new(
        &lab,
        &lab.unique("agent-resync"),
        vec![parent.backend()],
        NVME_PORT,
        ISCSI_PORT,
    )?;
    config.resync_interval_seconds = Some(2);
    let agent = AgentProcess::start(config).await?;
    let mut c = agent.client().await?;
    let uid_n = lab.unique("uid");
    let uid_i = lab.unique("uid");
    let id_n = format!("{}/{}", lab.pool, lab.unique("vol-nvme"));
    let id_i = format!("{}/{}", lab.pool, lab.unique("vol-iscsi"));
    for (id, uid) in [(&id_n, &uid_n), (&id_i, &uid_i)] {
        c.create_volume(create_request(id, fence(uid, 1))).await?;
    }
    let host = host_nqn(&lab, "host");
    let intruder = host_nqn(&lab, "intruder");
    let iqn = iscsi::initiator_name()?;
    let nqn = c
        .export_volume(export_request(&id_n, NVME, &[&host], fence(&uid_n, 1)))
        .await?
        .into_inner()
        .target_id;
    let target = c
        .export_volume(export_request(&id_i, ISCSI, &[&iqn], fence(&uid_i, 1)))
        .await?
        .into_inner()
        .target_id;
    let nvmet = nvmet::Nvmet::open()?;
    let lio = lio::Lio::open()?;
    let nqn_t = nvmet::Nqn::new(&nqn)?;
    let iqn_t = lio::Iqn::new(&target)?;
    let sub_before = nvmet.read()?.subsystems[&nqn_t].clone();
    let target_before = lio.read()?.targets[&iqn_t].clone();

    // Out of band, as an operator's shell would: the allowed host unlinked
    // and another host linked in its place, the namespace disabled, the
    // iSCSI target removed, and a subsystem the agent does not own added.
    let root = "/sys/kernel/config/nvmet";
    let foreign = format!("nqn.2026-01.org.example.lab:{}", lab.unique("foreign"));
    run(
        "sh",
        &[
            "-ec",
            &format!(
                "rm {root}/subsystems/{nqn}/allowed_hosts/{host}
                 mkdir -p {root}/hosts/{intruder}
                 ln -s {root}/hosts/{intruder} {root}/subsystems/{nqn}/allowed_hosts/{intruder}
                 echo 0 > {root}/subsystems/{nqn}/namespaces/1/enable
                 mkdir {root}/subsystems/{foreign}"
            ),
        ],
    )?;
    lio.teardown(&lio::Teardown {
        targets: [iqn_t.clone()].into(),
        storage_objects: Default::default(),
    })?;
    // Each change took (`sh -e` and the teardown fail otherwise); reading
    // them back here would race the 2 s resync, which may already have
    // repaired some.

    // Within a few resync periods both exports are as the agent recorded them.
    let repaired = eventually(std::time::Duration::from_secs(60), || {
        let n = nvmet.read()?;
        let l = lio.read()?;
        Ok(n.subsystems.get(&nqn_t) == Some(&sub_before)
            && l.targets.get(&iqn_t).map(|t| t.tpgs.len()) == Some(target_before.tpgs.len())
            && l.targets[&iqn_t]
                .tpgs
                .values()
                .all(|tpg| tpg.enabled && tpg.acls.keys().any(|a| a.as_str() == iqn)))
    })
    .await?;
    assert!(
        repaired,
        "resync did not repair the exports within 60 s: nvmet {:?}, lio {:?}\n{}",
        nvmet.read()?.subsystems.get(&nqn_t),
        lio.read()?.targets.get(&iqn_t),
        agent.log()
    );
    let present = nvmet.read()?;
    assert!(
        present.subsystems.contains_key(&nvmet::Nqn::new(&foreign)?),
        "the resync removed a subsystem it does not own"
    );

    // The kernel serves the repaired exports: the recorded host connects,
    // the intruder is refused, and iSCSI logs in again.
    assert!(
        Connection::tcp("127.0.0.1", NVME_PORT, &nqn, &intruder).is_err(),
        "the host linked out of band connected after the resync"
    );
    {
        let conn = Connection::tcp("127.0.0.1", NVME_PORT, &nqn, &host)?;
        let data = pattern(21, 1 << 20);
        write_at(&conn.namespace_device(1)?, 0, &data)?;
        assert!(read_at(&conn.namespace_device(1)?, 0, data.len())? == data);
    }
    {
        let session = Session::login(&target, &format!("127.0.0.1:{ISCSI_PORT}"), None)?;
        let data = pattern(22, 1 << 20);
        write_at(&session.disk(0)?, 0, &data)?;
        assert!(read_at(&session.disk(0)?, 0, data.len())? == data);
    }

    // Clean up: the foreign subsystem by hand, the volumes through the agent.
    run(
        "sh",
        &[
            "-ec",
            &format!("rmdir {root}/subsystems/{foreign}; [ ! -d {root}/hosts/{intruder} ] || rmdir {root}/hosts/{intruder}"),
        ],
    )?;
    for (id, uid) in [(&id_n, &uid_n), (&id_i, &uid_i)] {
        c.delete_volume(pb::DeleteVolumeRequest {
            volume_id: id.clone(),
            backend_type: ZVOL,
            fence: fence(uid, 1),
        })
        .await?;
    }
    assert_eq!(parent.children()?, Vec::<String>::new());
    Ok(())
}
