//! Leader election on a `coordination.k8s.io/v1` Lease: several replicas
//! run, one writes.
//!
//! # Why not a crate
//! `kube-leader-election` 0.44 requires kube 4. `kube-lease-manager` 0.13
//! supports kube 5, but a holder that cannot renew keeps reporting itself
//! leader until it next reads the Lease successfully (there is no renew
//! deadline), and its renewals and forced releases are patches without a
//! `resourceVersion` precondition, so a replica acting on a stale view can
//! knock out a fresh holder. "Only the leader writes" needs both guarantees,
//! so this module is a small loop with client-go's semantics instead.
//!
//! # Semantics (client-go's `leaderelection`, Lease lock)
//! - Every attempt reads the Lease and writes it back with `replace`, which
//!   carries the `resourceVersion` read: two replicas racing for one Lease
//!   cannot both win (the loser gets 409 Conflict).
//! - Another holder's term is judged on *this* replica's monotonic clock:
//!   it ends `leaseDurationSeconds` after the moment this replica first saw
//!   the current version of the record. Wall clocks of different nodes are
//!   never compared, so clock skew cannot cause two leaders.
//! - The holder renews every `retry_period`. If no renewal succeeds for
//!   `renew_deadline` (counted from the *start* of the last successful
//!   attempt) it steps down on its own, before any other replica can
//!   consider the term over (`renew_deadline < lease_duration`).
//! - [`LeaderElector::release`] stops the loop, reports "not leader" first,
//!   then clears `holderIdentity`, so a successor takes over at once instead
//!   of waiting out the term. A renewal the stop cancelled after it was sent
//!   can land in between; the release then reads the Lease again.
//!
//! After a `kill -9` of the holder, another replica takes over at most
//! `lease_duration + retry_period` (plus one request) after the holder's
//! last renewal, which itself is at most `retry_period` before the kill.
//!
//! RBAC: `get`, `create`, `update` on `leases` in the Lease's namespace.

use std::time::{Duration, Instant};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use tokio::{
    sync::{oneshot, watch},
    task::JoinHandle,
};
use tracing::{debug, error, info, trace, warn};

use portwise_controller::metrics::Metrics;

mod rules;

pub use rules::{Holding, LeaseAction, Timings, decide};

#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("invalid leader election timings {0}")]
    InvalidTimings(String),
    #[error("Lease request failed: {0}")]
    Kube(#[from] kube::Error),
    #[error("Lease request timed out")]
    Timeout,
    #[error("the Lease changed under each of {0} attempts to release it")]
    Contended(u32),
    #[error("leader election task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// A holder identity: `base` (the pod name), else the hostname, plus a
/// random suffix so a restarted pod with the same name is a new candidate
/// and never mistakes its predecessor's term for its own.
pub fn identity(base: Option<&str>) -> String {
    let base = base
        .map(str::trim)
        .filter(|b| !b.is_empty())
        .map(str::to_owned)
        .or_else(hostname)
        .unwrap_or_else(|| "portwise".to_owned());
    format!("{base}_{:08x}", random_u64() as u32)
}

/// [`identity`] from the hostname (the pod name in a cluster).
pub fn default_identity() -> String {
    identity(None)
}

fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
}

/// Randomness good enough for a suffix and jitter, without a dependency:
/// `RandomState` is keyed from the OS's random source.
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one((std::process::id(), std::time::SystemTime::now()))
}

fn jitter(max: Duration) -> Duration {
    if max.is_zero() {
        return Duration::ZERO;
    }
    let nanos = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(random_u64() % nanos)
}

/// Runs the election in the background and tells whether this replica leads.
///
/// Only write while [`LeaderElector::is_leader`] (or the watch from
/// [`LeaderElector::subscribe`]) says `true`; it turns `false` before any
/// other replica can take over. On shutdown: stop writing, then
/// [`LeaderElector::release`].
#[derive(Debug)]
pub struct LeaderElector {
    identity: String,
    leader: watch::Receiver<bool>,
    term: watch::Receiver<Option<Instant>>,
    /// See [`LeaderElector::expect_handover`].
    expecting: watch::Sender<bool>,
    mode: Mode,
}

/// How often an elector looks at the Lease while its holder is about to
/// hand it over ([`LeaderElector::expect_handover`]), instead of every
/// retry period: nobody writes between the holder's release and this
/// look, and the retry period (2 s with the default 15 s lease) was the
/// whole of a graceful move's gap (bench row 15).
const EXPECTING_LOOK: Duration = Duration::from_millis(100);

#[derive(Debug)]
enum Mode {
    /// `--leader-elect=false`: always leader.
    Standalone {
        _leader: watch::Sender<bool>,
        _term: watch::Sender<Option<Instant>>,
    },
    Elected {
        shutdown: Option<oneshot::Sender<()>>,
        task: Option<JoinHandle<Elector>>,
    },
}

impl LeaderElector {
    /// Starts competing for the Lease `namespace/name` as `identity` (make
    /// it with [`identity`] so it is unique per process start). The Lease is
    /// created if missing. Must be called within a Tokio runtime.
    pub fn start(
        client: Client,
        namespace: &str,
        name: &str,
        identity: &str,
        timings: Timings,
    ) -> Result<Self, LeaderError> {
        Self::start_seen(client, namespace, name, identity, timings, None)
    }

    /// [`LeaderElector::start`], counting another holder's term from when
    /// the caller first saw the record's current version (`seen`:
    /// `resourceVersion` and that instant) rather than from this elector's
    /// first read: a bucket's Lease whose holder died is taken when its
    /// term ends as the shard ring saw it, not a whole term later
    /// ([`super::shards`]).
    pub fn start_seen(
        client: Client,
        namespace: &str,
        name: &str,
        identity: &str,
        timings: Timings,
        seen: Option<(String, Instant)>,
    ) -> Result<Self, LeaderError> {
        timings.validate()?;
        let identity = identity.to_owned();
        let (tx, rx) = watch::channel(false);
        let (term_tx, term) = watch::channel(None);
        let (shutdown, shutdown_rx) = oneshot::channel();
        let (expecting, expecting_rx) = watch::channel(false);
        let elector = Elector {
            expecting: expecting_rx,
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
            identity: identity.clone(),
            timings,
            leader: tx,
            term: term_tx,
            observed: seen,
        };
        info!(lease = %format!("{namespace}/{name}"), %identity, "starting leader election");
        let task = tokio::spawn(elector.run(shutdown_rx));
        Ok(Self {
            identity,
            leader: rx,
            term,
            expecting,
            mode: Mode::Elected {
                shutdown: Some(shutdown),
                task: Some(task),
            },
        })
    }

    /// No election: this process always leads (single replica, tests).
    pub fn standalone(identity: &str) -> Self {
        let (tx, rx) = watch::channel(true);
        // A term without end: nobody else can lead.
        let (term_tx, term) = watch::channel(Some(
            Instant::now() + Duration::from_secs(100 * 365 * 86_400),
        ));
        Self {
            identity: identity.to_owned(),
            leader: rx,
            term,
            expecting: watch::channel(false).0,
            mode: Mode::Standalone {
                _leader: tx,
                _term: term_tx,
            },
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Whether this replica leads right now.
    pub fn is_leader(&self) -> bool {
        *self.leader.borrow()
    }

    /// A watch of "am I leader". After [`LeaderElector::release`] (or if the
    /// elector is dropped) it reads `false` and `changed()` returns an error.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.leader.clone()
    }

    /// A watch of the current term: `Some(until)` while this replica
    /// leads, where `until` is the instant its leadership ends at the
    /// latest, on this process's monotonic clock (the renew deadline,
    /// counted from the start of the last successful renewal; no other
    /// replica can take over before `until` plus the remaining
    /// `lease_duration - renew_deadline`). Writers check the clock against
    /// it, not only the flag of [`Self::subscribe`]: a process that was
    /// frozen (SIGSTOP, a stalled VM) wakes up with the flag still `true`
    /// but the term long over, and must not write before the election loop
    /// gets to run. `portwise_controller::Tenure` wraps it.
    pub fn subscribe_term(&self) -> watch::Receiver<Option<Instant>> {
        self.term.clone()
    }

    /// Whether the Lease's holder is about to release it to this replica
    /// (the shard ring says so once its member Lease reports the bucket
    /// warm). While it is, the Lease is looked at every 100 ms instead of
    /// every retry period, so the successor takes over within about that
    /// of the release: a few more GETs of one Lease for a moment.
    pub fn expect_handover(&self, expecting: bool) {
        self.expecting
            .send_if_modified(|e| std::mem::replace(e, expecting) != expecting);
    }

    /// Keeps `metrics`' `portwise_leader` gauge equal to [`Self::is_leader`]
    /// (in a background task that ends with the elector).
    pub fn track(&self, metrics: &Metrics) {
        let mut rx = self.subscribe();
        let metrics = metrics.clone();
        tokio::spawn(async move {
            loop {
                metrics.process.set_leader(*rx.borrow_and_update());
                if rx.changed().await.is_err() {
                    metrics.process.set_leader(false);
                    break;
                }
            }
        });
    }

    /// Stops competing: reports "not leader", then clears `holderIdentity`
    /// if this replica holds the Lease, so a successor need not wait out the
    /// term. Bounded by the renew deadline; a failure only means the
    /// successor waits for the term to end.
    pub async fn release(mut self) -> Result<(), LeaderError> {
        let Mode::Elected { shutdown, task } = &mut self.mode else {
            return Ok(());
        };
        if let Some(shutdown) = shutdown.take() {
            let _ = shutdown.send(());
        }
        let Some(task) = task.take() else {
            return Ok(());
        };
        let elector = task.await?;
        let deadline = elector.timings.renew_deadline;
        match tokio::time::timeout(deadline, elector.release()).await {
            Ok(result) => result,
            Err(_) => Err(LeaderError::Timeout),
        }
    }
}

impl Drop for LeaderElector {
    fn drop(&mut self) {
        if let Mode::Elected {
            task: Some(task), ..
        } = &self.mode
        {
            task.abort();
        }
    }
}

/// How many times a release reads the Lease again after a conflict. One
/// renewal can be in flight when the loop stops, so two reads do; more is
/// margin for writes by replicas that then lose (their writes carry a
/// resourceVersion and are refused).
const RELEASE_READS: u32 = 4;

enum Attempt {
    /// This replica holds the Lease, renewed just now.
    Held,
    /// Someone else holds it; look again after this long at the latest.
    NotHeld { retry_in: Duration },
}

#[derive(Debug)]
struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    timings: Timings,
    leader: watch::Sender<bool>,
    /// `Some(end of the term)` while leading; see [`LeaderElector::subscribe_term`].
    term: watch::Sender<Option<Instant>>,
    /// The record's `resourceVersion` and when this replica first saw it.
    observed: Option<(String, Instant)>,
    /// See [`LeaderElector::expect_handover`].
    expecting: watch::Receiver<bool>,
}

/// Returns once a hand-over is expected, if it was not (`before`) when the
/// pause was chosen; never if it was, or once the elector's handle is gone.
async fn handover_expected(mut expecting: watch::Receiver<bool>, before: bool) {
    if before {
        return std::future::pending().await;
    }
    loop {
        if *expecting.borrow_and_update() {
            return;
        }
        if expecting.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

impl Elector {
    async fn run(mut self, mut shutdown: oneshot::Receiver<()>) -> Self {
        let retry = self.timings.retry_period;
        let deadline = self.timings.renew_deadline;
        // Start of the last attempt that renewed or acquired; Some while leading.
        let mut renewed_at: Option<Instant> = None;
        loop {
            let started = Instant::now();
            // Read once per turn: the pause below and the wake-up after it
            // go by the same value, so a hint given meanwhile wakes it.
            let expecting = *self.expecting.borrow();
            if let Some(at) = renewed_at
                && started >= at + deadline
            {
                error!(identity = %self.identity, "could not renew the Lease within the renew deadline; stepping down");
                renewed_at = None;
                self.set_leader(None);
            }
            let budget = match renewed_at {
                Some(at) => (at + deadline).saturating_duration_since(started),
                None => deadline,
            };
            let attempt = tokio::select! {
                biased;
                _ = &mut shutdown => break,
                attempt = tokio::time::timeout(budget, self.try_acquire_or_renew()) => attempt,
            };
            let mut pause = retry;
            match attempt {
                Ok(Ok(Attempt::Held)) => {
                    if renewed_at.is_none() {
                        info!(identity = %self.identity, lease = %self.name, "acquired the Lease: leading");
                    }
                    renewed_at = Some(started);
                    self.set_leader(Some(started + deadline));
                }
                Ok(Ok(Attempt::NotHeld { retry_in })) => {
                    if renewed_at.take().is_some() {
                        warn!(identity = %self.identity, "the Lease has another holder: stepping down");
                    }
                    self.set_leader(None);
                    // Poll at the retry period (keeps the observation of the
                    // holder's renewals fresh), but wake exactly at the end of
                    // a term that ends sooner, and look often while the
                    // holder is about to hand the Lease over.
                    pause = if expecting {
                        retry_in.min(EXPECTING_LOOK.min(retry))
                    } else {
                        retry_in.min(retry + jitter(retry / 5))
                    };
                }
                Ok(Err(e)) => warn!(identity = %self.identity, error = %e, "Lease attempt failed"),
                Err(_) => warn!(identity = %self.identity, "Lease attempt timed out"),
            }
            if let Some(at) = renewed_at {
                // Never sleep past the renew deadline while reporting "leader".
                pause = pause.min((at + deadline).saturating_duration_since(Instant::now()));
            }
            tokio::select! {
                biased;
                _ = &mut shutdown => break,
                () = tokio::time::sleep(pause) => {}
                () = handover_expected(self.expecting.clone(), expecting), if renewed_at.is_none() => {}
            }
        }
        self.set_leader(None);
        self
    }

    /// Reports the term (`Some(until)`: leading), then the flag: writers
    /// go by the term, so it changes first either way.
    fn set_leader(&self, term: Option<Instant>) {
        let leading = term.is_some();
        self.term.send_replace(term);
        self.leader
            .send_if_modified(|current| std::mem::replace(current, leading) != leading);
    }

    /// Records the record's version; returns when it was first seen.
    fn observe(&mut self, lease: &Lease, now: Instant) -> Instant {
        let version = lease.metadata.resource_version.clone().unwrap_or_default();
        match &self.observed {
            Some((seen, at)) if *seen == version => *at,
            _ => {
                self.observed = Some((version, now));
                now
            }
        }
    }

    async fn try_acquire_or_renew(&mut self) -> Result<Attempt, LeaderError> {
        let current = self.api.get_opt(&self.name).await?;
        let now = Instant::now();
        let wall = MicroTime(Timestamp::now());
        let Some(mut lease) = current else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    acquire_time: Some(wall.clone()),
                    renew_time: Some(wall),
                    lease_duration_seconds: Some(self.timings.lease_duration_seconds()),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    self.observe(&created, Instant::now());
                    Ok(Attempt::Held)
                }
                // AlreadyExists (also 409): another replica created it first.
                Err(kube::Error::Api(s)) if s.is_conflict() || s.is_already_exists() => {
                    debug!("lost the race to create the Lease");
                    Ok(Attempt::NotHeld {
                        retry_in: Duration::ZERO,
                    })
                }
                Err(e) => Err(e.into()),
            };
        };
        let observed_at = self.observe(&lease, now);
        let holding = Holding::of(&lease);
        let action = decide(
            &holding,
            &self.identity,
            observed_at,
            now,
            self.timings.lease_duration,
        );
        trace!(holder = ?holding.holder, ?action, "Lease decision");
        if let LeaseAction::Wait { remaining } = action {
            return Ok(Attempt::NotHeld {
                retry_in: remaining,
            });
        }
        let spec = lease.spec.get_or_insert_with(Default::default);
        if action == LeaseAction::Acquire {
            spec.holder_identity = Some(self.identity.clone());
            spec.acquire_time = Some(wall.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
        }
        spec.renew_time = Some(wall);
        spec.lease_duration_seconds = Some(self.timings.lease_duration_seconds());
        // `lease` still carries the resourceVersion just read: optimistic concurrency.
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(updated) => {
                self.observe(&updated, Instant::now());
                Ok(Attempt::Held)
            }
            Err(kube::Error::Api(s)) if s.is_conflict() && action == LeaseAction::Acquire => {
                debug!("lost the race to acquire the Lease");
                Ok(Attempt::NotHeld {
                    retry_in: self.timings.retry_period,
                })
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Clears `holderIdentity` if this replica holds the Lease.
    ///
    /// A write refused as a conflict is read again rather than taken as
    /// "someone else holds it now": the writer in between is usually this
    /// replica. The stop cancelled the loop's attempt, but a renewal
    /// already sent still lands, after the read here; the Lease is still
    /// ours, and left alone it kept the successor waiting out the whole
    /// term (bench row 15: 1 hand-over in about 500, 3 s without a writer).
    async fn release(&self) -> Result<(), LeaderError> {
        for _ in 0..RELEASE_READS {
            let Some(mut lease) = self.api.get_opt(&self.name).await? else {
                return Ok(());
            };
            if Holding::of(&lease).holder.as_deref() != Some(self.identity.as_str()) {
                return Ok(());
            }
            let spec = lease.spec.get_or_insert_with(Default::default);
            spec.holder_identity = None;
            spec.renew_time = Some(MicroTime(Timestamp::now()));
            spec.lease_duration_seconds = Some(1);
            match self
                .api
                .replace(&self.name, &PostParams::default(), &lease)
                .await
            {
                Ok(_) => {
                    info!(identity = %self.identity, lease = %self.name, "released the Lease");
                    return Ok(());
                }
                Err(kube::Error::Api(s)) if s.is_conflict() => {
                    debug!(identity = %self.identity, lease = %self.name,
                        "the Lease changed since it was read (a renewal still in flight?): reading it again");
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(LeaderError::Contended(RELEASE_READS))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_are_unique_per_process_start() {
        let a = identity(Some("portwise-7d9f-abcde"));
        let b = identity(Some("portwise-7d9f-abcde"));
        assert!(a.starts_with("portwise-7d9f-abcde_"), "{a}");
        assert_eq!(a.len(), "portwise-7d9f-abcde_".len() + 8);
        assert_ne!(a, b);
        assert!(!identity(None).starts_with('_'));
        assert!(!identity(Some("  ")).starts_with('_'));
    }

    #[tokio::test]
    async fn track_mirrors_leadership_into_the_gauge() {
        async fn gauge_becomes(m: &Metrics, want: &str) {
            for _ in 0..200 {
                if m.encode()
                    .lines()
                    .any(|l| l == format!("portwise_leader {want}"))
                {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            panic!("portwise_leader never became {want}:\n{}", m.encode());
        }
        let m = Metrics::new();
        let e = LeaderElector::standalone("solo");
        assert!(e.is_leader());
        e.track(&m);
        gauge_becomes(&m, "1").await;
        drop(e);
        gauge_becomes(&m, "0").await;
    }

    #[tokio::test]
    async fn a_hint_wakes_a_sleeping_candidate_once_and_only_when_new() {
        async fn soon<F: std::future::IntoFuture>(
            f: F,
        ) -> Result<F::Output, tokio::time::error::Elapsed> {
            tokio::time::timeout(Duration::from_millis(50), f).await
        }
        let (tx, rx) = watch::channel(false);
        // Given while the attempt ran, after the pause was chosen: wakes at once.
        tx.send_replace(true);
        assert!(soon(handover_expected(rx.clone(), false)).await.is_ok());
        // Already expected when the pause was chosen (the short one): no wake.
        assert!(soon(handover_expected(rx.clone(), true)).await.is_err());
        // Given during the pause: wakes.
        tx.send_replace(false);
        let waiting = tokio::spawn(handover_expected(rx.clone(), false));
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!waiting.is_finished());
        tx.send_replace(true);
        assert!(soon(waiting).await.is_ok());
        // The handle gone: never (no busy loop on a closed channel).
        tx.send_replace(false);
        drop(tx);
        assert!(soon(handover_expected(rx, false)).await.is_err());
    }

    #[test]
    fn jitter_stays_below_its_bound() {
        for _ in 0..100 {
            assert!(jitter(Duration::from_millis(400)) < Duration::from_millis(400));
        }
        assert_eq!(jitter(Duration::ZERO), Duration::ZERO);
    }
}
