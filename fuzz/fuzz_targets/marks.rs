//! Fence marks as read from the state folder: any file name stem and any
//! file contents are decoded or refused without a panic. A decoded name
//! encodes back to a stem that decodes to it again; contents read as a mark
//! are the mark of exactly that volume ID, and what the store would write
//! for that mark reads back as the same mark.
//!
//! Input: the file name stem, a newline, then the file's contents.
//!
//! The fuzz crate links the agent itself (with its C libraries: ZFS and LVM
//! are dynamic libraries the build host has anyway), so this runs the
//! agent's own parser, `marks::{decode, parse}`, not a copy.
#![no_main]
use libfuzzer_sys::fuzz_target;
use pillar_csi_agent::marks::{decode, encode, parse, render, MARK_VERSION};

/// `encode` writes only `[A-Za-z0-9_-]` and `%XX`, and `decode` undoes it.
fn round_trips(id: &str) {
    let stem = encode(id);
    assert!(
        stem.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'%')),
        "{stem:?} is not a safe file name"
    );
    assert_eq!(decode(&stem).as_deref(), Some(id), "{stem:?}");
}

fuzz_target!(|data: &[u8]| {
    let (name, body) = match data.iter().position(|b| *b == b'\n') {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[][..]),
    };
    let Ok(stem) = std::str::from_utf8(name) else {
        return;
    };
    round_trips(stem);
    let mut ids = vec![stem.to_owned()];
    if let Some(id) = decode(stem) {
        round_trips(&id);
        ids.push(id);
    }
    for id in ids {
        let Ok(mark) = parse(&id, body) else {
            continue;
        };
        assert_eq!(mark.volume_id, id);
        assert_eq!(mark.version, MARK_VERSION);
        let written = render(&mark).expect("a parsed mark renders");
        assert_eq!(parse(&id, &written).ok().as_ref(), Some(&mark));
    }
});
