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

use std::{collections::HashMap, sync::Mutex, time::Duration};

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

/// One Service's consecutive failures and where its backoff is.
#[derive(Debug)]
struct Failing {
    failures: u32,
    backoff: backon::ExponentialBackoff,
}

/// Consecutive failures per Service (`namespace/name`).
#[derive(Debug, Default)]
pub struct Retries(Mutex<HashMap<String, Failing>>);

impl Retries {
    /// Records a failure of `key`; the delay before its next retry.
    pub fn failed(&self, key: &str) -> Duration {
        let mut failing = self.0.lock().unwrap();
        let f = failing.entry(key.to_string()).or_insert_with(|| Failing {
            failures: 0,
            backoff: backoff(),
        });
        f.failures = f.failures.saturating_add(1);
        // Never None without a maximum number of retries.
        f.backoff.next().unwrap_or(MAX)
    }

    /// A successful reconcile (or the Service's deletion) starts over.
    pub fn succeeded(&self, key: &str) {
        self.0.lock().unwrap().remove(key);
    }

    /// Consecutive failures of `key` so far.
    pub fn failures(&self, key: &str) -> u32 {
        self.0.lock().unwrap().get(key).map_or(0, |f| f.failures)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap() {
        let r = Retries::default();
        let all: Vec<Duration> = (0..100).map(|_| r.failed("ns/a")).collect();
        assert_eq!(all[..4], [FIRST, FIRST * 2, FIRST * 4, FIRST * 8]);
        assert!(all.windows(2).all(|w| w[0] <= w[1]), "{all:?}");
        // 500 ms * 2^9 = 256 s, then the cap.
        assert_eq!(all[9], Duration::from_secs(256));
        assert!(all[10..].iter().all(|d| *d == MAX), "{all:?}");
        assert_eq!(r.failures("ns/a"), 100);
    }

    #[test]
    fn each_service_backs_off_on_its_own_and_success_starts_over() {
        let r = Retries::default();
        assert_eq!(r.failed("ns/a"), FIRST);
        assert_eq!(r.failed("ns/a"), FIRST * 2);
        assert_eq!(r.failed("ns/a"), FIRST * 4);
        // Another Service's failures do not add to a's.
        assert_eq!(r.failed("ns/b"), FIRST);
        assert_eq!(r.failures("ns/a"), 3);
        r.succeeded("ns/a");
        assert_eq!(r.failures("ns/a"), 0);
        assert_eq!(r.failed("ns/a"), FIRST);
        assert_eq!(r.failures("ns/b"), 1);
    }
}
