//! The CHAP secret of an open-iscsi node record, written into the record
//! file itself instead of passing through iscsiadm's command line (where
//! any process can read it in `/proc/<pid>/cmdline`).
//!
//! iscsiadm keeps one file per target portal under its node database
//! (`/etc/iscsi/nodes/<iqn>/<address>,<port>`, or a folder of that name
//! with a `,<tpgt>` suffix holding `default`), root-only, in `key = value`
//! lines. The login reads the record and hands it to iscsid, which keeps
//! it in memory for the session's reconnects; so the secret is written
//! just before the login and removed just after it, and rests on disk only
//! while a login runs.
use super::error::{Error, Result};
use std::{
    fs,
    io::Write,
    net::IpAddr,
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
};

/// open-iscsi's node database on Debian.
pub const NODES_DIR: &str = "/etc/iscsi/nodes";
/// The record key of the CHAP secret.
const SECRET_KEY: &str = "node.session.auth.password";

/// Refuses a secret that cannot stand on one record line.
pub fn check_secret(secret: &str) -> Result<()> {
    if secret.is_empty() || !secret.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Error::invalid(format!(
            "chapPassword: must be printable ASCII without spaces ({} bytes given)",
            secret.len()
        )));
    }
    Ok(())
}

/// The record file of `iqn` at `address:port` under `nodes`.
fn record_file(nodes: &Path, iqn: &str, address: IpAddr, port: u16) -> Result<PathBuf> {
    let dir = nodes.join(iqn);
    let names = [format!("{address},{port}"), format!("[{address}],{port}")];
    let entries = fs::read_dir(&dir).map_err(|e| Error::io(dir.display(), e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(dir.display(), e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if names.contains(&name) && path.is_file() {
            return Ok(path);
        }
        if names.iter().any(|n| name.starts_with(&format!("{n},"))) && path.is_dir() {
            return Ok(path.join("default"));
        }
    }
    Err(Error::internal(format!(
        "no iSCSI node record for {iqn} at {address}:{port} under {}",
        dir.display()
    )))
}

/// Sets (`Some`) or removes (`None`) the CHAP secret of the node record of
/// `iqn` at `address:port`: the file is written again whole, `0600`, and
/// renamed over the old one.
pub fn set_secret(
    nodes: &Path,
    iqn: &str,
    address: IpAddr,
    port: u16,
    secret: Option<&str>,
) -> Result<()> {
    if let Some(s) = secret {
        check_secret(s)?;
    }
    let file = record_file(nodes, iqn, address, port)?;
    let text = fs::read_to_string(&file).map_err(|e| Error::io(file.display(), e))?;
    let mut out: String = text
        .lines()
        .filter(|l| l.split('=').next().map(str::trim) != Some(SECRET_KEY))
        .flat_map(|l| [l, "\n"])
        .collect();
    if let Some(s) = secret {
        out.push_str(&format!("{SECRET_KEY} = {s}\n"));
    }
    let tmp = file.with_extension("pillar-tmp");
    let write = || -> std::io::Result<()> {
        let _ = fs::remove_file(&tmp);
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(out.as_bytes())?;
        f.sync_all()?;
        fs::rename(&tmp, &file)
    };
    write().map_err(|e| Error::io(file.display(), e))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    const RECORD: &str = "node.name = iqn.2003-01.org.example:t\nnode.session.auth.authmethod = CHAP\nnode.session.auth.username = u\nnode.conn[0].port = 3260\n";

    fn secret_lines(file: &Path) -> Vec<String> {
        fs::read_to_string(file)
            .unwrap()
            .lines()
            .filter(|l| l.starts_with(SECRET_KEY))
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn the_secret_is_written_once_then_removed_and_the_rest_kept() {
        let nodes = tempfile::tempdir().unwrap();
        let iqn = "iqn.2003-01.org.example:t";
        let dir = nodes.path().join(iqn);
        fs::create_dir_all(&dir).unwrap();
        let file = dir.join("127.0.0.1,3260");
        fs::write(&file, RECORD).unwrap();
        let addr: IpAddr = "127.0.0.1".parse().unwrap();
        set_secret(nodes.path(), iqn, addr, 3260, Some("s3cret")).unwrap();
        set_secret(nodes.path(), iqn, addr, 3260, Some("s3cret-2")).unwrap();
        assert_eq!(secret_lines(&file), [format!("{SECRET_KEY} = s3cret-2")]);
        assert_eq!(
            fs::metadata(&file).unwrap().permissions().mode() & 0o777,
            0o600
        );
        set_secret(nodes.path(), iqn, addr, 3260, None).unwrap();
        assert!(secret_lines(&file).is_empty());
        assert_eq!(
            fs::read_to_string(&file).unwrap(),
            RECORD,
            "nothing else changed"
        );
        // The folder form, with a portal group suffix.
        let tpgt = dir.join("127.0.0.1,3261,1");
        fs::create_dir_all(&tpgt).unwrap();
        fs::write(tpgt.join("default"), RECORD).unwrap();
        set_secret(nodes.path(), iqn, addr, 3261, Some("x")).unwrap();
        assert_eq!(secret_lines(&tpgt.join("default")).len(), 1);
    }

    #[test]
    fn a_secret_that_would_break_the_record_is_refused_without_showing_it() {
        for bad in ["", "two words", "line\nnode.startup = automatic"] {
            let e = check_secret(bad).expect_err("refused");
            assert!(bad.is_empty() || !e.message.contains(bad), "{e}");
        }
        let nodes = tempfile::tempdir().unwrap();
        let e = set_secret(nodes.path(), "iqn.x:y", "::1".parse().unwrap(), 3260, None)
            .expect_err("no record");
        assert!(e.message.contains("iqn.x:y"), "{e}");
    }
}
