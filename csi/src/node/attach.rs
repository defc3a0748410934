//! Attaching a volume's device to this node and letting go of it, over
//! either protocol: the publish context in, a device node out.
use super::error::{Error, Kind, Result};
use super::iscsi::{self, IscsiHost};
use super::nvme::{self, HostIdentity, NvmeHost};
use super::record::StagingRecord;
use crate::publish_context::{Protocol, PublishContext};
use std::{
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

/// How often sysfs is looked at while a new disk is awaited.
const POLL: Duration = Duration::from_millis(50);

/// The node's initiators.
#[derive(Debug, Clone)]
pub struct Attacher {
    /// The NVMe/TCP host.
    pub nvme: NvmeHost,
    /// The iSCSI initiator.
    pub iscsi: IscsiHost,
    /// This node's NVMe host NQN and ID.
    pub host: HostIdentity,
    /// How long a connected volume's disk may take to appear.
    pub device_wait: Duration,
}

fn nvme_target(address: &str, port: u16, nqn: &str) -> Result<nvme::Target> {
    Ok(nvme::Target {
        address: address
            .parse()
            .map_err(|_| Error::internal(format!("bad address {address:?} in a staging record")))?,
        port,
        nqn: nqn.to_owned(),
    })
}

fn iscsi_target(address: &str, port: u16, iqn: &str) -> Result<iscsi::Target> {
    Ok(iscsi::Target {
        address: address
            .parse()
            .map_err(|_| Error::internal(format!("bad address {address:?} in a staging record")))?,
        port,
        iqn: iqn.to_owned(),
    })
}

/// Looks for a disk with `find` until it shows, then waits for its device
/// node (udev); both within `limit`.
fn await_disk(
    what: &str,
    limit: Duration,
    mut find: impl FnMut() -> Option<String>,
) -> Result<PathBuf> {
    let start = Instant::now();
    loop {
        if let Some(disk) = find() {
            let left = limit
                .saturating_sub(start.elapsed())
                .max(Duration::from_secs(1));
            return sys::udev::wait_for_node(&Path::new("/dev").join(&disk), left)
                .map_err(|e| Error::new(Kind::Timeout, format!("{what}: {e}")));
        }
        if start.elapsed() >= limit {
            return Err(Error::new(
                Kind::Timeout,
                format!("{what}: no disk appeared within {limit:?}"),
            ));
        }
        std::thread::sleep(POLL);
    }
}

/// What [`Attacher::attach`] did.
#[derive(Debug)]
pub struct Attach {
    /// Whether this call made the connection (none existed before it): a
    /// Stage that fails ends only a connection it made.
    pub made: bool,
    /// The volume's device node, or why there is none.
    pub device: Result<PathBuf>,
}

impl Attach {
    /// A connection that failed: nothing was made.
    fn failed(e: Error) -> Self {
        Self {
            made: false,
            device: Err(e),
        }
    }
}

impl Attacher {
    /// Connects (or reuses the connection) and finds the volume's device
    /// node.
    pub fn attach(&self, ctx: &PublishContext) -> Attach {
        match ctx.protocol {
            Protocol::NvmeofTcp => self.attach_nvme(ctx),
            Protocol::Iscsi => self.attach_iscsi(ctx),
        }
    }

    fn attach_nvme(&self, ctx: &PublishContext) -> Attach {
        let target = match nvme_target(&ctx.address.to_string(), ctx.port, &ctx.target) {
            Ok(t) => t,
            Err(e) => return Attach::failed(e),
        };
        let (ctrl, made) = match super::timed("connect", || self.nvme.connect(&target, &self.host))
        {
            Ok(c) => c,
            Err(e) => return Attach::failed(e),
        };
        tracing::info!(controller = %ctrl, new = made, nqn = %ctx.target, "NVMe/TCP controller");
        let what = format!("namespace {} of {} on {ctrl}", ctx.lun, ctx.target);
        let device = super::timed("device", || {
            await_disk(&what, self.device_wait, || {
                self.nvme.namespace_disk(&ctx.target, ctx.lun, &ctrl)
            })
        });
        Attach { made, device }
    }

    fn attach_iscsi(&self, ctx: &PublishContext) -> Attach {
        let target = match iscsi_target(&ctx.address.to_string(), ctx.port, &ctx.target) {
            Ok(t) => t,
            Err(e) => return Attach::failed(e),
        };
        let made = self.iscsi.sessions(&target).is_empty();
        if let Err(e) = super::timed("connect", || self.iscsi.login(&target, ctx.chap.as_ref())) {
            return Attach::failed(e);
        }
        let what = format!("LUN {} of {}", ctx.lun, ctx.target);
        let device = super::timed("device", || {
            await_disk(&what, self.device_wait, || {
                self.iscsi
                    .sessions(&target)
                    .iter()
                    .find_map(|s| self.iscsi.lun_disk(s, ctx.lun))
            })
        });
        Attach { made, device }
    }

    /// Ends the connection a record used (disconnects the NVMe controllers
    /// of its subsystem from this host, or logs out of the iSCSI target).
    pub fn detach(&self, r: &StagingRecord) -> Result<()> {
        match Protocol::parse(&r.protocol) {
            Some(Protocol::NvmeofTcp) => {
                let target = nvme_target(&r.address, r.port, &r.target)?;
                for ctrl in self.nvme.controllers(&target, &self.host.nqn) {
                    tracing::info!(controller = %ctrl, nqn = %r.target, "disconnecting");
                    self.nvme.disconnect(&ctrl)?;
                }
                Ok(())
            }
            Some(Protocol::Iscsi) => self
                .iscsi
                .logout(&iscsi_target(&r.address, r.port, &r.target)?),
            None => Err(Error::internal(format!(
                "staging record of {}: unknown protocol {:?}",
                r.volume_id, r.protocol
            ))),
        }
    }

    /// Asks the kernel to read the device's size again.
    pub fn rescan(&self, r: &StagingRecord, disk: &str) -> Result<()> {
        match Protocol::parse(&r.protocol) {
            Some(Protocol::NvmeofTcp) => self.nvme.rescan(&r.target),
            Some(Protocol::Iscsi) => self.iscsi.rescan(disk),
            None => Ok(()),
        }
    }

    /// Why the transport of `r` can carry no more I/O (the device or its
    /// disk gone, every controller or SCSI device of it dead, deleted or
    /// offline), `None` while it can or may again: a live, resetting or
    /// reconnecting controller, a running or blocked SCSI device. Data held
    /// for a dead transport is lost whatever the plugin does; data held for
    /// a living one is lost only if the plugin ends the connection.
    pub fn transport_dead(&self, r: &StagingRecord) -> Option<String> {
        let Some(device) = &r.device else {
            return Some("the volume's device was never attached".into());
        };
        let states = match self.disk_states(device) {
            Ok(states) => states,
            Err(why) => return Some(why),
        };
        let dead = |s: &String| {
            matches!(
                s.as_str(),
                "dead" | "deleting" | "deleting (no IO)" | "offline" | "transport-offline" | "del"
            )
        };
        (states.iter().all(dead)).then(|| format!("its disk's states are {states:?}"))
    }

    /// The states of the controllers or SCSI device behind `device`; `Err`
    /// says why there are none to read (the device or disk gone).
    fn disk_states(&self, device: &Path) -> std::result::Result<Vec<String>, String> {
        let Some(disk) = device.file_name().map(|n| n.to_string_lossy().into_owned()) else {
            return Err(format!("{} is not a device path", device.display()));
        };
        if !device.exists() {
            return Err(format!("the device {} is gone", device.display()));
        }
        let parent = self.nvme.sys.join("class/block").join(&disk).join("device");
        if !parent.exists() {
            return Err(format!("the disk {disk} is gone from sysfs"));
        }
        // A SCSI device or an NVMe controller has a state; a native
        // multipath disk hangs off its subsystem, whose controllers do.
        Ok(match fs::read_to_string(parent.join("state")) {
            Ok(state) => vec![state.trim().to_owned()],
            Err(_) => fs::read_dir(&parent)
                .map(|it| {
                    it.filter_map(|e| e.ok())
                        .filter_map(|e| fs::read_to_string(e.path().join("state")).ok())
                        .map(|s| s.trim().to_owned())
                        .collect()
                })
                .unwrap_or_default(),
        })
    }

    /// Why the staged device is unusable, or `None` when it is healthy:
    /// the device node or its disk is gone, or its transport is not live
    /// (the NVMe controller reconnecting, the SCSI device blocked/offline).
    pub fn abnormal(&self, r: &StagingRecord) -> Option<String> {
        let Some(device) = &r.device else {
            return Some("the volume's device was never attached".into());
        };
        let disk = device
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let states = match self.disk_states(device) {
            Ok(states) => states,
            Err(why) => return Some(why),
        };
        if states.iter().any(|s| s == "live" || s == "running") {
            return None;
        }
        Some(format!(
            "the disk {disk} is not reachable: its {} state is {states:?}",
            match Protocol::parse(&r.protocol) {
                Some(Protocol::NvmeofTcp) => "NVMe controller",
                _ => "SCSI device",
            }
        ))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::node::record::Phase;

    fn attacher(sys: &Path) -> Attacher {
        Attacher {
            nvme: NvmeHost {
                sys: sys.to_owned(),
                fabrics: sys.join("nvme-fabrics"),
                reconnect: Default::default(),
            },
            iscsi: IscsiHost {
                sys: sys.to_owned(),
                nodes: sys.join("nodes"),
            },
            host: HostIdentity {
                nqn: "nqn.host".into(),
                id: "id".into(),
            },
            device_wait: Duration::from_secs(1),
        }
    }

    fn record(device: &Path) -> StagingRecord {
        StagingRecord {
            volume_id: "v".into(),
            staging_path: "/s".into(),
            protocol: "nvmeof-tcp".into(),
            address: "127.0.0.1".into(),
            port: 4420,
            target: "nqn.t".into(),
            lun: 1,
            fs_type: None,
            mount_flags: vec![],
            device: Some(device.to_owned()),
            phase: Phase::Staged,
        }
    }

    #[test]
    fn the_transport_state_decides_the_volume_condition() {
        let root = tempfile::tempdir().unwrap();
        let sys = root.path().join("sys");
        let dev = root.path().join("nvme1n1");
        fs::write(&dev, b"").unwrap();
        let a = attacher(&sys);
        let r = record(&dev);
        assert!(a.abnormal(&r).unwrap().contains("gone from sysfs"));
        let ctrl = sys.join("class/block/nvme1n1/device");
        fs::create_dir_all(&ctrl).unwrap();
        fs::write(ctrl.join("state"), "connecting\n").unwrap();
        let why = a.abnormal(&r).unwrap();
        assert!(
            why.contains("NVMe controller") && why.contains("connecting"),
            "{why}"
        );
        fs::write(ctrl.join("state"), "live\n").unwrap();
        assert_eq!(a.abnormal(&r), None);
        // Native multipath: the disk hangs off the subsystem.
        fs::remove_file(ctrl.join("state")).unwrap();
        fs::create_dir_all(ctrl.join("nvme3")).unwrap();
        fs::write(ctrl.join("nvme3/state"), "resetting\n").unwrap();
        assert!(a.abnormal(&r).is_some());
        fs::create_dir_all(ctrl.join("nvme4")).unwrap();
        fs::write(ctrl.join("nvme4/state"), "live\n").unwrap();
        assert_eq!(a.abnormal(&r), None);
        fs::remove_file(&dev).unwrap();
        assert!(a.abnormal(&r).unwrap().contains("is gone"));
    }
}
