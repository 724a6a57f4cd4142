//! Every branch of [`decide`], without a cluster.

use std::{cell::Cell, collections::BTreeMap, sync::Arc};

use k8s_openapi::{
    api::{
        core::v1::{Pod, Service},
        discovery::v1::EndpointSlice,
    },
    apimachinery::pkg::apis::meta::v1::{OwnerReference, Time},
};

use super::*;
use crate::{
    config::Config,
    plan::{
        MANAGED_BY_LABEL,
        testutil::{MANAGER, foreign, include_all, num, pod, port, service},
    },
};

const KEY: &str = "app.example.com/group";

fn config(extra: &str) -> Config {
    Config::from_yaml(&format!("serviceKey: {{label: {KEY}}}\n{extra}")).unwrap()
}

/// A keyed, selector-less ClusterIP Service `web` of group `g`.
fn web() -> Service {
    let mut svc = service("web", vec![port("http", 80, num(8080))], &["IPv4"]);
    svc.metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(KEY.into(), "g".into());
    svc
}

fn unkeyed(mut svc: Service) -> Service {
    svc.metadata.labels.as_mut().unwrap().remove(KEY);
    svc
}

fn external_name(mut svc: Service) -> Service {
    let spec = svc.spec.as_mut().unwrap();
    spec.type_ = Some("ExternalName".into());
    spec.external_name = Some("example.com".into());
    svc
}

fn with_selector(mut svc: Service, selector: &[(&str, &str)]) -> Service {
    svc.spec.as_mut().unwrap().selector = Some(
        selector
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    svc
}

fn pods() -> Vec<Arc<Pod>> {
    vec![
        Arc::new(pod("a", &["10.0.0.1"], 8080)),
        Arc::new(pod("b", &["10.0.0.2"], 8080)),
    ]
}

/// A slice of ours for `web`: `foreign` with our manager is ours.
fn ours(name: &str) -> Arc<EndpointSlice> {
    foreign(name, MANAGER, "web", "IPv4")
}

/// What `decide` returned and which lookups it made.
struct Run {
    decision: Decision,
    groups_looked_up: Vec<String>,
    owned_looked_up: usize,
}

fn run(svc: Service, cfg: &Config, owned: Vec<Arc<EndpointSlice>>) -> Run {
    run_with_endpoints(svc, cfg, owned, false)
}

/// [`run`], with an Endpoints object of ours present or not.
fn run_with_endpoints(
    svc: Service,
    cfg: &Config,
    owned: Vec<Arc<EndpointSlice>>,
    has_our_endpoints: bool,
) -> Run {
    let svc = Arc::new(svc);
    let groups = std::cell::RefCell::new(Vec::new());
    let owned_calls = Cell::new(0);
    let pods_in_group = |g: &str| {
        groups.borrow_mut().push(g.to_string());
        pods()
    };
    let owned_fn = || {
        owned_calls.set(owned_calls.get() + 1);
        owned.clone()
    };
    let decision = decide(&Input {
        service: &svc,
        config: cfg,
        pods_in_group: &pods_in_group,
        node_known: &|_| true,
        owned: &owned_fn,
        has_our_endpoints,
        objects: &[],
    });
    Run {
        decision,
        groups_looked_up: groups.into_inner(),
        owned_looked_up: owned_calls.get(),
    }
}

fn released(r: &Run) -> &Release {
    match &r.decision {
        Decision::Release(rel) => rel,
        d => panic!("expected Release, got {d:?}"),
    }
}

fn served(r: &Run) -> &Serve {
    match &r.decision {
        Decision::Serve(s) => s,
        d => panic!("expected Serve, got {d:?}"),
    }
}

#[test]
fn keyed_service_is_served_with_the_subjects_of_its_group() {
    let r = run(web(), &config(""), vec![ours("web-http")]);
    let s = served(&r);
    assert_eq!(s.group, "g");
    assert_eq!(r.groups_looked_up, ["g"]);
    assert_eq!(r.owned_looked_up, 0, "the planner reads owned slices later");
    let subjects: Vec<_> = s
        .subjects
        .iter()
        .map(|s| (s.pod.metadata.name.clone().unwrap(), s.port.target))
        .collect();
    assert_eq!(subjects, [("a".to_string(), 8080), ("b".to_string(), 8080)]);
    assert!(!s.has_selector);
    assert!(!s.forget_migration);
    assert!(s.native_cleanup, "nativeCleanup defaults to true");
    assert!(!s.publish_legacy_endpoints);
    assert_eq!(
        s.warnings,
        Warnings {
            external_name: Once::Rearm,
            selector: Once::Rearm,
            unknown_policy: Once::Rearm,
        }
    );
    assert_eq!(r.decision.requeue(), Requeue::AfterResync);
}

#[test]
fn annotation_key_selects_the_group_too() {
    let cfg = Config::from_yaml(&format!("serviceKey: {{annotation: {KEY}}}\n")).unwrap();
    let mut svc = unkeyed(web());
    svc.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(KEY.into(), "from-annotation".into());
    let r = run(svc.clone(), &cfg, vec![]);
    assert_eq!(served(&r).group, "from-annotation");
    // A label of the same key does not count for an annotation key.
    let r = run(web(), &cfg, vec![]);
    assert_eq!(released(&r).why, Unmanaged::NoKey);
}

#[test]
fn service_without_key_releases_our_slices_and_metrics() {
    let cfg = config("");
    let r = run(
        unkeyed(web()),
        &cfg,
        vec![ours("web-http"), ours("web-http-2")],
    );
    let rel = released(&r);
    assert_eq!(rel.why, Unmanaged::NoKey);
    assert_eq!(rel.delete_slices, ["web-http", "web-http-2"]);
    assert!(rel.forget_metrics);
    assert!(!rel.remove_legacy_endpoints);
    assert_eq!(
        rel.warnings,
        Warnings {
            external_name: Once::Rearm,
            selector: Once::Keep,
            unknown_policy: Once::Keep,
        }
    );
    assert!(r.groups_looked_up.is_empty(), "no pods read for it");
    assert_eq!(r.decision.requeue(), Requeue::OnChange);
}

#[test]
fn release_deletes_only_slices_that_are_ours() {
    let cfg = config("");
    let mut stripped = (*ours("web-stripped")).clone();
    stripped
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .remove(MANAGED_BY_LABEL);
    let mut other_api = (*ours("web-other-api")).clone();
    other_api.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "example.com/v1".into(),
        ..other_api.metadata.owner_references.unwrap()[0].clone()
    }]);
    let r = run(
        unkeyed(web()),
        &cfg,
        vec![
            ours("web-http"),
            Arc::new(stripped),
            foreign(
                "web-native",
                "endpointslice-controller.k8s.io",
                "web",
                "IPv4",
            ),
            foreign("web-elses", MANAGER, "other", "IPv4"),
            Arc::new(other_api),
        ],
    );
    // Ours: our manager label, or none (reclaimed); owned by the Service
    // (core/v1) by uid.
    assert_eq!(released(&r).delete_slices, ["web-http", "web-stripped"]);
}

#[test]
fn release_with_nothing_published_deletes_nothing() {
    let r = run(unkeyed(web()), &config(""), vec![]);
    assert!(released(&r).delete_slices.is_empty());
}

#[test]
fn keyed_external_name_is_released_and_warned_about() {
    let r = run(external_name(web()), &config(""), vec![ours("web-http")]);
    let rel = released(&r);
    assert_eq!(rel.why, Unmanaged::ExternalName);
    assert_eq!(rel.delete_slices, ["web-http"]);
    assert!(!rel.forget_metrics, "as before: dropped when it is deleted");
    assert_eq!(
        rel.warnings,
        Warnings {
            external_name: Once::Raise,
            selector: Once::Keep,
            unknown_policy: Once::Keep,
        }
    );
    assert!(r.groups_looked_up.is_empty());
    assert_eq!(r.decision.requeue(), Requeue::OnChange);
}

#[test]
fn unkeyed_external_name_is_released_silently() {
    let r = run(unkeyed(external_name(web())), &config(""), vec![]);
    let rel = released(&r);
    assert_eq!(rel.why, Unmanaged::ExternalName);
    assert_eq!(rel.warnings.external_name, Once::Keep);
    assert!(!rel.forget_metrics);
}

#[test]
fn external_name_wins_over_a_selector() {
    let svc = with_selector(external_name(web()), &[("app", "web")]);
    let r = run(svc, &config(""), vec![]);
    assert_eq!(released(&r).why, Unmanaged::ExternalName);
    assert_eq!(r.decision.warnings().selector, Once::Keep);
}

#[test]
fn selector_is_served_but_warned_and_never_cleaned_up() {
    let r = run(with_selector(web(), &[("app", "web")]), &config(""), vec![]);
    let s = served(&r);
    assert!(s.has_selector);
    assert!(s.forget_migration);
    assert!(!s.native_cleanup);
    assert_eq!(s.warnings.selector, Once::Raise);
    assert_eq!(s.warnings.external_name, Once::Rearm);
    assert_eq!(s.subjects.len(), 2, "served like any other");
    assert_eq!(r.decision.requeue(), Requeue::AfterResync);
}

#[test]
fn empty_selector_is_no_selector() {
    let r = run(with_selector(web(), &[]), &config(""), vec![]);
    let s = served(&r);
    assert!(!s.has_selector);
    assert!(!s.forget_migration);
    assert!(s.native_cleanup);
    assert_eq!(s.warnings.selector, Once::Rearm);
}

#[test]
fn unkeyed_selector_service_keeps_its_selector_warning_mark() {
    let r = run(
        unkeyed(with_selector(web(), &[("app", "web")])),
        &config(""),
        vec![],
    );
    assert_eq!(released(&r).why, Unmanaged::NoKey);
    assert_eq!(r.decision.warnings().selector, Once::Keep);
}

#[test]
fn service_being_deleted_is_still_served() {
    let mut svc = web();
    svc.metadata.deletion_timestamp = Some(Time("2026-01-01T00:00:00Z".parse().unwrap()));
    let r = run(svc, &config(""), vec![ours("web-http")]);
    // The planner refuses it new slices; the decision does not release it.
    assert_eq!(served(&r).group, "g");
}

#[test]
fn native_cleanup_can_be_disabled() {
    let r = run(web(), &config("nativeCleanup: false\n"), vec![]);
    assert!(!served(&r).native_cleanup);
}

#[test]
fn native_cleanup_waits_for_a_published_endpoint() {
    let svc = web();
    let r = run(svc.clone(), &config(""), vec![]);
    let s = served(&r);
    let world = crate::plan::testutil::World::default();
    let full = world.plan(&svc, &include_all(&svc, &pods()), 100);
    assert!(s.cleans_up_native(&full));
    let empty = world.plan(&svc, &[], 100);
    assert_eq!(empty.summary.endpoints.values().sum::<usize>(), 0);
    assert!(!s.cleans_up_native(&empty), "never leave traffic nowhere");

    let r = run(with_selector(svc, &[("app", "web")]), &config(""), vec![]);
    assert!(!served(&r).cleans_up_native(&full));
}

#[test]
fn publish_legacy_endpoints_writes_when_served_and_removes_when_released() {
    let cfg = config("publishLegacyEndpoints: true\n");
    let r = run_with_endpoints(web(), &cfg, vec![], true);
    assert!(served(&r).publish_legacy_endpoints);
    assert!(!served(&r).remove_legacy_endpoints);
    let r = run_with_endpoints(unkeyed(web()), &cfg, vec![], true);
    assert!(released(&r).remove_legacy_endpoints);
    let r = run_with_endpoints(external_name(web()), &cfg, vec![], true);
    assert!(released(&r).remove_legacy_endpoints);
    // Nothing of ours to remove: no request.
    let r = run(unkeyed(web()), &cfg, vec![]);
    assert!(!released(&r).remove_legacy_endpoints);
}

/// Issue 12: an Endpoints object written while `publishLegacyEndpoints`
/// was on goes once it is off, served or not.
#[test]
fn our_endpoints_go_once_legacy_publishing_is_off() {
    let cfg = config("");
    let r = run_with_endpoints(web(), &cfg, vec![], true);
    assert!(!served(&r).publish_legacy_endpoints);
    assert!(served(&r).remove_legacy_endpoints);
    let r = run_with_endpoints(unkeyed(web()), &cfg, vec![], true);
    assert!(released(&r).remove_legacy_endpoints);
    let r = run_with_endpoints(external_name(web()), &cfg, vec![], true);
    assert!(released(&r).remove_legacy_endpoints);
    let r = run(web(), &cfg, vec![]);
    assert!(!served(&r).remove_legacy_endpoints);
}

#[test]
fn group_without_pods_is_served_empty() {
    let svc = Arc::new(web());
    let cfg = config("");
    let d = decide(&Input {
        service: &svc,
        config: &cfg,
        pods_in_group: &|_| Vec::new(),
        node_known: &|_| true,
        owned: &Vec::new,
        has_our_endpoints: false,
        objects: &[],
    });
    let Decision::Serve(s) = d else {
        panic!("expected Serve");
    };
    assert!(s.subjects.is_empty());
}

#[test]
fn pod_key_does_not_change_which_services_are_served() {
    // podKey names how pods join; the Service still opts in by serviceKey.
    let cfg = config("podKey: {label: other.example.com/group}\n");
    let r = run(web(), &cfg, vec![]);
    assert_eq!(served(&r).group, "g");
}

#[test]
fn managed_by_of_the_config_decides_what_is_ours() {
    let cfg = config("managedBy: someone-else\n");
    let r = run(unkeyed(web()), &cfg, vec![ours("web-http")]);
    assert!(released(&r).delete_slices.is_empty());
}

/// Pods of the group that cannot be judged are counted by reason, not
/// dropped without a word; the others are judged as before.
#[test]
fn pods_that_are_not_judged_are_counted_by_reason() {
    use crate::align::NotJudged;
    let svc = Arc::new(web());
    let cfg = config("");
    let mut done = pod("done", &["10.0.0.3"], 8080);
    done.status.as_mut().unwrap().phase = Some("Succeeded".into());
    let mut orphan = pod("orphan", &["10.0.0.4"], 8080);
    orphan.spec.as_mut().unwrap().node_name = Some("gone".into());
    let mut placed = pod("placed", &["10.0.0.5"], 8080);
    placed.spec.as_mut().unwrap().node_name = Some("here".into());
    let unaddressed = pod("new", &[], 8080);
    let v6_only = pod("v6", &["fd00::6"], 8080);
    let group = vec![
        Arc::new(pod("a", &["10.0.0.1"], 8080)),
        Arc::new(done),
        Arc::new(orphan),
        Arc::new(placed),
        Arc::new(unaddressed),
        Arc::new(v6_only),
    ];
    let d = decide(&Input {
        service: &svc,
        config: &cfg,
        pods_in_group: &|_| group.clone(),
        node_known: &|n| n != "gone",
        owned: &Vec::new,
        has_our_endpoints: false,
        objects: &[],
    });
    let Decision::Serve(s) = d else {
        panic!("expected Serve");
    };
    let judged: Vec<_> = s
        .subjects
        .iter()
        .map(|s| s.pod.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(judged, ["a", "placed"]);
    assert_eq!(
        s.not_judged,
        BTreeMap::from([
            (NotJudged::Terminal, 1),
            (NotJudged::NodeGone, 1),
            (NotJudged::NoAddress, 2),
        ])
    );
}

/// A Service picks its policy by annotation; a name the file lacks holds
/// the Service (nothing judged, nothing written or released) and warns.
#[test]
fn the_policy_annotation_picks_the_expression_or_holds_the_service() {
    use crate::policy::Policy;
    let cfg = config("membership: podReady\npolicies: {strict: {not: podReady}}\n");
    let annotate = |value: &str| {
        let mut svc = web();
        svc.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert("portwise.io/membership".into(), value.into());
        svc
    };
    assert_eq!(served(&run(web(), &cfg, vec![])).policy, Policy::Default);
    let r = run(annotate("strict"), &cfg, vec![]);
    assert_eq!(served(&r).policy, Policy::Named("strict".into()));
    assert_eq!(served(&r).warnings.unknown_policy, Once::Rearm);

    let r = run(annotate("strcit"), &cfg, vec![ours("web-http")]);
    let Decision::Hold(hold) = &r.decision else {
        panic!("expected Hold, got {:?}", r.decision);
    };
    assert_eq!(hold.why.name(), "strcit");
    assert_eq!(hold.warnings.unknown_policy, Once::Raise);
    assert!(r.groups_looked_up.is_empty(), "nothing judged");
    assert_eq!(r.owned_looked_up, 0, "nothing released");
    assert_eq!(r.decision.requeue(), Requeue::OnChange);
}
