//! The kernel NVMe/TCP host, driven through `/dev/nvme-fabrics` and sysfs
//! (no nvme-cli): connect, find an existing controller of a subsystem, find
//! a namespace's disk, rescan, disconnect.
//!
//! A namespace's disk is found by walking `/sys/block`: each `nvme*` disk
//! has an `nsid` file, and its `device` link leads to the controller
//! (`nvme<ctrl>`, native multipath off) or to the subsystem
//! (`nvme-subsys<n>`, native multipath on); both have a `subsysnqn` file.
//! The per-path disks of native multipath (`nvme<s>c<ctrl>n<ns>`) are hidden
//! from users and skipped.
use super::error::{Error, Result};
use std::{
    fs,
    io::{Read, Write},
    net::IpAddr,
    path::{Path, PathBuf},
};

/// How a connected host rides out a lost connection to its target (the
/// options written to `/dev/nvme-fabrics` at connect).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReconnectPolicy {
    /// `ctrl_loss_tmo`: seconds the host keeps reconnecting a lost
    /// controller, holding I/O, before it deletes the controller and fails
    /// I/O for good. 600 (the kernel's and nvme-cli's default) rides out a
    /// storage node's reboot; a controller deleted after it is not made
    /// again until the volume is staged again.
    pub ctrl_loss_tmo: u32,
    /// `reconnect_delay`: seconds between reconnect attempts.
    pub reconnect_delay: u32,
    /// `fast_io_fail_tmo`: seconds after which held I/O fails while the
    /// host still reconnects. `None` (the default) holds I/O for the whole
    /// `ctrl_loss_tmo`, so a filesystem sees a pause, not an error; set it
    /// only where a failover layer (multipath) wants errors early.
    pub fast_io_fail_tmo: Option<u32>,
}

impl Default for ReconnectPolicy {
    fn default() -> Self {
        Self {
            ctrl_loss_tmo: 600,
            reconnect_delay: 2,
            fast_io_fail_tmo: None,
        }
    }
}

impl ReconnectPolicy {
    /// The connect options of this policy.
    fn options(&self) -> String {
        let mut o = format!(
            "ctrl_loss_tmo={},reconnect_delay={}",
            self.ctrl_loss_tmo, self.reconnect_delay
        );
        if let Some(t) = self.fast_io_fail_tmo {
            o.push_str(&format!(",fast_io_fail_tmo={t}"));
        }
        o
    }
}

/// An NVMe/TCP subsystem to connect to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The target's address.
    pub address: IpAddr,
    /// The target's port.
    pub port: u16,
    /// The subsystem NQN.
    pub nqn: String,
}

/// Who this host is to the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostIdentity {
    /// The host NQN.
    pub nqn: String,
    /// The host ID (a UUID).
    pub id: String,
}

/// The host's NVMe view: sysfs (normally `/sys`) and the fabrics device.
#[derive(Debug, Clone)]
pub struct NvmeHost {
    /// The sysfs root.
    pub sys: PathBuf,
    /// `/dev/nvme-fabrics`.
    pub fabrics: PathBuf,
    /// How new controllers reconnect.
    pub reconnect: ReconnectPolicy,
}

impl Default for NvmeHost {
    fn default() -> Self {
        Self {
            sys: "/sys".into(),
            fabrics: "/dev/nvme-fabrics".into(),
            reconnect: ReconnectPolicy::default(),
        }
    }
}

fn read_trim(path: &Path) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_owned())
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .map(|it| {
            it.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// The value of `key` in a sysfs `address` line (`traddr=..,trsvcid=..`).
fn address_value<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split(',').find_map(|kv| {
        kv.trim()
            .strip_prefix(key)
            .and_then(|rest| rest.strip_prefix('='))
    })
}

/// Whether `name` is a user-visible NVMe disk (`nvme0n1`), not a controller
/// (`nvme0`), a hidden multipath path (`nvme0c1n1`) or a partition.
fn is_namespace_disk(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("nvme") else {
        return false;
    };
    let mut parts = rest.splitn(2, 'n');
    let (Some(a), Some(b)) = (parts.next(), parts.next()) else {
        return false;
    };
    !a.is_empty()
        && a.bytes().all(|c| c.is_ascii_digit())
        && !b.is_empty()
        && b.bytes().all(|c| c.is_ascii_digit())
}

impl NvmeHost {
    fn controller_dir(&self, ctrl: &str) -> PathBuf {
        self.sys.join("class/nvme").join(ctrl)
    }

    /// The controller's state (`live`, `connecting`, `resetting`,
    /// `deleting`, ...), `None` when it is gone.
    pub fn state(&self, ctrl: &str) -> Option<String> {
        read_trim(&self.controller_dir(ctrl).join("state"))
    }

    /// The controllers (`nvme<N>`) of `host` connected over TCP to
    /// `target`, that are not being deleted.
    pub fn controllers(&self, target: &Target, host_nqn: &str) -> Vec<String> {
        entries(&self.sys.join("class/nvme"))
            .into_iter()
            .filter(|ctrl| {
                let dir = self.controller_dir(ctrl);
                let same = |f: &str, want: &str| read_trim(&dir.join(f)).as_deref() == Some(want);
                let address = read_trim(&dir.join("address")).unwrap_or_default();
                same("subsysnqn", &target.nqn)
                    && same("transport", "tcp")
                    && same("hostnqn", host_nqn)
                    && address_value(&address, "traddr") == Some(&target.address.to_string())
                    && address_value(&address, "trsvcid") == Some(&target.port.to_string())
                    && !matches!(
                        self.state(ctrl).as_deref(),
                        None | Some("deleting" | "deleting (no IO)" | "dead")
                    )
            })
            .collect()
    }

    /// Connects to `target` as `host` unless a controller of this host to
    /// it exists (that one is reused); returns the controller's name and
    /// whether it was made now.
    pub fn connect(&self, target: &Target, host: &HostIdentity) -> Result<(String, bool)> {
        if let Some(ctrl) = self.controllers(target, &host.nqn).into_iter().next() {
            return Ok((ctrl, false));
        }
        let options = format!(
            "nqn={},transport=tcp,traddr={},trsvcid={},hostnqn={},hostid={},{}",
            target.nqn,
            target.address,
            target.port,
            host.nqn,
            host.id,
            self.reconnect.options()
        );
        let what = format!(
            "connecting to {} at {}:{}",
            target.nqn, target.address, target.port
        );
        let mut f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&self.fabrics)
            .map_err(|e| Error::io(format!("{what}: {}", self.fabrics.display()), e))?;
        f.write_all(options.as_bytes())
            .map_err(|e| Error::io(&what, e))?;
        let mut reply = String::new();
        f.read_to_string(&mut reply)
            .map_err(|e| Error::io(&what, e))?;
        // The kernel answers "instance=N,cntlid=M".
        let instance = reply
            .trim()
            .split(',')
            .find_map(|kv| kv.strip_prefix("instance="))
            .ok_or_else(|| Error::internal(format!("{what}: unexpected reply {reply:?}")))?;
        Ok((format!("nvme{instance}"), true))
    }

    /// The disk (`nvme0n1`) of namespace `nsid` of subsystem `nqn` served
    /// through controller `ctrl`, if the kernel shows one (either naming
    /// scheme, see the module doc: with native multipath the disk belongs
    /// to the subsystem and serves every controller of it).
    pub fn namespace_disk(&self, nqn: &str, nsid: u32, ctrl: &str) -> Option<String> {
        let block = self.sys.join("block");
        entries(&block).into_iter().find(|name| {
            let dir = block.join(name);
            let parent = fs::read_link(dir.join("device"))
                .ok()
                .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .unwrap_or_default();
            is_namespace_disk(name)
                && (parent == ctrl || parent.starts_with("nvme-subsys"))
                && read_trim(&dir.join("nsid")) == Some(nsid.to_string())
                && read_trim(&dir.join("device/subsysnqn")).as_deref() == Some(nqn)
        })
    }

    /// Asks every controller of subsystem `nqn` to rescan its namespaces
    /// (for a new size).
    pub fn rescan(&self, nqn: &str) -> Result<()> {
        for ctrl in entries(&self.sys.join("class/nvme")) {
            let dir = self.controller_dir(&ctrl);
            if read_trim(&dir.join("subsysnqn")).as_deref() == Some(nqn) {
                let file = dir.join("rescan_controller");
                fs::write(&file, "1").map_err(|e| Error::io(file.display(), e))?;
            }
        }
        Ok(())
    }

    /// Deletes controller `ctrl` (its disks go away; queued I/O fails).
    /// A controller already gone is fine.
    pub fn disconnect(&self, ctrl: &str) -> Result<()> {
        let file = self.controller_dir(ctrl).join("delete_controller");
        match fs::write(&file, "1") {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(format!("disconnecting {ctrl}"), e)),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    const NQN: &str = "nqn.2026-01.com.bhyoo.pillar-csi:labpool.vol-1";

    fn put(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
    }

    fn controller(root: &Path, name: &str, nqn: &str, state: &str) {
        let d = format!("class/nvme/{name}");
        put(root, &format!("{d}/subsysnqn"), &format!("{nqn}\n"));
        put(root, &format!("{d}/transport"), "tcp\n");
        put(root, &format!("{d}/hostnqn"), "nqn.host\n");
        put(root, &format!("{d}/state"), &format!("{state}\n"));
        put(
            root,
            &format!("{d}/address"),
            "traddr=127.0.0.1,trsvcid=4430,src_addr=127.0.0.1\n",
        );
    }

    fn disk(root: &Path, name: &str, nsid: u32, device: &str) {
        put(root, &format!("block/{name}/nsid"), &format!("{nsid}\n"));
        symlink(root.join(device), root.join(format!("block/{name}/device"))).unwrap();
    }

    fn host(root: &Path) -> NvmeHost {
        NvmeHost {
            sys: root.to_owned(),
            fabrics: root.join("nvme-fabrics"),
            reconnect: ReconnectPolicy::default(),
        }
    }

    #[test]
    fn reconnect_options_hold_io_through_a_storage_reboot_unless_told() {
        let policy = ReconnectPolicy::default();
        assert_eq!(policy.options(), "ctrl_loss_tmo=600,reconnect_delay=2");
        let fast = ReconnectPolicy {
            fast_io_fail_tmo: Some(30),
            ..policy
        };
        assert_eq!(
            fast.options(),
            "ctrl_loss_tmo=600,reconnect_delay=2,fast_io_fail_tmo=30"
        );
    }

    fn target() -> Target {
        Target {
            address: "127.0.0.1".parse().unwrap(),
            port: 4430,
            nqn: NQN.into(),
        }
    }

    #[test]
    fn a_namespace_is_found_without_native_multipath() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        controller(r, "nvme0", "nqn.other", "live");
        controller(r, "nvme1", NQN, "live");
        disk(r, "nvme0n1", 1, "class/nvme/nvme0");
        disk(r, "nvme1n1", 1, "class/nvme/nvme1");
        disk(r, "nvme1n2", 2, "class/nvme/nvme1");
        put(r, "block/nvme1n2p1/nsid", "2\n");
        let h = host(r);
        assert_eq!(
            h.namespace_disk(NQN, 2, "nvme1").as_deref(),
            Some("nvme1n2")
        );
        assert_eq!(
            h.namespace_disk(NQN, 1, "nvme1").as_deref(),
            Some("nvme1n1")
        );
        assert_eq!(h.namespace_disk(NQN, 3, "nvme1"), None);
        // Another controller's disk of the same subsystem is not ours.
        controller(r, "nvme2", NQN, "live");
        disk(r, "nvme2n1", 1, "class/nvme/nvme2");
        assert_eq!(
            h.namespace_disk(NQN, 1, "nvme2").as_deref(),
            Some("nvme2n1")
        );
        assert_eq!(h.controllers(&target(), "nqn.host"), vec!["nvme1", "nvme2"]);
        assert!(h.controllers(&target(), "nqn.other-host").is_empty());
    }

    #[test]
    fn a_namespace_is_found_with_native_multipath() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        // The head disk hangs off the subsystem; its number is the
        // subsystem's, not the controller's; the path disk is hidden.
        controller(r, "nvme3", NQN, "live");
        put(
            r,
            "class/nvme-subsystem/nvme-subsys1/subsysnqn",
            &format!("{NQN}\n"),
        );
        disk(r, "nvme1n4", 4, "class/nvme-subsystem/nvme-subsys1");
        disk(r, "nvme1c3n4", 4, "class/nvme/nvme3");
        let h = host(r);
        assert_eq!(
            h.namespace_disk(NQN, 4, "nvme3").as_deref(),
            Some("nvme1n4")
        );
    }

    #[test]
    fn a_controller_being_deleted_is_not_reused() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        controller(r, "nvme0", NQN, "deleting");
        controller(r, "nvme1", NQN, "connecting");
        assert_eq!(host(r).controllers(&target(), "nqn.host"), vec!["nvme1"]);
        let mut other_port = target();
        other_port.port = 4420;
        assert!(host(r).controllers(&other_port, "nqn.host").is_empty());
    }

    #[test]
    fn disk_names_are_told_apart() {
        for (name, disk) in [
            ("nvme0n1", true),
            ("nvme12n10", true),
            ("nvme0", false),
            ("nvme0c1n1", false),
            ("nvme0n1p1", false),
            ("nvme-fabrics", false),
            ("sda", false),
        ] {
            assert_eq!(is_namespace_disk(name), disk, "{name}");
        }
    }
}
