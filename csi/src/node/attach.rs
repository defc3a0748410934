//! Attaching a volume's device to this node and letting go of it, over
//! either protocol: the publish context in, a device node out.
use super::disk_identity;
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

/// Waits, within `limit`, until `state()` reads `want`: a connection this
/// Stage reuses may be reconnecting (a storage node rebooting), and a disk
/// found through it would fail the probe, mkfs or mount. `Err` names the
/// state it stayed in.
fn await_state(
    what: &str,
    want: &str,
    limit: Duration,
    mut state: impl FnMut() -> Option<String>,
) -> Result<()> {
    let start = Instant::now();
    loop {
        let now = state();
        if now.as_deref() == Some(want) {
            return Ok(());
        }
        if start.elapsed() >= limit {
            return Err(Error::new(
                Kind::Timeout,
                format!(
                    "{what} is {}, not {want}, after {limit:?}; NodeStageVolume again once it reconnects",
                    now.as_deref().unwrap_or("gone")
                ),
            ));
        }
        std::thread::sleep(POLL);
    }
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
            Protocol::Nfs | Protocol::Local => Attach::failed(Error::internal(
                "a filesystem volume is mounted, not attached as a device",
            )),
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
        if !made {
            let what = format!("controller {ctrl} of {}", ctx.target);
            if let Err(e) = await_state(&what, "live", self.device_wait, || self.nvme.state(&ctrl))
            {
                return Attach::failed(e);
            }
        }
        let what = format!("namespace {} of {} on {ctrl}", ctx.lun, ctx.target);
        let device = super::timed("device", || {
            await_disk(&what, self.device_wait, || {
                self.nvme.namespace_disk(&ctx.target, ctx.lun, &ctrl)
            })
        });
        let device = device.and_then(|d| self.check_identity(ctx, d));
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
        if !made {
            let what = format!("the iSCSI session to {}", ctx.target);
            let state = || {
                let sessions = self.iscsi.sessions(&target);
                sessions.first().map(|s| self.iscsi.session_state(s))
            };
            if let Err(e) = await_state(&what, "LOGGED_IN", self.device_wait, state) {
                return Attach::failed(e);
            }
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
        let device = device.and_then(|d| self.check_identity(ctx, d));
        Attach { made, device }
    }

    /// `device`, once its disk shows the identity the export told (when
    /// it told one): a disk that shows another is not this volume's.
    fn check_identity(&self, ctx: &PublishContext, device: PathBuf) -> Result<PathBuf> {
        let Some(want) = &ctx.device_identity else {
            return Ok(device);
        };
        let disk = device
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        match disk_identity::of(&self.nvme.sys, ctx.protocol, &disk) {
            Some(have) if disk_identity::matches(&have, want) => Ok(device),
            have => Err(Error::precondition(format!(
                "{} (LUN {} of {}) shows identity {}, the export serves {want}: it is another volume's disk under the same target name (two storage nodes exporting one name?); nothing was formatted or mounted",
                device.display(),
                ctx.lun,
                ctx.target,
                have.as_deref().unwrap_or("none")
            ))),
        }
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
            // Its unmount was the whole of it.
            Some(Protocol::Nfs | Protocol::Local) => Ok(()),
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
            Some(Protocol::Nfs | Protocol::Local) | None => Ok(()),
        }
    }

    /// The identity the kernel shows for the disk of `device` (its sysfs
    /// `wwid`: NVMe namespaces have it on the disk, SCSI devices on the
    /// device), if any.
    pub fn identity(&self, device: &Path) -> Option<String> {
        let disk = device.file_name()?.to_string_lossy().into_owned();
        let dir = self.nvme.sys.join("class/block").join(disk);
        [dir.join("wwid"), dir.join("device/wwid")]
            .iter()
            .find_map(|f| fs::read_to_string(f).ok())
            .map(|w| w.trim().to_owned())
            .filter(|w| !w.is_empty())
    }

    /// The device of staged volume `r`, once its disk shows the identity
    /// Stage recorded: after a lost connection the kernel gives the disk's
    /// name to the next disk that comes, another volume's.
    pub fn verified_device(&self, r: &StagingRecord) -> Result<PathBuf> {
        let device = r.device.clone().ok_or_else(|| {
            Error::internal(format!("staging record of {} has no device", r.volume_id))
        })?;
        let Some(want) = &r.device_id else {
            return Ok(device);
        };
        match self.identity(&device) {
            Some(have) if have == *want => Ok(device),
            have => Err(Error::precondition(format!(
                "{} is no longer the disk of volume {}: it shows identity {}, Stage recorded {want} (the volume's connection was lost and its disk name reused); NodeUnstageVolume and NodeStageVolume it again",
                device.display(),
                r.volume_id,
                have.as_deref().unwrap_or("none")
            ))),
        }
    }

    /// Why the transport of `r` can carry no more I/O (the device or its
    /// disk gone, every controller or SCSI device of it dead, deleted or
    /// offline), `None` while it can or may again: a live, resetting or
    /// reconnecting controller, a running or blocked SCSI device. Data held
    /// for a dead transport is lost whatever the plugin does; data held for
    /// a living one is lost only if the plugin ends the connection.
    pub fn transport_dead(&self, r: &StagingRecord) -> Option<String> {
        if super::nfs::is_nfs(r) || super::local::is_local(r) {
            // Never said of an NFS mount: its writeback has no connection
            // of ours to cut, only the node's access, which goes after
            // Unstage answers (and a node-local bind has no connection).
            return None;
        }
        let Some(device) = &r.device else {
            return Some("the volume's device was never attached".into());
        };
        if let Err(e) = self.verified_device(r) {
            return Some(e.message);
        }
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
            device_id: None,
            phase: Phase::Staged,
        }
    }

    /// A staged disk `nvme1n1` in a temporary sysfs: the folder (kept
    /// alive by the caller), the attacher, the record, the device node and
    /// the disk's controller folder (not made yet).
    fn staged_disk() -> (tempfile::TempDir, Attacher, StagingRecord, PathBuf, PathBuf) {
        let root = tempfile::tempdir().unwrap();
        let sys = root.path().join("sys");
        let dev = root.path().join("nvme1n1");
        fs::write(&dev, b"").unwrap();
        let a = attacher(&sys);
        let r = record(&dev);
        let ctrl = sys.join("class/block/nvme1n1/device");
        (root, a, r, dev, ctrl)
    }

    #[test]
    fn the_transport_state_decides_the_volume_condition() {
        let (_root, a, r, dev, ctrl) = staged_disk();
        assert!(a.abnormal(&r).unwrap().contains("gone from sysfs"));
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

    #[test]
    fn a_reused_connection_must_come_back_before_it_is_used() {
        let state = std::cell::Cell::new(0);
        let ok = await_state("controller nvme1", "live", Duration::from_secs(5), || {
            state.set(state.get() + 1);
            Some(
                if state.get() < 3 {
                    "connecting"
                } else {
                    "live"
                }
                .into(),
            )
        });
        assert_eq!(ok, Ok(()));
        let e = await_state("session", "LOGGED_IN", Duration::from_millis(200), || {
            Some("FAILED".into())
        })
        .expect_err("never logged in");
        assert_eq!(e.kind, Kind::Timeout);
        assert!(
            e.message.contains("session is FAILED, not LOGGED_IN"),
            "{e}"
        );
    }

    #[test]
    fn only_a_transport_that_cannot_come_back_is_dead() {
        let (_root, a, r, dev, ctrl) = staged_disk();
        fs::create_dir_all(&ctrl).unwrap();
        for (state, dead) in [
            ("live", false),
            ("resetting", false),
            ("connecting", false),
            ("deleting", true),
            ("dead", true),
        ] {
            fs::write(ctrl.join("state"), format!("{state}\n")).unwrap();
            assert_eq!(a.transport_dead(&r).is_some(), dead, "{state}");
        }
        // A SCSI device in error recovery may come back; offline may not.
        for (state, dead) in [
            ("running", false),
            ("blocked", false),
            ("transport-offline", true),
        ] {
            fs::write(ctrl.join("state"), format!("{state}\n")).unwrap();
            assert_eq!(a.transport_dead(&r).is_some(), dead, "{state}");
        }
        fs::remove_file(&dev).unwrap();
        assert!(a.transport_dead(&r).unwrap().contains("is gone"));
    }

    #[test]
    fn a_disk_that_shows_another_identity_is_not_the_volume_s() {
        let root = tempfile::tempdir().unwrap();
        let sys = root.path().join("sys");
        let a = attacher(&sys);
        let dev = root.path().join("nvme1n1");
        let block = sys.join("class/block/nvme1n1");
        fs::create_dir_all(&block).unwrap();
        fs::write(block.join("wwid"), "uuid.aaaa\n").unwrap();
        assert_eq!(a.identity(&dev).as_deref(), Some("uuid.aaaa"));
        let mut r = record(&dev);
        assert_eq!(a.verified_device(&r).unwrap(), dev, "no identity recorded");
        r.device_id = Some("uuid.aaaa".into());
        assert_eq!(a.verified_device(&r).unwrap(), dev);
        fs::write(block.join("wwid"), "uuid.cccc\n").unwrap();
        let e = a.verified_device(&r).expect_err("another volume's disk");
        assert_eq!(e.kind, Kind::FailedPrecondition);
        assert!(
            e.message.contains("uuid.cccc") && e.message.contains("uuid.aaaa"),
            "{e}"
        );
        // A SCSI disk shows it on its device.
        let sd = sys.join("class/block/sdb/device");
        fs::create_dir_all(&sd).unwrap();
        fs::write(sd.join("wwid"), "naa.6001405abc\n").unwrap();
        assert_eq!(
            a.identity(&root.path().join("sdb")).as_deref(),
            Some("naa.6001405abc")
        );
    }
}
