//! The `last-change-trigger-time` annotation on the writes of a plan
//! (`trigger.rs` holds the rule's own tests).

use k8s_openapi::{
    api::core::v1::{PodCondition, PodStatus},
    jiff::Timestamp,
};

use super::*;

const CREATED: &str = "2026-01-01T09:00:00Z";
const READY: &str = "2026-01-01T09:30:00Z";
const OBSERVED: &str = "2026-01-01T10:00:00.25Z";

fn at(s: &str) -> Timestamp {
    s.parse().unwrap()
}

/// `http` and `admin`, created at [`CREATED`].
fn svc() -> Service {
    let mut svc = service(
        "web",
        vec![port("http", 80, num(8080)), port("admin", 90, num(9090))],
        &["IPv4"],
    );
    svc.metadata.creation_timestamp = Some(Time(at(CREATED)));
    svc
}

fn with_ready(mut p: Pod, ready: bool, since: &str) -> Pod {
    let status = p.status.get_or_insert_with(PodStatus::default);
    status.conditions = Some(vec![PodCondition {
        type_: "Ready".into(),
        status: if ready { "True" } else { "False" }.into(),
        last_transition_time: Some(Time(at(since))),
        ..Default::default()
    }]);
    p
}

/// `admin`'s pods: a slice of their own, apart from `http`'s.
const ADMIN: [&str; 3] = ["d", "e", "f"];

/// `http`'s pods (name, ready, since), then `admin`'s, ready.
fn pods(ready: &[(&str, bool, &str)]) -> Vec<Arc<Pod>> {
    pods_of(ready, &ADMIN)
}

fn pods_of(ready: &[(&str, bool, &str)], admin: &[&str]) -> Vec<Arc<Pod>> {
    ready
        .iter()
        .copied()
        .chain(admin.iter().map(|n| (*n, true, READY)))
        .enumerate()
        .map(|(i, (n, r, since))| {
            let ip = format!("10.244.0.{}", i + 1);
            Arc::new(with_ready(pod(n, &[&ip], 8080), r, since))
        })
        .collect()
}

/// `http` takes its pods that are ready; `admin` its pods but
/// `excluded`. No pod backs both, so each port has a slice of its own.
fn verdicts(svc: &Service, pods: &[Arc<Pod>], excluded: &[&str]) -> Vec<Judged> {
    judge(svc, pods, |p, port, _| {
        let name = p.metadata.name.as_deref().unwrap();
        let yes = match port {
            _ if ADMIN.contains(&name) != (port == "admin") => false,
            "http" => p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
            _ => !excluded.contains(&name),
        };
        if yes {
            Decision::Include
        } else {
            Decision::Exclude
        }
    })
}

fn observed(previous: &TriggerMemory) -> Triggers<'_> {
    Triggers {
        previous,
        observed: Some(at(OBSERVED)),
    }
}

fn applied<'p>(plan: &'p Plan, name: &str) -> &'p EndpointSlice {
    plan.applies
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("{name} not written: {:?}", names(plan)))
}

fn annotation(s: &EndpointSlice) -> Option<&str> {
    s.metadata
        .annotations
        .as_ref()?
        .get(TRIGGER_TIME_ANNOTATION)
        .map(String::as_str)
}

/// A world where `web` was published (dated by its creation) and the
/// memory its plan left.
fn published() -> (Service, World, TriggerMemory) {
    let svc = svc();
    let pods = pods(&[("a", true, READY), ("b", true, READY), ("c", true, READY)]);
    let mut w = World::default();
    let plan = w.plan_dated(
        &svc,
        &verdicts(&svc, &pods, &[]),
        100,
        observed(TriggerMemory::empty()),
    );
    w.apply(&plan);
    (svc, w, plan.trigger_memory)
}

#[test]
fn a_new_service_is_dated_by_its_creation() {
    let (_, w, memory) = published();
    for name in ["web-http", "web-admin"] {
        assert_eq!(annotation(w.get(name)), Some(CREATED), "{name}");
    }
    assert_eq!(memory.len(), 6);
}

#[test]
fn a_readiness_flip_dates_only_the_slice_it_changes() {
    let (svc, mut w, memory) = published();
    // Steady: nothing to write, the memory stays.
    let pods_now = pods(&[("a", true, READY), ("b", true, READY), ("c", true, READY)]);
    let again = w.plan_dated(
        &svc,
        &verdicts(&svc, &pods_now, &[]),
        100,
        observed(&memory),
    );
    assert!(again.applies.is_empty() && again.deletes.is_empty());
    assert_eq!(again.trigger_memory, memory);

    // b turns unready at 09:45: only http changes, dated by that.
    let flipped = "2026-01-01T09:45:00Z";
    let pods_now = pods(&[
        ("a", true, READY),
        ("b", false, flipped),
        ("c", true, READY),
    ]);
    let plan = w.plan_dated(
        &svc,
        &verdicts(&svc, &pods_now, &[]),
        100,
        observed(&memory),
    );
    assert_eq!(names(&plan), vec!["web-http"]);
    assert_eq!(annotation(&plan.applies[0]), Some(flipped));
    w.apply(&plan);
    assert_eq!(
        annotation(w.get("web-admin")),
        Some(CREATED),
        "the untouched slice keeps its value"
    );
    // Re-planning the same state writes nothing.
    let memory = plan.trigger_memory;
    let again = w.plan_dated(
        &svc,
        &verdicts(&svc, &pods_now, &[]),
        100,
        observed(&memory),
    );
    assert!(again.applies.is_empty(), "{:?}", names(&again));

    // Back at 09:50 and, in the same plan, f leaves admin for a reason
    // without a time of its own: each slice gets its own date.
    let back = "2026-01-01T09:50:00Z";
    let pods_now = pods(&[("a", true, READY), ("b", true, back), ("c", true, READY)]);
    let plan = w.plan_dated(
        &svc,
        &verdicts(&svc, &pods_now, &["f"]),
        100,
        observed(&memory),
    );
    assert_eq!(names(&plan), vec!["web-http", "web-admin"]);
    assert_eq!(annotation(applied(&plan, "web-admin")), Some(OBSERVED));
    assert_eq!(annotation(applied(&plan, "web-http")), Some(back));
}

#[test]
fn earliest_change_of_the_slice_wins() {
    let (svc, w, memory) = published();
    let pods_now = pods(&[
        ("a", false, "2026-01-01T09:47:00Z"),
        ("b", false, "2026-01-01T09:46:00Z"),
        ("c", true, READY),
    ]);
    let plan = w.plan_dated(
        &svc,
        &verdicts(&svc, &pods_now, &[]),
        100,
        observed(&memory),
    );
    assert_eq!(names(&plan), vec!["web-http"]);
    assert_eq!(annotation(&plan.applies[0]), Some("2026-01-01T09:46:00Z"));
}

#[test]
fn without_a_time_nothing_is_dated() {
    // No observation time and no Ready transition since the last plan:
    // the change is published without the annotation (the live one is
    // removed, so consumers do not date it by an older change).
    let (svc, w, memory) = published();
    let pods_now = pods(&[("a", true, READY), ("b", true, READY), ("c", true, READY)]);
    let plan = w.plan_dated(
        &svc,
        &verdicts(&svc, &pods_now, &["d"]),
        100,
        Triggers {
            previous: &memory,
            observed: None,
        },
    );
    assert_eq!(names(&plan), vec!["web-admin"]);
    assert_eq!(annotation(&plan.applies[0]), None);
    let mut w = w;
    w.apply(&plan);
    assert_eq!(annotation(w.get("web-admin")), None);
}

#[test]
fn a_write_for_labels_only_keeps_the_live_value() {
    let (mut svc, w, memory) = published();
    svc.metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert("tier".into(), "front".into());
    let pods_now = pods(&[("a", true, READY), ("b", true, READY), ("c", true, READY)]);
    let plan = w.plan_dated(
        &svc,
        &verdicts(&svc, &pods_now, &[]),
        100,
        observed(&memory),
    );
    assert_eq!(names(&plan), vec!["web-admin", "web-http"]);
    for s in &plan.applies {
        assert_eq!(annotation(s), Some(CREATED));
        assert_eq!(s.metadata.labels.as_ref().unwrap()["tier"], "front");
    }
}

#[test]
fn endpoints_that_only_move_between_slices_are_not_dated() {
    let (svc, w, memory) = published();
    let pods_now = pods(&[("a", true, READY), ("b", true, READY), ("c", true, READY)]);
    // maxEndpointsPerSlice lowered: endpoints move, no membership changes.
    let plan = w.plan_dated(&svc, &verdicts(&svc, &pods_now, &[]), 2, observed(&memory));
    assert!(!plan.applies.is_empty());
    for s in &plan.applies {
        assert_eq!(annotation(s), None, "{:?}", s.metadata.name);
    }
}

#[test]
fn the_annotation_alone_never_causes_a_write() {
    let (svc, mut w, memory) = published();
    // Someone rewrites the value (ours, as managedFields says).
    let mut edited = (*w.slices["web-http"]).clone();
    edited.metadata.annotations = Some(BTreeMap::from([(
        TRIGGER_TIME_ANNOTATION.to_string(),
        "2000-01-01T00:00:00Z".to_string(),
    )]));
    edited.metadata.managed_fields = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry {
            manager: Some(MANAGER.into()),
            operation: Some("Apply".into()),
            fields_v1: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1(
                serde_json::json!({"f:metadata": {"f:annotations": {
                    format!("f:{TRIGGER_TIME_ANNOTATION}"): {}
                }}}),
            )),
            ..Default::default()
        },
    ]);
    w.slices.insert("web-http".into(), Arc::new(edited.clone()));
    let pods_now = pods(&[("a", true, READY), ("b", true, READY), ("c", true, READY)]);
    let judged = verdicts(&svc, &pods_now, &[]);
    assert!(
        w.plan_dated(&svc, &judged, 100, observed(&memory))
            .applies
            .is_empty()
    );
    // And removed: still nothing to write.
    edited.metadata.annotations = None;
    w.slices.insert("web-http".into(), Arc::new(edited));
    assert!(
        w.plan_dated(&svc, &judged, 100, observed(&memory))
            .applies
            .is_empty()
    );
}

#[test]
fn a_deleted_pod_is_dated_by_the_observation() {
    let (svc, w, memory) = published();
    let pods_now = pods_of(&[("a", true, READY), ("b", true, READY)], &["d", "e"]);
    let plan = w.plan_dated(
        &svc,
        &verdicts(&svc, &pods_now, &[]),
        100,
        observed(&memory),
    );
    assert_eq!(names(&plan), vec!["web-admin", "web-http"]);
    for s in &plan.applies {
        assert_eq!(annotation(s), Some(OBSERVED));
    }
    assert_eq!(plan.trigger_memory.get("c"), None, "forgotten with the pod");
    assert_eq!(plan.trigger_memory.get("f"), None, "forgotten with the pod");
}
