//! Only the leader writes, and only within its term.
//!
//! A flag ("am I leader") is not enough: it is flipped by the election
//! loop, which is just another task. A process frozen past its Lease
//! (SIGSTOP, a paused VM, a long GC-like stall of the node) resumes with
//! every task runnable at once; a reconcile that runs before the election
//! loop still reads "leader" and writes over the successor's slices. So the
//! elector hands out the *end* of its term as an instant on this process's
//! monotonic clock (which keeps counting while the process is stopped), and
//! every write is checked against the clock: [`Tenure::remaining`].
//!
//! The check runs in two places: the reconcile skips work when the term is
//! over (cheap, early), and the binary's API client refuses any mutating
//! request outside the term and cuts one that would outlast it
//! (`portwise::ops::client`), so that no write path can forget it.
//!
//! Sharded (issue 49), there is a term per bucket of namespaces
//! ([`Terms`]): a replica writes in a namespace only within the term of the
//! bucket the namespace hashes to. [`Leadership`] is the one question both
//! places ask: how long may this replica still write in this namespace.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, RwLock},
    time::{Duration, Instant},
};

use portwise_core::shard::{Bucket, Shards};
use tokio::sync::watch;

/// What [`Leadership::remaining`] says of a replica without election: no
/// end. A deadline this far out overflows `Instant`, which tokio's
/// `timeout` (the write fence's) reads as "never".
pub const FOREVER: Duration = Duration::MAX;

/// Who writes where: every replica that may write asks it before a write.
#[derive(Clone, Debug)]
pub enum Leadership {
    /// No election: the only replica writes everything, always.
    Sole,
    /// One elected leader writes everything, within its term.
    Leader(Tenure),
    /// Each bucket of namespaces has its own holder: a write in a namespace
    /// is within the term of the bucket it hashes to; a write in no
    /// namespace is never (every write portwise makes is namespaced).
    Shards { shards: Shards, terms: Terms },
}

impl Leadership {
    /// How long this replica may still write in `namespace` (`None`: a
    /// cluster-scoped write); `None` when it may not write there now.
    pub fn remaining(&self, namespace: Option<&str>) -> Option<Duration> {
        match self {
            Leadership::Sole => Some(FOREVER),
            Leadership::Leader(tenure) => tenure.remaining(),
            Leadership::Shards { shards, terms } => terms
                .until(shards.bucket(namespace?))?
                .checked_duration_since(Instant::now())
                .filter(|d| !d.is_zero()),
        }
    }

    /// This replica may write in `namespace` now.
    pub fn leads(&self, namespace: &str) -> bool {
        self.remaining(Some(namespace)).is_some()
    }

    /// This replica may write somewhere now: it leads, or holds a bucket.
    /// Work whose only end is a write returns early without it.
    pub fn writes_anywhere(&self) -> bool {
        match self {
            Leadership::Sole => true,
            Leadership::Leader(tenure) => tenure.remaining().is_some(),
            Leadership::Shards { terms, .. } => !terms.held().is_empty(),
        }
    }

    /// The bucket `namespace` falls in, when sharded.
    pub fn bucket(&self, namespace: &str) -> Option<Bucket> {
        match self {
            Leadership::Shards { shards, .. } => Some(shards.bucket(namespace)),
            _ => None,
        }
    }
}

/// This replica's terms, per bucket it holds or competes for: what the
/// write fence and the reconciles ask. The shard ring
/// (`portwise::ops::shards`) keeps it, one elector's term watch per bucket.
#[derive(Clone, Debug, Default)]
pub struct Terms(Arc<RwLock<BTreeMap<Bucket, watch::Receiver<Option<Instant>>>>>);

impl Terms {
    /// When this replica's term for `bucket` ends at the latest; `None`
    /// when it does not hold it (or the term is over by the clock).
    pub fn until(&self, bucket: Bucket) -> Option<Instant> {
        let terms = self.0.read().unwrap_or_else(|e| e.into_inner());
        (*terms.get(&bucket)?.borrow()).filter(|until| *until > Instant::now())
    }

    /// The buckets whose term runs now.
    pub fn held(&self) -> BTreeSet<Bucket> {
        let now = Instant::now();
        let terms = self.0.read().unwrap_or_else(|e| e.into_inner());
        terms
            .iter()
            .filter(|(_, t)| t.borrow().is_some_and(|until| until > now))
            .map(|(b, _)| *b)
            .collect()
    }

    /// Follows `term` for `bucket` (`None`: competes for it no more). The
    /// ring's call only.
    pub fn set(&self, bucket: Bucket, term: Option<watch::Receiver<Option<Instant>>>) {
        let mut terms = self.0.write().unwrap_or_else(|e| e.into_inner());
        match term {
            Some(t) => terms.insert(bucket, t),
            None => terms.remove(&bucket),
        };
    }
}

/// This replica's leadership: `Some(until)` while it leads, where `until`
/// is when its term ends at the latest.
#[derive(Clone, Debug)]
pub struct Tenure(watch::Receiver<Option<Instant>>);

impl Tenure {
    /// From the elector's term watch
    /// (`portwise::ops::leader::LeaderElector::subscribe_term`).
    pub fn new(term: watch::Receiver<Option<Instant>>) -> Self {
        Self(term)
    }

    /// A term that never ends (no election: the only replica).
    pub fn unlimited() -> Self {
        let (tx, rx) = watch::channel(Some(far_future()));
        // The receiver keeps the last value after the sender is gone.
        drop(tx);
        Self(rx)
    }

    /// How much of the term is left now; `None` when this replica does not
    /// lead or its term is over.
    pub fn remaining(&self) -> Option<Duration> {
        let until = (*self.0.borrow())?;
        until
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
    }

    /// This replica may write now.
    pub fn leads(&self) -> bool {
        self.remaining().is_some()
    }

    /// Waits for the elector to report a change (a new term, a renewal, a
    /// step-down), then tells whether a term is held (by the flag: the
    /// clock is for writes). `None` when the elector is gone.
    pub async fn changed(&mut self) -> Option<bool> {
        self.0.changed().await.ok()?;
        Some(self.0.borrow_and_update().is_some())
    }

    /// Whether a term is held, marking the current value seen.
    pub fn holds_term(&mut self) -> bool {
        self.0.borrow_and_update().is_some()
    }
}

fn far_future() -> Instant {
    // Instant has no MAX; a century is beyond any process's uptime.
    Instant::now() + Duration::from_secs(100 * 365 * 86_400)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_term_in_the_past_is_over_although_the_elector_still_reports_it() {
        // What a frozen process wakes up to: the elector's last word was
        // "leading until T", and T has passed.
        let (_tx, rx) = watch::channel(Some(Instant::now() - Duration::from_millis(1)));
        let tenure = Tenure::new(rx);
        assert_eq!(tenure.remaining(), None);
        assert!(!tenure.leads());
    }

    #[test]
    fn remaining_counts_down_to_the_end_of_the_term() {
        let until = Instant::now() + Duration::from_secs(5);
        let (tx, rx) = watch::channel(Some(until));
        let tenure = Tenure::new(rx);
        let left = tenure.remaining().expect("leading");
        assert!(left <= Duration::from_secs(5) && left > Duration::from_secs(4));
        tx.send_replace(None);
        assert!(!tenure.leads(), "stepped down");
    }

    #[test]
    fn a_sharded_replica_leads_only_in_the_namespaces_of_its_buckets() {
        let shards = Shards::new(std::num::NonZeroU32::new(4).unwrap());
        let a = "team-a";
        let mine = shards.bucket(a);
        // A namespace of another bucket.
        let other = (0..64)
            .map(|i| format!("ns-{i}"))
            .find(|n| shards.bucket(n) != mine)
            .unwrap();
        let terms = Terms::default();
        let leadership = Leadership::Shards {
            shards,
            terms: terms.clone(),
        };
        assert!(!leadership.leads(a), "no term held yet");
        assert!(!leadership.writes_anywhere(), "no term held yet");
        let (tx, rx) = watch::channel(Some(Instant::now() + Duration::from_secs(5)));
        terms.set(mine, Some(rx));
        assert!(leadership.leads(a));
        assert!(leadership.writes_anywhere());
        assert!(!leadership.leads(&other), "{other} is in another bucket");
        assert_eq!(leadership.remaining(None), None, "a cluster-scoped write");
        assert_eq!(terms.held(), BTreeSet::from([mine]));
        tx.send_replace(Some(Instant::now() - Duration::from_millis(1)));
        assert!(!leadership.leads(a), "the term is over by the clock");
        assert!(
            !leadership.writes_anywhere(),
            "the term is over by the clock"
        );
    }

    #[test]
    fn unlimited_leads_after_its_sender_is_gone() {
        assert!(Tenure::unlimited().leads());
    }

    #[tokio::test]
    async fn changed_reports_new_terms_and_step_downs() {
        let (tx, rx) = watch::channel(None);
        let mut tenure = Tenure::new(rx);
        assert!(!tenure.holds_term());
        tx.send_replace(Some(Instant::now() + Duration::from_secs(1)));
        assert_eq!(tenure.changed().await, Some(true));
        tx.send_replace(None);
        assert_eq!(tenure.changed().await, Some(false));
        drop(tx);
        assert_eq!(tenure.changed().await, None);
    }
}
