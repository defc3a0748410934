//! Export a block device over iSCSI to one initiator (a node ACL), show what
//! the kernel holds, tear it down.
//!
//! ```sh
//! sudo modprobe target_core_iblock iscsi_target_mod   # configfs mounted too
//! sudo ./target/debug/examples/lio_export /dev/loop0
//! ```
//!
//! While it is up, only the initiator named below logs in, for example with
//! `iscsiadm -m discovery -t st -p 127.0.0.1:3270` and `iscsiadm -m node -l`.
use lio::{
    Acl, Iqn, Lio, Lun, MappedLun, State, StorageObject, StorageObjectName, Target, Teardown, Tpg,
    TpgLun, Tpgt,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let device = std::env::args()
        .nth(1)
        .ok_or("usage: lio_export <block device>")?;

    // Checked names: a bad IQN or object name is an error here, before
    // anything in configfs is touched. Use RFC 3720 names (a reversed
    // domain), which targetcli and rtslib-fb also accept.
    let object = StorageObjectName::new("export-demo")?;
    let iqn = Iqn::new("iqn.2003-01.org.example:export-demo")?;
    let initiator = Iqn::new("iqn.2003-01.org.example:initiator-1")?;

    // The desired state: an iblock storage object on the device, and a
    // target whose TPG 1 listens on a portal, serves it as LUN 0, and admits
    // only `initiator` (the default TPG attributes: ACLs only, no CHAP).
    let mut desired = State::default();
    desired.storage_objects.insert(
        object.clone(),
        StorageObject {
            udev_path: device.into(),
            ..Default::default()
        },
    );
    let mut tpg = Tpg {
        enabled: true,
        ..Default::default()
    };
    tpg.portals.insert("127.0.0.1:3270".parse()?);
    tpg.luns.insert(Lun(0), TpgLun::new(object.clone()));
    let mut acl = Acl::default();
    acl.mapped_luns.insert(Lun(0), MappedLun::new(Lun(0)));
    tpg.acls.insert(initiator.clone(), acl);
    let mut target = Target::default();
    target.tpgs.insert(Tpgt::new(1)?, tpg);
    desired.targets.insert(iqn.clone(), target);

    // Apply it: only the missing pieces are created, in the kernel's order.
    let lio = Lio::open()?;
    let steps = lio.apply(&desired)?;
    println!("apply: {} steps", steps.len());
    for step in &steps {
        println!("  {step:?}");
    }
    // Applying again changes nothing: the state is already there.
    println!("apply again: {} steps", lio.apply(&desired)?.len());

    // Read back what the kernel holds now.
    let present = lio.read_scoped(&desired)?;
    let so = &present.storage_objects[&object];
    let tpg = &present.targets[&iqn].tpgs[&Tpgt::new(1)?];
    println!(
        "{object}: iblock_{} on {} (enabled: {})",
        so.hba.unwrap_or_default(),
        so.udev_path.display(),
        so.enabled
    );
    let portals: Vec<String> = tpg.portals.iter().map(|p| p.to_string()).collect();
    let luns: Vec<String> = tpg.luns.keys().map(Lun::to_string).collect();
    let acls: Vec<String> = tpg.acls.keys().map(Iqn::to_string).collect();
    println!(
        "{iqn}: TPG 1 portals: {}; LUNs: {}; ACLs: {}",
        portals.join(", "),
        luns.join(", "),
        acls.join(", ")
    );

    // Tear down the target (ACLs, LUNs, portal, TPG) and then the storage
    // object, in the kernel's order.
    let removed = lio.teardown(&Teardown {
        targets: [iqn.clone()].into(),
        storage_objects: [object.clone()].into(),
    })?;
    println!("teardown: {} steps", removed.len());
    let after = lio.read()?;
    if after.targets.contains_key(&iqn) || after.storage_objects.contains_key(&object) {
        return Err(format!("{iqn} or {object} is still there after teardown").into());
    }
    println!("{iqn} and {object} are gone");
    Ok(())
}
