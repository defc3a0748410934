//! The libraries as another project uses them: by package name and version,
//! with the short crate names their `[lib]` sections give (`configfs`,
//! `nvmet`, `lio`, `sys`). Run by the lab runner (`make lab`).
use std::{path::Path, time::Duration};
use sys::{
    block::{Exclusive, Host},
    zfs::{DatasetName, Provisioning, Zfs, ZvolSpec},
};

type Result<T = ()> = std::result::Result<T, Box<dyn std::error::Error>>;

/// An nvmet export of `dev`: one subsystem open to any host, on one port.
fn nvmet_export(nqn: &nvmet::Nqn, dev: &Path) -> Result<nvmet::State> {
    let mut sub = nvmet::Subsystem {
        allow_any_host: true,
        ..Default::default()
    };
    let namespace = nvmet::Namespace {
        device_path: dev.to_owned(),
        enabled: true,
        ..Default::default()
    };
    sub.namespaces.insert(nvmet::Nsid::new(1)?, namespace);
    let mut port = nvmet::Port::tcp("127.0.0.1:4431".parse()?);
    port.subsystems.insert(nqn.clone());
    let mut state = nvmet::State::default();
    state.subsystems.insert(nqn.clone(), sub);
    state.ports.insert(nvmet::PortId(4431), port);
    Ok(state)
}

/// A LIO export of `dev`: an iblock storage object as LUN 0 of a target.
fn lio_export(iqn: &lio::Iqn, object: &lio::StorageObjectName, dev: &Path) -> Result<lio::State> {
    let mut state = lio::State::default();
    let so = lio::StorageObject {
        udev_path: dev.to_owned(),
        ..Default::default()
    };
    state.storage_objects.insert(object.clone(), so);
    let mut tpg = lio::Tpg {
        enabled: true,
        ..Default::default()
    };
    tpg.portals.insert("127.0.0.1:3271".parse()?);
    tpg.luns
        .insert(lio::Lun(0), lio::TpgLun::new(object.clone()));
    let mut target = lio::Target::default();
    target.tpgs.insert(lio::Tpgt::new(1)?, tpg);
    state.targets.insert(iqn.clone(), target);
    Ok(state)
}

#[test]
#[ignore = "needs the kernel lab"]
fn consumer_zvol_exported_by_nvmet_and_lio_is_in_use_until_torn_down() -> Result {
    let pool = std::env::var("PILLAR_LAB_POOL").map_err(|_| "PILLAR_LAB_POOL is not set")?;
    let tag = format!("consumer-{}", std::process::id());
    let zfs = Zfs::open()?;
    let name = DatasetName::below_pool(&format!("{pool}/{tag}"))?;
    let mut spec = ZvolSpec::new(name.clone(), 32 << 20);
    spec.provisioning = Provisioning::Sparse;
    zfs.create_zvol(&spec)?;
    let dev = zfs.wait_device(&name, Duration::from_secs(20))?;
    let host = Host::default();
    assert!(host.usage(&dev)?.is_idle(), "a new zvol is idle");

    let nqn = nvmet::Nqn::new(&format!("nqn.2026-01.com.bhyoo.pillar-csi.lab:{tag}"))?;
    let nvme = nvmet::Nvmet::open()?;
    nvme.apply(&nvmet_export(&nqn, &dev)?)?;
    let iqn = lio::Iqn::new(&format!("iqn.2003-01.org.example.lab:{tag}"))?;
    let object = lio::StorageObjectName::new(&tag)?;
    let scsi = lio::Lio::open()?;
    scsi.apply(&lio_export(&iqn, &object, &dev)?)?;

    // configfs, directly: the namespace's device as the kernel holds it.
    let tree = configfs::Tree::open(nvmet::DEFAULT_ROOT)?;
    let written = tree.read_attr(&format!("subsystems/{nqn}/namespaces/1/device_path"))?;
    assert_eq!(Path::new(&written), dev);

    // sys::block sees both exporters, and LIO's exclusive claim.
    let usage = host.usage(&dev)?;
    let subsystems: Vec<&str> = usage.nvmet.iter().map(|u| u.subsystem.as_str()).collect();
    let objects: Vec<&str> = usage.lio.iter().map(|u| u.name.as_str()).collect();
    assert_eq!(subsystems, [nqn.as_str()]);
    assert_eq!(objects, [tag.as_str()]);
    assert_eq!(
        usage.exclusive,
        Exclusive::Busy,
        "LIO iblock claims the device"
    );

    scsi.teardown(&lio::Teardown {
        targets: [iqn].into(),
        storage_objects: [object].into(),
    })?;
    nvme.teardown(&nvmet::Teardown {
        subsystems: [nqn].into(),
        ports: [nvmet::PortId(4431)].into(),
        hosts: Default::default(),
    })?;
    let after = host.usage(&dev)?;
    assert!(after.is_idle(), "still in use: {:?}", after.reasons());
    zfs.destroy(&name)?;
    assert!(!zfs.exists(name.as_str()), "{name} was destroyed");
    Ok(())
}
