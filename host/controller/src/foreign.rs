//! Slices under names we wanted that belong to someone else.
//!
//! portwise's slice watch selects only slices carrying its own managed-by
//! label, so a slice another manager holds under a name the planner wants
//! is not in the cache. The planner would take the name for free, and the
//! writer creates a name its view does not hold: the apiserver refuses it
//! with 409 (AlreadyExists). After such a refusal the writer GETs the
//! object once and remembers it here; the view the planner reads
//! ([`crate::apply::SliceWriter::overlay`]) then shows it, so the retry
//! reports the `EndpointSliceNameCollision` and picks the next name,
//! exactly as when the cache held every slice.
//!
//! An entry is kept for [`FOREIGN_FOR`]; after that the name is tried again
//! (one refused create and one GET per collision and period), which is also
//! how a name its holder gave up becomes usable.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::api::discovery::v1::EndpointSlice;

/// How long a learned foreign slice stands in for the cache.
pub const FOREIGN_FOR: Duration = Duration::from_secs(300);

/// (namespace, name) -> the foreign slice and when it was fetched.
type Held = HashMap<(String, String), (Arc<EndpointSlice>, Instant)>;

#[derive(Debug, Default)]
pub struct Foreign(Mutex<Held>);

impl Foreign {
    pub fn remember(&self, ns: &str, name: &str, slice: EndpointSlice) {
        self.0.lock().unwrap().insert(
            (ns.to_string(), name.to_string()),
            (Arc::new(slice), Instant::now()),
        );
    }

    /// The remembered holder of `ns/name`, unless expired.
    pub fn get(&self, ns: &str, name: &str) -> Option<Arc<EndpointSlice>> {
        let mut all = self.0.lock().unwrap();
        let key = (ns.to_string(), name.to_string());
        match all.get(&key) {
            Some((s, at)) if at.elapsed() <= FOREIGN_FOR => Some(s.clone()),
            Some(_) => {
                all.remove(&key);
                None
            }
            None => None,
        }
    }

    /// The cache (or our own write) shows `ns/name`: it is no longer needed.
    pub fn forget(&self, ns: &str, name: &str) {
        let mut all = self.0.lock().unwrap();
        if !all.is_empty() {
            all.remove(&(ns.to_string(), name.to_string()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_until_forgotten() {
        let f = Foreign::default();
        assert!(f.get("ns", "a").is_none());
        f.remember("ns", "a", EndpointSlice::default());
        assert!(f.get("ns", "a").is_some());
        assert!(f.get("other", "a").is_none());
        f.forget("ns", "a");
        assert!(f.get("ns", "a").is_none());
        assert!(f.0.lock().unwrap().is_empty());
    }
}
