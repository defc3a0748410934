//! Taking access away from hosts that are already connected.
//!
//! nvmet checks `attr_allow_any_host` and `allowed_hosts` only when a host
//! connects: removing a host's link leaves its live controllers serving I/O.
//! What the kernel does offer is this: removing a subsystem's link from a port
//! (`nvmet_port_subsys_drop_link`) deletes every controller of that subsystem
//! on that port (`nvmet_port_del_ctrls`) before the `unlink(2)` returns; for
//! TCP the controllers' sockets are shut down, so the target takes no further
//! command from them. Linking the subsystem back lets hosts connect again,
//! each checked against the access rules in force at that moment.
//!
//! [`plan_apply_revoking`] therefore wraps [`plan_apply`]: for every
//! subsystem whose access narrows (a host leaves `allowed_hosts`, or
//! `attr_allow_any_host` goes from 1 to 0) it first unlinks the subsystem
//! from every port it is linked to, then makes the changes of
//! [`plan_apply`], then links it back. Hosts still allowed reconnect on
//! their own (after their `reconnect_delay`, within `ctrl_loss_tmo`); a
//! host no longer allowed is refused with "do not retry" and its controller
//! goes away.
//!
//! The order makes an interrupted run safe. Whatever prefix of the steps
//! ran, configfs holds either the old access rules (with the subsystem
//! linked or unlinked) or the new rules with the subsystem unlinked or
//! linked back, and in no state the new rules next to a controller that
//! connected under the old ones. Applying the desired state again (as a
//! restart does) links the subsystem back.
use crate::{
    error::Error,
    model::{State, Subsystem},
    names::{Nqn, PortId},
    plan::{link_path, plan_apply, port_dir, subsystem_dir},
    read::{read_port, Links},
    Nvmet,
};
use configfs::Step;
use std::collections::BTreeSet;

/// Whether a subsystem going from `have` to `want` takes access away from
/// some host: `attr_allow_any_host` is cleared, or a host leaves
/// `allowed_hosts` while any host is not allowed.
pub fn narrows_access(have: &Subsystem, want: &Subsystem) -> bool {
    !want.allow_any_host
        && (have.allow_any_host || !have.allowed_hosts.is_subset(&want.allowed_hosts))
}

/// The steps of an apply that cuts off connected hosts losing access.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RevokingPlan {
    /// The steps, in order: the cut-off unlinks, the steps of
    /// [`plan_apply`], then the links back that plan does not already make.
    pub steps: Vec<Step>,
    /// Each `(port, subsystem)` link removed and made again, which deletes
    /// every controller of the subsystem on that port.
    pub cut_off: Vec<(PortId, Nqn)>,
}

/// The steps that turn `present` into `desired` (as [`plan_apply`]), with
/// every subsystem whose access narrows ([`narrows_access`]) unlinked from
/// each port `present` shows it linked to before its access rules change,
/// and linked back after.
///
/// `present` must show, for each such subsystem, every port linking it (not
/// only the ports `desired` names); [`Nvmet::apply_revoking`] reads it so.
pub fn plan_apply_revoking(present: &State, desired: &State) -> Result<RevokingPlan, Error> {
    let narrowed = narrowed(present, desired);
    if narrowed.is_empty() {
        return Ok(RevokingPlan {
            steps: plan_apply(present, desired)?,
            cut_off: Vec::new(),
        });
    }
    let mut cut_off = Vec::new();
    let mut unlinked = present.clone();
    for (id, port) in &mut unlinked.ports {
        for nqn in &narrowed {
            if port.subsystems.remove(nqn) {
                cut_off.push((*id, nqn.clone()));
            }
        }
    }
    let mut steps: Vec<Step> = cut_off
        .iter()
        .map(|(id, nqn)| Step::unlink(link_path(&port_dir(*id), nqn)))
        .collect();
    steps.extend(plan_apply(&unlinked, desired)?);
    for (id, nqn) in &cut_off {
        let relink = Step::symlink(subsystem_dir(nqn), link_path(&port_dir(*id), nqn));
        if !steps.contains(&relink) {
            steps.push(relink);
        }
    }
    Ok(RevokingPlan { steps, cut_off })
}

impl RevokingPlan {
    /// Whether every step makes, changes or removes only objects of
    /// subsystem `nqn`: its own folder and what is in it, and its links
    /// from ports. Such a plan cannot collide with a plan for another
    /// subsystem; one that makes or changes a port or a host object can.
    pub fn only_subsystem(&self, nqn: &Nqn) -> bool {
        let own_dir = subsystem_dir(nqn);
        let own = |path: &str| {
            path == own_dir
                || path
                    .strip_prefix(&own_dir)
                    .is_some_and(|rest| rest.starts_with('/'))
                || path
                    .strip_prefix("ports/")
                    .and_then(|rest| rest.split_once('/'))
                    .and_then(|(_, link)| link.strip_prefix("subsystems/"))
                    .is_some_and(|link| link == nqn.as_str())
        };
        self.steps.iter().all(|step| match step {
            Step::Mkdir(p) | Step::Rmdir(p) | Step::Unlink(p) => own(p),
            Step::Write { path, .. } => own(path),
            // A link's target is only read; linking to a host object
            // relies on it staying, which the caller's locking must see to.
            Step::Symlink { link, .. } => own(link),
        })
    }
}

/// The subsystems of `desired` whose access narrows from `present`.
fn narrowed(present: &State, desired: &State) -> BTreeSet<Nqn> {
    desired
        .subsystems
        .iter()
        .filter(|(nqn, want)| {
            present
                .subsystems
                .get(*nqn)
                .is_some_and(|have| narrows_access(have, want))
        })
        .map(|(nqn, _)| nqn.clone())
        .collect()
}

impl Nvmet {
    /// [`Nvmet::apply`], cutting off the controllers of hosts that lose
    /// access: see [`plan_apply_revoking`]. When it returns `Ok`, no
    /// controller that connected under the old access rules of a narrowed
    /// subsystem is left, and the subsystem is linked to its ports again.
    pub fn apply_revoking(&self, desired: &State) -> Result<RevokingPlan, Error> {
        let plan = self.plan_revoking(desired)?;
        self.tree().run(&plan.steps)?;
        Ok(plan)
    }

    /// The plan [`Nvmet::apply_revoking`] would run now, read and made but
    /// not run (a caller may look at what it touches first, then run its
    /// steps with [`configfs::Tree::run`]).
    pub fn plan_revoking(&self, desired: &State) -> Result<RevokingPlan, Error> {
        self.plan_revoking_from(self.read_scoped(desired)?, desired)
    }

    /// The revoking plan from `present` as [`Nvmet::read_scoped`] read it
    /// for `desired`, with the other ports linking a narrowed subsystem
    /// read in.
    pub(crate) fn plan_revoking_from(
        &self,
        mut present: State,
        desired: &State,
    ) -> Result<RevokingPlan, Error> {
        let narrowed = narrowed(&present, desired);
        if !narrowed.is_empty() {
            // Ports `desired` does not name may link the subsystem too.
            for name in self.tree().children("ports")? {
                let id: PortId = name.parse()?;
                let linked = |p: &crate::Port| narrowed.iter().any(|n| p.subsystems.contains(n));
                if present.ports.get(&id).is_some_and(linked) {
                    continue;
                }
                if let Some(port) = read_port(self.tree(), id, Links::Only(&narrowed))? {
                    let links = port.subsystems.clone();
                    present
                        .ports
                        .entry(id)
                        .or_insert(port)
                        .subsystems
                        .extend(links);
                }
            }
        }
        plan_apply_revoking(&present, desired)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Namespace, Nsid, Port};

    #[test]
    fn a_plan_is_only_its_subsystems_when_it_makes_no_port_or_host() {
        let v = nqn("v");
        let mut present = export(&[]);
        // A new export onto an existing port: its own objects and its link.
        let new = plan_apply_revoking(&present, &export(&[])).expect("plan");
        assert!(new.steps.is_empty());
        present.subsystems.clear();
        present
            .ports
            .values_mut()
            .for_each(|p| p.subsystems.clear());
        let fresh = plan_apply_revoking(&present, &export(&[])).expect("plan");
        assert!(!fresh.steps.is_empty());
        assert!(fresh.only_subsystem(&v), "{:?}", fresh.steps);
        assert!(!fresh.only_subsystem(&nqn("w")));
        // Allowing a host whose object is missing makes that object.
        let with_host = plan_apply_revoking(&export(&[]), &export(&["a"])).expect("plan");
        assert!(!with_host.only_subsystem(&v), "{:?}", with_host.steps);
        // With the host there, only the subsystem's link to it.
        let mut hosts_present = export(&[]);
        hosts_present.hosts.insert(nqn("a"));
        let link = plan_apply_revoking(&hosts_present, &export(&["a"])).expect("plan");
        assert!(link.only_subsystem(&v), "{:?}", link.steps);
        // No port at all: the plan makes it.
        let mut no_port = State::default();
        no_port.hosts.insert(nqn("a"));
        let port = plan_apply_revoking(&no_port, &export(&["a"])).expect("plan");
        assert!(!port.only_subsystem(&v), "{:?}", port.steps);
        // A subsystem whose name starts like ours is not ours.
        let plan = RevokingPlan {
            steps: vec![Step::mkdir(format!("subsystems/{v}x"))],
            cut_off: vec![],
        };
        assert!(!plan.only_subsystem(&v));
    }

    fn nqn(s: &str) -> Nqn {
        Nqn::new(&format!("nqn.2026-01.org.example:{s}")).expect("valid test NQN")
    }

    /// Subsystem `v` on port 1, admitting `hosts` (any host when empty).
    fn export(hosts: &[&str]) -> State {
        let mut s = State::default();
        let mut sub = Subsystem {
            allow_any_host: hosts.is_empty(),
            allowed_hosts: hosts.iter().map(|h| nqn(h)).collect(),
            ..Default::default()
        };
        sub.namespaces.insert(
            Nsid::new(1).expect("nsid"),
            Namespace {
                device_path: "/dev/zd0".into(),
                enabled: true,
                ..Default::default()
            },
        );
        s.subsystems.insert(nqn("v"), sub);
        let mut port = Port::tcp("127.0.0.1:4420".parse().expect("addr"));
        port.subsystems.insert(nqn("v"));
        s.ports.insert(PortId(1), port);
        s.hosts = hosts.iter().map(|h| nqn(h)).collect();
        s
    }

    const LINK: &str = "ports/1/subsystems/nqn.2026-01.org.example:v";
    const DIR: &str = "subsystems/nqn.2026-01.org.example:v";

    #[test]
    fn narrowing_is_a_host_leaving_or_any_host_ending() {
        let sub = |any: bool, hosts: &[&str]| Subsystem {
            allow_any_host: any,
            allowed_hosts: hosts.iter().map(|h| nqn(h)).collect(),
            ..Default::default()
        };
        assert!(narrows_access(
            &sub(false, &["a", "b"]),
            &sub(false, &["b"])
        ));
        assert!(narrows_access(&sub(false, &["a"]), &sub(false, &["b"])));
        assert!(narrows_access(&sub(true, &[]), &sub(false, &["a"])));
        assert!(narrows_access(&sub(false, &["a"]), &sub(false, &[])));
        assert!(!narrows_access(
            &sub(false, &["a"]),
            &sub(false, &["a", "b"])
        ));
        assert!(!narrows_access(&sub(false, &["a"]), &sub(true, &[])));
        assert!(!narrows_access(&sub(true, &[]), &sub(true, &[])));
        assert!(!narrows_access(&sub(false, &["a"]), &sub(false, &["a"])));
    }

    #[test]
    fn removing_a_host_unlinks_the_port_first_and_relinks_last() -> Result<(), Error> {
        let plan = plan_apply_revoking(&export(&["a", "b"]), &export(&["b"]))?;
        assert_eq!(
            plan.steps,
            vec![
                Step::unlink(LINK),
                Step::unlink(format!("{DIR}/allowed_hosts/nqn.2026-01.org.example:a")),
                Step::symlink(DIR, LINK),
            ]
        );
        assert_eq!(plan.cut_off, vec![(PortId(1), nqn("v"))]);
        Ok(())
    }

    #[test]
    fn ending_allow_any_host_cuts_off_before_clearing_it() -> Result<(), Error> {
        let mut present = export(&[]);
        present.hosts.insert(nqn("b"));
        let plan = plan_apply_revoking(&present, &export(&["b"]))?;
        assert_eq!(
            plan.steps,
            vec![
                Step::unlink(LINK),
                Step::write(format!("{DIR}/attr_allow_any_host"), "0"),
                Step::symlink(
                    "hosts/nqn.2026-01.org.example:b",
                    format!("{DIR}/allowed_hosts/nqn.2026-01.org.example:b")
                ),
                Step::symlink(DIR, LINK),
            ]
        );
        Ok(())
    }

    #[test]
    fn widening_or_no_change_cuts_nothing_off() -> Result<(), Error> {
        for (present, desired) in [
            (export(&["a"]), export(&["a", "b"])),
            (export(&["a"]), export(&[])),
            (export(&["a"]), export(&["a"])),
        ] {
            let plan = plan_apply_revoking(&present, &desired)?;
            assert_eq!(plan.cut_off, Vec::new());
            assert_eq!(plan.steps, plan_apply(&present, &desired)?);
        }
        Ok(())
    }

    #[test]
    fn a_subsystem_on_an_undesired_port_is_linked_back_there_too() -> Result<(), Error> {
        let mut present = export(&["a", "b"]);
        let mut other = Port::tcp("127.0.0.1:4421".parse().expect("addr"));
        other.subsystems.insert(nqn("v"));
        present.ports.insert(PortId(2), other);
        let plan = plan_apply_revoking(&present, &export(&["b"]))?;
        let other_link = "ports/2/subsystems/nqn.2026-01.org.example:v";
        assert_eq!(
            plan.steps.first(),
            Some(&Step::unlink(LINK)),
            "{:#?}",
            plan.steps
        );
        assert_eq!(plan.steps.get(1), Some(&Step::unlink(other_link)));
        assert_eq!(plan.steps.last(), Some(&Step::symlink(DIR, other_link)));
        assert_eq!(
            plan.steps
                .iter()
                .filter(|s| matches!(s, Step::Symlink { link, .. } if link == LINK))
                .count(),
            1
        );
        Ok(())
    }

    /// Every prefix of the steps, applied again, converges to the desired
    /// state with the subsystem linked, the way a restart after a kill
    /// mid-way re-applies it.
    #[test]
    fn every_interrupted_prefix_is_completed_by_a_second_apply() -> Result<(), Error> {
        let present = export(&["a", "b"]);
        let desired = export(&["b"]);
        let plan = plan_apply_revoking(&present, &desired)?;
        for k in 0..=plan.steps.len() {
            let mut state = present.clone();
            for step in &plan.steps[..k] {
                simulate(&mut state, step);
            }
            let again = plan_apply_revoking(&state, &desired)?;
            for step in &again.steps {
                simulate(&mut state, step);
            }
            let sub = &state.subsystems[&nqn("v")];
            assert_eq!(sub.allowed_hosts, [nqn("b")].into(), "prefix {k}");
            assert!(
                state.ports[&PortId(1)].subsystems.contains(&nqn("v")),
                "prefix {k}: not linked back"
            );
        }
        Ok(())
    }

    /// Applies the link and host steps of a plan to a state, as the kernel
    /// would (enough for the steps these tests produce).
    fn simulate(state: &mut State, step: &Step) {
        let name = |p: &str| nqn(p.rsplit(':').next().expect("an NQN in the path"));
        match step {
            Step::Unlink(p) if p.starts_with("ports/1/") => {
                state.ports.entry(PortId(1)).and_modify(|port| {
                    port.subsystems.remove(&name(p));
                });
            }
            Step::Symlink { link, .. } if link.starts_with("ports/1/") => {
                state.ports.entry(PortId(1)).and_modify(|port| {
                    port.subsystems.insert(name(link));
                });
            }
            Step::Unlink(p) if p.contains("/allowed_hosts/") => {
                state.subsystems.entry(nqn("v")).and_modify(|s| {
                    s.allowed_hosts.remove(&name(p));
                });
            }
            other => panic!("unexpected step {other:?}"),
        }
    }
}
