//! Per-Service retry backoff after a failed reconcile.
//!
//! A fixed delay either hammers the apiserver with a write it keeps
//! refusing (a 422 that only a user can fix) or makes a transient failure
//! wait longer than it needs. Like the native controller's work queue
//! (`ItemExponentialFailureRateLimiter`) and kube-runtime's examples, each
//! Service backs off on its own: the first retry comes quickly, each
//! further consecutive failure doubles the wait up to a cap, and a
//! successful reconcile starts it over. A change to the Service or its pods
//! still reconciles at once: triggers are not subject to the backoff.

use std::time::Duration;

use backon::BackoffBuilder as _;

/// The first retry's delay.
pub const FIRST: Duration = Duration::from_millis(500);
/// The longest wait between retries.
pub const MAX: Duration = Duration::from_secs(300);

/// FIRST * 2^(n-1) after the `n`th consecutive failure, at most MAX, for
/// ever; no jitter (each Service's failures come at their own times).
fn backoff() -> backon::ExponentialBackoff {
    backon::ExponentialBuilder::default()
        .with_min_delay(FIRST)
        .with_max_delay(MAX)
        .with_factor(2.0)
        .without_max_times()
        .build()
}

/// One Service's consecutive failures and where its backoff is (kept in
/// its row of the [`crate::table::ServiceTable`]).
#[derive(Debug)]
pub(crate) struct Backoff {
    failures: u32,
    delays: backon::ExponentialBackoff,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            failures: 0,
            delays: backoff(),
        }
    }
}

impl Backoff {
    /// Records a failure; the delay before the next retry.
    pub(crate) fn fail(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        // Never None without a maximum number of retries.
        self.delays.next().unwrap_or(MAX)
    }

    /// Consecutive failures so far.
    pub(crate) fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap() {
        let mut b = Backoff::default();
        let all: Vec<Duration> = (0..100).map(|_| b.fail()).collect();
        assert_eq!(all[..4], [FIRST, FIRST * 2, FIRST * 4, FIRST * 8]);
        assert!(all.windows(2).all(|w| w[0] <= w[1]), "{all:?}");
        // 500 ms * 2^9 = 256 s, then the cap.
        assert_eq!(all[9], Duration::from_secs(256));
        assert!(all[10..].iter().all(|d| *d == MAX), "{all:?}");
        assert_eq!(b.failures(), 100);
    }
}
