//! Test-only named crash points.
//!
//! With the cargo feature `crash-points` (off by default, never in a
//! release image), `PILLAR_CRASH_POINT=<name>` (or `<name>@<n>`: the n-th
//! time that point is passed, counting from 1) is read once at start; when
//! the agent reaches [`point`] of that name it logs `crash point <name>
//! reached` on stderr and stops the calling task for good, holding whatever
//! it holds (the volume's lock, the reply not sent), so a test can `kill -9`
//! the process exactly there. While any point is armed, every point passed
//! is logged as `crash point <name> passed` first, so a test can learn which
//! points an operation passes (arm a name that is no point, say `trace`).
//! Without the feature [`point`] is empty.
//!
//! Every name is listed in [`POINTS`] with the operations that pass it; a
//! unit test checks the list against the `point` calls in the source.

/// The environment variable naming the crash point to stop at.
pub const ENV: &str = "PILLAR_CRASH_POINT";

/// Every crash point: its name and the operations (and step) that pass it.
/// The mark and export points sit in the transaction helper and the steps
/// it drives, so every mutation passes them; the configfs points are called
/// after each applied step of an nvmet or LIO plan (one name per step kind).
pub const POINTS: &[(&str, &str)] = &[
    (
        "mark-intent-saved",
        "CreateVolume: the intent (the backend record) is written before the backend call",
    ),
    (
        "mark-written-unrenamed",
        "every mark write: the new mark durable in its temporary file, not renamed into place",
    ),
    (
        "mark-committed",
        "every mutation: the mark is committed, the reply not sent",
    ),
    (
        "mark-restored",
        "CreateVolume: a failed create's intent is undone",
    ),
    (
        "create-backend-done",
        "CreateVolume: the backend created the volume, the mark not committed",
    ),
    (
        "import-backend-done",
        "ImportVolume: the backend checked and adopted the volume, the mark not committed",
    ),
    (
        "expand-backend-done",
        "ExpandVolume: the backend grew the volume, exports not revalidated",
    ),
    (
        "delete-unexported",
        "DeleteVolume: every export removed, the volume not destroyed",
    ),
    (
        "delete-backend-done",
        "DeleteVolume: the backend destroyed the volume, the mark not committed",
    ),
    (
        "snapshot-taken",
        "CreateSnapshot: the backend took the snapshot, the mark not committed",
    ),
    (
        "snapshot-deleted",
        "DeleteSnapshot: the backend destroyed the snapshot (or marked it to go with its last clone), the mark not committed",
    ),
    (
        "retained-destroyed",
        "DeleteSnapshot, DeleteVolume of a clone: a volume kept for its snapshots destroyed, the mark not committed",
    ),
    (
        "release-unexported",
        "ReleaseVolume: every export removed, the mark not committed",
    ),
    (
        "unexport-done",
        "UnexportVolume: the export removed, the mark not committed",
    ),
    (
        "export-applied",
        "ExportVolume, Allow/DenyInitiator, reconciliation: the export applied to configfs",
    ),
    (
        "reconcile-volume-done",
        "restart reconciliation: one volume's recorded exports re-applied",
    ),
    (
        "transfer-after-rename",
        "TransferVolumeOwnership: the recovery mark renamed into place, the reply not sent",
    ),
    ("nvmet-mkdir", "any nvmet plan: a folder made"),
    ("nvmet-write", "any nvmet plan: an attribute written"),
    ("nvmet-symlink", "any nvmet plan: a link made"),
    ("nvmet-unlink", "any nvmet plan: a link removed"),
    ("nvmet-rmdir", "any nvmet plan: a folder removed"),
    ("lio-mkdir", "any LIO plan: a folder made"),
    ("lio-write", "any LIO plan: an attribute written"),
    ("lio-symlink", "any LIO plan: a link made"),
    ("lio-unlink", "any LIO plan: a link removed"),
    ("lio-rmdir", "any LIO plan: a folder removed"),
];

/// The armed point: its name and which pass of it stops (1: the first).
#[cfg(feature = "crash-points")]
fn armed() -> Option<&'static (String, usize)> {
    static ARMED: std::sync::OnceLock<Option<(String, usize)>> = std::sync::OnceLock::new();
    ARMED
        .get_or_init(|| {
            let raw = std::env::var(ENV).ok().filter(|n| !n.is_empty())?;
            Some(parse(&raw))
        })
        .as_ref()
}

/// `name` or `name@n` as (name, n); a bad count is taken as part of the name
/// (a point that never matches).
#[cfg_attr(not(feature = "crash-points"), allow(dead_code))]
fn parse(raw: &str) -> (String, usize) {
    match raw.rsplit_once('@') {
        Some((name, n)) => match n.parse::<usize>() {
            Ok(n) if n > 0 => (name.to_owned(), n),
            _ => (raw.to_owned(), 1),
        },
        None => (raw.to_owned(), 1),
    }
}

/// Reads the armed crash point now (at start), so a later change of the
/// environment has no effect.
pub fn arm() {
    #[cfg(feature = "crash-points")]
    if let Some((name, n)) = armed() {
        eprintln!("crash point {name}@{n} armed");
    }
}

/// Stops here for good when `name` is the armed crash point (and this is
/// the armed pass of it).
#[cfg(feature = "crash-points")]
pub fn point(name: &str) {
    use std::{
        collections::BTreeMap,
        sync::{Mutex, OnceLock},
    };
    static PASSES: OnceLock<Mutex<BTreeMap<String, usize>>> = OnceLock::new();
    let Some((armed, at)) = armed() else {
        return;
    };
    eprintln!("crash point {name} passed");
    if armed != name {
        return;
    }
    let pass = {
        let mut passes = PASSES
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = passes.entry(name.to_owned()).or_default();
        *n += 1;
        *n
    };
    if pass == *at {
        eprintln!("crash point {name} reached");
        loop {
            std::thread::park();
        }
    }
}

/// Does nothing: the agent was built without `crash-points`.
#[cfg(not(feature = "crash-points"))]
#[inline(always)]
pub fn point(_name: &str) {}

/// The crash point after an applied configfs step of `target` (`nvmet` or
/// `lio`), one name per step kind.
pub fn configfs_step(target: Target, step: &configfs::Step) {
    use configfs::Step;
    match (target, step) {
        (Target::Nvmet, Step::Mkdir(_)) => point("nvmet-mkdir"),
        (Target::Nvmet, Step::Write { .. }) => point("nvmet-write"),
        (Target::Nvmet, Step::Symlink { .. }) => point("nvmet-symlink"),
        (Target::Nvmet, Step::Unlink(_)) => point("nvmet-unlink"),
        (Target::Nvmet, Step::Rmdir(_)) => point("nvmet-rmdir"),
        (Target::Lio, Step::Mkdir(_)) => point("lio-mkdir"),
        (Target::Lio, Step::Write { .. }) => point("lio-write"),
        (Target::Lio, Step::Symlink { .. }) => point("lio-symlink"),
        (Target::Lio, Step::Unlink(_)) => point("lio-unlink"),
        (Target::Lio, Step::Rmdir(_)) => point("lio-rmdir"),
    }
}

/// The kernel target whose configfs steps [`configfs_step`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// nvmet.
    Nvmet,
    /// LIO.
    Lio,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::{collections::BTreeSet, fs, path::Path};

    /// Every name given to `point` (as a string literal) in `dir`'s Rust files.
    fn called(dir: &Path, out: &mut BTreeSet<String>) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                called(&path, out);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = fs::read_to_string(&path).unwrap();
            for (i, _) in text.match_indices("point(\"") {
                let rest = &text[i + "point(\"".len()..];
                let name = &rest[..rest.find('"').unwrap()];
                out.insert(name.to_owned());
            }
        }
    }

    #[test]
    fn the_list_names_exactly_the_points_called_in_the_source() {
        let mut found = BTreeSet::new();
        called(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut found,
        );
        let listed: BTreeSet<String> = POINTS.iter().map(|(n, _)| (*n).to_owned()).collect();
        assert_eq!(listed.len(), POINTS.len(), "a name is listed twice");
        let unlisted: Vec<_> = found.difference(&listed).collect();
        let uncalled: Vec<_> = listed.difference(&found).collect();
        assert!(
            unlisted.is_empty(),
            "called but not in POINTS: {unlisted:?}"
        );
        assert!(
            uncalled.is_empty(),
            "in POINTS but never called: {uncalled:?}"
        );
    }

    #[test]
    fn a_count_names_the_nth_pass() {
        assert_eq!(parse("lio-mkdir"), ("lio-mkdir".into(), 1));
        assert_eq!(parse("lio-mkdir@3"), ("lio-mkdir".into(), 3));
        assert_eq!(parse("lio-mkdir@0"), ("lio-mkdir@0".into(), 1));
        assert_eq!(parse("x@y"), ("x@y".into(), 1));
    }
}
