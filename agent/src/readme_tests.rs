//! The README's refusal tables against the code: every FAILED_PRECONDITION
//! message the agent's import, release, expand, export and initiator paths
//! can produce must appear in the README, piece by piece (the text between
//! its placeholders), so a refusal added to the code without its row fails
//! here.

/// The files whose refusals the README documents, with their names for messages.
const SOURCES: [(&str, &str); 9] = [
    ("backend/zfs.rs", include_str!("backend/zfs.rs")),
    ("backend/lvm.rs", include_str!("backend/lvm.rs")),
    ("adopt.rs", include_str!("adopt.rs")),
    ("service/adoption.rs", include_str!("service/adoption.rs")),
    ("service/volumes.rs", include_str!("service/volumes.rs")),
    ("service/exports.rs", include_str!("service/exports.rs")),
    ("service/inspect.rs", include_str!("service/inspect.rs")),
    ("service/mod.rs", include_str!("service/mod.rs")),
    ("service/recovery.rs", include_str!("service/recovery.rs")),
];

/// The recovery rules, whose refusals are returned as `Err(String)` (the
/// service prefixes them with `recovery of volume <id> refused: `).
const RULES: [(&str, &str); 2] = [
    ("recovery/rules.rs", include_str!("recovery/rules.rs")),
    ("service/recovery.rs", include_str!("service/recovery.rs")),
];

/// Calls whose `format!` builds a recovery rule's refusal.
const RULE_MARKERS: [&str; 2] = ["Err(", "differs("];

const README: &str = include_str!("../../README.md");

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

#[test]
fn the_readme_lists_every_refusal_the_code_can_produce() {
    let readme = README.replace("\\|", "|");
    let mut missing = Vec::new();
    let mut seen = 0;
    let scans = SOURCES.iter().map(|(n, s)| (n, refusal_formats(s))).chain(
        RULES
            .iter()
            .map(|(n, s)| (n, formats_after(s, &RULE_MARKERS))),
    );
    for (name, formats) in scans {
        for format in formats {
            seen += 1;
            for piece in pieces(&format) {
                if !readme.contains(&piece) {
                    missing.push(format!("{name}: {piece:?} (of {format:?})"));
                }
            }
        }
    }
    assert!(
        seen >= 30,
        "only {seen} refusal messages found: the scan is broken"
    );
    assert!(
        missing.is_empty(),
        "refusals missing from README.md:\n{}",
        missing.join("\n")
    );
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
