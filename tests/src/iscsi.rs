//! The open-iscsi initiator (iscsid, started by the lab runner), driven with
//! `iscsiadm`: there is no library for it, and the agent's node side will
//! run the same tool.
use crate::{run, Result};
use std::{
    fs,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

/// `open` of a disk the kernel lists but has not yet made live (Linux's
/// errno 6, "No such device or address").
const ENXIO: i32 = 6;

/// The initiator name iscsid uses by default (`/etc/iscsi/initiatorname.iscsi`).
pub fn initiator_name() -> Result<String> {
    let text = fs::read_to_string("/etc/iscsi/initiatorname.iscsi")?;
    text.lines()
        .find_map(|l| l.trim().strip_prefix("InitiatorName="))
        .map(|s| s.trim().to_owned())
        .ok_or_else(|| "no InitiatorName= in /etc/iscsi/initiatorname.iscsi".into())
}

/// The target names a SendTargets discovery at `portal` (`ip:port`) returns.
pub fn discover(portal: &str, iface: Option<&Iface>) -> Result<Vec<String>> {
    let mut args = vec!["-m", "discovery", "-t", "st", "-p", portal];
    if let Some(i) = iface {
        args.extend(["-I", i.name.as_str()]);
    }
    let out = run("iscsiadm", &args)?;
    // Lines read "127.0.0.1:3260,1 iqn....".
    Ok(out
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .map(str::to_owned)
        .collect())
}

/// An iscsid interface with its own initiator name, so one host can log in
/// as another initiator; deleted when dropped.
#[derive(Debug)]
pub struct Iface {
    /// The interface's name (`-I`).
    pub name: String,
    /// The initiator name it presents.
    pub initiator: String,
}

impl Iface {
    /// Creates interface `name` presenting `initiator`.
    pub fn new(name: &str, initiator: &str) -> Result<Self> {
        run("iscsiadm", &["-m", "iface", "-I", name, "-o", "new"])?;
        let iface = Self {
            name: name.to_owned(),
            initiator: initiator.to_owned(),
        };
        run(
            "iscsiadm",
            &[
                "-m",
                "iface",
                "-I",
                name,
                "-o",
                "update",
                "-n",
                "iface.initiatorname",
                "-v",
                initiator,
            ],
        )?;
        Ok(iface)
    }
}

impl Drop for Iface {
    fn drop(&mut self) {
        let _ = run(
            "iscsiadm",
            &["-m", "iface", "-I", &self.name, "-o", "delete"],
        );
    }
}

/// A logged-in iSCSI session; logged out and its node record deleted when
/// dropped.
#[derive(Debug)]
pub struct Session {
    /// The target's IQN.
    pub target: String,
    /// The portal, `ip:port`.
    pub portal: String,
    /// The interface used (`default` for the host's initiator name).
    pub iface: String,
}

impl Session {
    /// Logs in to `target` at `portal` through `iface` (the default
    /// interface when `None`). The node record is created directly, so a
    /// target that discovery does not show to this initiator can still be
    /// tried. Fails as iscsiadm does when the target refuses the initiator.
    pub fn login(target: &str, portal: &str, iface: Option<&Iface>) -> Result<Self> {
        Self::login_chap(target, portal, iface, None)
    }

    /// [`Session::login`] presenting CHAP credentials `(user, password)`
    /// when given (written into the node record before the login).
    pub fn login_chap(
        target: &str,
        portal: &str,
        iface: Option<&Iface>,
        chap: Option<(&str, &str)>,
    ) -> Result<Self> {
        let session = Self {
            target: target.to_owned(),
            portal: portal.to_owned(),
            iface: iface.map_or("default".to_owned(), |i| i.name.clone()),
        };
        // Discovery may have made the record already (with the TPG tag); a
        // second record without it would be a second login that fails
        // with "session exists".
        if run("iscsiadm", &session.node_args(&[])).is_err() {
            run("iscsiadm", &session.node_args(&["-o", "new"]))?;
        }
        if let Some((user, password)) = chap {
            for (key, value) in [
                ("node.session.auth.authmethod", "CHAP"),
                ("node.session.auth.username", user),
                ("node.session.auth.password", password),
            ] {
                run(
                    "iscsiadm",
                    &session.node_args(&["-o", "update", "-n", key, "-v", value]),
                )?;
            }
        }
        run("iscsiadm", &session.node_args(&["-l"]))?;
        Ok(session)
    }

    fn node_args<'a>(&'a self, extra: &[&'a str]) -> Vec<&'a str> {
        let mut args = vec![
            "-m",
            "node",
            "-T",
            self.target.as_str(),
            "-p",
            self.portal.as_str(),
            "-I",
            self.iface.as_str(),
        ];
        args.extend_from_slice(extra);
        args
    }

    /// The sysfs folder of this session (`/sys/class/iscsi_session/sessionN`).
    fn sysfs(&self) -> Result<PathBuf> {
        for entry in fs::read_dir("/sys/class/iscsi_session")? {
            let dir = entry?.path();
            let read = |f: &str| {
                fs::read_to_string(dir.join(f))
                    .map(|s| s.trim().to_owned())
                    .unwrap_or_default()
            };
            if read("targetname") == self.target && read("ifacename") == self.iface {
                return Ok(dir);
            }
        }
        Err(format!(
            "no iSCSI session with {} through {}",
            self.target, self.iface
        )
        .into())
    }

    /// The SCSI disk of LUN `lun`, waited for up to 30 seconds until it
    /// opens. The kernel lists a new disk in sysfs and `/dev` a moment
    /// before it can be opened (open answers ENXIO until the disk is
    /// live), so a disk is taken only once an open of it succeeds.
    pub fn disk(&self, lun: u16) -> Result<PathBuf> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut last = None;
        loop {
            if let Some(dev) = self.find_disk(lun)? {
                crate::block::wait_for(&dev, Duration::from_secs(10))?;
                match fs::File::open(&dev) {
                    Ok(_) => return Ok(dev),
                    Err(e) if e.raw_os_error() == Some(ENXIO) => {
                        last = Some(format!("{} answers open with {e}", dev.display()))
                    }
                    Err(e) => return Err(format!("open {}: {e}", dev.display()).into()),
                }
            }
            if Instant::now() > deadline {
                let why = last.unwrap_or_else(|| "no disk appeared".to_owned());
                return Err(format!("LUN {lun} of {}: {why}", self.target).into());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn find_disk(&self, lun: u16) -> Result<Option<PathBuf>> {
        let device = self.sysfs()?.join("device");
        for target in dir_names(&device)? {
            if !target.starts_with("target") {
                continue;
            }
            for hctl in dir_names(&device.join(&target))? {
                if hctl.rsplit(':').next() != Some(&lun.to_string())
                    || hctl.matches(':').count() != 3
                {
                    continue;
                }
                // A disk not yet running (still probed, or offline from a
                // session that is going away) answers open with ENXIO.
                let scsi = device.join(&target).join(&hctl);
                let state = fs::read_to_string(scsi.join("state")).unwrap_or_default();
                if state.trim() != "running" {
                    continue;
                }
                if let Some(disk) = dir_names(&scsi.join("block"))?.into_iter().next() {
                    return Ok(Some(PathBuf::from("/dev").join(disk)));
                }
            }
        }
        Ok(None)
    }
}

fn dir_names(dir: &Path) -> Result<Vec<String>> {
    match fs::read_dir(dir) {
        Ok(entries) => Ok(entries
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

impl Drop for Session {
    /// Logs out and waits (up to 10 s) until the kernel no longer lists
    /// the session, so a login that follows cannot find the old one.
    fn drop(&mut self) {
        let _ = run("iscsiadm", &self.node_args(&["-u"]));
        let _ = run("iscsiadm", &self.node_args(&["-o", "delete"]));
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.sysfs().is_ok() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
