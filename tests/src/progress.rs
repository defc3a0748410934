//! A writer's progress, counted by the writer and awaited by the test that
//! breaks something under it (the storage side's reboots).
use crate::Result;
use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

/// Waits until `acked` (the records a writer has acknowledged) reaches
/// `at_least`; an error naming both counts after `bound`.
pub async fn wait_for(acked: &AtomicU64, at_least: u64, bound: Duration) -> Result<()> {
    let start = Instant::now();
    while acked.load(Ordering::SeqCst) < at_least {
        if start.elapsed() > bound {
            return Err(format!(
                "the writer acknowledged {} records, waited for {at_least} during {bound:?}",
                acked.load(Ordering::SeqCst)
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}
