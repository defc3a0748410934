//! Safe, synchronous wrappers over the storage host, for the pillar-csi agent
//! and any other Rust storage tool.
//!
//! - [`zfs`]: zvols, snapshots, clones, properties and pool capacity through
//!   libzfs_core and libzfs (no `zfs`/`zpool` process).
//! - [`zfs`] also makes, mounts and bounds filesystems (`refquota`).
//! - [`lvm`]: LVM through liblvm2cmd, in-process, on one worker thread.
//! - [`quota`]: project quotas on XFS and ext4 (a directory's project, a
//!   project's limit and usage).
//! - [`nfsd`]: flushing the kernel NFS server's caches of exports and
//!   clients.
//! - [`udev`]: waiting for a device node that udev creates.
//! - [`blkid`]: a read-only filesystem and partition-table signature probe
//!   through libblkid.
//! - [`fsgrow`]: growing a mounted ext4 or XFS filesystem online through
//!   the kernel's resize ioctls.
//! - [`block`]: a block device's identity, size and partitions, and who uses
//!   it (mounts, device-mapper holders, an exclusive-open probe, LIO and
//!   nvmet exports).
//!
//! Typed values in, typed values and typed errors (naming the object and the
//! cause) out; no async runtime in the API. `unsafe` code lives only in the
//! FFI modules, every block with a `SAFETY` comment.
//!
//! # Host
//!
//! Built against libzfs and libzfs_core of OpenZFS 2.2 or later (through
//! `pillar-csi-zfs-sys`), liblvm2cmd (through `pillar-csi-lvm-sys`),
//! libudev and libblkid: on Debian, `libzfslinux-dev liblvm2-dev
//! libudev-dev libblkid-dev pkg-config libclang-dev`. At run time: the zfs
//! module of the same release as the userland ([`zfs::Zfs::open`] checks),
//! udev, and root for most calls. The package is `pillar-csi-host`; the
//! crate is `sys`.
//!
//! ```no_run
//! use sys::{block::Host, zfs::{DatasetName, Zfs, ZvolSpec}};
//! use std::time::Duration;
//!
//! let zfs = Zfs::open()?;
//! let name = DatasetName::below_pool("tank/vol1")?;
//! zfs.create_zvol(&ZvolSpec::new(name.clone(), 64 << 20))?;
//! let dev = zfs.wait_device(&name, Duration::from_secs(10))?;
//! println!("idle: {}", Host::default().usage(&dev)?.is_idle());
//! zfs.destroy(&name)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! A fuller walk-through (a zvol and a thin LV, who uses a device) is
//! `examples/sys_volumes.rs`.

pub mod blkid;
pub mod block;
pub mod fsgrow;
pub mod lvm;
pub mod nfsd;
pub mod quota;
pub mod udev;
pub mod zfs;
