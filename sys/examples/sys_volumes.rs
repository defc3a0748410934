//! Create and destroy a zvol (libzfs_core/libzfs) and a thin LV
//! (liblvm2cmd), in-process, and report who uses a device.
//!
//! ```sh
//! sudo ./target/debug/examples/sys_volumes tank data-vg thin0
//! ```
//!
//! Needs the zfs module and a pool, a volume group with a thin pool, and
//! udev running (device nodes appear through it).
use std::{
    error::Error, fs::OpenOptions, os::unix::fs::OpenOptionsExt, path::Path, time::Duration,
};
use sys::{
    block::Host,
    lvm::{LvName, Lvm, VgName},
    zfs::{DatasetName, Provisioning, Zfs, ZvolSpec},
};

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [pool, vg, thin_pool] = args.as_slice() else {
        return Err("usage: sys_volumes <zpool> <volume group> <thin pool>".into());
    };
    // Where usage is looked up: the real /sys, /proc and configfs.
    let host = Host::default();

    // A sparse 64 MiB zvol. Names are checked before anything is created.
    let zfs = Zfs::open()?; // also checks the userland against the zfs module
    let zvol = DatasetName::below_pool(&format!("{pool}/sys-example"))?;
    let mut spec = ZvolSpec::new(zvol.clone(), 64 << 20);
    spec.provisioning = Provisioning::Sparse;
    zfs.create_zvol(&spec)?;
    let dev = zfs.wait_device(&zvol, Duration::from_secs(20))?;
    println!(
        "created {zvol}: {} bytes at {}",
        zfs.volsize(&zvol)?,
        dev.display()
    );

    // Who uses it? Hold it open exclusively, as a filesystem or a SCSI
    // target would, and ask; then let go and ask again.
    let claim = OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::EXCL.bits() as i32)
        .open(&dev)?;
    report(&host, &dev)?;
    drop(claim);
    report(&host, &dev)?;

    // Never recursive: a zvol with snapshots would be refused.
    zfs.destroy(&zvol)?;
    if zfs.exists(zvol.as_str()) {
        return Err(format!("{zvol} is still there").into());
    }
    println!("destroyed {zvol}");

    // A thin LV of 64 MiB. liblvm2cmd is not thread-safe: Lvm runs it on
    // one worker thread, and any thread may call it.
    let lvm = Lvm::start()?;
    let (vg, thin_pool) = (VgName::new(vg)?, LvName::new(thin_pool)?);
    let name = LvName::new("sys-example")?;
    let lv = lvm.create_thin(&vg, &thin_pool, &name, 64 << 20)?;
    println!(
        "created {vg}/{name}: {} bytes at {}, UUID {}",
        lv.size,
        lv.path.display(),
        lv.uuid
    );
    report(&host, &lv.path)?;

    // Removed only while its UUID is still the one created: a same-named
    // LV made by someone else in between is left alone.
    lvm.remove(&vg, &name, &lv.uuid)?;
    if lvm.lv(&vg, &name).is_ok() {
        return Err(format!("{vg}/{name} is still there").into());
    }
    println!("removed {vg}/{name}");
    Ok(())
}

/// Prints who uses the device: mounts, holders, LIO and nvmet exports, and
/// an exclusive-open probe; a moment's truth, not a lock.
fn report(host: &Host, dev: &Path) -> Result<(), Box<dyn Error>> {
    let usage = host.usage(dev)?;
    if usage.is_idle() {
        println!("{} ({}): idle", dev.display(), usage.device.name);
    }
    for reason in usage.reasons() {
        println!(
            "{} ({}): in use: {reason}",
            dev.display(),
            usage.device.name
        );
    }
    Ok(())
}
