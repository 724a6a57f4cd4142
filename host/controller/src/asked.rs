//! When a pod change first asked for a Service's reconcile, so that the
//! reconcile's profile can tell how long the request waited before a
//! reconcile took it up (a run of the Service under way, then its turn in
//! the queue). Only the first request counts until a reconcile takes it;
//! later ones are served by the same reconcile.
//!
//! One entry per Service with a request outstanding, by its `ns/name` key
//! (the retry backoff's key): taken by its next reconcile, or dropped with
//! the Service.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

#[derive(Debug, Default)]
pub(crate) struct Asked(Mutex<HashMap<String, Instant>>);

impl Asked {
    /// A pod change asks for Service `key`'s reconcile now.
    pub(crate) fn mark(&self, key: String) {
        self.0
            .lock()
            .unwrap()
            .entry(key)
            .or_insert_with(Instant::now);
    }

    /// How long ago the outstanding request for `key` was made, if any; it
    /// is served now (and so forgotten).
    pub(crate) fn take(&self, key: &str) -> Option<Duration> {
        self.0.lock().unwrap().remove(key).map(|at| at.elapsed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_request_counts_until_a_reconcile_takes_it() {
        let asked = Asked::default();
        assert_eq!(asked.take("shop/web"), None);
        asked.mark("shop/web".into());
        std::thread::sleep(Duration::from_millis(20));
        // A later request does not move the first one's time.
        asked.mark("shop/web".into());
        let waited = asked.take("shop/web").expect("asked");
        assert!(waited >= Duration::from_millis(20), "{waited:?}");
        // Taken: the next reconcile was not asked for by a pod.
        assert_eq!(asked.take("shop/web"), None);
    }
}
