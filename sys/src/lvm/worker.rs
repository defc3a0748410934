//! The worker thread: owns the liblvm2cmd handle, turns each [`Request`]
//! into LVM command lines built from checked values, and each outcome into
//! a typed [`Reply`] or [`Error`].
use super::{
    dm,
    error::Error,
    ffi::{Handle, Outcome},
    report::{parse_lvs, parse_vgs, Lv, Vg, VolumeType, LV_FIELDS, VG_FIELDS},
    Created, Job, LvName, LvmUuid, Reply, Request, ThinPool, VgName,
};
use std::{ffi::CString, path::Path, sync::mpsc};

/// Where the kernel lists block devices, device-mapper ones included.
const SYS_BLOCK: &str = "/sys/block";

/// Runs the worker until every sender is dropped, then releases the handle.
pub(crate) fn run(inbox: mpsc::Receiver<Job>, ready: mpsc::Sender<Result<(), Error>>) {
    let Some(handle) = Handle::init() else {
        let _ = ready.send(Err(Error::Init));
        return;
    };
    let mut worker = Worker { handle };
    let _ = ready.send(Ok(()));
    drop(ready);
    for (request, reply) in inbox {
        let outcome =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| worker.handle(request)))
                .unwrap_or_else(|_| Err(Error::Worker("a request panicked".into())));
        let _ = reply.send(outcome);
    }
    // `worker` (and its handle: lvm2_exit) is dropped here, on this thread.
}

/// An LVM command line. Every argument is a fixed option, a checked name,
/// UUID or number, none containing space, quote or `#` (which liblvm2cmd's
/// splitter would treat specially).
#[derive(Debug, Clone)]
pub(crate) struct Cmd(Vec<String>);

impl Cmd {
    fn new(command: &str) -> Self {
        Self(vec![command.to_owned()])
    }

    fn arg(mut self, a: impl Into<String>) -> Self {
        let a = a.into();
        debug_assert!(
            !a.is_empty() && !a.contains(|c: char| c.is_whitespace() || "'\"#".contains(c)),
            "unsafe LVM argument {a:?}"
        );
        self.0.push(a);
        self
    }

    fn report(command: &str, fields: &str) -> Self {
        Self::new(command)
            .arg("--reportformat")
            .arg("json")
            .arg("--units")
            .arg("b")
            .arg("--nosuffix")
            .arg("-o")
            .arg(fields)
    }

    /// The command line as text (for errors and for `lvm2_run`).
    pub(crate) fn line(&self) -> String {
        self.0.join(" ")
    }
}

fn vg_report(vg: &VgName) -> Cmd {
    Cmd::report("vgs", VG_FIELDS).arg(vg.as_str())
}

fn lvs_report(vg: &VgName) -> Cmd {
    Cmd::report("lvs", LV_FIELDS).arg("-a").arg(vg.as_str())
}

/// `lvs` of one LV (its report, hidden LVs left out by the caller).
fn lv_report(vg: &VgName, lv: &LvName) -> Cmd {
    Cmd::report("lvs", LV_FIELDS).arg(lv_path(vg, lv))
}

fn lvcreate_linear(vg: &VgName, lv: &LvName, size: u64) -> Cmd {
    Cmd::new("lvcreate")
        .arg("-y")
        .arg("--type")
        .arg("linear")
        .arg("-n")
        .arg(lv.as_str())
        .arg("-L")
        .arg(format!("{size}b"))
        .arg(vg.as_str())
}

fn lvcreate_thin(vg: &VgName, pool: &LvName, lv: &LvName, size: u64) -> Cmd {
    Cmd::new("lvcreate")
        .arg("-y")
        .arg("--type")
        .arg("thin")
        .arg("-n")
        .arg(lv.as_str())
        .arg("-V")
        .arg(format!("{size}b"))
        .arg("--thinpool")
        .arg(pool.as_str())
        .arg(vg.as_str())
}

fn lvcreate_thin_snapshot(vg: &VgName, origin: &LvName, lv: &LvName, active: bool) -> Cmd {
    Cmd::new("lvcreate")
        .arg("-y")
        .arg("--snapshot")
        .arg("--setactivationskip")
        .arg(if active { "n" } else { "y" })
        .arg("-n")
        .arg(lv.as_str())
        .arg(lv_path(vg, origin))
}

/// The selection makes LVM itself skip the LV unless its UUID is still
/// `uuid`, under its VG lock: no window between check and remove.
fn lvremove(vg: &VgName, lv: &LvName, uuid: &LvmUuid) -> Cmd {
    Cmd::new("lvremove")
        .arg("-y")
        .arg("--select")
        .arg(format!("lv_uuid={uuid}"))
        .arg(lv_path(vg, lv))
}

fn lvextend(vg: &VgName, lv: &LvName, size: u64) -> Cmd {
    Cmd::new("lvextend")
        .arg("-L")
        .arg(format!("{size}b"))
        .arg(lv_path(vg, lv))
}

/// The LVM command at the heart of a request, as the worker runs it: the
/// one `lvm2_run` that does the request's work, without the reports some
/// requests add before or after it ([`super::floor`]).
pub(crate) fn command(request: &Request) -> Cmd {
    match request {
        Request::Vg(vg) => vg_report(vg),
        Request::Lvs(vg) => lvs_report(vg),
        Request::Lv(vg, lv) | Request::ThinPool(vg, lv) => lv_report(vg, lv),
        Request::CreateLinear { vg, lv, size } => lvcreate_linear(vg, lv, *size),
        Request::CreateThin { vg, pool, lv, size } => lvcreate_thin(vg, pool, lv, *size),
        Request::CreateThinSnapshot {
            vg,
            origin,
            lv,
            active,
        } => lvcreate_thin_snapshot(vg, origin, lv, *active),
        Request::Remove { vg, lv, uuid } => lvremove(vg, lv, uuid),
        Request::Extend { vg, lv, size } => lvextend(vg, lv, *size),
    }
}

/// What a command printed, when it succeeded.
struct Printed {
    command: String,
    lines: Vec<String>,
}

struct Worker {
    handle: Handle,
}

fn lv_path(vg: &VgName, lv: &LvName) -> String {
    format!("{vg}/{lv}")
}

fn check_size(vg: &VgName, lv: &LvName, size: u64) -> Result<(), Error> {
    let why = if size == 0 {
        "it is zero"
    } else if !size.is_multiple_of(512) {
        "it is not a whole number of 512-byte sectors"
    } else {
        return Ok(());
    };
    Err(Error::InvalidSize {
        vg: vg.to_string(),
        lv: lv.to_string(),
        size,
        why,
    })
}

impl Worker {
    fn handle(&mut self, request: Request) -> Result<Reply, Error> {
        match request {
            Request::Vg(vg) => self.vg(&vg).map(Reply::Vg),
            Request::Lvs(vg) => self.lvs(&vg).map(Reply::Lvs),
            Request::Lv(vg, lv) => self.lv(&vg, &lv).map(Reply::Lv),
            Request::CreateLinear { vg, lv, size } => {
                self.create_linear(&vg, &lv, size).map(Reply::Created)
            }
            Request::CreateThin { vg, pool, lv, size } => {
                self.create_thin(&vg, &pool, &lv, size).map(Reply::Created)
            }
            Request::CreateThinSnapshot {
                vg,
                origin,
                lv,
                active,
            } => self
                .create_thin_snapshot(&vg, &origin, &lv, active)
                .map(Reply::Created),
            Request::Remove { vg, lv, uuid } => {
                self.remove(&vg, &lv, &uuid).map(|()| Reply::Removed)
            }
            Request::Extend { vg, lv, size } => self.extend(&vg, &lv, size).map(Reply::Lv),
            Request::ThinPool(vg, pool) => self.thin_pool(&vg, &pool).map(Reply::ThinPool),
        }
    }

    /// Runs a command; a failure is [`Error::Command`] with LVM's messages.
    fn exec(&mut self, cmd: &Cmd) -> Result<Printed, Error> {
        let command = cmd.line();
        let cline = CString::new(command.clone()).map_err(|_| Error::Command {
            command: command.clone(),
            code: 0,
            messages: vec!["the command line holds a NUL byte".into()],
        })?;
        let Outcome { code, lines } = self.handle.run(&cline);
        if code != lvm_sys::LVM2_COMMAND_SUCCEEDED as i32 {
            return Err(Error::Command {
                command,
                code,
                messages: lines
                    .into_iter()
                    .filter(|l| l.level < lvm_sys::LVM2_LOG_PRINT as i32)
                    .map(|l| l.text.trim().to_owned())
                    .collect(),
            });
        }
        Ok(Printed {
            command,
            lines: lines
                .into_iter()
                .filter(|l| l.level == lvm_sys::LVM2_LOG_PRINT as i32)
                .map(|l| l.text)
                .collect(),
        })
    }

    /// Maps LVM's "not found" messages for `vg` (and `vg/lv`) to typed errors.
    fn not_found(err: Error, vg: &VgName, lv: Option<&LvName>) -> Error {
        if let Error::Command { messages, .. } = &err {
            let vg_msg = format!("Volume group \"{vg}\" not found");
            if messages.iter().any(|m| m.contains(&vg_msg)) {
                return Error::VgNotFound { vg: vg.to_string() };
            }
            if let Some(lv) = lv {
                let lv_msg = format!("Failed to find logical volume \"{vg}/{lv}\"");
                if messages.iter().any(|m| m.contains(&lv_msg)) {
                    return Error::LvNotFound {
                        vg: vg.to_string(),
                        lv: lv.to_string(),
                    };
                }
            }
        }
        err
    }

    fn vg(&mut self, vg: &VgName) -> Result<Vg, Error> {
        let cmd = vg_report(vg);
        let out = self.exec(&cmd).map_err(|e| Self::not_found(e, vg, None))?;
        let vgs = parse_vgs(&out.lines).map_err(|source| Error::Report {
            command: out.command.clone(),
            source,
        })?;
        vgs.into_iter()
            .find(|v| &v.name == vg)
            .ok_or_else(|| Error::VgNotFound { vg: vg.to_string() })
    }

    fn parse_lvs(out: &Printed) -> Result<Vec<Lv>, Error> {
        parse_lvs(&out.lines).map_err(|source| Error::Report {
            command: out.command.clone(),
            source,
        })
    }

    fn lvs(&mut self, vg: &VgName) -> Result<Vec<Lv>, Error> {
        let cmd = lvs_report(vg);
        let out = self.exec(&cmd).map_err(|e| Self::not_found(e, vg, None))?;
        Self::parse_lvs(&out)
    }

    fn lv(&mut self, vg: &VgName, lv: &LvName) -> Result<Lv, Error> {
        let cmd = lv_report(vg, lv);
        let out = self
            .exec(&cmd)
            .map_err(|e| Self::not_found(e, vg, Some(lv)))?;
        Self::parse_lvs(&out)?
            .into_iter()
            .find(|l| l.name == lv.as_str() && !l.hidden)
            .ok_or_else(|| Error::LvNotFound {
                vg: vg.to_string(),
                lv: lv.to_string(),
            })
    }

    /// Why a create or extend in `vg` failed, found by reading the VG and LV
    /// after the fact (only on the failure path).
    fn diagnose_create(&mut self, err: Error, vg: &VgName, lv: &LvName, size: u64) -> Error {
        let vg_now = match self.vg(vg) {
            Ok(v) => v,
            Err(e @ Error::VgNotFound { .. }) => return e,
            Err(_) => return err,
        };
        match self.lv(vg, lv) {
            Ok(_) => {
                return Error::LvExists {
                    vg: vg.to_string(),
                    lv: lv.to_string(),
                }
            }
            Err(Error::LvNotFound { .. }) => {}
            Err(_) => return err,
        }
        if size > vg_now.free {
            return Error::InsufficientSpace {
                vg: vg.to_string(),
                lv: lv.to_string(),
                requested: size,
                free: vg_now.free,
            };
        }
        err
    }

    /// The LV just created: from the kernel's device-mapper entry when it
    /// is active (no second LVM command), else from an LVM report.
    fn created(&mut self, vg: &VgName, lv: &LvName) -> Result<Created, Error> {
        let path = std::path::PathBuf::from(format!("/dev/{vg}/{lv}"));
        if let Some(a) = dm::active(Path::new(SYS_BLOCK), vg, lv) {
            return Ok(Created {
                vg: vg.clone(),
                name: lv.clone(),
                vg_uuid: a.vg_uuid,
                uuid: a.uuid,
                size: a.size,
                path,
                active: true,
            });
        }
        let r = self.lv(vg, lv)?;
        Ok(Created {
            vg: vg.clone(),
            name: lv.clone(),
            vg_uuid: r.vg_uuid,
            uuid: r.uuid,
            size: r.size,
            path: r.path.unwrap_or(path),
            active: r.attr.active,
        })
    }

    fn create_linear(&mut self, vg: &VgName, lv: &LvName, size: u64) -> Result<Created, Error> {
        check_size(vg, lv, size)?;
        let cmd = lvcreate_linear(vg, lv, size);
        if let Err(e) = self.exec(&cmd) {
            return Err(self.diagnose_create(e, vg, lv, size));
        }
        self.created(vg, lv)
    }

    fn thin_pool_lv(&mut self, vg: &VgName, pool: &LvName) -> Result<Lv, Error> {
        let not_pool = |why: String| Error::NotAThinPool {
            vg: vg.to_string(),
            pool: pool.to_string(),
            why,
        };
        match self.lv(vg, pool) {
            Ok(p) if p.attr.volume_type == VolumeType::ThinPool => Ok(p),
            Ok(p) => Err(not_pool(format!(
                "it is a {} LV with lv_attr {}",
                p.segtype, p.attr.raw
            ))),
            Err(Error::LvNotFound { .. }) => Err(not_pool("it does not exist".into())),
            Err(e) => Err(e),
        }
    }

    fn create_thin(
        &mut self,
        vg: &VgName,
        pool: &LvName,
        lv: &LvName,
        size: u64,
    ) -> Result<Created, Error> {
        check_size(vg, lv, size)?;
        // Checked first: `lvcreate --thinpool` must never be pointed at an
        // LV that is not a thin pool. An active pool shows in the kernel's
        // device-mapper table (a few sysfs reads); only an inactive one, or
        // an LV that is not a pool, costs an LVM report.
        if !dm::active_thin_pool(Path::new(SYS_BLOCK), vg, pool) {
            self.thin_pool_lv(vg, pool)?;
        }
        let cmd = lvcreate_thin(vg, pool, lv, size);
        if let Err(e) = self.exec(&cmd) {
            return Err(match self.lv(vg, lv) {
                Ok(_) => Error::LvExists {
                    vg: vg.to_string(),
                    lv: lv.to_string(),
                },
                Err(_) => e,
            });
        }
        self.created(vg, lv)
    }

    fn create_thin_snapshot(
        &mut self,
        vg: &VgName,
        origin: &LvName,
        lv: &LvName,
        active: bool,
    ) -> Result<Created, Error> {
        let cmd = lvcreate_thin_snapshot(vg, origin, lv, active);
        if let Err(e) = self.exec(&cmd) {
            return Err(match self.lv(vg, lv) {
                Ok(_) => Error::LvExists {
                    vg: vg.to_string(),
                    lv: lv.to_string(),
                },
                Err(_) => Self::not_found(e, vg, Some(origin)),
            });
        }
        self.created(vg, lv)
    }

    fn remove(&mut self, vg: &VgName, lv: &LvName, uuid: &LvmUuid) -> Result<(), Error> {
        let cmd = lvremove(vg, lv, uuid);
        let out = self
            .exec(&cmd)
            .map_err(|e| Self::not_found(e, vg, Some(lv)))?;
        let removed = format!("Logical volume \"{lv}\" successfully removed");
        if out.lines.iter().any(|l| l.contains(&removed)) {
            return Ok(());
        }
        // LVM printed no removal: find out what is there now.
        match self.lv(vg, lv) {
            Err(Error::LvNotFound { .. }) => Ok(()),
            Ok(found) if &found.uuid != uuid => Err(Error::UuidMismatch {
                vg: vg.to_string(),
                lv: lv.to_string(),
                expected: uuid.clone(),
                found: found.uuid,
            }),
            Ok(_) => Err(Error::Command {
                command: out.command,
                code: lvm_sys::LVM2_COMMAND_SUCCEEDED as i32,
                messages: vec![format!(
                    "LVM reported success but {vg}/{lv} is still there: {:?}",
                    out.lines
                )],
            }),
            Err(e) => Err(e),
        }
    }

    fn extend(&mut self, vg: &VgName, lv: &LvName, size: u64) -> Result<Lv, Error> {
        check_size(vg, lv, size)?;
        let current = self.lv(vg, lv)?;
        if size < current.size {
            return Err(Error::Shrink {
                vg: vg.to_string(),
                lv: lv.to_string(),
                current: current.size,
                requested: size,
            });
        }
        if size == current.size {
            return Ok(current);
        }
        let cmd = lvextend(vg, lv, size);
        if let Err(e) = self.exec(&cmd) {
            let now = self.lv(vg, lv)?;
            // Rounded up to whole extents, the size may already be reached.
            if now.size >= size {
                return Ok(now);
            }
            if now.attr.volume_type != VolumeType::Thin {
                if let Ok(v) = self.vg(vg) {
                    if size - now.size > v.free {
                        return Err(Error::InsufficientSpace {
                            vg: vg.to_string(),
                            lv: lv.to_string(),
                            requested: size,
                            free: v.free,
                        });
                    }
                }
            }
            return Err(e);
        }
        self.lv(vg, lv)
    }

    fn thin_pool(&mut self, vg: &VgName, pool: &LvName) -> Result<ThinPool, Error> {
        let lv = self.thin_pool_lv(vg, pool)?;
        let data_percent = lv.data_percent.unwrap_or(0.0);
        Ok(ThinPool {
            size: lv.size,
            used: (lv.size as f64 * data_percent / 100.0).round() as u64,
            data_percent,
            metadata_percent: lv.metadata_percent.unwrap_or(0.0),
            lv,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn command_lines_are_built_from_checked_parts() {
        let vg = VgName::new("labvg").unwrap();
        let lv = LvName::new("pvc-1").unwrap();
        let cmd = Cmd::new("lvcreate")
            .arg("-n")
            .arg(lv.as_str())
            .arg("-L")
            .arg(format!("{}b", 4 << 20))
            .arg(vg.as_str());
        assert_eq!(cmd.line(), "lvcreate -n pvc-1 -L 4194304b labvg");
        let report = Cmd::report("vgs", VG_FIELDS).arg(vg.as_str());
        assert_eq!(
            report.line(),
            "vgs --reportformat json --units b --nosuffix -o vg_name,vg_uuid,vg_size,vg_free,vg_extent_size labvg"
        );
    }

    #[test]
    #[should_panic(expected = "unsafe LVM argument")]
    fn an_argument_with_a_space_is_a_bug() {
        let _ = Cmd::new("lvs").arg("a b");
    }

    #[test]
    fn sizes_must_be_whole_sectors() {
        let vg = VgName::new("vg").unwrap();
        let lv = LvName::new("lv").unwrap();
        assert!(check_size(&vg, &lv, 512).is_ok());
        assert!(check_size(&vg, &lv, 1 << 30).is_ok());
        for bad in [0, 1, 511, 513] {
            let err = check_size(&vg, &lv, bad).unwrap_err();
            assert!(
                err.to_string().starts_with("LV vg/lv: invalid size"),
                "{err}"
            );
        }
    }
}
