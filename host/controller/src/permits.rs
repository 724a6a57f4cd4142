//! Check permits (`maxConcurrentChecks`) handed out fairly between shares
//! (a Service's namespace), each share holding at most its cap
//! (`maxConcurrentChecksPerNamespace`).
//!
//! Why not a semaphore: tokio's is first come, first served, so a tenant
//! whose Services ask for hundreds of probes that never answer (a
//! NetworkPolicy dropping portwise's traffic does it) queues them ahead of
//! everyone else's, and another namespace's probe waits for all of them to
//! time out: minutes. Here a freed permit goes to the next share in turn,
//! round robin over the shares with waiters, first come first served
//! within one; a share that asks for a thousand permits gets every other
//! one while another waits, never all of them. The cap bounds a share even
//! when nobody else waits, so that a namespace's hung probes leave the
//! rest of the pool free for the next namespace that needs it at once.

use std::{
    collections::{HashMap, VecDeque},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use tokio::sync::oneshot;

/// A pool of permits shared fairly; see the module docs.
#[derive(Debug)]
pub(crate) struct FairPermits {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    free: usize,
    /// The most permits one share holds at once.
    cap: usize,
    /// Permits held, per share (shares holding none are left out).
    held: HashMap<String, usize>,
    /// Waiters per share, oldest first.
    waiting: HashMap<String, VecDeque<oneshot::Sender<Permit>>>,
    /// Shares with waiters, in turn order.
    turns: VecDeque<String>,
}

impl State {
    fn below_cap(&self, share: &str) -> bool {
        self.held.get(share).copied().unwrap_or(0) < self.cap
    }

    fn take(&mut self, share: &str) {
        *self.held.entry(share.to_owned()).or_default() += 1;
    }

    fn put(&mut self, share: &str) {
        if let Some(n) = self.held.get_mut(share) {
            *n -= 1;
            if *n == 0 {
                self.held.remove(share);
            }
        }
    }
}

/// One permit of a share; given back when dropped (to the next waiter in
/// turn).
#[derive(Debug)]
pub(crate) struct Permit {
    /// `None` only for a permit that was never handed to anyone.
    pool: Option<Arc<FairPermits>>,
    share: String,
}

impl FairPermits {
    /// A pool of `permits` (at least one) without a cap: a share may hold
    /// them all while nobody else waits.
    pub(crate) fn new(permits: usize) -> Arc<Self> {
        Self::capped(permits, permits)
    }

    /// A pool of `permits` (at least one) of which one share holds at most
    /// `cap` (at least one) at once.
    pub(crate) fn capped(permits: usize, cap: usize) -> Arc<Self> {
        Arc::new(FairPermits {
            state: Mutex::new(State {
                free: permits.max(1),
                cap: cap.max(1),
                held: HashMap::new(),
                waiting: HashMap::new(),
                turns: VecDeque::new(),
            }),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A permit for `share`, when its turn comes. Cancel-safe: a waiter
    /// dropped before or after its grant gives the permit on.
    pub(crate) async fn acquire(self: &Arc<Self>, share: &str) -> Permit {
        let granted = {
            let mut s = self.state();
            // A freed permit goes to a waiter below its cap if there is
            // one, so a free permit means nobody who may take it waits.
            if s.free > 0 && s.below_cap(share) {
                s.free -= 1;
                s.take(share);
                return Permit {
                    pool: Some(self.clone()),
                    share: share.to_owned(),
                };
            }
            let (tx, rx) = oneshot::channel();
            let s = &mut *s;
            let queue = s.waiting.entry(share.to_string()).or_default();
            if queue.is_empty() {
                s.turns.push_back(share.to_string());
            }
            queue.push_back(tx);
            rx
        };
        // The pool holds a sender for every waiter until it grants it.
        granted
            .await
            .expect("a waiter's sender is kept until granted")
    }

    /// Permits free now (tests).
    #[cfg(test)]
    pub(crate) fn available(&self) -> usize {
        self.state().free
    }

    /// Gives back a permit of `share`: to the oldest waiter of the next
    /// share in turn that is below its cap, or to the pool.
    fn give_back(self: &Arc<Self>, share: &str) {
        let mut s = self.state();
        s.put(share);
        s.free += 1;
        drop(s);
        self.hand_out();
    }

    /// Hands free permits to waiters below their cap, in turn.
    fn hand_out(self: &Arc<Self>) {
        loop {
            let (next, share) = {
                let mut s = self.state();
                if s.free == 0 {
                    return;
                }
                // The first share in turn that may take one more; shares
                // at their cap keep their place.
                let Some(at) = s.turns.iter().position(|t| s.below_cap(t)) else {
                    return;
                };
                let share = s.turns.remove(at).expect("a position in turns");
                let queue = s.waiting.get_mut(&share).expect("a share in turn waits");
                let tx = queue.pop_front().expect("a share in turn waits");
                if queue.is_empty() {
                    s.waiting.remove(&share);
                } else {
                    s.turns.push_back(share.clone());
                }
                s.free -= 1;
                s.take(&share);
                (tx, share)
            };
            // Sent outside the lock: a permit that comes back (its waiter
            // was dropped) must not give itself back from inside it.
            match next.send(Permit {
                pool: Some(self.clone()),
                share: share.clone(),
            }) {
                Ok(()) => continue,
                Err(mut unclaimed) => {
                    unclaimed.pool = None;
                    let mut s = self.state();
                    s.put(&share);
                    s.free += 1;
                }
            }
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.give_back(&self.share);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    async fn granted(f: &mut (impl Future<Output = Permit> + Unpin)) -> Option<Permit> {
        tokio::time::timeout(Duration::from_millis(20), f)
            .await
            .ok()
    }

    /// A share that queued many waiters first does not go first for all of
    /// them: another share's waiter gets the next permit freed. Fails with
    /// a first-come-first-served semaphore.
    #[tokio::test]
    async fn a_freed_permit_goes_to_the_next_share_in_turn() {
        let pool = FairPermits::new(1);
        let held = pool.acquire("noisy").await;
        let mut noisy: Vec<_> = (0..5).map(|_| Box::pin(pool.acquire("noisy"))).collect();
        let mut quiet = Box::pin(pool.acquire("quiet"));
        // Polled once, so each is queued in this order.
        for w in &mut noisy {
            assert!(granted(w).await.is_none());
        }
        assert!(granted(&mut quiet).await.is_none());
        drop(held);
        // The freed permit goes to the oldest noisy waiter (noisy's turn
        // came first), the next to quiet, not to the 4 noisy ones queued
        // before it.
        let first = granted(&mut noisy[0]).await.expect("noisy's turn");
        drop(first);
        let q = granted(&mut quiet).await.expect("quiet's turn came second");
        assert!(granted(&mut noisy[1]).await.is_none(), "held by quiet");
        drop(q);
        assert!(granted(&mut noisy[1]).await.is_some());
    }

    /// A waiter dropped before its grant does not swallow the permit, and
    /// permits come back to the pool when nobody waits.
    #[tokio::test]
    async fn a_dropped_waiter_passes_its_permit_on() {
        let pool = FairPermits::new(2);
        let (a, b) = (pool.acquire("x").await, pool.acquire("y").await);
        assert_eq!(pool.available(), 0);
        let mut gone = Box::pin(pool.acquire("x"));
        assert!(granted(&mut gone).await.is_none());
        let mut waits = Box::pin(pool.acquire("y"));
        assert!(granted(&mut waits).await.is_none());
        drop(gone);
        drop(a);
        let w = granted(&mut waits)
            .await
            .expect("the dropped waiter's turn passed on");
        drop((b, w));
        assert_eq!(pool.available(), 2, "every permit back in the pool");
    }

    /// A share at its cap waits even with permits free, and the permits it
    /// cannot take go to another share at once; its next permit comes when
    /// one of its own is back. Fails without the cap (the noisy share would
    /// hold all four).
    #[tokio::test]
    async fn a_share_holds_at_most_its_cap() {
        let pool = FairPermits::capped(4, 2);
        let held = [pool.acquire("noisy").await, pool.acquire("noisy").await];
        let mut third = Box::pin(pool.acquire("noisy"));
        assert!(granted(&mut third).await.is_none(), "noisy is at its cap");
        assert_eq!(pool.available(), 2);
        let quiet = [pool.acquire("quiet").await, pool.acquire("quiet").await];
        assert_eq!(pool.available(), 0);
        drop(quiet);
        assert!(granted(&mut third).await.is_none(), "still at its cap");
        assert_eq!(pool.available(), 2);
        let [first, _second] = held;
        drop(first);
        assert!(
            granted(&mut third).await.is_some(),
            "one of its own came back"
        );
    }
}
