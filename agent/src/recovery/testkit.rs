//! The fixtures' recovery keys (`testdata/`), shared by the rule tests here
//! and the service's transfer tests: the operator's EC key pair in the
//! trust anchor, and the server certificate `storage-1` that signs
//! snapshots.
use super::{PrivateSigner, Recovery};
use std::path::{Path, PathBuf};

const TESTDATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src/recovery/testdata");

/// The path of the fixture `name`.
pub(crate) fn data(name: &str) -> PathBuf {
    Path::new(TESTDATA).join(name)
}

/// The bytes of the fixture `name`.
pub(crate) fn read(name: &str) -> Vec<u8> {
    std::fs::read(data(name)).expect("testdata")
}

/// Recovery as an agent started with `--recovery-trust-anchor
/// operator-ec.pub` and the server identity `server.crt`/`server.key` has it.
pub(crate) fn recovery() -> Recovery {
    Recovery::load(
        &data("operator-ec.pub"),
        &data("server.crt"),
        &data("server.key"),
    )
    .expect("recovery")
}

/// The operator key the trust anchor of [`recovery`] holds.
pub(crate) fn operator() -> PrivateSigner {
    PrivateSigner::from_pem(&read("operator-ec.key")).expect("operator key")
}
