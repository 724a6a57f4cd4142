//! Our own writes coming back through the slice watch.
//!
//! Every apply and delete portwise makes returns as a watch event on its
//! own slices. Left alone, that event triggers another reconcile of the
//! Service, which finds nothing to do: one wasted reconcile per write, so
//! a cold start reconciles every Service twice. The native controller's
//! `EndpointSliceTracker` recognises its own writes (by generation) and
//! skips them; this does the same, by uid and resourceVersion, which is
//! stricter: a change by anyone else, even one that leaves the generation
//! alone (annotations), has another resourceVersion and still triggers, so
//! drift is repaired as before.
//!
//! One mark per slice name, replaced by each write: bounded by the slices
//! we hold. A delete's mark is dropped when its event comes; an apply's
//! when the slice is deleted (by anyone).
//!
//! The watch event of a write can arrive before the write's response (the
//! apiserver sends both once etcd has it), so a write in flight is marked
//! as such: an event for its name waits for the response, then is judged
//! ([`Echoes::settled`]).

use std::{collections::HashMap, sync::Mutex};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;

/// What we last did under one name.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Mark {
    /// Applied: the object as the apiserver returned it.
    Applied {
        uid: Option<String>,
        resource_version: Option<String>,
    },
    /// Deleted the object with this uid.
    Deleted { uid: Option<String> },
}

/// Our last write per slice, by (namespace, name), and the writes in
/// flight.
#[derive(Debug, Default)]
pub struct Echoes {
    marks: Mutex<HashMap<(String, String), Mark>>,
    in_flight: Mutex<HashMap<(String, String), usize>>,
    /// Our writes the watch has shown (uid, resourceVersion), kept past a
    /// deletion by someone else: the writer's overlay learns from it that
    /// a slice missing from the cache was there and is gone, not still on
    /// its way ([`Echoes::shown`]). The echo reconcile used to teach it
    /// that. Pruned by age.
    shown: Mutex<HashMap<(String, String), Shown>>,
    /// Woken whenever a write in flight ends.
    landed: tokio::sync::Notify,
}

/// A write the watch showed: its uid, its resourceVersion, and when.
type Shown = (Option<String>, String, std::time::Instant);

/// How long a shown write is remembered: longer than the writer's overlay
/// keeps a write (60 s), after which it trusts the cache anyway.
const SHOWN_FOR: std::time::Duration = std::time::Duration::from_secs(120);

/// How long an event waits for the response of a write in flight to its
/// name before it is taken as someone else's (and reconciled).
const WAIT_FOR_RESPONSE: std::time::Duration = std::time::Duration::from_secs(5);

fn key(slice: &EndpointSlice) -> (String, String) {
    (slice.namespace().unwrap_or_default(), slice.name_any())
}

impl Echoes {
    /// Marks a write to `ns/name` in flight until the returned guard is
    /// dropped (after its response has been recorded, or it failed).
    pub fn writing(&self, ns: &str, name: &str) -> InFlight<'_> {
        let key = (ns.to_string(), name.to_string());
        *self.flights().entry(key.clone()).or_default() += 1;
        InFlight { echoes: self, key }
    }

    /// Waits (at most a few seconds) until no write to `slice`'s name is in
    /// flight, so that its response is recorded before the event is judged.
    pub async fn settled(&self, slice: &EndpointSlice) {
        let key = key(slice);
        let wait = async {
            loop {
                let landed = self.landed.notified();
                if !self.flights().contains_key(&key) {
                    return;
                }
                landed.await;
            }
        };
        let _ = tokio::time::timeout(WAIT_FOR_RESPONSE, wait).await;
    }

    /// Whether a write to `slice`'s name is in flight.
    pub fn in_flight(&self, slice: &EndpointSlice) -> bool {
        self.flights().contains_key(&key(slice))
    }

    fn flights(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), usize>> {
        self.in_flight.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records an apply, as the apiserver answered it.
    pub fn applied(&self, written: &EndpointSlice) {
        self.lock().insert(
            key(written),
            Mark::Applied {
                uid: written.uid(),
                resource_version: written.resource_version(),
            },
        );
    }

    /// Records the delete of `name`'s object `uid`.
    pub fn deleted(&self, ns: &str, name: &str, uid: Option<String>) {
        self.lock()
            .insert((ns.to_string(), name.to_string()), Mark::Deleted { uid });
    }

    /// Whether a watch event that shows `slice` as it is now reflects
    /// only our last apply of it (nothing to reconcile).
    pub fn is_our_apply(&self, slice: &EndpointSlice) -> bool {
        let Some(version) = slice.resource_version() else {
            return false;
        };
        let ours = self.lock().get(&key(slice))
            == Some(&Mark::Applied {
                uid: slice.uid(),
                resource_version: Some(version.clone()),
            });
        if ours {
            let mut shown = self.shown.lock().unwrap_or_else(|e| e.into_inner());
            if shown.len() > 1024 {
                shown.retain(|_, (_, _, at)| at.elapsed() < SHOWN_FOR);
            }
            shown.insert(
                key(slice),
                (slice.uid(), version, std::time::Instant::now()),
            );
        }
        ours
    }

    /// Whether the watch has shown our write `mine` of its name (so its
    /// absence from the cache now means it was deleted, or left our
    /// selector, since).
    pub fn shown(&self, mine: &EndpointSlice) -> bool {
        let (Some(version), shown) = (
            mine.resource_version(),
            self.shown.lock().unwrap_or_else(|e| e.into_inner()),
        ) else {
            return false;
        };
        shown
            .get(&key(mine))
            .is_some_and(|(uid, rv, _)| *uid == mine.uid() && *rv == version)
    }

    /// Whether a delete event of `slice` is our own delete coming back.
    /// The mark goes either way: the name is free again.
    pub fn is_our_delete(&self, slice: &EndpointSlice) -> bool {
        let ours = self.lock().remove(&key(slice));
        slice.uid().is_some() && ours == Some(Mark::Deleted { uid: slice.uid() })
    }

    /// Marks held.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Mark>> {
        // A mark only saves a reconcile; a panic elsewhere cannot make one
        // wrong in a way that loses a write.
        self.marks.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A write in flight ([`Echoes::writing`]).
pub struct InFlight<'a> {
    echoes: &'a Echoes,
    key: (String, String),
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut flights = self.echoes.flights();
        if let Some(n) = flights.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                flights.remove(&self.key);
            }
        }
        drop(flights);
        self.echoes.landed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    fn slice(name: &str, uid: &str, rv: &str) -> EndpointSlice {
        EndpointSlice {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                uid: Some(uid.into()),
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            address_type: "IPv4".into(),
            endpoints: None,
            ports: None,
        }
    }

    #[test]
    fn our_apply_is_an_echo_and_anyone_elses_change_is_not() {
        let e = Echoes::default();
        let ours = slice("web-1", "u1", "10");
        assert!(!e.is_our_apply(&ours), "nothing written yet");
        e.applied(&ours);
        assert!(e.is_our_apply(&ours));
        // Someone else wrote after us: another resourceVersion.
        assert!(!e.is_our_apply(&slice("web-1", "u1", "11")));
        // The name re-created by someone else: another uid.
        assert!(!e.is_our_apply(&slice("web-1", "u2", "10")));
        assert!(!e.is_our_apply(&slice("web-2", "u1", "10")));
    }

    /// An event that overtakes its write's response waits for it, and is
    /// then recognised.
    #[tokio::test]
    async fn an_event_ahead_of_its_response_waits_for_it() {
        let e = std::sync::Arc::new(Echoes::default());
        let ours = slice("web-1", "u1", "10");
        let flight = e.writing("ns", "web-1");
        assert!(e.in_flight(&ours));
        let waiter = tokio::spawn({
            let (e, ours) = (e.clone(), ours.clone());
            async move {
                e.settled(&ours).await;
                e.is_our_apply(&ours)
            }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "it did not wait for the response");
        e.applied(&ours);
        drop(flight);
        assert!(waiter.await.unwrap(), "recognised once the response landed");
        assert!(!e.in_flight(&ours));
    }

    #[test]
    fn our_delete_is_an_echo_once_and_a_delete_by_others_is_not() {
        let e = Echoes::default();
        e.deleted("ns", "web-1", Some("u1".into()));
        assert!(e.is_our_delete(&slice("web-1", "u1", "12")));
        assert!(!e.is_our_delete(&slice("web-1", "u1", "12")), "consumed");
        assert_eq!(e.len(), 0);
        // Applied by us, deleted by the garbage collector: not ours, and
        // the mark goes.
        e.applied(&slice("web-2", "u3", "5"));
        assert!(!e.is_our_delete(&slice("web-2", "u3", "6")));
        assert_eq!(e.len(), 0);
    }
}
