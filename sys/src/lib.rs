//! Safe, synchronous wrappers over the storage host.
//!
//! Typed values in, typed values and typed errors out; no storage CLI is run
//! as a process. Modules:
//!
//! - [`lvm`]: LVM through liblvm2cmd, in-process, on one worker thread.

pub mod lvm;
