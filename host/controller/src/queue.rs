//! The work queue: every reconcile is asked for here, whatever asked for it
//! (a pod, Service or slice change, a resync, a retry, a new term), with
//! client-go's work queue guarantees:
//! - a key asked for many times before its turn runs once;
//! - a key never runs twice at once; asked for while it runs, it runs once
//!   more afterwards (the change may have come after the run read the
//!   caches);
//! - a key due later ([`Queue::add_after`]) keeps its earliest time;
//! - a key asked for now is handed out at once: no timer between an event
//!   and its reconcile (kube-runtime's `Controller` put every request
//!   through a millisecond `DelayQueue`, which measured 1.3–2.2 ms of
//!   added delay per pod change, from the change to kube-proxy routing by
//!   it).
//!
//! Which ready key goes next is the queue's policy: round robin over the
//! keys' *shares* (a Service's namespace), first come first served within
//! one. A namespace that asks for a thousand reconciles gets its turn like
//! every other, not a thousand turns first.
//!
//! Why one queue: before it, pod changes went through a prompt lane beside
//! kube-runtime's `Controller`, with a lock per key between the two, a
//! semaphore for the concurrency bound and a side table for the trigger
//! time; both paths counted metrics and retried, and their races had to be
//! argued case by case.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    hash::Hash,
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

use tokio::sync::Notify;

/// A key the queue can schedule fairly: the share it counts against.
pub trait Shared {
    fn share(&self) -> &str;
}

impl Shared for kube::runtime::reflector::ObjectRef<k8s_openapi::api::core::v1::Service> {
    fn share(&self) -> &str {
        self.namespace.as_deref().unwrap_or_default()
    }
}

/// A key handed out by [`Queue::next`], with how long it waited ready.
#[derive(Debug)]
pub struct Turn<K> {
    pub key: K,
    pub waited: Duration,
}

pub struct Queue<K> {
    inner: Arc<Inner<K>>,
}

impl<K> Clone for Queue<K> {
    fn clone(&self) -> Self {
        Queue {
            inner: self.inner.clone(),
        }
    }
}

struct Inner<K> {
    state: Mutex<State<K>>,
    /// Woken when a key becomes ready, a key's run ends, or the queue closes.
    changed: Notify,
}

struct State<K> {
    /// Ready keys per share, in arrival order, with when they became ready.
    ready: HashMap<String, VecDeque<(K, Instant)>>,
    /// Shares with ready keys, in turn order.
    turns: VecDeque<String>,
    /// Every ready key (so a second ask is a no-op).
    queued: HashSet<K>,
    /// Keys handed out and not yet done.
    running: HashSet<K>,
    /// Running keys asked for again since they were handed out.
    again: HashSet<K>,
    /// Keys due later, with their earliest due time.
    delayed: HashMap<K, Instant>,
    closed: bool,
}

impl<K: Clone + Eq + Hash + Shared + Send + 'static> Default for Queue<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Clone + Eq + Hash + Shared + Send + 'static> Queue<K> {
    pub fn new() -> Self {
        Queue {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    ready: HashMap::new(),
                    turns: VecDeque::new(),
                    queued: HashSet::new(),
                    running: HashSet::new(),
                    again: HashSet::new(),
                    delayed: HashMap::new(),
                    closed: false,
                }),
                changed: Notify::new(),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State<K>> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Asks for `key` now. `false` once the queue is closed.
    pub fn add(&self, key: K) -> bool {
        {
            let mut guard = self.state();
            let s = &mut *guard;
            if s.closed {
                return false;
            }
            if s.running.contains(&key) {
                s.again.insert(key);
                return true;
            }
            if !s.queued.insert(key.clone()) {
                return true;
            }
            let share = key.share().to_string();
            let ready = s.ready.entry(share.clone()).or_default();
            if ready.is_empty() {
                s.turns.push_back(share);
            }
            ready.push_back((key, Instant::now()));
        }
        self.inner.changed.notify_waiters();
        true
    }

    /// Asks for `key` in `delay`, unless it is due sooner already.
    pub fn add_after(&self, key: K, delay: Duration) {
        if delay.is_zero() {
            self.add(key);
            return;
        }
        let due = Instant::now() + delay;
        {
            let mut s = self.state();
            if s.closed || s.delayed.get(&key).is_some_and(|d| *d <= due) {
                return;
            }
            s.delayed.insert(key.clone(), due);
        }
        let queue = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(due.into()).await;
            let mine = {
                let mut s = queue.state();
                // A sooner time replaced ours: its own timer asks.
                let mine = s.delayed.get(&key) == Some(&due);
                if mine {
                    s.delayed.remove(&key);
                }
                mine
            };
            if mine {
                queue.add(key);
            }
        });
    }

    /// The next ready key, by the queue's policy, marked running until
    /// [`Queue::done`]; `None` once the queue is closed.
    pub async fn next(&self) -> Option<Turn<K>> {
        self.wait_for(|s| {
            if s.closed {
                Some(None)
            } else {
                pop(s).map(Some)
            }
        })
        .await
    }

    /// Waits until `ready` gives a value, asking it under the lock each
    /// time the queue changes. The waiter is registered before each
    /// check, so a change between the check and the wait is not missed.
    async fn wait_for<T>(&self, mut ready: impl FnMut(&mut State<K>) -> Option<T>) -> T {
        loop {
            let changed = self.inner.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(out) = ready(&mut self.state()) {
                return out;
            }
            changed.await;
        }
    }

    /// `key`'s run has ended: asked for meanwhile, it is ready again.
    pub fn done(&self, key: &K) {
        let again = {
            let mut s = self.state();
            s.running.remove(key);
            s.again.remove(key)
        };
        if again {
            self.add(key.clone());
        }
        self.inner.changed.notify_waiters();
    }

    /// Runs `work` as `key`'s turn, outside the queue's order: after the
    /// key's current run if it has one, and with no run of it beside
    /// (for work on a key the queue cannot hand out, such as a Service
    /// the cache no longer holds). `None`, without running it, once the
    /// queue is closed.
    pub async fn exclusive<T>(
        &self,
        key: K,
        work: impl std::future::Future<Output = T>,
    ) -> Option<T> {
        let go = self
            .wait_for(|s| {
                if s.closed {
                    Some(false)
                } else {
                    s.running.insert(key.clone()).then_some(true)
                }
            })
            .await;
        if !go {
            return None;
        }
        // Done even if the work is dropped half way (its task aborted).
        struct Release<'a, K: Clone + Eq + Hash + Shared + Send + 'static>(&'a Queue<K>, K);
        impl<K: Clone + Eq + Hash + Shared + Send + 'static> Drop for Release<'_, K> {
            fn drop(&mut self) {
                self.0.done(&self.1);
            }
        }
        let _release = Release(self, key);
        Some(work.await)
    }

    /// Refuses new keys and hands out no more; runs under way go on
    /// ([`Queue::idle`] waits for them).
    pub fn close(&self) {
        self.state().closed = true;
        self.inner.changed.notify_waiters();
    }

    /// Waits until no key is running.
    pub async fn idle(&self) {
        self.wait_for(|s| s.running.is_empty().then_some(())).await
    }

    /// Keys ready or running, for tests.
    #[cfg(test)]
    fn len(&self) -> usize {
        let s = self.state();
        s.queued.len() + s.running.len()
    }
}

/// The next share's oldest key: round robin over shares. A key taken
/// running meanwhile ([`Queue::exclusive`]) runs again after, not now.
fn pop<K: Clone + Eq + Hash>(s: &mut State<K>) -> Option<Turn<K>> {
    loop {
        let share = s.turns.pop_front()?;
        let Some(ready) = s.ready.get_mut(&share) else {
            continue;
        };
        let Some((key, at)) = ready.pop_front() else {
            s.ready.remove(&share);
            continue;
        };
        if ready.is_empty() {
            s.ready.remove(&share);
        } else {
            s.turns.push_back(share);
        }
        s.queued.remove(&key);
        if s.running.contains(&key) {
            s.again.insert(key);
            continue;
        }
        s.running.insert(key.clone());
        return Some(Turn {
            key,
            waited: at.elapsed(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug, PartialEq, Eq, Hash)]
    struct Key(&'static str, &'static str);

    impl Shared for Key {
        fn share(&self) -> &str {
            self.0
        }
    }

    async fn next_now(q: &Queue<Key>) -> Option<Key> {
        tokio::time::timeout(Duration::from_millis(50), q.next())
            .await
            .ok()
            .flatten()
            .map(|t| t.key)
    }

    #[tokio::test]
    async fn many_asks_before_the_turn_run_once() {
        let q = Queue::new();
        for _ in 0..3 {
            assert!(q.add(Key("a", "web")));
        }
        assert_eq!(next_now(&q).await, Some(Key("a", "web")));
        assert_eq!(next_now(&q).await, None, "handed out twice");
    }

    #[tokio::test]
    async fn asked_while_running_runs_once_more_after_and_never_at_once() {
        let q = Queue::new();
        q.add(Key("a", "web"));
        let k = next_now(&q).await.unwrap();
        q.add(k.clone());
        q.add(k.clone());
        assert_eq!(next_now(&q).await, None, "ran twice at once");
        q.done(&k);
        assert_eq!(
            next_now(&q).await,
            Some(k.clone()),
            "the ask during the run was lost"
        );
        q.done(&k);
        assert_eq!(next_now(&q).await, None, "ran a third time");
        assert_eq!(q.len(), 0);
    }

    /// A namespace with a thousand keys ready does not keep another's one
    /// key waiting behind them (issue 45's starvation, at the queue).
    #[tokio::test]
    async fn shares_take_turns() {
        let q = Queue::new();
        let names: Vec<&'static str> = (0..1000)
            .map(|i| &*Box::leak(format!("s{i}").into_boxed_str()))
            .collect();
        for n in &names {
            q.add(Key("busy", n));
        }
        q.add(Key("quiet", "one"));
        let first = next_now(&q).await.unwrap();
        let second = next_now(&q).await.unwrap();
        assert_eq!(first, Key("busy", "s0"));
        assert_eq!(
            second,
            Key("quiet", "one"),
            "the quiet namespace waited its turn"
        );
        // Within a share, first come first served.
        assert_eq!(next_now(&q).await, Some(Key("busy", "s1")));
    }

    #[tokio::test]
    async fn a_later_ask_keeps_the_earliest_due_time() {
        let q = Queue::new();
        let t0 = Instant::now();
        q.add_after(Key("a", "web"), Duration::from_millis(1000));
        q.add_after(Key("a", "web"), Duration::from_millis(100));
        q.add_after(Key("a", "web"), Duration::from_millis(500));
        let k = q.next().await.unwrap().key;
        assert_eq!(k, Key("a", "web"));
        let waited = t0.elapsed();
        assert!(waited >= Duration::from_millis(100), "{waited:?}");
        assert!(
            waited < Duration::from_millis(500),
            "not the earliest: {waited:?}"
        );
        q.done(&k);
        // The superseded timers ask for nothing more.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert_eq!(q.len(), 0);
    }

    #[tokio::test]
    async fn close_hands_out_nothing_and_idle_waits_for_runs() {
        let q = Queue::new();
        q.add(Key("a", "web"));
        q.add(Key("a", "api"));
        let k = next_now(&q).await.unwrap();
        q.close();
        assert!(!q.add(Key("b", "db")));
        assert!(q.next().await.is_none(), "handed out after close");
        assert_eq!(
            q.exclusive(Key("b", "db"), async {}).await,
            None,
            "ran after close"
        );
        let idle = tokio::spawn({
            let q = q.clone();
            async move { q.idle().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!idle.is_finished(), "idle while a key runs");
        q.done(&k);
        tokio::time::timeout(Duration::from_secs(5), idle)
            .await
            .expect("idle never came")
            .unwrap();
    }

    #[tokio::test]
    async fn exclusive_work_never_runs_beside_a_turn_of_its_key() {
        let q = Queue::new();
        q.add(Key("a", "web"));
        let k = next_now(&q).await.unwrap();
        let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let side = tokio::spawn({
            let (q, ran) = (q.clone(), ran.clone());
            async move {
                q.exclusive(Key("a", "web"), async {
                    ran.store(true, std::sync::atomic::Ordering::SeqCst)
                })
                .await
            }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !ran.load(std::sync::atomic::Ordering::SeqCst),
            "ran beside the turn"
        );
        // Asked for while the exclusive work waits: handed out after it.
        q.add(k.clone());
        q.done(&k);
        let out = tokio::time::timeout(Duration::from_secs(5), side)
            .await
            .expect("exclusive work never ran")
            .unwrap();
        assert_eq!(out, Some(()));
        assert!(ran.load(std::sync::atomic::Ordering::SeqCst));
        assert_eq!(next_now(&q).await, Some(k));
    }

    #[tokio::test]
    async fn a_waiting_next_wakes_on_add() {
        let q: Queue<Key> = Queue::new();
        let waiter = tokio::spawn({
            let q = q.clone();
            async move { q.next().await.map(|t| t.key) }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        q.add(Key("a", "web"));
        let got = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("next never woke")
            .unwrap();
        assert_eq!(got, Some(Key("a", "web")));
    }
}
