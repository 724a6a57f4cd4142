//! Dating a slice write: the `endpoints.kubernetes.io/last-change-trigger-time`
//! annotation, which kube-proxy
//! (`kubeproxy_network_programming_duration_seconds`) and CoreDNS
//! (`coredns_kubernetes_dns_programming_duration_seconds`) subtract from the
//! time they programmed the change.
//!
//! The native controller (`TriggerTimeTracker` in
//! `pkg/controller/util/endpoint/trigger_time_tracker.go`, and
//! `addTriggerTimeAnnotation` in `k8s.io/endpointslice`) dates a sync by the
//! earliest Ready `lastTransitionTime` among the Service's pods whose value
//! changed since its previous sync, or by the Service's `creationTimestamp`
//! when it sees the Service for the first time; it puts that time on every
//! slice it creates or updates in the sync (a zero time removes the
//! annotation), formatted `time.RFC3339Nano` in UTC.
//!
//! portwise follows the same rule, per slice rather than per Service, since
//! one pod's change may concern one port and not another:
//! - Only a write that changes a slice's endpoints (or its port, or creates
//!   it) sets the annotation; consumers only look at it then. A write for
//!   labels or owner references alone keeps the live value, and slices that
//!   need no write are not written at all.
//! - A Service published for the first time (no slice of ours exists):
//!   every slice is dated by the Service's `creationTimestamp`.
//! - Otherwise a slice is dated by the earliest of the changes it publishes:
//!   the endpoints it adds, drops or alters compared with what the live
//!   slices of its (port, family) show (an endpoint moving between slices
//!   of one set is no change). Each is dated by its pod's Ready
//!   `lastTransitionTime` if that changed since the previous sync of the
//!   Service ([`TriggerMemory`]; a pod not seen then counts), as natively.
//!   A change with no such time (a probe result, a port-names annotation, a
//!   guest's verdict, a deleted pod, a node's zone, a Service edit) is
//!   dated by the time portwise observed it: the start of the reconcile
//!   that publishes it ([`Triggers::observed`]), a lower bound of the true
//!   latency.
//! - Nothing to date (endpoints only moved between slices): no annotation,
//!   and a live one is removed, as natively, so consumers do not measure a
//!   latency from an old change.
//!
//! No clock is read here: the shell passes the observation time in, and
//! keeps the memory between syncs.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{Pod, Service},
    jiff::{Timestamp, tz::TimeZone},
};

/// The annotation (`v1.EndpointsLastChangeTriggerTime`).
pub const TRIGGER_TIME_ANNOTATION: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// A pod's trigger time, as native `getPodTriggerTime`: its Ready
/// condition's `lastTransitionTime`.
pub fn pod_trigger_time(pod: &Pod) -> Option<Timestamp> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?
        .last_transition_time
        .as_ref()
        .map(|t| t.0)
}

/// A Service's trigger time, as native `getServiceTriggerTime`: its
/// `creationTimestamp`.
pub fn service_trigger_time(svc: &Service) -> Option<Timestamp> {
    svc.metadata.creation_timestamp.as_ref().map(|t| t.0)
}

/// `t` as Go's `t.UTC().Format(time.RFC3339Nano)`: seconds, then a
/// fraction without trailing zeros (none when whole), then `Z`.
pub fn format_trigger_time(t: Timestamp) -> String {
    let dt = TimeZone::UTC.to_datetime(t);
    let mut s = format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
        dt.year(),
        dt.month(),
        dt.day(),
        dt.hour(),
        dt.minute(),
        dt.second()
    );
    let nanos = dt.subsec_nanosecond();
    if nanos != 0 {
        let frac = format!("{nanos:09}");
        s.push('.');
        s.push_str(frac.trim_end_matches('0'));
    }
    s.push('Z');
    s
}

/// What a Service's previous sync saw: each pod's trigger time, by pod
/// name (native `ServiceState.lastPodTriggerTimes`). Kept by the shell per
/// Service, between syncs; dropped with the Service.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TriggerMemory {
    pods: BTreeMap<String, Timestamp>,
}

static NOTHING_SEEN: TriggerMemory = TriggerMemory {
    pods: BTreeMap::new(),
};

impl TriggerMemory {
    /// The memory of a Service never synced: every pod's time is new.
    pub fn empty() -> &'static TriggerMemory {
        &NOTHING_SEEN
    }

    /// The trigger time seen for `pod`.
    pub fn get(&self, pod: &str) -> Option<Timestamp> {
        self.pods.get(pod).copied()
    }

    pub fn len(&self) -> usize {
        self.pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// This sync's view of `pods`: the pods whose trigger time is new since
    /// this memory (later than what it holds, or not held), and the memory
    /// to keep for the next sync.
    fn advance<'p>(
        &self,
        pods: impl IntoIterator<Item = &'p Pod>,
    ) -> (BTreeMap<String, Timestamp>, TriggerMemory) {
        let mut fresh = BTreeMap::new();
        let mut next = TriggerMemory::default();
        for pod in pods {
            let (Some(name), Some(t)) = (pod.metadata.name.as_deref(), pod_trigger_time(pod))
            else {
                continue;
            };
            if next.pods.insert(name.to_string(), t).is_some() {
                continue;
            }
            if self.get(name).is_none_or(|seen| t > seen) {
                fresh.insert(name.to_string(), t);
            }
        }
        (fresh, next)
    }
}

/// What the planner needs to date its writes.
#[derive(Clone, Copy, Debug)]
pub struct Triggers<'a> {
    /// What the previous sync of this Service saw.
    pub previous: &'a TriggerMemory,
    /// When this sync began to observe (the shell's clock): dates the
    /// changes that carry no time of their own. `None`: such changes are
    /// not dated.
    pub observed: Option<Timestamp>,
}

impl Triggers<'static> {
    /// Nothing remembered, no observation time: only Ready transitions and
    /// Service creation date a write.
    pub fn none() -> Self {
        Self {
            previous: TriggerMemory::empty(),
            observed: None,
        }
    }
}

/// The dates of one plan's changes.
#[derive(Debug)]
pub(crate) struct Dating {
    /// Set when the Service is published for the first time: its creation.
    first: Option<Timestamp>,
    /// Pods whose trigger time is new since the previous sync.
    fresh: BTreeMap<String, Timestamp>,
    observed: Option<Timestamp>,
}

impl Dating {
    /// `pods`: every pod judged in this sync. `first_publication`: no slice
    /// of ours exists for the Service. Also returns the memory to keep.
    pub(crate) fn new<'p>(
        svc: &Service,
        triggers: Triggers,
        pods: impl IntoIterator<Item = &'p Pod>,
        first_publication: bool,
    ) -> (Self, TriggerMemory) {
        let (fresh, next) = triggers.previous.advance(pods);
        let dating = Dating {
            first: service_trigger_time(svc).filter(|_| first_publication),
            fresh,
            observed: triggers.observed,
        };
        (dating, next)
    }

    /// The trigger time of a slice write that changes endpoints, publishing
    /// changes of the pods `changed` (with repeats): the earliest of their
    /// dates. `None`: nothing to date.
    pub(crate) fn date<'a>(&self, changed: impl IntoIterator<Item = &'a str>) -> Option<Timestamp> {
        if self.first.is_some() {
            return self.first;
        }
        changed
            .into_iter()
            .filter_map(|pod| self.fresh.get(pod).copied().or(self.observed))
            .min()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::{PodCondition, PodStatus},
        apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    };

    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn pod(name: &str, ready_since: Option<&str>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            status: Some(PodStatus {
                conditions: Some(vec![
                    PodCondition {
                        type_: "ContainersReady".into(),
                        status: "True".into(),
                        last_transition_time: Some(Time(at("2020-01-01T00:00:00Z"))),
                        ..Default::default()
                    },
                    PodCondition {
                        type_: "Ready".into(),
                        status: "True".into(),
                        last_transition_time: ready_since.map(|s| Time(at(s))),
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn svc(created: Option<&str>) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("web".into()),
                creation_timestamp: created.map(|s| Time(at(s))),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn format_is_go_rfc3339nano_in_utc() {
        let cases = [
            ("2026-03-04T05:06:07Z", "2026-03-04T05:06:07Z"),
            ("2026-03-04T05:06:07.5Z", "2026-03-04T05:06:07.5Z"),
            ("2026-03-04T05:06:07.120Z", "2026-03-04T05:06:07.12Z"),
            (
                "2026-03-04T05:06:07.000000001Z",
                "2026-03-04T05:06:07.000000001Z",
            ),
            (
                "2026-03-04T05:06:07.123456789Z",
                "2026-03-04T05:06:07.123456789Z",
            ),
            // Offsets are converted to UTC.
            ("2026-03-04T07:06:07+02:00", "2026-03-04T05:06:07Z"),
            ("0999-12-31T23:59:59Z", "0999-12-31T23:59:59Z"),
            ("1969-12-31T23:59:59.25Z", "1969-12-31T23:59:59.25Z"),
        ];
        for (input, want) in cases {
            let t = at(input);
            assert_eq!(format_trigger_time(t), want, "{input}");
            assert_eq!(at(want), t, "{want} reads back as {input}");
        }
    }

    #[test]
    fn pod_trigger_is_the_ready_transition() {
        assert_eq!(
            pod_trigger_time(&pod("a", Some("2026-01-01T10:00:00Z"))),
            Some(at("2026-01-01T10:00:00Z"))
        );
        // ContainersReady does not count; no Ready time, no trigger.
        assert_eq!(pod_trigger_time(&pod("a", None)), None);
        assert_eq!(pod_trigger_time(&Pod::default()), None);
    }

    #[test]
    fn earliest_of_the_changed_triggers() {
        let previous = TriggerMemory::empty();
        let pods = [
            pod("a", Some("2026-01-01T10:00:03Z")),
            pod("b", Some("2026-01-01T10:00:01Z")),
            pod("c", Some("2026-01-01T10:00:02Z")),
        ];
        let triggers = Triggers {
            previous,
            observed: Some(at("2026-01-01T10:00:09Z")),
        };
        let (dating, memory) = Dating::new(&svc(None), triggers, &pods, false);
        assert_eq!(
            dating.date(["a", "c"]),
            Some(at("2026-01-01T10:00:02Z")),
            "earliest of the pods this slice changes"
        );
        assert_eq!(
            dating.date(["a", "b", "c"]),
            Some(at("2026-01-01T10:00:01Z"))
        );
        assert_eq!(memory.len(), 3);
        assert_eq!(memory.get("b"), Some(at("2026-01-01T10:00:01Z")));
    }

    #[test]
    fn only_triggers_that_changed_since_the_previous_sync_count() {
        let before = [
            pod("a", Some("2026-01-01T10:00:00Z")),
            pod("b", Some("2026-01-01T10:00:00Z")),
        ];
        let (_, memory) = Dating::new(&svc(None), Triggers::none(), &before, false);
        // `a` flips again later; `b` is unchanged; `c` is new.
        let now = [
            pod("a", Some("2026-01-01T10:05:00Z")),
            pod("b", Some("2026-01-01T10:00:00Z")),
            pod("c", Some("2026-01-01T10:04:00Z")),
        ];
        let observed = at("2026-01-01T10:06:00Z");
        let triggers = Triggers {
            previous: &memory,
            observed: Some(observed),
        };
        let (dating, next) = Dating::new(&svc(None), triggers, &now, false);
        assert_eq!(dating.date(["a"]), Some(at("2026-01-01T10:05:00Z")));
        assert_eq!(dating.date(["c"]), Some(at("2026-01-01T10:04:00Z")));
        // `b`'s change has no new time of its own: portwise's observation.
        assert_eq!(dating.date(["b"]), Some(observed));
        assert_eq!(dating.date(["a", "b"]), Some(at("2026-01-01T10:05:00Z")));
        // A deleted pod (not judged any more) is dated by the observation.
        assert_eq!(dating.date(["gone"]), Some(observed));
        assert_eq!(next.get("a"), Some(at("2026-01-01T10:05:00Z")));

        // The same state again: nothing is new.
        let (dating, again) = Dating::new(
            &svc(None),
            Triggers {
                previous: &next,
                observed: None,
            },
            &now,
            false,
        );
        assert_eq!(dating.date(["a", "b", "c"]), None);
        assert_eq!(again, next);
    }

    #[test]
    fn none_when_nothing_changed() {
        let (dating, _) = Dating::new(
            &svc(Some("2026-01-01T09:00:00Z")),
            Triggers {
                previous: TriggerMemory::empty(),
                observed: Some(at("2026-01-01T10:00:00Z")),
            },
            &[pod("a", Some("2026-01-01T10:00:00Z"))],
            false,
        );
        assert_eq!(dating.date([]), None, "endpoints only moved");
    }

    #[test]
    fn a_new_service_is_dated_by_its_creation() {
        let created = at("2026-01-01T09:00:00Z");
        let (dating, memory) = Dating::new(
            &svc(Some("2026-01-01T09:00:00Z")),
            Triggers {
                previous: TriggerMemory::empty(),
                observed: Some(at("2026-01-01T10:00:00Z")),
            },
            &[pod("a", Some("2026-01-01T08:00:00Z"))],
            true,
        );
        assert_eq!(dating.date(["a"]), Some(created));
        assert_eq!(dating.date([]), Some(created), "also an empty placeholder");
        assert_eq!(memory.get("a"), Some(at("2026-01-01T08:00:00Z")));
        // Without a creationTimestamp, the pods' rule applies.
        let (dating, _) = Dating::new(
            &svc(None),
            Triggers::none(),
            &[pod("a", Some("2026-01-01T08:00:00Z"))],
            true,
        );
        assert_eq!(dating.date(["a"]), Some(at("2026-01-01T08:00:00Z")));
    }

    #[test]
    fn an_earlier_time_than_remembered_is_not_new() {
        let (_, memory) = Dating::new(
            &svc(None),
            Triggers::none(),
            &[pod("a", Some("2026-01-01T10:00:00Z"))],
            false,
        );
        let (dating, _) = Dating::new(
            &svc(None),
            Triggers {
                previous: &memory,
                observed: None,
            },
            &[pod("a", Some("2026-01-01T09:00:00Z"))],
            false,
        );
        assert_eq!(dating.date(["a"]), None);
    }
}
