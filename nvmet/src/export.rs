//! One subsystem's export planned from one read, with the ports it links to
//! read whole only every [`PortCheck::EVERY`].
//!
//! An export of a new volume writes six configfs objects; reading its port
//! back (three attributes) and its subsystem first took as many system
//! calls again. The port is what many exports share, and what its owner
//! made and checked: a plan reads it whole when the last whole read is
//! older than [`PortCheck::EVERY`] (or failed), and otherwise trusts it to
//! be as desired where it exists, looking only at whether it links the
//! subsystem; a port removed meanwhile is made again, while one moved to
//! another address meanwhile is seen at the next whole read.
use crate::{
    error::Error,
    model::{Port, State, Subsystem},
    names::Nqn,
    plan::{link_path, port_dir, subsystem_dir},
    read::present_hosts,
    revoke::RevokingPlan,
    Nvmet,
};
use configfs::Step;
use std::{
    collections::BTreeSet,
    sync::Mutex,
    time::{Duration, Instant},
};

/// `mkdir` of an object that exists.
const EEXIST: i32 = 17;

/// When the ports of a [`Nvmet::plan_subsystem`] were last read whole and
/// found as desired.
#[derive(Debug, Default)]
pub struct PortCheck {
    last: Mutex<Option<Instant>>,
}

impl PortCheck {
    /// How long a whole read of the ports is trusted.
    pub const EVERY: Duration = Duration::from_secs(10);

    fn due(&self) -> bool {
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        last.is_none_or(|t| t.elapsed() >= Self::EVERY)
    }

    fn passed(&self) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    }

    /// The next plan reads the ports whole.
    pub fn forget(&self) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// A plan of [`Nvmet::plan_subsystem`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubsystemPlan {
    /// What to run.
    pub plan: RevokingPlan,
    /// The hosts the subsystem allowed when it was read (none when it did
    /// not exist).
    pub allowed_before: BTreeSet<Nqn>,
    /// Whether the ports were read whole for this plan.
    ports_read: bool,
}

impl SubsystemPlan {
    /// Whether the plan took the ports to be as desired instead of reading
    /// them: when its run fails, a plan made again reads them whole.
    pub fn trusted_ports(&self) -> bool {
        !self.ports_read
    }
}

impl Nvmet {
    /// [`Nvmet::plan_revoking`] for one subsystem, `nqn`, from one read of
    /// what it touches, with the hosts the subsystem allowed before.
    ///
    /// When `check` is due, the ports of `desired` are read whole: one
    /// present at another address moves, its present links that
    /// `moves_with_port` accepts are kept in the desired state (they move
    /// with it), and any other link makes the plan refuse the move. Else
    /// the ports are taken to be as desired, and only their links to `nqn`
    /// are looked at; a subsystem not there yet then has its folder made
    /// first, and nothing of it or of its ports is read (a port removed
    /// meanwhile makes the run fail, and the next plan reads the ports).
    pub fn plan_subsystem(
        &self,
        nqn: &Nqn,
        desired: State,
        moves_with_port: impl Fn(&Nqn) -> bool,
        check: &PortCheck,
    ) -> Result<SubsystemPlan, Error> {
        let ports_read = check.due();
        let (present, desired) = if ports_read {
            self.read_moving_ports(desired, moves_with_port)?
        } else {
            (self.read_trusting_ports(nqn, &desired)?, desired)
        };
        let allowed_before = present
            .subsystems
            .get(nqn)
            .map(|s| s.allowed_hosts.clone())
            .unwrap_or_default();
        Ok(SubsystemPlan {
            plan: self.plan_revoking_from(present, &desired)?,
            allowed_before,
            ports_read,
        })
    }

    /// Runs a plan of [`Nvmet::plan_subsystem`]: when it ran, a plan made
    /// from a whole read of the ports passes `check`; when it failed, the
    /// next plan reads them whole.
    pub fn run_subsystem_plan(
        &self,
        planned: &SubsystemPlan,
        check: &PortCheck,
    ) -> Result<(), Error> {
        match self.tree().run(&planned.plan.steps) {
            Ok(()) => {
                if planned.ports_read {
                    check.passed();
                }
                Ok(())
            }
            Err(e) => {
                check.forget();
                Err(e.into())
            }
        }
    }

    /// The present state for `desired` with its ports, where they exist,
    /// taken to be as desired apart from their links to its subsystems.
    ///
    /// A subsystem `nqn` not there yet has its folder made here, the first
    /// step of any plan that makes it: when that succeeds, nothing of it
    /// can be present (the kernel makes it with no namespace, no allowed
    /// host, `attr_allow_any_host` 0 and no port linking it), and only the
    /// host objects it is to allow are looked at.
    fn read_trusting_ports(&self, nqn: &Nqn, desired: &State) -> Result<State, Error> {
        let made = match self.tree().run(&[Step::mkdir(subsystem_dir(nqn))]) {
            Ok(()) => true,
            Err(e) if e.errno() == Some(EEXIST) => false,
            Err(e) => return Err(e.into()),
        };
        let mut present = if made {
            let mut present = State {
                hosts: present_hosts(self.tree(), desired),
                ..Default::default()
            };
            present.subsystems.insert(nqn.clone(), Subsystem::default());
            present
        } else {
            self.read_scoped(&State {
                ports: Default::default(),
                ..desired.clone()
            })?
        };
        for (id, want) in &desired.ports {
            // A port removed since its check (by a tool emptying the ones
            // nothing links) is made again for a subsystem that was there.
            // A new subsystem's plan does not look: its link to the port
            // fails, and the failed run makes the next plan read the ports.
            if !made && !self.tree().exists(&port_dir(*id)) {
                continue;
            }
            let linked = want.subsystems.iter().filter(|n| {
                !(made && *n == nqn) && self.tree().exists(&link_path(&port_dir(*id), n))
            });
            let port = Port {
                transport: want.transport.clone(),
                address: want.address,
                inline_data_size: want.inline_data_size,
                max_queue_size: want.max_queue_size,
                subsystems: linked.cloned().collect(),
            };
            present.ports.insert(*id, port);
        }
        Ok(present)
    }

    /// The present state for `desired` with its ports read whole, and
    /// `desired` with the links that move with a moving port.
    fn read_moving_ports(
        &self,
        mut desired: State,
        moves_with_port: impl Fn(&Nqn) -> bool,
    ) -> Result<(State, State), Error> {
        let present = self.read_scoped(&desired)?;
        let mut moved = false;
        for (id, want) in &mut desired.ports {
            let Some(have) = present.ports.get(id) else {
                continue;
            };
            if have.transport != want.transport || have.address != want.address {
                let moving = have.subsystems.iter().filter(|n| moves_with_port(n));
                want.subsystems.extend(moving.cloned());
                moved = true;
            }
        }
        if moved {
            // The subsystems moving with the port are read too.
            return Ok((self.read_scoped(&desired)?, desired));
        }
        Ok((present, desired))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Namespace, Nsid, Port, PortId, Subsystem};
    use configfs::Tree;
    use std::fs;

    fn export(nqn: &Nqn, address: &str) -> Result<State, Box<dyn std::error::Error>> {
        let mut sub = Subsystem {
            allow_any_host: true,
            ..Default::default()
        };
        sub.namespaces.insert(
            Nsid::new(1)?,
            Namespace {
                device_path: "/dev/zvol/p/v".into(),
                enabled: true,
                ..Default::default()
            },
        );
        let mut port = Port::tcp(address.parse()?);
        port.subsystems.insert(nqn.clone());
        let mut state = State::default();
        state.subsystems.insert(nqn.clone(), sub);
        state.ports.insert(PortId(1), port);
        Ok(state)
    }

    #[test]
    fn the_port_is_read_whole_when_its_check_is_due() -> Result<(), Box<dyn std::error::Error>> {
        // A plain folder stands in for configfs: port 1 at 127.0.0.1:4420.
        let dir = tempfile::tempdir()?;
        let port = dir.path().join("ports/1");
        fs::create_dir_all(port.join("subsystems"))?;
        fs::create_dir(dir.path().join("subsystems"))?;
        for (attr, value) in [
            ("addr_trtype", "tcp"),
            ("addr_traddr", "127.0.0.1"),
            ("addr_trsvcid", "4420"),
        ] {
            fs::write(port.join(attr), format!("{value}\n"))?;
        }
        let target = Nvmet::with_tree(Tree::at(dir.path()));
        let check = PortCheck::default();
        let a = Nqn::new("nqn.2026-01.org.example:a")?;
        let b = Nqn::new("nqn.2026-01.org.example:b")?;
        let writes_port = |p: &SubsystemPlan| {
            p.plan.steps.iter().any(
                |s| matches!(s, configfs::Step::Write { path, .. } if path.starts_with("ports/")),
            )
        };

        // First plan: the port is read whole and found where desired.
        let first = target.plan_subsystem(&a, export(&a, "127.0.0.1:4420")?, |_| false, &check)?;
        assert!(first.ports_read && !writes_port(&first));
        // (A plain folder cannot run the plan: configfs makes a subsystem's
        // inner folders itself.) It ran.
        check.passed();

        // The port moved behind the exporter's back: within the check's
        // period the port is trusted (only b's link is planned) ...
        fs::write(port.join("addr_trsvcid"), "4421\n")?;
        let trusted =
            target.plan_subsystem(&b, export(&b, "127.0.0.1:4420")?, |_| false, &check)?;
        assert!(!trusted.ports_read && !writes_port(&trusted));
        // b's folder was made first (nothing of it read), then its link.
        let b_dir = dir.path().join(format!("subsystems/{b}"));
        assert!(b_dir.is_dir());
        let b_link =
            configfs::Step::symlink(format!("subsystems/{b}"), format!("ports/1/subsystems/{b}"));
        assert!(trusted.plan.steps.contains(&b_link));
        assert!(!trusted
            .plan
            .steps
            .contains(&configfs::Step::mkdir(format!("subsystems/{b}"))));
        // (The kernel's attribute of the folder made.)
        fs::write(b_dir.join("attr_allow_any_host"), "0\n")?;
        // ... and once the check is forgotten (as a failed run does), read
        // whole again: the port is moved back, its link to a moving with it.
        check.forget();
        let read = target.plan_subsystem(&b, export(&b, "127.0.0.1:4420")?, |_| true, &check)?;
        assert!(read.ports_read && writes_port(&read));

        // A port removed within the check's period: a plan for a subsystem
        // that is there makes it again ...
        check.passed();
        fs::remove_dir_all(&port)?;
        let makes_port = |p: &SubsystemPlan| {
            writes_port(p) && p.plan.steps.contains(&configfs::Step::mkdir("ports/1"))
        };
        let remade = target.plan_subsystem(&b, export(&b, "127.0.0.1:4420")?, |_| false, &check)?;
        assert!(remade.trusted_ports() && makes_port(&remade));
        // ... while a new subsystem's plan trusts it. Its run fails (here on
        // the plain folder, in configfs on the link), which forgets the
        // check, and the plan made again reads the ports and makes it.
        let c = Nqn::new("nqn.2026-01.org.example:c")?;
        let trusting =
            target.plan_subsystem(&c, export(&c, "127.0.0.1:4420")?, |_| false, &check)?;
        assert!(trusting.trusted_ports() && !makes_port(&trusting));
        assert!(target.run_subsystem_plan(&trusting, &check).is_err());
        fs::write(
            dir.path()
                .join(format!("subsystems/{c}/attr_allow_any_host")),
            "0\n",
        )?;
        let again = target.plan_subsystem(&c, export(&c, "127.0.0.1:4420")?, |_| false, &check)?;
        assert!(!again.trusted_ports() && makes_port(&again));
        Ok(())
    }
}
