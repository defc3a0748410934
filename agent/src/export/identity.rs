//! The identity an export shows initiators, the same on every export of a
//! volume: after a storage node's reboot (configfs emptied) the agent makes
//! the export again with it, and a host that reconnects finds the
//! namespace or LUN it had. The kernel's own values are random per
//! creation, and a host drops a namespace whose identifiers changed (and a
//! node plugin refuses a disk whose identity is not the one it staged).
//! Derived from the export's target name (subsystem NQN or target IQN),
//! which names the volume.

/// The identifiers of one export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StableIdentity {
    /// A UUID (RFC 9562 layout, version 8): an NVMe namespace's
    /// `device_uuid`, a LIO storage object's `vpd_unit_serial`.
    pub uuid: String,
    /// An NVMe namespace's `device_nguid`.
    pub nguid: String,
    /// An NVMe subsystem's `attr_serial` (20 hexadecimal digits).
    pub serial: String,
}

impl StableIdentity {
    /// The identity of the export named `target` (an NQN or IQN).
    pub fn of(target: &str) -> Self {
        let digest = |what: &str| {
            let text = format!("pillar-csi export {what} {target}");
            let d = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
            let mut bytes = [0u8; 16];
            bytes.copy_from_slice(&d.as_ref()[..16]);
            bytes
        };
        let mut uuid = digest("uuid");
        uuid[6] = (uuid[6] & 0x0f) | 0x80;
        uuid[8] = (uuid[8] & 0x3f) | 0x80;
        Self {
            uuid: dashed(uuid),
            nguid: dashed(digest("nguid")),
            serial: hex(&digest("serial")[..10]),
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn dashed(bytes: [u8; 16]) -> String {
    let h = hex(&bytes);
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_volume_s_identity_is_the_same_on_every_export_and_its_own() {
        let a = StableIdentity::of("nqn.2026-01.com.bhyoo.pillar-csi:tank.pvc-a");
        assert_eq!(
            a,
            StableIdentity::of("nqn.2026-01.com.bhyoo.pillar-csi:tank.pvc-a")
        );
        let b = StableIdentity::of("nqn.2026-01.com.bhyoo.pillar-csi:tank.pvc-b");
        assert!(a.uuid != b.uuid && a.nguid != b.nguid && a.serial != b.serial);
        assert_ne!(a.uuid, a.nguid);
        assert_eq!(a.uuid.len(), 36);
        assert_eq!(&a.uuid[14..15], "8", "version 8: {}", a.uuid);
        assert!("89ab".contains(&a.uuid[19..20]), "variant: {}", a.uuid);
        assert_eq!(a.serial.len(), 20);
        assert!(a.serial.bytes().all(|c| c.is_ascii_hexdigit()));
    }
}
