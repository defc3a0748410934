//! Volume handles: any input is parsed or refused without a panic, and a
//! parsed handle writes back as the same text and parses to the same value.
#![no_main]
use api::handle::{AgentVolumeId, VolumeHandle};
use api::tokens::Backend;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(handle) = VolumeHandle::parse(text) {
        let written = handle.to_string();
        assert_eq!(written, text, "a handle must write back as it was read");
        assert_eq!(VolumeHandle::parse(&written).ok().as_ref(), Some(&handle));
    }
    for backend in [Backend::ZfsZvol, Backend::LvmLv] {
        if let Ok(id) = AgentVolumeId::parse(backend, text) {
            assert_eq!(id.backend(), backend);
            assert_eq!(
                AgentVolumeId::parse(backend, &id.to_string()).ok().as_ref(),
                Some(&id)
            );
        }
    }
});
