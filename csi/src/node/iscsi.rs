//! The open-iscsi initiator: log in and out with `iscsiadm`, find a LUN's
//! disk through sysfs.
//!
//! iscsiadm is a program, not a library, on purpose: open-iscsi offers no
//! library for logins (iscsid speaks a private, unversioned protocol over
//! its socket), so every CSI driver runs iscsiadm. Each run is bounded, so
//! a target that vanished cannot hang the node.
use super::command::{run, run_ok};
use super::error::{Error, Kind, Result};
use super::iscsi_secret::{set_secret, NODES_DIR};
use crate::publish_context::Chap;
use std::{
    fs,
    net::IpAddr,
    os::linux::net::SocketAddrExt,
    path::{Path, PathBuf},
    time::Duration,
};

/// How long one iscsiadm run may take.
pub const ISCSIADM_LIMIT: Duration = Duration::from_secs(30);
/// iscsiadm's exit code for "session already exists".
const SESSION_EXISTS: i32 = 15;
/// iscsiadm's exit code for "no session / no records found".
const NO_OBJECTS: i32 = 21;
/// iscsiadm's exit code for a login the target refused for its
/// authentication (`ISCSI_ERR_LOGIN_AUTH_FAILED`).
const AUTH_FAILED: i32 = 24;

/// An iSCSI target portal and IQN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The portal's address.
    pub address: IpAddr,
    /// The portal's port.
    pub port: u16,
    /// The target IQN.
    pub iqn: String,
}

impl Target {
    fn portal(&self) -> String {
        match self.address {
            IpAddr::V4(a) => format!("{a}:{}", self.port),
            IpAddr::V6(a) => format!("[{a}]:{}", self.port),
        }
    }

    fn node_args<'a>(&'a self, portal: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
        let mut args = vec!["-m", "node", "-T", self.iqn.as_str(), "-p", portal];
        args.extend_from_slice(extra);
        args
    }
}

/// Whether iscsid answers on its control socket (the abstract unix socket
/// `ISCSIADM_ABSTRACT_NAMESPACE` that iscsiadm connects to).
pub fn iscsid_reachable() -> bool {
    std::os::unix::net::SocketAddr::from_abstract_name(b"ISCSIADM_ABSTRACT_NAMESPACE")
        .and_then(|a| std::os::unix::net::UnixStream::connect_addr(&a))
        .is_ok()
}

/// The error of a login iscsiadm ended with exit code `code`: a refused
/// authentication names whether the stage secrets carried CHAP.
fn login_error(
    target: &Target,
    portal: &str,
    chap: Option<&Chap>,
    code: Option<i32>,
    stderr: &str,
) -> Error {
    if code == Some(AUTH_FAILED) {
        let why = match chap {
            Some(c) => format!(
                "the target refused the CHAP credentials of user {:?} from the stage secrets",
                c.username
            ),
            None => "the target requires CHAP and the stage secrets carry none (chapUsername, chapPassword)".to_owned(),
        };
        return Error::new(
            Kind::PermissionDenied,
            format!("iSCSI login to {} at {portal} refused: {why}", target.iqn),
        );
    }
    Error::internal(format!(
        "iSCSI login to {} at {portal} failed: {stderr}",
        target.iqn
    ))
}

/// The sysfs view of iSCSI sessions (normally `/sys`) and open-iscsi's
/// node database.
#[derive(Debug, Clone)]
pub struct IscsiHost {
    /// The sysfs root.
    pub sys: PathBuf,
    /// The node database (`/etc/iscsi/nodes`).
    pub nodes: PathBuf,
}

impl Default for IscsiHost {
    fn default() -> Self {
        Self {
            sys: "/sys".into(),
            nodes: NODES_DIR.into(),
        }
    }
}

fn read_trim(path: &Path) -> String {
    fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

fn names(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .map(|it| {
            it.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

impl IscsiHost {
    /// The sessions (`sessionN`) to `target`'s IQN through a connection to
    /// its portal.
    pub fn sessions(&self, target: &Target) -> Vec<String> {
        let class = self.sys.join("class/iscsi_session");
        names(&class)
            .into_iter()
            .filter(|s| {
                read_trim(&class.join(s).join("targetname")) == target.iqn
                    && names(&class.join(s).join("device"))
                        .iter()
                        .filter(|c| c.starts_with("connection"))
                        .any(|c| {
                            let conn = self.sys.join("class/iscsi_connection").join(c);
                            read_trim(&conn.join("persistent_address"))
                                == target.address.to_string()
                                && read_trim(&conn.join("persistent_port"))
                                    == target.port.to_string()
                        })
            })
            .collect()
    }

    /// The session's state (`LOGGED_IN`, `FAILED`, `FREE`).
    pub fn session_state(&self, session: &str) -> String {
        read_trim(
            &self
                .sys
                .join("class/iscsi_session")
                .join(session)
                .join("state"),
        )
    }

    /// The disk (`sdb`) of LUN `lun` in `session`, if the kernel shows one:
    /// `session/device/target<h>:<c>:<t>/<h>:<c>:<t>:<lun>/block/<disk>`.
    pub fn lun_disk(&self, session: &str, lun: u32) -> Option<String> {
        let device = self
            .sys
            .join("class/iscsi_session")
            .join(session)
            .join("device");
        names(&device)
            .into_iter()
            .filter(|t| t.starts_with("target"))
            .flat_map(|t| {
                let dir = device.join(&t);
                names(&dir).into_iter().map(move |h| dir.join(h))
            })
            .filter(|hctl| {
                let name = hctl.file_name().map(|n| n.to_string_lossy().into_owned());
                name.is_some_and(|n| {
                    n.matches(':').count() == 3 && n.rsplit(':').next() == Some(&lun.to_string())
                })
            })
            .find_map(|hctl| names(&hctl.join("block")).into_iter().next())
    }

    /// Logs in to `target` (CHAP when given) unless a session exists.
    pub fn login(&self, target: &Target, chap: Option<&Chap>) -> Result<()> {
        if !self.sessions(target).is_empty() {
            return Ok(());
        }
        let portal = target.portal();
        // The node record: made here, not by discovery, so only this target
        // is recorded; an existing one is updated in place.
        let exists = run("iscsiadm", &target.node_args(&portal, &[]), ISCSIADM_LIMIT)?;
        if exists.code != Some(0) {
            run_ok(
                "iscsiadm",
                &target.node_args(&portal, &["-o", "new"]),
                ISCSIADM_LIMIT,
            )?;
        }
        let mut settings = vec![("node.startup", "manual")];
        match chap {
            // The user name is no secret; the secret never reaches a
            // command line (see `iscsi_secret`).
            Some(c) => settings.extend([
                ("node.session.auth.authmethod", "CHAP"),
                ("node.session.auth.username", c.username.as_str()),
            ]),
            None => settings.push(("node.session.auth.authmethod", "None")),
        }
        for (key, value) in settings {
            run_ok(
                "iscsiadm",
                &target.node_args(&portal, &["-o", "update", "-n", key, "-v", value]),
                ISCSIADM_LIMIT,
            )?;
        }
        let secret = chap.map(|c| c.password.as_str());
        set_secret(
            &self.nodes,
            &target.iqn,
            target.address,
            target.port,
            secret,
        )?;
        let out = run(
            "iscsiadm",
            &target.node_args(&portal, &["-l"]),
            ISCSIADM_LIMIT,
        );
        // iscsid holds the credentials of the session now: the secret
        // leaves the disk whether the login worked or not.
        if secret.is_some() {
            if let Err(e) = set_secret(&self.nodes, &target.iqn, target.address, target.port, None)
            {
                tracing::warn!(error = %e, iqn = %target.iqn, "could not remove the CHAP secret from the node record");
            }
        }
        let out = out?;
        if matches!(out.code, Some(0) | Some(SESSION_EXISTS)) {
            return Ok(());
        }
        // A failed login leaves no node record behind: no secret stays on
        // disk and iscsid does not retry it.
        if let Err(e) = run(
            "iscsiadm",
            &target.node_args(&portal, &["-o", "delete"]),
            ISCSIADM_LIMIT,
        ) {
            tracing::warn!(error = %e, iqn = %target.iqn, "could not delete the node record of a failed login");
        }
        Err(login_error(
            target,
            &portal,
            chap,
            out.code,
            out.stderr.trim(),
        ))
    }

    /// Logs out of `target` and deletes its node record; none is fine.
    pub fn logout(&self, target: &Target) -> Result<()> {
        let portal = target.portal();
        for op in [&["-u"][..], &["-o", "delete"][..]] {
            let out = run("iscsiadm", &target.node_args(&portal, op), ISCSIADM_LIMIT)?;
            if !matches!(out.code, Some(0) | Some(NO_OBJECTS)) {
                return Err(Error::internal(format!(
                    "iSCSI logout from {} at {portal}: {}",
                    target.iqn,
                    out.stderr.trim()
                )));
            }
        }
        Ok(())
    }

    /// Asks the SCSI disk `disk` to read its capacity again.
    pub fn rescan(&self, disk: &str) -> Result<()> {
        let file = self.sys.join("block").join(disk).join("device/rescan");
        fs::write(&file, "1").map_err(|e| Error::io(file.display(), e))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn put(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
    }

    #[test]
    fn sessions_and_luns_are_found_in_sysfs() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        let iqn = "iqn.2003-01.org.example:t1";
        put(r, "class/iscsi_session/session2/targetname", iqn);
        put(r, "class/iscsi_session/session2/state", "LOGGED_IN\n");
        fs::create_dir_all(r.join("class/iscsi_session/session2/device/connection2:0")).unwrap();
        put(
            r,
            "class/iscsi_connection/connection2:0/persistent_address",
            "127.0.0.1\n",
        );
        put(
            r,
            "class/iscsi_connection/connection2:0/persistent_port",
            "3270\n",
        );
        let lun = "class/iscsi_session/session2/device/target3:0:0";
        fs::create_dir_all(r.join(format!("{lun}/3:0:0:0/block/sdb"))).unwrap();
        fs::create_dir_all(r.join(format!("{lun}/3:0:0:1/block/sdc"))).unwrap();
        let h = IscsiHost {
            sys: r.to_owned(),
            nodes: r.join("nodes"),
        };
        let t = Target {
            address: "127.0.0.1".parse().unwrap(),
            port: 3270,
            iqn: iqn.into(),
        };
        assert_eq!(h.sessions(&t), vec!["session2"]);
        assert_eq!(h.session_state("session2"), "LOGGED_IN");
        assert_eq!(h.lun_disk("session2", 1).as_deref(), Some("sdc"));
        assert_eq!(h.lun_disk("session2", 0).as_deref(), Some("sdb"));
        assert_eq!(h.lun_disk("session2", 2), None);
        let other = Target { port: 3260, ..t };
        assert!(h.sessions(&other).is_empty());
    }

    #[test]
    fn a_refused_authentication_is_named_and_the_secret_is_not() {
        let t = Target {
            address: "127.0.0.1".parse().unwrap(),
            port: 3270,
            iqn: "iqn.2026-01.com.bhyoo.pillar-csi:v".into(),
        };
        let chap = Chap {
            username: "user".into(),
            password: "secret123456".into(),
        };
        let wrong = login_error(&t, "127.0.0.1:3270", Some(&chap), Some(24), "auth");
        assert_eq!(wrong.kind, Kind::PermissionDenied);
        assert!(
            wrong
                .message
                .contains("refused the CHAP credentials of user \"user\""),
            "{wrong}"
        );
        assert!(!wrong.message.contains("secret123456"), "{wrong}");
        let missing = login_error(&t, "127.0.0.1:3270", None, Some(24), "auth");
        assert_eq!(missing.kind, Kind::PermissionDenied);
        assert!(
            missing
                .message
                .contains("the stage secrets carry none (chapUsername, chapPassword)"),
            "{missing}"
        );
        let other = login_error(&t, "127.0.0.1:3270", None, Some(8), "timed out");
        assert_eq!(other.kind, Kind::Internal);
        assert!(other.message.ends_with("failed: timed out"), "{other}");
    }
}
