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

use std::time::{Duration, Instant};

use tokio::sync::watch;

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
