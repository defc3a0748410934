//! The names a CSI volume gets in the cluster and on its agent.
//!
//! Under the external-provisioner, CreateVolume's name is the PV's
//! (`pvc-<claim UID>`): a DNS subdomain name, used as it is for the
//! PillarVolumeState and for the agent's volume (`<pool>/pvc-<UID>`), as
//! the spec's recovery procedures expect. The CSI spec allows any name,
//! though (other COs, csi-sanity: capitals, `_`, 128 bytes); such a name
//! gets a derived record name, a readable part and a digest of the exact
//! name, and the record keeps the exact name in [`CSI_NAME`], which
//! CreateVolume compares, so two names never share a volume.
use kube::ResourceExt;

/// The annotation of a PillarVolumeState whose name was derived from
/// CreateVolume's: the name as the CO sent it.
pub const CSI_NAME: &str = "pillar-csi.bhyoo.com/csi-volume-name";

/// The longest agent volume name the controller makes: short enough for
/// every NQN, IQN and LV name built from it.
const AGENT_NAME_MAX: usize = 63;

/// A name of `text`'s lowercase letters and digits (anything else becomes
/// `-`), at most `max` of them, then `-` and 16 hex digits of FNV-1a of
/// `text` (only the digits when `text` has no letter or digit): valid as a
/// Kubernetes object name, a ZFS dataset or LV name, and different for
/// names that differ only in case or punctuation.
pub fn derived(text: &str, max: usize) -> String {
    let readable: String = text
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9') => c,
            _ => '-',
        })
        .take(max)
        .collect();
    let digest = api::names::fnv1a(api::names::FNV1A_BASIS, text.as_bytes());
    match readable.trim_matches('-') {
        "" => format!("{digest:016x}"),
        readable => format!("{readable}-{digest:016x}"),
    }
}

/// Whether `name` is a DNS subdomain name (RFC 1123), as Kubernetes
/// requires of object names.
pub(crate) fn is_object_name(name: &str) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    name.len() <= 253
        && name.split('.').all(|label| {
            label.len() <= 63
                && label.starts_with(alnum)
                && label.ends_with(alnum)
                && label.chars().all(|c| alnum(c) || c == '-')
        })
}

/// The PillarVolumeState's name for CreateVolume's `name`: `name` itself
/// when it is a valid object name, else [`derived`] from it.
pub fn record_name(name: &str) -> String {
    if is_object_name(name) {
        name.to_owned()
    } else {
        derived(name, 40)
    }
}

/// The agent volume's name (after `<pool>/` or `<vg>/`) for the record
/// named `record`: the record's name when short enough and free of `.`,
/// else [`derived`] from it.
pub fn agent_name(record: &str) -> String {
    if record.len() <= AGENT_NAME_MAX && !record.contains('.') {
        record.to_owned()
    } else {
        derived(record, AGENT_NAME_MAX - 17)
    }
}

/// Whether the record `state` was made for CreateVolume's `name`: its
/// name is `name`, or it keeps `name` in [`CSI_NAME`].
pub fn is_record_of(state: &impl ResourceExt, name: &str) -> bool {
    match state.annotations().get(CSI_NAME) {
        Some(kept) => kept == name,
        None => state.name_any() == name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    #[test]
    fn a_pv_name_is_used_as_it_is() {
        let pv = "pvc-0d52c8d6-5d1e-4b8a-9c34-2f1a8e7b9c01";
        assert_eq!(record_name(pv), pv);
        assert_eq!(agent_name(pv), pv);
    }

    #[test]
    fn other_names_get_valid_distinct_derived_names() {
        let sanity = "sanity-Node-Stage-Volume-0123ABCD_x";
        let long = format!("{}-{}", "v".repeat(100), "Z".repeat(27));
        for name in [sanity, long.as_str(), "a_b", "a.b-", "UPPER"] {
            let record = record_name(name);
            assert!(is_object_name(&record), "{name:?} -> {record:?}");
            assert!(record.len() <= 57, "{record:?}");
            let agent = agent_name(&record);
            assert!(agent.len() <= AGENT_NAME_MAX, "{agent:?}");
            let dataset = api::names::zfs::DatasetName::new(&format!("tank/{agent}"));
            assert!(dataset.is_ok(), "{agent:?}: {dataset:?}");
        }
        assert!(record_name(sanity).starts_with("sanity-node-stage-volume-0123abcd-"));
        assert_ne!(record_name("a_b"), record_name("a-b"));
        assert_ne!(record_name("A"), record_name("a"));
        assert_eq!(record_name(sanity), record_name(sanity));
    }

    #[test]
    fn names_of_punctuation_or_nothing_still_get_valid_names() {
        let long_upper = "A".repeat(300);
        let long_punct = "_".repeat(300);
        let names = [
            "_",
            "",
            "-",
            "--",
            ".",
            "UPPER",
            "_a_",
            &long_upper,
            &long_punct,
        ];
        for name in names {
            for max in [40, AGENT_NAME_MAX - 17] {
                let made = derived(name, max);
                assert!(is_object_name(&made), "{name:?} ({max}) -> {made:?}");
                assert!(made.len() <= max + 17, "{made:?}");
            }
            let record = record_name(name);
            assert!(is_object_name(&record), "{name:?} -> {record:?}");
            let agent = agent_name(&record);
            let dataset = api::names::zfs::DatasetName::new(&format!("tank/{agent}"));
            assert!(dataset.is_ok(), "{name:?} -> {agent:?}: {dataset:?}");
            let lv = api::names::lvm::LvName::new(&agent);
            assert!(lv.is_ok(), "{name:?} -> {agent:?}: {lv:?}");
        }
        assert_ne!(record_name("_"), record_name("-"));
        assert_ne!(record_name("_"), record_name(""));
    }

    #[test]
    fn a_long_or_dotted_object_name_gets_a_short_agent_name() {
        let long = ["x".repeat(60), "y".repeat(60), "z".repeat(60)].join(".");
        assert_eq!(record_name(&long), long);
        let agent = agent_name(&long);
        assert!(agent.len() <= AGENT_NAME_MAX && agent.starts_with("xxxx"));
        assert_ne!(
            record_name(&"x".repeat(64)),
            "x".repeat(64),
            "a label of 64"
        );
        assert_ne!(agent_name("a.b"), "a.b");
        assert_ne!(agent_name("a.b"), agent_name("a-b"));
    }

    #[test]
    fn a_record_belongs_to_the_name_it_keeps() {
        let mut state = ConfigMap::default();
        state.metadata.name = Some("v-1".to_owned());
        assert!(is_record_of(&state, "v-1"));
        assert!(!is_record_of(&state, "V-1"));
        state
            .annotations_mut()
            .insert(CSI_NAME.to_owned(), "V_1".to_owned());
        assert!(is_record_of(&state, "V_1"));
        assert!(!is_record_of(&state, "v-1"));
    }
}
