//! The names of a volume's export targets: unique per agent, so two
//! storage nodes that export the same volume ID (`tank/data` imported on
//! both) never show hosts one subsystem NQN or target IQN. A host joins
//! controllers of one NQN into one subsystem (native NVMe multipath), and
//! would then mount one node's disk for the other's volume.
//!
//! A name is `<prefix><agent>:<volume>`: the prefix names pillar-csi, the
//! agent part is the agent's name folded to the RFC 3720 alphabet, the
//! volume part is [`VolumeId::target_suffix`]. Exports made before names
//! carried the agent (`<prefix><volume>`, the legacy name) keep it until
//! they are removed: renaming a live target would cut its hosts off. The
//! fence mark records which name each export was made under.
use crate::{
    error::AgentError,
    volume::{fold_to_target_name, VolumeId},
};

/// The prefix of every subsystem NQN this agent makes.
pub const NQN_PREFIX: &str = "nqn.2026-01.com.bhyoo.pillar-csi:";
/// The prefix of every target IQN this agent makes.
pub const IQN_PREFIX: &str = "iqn.2026-01.com.bhyoo.pillar-csi:";
/// The longest NQN or IQN (NVMe base specification, RFC 3720).
const MAX_NAME: usize = 223;
/// The longest agent part: a longer name keeps its head and a hash.
const MAX_AGENT: usize = 40;

/// How one agent names its export targets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetNames {
    agent: String,
}

impl TargetNames {
    /// The names of the agent called `agent_name` (its node's name). The
    /// name is folded to lowercase letters, digits, `-` and `.`; one that
    /// folds to nothing is refused.
    pub fn new(agent_name: &str) -> Result<Self, AgentError> {
        let folded = fold_to_target_name(agent_name.trim());
        if folded.trim_matches(['-', '.']).is_empty() {
            return Err(AgentError::InvalidArgument(format!(
                "agent name {agent_name:?} has no letter or digit to name export targets with"
            )));
        }
        let agent = if folded.len() > MAX_AGENT {
            format!(
                "{}-{:08x}",
                &folded[..MAX_AGENT - 9],
                api::names::fnv1a(api::names::FNV1A_BASIS, agent_name.as_bytes()) as u32
            )
        } else {
            folded
        };
        Ok(Self { agent })
    }

    /// The agent part of the names.
    pub fn agent(&self) -> &str {
        &self.agent
    }

    /// The NQN this agent gives a new export of `volume`.
    pub fn nqn(&self, volume: &VolumeId) -> String {
        self.name(NQN_PREFIX, volume)
    }

    /// The IQN this agent gives a new export of `volume`.
    pub fn iqn(&self, volume: &VolumeId) -> String {
        self.name(IQN_PREFIX, volume)
    }

    /// The NQN exports of `volume` had before names carried the agent.
    pub fn legacy_nqn(volume: &VolumeId) -> String {
        format!("{NQN_PREFIX}{}", volume.target_suffix())
    }

    /// The IQN exports of `volume` had before names carried the agent.
    pub fn legacy_iqn(volume: &VolumeId) -> String {
        format!("{IQN_PREFIX}{}", volume.target_suffix())
    }

    /// `<prefix><agent>:<volume>`, the volume part shortened to fit (its
    /// hash of the exact ID, at its end, is kept).
    fn name(&self, prefix: &str, volume: &VolumeId) -> String {
        let suffix = volume.target_suffix();
        let room = MAX_NAME - prefix.len() - self.agent.len() - 1;
        let volume_part = if suffix.len() > room {
            let (head, hash) = suffix.split_at(suffix.len() - 9);
            format!("{}{hash}", &head[..room - 9])
        } else {
            suffix
        };
        format!("{prefix}{}:{volume_part}", self.agent)
    }
}

/// The name of the host this agent runs on (the agent runs in the host's
/// network namespace, whose host name is the node's).
pub fn host_name() -> Result<String, AgentError> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_err(|e| AgentError::Internal(format!("reading the host name: {e}")))?;
    Ok(name.trim().to_owned())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn two_agents_name_one_volume_id_differently() {
        let v = VolumeId::parse("tank/data").unwrap();
        let a = TargetNames::new("storage-1").unwrap();
        let b = TargetNames::new("storage-2").unwrap();
        assert_eq!(
            a.nqn(&v),
            format!(
                "nqn.2026-01.com.bhyoo.pillar-csi:storage-1:{}",
                v.target_suffix()
            )
        );
        assert_ne!(a.nqn(&v), b.nqn(&v));
        assert_ne!(a.iqn(&v), b.iqn(&v));
        assert!(a.iqn(&v).starts_with(IQN_PREFIX));
        // The legacy name, the same on every agent, is neither.
        assert_ne!(TargetNames::legacy_nqn(&v), a.nqn(&v));
        assert!(nvmet::Nqn::new(&a.nqn(&v)).is_ok());
        assert!(lio::Iqn::new(&a.iqn(&v)).is_ok());
    }

    #[test]
    fn agent_names_fold_and_long_ones_keep_a_hash() {
        assert_eq!(
            TargetNames::new("Node_7.Example").unwrap().agent(),
            "node-7.example"
        );
        let long = "n".repeat(60);
        let a = TargetNames::new(&long).unwrap();
        assert_eq!(a.agent().len(), MAX_AGENT);
        assert_ne!(a, TargetNames::new(&"n".repeat(61)).unwrap());
        for bad in ["", "  ", "_", "--"] {
            let e = TargetNames::new(bad).unwrap_err().to_string();
            assert!(e.contains("agent name"), "{e}");
        }
    }

    #[test]
    fn a_long_volume_id_still_fits_and_stays_unique() {
        let a = TargetNames::new(&"s".repeat(60)).unwrap();
        let id = |last: char| VolumeId::parse(&format!("tank/{}{last}", "v".repeat(240))).unwrap();
        let (x, y) = (a.nqn(&id('x')), a.nqn(&id('y')));
        assert_eq!(x.len(), MAX_NAME);
        assert_ne!(x, y);
        assert!(nvmet::Nqn::new(&x).is_ok() && lio::Iqn::new(&a.iqn(&id('x'))).is_ok());
    }
}
