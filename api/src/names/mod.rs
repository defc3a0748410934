//! Names the storage host uses, checked without touching the host: ZFS
//! dataset and snapshot names ([`zfs`]) and LVM VG/LV names and UUIDs
//! ([`lvm`]), and the digest that derived names end with ([`fnv1a`]).
//! `pillar-csi-host` (`sys::zfs`, `sys::lvm`) re-exports them.

pub mod lvm;
pub mod zfs;

/// The FNV-1a offset basis: [`fnv1a`]'s starting value.
pub const FNV1A_BASIS: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a, 64 bits, from `seed` ([`FNV1A_BASIS`] for the standard one):
/// a digest that is the same in every release, for names derived from
/// other names (they are durable). Not a security boundary: whoever relies
/// on a derived name being unique compares the full name it came from.
///
/// ```
/// assert_eq!(api::names::fnv1a(api::names::FNV1A_BASIS, b"a"), 0xaf63dc4c8601ec8c);
/// ```
pub fn fnv1a(seed: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(seed, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
