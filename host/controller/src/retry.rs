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

/// The first retry's delay.
pub const FIRST: Duration = Duration::from_millis(500);
/// The longest wait between retries.
pub const MAX: Duration = Duration::from_secs(300);

/// Consecutive failures per Service (`namespace/name`).
#[derive(Debug, Default)]
pub struct Retries(Mutex<HashMap<String, u32>>);

impl Retries {
    /// Records a failure of `key`; the delay before its next retry.
    pub fn failed(&self, key: &str) -> Duration {
        let mut failures = self.0.lock().unwrap();
        let n = failures.entry(key.to_string()).or_default();
        *n = n.saturating_add(1);
        delay(*n)
    }

    /// A successful reconcile (or the Service's deletion) starts over.
    pub fn succeeded(&self, key: &str) {
        self.0.lock().unwrap().remove(key);
    }

    /// Consecutive failures of `key` so far.
    pub fn failures(&self, key: &str) -> u32 {
        self.0.lock().unwrap().get(key).copied().unwrap_or(0)
    }
}

/// The delay after the `n`th consecutive failure (n >= 1):
/// FIRST * 2^(n-1), at most MAX.
pub fn delay(n: u32) -> Duration {
    let doublings = n.saturating_sub(1).min(20);
    FIRST.saturating_mul(1 << doublings).min(MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap() {
        assert_eq!(delay(1), FIRST);
        assert_eq!(delay(2), FIRST * 2);
        assert_eq!(delay(3), FIRST * 4);
        let all: Vec<Duration> = (1..=40).map(delay).collect();
        assert!(all.windows(2).all(|w| w[0] <= w[1]), "{all:?}");
        assert_eq!(*all.last().unwrap(), MAX);
        assert_eq!(delay(u32::MAX), MAX);
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
