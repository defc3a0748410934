//! Safe, synchronous wrappers over the storage host, for the pillar-csi agent
//! and any other Rust storage tool.
//!
//! - [`zfs`]: zvols, snapshots, clones, properties and pool capacity through
//!   libzfs_core and libzfs (no `zfs`/`zpool` process).
//! - [`udev`]: waiting for a device node that udev creates.
//!
//! Typed values in, typed values and typed errors (naming the object and the
//! cause) out; no async runtime in the API. `unsafe` code lives only in the
//! FFI module `zfs::ffi`, every block with a `SAFETY` comment.

pub mod udev;
pub mod zfs;
