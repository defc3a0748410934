//! Safe, synchronous wrappers over the storage host.
//!
//! - [`block`]: a block device's identity, size and partitions, and who uses
//!   it (mounts, device-mapper holders, an exclusive-open probe, LIO and
//!   nvmet exports).

pub mod block;
