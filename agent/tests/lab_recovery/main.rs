//! Metadata-loss recovery in the kernel lab (spec: adopt-lvm-lv.md,
//! "Recover after metadata loss"). The `pillar-csi agent` binary runs with
//! mTLS and `--recovery-trust-anchor`; an LV with data is adopted and
//! exported under an "old" lifecycle whose Kubernetes records are then
//! considered lost (the mark survives). The procedure test takes the
//! operator's steps through the independent JSON client
//! (`tests/lab/agent_json.py`, grpcurl's flags and JSON) and checks the
//! operator's CLI against it on the same agent (`pillar-csi recovery
//! inspect|verify`, `rebind-check`); the grant is signed by `pillar-csi
//! recovery sign`, and TransferVolumeOwnership is called as the controller
//! calls it (the bytes of the annotation and of `spec.recovery.authorization`).
//!
//! | module | tests |
//! | --- | --- |
//! | `setup.rs` | the shared adopted LV, agent and operator steps |
//! | `procedure.rs` | the spec's procedure; the CLI against the real agent |
//! | `refusals.rs` | every transfer refusal from its real cause |
//! | `start.rs` | start-up refusals, the plaintext agent, kill -9 after the rename |
//!
//! Run with `tests/lab/run tests -- recovery_`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../common/mod.rs"]
mod common;
mod procedure;
mod refusals;
mod setup;
mod start;
