//! An active LV's identity read from the kernel's device-mapper entries in
//! sysfs (`/sys/block/dm-N/dm/{name,uuid}`, `/sys/block/dm-N/size`): the
//! kernel's view, at the cost of a few small reads instead of an LVM report.
use api::names::lvm::{LvName, LvmUuid, VgName};
use std::{
    fs,
    path::{Path, PathBuf},
};

/// The device-mapper name LVM gives an LV: `<vg>-<lv>` with each hyphen
/// inside the names doubled.
pub(crate) fn dm_name(vg: &VgName, lv: &LvName) -> String {
    format!(
        "{}-{}",
        vg.as_str().replace('-', "--"),
        lv.as_str().replace('-', "--")
    )
}

/// An LVM UUID from its 32 raw characters, in LVM's printed 6-4-4-4-4-4-6 form.
pub(crate) fn uuid_from_raw(raw: &str) -> Option<LvmUuid> {
    if raw.len() != 32 || !raw.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return None;
    }
    let mut out = String::with_capacity(38);
    for (i, group) in [6, 4, 4, 4, 4, 4, 6]
        .iter()
        .scan(0, |at, len| {
            let g = &raw[*at..*at + len];
            *at += len;
            Some(g)
        })
        .enumerate()
    {
        if i > 0 {
            out.push('-');
        }
        out.push_str(group);
    }
    LvmUuid::new(&out).ok()
}

/// What the kernel shows of an active LV.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Active {
    pub vg_uuid: LvmUuid,
    pub uuid: LvmUuid,
    pub size: u64,
}

/// Parses a device-mapper UUID of a top-level LV: `LVM-` then the VG's and
/// the LV's 32 raw characters, with no layer suffix (`-real`, `-pool`, ...).
pub(crate) fn parse_dm_uuid(dm_uuid: &str) -> Option<(LvmUuid, LvmUuid)> {
    let raw = dm_uuid.trim().strip_prefix("LVM-")?;
    if raw.len() != 64 {
        return None;
    }
    Some((uuid_from_raw(&raw[..32])?, uuid_from_raw(&raw[32..])?))
}

/// The folder under `sys_block` of the device-mapper device named `name`.
fn find(sys_block: &Path, name: &str) -> Option<PathBuf> {
    fs::read_dir(sys_block).ok()?.flatten().find_map(|entry| {
        if !entry.file_name().to_string_lossy().starts_with("dm-") {
            return None;
        }
        let dir = entry.path();
        let found = fs::read_to_string(dir.join("dm/name")).unwrap_or_default();
        (found.trim_end() == name).then_some(dir)
    })
}

/// Finds the active LV `vg/lv` among the device-mapper devices under
/// `sys_block` (normally `/sys/block`); `None` when it is not active or
/// sysfs cannot be read.
pub(crate) fn active(sys_block: &Path, vg: &VgName, lv: &LvName) -> Option<Active> {
    let dir = find(sys_block, &dm_name(vg, lv))?;
    let (vg_uuid, uuid) = parse_dm_uuid(&fs::read_to_string(dir.join("dm/uuid")).ok()?)?;
    let sectors: u64 = fs::read_to_string(dir.join("size"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Active {
        vg_uuid,
        uuid,
        size: sectors * 512,
    })
}

/// Whether the kernel shows `vg/pool` as an active thin pool: LVM maps a
/// thin pool's data and metadata through a `<vg>-<pool>-tpool` device (a
/// layer name, which no LV's own name can produce: hyphens in names are
/// doubled) whose UUID is the pool's with the `-tpool` suffix. `false`
/// when there is none (the pool is not active) or sysfs cannot be read.
pub(crate) fn active_thin_pool(sys_block: &Path, vg: &VgName, pool: &LvName) -> bool {
    let Some(dir) = find(sys_block, &format!("{}-tpool", dm_name(vg, pool))) else {
        return false;
    };
    fs::read_to_string(dir.join("dm/uuid")).is_ok_and(|u| {
        u.trim()
            .strip_suffix("-tpool")
            .is_some_and(|lv| parse_dm_uuid(lv).is_some())
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn dm_names_double_hyphens() {
        let vg = VgName::new("data-vg").unwrap();
        let lv = LvName::new("pvc-1").unwrap();
        assert_eq!(dm_name(&vg, &lv), "data--vg-pvc--1");
    }

    #[test]
    fn dm_uuids_split_into_vg_and_lv_uuids() {
        let vg_raw = "Bpxmgtabcdefghijklmnopqrstuvw012";
        let lv_raw = "7PfhgYxJRYsfrwhcr0Z1KJQmEr26wILP";
        let raw = format!("LVM-{vg_raw}{lv_raw}");
        let (vg, lv) = parse_dm_uuid(&raw).unwrap();
        assert_eq!(vg.as_str(), "Bpxmgt-abcd-efgh-ijkl-mnop-qrst-uvw012");
        assert_eq!(lv.as_str(), "7PfhgY-xJRY-sfrw-hcr0-Z1KJ-QmEr-26wILP");
        // Layered devices (a thin pool's -tpool, an origin's -real) are not the LV.
        assert_eq!(parse_dm_uuid(&format!("{raw}-real")), None);
        assert_eq!(parse_dm_uuid("CRYPT-LUKS2-abc"), None);
    }

    #[test]
    fn an_active_lv_is_found_in_a_sysfs_tree() {
        let root = std::env::temp_dir().join(format!("sys-lvm-dm-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        for (dev, name, uuid, size) in [
            (
                "dm-0",
                "labvg-thin0_tmeta",
                "LVM-abcdefghijklmnopqrstuvwxyz012345ABCDEFGHIJKLMNOPQRSTUVWXYZ012345-tmeta",
                "8192",
            ),
            (
                "dm-1",
                "labvg-thin0-tpool",
                "LVM-abcdefghijklmnopqrstuvwxyz012345ABCDEFGHIJKLMNOPQRSTUVWXYZ0000aa-tpool",
                "8192",
            ),
            (
                "dm-2",
                "labvg-thin1--tpool",
                "LVM-abcdefghijklmnopqrstuvwxyz012345ABCDEFGHIJKLMNOPQRSTUVWXYZ0000bb",
                "8192",
            ),
            (
                "dm-3",
                "labvg-pvc--1",
                "LVM-abcdefghijklmnopqrstuvwxyz012345ABCDEFGHIJKLMNOPQRSTUVWXYZ6789ab",
                "16384",
            ),
        ] {
            let d = root.join(dev);
            fs::create_dir_all(d.join("dm")).unwrap();
            fs::write(d.join("dm/name"), format!("{name}\n")).unwrap();
            fs::write(d.join("dm/uuid"), format!("{uuid}\n")).unwrap();
            fs::write(d.join("size"), format!("{size}\n")).unwrap();
        }
        fs::create_dir_all(root.join("loop0")).unwrap();
        let vg = VgName::new("labvg").unwrap();
        let found = active(&root, &vg, &LvName::new("pvc-1").unwrap()).unwrap();
        assert_eq!(found.size, 16384 * 512);
        assert_eq!(
            found.uuid.as_str(),
            "ABCDEF-GHIJ-KLMN-OPQR-STUV-WXYZ-6789ab"
        );
        assert_eq!(
            found.vg_uuid.as_str(),
            "abcdef-ghij-klmn-opqr-stuv-wxyz-012345"
        );
        assert_eq!(active(&root, &vg, &LvName::new("pvc").unwrap()), None);
        // A pool's -tpool layer; not an LV named thin1-tpool, nor an LV itself.
        let pool = |name: &str| active_thin_pool(&root, &vg, &LvName::new(name).unwrap());
        assert!(pool("thin0"));
        assert!(!pool("thin1"));
        assert!(!pool("pvc-1"));
        assert!(!pool("thin1-tpool"));
        fs::remove_dir_all(&root).unwrap();
    }
}
