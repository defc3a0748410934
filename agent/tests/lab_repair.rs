//! The agent converges from what failures and other hands leave behind, in
//! the kernel lab (the in-process agent over libzfs, liblvm2cmd, nvmet and
//! LIO): a half-done export, half-made LIO folders, a half-made nvmet port,
//! a released adopted LV used on the storage node, a zvol replaced under its
//! name. Each test is the sequence that broke a promise before its fix.
//!
//! Run with `tests/lab/run tests -- repair_`.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use api::annotations::LvPolicy;
use pillar_csi_agent::{
    backend::{Backend, CreateOptions, ZfsBackend},
    error::AgentError,
    export::{LioExporter, Protocol},
    marks::ExportRecord,
    volume::VolumeId,
};
use pillar_csi_lab::{
    env::Lab,
    iscsi::{Iface, Session},
    nvme::Connection,
};
use std::{fs, net::IpAddr, sync::Arc};

mod common;
use common::*;

/// The nvmet port of these tests, apart from every other test's.
const PORT_ID: nvmet::PortId = nvmet::PortId(32);
const NVME_PORT: u16 = 4421;
/// An address on no interface of the lab guest (TEST-NET-1).
const ABSENT: [u8; 4] = [192, 0, 2, 77];
const INITIATOR: &str = "iqn.2003-01.org.example.lab:repair";
const SIZE: u64 = 32 << 20;

fn record(protocol: Protocol) -> ExportRecord {
    let initiator = match protocol {
        Protocol::NvmeofTcp => HOST_NQN,
        Protocol::Iscsi => INITIATOR,
        Protocol::Nfs => "127.0.0.1",
        Protocol::Local => "worker-1",
    };
    ExportRecord {
        acl: true,
        allowed_initiators: [initiator.to_owned()].into(),
        chap: None,
        target: None,
    }
}

/// A parent dataset for one test and a ZFS backend on it.
fn zfs_backend(lab: &Lab, name: &str) -> (String, Arc<dyn Backend>) {
    let parent = lab.unique(name);
    sh(&format!("zfs create {}/{parent}", lab.pool));
    let backend = ZfsBackend::new(zfs(), &lab.pool, Some(&parent), None).unwrap();
    (format!("{}/{parent}", lab.pool), Arc::new(backend))
}

/// An in-process agent exporting on 127.0.0.1 through this file's nvmet port.
fn local_agent(backend: Arc<dyn Backend>) -> Fixture {
    agent_on(
        vec![backend],
        IpAddr::from([127, 0, 0, 1]),
        PORT_ID,
        NVME_PORT,
    )
}

/// Whether configfs holds any nvmet or LIO object of `id`'s exports.
fn exported_anywhere(id: &str) -> Vec<String> {
    let vid = VolumeId::parse(id).unwrap();
    let suffix = vid.target_suffix();
    let object = LioExporter::object(&vid).unwrap();
    let mut found = Vec::new();
    let nvmet = nvmet::Nvmet::open().unwrap().read().unwrap();
    found.extend(
        nvmet
            .subsystems
            .keys()
            .filter(|n| n.as_str().ends_with(&suffix))
            .map(|n| format!("nvmet subsystem {n}")),
    );
    let lio = lio::Lio::open().unwrap().read().unwrap();
    found.extend(
        lio.storage_objects
            .keys()
            .filter(|n| **n == object)
            .map(|n| format!("LIO storage object {n}")),
    );
    found.extend(
        lio.targets
            .keys()
            .filter(|t| t.as_str().ends_with(&suffix))
            .map(|t| format!("LIO target {t}")),
    );
    found
}

fn expect_err<T: std::fmt::Debug>(r: Result<T, AgentError>, what: &str) -> AgentError {
    match r {
        Ok(v) => panic!("{what}: accepted ({v:?})"),
        Err(e) => e,
    }
}

/// Hole 2 and hole 7 of issue 19. An agent whose listen address is on no
/// interface: the NVMe/TCP export fails at the port link after the
/// namespace was enabled on the zvol. The failed export is undone, nothing
/// is recorded, and DeleteVolume destroys the zvol (before: "dataset is
/// busy" forever). The nvmet port stays half-made (its
/// address written, never enabled, `param_max_queue_size` unset); an agent
/// at a reachable address then repairs it and a host connects (before:
/// every export failed reading `-1`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the kernel lab"]
async fn repair_a_half_done_export_is_undone_and_a_half_made_port_is_repaired() -> R {
    let lab = Lab::get();
    let (parent, backend) = zfs_backend(&lab, "repair2");
    let f = agent_on(vec![backend], IpAddr::from(ABSENT), PORT_ID, NVME_PORT);
    let id = format!("{}/h2", lab.pool);
    f.agent
        .create_volume(
            &id,
            None,
            SIZE,
            CreateOptions::default(),
            Some(&token("u2", 1)),
        )
        .await?;
    let nvme = Protocol::NvmeofTcp;
    let e = expect_err(
        f.agent
            .export_volume(&id, None, nvme, record(nvme), Some(&token("u2", 1)))
            .await,
        "an NVMe/TCP export on an absent address",
    );
    println!("{e}");
    assert!(
        e.to_string().contains("Cannot assign requested address"),
        "{e}"
    );
    assert_eq!(exported_anywhere(&id), Vec::<String>::new(), "{e}");
    let mark = f.agent.marks().load(&id)?.expect("mark");
    assert!(
        mark.exports.is_empty(),
        "a failed export was recorded: {mark:?}"
    );
    // LIO listens with IP_FREEBIND: its portal on an absent address is
    // accepted, so the iSCSI export succeeds and the delete removes it.
    let iscsi = Protocol::Iscsi;
    f.agent
        .export_volume(&id, None, iscsi, record(iscsi), Some(&token("u2", 1)))
        .await?;
    f.agent
        .delete_volume(&id, None, Some(&token("u2", 1)))
        .await?;
    assert_eq!(exported_anywhere(&id), Vec::<String>::new());
    assert!(!zfs().exists(&format!("{parent}/h2")), "the zvol is gone");

    let port = format!("/sys/kernel/config/nvmet/ports/{PORT_ID}");
    let traddr = fs::read_to_string(format!("{port}/addr_traddr"))?;
    let queue = fs::read_to_string(format!("{port}/param_max_queue_size")).unwrap_or_default();
    println!(
        "port {PORT_ID} left at {:?}, param_max_queue_size {:?}",
        traddr.trim(),
        queue.trim()
    );
    assert_eq!(
        traddr.trim(),
        "192.0.2.77",
        "the failed start left the port half-made"
    );

    let (_, backend) = zfs_backend(&lab, "repair7");
    let g = local_agent(backend);
    let id = format!("{}/h7", lab.pool);
    g.agent
        .create_volume(
            &id,
            None,
            SIZE,
            CreateOptions::default(),
            Some(&token("u7", 1)),
        )
        .await?;
    let info = g
        .agent
        .export_volume(
            &id,
            None,
            Protocol::NvmeofTcp,
            record(Protocol::NvmeofTcp),
            Some(&token("u7", 1)),
        )
        .await?;
    let traddr = fs::read_to_string(format!("{port}/addr_traddr"))?;
    assert_eq!(traddr.trim(), "127.0.0.1", "the port was repaired");
    {
        let host = Connection::tcp("127.0.0.1", NVME_PORT, &info.target_id, HOST_NQN)?;
        let dev = host.namespace_device(1)?;
        assert!(dev.exists(), "{}", dev.display());
    }
    g.agent
        .delete_volume(&id, None, Some(&token("u7", 1)))
        .await?;
    Ok(())
}

/// Hole 3 of issue 19. The link of an ACL's mapped LUN removed by hand (what
/// a crash between `mkdir` and `symlink`, or `unlink` and `rmdir`, leaves):
/// ExportVolume links it again and the initiator sees its LUN (before:
/// `mkdir .../lun_0: File exists`); left half-made again, DeleteVolume
/// removes everything (before: `rmdir .../acls/<initiator>: Directory not
/// empty`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the kernel lab"]
async fn repair_half_made_lio_mapped_luns_are_linked_again_or_removed() -> R {
    let lab = Lab::get();
    let (parent, backend) = zfs_backend(&lab, "repair3");
    let f = local_agent(backend);
    let id = format!("{}/h3", lab.pool);
    let t = Some(token("u3", 1));
    f.agent
        .create_volume(&id, None, SIZE, CreateOptions::default(), t.as_ref())
        .await?;
    let info = f
        .agent
        .export_volume(
            &id,
            None,
            Protocol::Iscsi,
            record(Protocol::Iscsi),
            t.as_ref(),
        )
        .await?;
    let mapped = format!(
        "/sys/kernel/config/target/iscsi/{}/tpgt_1/acls/{INITIATOR}/lun_0",
        info.target_id
    );
    let unlink_by_hand = || {
        for entry in fs::read_dir(&mapped).unwrap() {
            let path = entry.unwrap().path();
            if path.is_symlink() {
                fs::remove_file(&path).unwrap();
            }
        }
    };
    unlink_by_hand();
    f.agent
        .export_volume(
            &id,
            None,
            Protocol::Iscsi,
            record(Protocol::Iscsi),
            t.as_ref(),
        )
        .await?;
    let linked = fs::read_dir(&mapped)?
        .filter_map(Result::ok)
        .any(|e| e.path().is_symlink());
    assert!(linked, "the mapped LUN is linked again");
    {
        let iface = Iface::new(&lab.unique("repair3"), INITIATOR)?;
        let portal = format!("{}:{}", info.listener.address, info.listener.port);
        let session = Session::login(&info.target_id, &portal, Some(&iface))?;
        let disk = session.disk(0)?;
        assert!(disk.exists(), "{}", disk.display());
    }
    unlink_by_hand();
    f.agent.delete_volume(&id, None, t.as_ref()).await?;
    assert_eq!(exported_anywhere(&id), Vec::<String>::new());
    assert!(!zfs().exists(&format!("{parent}/h3")));
    Ok(())
}

/// Hole 4 of issue 19. A PreserveOriginal LV released by its lifecycle, then
/// mounted on the storage node: the next lifecycle's ExportVolume is refused
/// and exports nothing (before: an NVMe/TCP subsystem served a mounted
/// ext4), and its import names the mount; unmounted, the import and export
/// succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the kernel lab"]
async fn repair_a_released_preserved_lv_is_not_exported_without_a_new_import() -> R {
    let lab = Lab::get();
    let vg = lab.vg.clone();
    let name = lab.unique("released").replace('-', "_");
    sh(&format!("lvcreate -q -y -L 32M -n {name} {vg}"));
    settle();
    let dev = format!("/dev/{vg}/{name}");
    sh(&format!("mkfs.ext4 -q {dev}"));
    let id = format!("{vg}/{name}");
    let ident = lv_identity(&vg, &name);
    let f = local_agent(Arc::new(
        pillar_csi_agent::backend::LvmBackend::new(lvm(), &vg, None).unwrap(),
    ));
    let nvme = Protocol::NvmeofTcp;
    import_lv(&f, &ident, LvPolicy::PreserveOriginal, 1 << 20, "u4").await?;
    f.agent
        .export_volume(&id, None, nvme, record(nvme), Some(&token("u4", 1)))
        .await?;
    f.agent
        .release_volume(&id, None, Some(&token("u4", 1)))
        .await?;
    let mnt = mkdir_tmp();
    sh(&format!("mount {dev} {}", mnt.display()));
    let e = expect_err(
        f.agent
            .export_volume(&id, None, nvme, record(nvme), Some(&token("u5", 1)))
            .await,
        "export of a released adopted LV",
    );
    println!("{e}");
    assert!(
        matches!(&e, AgentError::FailedPrecondition(m) if m.contains("import it again")),
        "{e:?}"
    );
    assert_eq!(exported_anywhere(&id), Vec::<String>::new());
    let e = expect_err(
        import_lv(&f, &ident, LvPolicy::PreserveOriginal, 1 << 20, "u5").await,
        "import of a mounted LV",
    );
    println!("{e}");
    assert!(e.to_string().contains("is mounted at"), "{e}");
    sh(&format!("umount {}", mnt.display()));
    import_lv(&f, &ident, LvPolicy::PreserveOriginal, 1 << 20, "u5").await?;
    f.agent
        .export_volume(&id, None, nvme, record(nvme), Some(&token("u5", 1)))
        .await?;
    f.agent
        .delete_volume(&id, None, Some(&token("u5", 1)))
        .await?;
    assert_eq!(exported_anywhere(&id), Vec::<String>::new());
    sh(&format!("lvremove -q -y {vg}/{name}"));
    Ok(())
}

/// Hole 5 of issue 19. A zvol the agent created, renamed away and another
/// made under its name out of band: export, resize and delete are refused
/// naming the identity, and the stranger is left alone (before: exported and
/// destroyed). With the pinned zvol back under its name, all works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the kernel lab"]
async fn repair_a_zvol_replaced_under_its_name_is_not_touched() -> R {
    let lab = Lab::get();
    let (parent, backend) = zfs_backend(&lab, "repair5");
    let f = local_agent(backend);
    let id = format!("{}/h5", lab.pool);
    let t = Some(token("u5", 1));
    let nvme = Protocol::NvmeofTcp;
    f.agent
        .create_volume(&id, None, SIZE, CreateOptions::default(), t.as_ref())
        .await?;
    let ds = format!("{parent}/h5");
    sh(&format!(
        "zfs rename {ds} {ds}-old && zfs create -V 32M {ds}"
    ));
    let stranger = sh(&format!("zfs get -Hp -o value guid {ds}"));
    let refusals = [
        f.agent
            .export_volume(&id, None, nvme, record(nvme), t.as_ref())
            .await
            .map(|_| ()),
        f.agent
            .expand_volume(&id, None, 2 * SIZE, t.as_ref())
            .await
            .map(|_| ()),
        f.agent.delete_volume(&id, None, t.as_ref()).await,
    ];
    for r in refusals {
        let e = expect_err(r, "a call on a replaced zvol");
        println!("{e}");
        assert!(
            matches!(&e, AgentError::FailedPrecondition(m) if m.contains("identity: zvol")),
            "{e:?}"
        );
    }
    assert_eq!(exported_anywhere(&id), Vec::<String>::new());
    assert_eq!(sh(&format!("zfs get -Hp -o value guid {ds}")), stranger);
    assert_eq!(
        sh(&format!("zfs get -Hp -o value volsize {ds}")).trim(),
        (32u64 << 20).to_string(),
        "the stranger was not resized"
    );
    sh(&format!("zfs destroy {ds} && zfs rename {ds}-old {ds}"));
    f.agent
        .export_volume(&id, None, nvme, record(nvme), t.as_ref())
        .await?;
    f.agent.delete_volume(&id, None, t.as_ref()).await?;
    assert!(!zfs().exists(&ds));
    Ok(())
}
