//! Test-only named crash points.
//!
//! With the cargo feature `crash-points` (off by default, never in a
//! release image), `PILLAR_CRASH_POINT=<name>` is read once at start; when
//! the agent reaches [`point`] of that name it logs `crash point <name>
//! reached` on stderr and stops the calling task for good, holding whatever
//! it holds (the volume's lock, the reply not sent), so a test can `kill -9`
//! the process exactly there. Without the feature [`point`] is empty.
//!
//! Names are `<operation>-<step>`; today: `transfer-after-rename` (the
//! recovery mark is renamed into place, the reply not sent). Growing this
//! into a crash point for every step of every mutation (issue #15) means
//! adding calls, not machinery: one call per step, a name per call.

/// The environment variable naming the crash point to stop at.
pub const ENV: &str = "PILLAR_CRASH_POINT";

#[cfg(feature = "crash-points")]
fn armed() -> Option<&'static str> {
    static ARMED: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    ARMED
        .get_or_init(|| std::env::var(ENV).ok().filter(|n| !n.is_empty()))
        .as_deref()
}

/// Reads the armed crash point now (at start), so a later change of the
/// environment has no effect.
pub fn arm() {
    #[cfg(feature = "crash-points")]
    if let Some(name) = armed() {
        eprintln!("crash point {name} armed");
    }
}

/// Stops here for good when `name` is the armed crash point.
#[cfg(feature = "crash-points")]
pub fn point(name: &str) {
    if armed() == Some(name) {
        eprintln!("crash point {name} reached");
        loop {
            std::thread::park();
        }
    }
}

/// Does nothing: the agent was built without `crash-points`.
#[cfg(not(feature = "crash-points"))]
#[inline(always)]
pub fn point(_name: &str) {}
