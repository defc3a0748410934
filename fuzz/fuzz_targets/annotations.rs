//! The PVC annotation parsers: any value is parsed or refused without a
//! panic; a refusal names the annotation; an accepted import names a volume
//! the name rules accept.
#![no_main]
use api::annotations::{parse_import_lv, parse_import_lv_policy, parse_import_zvol};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match parse_import_zvol(text) {
        Ok(ds) => assert!(api::names::zfs::DatasetName::new(ds.as_str()).is_ok()),
        Err(e) => assert!(e.to_string().contains("import-zvol"), "{e}"),
    }
    match parse_import_lv(text) {
        Ok(id) => {
            assert!(api::names::lvm::VgName::new(id.vg.as_str()).is_ok());
            assert!(api::names::lvm::LvName::new(id.lv.as_str()).is_ok());
        }
        Err(e) => assert!(e.to_string().contains("import-lv"), "{e}"),
    }
    if let Err(e) = parse_import_lv_policy(Some(text)) {
        assert!(e.to_string().contains("import-lv-policy"), "{e}");
    }
});
