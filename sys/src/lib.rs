//! Safe, synchronous wrappers over the storage host, for the pillar-csi agent
//! and any other Rust storage tool.
//!
//! - [`zfs`]: zvols, snapshots, clones, properties and pool capacity through
//!   libzfs_core and libzfs (no `zfs`/`zpool` process).
//! - [`lvm`]: LVM through liblvm2cmd, in-process, on one worker thread.
//! - [`udev`]: waiting for a device node that udev creates.
//! - [`block`]: a block device's identity, size and partitions, and who uses
//!   it (mounts, device-mapper holders, an exclusive-open probe, LIO and
//!   nvmet exports).
//!
//! Typed values in, typed values and typed errors (naming the object and the
//! cause) out; no async runtime in the API. `unsafe` code lives only in the
//! FFI modules, every block with a `SAFETY` comment.

pub mod block;
pub mod lvm;
pub mod udev;
pub mod zfs;
