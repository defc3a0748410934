//! Every name checker: any input is accepted or refused without a panic,
//! and an accepted name is a single safe path component where one is
//! needed (no `/`, NUL, `.` or `..`), and is accepted again as it reads back.
#![no_main]
use libfuzzer_sys::fuzz_target;

/// A name that is safe as one configfs folder or file name.
fn one_component(name: &str) {
    assert!(!name.is_empty(), "empty component accepted");
    assert!(!name.contains('/'), "{name:?} would escape its folder");
    assert!(!name.contains('\0'), "{name:?} holds NUL");
    assert!(
        name != "." && name != "..",
        "{name:?} names a folder itself"
    );
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(c) = configfs::Component::new(text, 255) {
        one_component(c.as_str());
        assert_eq!(c.as_str(), text);
    }
    if let Ok(nqn) = nvmet::Nqn::new(text) {
        one_component(nqn.as_str());
        assert_eq!(nvmet::Nqn::new(nqn.as_str()).ok().as_ref(), Some(&nqn));
    }
    if let Ok(iqn) = lio::Iqn::new(text) {
        one_component(iqn.as_str());
        assert_eq!(lio::Iqn::new(iqn.as_str()).ok().as_ref(), Some(&iqn));
    }
    if let Ok(ds) = api::names::zfs::DatasetName::new(text) {
        assert!(!ds.as_str().contains('@') && !ds.as_str().contains('#'));
        for part in ds.as_str().split('/') {
            one_component(part);
        }
        assert_eq!(
            api::names::zfs::DatasetName::new(ds.as_str()).ok().as_ref(),
            Some(&ds)
        );
    }
    if let Ok(snap) = api::names::zfs::SnapshotName::new(text) {
        assert_eq!(
            format!("{}@{}", snap.dataset().as_str(), snap.snapshot()),
            snap.as_str()
        );
    }
    if let Ok(vg) = api::names::lvm::VgName::new(text) {
        one_component(vg.as_str());
    }
    if let Ok(lv) = api::names::lvm::LvName::new(text) {
        one_component(lv.as_str());
    }
    if let Ok(uuid) = api::names::lvm::LvmUuid::new(text) {
        assert_eq!(uuid.as_str().len(), 38);
    }
});
