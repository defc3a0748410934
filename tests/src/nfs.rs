//! Filesystem volumes in the lab: a parent ZFS filesystem that mounts, the
//! kernel NFS server's table, NFS mounts of the guest's own server, and
//! what holds a busy mount.
use crate::{run, Lab, Result};
use std::{
    io::Write,
    path::{Path, PathBuf},
    time::Duration,
};

const MIB: u64 = 1 << 20;

/// The NFS client of the lab: the guest itself, over loopback.
pub const CLIENT: &str = "127.0.0.1";

/// `zfs get -Hp -o value <prop> <ds>`.
pub fn zget(ds: &str, prop: &str) -> Result<String> {
    Ok(run("zfs", &["get", "-Hp", "-o", "value", prop, ds])?
        .trim()
        .to_owned())
}

/// A parent filesystem mounted under `/run` (the lab's pool mounts
/// nothing), made for one test; destroyed with everything below it when
/// dropped.
#[derive(Debug)]
pub struct FsParent {
    /// Its full dataset name.
    pub dataset: String,
    /// Where it is mounted.
    pub at: PathBuf,
}

impl FsParent {
    /// Creates `<pool>/<unique name from prefix>`, mounted at
    /// `/run/pillar-lab-fs/<that name>`.
    pub fn create(lab: &Lab, prefix: &str) -> Result<Self> {
        let unique = lab.unique(prefix);
        let at = PathBuf::from("/run/pillar-lab-fs").join(&unique);
        let dataset = format!("{}/{unique}", lab.pool);
        run(
            "zfs",
            &[
                "create",
                "-o",
                &format!("mountpoint={}", at.display()),
                &dataset,
            ],
        )?;
        Ok(Self { dataset, at })
    }

    /// The pool.
    pub fn pool(&self) -> &str {
        self.dataset.split('/').next().unwrap_or_default()
    }

    /// How many datasets are below it (the volumes left).
    pub fn children_count(&self) -> Result<usize> {
        let out = run(
            "zfs",
            &["list", "-H", "-o", "name", "-r", "-d", "1", &self.dataset],
        )?;
        Ok(out.lines().filter(|l| l.trim() != self.dataset).count())
    }
}

impl Drop for FsParent {
    fn drop(&mut self) {
        let _ = run("zfs", &["destroy", "-r", "-f", &self.dataset]);
    }
}

/// The kernel's export table as `exportfs -v` prints it, one export per
/// line (it wraps long ones).
pub fn exported() -> Result<String> {
    Ok(run("exportfs", &["-v"])?.replace("\n\t\t", " "))
}

/// An NFSv3 mount of `path` from the guest's own server (see
/// tests/lab/guest: NFSv4 walks from a root this guest cannot export),
/// hard, with short retries so a refused client fails fast; no lock
/// manager (rpc.statd does not run in the lab). Unmounted when dropped.
#[derive(Debug)]
pub struct NfsMount(PathBuf);

impl NfsMount {
    /// Mounts `path` at `at`.
    pub fn mount(path: &str, at: &Path) -> Result<Self> {
        std::fs::create_dir_all(at)?;
        run(
            "mount",
            &[
                "-t",
                "nfs",
                "-o",
                "vers=3,proto=tcp,mountproto=tcp,nolock,hard,timeo=50,retrans=2",
                &format!("{CLIENT}:{path}"),
                &at.to_string_lossy(),
            ],
        )?;
        Ok(Self(at.to_owned()))
    }
}

impl Drop for NfsMount {
    fn drop(&mut self) {
        // A plain unmount, so the client is gone when it returns (a lazy
        // one could keep retrying its writes into the next steps).
        let at = self.0.to_string_lossy().into_owned();
        if let Err(e) = run("umount", &[&at]) {
            println!("nfs: umount {at}: {e}; detaching it");
            let _ = run("umount", &["-f", "-l", &at]);
        }
    }
}

/// `zfs unmount`, tried again after the NFS server's caches are purged:
/// they hold the mount of a filesystem a client used. A mount still busy
/// is an error naming what holds it.
pub fn unmount(ds: &str) -> Result<()> {
    let mut tries = 0;
    loop {
        match run("zfs", &["unmount", ds]) {
            Err(e) if tries < 3 && e.to_string().contains("busy") => {
                tries += 1;
                sys::nfsd::purge_caches(Duration::from_secs(20))?;
            }
            Err(e) => return Err(format!("{e}; {}", holders(ds)).into()),
            Ok(_) => return Ok(()),
        }
    }
}

/// What may hold the mount of `ds`: processes with a file or folder in it,
/// and the NFS server's cache entries naming it.
pub fn holders(ds: &str) -> String {
    let at = zget(ds, "mountpoint").unwrap_or_default();
    let mut found = Vec::new();
    for p in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let pid = p.file_name().to_string_lossy().into_owned();
        let links = std::fs::read_dir(p.path().join("fd"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|f| f.path())
            .chain([p.path().join("cwd"), p.path().join("root")]);
        for l in links {
            if let Ok(t) = std::fs::read_link(&l) {
                if t.starts_with(&at) {
                    let comm = std::fs::read_to_string(p.path().join("comm")).unwrap_or_default();
                    found.push(format!("{pid} ({}) {}", comm.trim(), t.display()));
                }
            }
        }
    }
    for cache in ["nfsd.export", "nfsd.fh"] {
        let content =
            std::fs::read_to_string(format!("/proc/net/rpc/{cache}/content")).unwrap_or_default();
        found.extend(
            content
                .lines()
                .filter(|l| l.contains(&at))
                .map(|l| format!("{cache}: {l}")),
        );
    }
    format!("held by: [{}]", found.join("; "))
}

/// Runs `f` on another thread; its result, or an error after `limit`
/// (a call that hangs on a hard mount is a failure too).
pub fn within<T: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).unwrap_or_else(|_| {
        Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer in {limit:?}"),
        ))
    })
}

/// Writes `mib` MiB of incompressible bytes to `path` and syncs them; the
/// error of the first write or sync that fails.
pub fn fill(path: &Path, mib: u64) -> std::io::Result<()> {
    let mut f = std::fs::File::create(path)?;
    let mut block = vec![0u8; MIB as usize];
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..mib {
        for b in block.iter_mut() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *b = state as u8;
        }
        f.write_all(&block)?;
    }
    f.sync_all()
}
