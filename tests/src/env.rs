//! What the lab runner prepared, read from `PILLAR_LAB_*` variables.
use std::path::PathBuf;

/// The lab's prepared resources.
#[derive(Debug, Clone)]
pub struct Lab {
    /// The file-backed zpool (`PILLAR_LAB_POOL`).
    pub pool: String,
    /// The volume group on a loop device (`PILLAR_LAB_VG`).
    pub vg: String,
    /// The thin pool in that VG (`PILLAR_LAB_THINPOOL`).
    pub thin_pool: String,
    /// A folder shared with the host, fresh for this run (`PILLAR_LAB_WORK`).
    pub work: PathBuf,
}

impl Lab {
    /// The lab's resources; panics with a clear message outside the lab, so an
    /// ignored test run by hand on a normal machine says why it cannot run.
    pub fn get() -> Self {
        let var = |name: &str| {
            std::env::var(name).unwrap_or_else(|_| {
                panic!("{name} is not set: this test needs the kernel lab (run `make lab`)")
            })
        };
        Self {
            pool: var("PILLAR_LAB_POOL"),
            vg: var("PILLAR_LAB_VG"),
            thin_pool: var("PILLAR_LAB_THINPOOL"),
            work: var("PILLAR_LAB_WORK").into(),
        }
    }

    /// A name unique to this test process and call, for objects a test creates.
    pub fn unique(&self, prefix: &str) -> String {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        format!(
            "{prefix}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        )
    }
}
