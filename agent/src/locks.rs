//! One lock per volume ID, so requests for one volume run one at a time and
//! requests for different volumes run side by side.
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

/// The lock table.
#[derive(Debug, Default)]
pub struct VolumeLocks {
    table: Mutex<HashMap<String, Arc<AsyncMutex<()>>>>,
}

impl VolumeLocks {
    /// Waits for and takes the lock of `volume_id`.
    pub async fn lock(&self, volume_id: &str) -> OwnedMutexGuard<()> {
        let entry = {
            let mut table = self
                .table
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            // Forget locks nobody holds or waits for, so the table stays small.
            table.retain(|_, l| Arc::strong_count(l) > 1);
            table.entry(volume_id.to_owned()).or_default().clone()
        };
        entry.lock_owned().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn same_volume_waits_other_volume_does_not() {
        let locks = Arc::new(VolumeLocks::default());
        let held = locks.lock("tank/a").await;
        let other = tokio::time::timeout(Duration::from_millis(100), locks.lock("tank/b")).await;
        assert!(other.is_ok(), "another volume is not blocked");
        let same = tokio::time::timeout(Duration::from_millis(100), locks.lock("tank/a")).await;
        assert!(same.is_err(), "the same volume waits");
        drop(held);
        assert!(
            tokio::time::timeout(Duration::from_millis(100), locks.lock("tank/a"))
                .await
                .is_ok()
        );
    }
}
