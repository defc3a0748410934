//! The kernel NVMe/TCP initiator, driven through `/dev/nvme-fabrics`.
use crate::Result;
use std::{
    fs,
    io::{Read, Write},
    path::PathBuf,
    time::Duration,
};

/// A connected NVMe-oF controller; disconnected when dropped.
#[derive(Debug)]
pub struct Connection {
    /// The controller instance (`nvme<N>`).
    pub instance: u32,
}

impl Connection {
    /// Connects to `nqn` at `addr:port` over TCP as `host_nqn`.
    ///
    /// Fails (as the kernel does) when the host is not admitted. The host ID
    /// is derived from the host NQN: the kernel refuses one host ID under two
    /// NQNs, so the default ID cannot serve several test hosts.
    pub fn tcp(addr: &str, port: u16, nqn: &str, host_nqn: &str) -> Result<Self> {
        let hostid = host_id(host_nqn);
        let opts = format!(
            "transport=tcp,traddr={addr},trsvcid={port},nqn={nqn},hostnqn={host_nqn},hostid={hostid}"
        );
        let mut f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/nvme-fabrics")?;
        f.write_all(opts.as_bytes())
            .map_err(|e| format!("connect {opts}: {e}"))?;
        let mut reply = String::new();
        f.read_to_string(&mut reply)?;
        // The kernel answers "instance=N,cntlid=M".
        let instance = reply
            .trim()
            .split(',')
            .find_map(|kv| kv.strip_prefix("instance="))
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| format!("unexpected reply from /dev/nvme-fabrics: {reply:?}"))?;
        Ok(Self { instance })
    }

    /// The block device of namespace `nsid`, waited for up to 20 seconds.
    ///
    /// Found as the disk in `/sys/block` whose subsystem NQN is this
    /// controller's: with native multipath the disk hangs off the subsystem,
    /// not the controller, and its number need not be the controller's.
    pub fn namespace_device(&self, nsid: u32) -> Result<PathBuf> {
        let nqn = self.subsystem_nqn()?;
        let suffix = format!("n{nsid}");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            for entry in fs::read_dir("/sys/block")? {
                let name = entry?.file_name().to_string_lossy().into_owned();
                let is_disk =
                    name.starts_with("nvme") && name.ends_with(&suffix) && !name[4..].contains('c');
                let owner = fs::read_to_string(format!("/sys/block/{name}/device/subsysnqn"))
                    .unwrap_or_default();
                if is_disk && owner.trim() == nqn {
                    let dev = PathBuf::from("/dev").join(&name);
                    crate::block::wait_for(&dev, Duration::from_secs(10))?;
                    return Ok(dev);
                }
            }
            if std::time::Instant::now() > deadline {
                return Err(format!("no disk for namespace {nsid} of {nqn} appeared").into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The block device of namespace `nsid` served through this controller
    /// alone, waited for up to 20 seconds. Needs native NVMe multipath off
    /// (`nvme_core.multipath=N`, as the lab guest loads it): with it on, the
    /// controllers of several host NQNs on one machine are paths of one disk.
    pub fn own_namespace_device(&self, nsid: u32) -> Result<PathBuf> {
        let prefix = format!("nvme{}n", self.instance);
        let dir = PathBuf::from(format!("/sys/class/nvme/nvme{}", self.instance));
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            for entry in fs::read_dir(&dir)? {
                let name = entry?.file_name().to_string_lossy().into_owned();
                let id = fs::read_to_string(dir.join(&name).join("nsid")).unwrap_or_default();
                if name.starts_with(&prefix) && id.trim() == nsid.to_string() {
                    let dev = PathBuf::from("/dev").join(&name);
                    crate::block::wait_for(&dev, Duration::from_secs(10))?;
                    return Ok(dev);
                }
            }
            if std::time::Instant::now() > deadline {
                return Err(format!(
                    "no disk of its own for namespace {nsid} on nvme{} appeared",
                    self.instance
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The subsystem NQN the controller is connected to.
    pub fn subsystem_nqn(&self) -> Result<String> {
        Ok(
            fs::read_to_string(format!("/sys/class/nvme/nvme{}/subsysnqn", self.instance))?
                .trim()
                .to_owned(),
        )
    }
}

/// A UUID-shaped host ID that is the same for the same host NQN.
fn host_id(host_nqn: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut words = [0u64; 2];
    for (i, w) in words.iter_mut().enumerate() {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (i, host_nqn).hash(&mut h);
        *w = h.finish();
    }
    let hex = format!("{:016x}{:016x}", words[0], words[1]);
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

impl Drop for Connection {
    fn drop(&mut self) {
        let _ = fs::write(
            format!("/sys/class/nvme/nvme{}/delete_controller", self.instance),
            "1",
        );
    }
}
