//! The node's initiator names: the NVMe host NQN (`/etc/nvme/hostnqn`) and
//! the iSCSI initiator IQN (`/etc/iscsi/initiatorname.iscsi`), created when
//! missing the way nvme-cli (`nvme gen-hostnqn`) and open-iscsi
//! (`iscsi-iname`) would, so the node keeps one identity across restarts.
use std::{
    fs,
    io::Write,
    path::{Path, PathBuf},
};

/// Where nvme-cli keeps the host NQN.
pub const HOST_NQN_FILE: &str = "/etc/nvme/hostnqn";
/// Where nvme-cli keeps the host ID.
pub const HOST_ID_FILE: &str = "/etc/nvme/hostid";
/// Where open-iscsi keeps the initiator name.
pub const INITIATOR_NAME_FILE: &str = "/etc/iscsi/initiatorname.iscsi";

/// An initiator name file that could not be read or written.
#[derive(Debug, thiserror::Error)]
#[error("{}: {why}", path.display())]
pub struct Error {
    /// The file.
    pub path: PathBuf,
    /// What went wrong.
    pub why: String,
}

fn err(path: &Path, why: impl ToString) -> Error {
    Error {
        path: path.to_owned(),
        why: why.to_string(),
    }
}

/// A random UUID from the kernel (`/proc/sys/kernel/random/uuid`).
fn random_uuid() -> Result<String, Error> {
    let path = Path::new("/proc/sys/kernel/random/uuid");
    Ok(fs::read_to_string(path)
        .map_err(|e| err(path, e))?
        .trim()
        .to_owned())
}

/// Writes `text` to a new file `path` (its folder created), atomically: a
/// concurrent reader sees no file or the whole file.
fn create(path: &Path, text: &str) -> Result<(), Error> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    fs::create_dir_all(dir).map_err(|e| err(dir, e))?;
    let tmp = path.with_extension("pillar-csi.tmp");
    let mut f = fs::File::create(&tmp).map_err(|e| err(&tmp, e))?;
    f.write_all(text.as_bytes()).map_err(|e| err(&tmp, e))?;
    f.sync_all().map_err(|e| err(&tmp, e))?;
    fs::rename(&tmp, path).map_err(|e| err(path, e))
}

/// Reads a file, or `None` when it does not exist.
fn read(path: &Path) -> Result<Option<String>, Error> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(err(path, e)),
    }
}

/// The host NQN in `file` (nvme-cli's `/etc/nvme/hostnqn`), written as
/// `nqn.2014-08.org.nvmexpress:uuid:<random UUID>` when missing.
pub fn host_nqn(file: &Path) -> Result<String, Error> {
    if let Some(text) = read(file)? {
        let nqn = text.trim();
        if !nqn.starts_with("nqn.") {
            return Err(err(file, format!("{nqn:?} is not an NQN")));
        }
        return Ok(nqn.to_owned());
    }
    let nqn = format!("nqn.2014-08.org.nvmexpress:uuid:{}", random_uuid()?);
    create(file, &format!("{nqn}\n"))?;
    Ok(nqn)
}

/// The host ID to present with `host_nqn`: `file` (`/etc/nvme/hostid`) when
/// it exists, else the UUID inside a `...:uuid:<UUID>` NQN (what nvme-cli
/// does), else a UUID derived from the NQN. The kernel refuses one host ID
/// under two host NQNs, so the ID must follow the NQN.
pub fn host_id(file: &Path, host_nqn: &str) -> Result<String, Error> {
    if let Some(text) = read(file)? {
        if !text.trim().is_empty() {
            return Ok(text.trim().to_owned());
        }
    }
    if let Some((_, uuid)) = host_nqn.rsplit_once(":uuid:") {
        return Ok(uuid.to_owned());
    }
    Ok(derived_uuid(host_nqn))
}

/// A UUID-shaped value that is the same for the same text (FNV-1a, twice).
fn derived_uuid(text: &str) -> String {
    let hash = |seed: u64| api::names::fnv1a(seed, text.as_bytes());
    let hex = format!(
        "{:016x}{:016x}",
        hash(api::names::FNV1A_BASIS),
        hash(0x8422_2325_cbf2_9ce4)
    );
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// The initiator IQN in `file` (`InitiatorName=...`), written as
/// `iqn.1993-08.org.debian:01:<12 hex digits>` (open-iscsi's Debian
/// default) when missing.
pub fn initiator_iqn(file: &Path) -> Result<String, Error> {
    if let Some(text) = read(file)? {
        return text
            .lines()
            .find_map(|l| l.trim().strip_prefix("InitiatorName="))
            .map(|s| s.trim().to_owned())
            .filter(|s| s.starts_with("iqn."))
            .ok_or_else(|| err(file, "no InitiatorName=iqn.... line"));
    }
    let hex: String = random_uuid()?
        .chars()
        .filter(|c| *c != '-')
        .take(12)
        .collect();
    let iqn = format!("iqn.1993-08.org.debian:01:{hex}");
    create(
        file,
        &format!("## Written by pillar-csi node\nInitiatorName={iqn}\n"),
    )?;
    Ok(iqn)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn missing_names_are_created_once_and_then_read() {
        let dir = tempfile::tempdir().unwrap();
        let nqn_file = dir.path().join("nvme/hostnqn");
        let nqn = host_nqn(&nqn_file).unwrap();
        assert!(nqn.starts_with("nqn.2014-08.org.nvmexpress:uuid:"), "{nqn}");
        assert_eq!(host_nqn(&nqn_file).unwrap(), nqn);
        let id = host_id(&dir.path().join("nvme/hostid"), &nqn).unwrap();
        assert!(nqn.ends_with(&id), "{id}");

        let iqn_file = dir.path().join("iscsi/initiatorname.iscsi");
        let iqn = initiator_iqn(&iqn_file).unwrap();
        assert!(iqn.starts_with("iqn.1993-08.org.debian:01:"), "{iqn}");
        assert_eq!(iqn.len(), "iqn.1993-08.org.debian:01:".len() + 12);
        assert_eq!(initiator_iqn(&iqn_file).unwrap(), iqn);
    }

    #[test]
    fn existing_files_are_read_and_bad_ones_named() {
        let dir = tempfile::tempdir().unwrap();
        let iqn_file = dir.path().join("initiatorname.iscsi");
        fs::write(
            &iqn_file,
            "# comment\nInitiatorName=iqn.2003-01.org.example:a\n",
        )
        .unwrap();
        assert_eq!(
            initiator_iqn(&iqn_file).unwrap(),
            "iqn.2003-01.org.example:a"
        );
        fs::write(&iqn_file, "nothing\n").unwrap();
        let e = initiator_iqn(&iqn_file).unwrap_err();
        assert!(e.to_string().contains("InitiatorName"), "{e}");
        let nqn_file = dir.path().join("hostnqn");
        fs::write(&nqn_file, "host-1\n").unwrap();
        assert!(host_nqn(&nqn_file)
            .unwrap_err()
            .to_string()
            .contains("host-1"));
        let a = host_id(&dir.path().join("none"), "nqn.2026-01.lab:a").unwrap();
        assert_eq!(
            a,
            host_id(&dir.path().join("none"), "nqn.2026-01.lab:a").unwrap()
        );
        assert_ne!(
            a,
            host_id(&dir.path().join("none"), "nqn.2026-01.lab:b").unwrap()
        );
        assert_eq!(a.len(), 36);
    }
}
