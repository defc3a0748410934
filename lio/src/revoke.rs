//! Ending the sessions of initiators that lose access.
//!
//! LIO checks node ACLs when an initiator logs in. Removing a node ACL ends
//! that initiator's sessions before the `rmdir(2)` returns
//! (`core_tpg_del_initiator_node_acl` shuts them down and waits for them),
//! so an ACL that loses an initiator needs nothing more. Demo mode is
//! different: a session admitted by `generate_node_acls=1` hangs off a
//! dynamic ACL that has no configfs folder, and clearing the attribute
//! leaves it logged in. Disabling the TPG (`enable` 0) ends every session of
//! the TPG before the write returns (`iscsit_tpg_disable_portal_group` ->
//! `iscsit_release_sessions_for_tpg`, which stops each session and waits);
//! the apply that follows enables the TPG again, and initiators that still
//! have an ACL log in again by themselves.
//!
//! A run cut short after the disable leaves the TPG disabled: applying the
//! desired state again (as a restart does) enables it.
use crate::{
    error::Error,
    model::{State, Tpg},
    names::{Iqn, Tpgt},
    plan::tpg_dir,
    Lio,
};
use configfs::Step;

/// Whether a TPG going from `have` to `want` leaves demo mode while enabled:
/// the initiators it admitted keep their sessions unless the TPG is cycled.
pub fn leaves_demo_mode(have: &Tpg, want: &Tpg) -> bool {
    have.enabled && have.attributes.generate_node_acls && !want.attributes.generate_node_acls
}

/// The steps that end the sessions of every TPG of `desired` that leaves
/// demo mode from `present` ([`leaves_demo_mode`]): its `enable` set to 0.
pub fn plan_end_demo_sessions(present: &State, desired: &State) -> Vec<(Iqn, Tpgt, Step)> {
    let mut out = Vec::new();
    for (iqn, want) in &desired.targets {
        let Some(have) = present.targets.get(iqn) else {
            continue;
        };
        for (tpgt, want_tpg) in &want.tpgs {
            if have
                .tpgs
                .get(tpgt)
                .is_some_and(|h| leaves_demo_mode(h, want_tpg))
            {
                let step = Step::write(format!("{}/enable", tpg_dir(iqn, *tpgt)), "0");
                out.push((iqn.clone(), *tpgt, step));
            }
        }
    }
    out
}

/// What [`Lio::apply_revoking`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Revoked {
    /// The TPGs disabled (ending all their sessions) before the apply.
    pub cycled: Vec<(Iqn, Tpgt)>,
    /// The steps of the apply.
    pub steps: Vec<Step>,
}

impl Lio {
    /// [`Lio::apply`], first ending the sessions that would keep access the
    /// desired state takes away: a TPG leaving demo mode is disabled (see
    /// [`plan_end_demo_sessions`]) and enabled again by the apply; a removed
    /// node ACL ends its sessions in the apply itself. When it returns `Ok`,
    /// no initiator without access holds a session.
    pub fn apply_revoking(&self, desired: &State) -> Result<Revoked, Error> {
        let present = self.read_scoped(desired)?;
        let ends = plan_end_demo_sessions(&present, desired);
        let steps: Vec<Step> = ends.iter().map(|(_, _, s)| s.clone()).collect();
        self.tree().run(&steps)?;
        let applied = self.apply(desired)?;
        Ok(Revoked {
            cycled: ends.into_iter().map(|(iqn, tpgt, _)| (iqn, tpgt)).collect(),
            steps: applied,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Target, TpgAttributes};

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
    fn only_an_enabled_tpg_leaving_demo_mode_is_disabled_first() {
        let demo = TpgAttributes::open();
        let acl = TpgAttributes::default();
        let steps = plan_end_demo_sessions(&state(true, demo), &state(true, acl));
        assert_eq!(
            steps.into_iter().map(|(_, _, s)| s).collect::<Vec<_>>(),
            vec![Step::write(
                "iscsi/iqn.2003-01.org.example:t/tpgt_1/enable",
                "0"
            )]
        );
        for (have, want) in [
            (state(true, acl), state(true, demo)),
            (state(true, acl), state(true, acl)),
            (state(true, demo), state(true, demo)),
            (state(false, demo), state(true, acl)),
            (State::default(), state(true, acl)),
        ] {
            assert!(plan_end_demo_sessions(&have, &want).is_empty());
        }
    }
}
