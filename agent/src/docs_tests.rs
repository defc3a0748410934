//! The guides' refusal tables against the code: every FAILED_PRECONDITION
//! message the agent's import, release, expand, export, initiator and
//! recovery paths can produce must appear in the operator's guides under
//! `docs/`, piece by piece (the text between its placeholders), so a refusal
//! added to the code without its row fails here. The recovery rules must be
//! in `docs/recovery.md` itself, where an operator reading a refused recovery
//! looks.

/// The files whose refusals the guides document, with their names for messages.
const SOURCES: [(&str, &str); 17] = [
    ("backend/zfs.rs", include_str!("backend/zfs.rs")),
    ("backend/dataset.rs", include_str!("backend/dataset.rs")),
    ("backend/directory.rs", include_str!("backend/directory.rs")),
    ("backend/lvm.rs", include_str!("backend/lvm.rs")),
    ("adopt.rs", include_str!("adopt.rs")),
    ("service/adoption.rs", include_str!("service/adoption.rs")),
    ("service/volumes.rs", include_str!("service/volumes.rs")),
    ("service/exports.rs", include_str!("service/exports.rs")),
    ("service/inspect.rs", include_str!("service/inspect.rs")),
    ("service/mod.rs", include_str!("service/mod.rs")),
    ("service/recovery.rs", include_str!("service/recovery.rs")),
    ("service/snapshots.rs", include_str!("service/snapshots.rs")),
    ("service/sources.rs", include_str!("service/sources.rs")),
    (
        "backend/zfs/snapshots.rs",
        include_str!("backend/zfs/snapshots.rs"),
    ),
    (
        "backend/lvm/snapshots.rs",
        include_str!("backend/lvm/snapshots.rs"),
    ),
    ("backend/zfs/keys.rs", include_str!("backend/zfs/keys.rs")),
    (
        "backend/zfs/key_change.rs",
        include_str!("backend/zfs/key_change.rs"),
    ),
];

/// The recovery rules, whose refusals are returned as `Err(String)` (the
/// service prefixes them with `recovery of volume <id> refused: `).
const RULES: [(&str, &str); 2] = [
    ("recovery/rules.rs", include_str!("recovery/rules.rs")),
    ("service/recovery.rs", include_str!("service/recovery.rs")),
];

/// Calls whose `format!` builds a recovery rule's refusal.
const RULE_MARKERS: [&str; 2] = ["Err(", "differs("];

/// The guides that hold the agent's refusal tables (the README holds
/// those of filesystem adoption).
const GUIDES: [(&str, &str); 6] = [
    ("README.md", include_str!("../../README.md")),
    ("docs/install.md", include_str!("../../docs/install.md")),
    (
        "docs/import-zvol.md",
        include_str!("../../docs/import-zvol.md"),
    ),
    ("docs/adopt-lv.md", include_str!("../../docs/adopt-lv.md")),
    ("docs/recovery.md", include_str!("../../docs/recovery.md")),
    (
        "docs/troubleshooting.md",
        include_str!("../../docs/troubleshooting.md"),
    ),
];

/// The guide an operator reads for a refused recovery.
const RECOVERY_GUIDE: &str = include_str!("../../docs/recovery.md");

/// A guide's text as a reader of its tables sees it (`\|` is a `|`).
fn unescaped(text: &str) -> String {
    text.replace("\\|", "|")
}

/// Calls whose `format!` builds a refusal message.
const MARKERS: [&str; 4] = [
    "refused(",
    "refuse(",
    "FailedPrecondition(",
    // `Some(format!(...))`: a reason returned to a caller that refuses.
    "Some(",
];

/// Errors that are not refusals (a `format!` inside one is skipped).
const OTHER_ERRORS: [&str; 6] = [
    "InvalidArgument(",
    "Internal(",
    "NotFound(",
    "AlreadyExists(",
    "Unimplemented(",
    "Unavailable(",
];

/// The string literal `text` starts with, unescaped.
fn literal(text: &str) -> Option<String> {
    let mut out = String::new();
    let mut chars = text.strip_prefix('"')?.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(out),
            '\\' => match chars.next()? {
                '\n' => {
                    // A line continuation: skip the next line's indentation.
                    let rest: String = chars.clone().collect();
                    let skipped = rest.len() - rest.trim_start().len();
                    for _ in 0..skipped {
                        chars.next();
                    }
                }
                e => out.push(e),
            },
            c => out.push(c),
        }
    }
    None
}

/// The refusal format strings of one source file.
fn refusal_formats(source: &str) -> Vec<String> {
    formats_after(source, &MARKERS)
}

/// The format strings of `source` that are arguments of one of `markers`.
fn formats_after(source: &str, markers: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = source[from..].find("format!(") {
        let start = from + at;
        from = start + "format!(".len();
        let before = &source[start.saturating_sub(120)..start];
        let last_marker = markers.iter().filter_map(|m| before.rfind(m)).max();
        let Some(marker_at) = last_marker else {
            continue;
        };
        // The marker must open the call this format! is an argument of:
        // no statement ends between them.
        if before[marker_at..].contains(';')
            || OTHER_ERRORS.iter().any(|e| before[marker_at..].contains(e))
        {
            continue;
        }
        let rest = source[from..].trim_start();
        if let Some(text) = literal(rest) {
            out.push(text);
        }
    }
    out
}

/// The fixed pieces of a format string (the text between placeholders).
fn pieces(format: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut depth = 0;
    for c in format.chars() {
        match c {
            '{' => {
                depth += 1;
                out.push(std::mem::take(&mut current));
            }
            '}' => depth -= 1,
            c if depth == 0 => current.push(c),
            _ => {}
        }
    }
    out.push(current);
    out.into_iter()
        .map(|p| p.trim().to_owned())
        .filter(|p| p.len() >= 6)
        .collect()
}

/// The pieces of `formats` that `text` lacks, each with its file and format.
fn missing_in(text: &str, name: &str, formats: &[String]) -> Vec<String> {
    let mut missing = Vec::new();
    for format in formats {
        for piece in pieces(format) {
            if !text.contains(&piece) {
                missing.push(format!("{name}: {piece:?} (of {format:?})"));
            }
        }
    }
    missing
}

#[test]
fn the_guides_list_every_refusal_the_code_can_produce() {
    let guides: String = GUIDES.iter().map(|(_, text)| unescaped(text)).collect();
    let recovery = unescaped(RECOVERY_GUIDE);
    let mut missing = Vec::new();
    let mut seen = 0;
    for (name, source) in SOURCES {
        let formats = refusal_formats(source);
        seen += formats.len();
        missing.extend(missing_in(&guides, name, &formats));
    }
    for (name, source) in RULES {
        let formats = formats_after(source, &RULE_MARKERS);
        seen += formats.len();
        missing.extend(missing_in(&recovery, name, &formats));
    }
    assert!(
        seen >= 30,
        "only {seen} refusal messages found: the scan is broken"
    );
    assert!(
        missing.is_empty(),
        "refusals missing from the guides ({}; recovery rules from docs/recovery.md):\n{}",
        GUIDES.map(|(name, _)| name).join(", "),
        missing.join("\n")
    );
}

#[test]
fn every_guide_holds_a_refusal_table() {
    for (name, text) in GUIDES {
        assert!(
            text.lines()
                .any(|l| l.starts_with("| `") && l.contains("refused")),
            "{name} has no refusal table row"
        );
    }
}

#[test]
fn the_scan_finds_refusals_and_their_pieces() {
    let found = refusal_formats(
        "return Err(refused(\n    id,\n    format!(\"missing: dataset {named} does not exist\"),\n));\nlet x = format!(\"not a refusal {y}\");\nSome(x.map_err(|e| AgentError::InvalidArgument(format!(\"bad input {e}\"))))",
    );
    assert_eq!(found, vec!["missing: dataset {named} does not exist"]);
    assert_eq!(
        pieces(&found[0]),
        vec!["missing: dataset", "does not exist"]
    );
}
