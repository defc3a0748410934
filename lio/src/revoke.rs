//! Ending the sessions of initiators that lose access.
//!
//! LIO checks node ACLs when an initiator logs in. Removing a node ACL ends
//! that initiator's sessions before the `rmdir(2)` returns
//! (`core_tpg_del_initiator_node_acl` shuts them down and waits for them),
//! so an ACL that loses an initiator needs nothing more. Demo mode is
//! different: a session admitted by `generate_node_acls=1` hangs off a
//! dynamic node ACL that has no configfs folder, and the kernel keeps that
//! ACL cached (demo mode forces `cache_dynamic_acls=1`). Clearing the
//! attribute leaves the session logged in, and disabling the TPG ends the
//! session but the cached ACL admits the initiator again when it logs back
//! in (seen in the lab). Removing the TPG ends its sessions and frees its
//! dynamic ACLs (`core_tpg_deregister`), so a target leaving demo mode is
//! removed and made again by the apply that follows; initiators with an
//! ACL log in again by themselves.
//!
//! A run cut short after the removal leaves the target missing: applying
//! the desired state again (as a restart does) makes it.
use crate::{
    error::Error,
    model::{State, Teardown, Tpg},
    names::Iqn,
    Lio,
};
use configfs::Step;
use std::collections::BTreeSet;

/// Whether a TPG going from `have` to `want` leaves demo mode: the
/// initiators it admitted keep their sessions and cached dynamic ACLs
/// unless the TPG is removed.
pub fn leaves_demo_mode(have: &Tpg, want: &Tpg) -> bool {
    have.attributes.generate_node_acls && !want.attributes.generate_node_acls
}

/// The targets of `desired` with a TPG that leaves demo mode from
/// `present` ([`leaves_demo_mode`]): they are removed before the apply.
pub fn targets_leaving_demo_mode(present: &State, desired: &State) -> BTreeSet<Iqn> {
    desired
        .targets
        .iter()
        .filter(|(iqn, want)| {
            present.targets.get(*iqn).is_some_and(|have| {
                want.tpgs
                    .iter()
                    .any(|(tpgt, w)| have.tpgs.get(tpgt).is_some_and(|h| leaves_demo_mode(h, w)))
            })
        })
        .map(|(iqn, _)| iqn.clone())
        .collect()
}

/// What [`Lio::apply_revoking`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Revoked {
    /// The targets removed (ending all their sessions and dropping their
    /// dynamic ACLs) and made again.
    pub recreated: BTreeSet<Iqn>,
    /// The steps taken, the removals first.
    pub steps: Vec<Step>,
}

impl Lio {
    /// [`Lio::apply`], first ending the sessions that would keep access the
    /// desired state takes away: a target leaving demo mode is removed (see
    /// [`targets_leaving_demo_mode`]) and made again by the apply; a removed
    /// node ACL ends its sessions in the apply itself. Storage objects are
    /// kept. When it returns `Ok`, no initiator without access holds a
    /// session.
    pub fn apply_revoking(&self, desired: &State) -> Result<Revoked, Error> {
        // Only the targets tell whether one leaves demo mode; the apply
        // reads the rest.
        let present = State {
            targets: crate::read::read_targets_named(self.tree(), desired.targets.keys())?,
            ..Default::default()
        };
        let recreated = targets_leaving_demo_mode(&present, desired);
        let mut steps = if recreated.is_empty() {
            Vec::new()
        } else {
            self.teardown(&Teardown {
                targets: recreated.clone(),
                ..Default::default()
            })?
        };
        steps.extend(self.apply(desired)?);
        Ok(Revoked { recreated, steps })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Target, TpgAttributes, Tpgt};

    fn state(enabled: bool, attributes: TpgAttributes) -> State {
        let mut target = Target::default();
        target.tpgs.insert(
            Tpgt::new(1).expect("tpgt"),
            Tpg {
                enabled,
                attributes,
                ..Default::default()
            },
        );
        let mut s = State::default();
        s.targets
            .insert(Iqn::new("iqn.2003-01.org.example:t").expect("iqn"), target);
        s
    }

    #[test]
    fn only_a_target_leaving_demo_mode_is_made_again() {
        let demo = TpgAttributes::open();
        let acl = TpgAttributes::default();
        let t = Iqn::new("iqn.2003-01.org.example:t").expect("iqn");
        assert_eq!(
            targets_leaving_demo_mode(&state(true, demo), &state(true, acl)),
            [t.clone()].into()
        );
        assert_eq!(
            targets_leaving_demo_mode(&state(false, demo), &state(true, acl)),
            [t].into(),
            "a disabled TPG still holds cached dynamic ACLs"
        );
        for (have, want) in [
            (state(true, acl), state(true, demo)),
            (state(true, acl), state(true, acl)),
            (state(true, demo), state(true, demo)),
            (State::default(), state(true, acl)),
        ] {
            assert!(targets_leaving_demo_mode(&have, &want).is_empty());
        }
    }
}
