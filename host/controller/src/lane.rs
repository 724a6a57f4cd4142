//! The prompt lane: a pod change reconciles its Services at once.
//!
//! kube-runtime's `Controller` schedules every request through a
//! `DelayQueue` with millisecond resolution, even one due now, so a pod
//! change waited 1.3–2.2 ms for its reconcile to start (docs/benchmarks.md,
//! row 8): longer than judging and planning it. The native controller's
//! work queue hands a key to a worker at once. This lane does the same for
//! pod changes, with that queue's guarantees:
//! - a key asked for while it waits or runs is not run twice at once;
//! - asked for while it runs, it runs once more afterwards (the change may
//!   have come after the run read the caches);
//! - asked for many times before its turn, it runs once.
//!
//! Everything else (Service and slice events, resyncs, retries,
//! leadership) still goes through the `Controller`; [`Exclusive`] keeps the
//! two from reconciling one Service at the same time.

use std::{
    collections::HashMap,
    hash::Hash,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
};

use futures::future::BoxFuture;

/// The work a key stands for.
type Work<K> = Box<dyn Fn(K) -> BoxFuture<'static, ()> + Send + Sync>;

/// Runs `work(key)` for each key asked for, at once, one run per key at a
/// time (module docs).
pub struct Lane<K> {
    inner: Arc<Inner<K>>,
}

struct Inner<K> {
    /// The keys running, each with whether it was asked for again since
    /// its run began.
    running: Mutex<HashMap<K, bool>>,
    work: Work<K>,
    /// Closed by [`Lane::drain`]: asks after it are refused.
    closed: AtomicBool,
    in_flight: AtomicUsize,
    /// Woken whenever a key's runs end.
    idle: tokio::sync::Notify,
}

impl<K: Clone + Eq + Hash + Send + 'static> Lane<K> {
    pub fn new(work: impl Fn(K) -> BoxFuture<'static, ()> + Send + Sync + 'static) -> Self {
        Lane {
            inner: Arc::new(Inner {
                running: Mutex::default(),
                work: Box::new(work),
                closed: AtomicBool::new(false),
                in_flight: AtomicUsize::new(0),
                idle: tokio::sync::Notify::new(),
            }),
        }
    }

    /// Runs `key`'s work now, or once more after its current run.
    /// `false` once the lane is draining.
    pub fn ask(&self, key: K) -> bool {
        if self.inner.closed.load(Ordering::SeqCst) {
            return false;
        }
        {
            let mut running = self.running();
            if let Some(again) = running.get_mut(&key) {
                *again = true;
                return true;
            }
            running.insert(key.clone(), false);
            self.inner.in_flight.fetch_add(1, Ordering::SeqCst);
        }
        let inner = self.inner.clone();
        tokio::spawn(async move {
            loop {
                (inner.work)(key.clone()).await;
                let mut running = inner.running.lock().unwrap_or_else(|e| e.into_inner());
                if running.get(&key) == Some(&true) {
                    running.insert(key.clone(), false);
                    continue;
                }
                running.remove(&key);
                break;
            }
            inner.in_flight.fetch_sub(1, Ordering::SeqCst);
            inner.idle.notify_waiters();
        });
        true
    }

    /// Refuses new asks and waits until every run has ended, so that
    /// nothing writes after the controller has stopped (and its Lease is
    /// released).
    pub async fn drain(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        loop {
            let idle = self.inner.idle.notified();
            if self.inner.in_flight.load(Ordering::SeqCst) == 0 {
                return;
            }
            idle.await;
        }
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<K, bool>> {
        self.inner.running.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One holder per key at a time, across the lane and the `Controller`.
/// Entries live while held or awaited, so the map is bounded by the
/// reconciles in flight.
pub struct Exclusive<K> {
    locks: Arc<Mutex<HashMap<K, Arc<tokio::sync::Mutex<()>>>>>,
}

impl<K> Default for Exclusive<K> {
    fn default() -> Self {
        Exclusive {
            locks: Arc::default(),
        }
    }
}

/// Held until dropped.
pub struct Held<K: Eq + Hash> {
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
    key: K,
    locks: Arc<Mutex<HashMap<K, Arc<tokio::sync::Mutex<()>>>>>,
}

impl<K: Clone + Eq + Hash> Exclusive<K> {
    /// Waits until no one else holds `key`.
    pub async fn hold(&self, key: K) -> Held<K> {
        let lock = self
            .locks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key.clone())
            .or_default()
            .clone();
        Held {
            guard: Some(lock.lock_owned().await),
            key,
            locks: self.locks.clone(),
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.locks.lock().unwrap().len()
    }
}

impl<K: Eq + Hash> Drop for Held<K> {
    fn drop(&mut self) {
        self.guard.take();
        let mut locks = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        // Only the map's own reference left: no one holds or awaits it.
        if locks
            .get(&self.key)
            .is_some_and(|l| Arc::strong_count(l) == 1)
        {
            locks.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::FutureExt;

    use super::*;

    /// A lane whose work records each run and takes `busy` per run.
    fn recording(busy: Duration) -> (Lane<&'static str>, Arc<Mutex<Vec<&'static str>>>) {
        let runs = Arc::new(Mutex::new(Vec::new()));
        let log = runs.clone();
        let lane = Lane::new(move |key| {
            let log = log.clone();
            async move {
                log.lock().unwrap().push(key);
                tokio::time::sleep(busy).await;
            }
            .boxed()
        });
        (lane, runs)
    }

    #[tokio::test]
    async fn a_key_asked_for_while_it_runs_runs_once_more_and_not_at_once() {
        let (lane, runs) = recording(Duration::from_millis(50));
        assert!(lane.ask("a"));
        tokio::time::sleep(Duration::from_millis(10)).await;
        // Three asks during the run: one more run, after it.
        for _ in 0..3 {
            assert!(lane.ask("a"));
        }
        assert_eq!(*runs.lock().unwrap(), ["a"], "ran twice at once");
        lane.drain().await;
        assert_eq!(*runs.lock().unwrap(), ["a", "a"]);
    }

    #[tokio::test]
    async fn different_keys_run_side_by_side() {
        // Each run waits for the other: they end only if both run at once.
        let both = Arc::new(tokio::sync::Barrier::new(2));
        let lane = Lane::new(move |_key: &'static str| {
            let both = both.clone();
            async move {
                both.wait().await;
            }
            .boxed()
        });
        lane.ask("a");
        lane.ask("b");
        tokio::time::timeout(Duration::from_secs(5), lane.drain())
            .await
            .expect("one key waited for the other");
    }

    #[tokio::test]
    async fn drain_waits_for_runs_and_refuses_new_asks() {
        let (lane, runs) = recording(Duration::from_millis(30));
        lane.ask("a");
        tokio::time::timeout(Duration::from_secs(5), lane.drain())
            .await
            .expect("drain never ended");
        assert_eq!(*runs.lock().unwrap(), ["a"]);
        assert!(!lane.ask("b"), "asked after draining");
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(*runs.lock().unwrap(), ["a"]);
    }

    #[tokio::test]
    async fn one_holder_per_key_and_no_entry_left_behind() {
        let ex = Arc::new(Exclusive::default());
        let first = ex.hold("a").await;
        let other = ex.hold("b").await;
        let waiter = tokio::spawn({
            let ex = ex.clone();
            async move {
                let _held = ex.hold("a").await;
            }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "two holders of one key");
        drop(first);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiter never got the key")
            .unwrap();
        drop(other);
        assert_eq!(ex.len(), 0, "entries left after every holder went");
    }
}
