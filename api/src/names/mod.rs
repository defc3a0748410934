//! Names the storage host uses, checked without touching the host: ZFS
//! dataset and snapshot names ([`zfs`]) and LVM VG/LV names and UUIDs
//! ([`lvm`]). `pillar-csi-host` (`sys::zfs`, `sys::lvm`) re-exports them.

pub mod lvm;
pub mod zfs;
