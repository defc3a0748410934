//! Whether two paths an object names, such as a namespace's `device_path`
//! or a storage object's `udev_path`, are the same device.
use std::{
    fs,
    os::unix::fs::{FileTypeExt, MetadataExt},
    path::Path,
};

/// Whether `a` and `b` name the same device: the same path, or two paths
/// (a udev link such as `/dev/zvol/tank/pvc-1` and the kernel's node
/// `/dev/zd16`) that lead to device files of the same kind with the same
/// device number. A path that does not lead to a device is only itself.
pub fn same_device(a: &Path, b: &Path) -> bool {
    if a == b {
        return true;
    }
    if a.as_os_str().is_empty() || b.as_os_str().is_empty() {
        return false;
    }
    let number = |p: &Path| {
        let m = fs::metadata(p).ok()?;
        let kind = m.file_type();
        (kind.is_block_device() || kind.is_char_device())
            .then(|| (kind.is_block_device(), m.rdev()))
    };
    number(a).is_some_and(|x| number(b) == Some(x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_and_its_device_are_the_same_other_devices_and_files_are_not() -> std::io::Result<()> {
        let dir = std::env::temp_dir().join(format!("same-device-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir)?;
        let link = dir.join("null-link");
        std::os::unix::fs::symlink("/dev/null", &link)?;
        let file = dir.join("file");
        fs::write(&file, b"")?;
        let null = Path::new("/dev/null");
        assert!(same_device(&link, null));
        assert!(same_device(null, &link));
        assert!(!same_device(null, Path::new("/dev/zero")));
        assert!(!same_device(&file, &dir.join("file-link")));
        assert!(same_device(&file, &file), "the same path");
        assert!(!same_device(&dir.join("gone"), &dir.join("gone-too")));
        assert!(
            !same_device(Path::new(""), null),
            "a namespace not configured yet"
        );
        fs::remove_dir_all(&dir)
    }
}
