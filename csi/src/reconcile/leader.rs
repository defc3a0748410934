//! Leader election through a `coordination.k8s.io/v1` Lease, in the manner
//! of client-go's leaderelection: the holder renews `spec.renewTime` every
//! `retry` period; another candidate takes the Lease once it has seen the
//! same holder and renew time unchanged for a whole `leaseDurationSeconds`
//! (measured on its own clock, so clock skew between replicas does not
//! matter). Every write carries the Lease's resourceVersion, so two
//! candidates racing for it cannot both win. A leader that cannot renew
//! within the lease duration stops leading; one that stops cleanly
//! releases the Lease (empty holder) so another takes over at once.
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Where and as whom to run for leader.
#[derive(Clone, Debug)]
pub struct Election {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub name: String,
    /// This candidate's identity (the pod name).
    pub identity: String,
    /// How long a Lease not renewed stays its holder's.
    pub lease_duration: Duration,
}

impl Election {
    /// How often the Lease is tried or renewed: a fifth of its duration
    /// (at least 200 ms), so a renewal survives a few failed attempts.
    pub fn retry(&self) -> Duration {
        (self.lease_duration / 5).max(Duration::from_millis(200))
    }

    fn fresh(&self, mut lease: Lease, transitions: i32) -> Lease {
        let now = MicroTime(Timestamp::now());
        let secs = i32::try_from(self.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX);
        lease.spec = Some(LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(secs),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_transitions: Some(transitions),
            ..Default::default()
        });
        lease
    }

    /// Runs for leader until `stop` turns true or its sender is dropped,
    /// publishing whether this candidate leads on `leading`; on stopping
    /// it releases a Lease it holds.
    pub async fn run(
        self,
        client: kube::Client,
        leading: watch::Sender<bool>,
        mut stop: watch::Receiver<bool>,
    ) {
        let api: Api<Lease> = Api::namespaced(client, &self.namespace);
        let mut observed: Option<(String, Instant)> = None;
        let mut renewed: Option<Instant> = None;
        loop {
            match self.attempt(&api, &mut observed).await {
                Ok(true) => {
                    renewed = Some(Instant::now());
                    if !*leading.borrow() {
                        tracing::info!(identity = %self.identity, lease = %self.name, "leading");
                    }
                    leading.send_replace(true);
                }
                Ok(false) => {
                    renewed = None;
                    leading.send_replace(false);
                }
                Err(e) => {
                    tracing::warn!(lease = %self.name, error = %super::with_causes(&e), "leader election");
                    if renewed.is_none_or(|t| t.elapsed() >= self.lease_duration) {
                        leading.send_replace(false);
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(self.retry()) => {}
                _ = stop.changed() => {}
            }
            if stop.has_changed().is_err() || *stop.borrow() {
                break;
            }
        }
        if *leading.borrow() {
            leading.send_replace(false);
            if let Err(e) = self.release(&api).await {
                tracing::warn!(lease = %self.name, error = %super::with_causes(&e), "release the Lease");
            }
        }
    }

    /// One try: create, renew or take the Lease; whether this candidate holds it.
    async fn attempt(
        &self,
        api: &Api<Lease>,
        observed: &mut Option<(String, Instant)>,
    ) -> Result<bool, kube::Error> {
        let Some(lease) = api.get_opt(&self.name).await? else {
            let new = self.fresh(
                Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        namespace: Some(self.namespace.clone()),
                        ..Default::default()
                    },
                    spec: None,
                },
                0,
            );
            return conflict_is_false(api.create(&PostParams::default(), &new).await);
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        if holder == self.identity {
            let mut renewed = lease;
            if let Some(s) = renewed.spec.as_mut() {
                s.renew_time = Some(MicroTime(Timestamp::now()));
                s.lease_duration_seconds =
                    Some(i32::try_from(self.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX));
            }
            return conflict_is_false(
                api.replace(&self.name, &PostParams::default(), &renewed)
                    .await,
            );
        }
        let key = format!("{holder}@{:?}", spec.renew_time.as_ref().map(|t| t.0));
        let seen = match observed {
            Some((k, at)) if *k == key => *at,
            _ => {
                let now = Instant::now();
                *observed = Some((key, now));
                now
            }
        };
        let duration = spec
            .lease_duration_seconds
            .and_then(|s| u64::try_from(s).ok())
            .map(Duration::from_secs)
            .unwrap_or(self.lease_duration);
        if !holder.is_empty() && seen.elapsed() < duration {
            return Ok(false);
        }
        let transitions = spec.lease_transitions.unwrap_or(0) + 1;
        let taken = self.fresh(lease, transitions);
        conflict_is_false(
            api.replace(&self.name, &PostParams::default(), &taken)
                .await,
        )
    }

    /// Gives the Lease up: no holder, so the next candidate takes it at once.
    async fn release(&self, api: &Api<Lease>) -> Result<(), kube::Error> {
        let Some(mut lease) = api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let Some(spec) = lease.spec.as_mut() else {
            return Ok(());
        };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        conflict_is_false(
            api.replace(&self.name, &PostParams::default(), &lease)
                .await,
        )
        .map(|_| ())
    }
}

/// A write's outcome: done (true), lost a race (false, 409), or failed.
fn conflict_is_false(result: Result<Lease, kube::Error>) -> Result<bool, kube::Error> {
    match result {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}
