//! `stable`: kubelet-style damping of an inner checker, with the damper
//! states kept per pod address and port in a [`StableStore`].

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use portwise_core::membership::{Decision, Subject, Verdict, algebra::Damper};

use crate::{BoxFuture, Checker};

/// What one `stable` state is kept for: the same pod address judged for the
/// same Service port and target. A new pod (new UID), a moved target port
/// or a new address starts afresh.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct StableKey {
    pub service_uid: String,
    pub pod_uid: String,
    pub port: String,
    pub target: u16,
    pub address: IpAddr,
}

impl StableKey {
    pub fn of(subject: &Subject) -> Self {
        StableKey {
            service_uid: subject.service.metadata.uid.clone().unwrap_or_default(),
            pod_uid: subject.pod.metadata.uid.clone().unwrap_or_default(),
            port: subject.port.name.clone(),
            target: subject.port.target,
            address: subject.address,
        }
    }
}

/// Damper states per [`StableKey`], forgotten when unused for `ttl` (pods
/// come and go; without expiry the map would grow forever). Expired entries
/// are swept lazily, at most once per `ttl`, on the next observation.
#[derive(Debug)]
pub struct StableStore {
    success_threshold: u32,
    failure_threshold: u32,
    ttl: Duration,
    /// Observations closer than this to the last counted one are not
    /// counted (see [`StableStore::observe`]).
    spacing: Duration,
    inner: Mutex<StoreInner>,
}

#[derive(Debug)]
struct StoreInner {
    entries: HashMap<StableKey, Entry>,
    last_sweep: Option<Instant>,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    damper: Damper,
    /// Last observation, counted or not (for the TTL).
    used: Instant,
    /// Last observation the damper counted.
    counted: Instant,
}

impl StableStore {
    pub fn new(success_threshold: u32, failure_threshold: u32, ttl: Duration) -> Self {
        StableStore {
            success_threshold,
            failure_threshold,
            ttl,
            spacing: Duration::ZERO,
            inner: Mutex::new(StoreInner {
                entries: HashMap::new(),
                last_sweep: None,
            }),
        }
    }

    /// Counts observations only `spacing` apart (see
    /// [`BuildContext::stable_spacing_for`](crate::BuildContext::stable_spacing_for)).
    pub fn counting_every(mut self, spacing: Duration) -> Self {
        self.spacing = spacing;
        self
    }

    /// Feeds one observation for `key` at time `now`; returns the damped
    /// decision and the damper after the observation.
    ///
    /// Thresholds count distinct observations at least `spacing` apart,
    /// as kubelet counts one probe per period: one closer to the last
    /// counted observation changes nothing and answers the damped state.
    /// Before the first conclusive observation every one counts (the first
    /// is taken as is).
    pub fn observe(&self, key: StableKey, d: Decision, now: Instant) -> (Decision, Damper) {
        // A panic elsewhere cannot leave a Damper half-updated; keep going.
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let due = inner
            .last_sweep
            .is_none_or(|t| now.saturating_duration_since(t) >= self.ttl);
        if due {
            let ttl = self.ttl;
            inner
                .entries
                .retain(|_, e| now.saturating_duration_since(e.used) < ttl);
            inner.last_sweep = Some(now);
        }
        let fresh = Damper::new(self.success_threshold, self.failure_threshold);
        let mut is_new = false;
        let entry = inner.entries.entry(key).or_insert_with(|| {
            is_new = true;
            Entry {
                damper: fresh,
                used: now,
                counted: now,
            }
        });
        if now.saturating_duration_since(entry.used) >= self.ttl {
            // expired but not yet swept
            *entry = Entry {
                damper: fresh,
                used: now,
                counted: now,
            };
            is_new = true;
        }
        entry.used = now;
        let counts = is_new
            || entry.damper.state().is_none()
            || now.saturating_duration_since(entry.counted) >= self.spacing;
        if !counts {
            return (entry.damper.state().unwrap_or(d), entry.damper);
        }
        entry.counted = now;
        let decision = entry.damper.observe(d);
        (decision, entry.damper)
    }

    /// Number of keys currently remembered.
    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entries
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `stable(checker, successThreshold, failureThreshold)`: kubelet-style
/// damping of the inner checker (see [`Damper`]).
#[derive(Debug)]
pub struct Stable {
    pub inner: Arc<dyn Checker>,
    pub store: StableStore,
}

impl Stable {
    /// See [`StableStore::counting_every`].
    pub fn counting_every(mut self, spacing: Duration) -> Self {
        self.store = self.store.counting_every(spacing);
        self
    }

    pub fn new(
        inner: Arc<dyn Checker>,
        success_threshold: u32,
        failure_threshold: u32,
        ttl: Duration,
    ) -> Self {
        Stable {
            inner,
            store: StableStore::new(success_threshold, failure_threshold, ttl),
        }
    }
}

impl Checker for Stable {
    fn check<'a>(&'a self, subject: &'a Subject) -> BoxFuture<'a, Verdict> {
        Box::pin(async move {
            let v = self.inner.check(subject).await;
            let (damped, damper) =
                self.store
                    .observe(StableKey::of(subject), v.decision, Instant::now());
            if damped == v.decision {
                return v;
            }
            let why = match v.reason {
                Some(r) => format!(": {r}"),
                None => String::new(),
            };
            let reason = if v.decision == Decision::Abstain {
                format!("stable: holding {damped:?}, inner checker abstained{why}")
            } else {
                let needed = match v.decision {
                    Decision::Include => self.store.success_threshold.max(1),
                    _ => self.store.failure_threshold.max(1),
                };
                format!(
                    "stable: holding {damped:?}, {} of {needed} consecutive {:?}{why}",
                    damper.consecutive(),
                    v.decision
                )
            };
            Verdict {
                decision: damped,
                reason: Some(reason),
            }
        })
    }

    fn probes(&self) -> bool {
        self.inner.probes()
    }
}
