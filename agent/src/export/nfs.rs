//! NFS exports of filesystem volumes through the kernel NFS server.
//!
//! Each volume's exports are one file of `/etc/exports.d`, one line per
//! admitted client address, written atomically; `exportfs -r` then makes
//! the kernel's table match every exports file. Why a file and `exportfs`:
//! the kernel's NFS server does not hold an export table it can be given;
//! it asks `rpc.mountd` (the running daemon of nfs-utils) about each client
//! and path, and mountd answers from the table `exportfs` merges out of
//! `/etc/exports` and `/etc/exports.d`. No library offers that merge, and
//! answering the kernel ourselves would fight mountd for its channels.
//! ZFS's own `sharenfs` writes a file of its own and runs `exportfs`
//! itself, from inside libzfs, with no client list per volume and a share
//! any `zfs share -a` of an admin acts on. So this is the agent's one
//! subprocess, bounded by a timeout, its stderr in the error. Our files
//! are read by an admin's own `exportfs -r` like any, so that never drops
//! them; and `exportfs -r` removes from the kernel what no file holds any
//! more, so a client removed from a file loses access when it returns.
use super::{ExportInfo, Exporter, Protocol};
use crate::{config::Listener, error::AgentError, marks::ExportRecord, volume::VolumeId};
use std::{
    io::Write,
    net::IpAddr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Condvar, Mutex},
    time::{Duration, Instant},
};

/// Where the exports files are.
pub const EXPORTS_DIR: &str = "/etc/exports.d";
/// How long `exportfs -r` may take.
const EXPORTFS_TIMEOUT: Duration = Duration::from_secs(60);
/// The options of every export line: read-write, writes stable before
/// they are answered, root as root (the pods' own users own their files),
/// AUTH_SYS.
const OPTIONS: &str = "rw,sync,no_subtree_check,no_root_squash,sec=sys";

/// The export's `fsid`: a UUID derived from the volume ID alone, so the
/// file handles clients hold stay valid when the filesystem is mounted
/// again (a storage-node reboot, the agent's remount at start). Without
/// it the server names the filesystem by what the kernel shows of the
/// mount, and a client of the lab's reboot test got `ESTALE` afterwards.
pub(crate) fn fsid(volume: &VolumeId) -> String {
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        format!("pillar-csi nfs fsid {volume}").as_bytes(),
    );
    let hex: String = digest.as_ref()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}
/// What a volume's file is named after its ID's two parts.
const FILE_PREFIX: &str = "pillar-csi@";
/// The suffix of a file being removed: exportfs reads only `*.exports`.
const REMOVING: &str = ".removing";

/// Exports filesystem volumes over NFS.
#[derive(Debug)]
pub struct NfsExporter {
    listener: Listener,
    dir: PathBuf,
    /// The program that applies the files (`exportfs`), with any leading
    /// arguments; `-r` follows them.
    exportfs: Vec<String>,
    /// The runs of `exportfs -r`, shared by the callers that wait for one.
    runs: Mutex<Runs>,
    /// Signalled when a run ends.
    ran: Condvar,
}

/// One `exportfs -r` at a time, and each covers every caller that asked
/// before it started (it reads every file): callers that arrive while one
/// runs wait for the next, which one of them starts for all.
#[derive(Debug)]
struct Runs {
    /// Tickets handed out, one per caller.
    asked: u64,
    /// The highest ticket a finished run covered.
    covered: u64,
    /// Whether a run is in progress.
    running: bool,
    /// The result of the last finished run (its error's message).
    last: Result<(), String>,
}

impl NfsExporter {
    /// Exports listed in `/etc/exports.d`, served at `listener`.
    pub fn new(listener: Listener) -> Self {
        Self::with_dir(listener, EXPORTS_DIR.into(), vec!["exportfs".into()])
    }

    /// Exports listed in `dir`, applied by the command `exportfs` (a
    /// program and its leading arguments, to which `-r` is added).
    pub fn with_dir(listener: Listener, dir: PathBuf, exportfs: Vec<String>) -> Self {
        Self {
            listener,
            dir,
            exportfs,
            runs: Mutex::new(Runs {
                asked: 0,
                covered: 0,
                running: false,
                last: Ok(()),
            }),
            ran: Condvar::new(),
        }
    }

    /// The name of `volume`'s exports file (`@` is in no volume ID).
    fn file_name(volume: &VolumeId) -> String {
        format!("{FILE_PREFIX}{}@{}.exports", volume.pool(), volume.name())
    }

    /// Makes the kernel's table every file's as they are now: waits for a
    /// run of `exportfs -r` that starts after this call, starting it when
    /// none does, and answers its result.
    fn apply(&self) -> Result<(), AgentError> {
        let mut runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        runs.asked += 1;
        let ticket = runs.asked;
        loop {
            if runs.covered >= ticket {
                return runs.last.clone().map_err(AgentError::Unavailable);
            }
            if !runs.running {
                break;
            }
            runs = self.ran.wait(runs).unwrap_or_else(|e| e.into_inner());
        }
        runs.running = true;
        let covers = runs.asked;
        drop(runs);
        let result = self.run_exportfs();
        let mut runs = self.runs.lock().unwrap_or_else(|e| e.into_inner());
        runs.running = false;
        runs.covered = covers;
        runs.last = result.as_ref().map(|_| ()).map_err(|e| e.to_string());
        self.ran.notify_all();
        result
    }

    /// Runs `exportfs -r` once, bounded by [`EXPORTFS_TIMEOUT`].
    fn run_exportfs(&self) -> Result<(), AgentError> {
        let (program, leading) = self
            .exportfs
            .split_first()
            .ok_or_else(|| AgentError::Internal("NFS exports: no exportfs command".into()))?;
        let mut child = Command::new(program)
            .args(leading)
            .arg("-r")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                AgentError::Unavailable(format!(
                    "NFS exports: cannot run {} (nfs-kernel-server's exportfs): {e}",
                    self.exportfs.join(" ")
                ))
            })?;
        let started = Instant::now();
        loop {
            if let Some(status) = child.try_wait().map_err(|e| {
                AgentError::Internal(format!("NFS exports: waiting for exportfs: {e}"))
            })? {
                let mut stderr = String::new();
                if let Some(mut err) = child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut err, &mut stderr);
                }
                if status.success() {
                    return Ok(());
                }
                if let Some(gone) = missing_paths_only(&stderr) {
                    // exportfs applied every other line: one volume whose
                    // filesystem was destroyed or moved outside pillar-csi
                    // must not stop every export of the node.
                    tracing::warn!(paths = ?gone, "exportfs -r skipped exports of paths that do not exist (filesystems destroyed or moved outside pillar-csi; their exports files stay until their volumes' lifecycles remove them)");
                    return Ok(());
                }
                return Err(AgentError::Unavailable(format!(
                    "NFS exports: exportfs -r failed ({status}): {}",
                    stderr.trim()
                )));
            }
            if started.elapsed() > EXPORTFS_TIMEOUT {
                let _ = child.kill();
                let _ = child.wait();
                return Err(AgentError::Unavailable(format!(
                    "NFS exports: exportfs -r did not finish in {} s",
                    EXPORTFS_TIMEOUT.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// The paths of exportfs's complaints when every line of `stderr` is a
/// `Failed to stat <path>: No such file or directory` for a path that does
/// not exist (exportfs skips those entries and applies the rest); `None`
/// when any line is another failure.
fn missing_paths_only(stderr: &str) -> Option<Vec<String>> {
    let mut paths = Vec::new();
    for line in stderr.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let path = line
            .strip_prefix("exportfs: Failed to stat ")?
            .strip_suffix(": No such file or directory")?;
        if Path::new(path).exists() {
            return None;
        }
        paths.push(path.to_owned());
    }
    (!paths.is_empty()).then_some(paths)
}

/// Empties the kernel's export and client caches, so a removed client is
/// not served from them and their references to the filesystem's mount go.
fn flush_caches() -> Result<(), AgentError> {
    sys::nfsd::flush_caches().map_err(|e| {
        AgentError::Unavailable(format!(
            "NFS exports: cannot flush the kernel's caches: {e}"
        ))
    })
}

/// The lines of a volume's exports file: `path` to each client.
pub(crate) fn exports_file(
    volume: &VolumeId,
    path: &Path,
    record: &ExportRecord,
) -> Result<String, AgentError> {
    let shown = path.to_string_lossy();
    // exportfs splits lines at blanks and reads `#` as a comment, quotes
    // and backslashes as escapes: a path with any of them is refused
    // rather than quoted.
    if !path.is_absolute()
        || !shown
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'"' | b'\\' | b'#'))
    {
        return Err(AgentError::FailedPrecondition(format!(
            "volume {volume}: its mount path {shown:?} cannot be exported over NFS: it must be absolute, printable ASCII without blanks, quotes, backslashes or '#'"
        )));
    }
    if !record.acl {
        return Err(AgentError::InvalidArgument(format!(
            "volume {volume}: NFS exports always name their clients: acl_enabled must be true"
        )));
    }
    let mut out =
        format!("# pillar-csi volume {volume}: written by the agent, replaced on every change\n");
    let fsid = fsid(volume);
    for client in &record.allowed_initiators {
        out.push_str(&format!("{shown} {client}({OPTIONS},fsid={fsid})\n"));
    }
    Ok(out)
}

/// Writes `content` to `path` through a temporary file and a rename, each
/// made durable: a reader sees the old file or the new one.
fn write_atomically(path: &Path, content: &str) -> std::io::Result<()> {
    let temp = path.with_extension("exports.new");
    let mut f = std::fs::File::create(&temp)?;
    f.write_all(content.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&temp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

impl Exporter for NfsExporter {
    fn protocol(&self) -> Protocol {
        Protocol::Nfs
    }

    fn check_initiator(&self, initiator: &str) -> Result<(), AgentError> {
        match initiator.parse::<IpAddr>() {
            Ok(ip) if !ip.is_unspecified() && !ip.is_multicast() => Ok(()),
            _ => Err(AgentError::InvalidArgument(format!(
                "initiator {initiator:?}: an NFS client is named by its IP address (one address, no network or host name)"
            ))),
        }
    }

    fn new_target(&self, volume: &VolumeId) -> String {
        Self::file_name(volume)
    }

    fn own_names(&self, volume: &VolumeId) -> Vec<String> {
        vec![Self::file_name(volume)]
    }

    fn export(
        &self,
        volume: &VolumeId,
        device: &Path,
        record: &ExportRecord,
    ) -> Result<ExportInfo, AgentError> {
        let content = exports_file(volume, device, record)?;
        let file = self.dir.join(Self::file_name(volume));
        let io = |e: std::io::Error| {
            AgentError::Internal(format!("NFS exports file {}: {e}", file.display()))
        };
        let changed = std::fs::read_to_string(&file).ok().as_deref() != Some(content.as_str());
        if changed {
            std::fs::create_dir_all(&self.dir).map_err(io)?;
            write_atomically(&file, &content).map_err(io)?;
        }
        // Applied every time: the file may be right and the kernel's table
        // not (a storage-node reboot, an admin's exportfs -u).
        self.apply()?;
        if changed {
            // A client removed from the file is not served from the caches.
            flush_caches()?;
        }
        Ok(ExportInfo {
            target_id: device.to_string_lossy().into_owned(),
            listener: self.listener,
            lun: 0,
            device_identity: String::new(),
        })
    }

    fn unexport(&self, volume: &VolumeId, recorded: Option<&str>) -> Result<(), AgentError> {
        // The file is renamed away from `*.exports`, the table applied, and
        // only then is it deleted: a crash between leaves the renamed file,
        // and the retry applies the table again.
        let own = Self::file_name(volume);
        let mut found = false;
        for name in recorded.into_iter().chain([own.as_str()]) {
            if name.contains('/') || !name.starts_with(FILE_PREFIX) {
                continue;
            }
            let file = self.dir.join(name);
            let removing = self.dir.join(format!("{name}{REMOVING}"));
            match std::fs::rename(&file, &removing) {
                Ok(()) => found = true,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    found |= removing.exists();
                }
                Err(e) => {
                    return Err(AgentError::Internal(format!(
                        "NFS exports file {}: {e}",
                        file.display()
                    )))
                }
            }
        }
        if !found {
            return Ok(());
        }
        self.apply()?;
        flush_caches()?;
        for name in recorded.into_iter().chain([own.as_str()]) {
            let removing = self.dir.join(format!("{name}{REMOVING}"));
            if let Err(e) = std::fs::remove_file(&removing) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    return Err(AgentError::Internal(format!(
                        "NFS exports file {}: {e}",
                        removing.display()
                    )));
                }
            }
        }
        Ok(())
    }

    fn revalidate(&self, _volume: &VolumeId, _record: &ExportRecord) -> Result<(), AgentError> {
        // A new refquota reaches clients through their next statfs.
        Ok(())
    }

    fn health(&self) -> Result<(), AgentError> {
        let threads = std::fs::read_to_string("/proc/fs/nfsd/threads").map_err(|e| {
            AgentError::Unavailable(format!(
                "the kernel NFS server is not running (/proc/fs/nfsd/threads: {e})"
            ))
        })?;
        match threads.trim().parse::<u32>() {
            Ok(n) if n > 0 => Ok(()),
            _ => Err(AgentError::Unavailable(
                "the kernel NFS server has no threads (start nfs-kernel-server)".into(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Result = std::result::Result<(), Box<dyn std::error::Error>>;

    fn record(clients: &[&str]) -> ExportRecord {
        ExportRecord {
            acl: true,
            allowed_initiators: clients.iter().map(|c| c.to_string()).collect(),
            chap: None,
            target: None,
        }
    }

    #[test]
    fn only_exports_of_missing_paths_are_skipped() -> Result {
        let dir = tempfile::tempdir()?;
        let here = dir.path().display().to_string();
        let gone = dir.path().join("gone").display().to_string();
        let line = |p: &str| format!("exportfs: Failed to stat {p}: No such file or directory\n");
        assert_eq!(missing_paths_only(&line(&gone)), Some(vec![gone.clone()]));
        assert_eq!(
            missing_paths_only(&line(&here)),
            None,
            "it exists: another cause"
        );
        let mixed = format!(
            "{}exportfs: could not open /var/lib/nfs/.etab.lock\n",
            line(&gone)
        );
        assert_eq!(missing_paths_only(&mixed), None);
        assert_eq!(missing_paths_only(""), None);
        Ok(())
    }

    #[test]
    fn a_line_per_client_and_odd_paths_refused() -> Result {
        let id = VolumeId::parse("tank/pvc-1")?;
        let text = exports_file(
            &id,
            Path::new("/tank/k8s/pvc-1"),
            &record(&["10.0.0.2", "fd00::3"]),
        )?;
        let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        let fsid = fsid(&id);
        assert_eq!(
            lines,
            [
                format!("/tank/k8s/pvc-1 10.0.0.2({OPTIONS},fsid={fsid})"),
                format!("/tank/k8s/pvc-1 fd00::3({OPTIONS},fsid={fsid})"),
            ]
        );
        // Stable for one volume, its own for each.
        assert_eq!(fsid, super::fsid(&VolumeId::parse("tank/pvc-1")?));
        assert_ne!(fsid, super::fsid(&VolumeId::parse("tank/pvc-2")?));
        assert_eq!(fsid.len(), 36);
        for bad in ["/a b", "relative", "/a#b", "/a\"b", "/a\\b", "/a\u{e9}"] {
            let err = exports_file(&id, Path::new(bad), &record(&["10.0.0.2"]))
                .err()
                .ok_or("must be refused")?;
            assert!(
                err.to_string().contains("cannot be exported over NFS"),
                "{bad}: {err}"
            );
        }
        let mut open = record(&[]);
        open.acl = false;
        let err = exports_file(&id, Path::new("/tank/x"), &open)
            .err()
            .ok_or("must be refused")?;
        assert!(err.to_string().contains("acl_enabled"), "{err}");
        Ok(())
    }

    #[test]
    fn clients_are_single_addresses() -> Result {
        let e = NfsExporter::new(Listener {
            address: IpAddr::from([127, 0, 0, 1]),
            port: 2049,
        });
        assert!(e.check_initiator("10.1.2.3").is_ok());
        assert!(e.check_initiator("fd00::1").is_ok());
        for bad in [
            "10.0.0.0/8",
            "node-1",
            "*",
            "0.0.0.0",
            "224.0.0.1",
            "10.0.0.1(rw)",
            "",
        ] {
            assert!(e.check_initiator(bad).is_err(), "{bad} must be refused");
        }
        Ok(())
    }

    #[test]
    fn callers_at_once_share_the_runs_of_exportfs() -> Result {
        let dir = tempfile::tempdir()?;
        // A stand-in exportfs that counts its runs and ends once `go` is
        // there (run by `sh`: a file written and then executed can fail
        // with ETXTBSY while another test forks).
        let counter = dir.path().join("runs");
        let go = dir.path().join("go");
        let script = dir.path().join("exportfs");
        std::fs::write(
            &script,
            format!(
                "echo run >> {}\nwhile [ ! -e {} ]; do sleep 0.01; done\n",
                counter.display(),
                go.display()
            ),
        )?;
        let e = std::sync::Arc::new(NfsExporter::with_dir(
            Listener {
                address: IpAddr::from([127, 0, 0, 1]),
                port: 2049,
            },
            dir.path().join("exports.d"),
            vec!["sh".into(), script.display().to_string()],
        ));
        let callers: Vec<_> = (0..8)
            .map(|_| {
                let e = e.clone();
                std::thread::spawn(move || e.apply())
            })
            .collect();
        // Every caller has asked before the first run may end.
        while e.runs.lock().map_err(|_| "poisoned")?.asked < 8 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        std::fs::write(&go, "")?;
        for c in callers {
            c.join().map_err(|_| "a caller panicked")??;
        }
        let runs = std::fs::read_to_string(&counter)?.lines().count();
        // The first caller's run, then one run for all who came during it.
        assert!((1..=2).contains(&runs), "8 callers at once, {runs} runs");
        Ok(())
    }

    #[test]
    fn a_volume_file_is_made_applied_and_removed() -> Result {
        let dir = tempfile::tempdir()?;
        // `true` stands in for exportfs: this test is of the files.
        let e = NfsExporter::with_dir(
            Listener {
                address: IpAddr::from([127, 0, 0, 1]),
                port: 2049,
            },
            dir.path().to_owned(),
            vec!["true".into()],
        );
        let id = VolumeId::parse("tank/pvc-1")?;
        let info = e.export(&id, Path::new("/tank/k8s/pvc-1"), &record(&["10.0.0.2"]))?;
        assert_eq!(info.target_id, "/tank/k8s/pvc-1");
        let file = dir.path().join("pillar-csi@tank@pvc-1.exports");
        assert!(std::fs::read_to_string(&file)?.contains("10.0.0.2("));
        e.unexport(&id, Some("pillar-csi@tank@pvc-1.exports"))?;
        assert_eq!(std::fs::read_dir(dir.path())?.count(), 0);
        // A crash after the rename: the retry applies and deletes.
        std::fs::write(
            dir.path().join("pillar-csi@tank@pvc-1.exports.removing"),
            "x",
        )?;
        e.unexport(&id, None)?;
        assert_eq!(std::fs::read_dir(dir.path())?.count(), 0);
        // A failing exportfs is an error that says so.
        let failing =
            NfsExporter::with_dir(e.listener, dir.path().to_owned(), vec!["false".into()]);
        let err = failing
            .export(&id, Path::new("/tank/k8s/pvc-1"), &record(&["10.0.0.2"]))
            .err()
            .ok_or("must be refused")?;
        assert!(err.to_string().contains("exportfs -r failed"), "{err}");
        Ok(())
    }
}
