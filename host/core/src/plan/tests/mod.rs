//! Unit tests of the planner, one per behaviour in semantics.md.

use std::{collections::BTreeMap, sync::Arc};

use k8s_openapi::{
    api::{
        core::v1::{Container, ContainerPort, Pod, Service},
        discovery::v1::EndpointSlice,
    },
    apimachinery::pkg::apis::meta::v1::{OwnerReference, Time},
};

use super::{testutil::*, *};
use crate::membership::{Decision, Family};

mod fields;
mod port_sets;
mod repair;
mod trigger_time;
mod v1_endpoints;

fn http_svc() -> Service {
    service("web", vec![port("http", 80, named("web"))], &["IPv4"])
}

fn steady(world: &World, svc: &Service, judged: &[Judged], max: usize) {
    let again = world.plan(svc, judged, max);
    assert!(
        again.applies.is_empty() && again.deletes.is_empty(),
        "re-plan wrote: applies {:?} deletes {:?}",
        again
            .applies
            .iter()
            .map(|s| s.metadata.name.clone())
            .collect::<Vec<_>>(),
        again.deletes
    );
}

fn names(plan: &Plan) -> Vec<String> {
    plan.applies
        .iter()
        .map(|s| s.metadata.name.clone().unwrap())
        .collect()
}

/// The seed's colocated Service: `http → a, b, c` (named target `web`,
/// 8080), `https → b, c, d` (8443); a is 10.244.0.10, d 10.244.0.7.
fn seed() -> (Service, Vec<Arc<Pod>>, Vec<Judged>) {
    let svc = service(
        "web",
        vec![
            port("http", 80, named("web")),
            port("https", 443, num(8443)),
        ],
        &["IPv4"],
    );
    let pods: Vec<Arc<Pod>> = ["a", "b", "c", "d"]
        .iter()
        .enumerate()
        .map(|(i, n)| Arc::new(pod(n, &[&format!("10.244.0.{}", 10 - i)], 8080)))
        .collect();
    let judged = judge(&svc, &pods, |p, port, _| {
        let n = p.metadata.name.as_deref().unwrap();
        let yes = match port {
            "http" => n != "d",
            _ => n != "a",
        };
        if yes {
            Decision::Include
        } else {
            Decision::Exclude
        }
    });
    (svc, pods, judged)
}

#[test]
fn colocated_ports_get_their_own_members() {
    let (svc, _, judged) = seed();
    let plan = World::default().plan(&svc, &judged, 100);
    // Each address in one slice, listing every port it backs (the native
    // controller's layout): a backs http alone, b and c both, d https.
    assert_eq!(
        names(&plan),
        vec!["web-http", "web-http.https", "web-https"]
    );
    let http = &plan.applies[0];
    assert_eq!(addresses(http), vec!["10.244.0.10"]);
    let both = &plan.applies[1];
    // sorted by address
    assert_eq!(addresses(both), vec!["10.244.0.8", "10.244.0.9"]);
    assert_eq!(addresses(&plan.applies[2]), vec!["10.244.0.7"]);
    assert_eq!(http.address_type, "IPv4");
    let p = &http.ports.as_ref().unwrap()[..];
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].name.as_deref(), Some("http"));
    assert_eq!(p[0].port, Some(8080));
    assert_eq!(p[0].protocol.as_deref(), Some("TCP"));
    // Both ports, each with its own number, in the Service's order.
    let p: Vec<_> = both
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.as_deref().unwrap(), p.port.unwrap()))
        .collect();
    assert_eq!(p, vec![("http", 8080), ("https", 8443)]);
    assert_eq!(plan.applies[2].ports.as_ref().unwrap()[0].port, Some(8443));
    let labels = http.metadata.labels.as_ref().unwrap();
    assert_eq!(
        labels.get(SERVICE_NAME_LABEL).map(String::as_str),
        Some("web")
    );
    assert_eq!(
        labels.get(MANAGED_BY_LABEL).map(String::as_str),
        Some(MANAGER)
    );
    assert_eq!(labels.get("app").map(String::as_str), Some("web"));
    assert!(!labels.contains_key(HEADLESS_LABEL));
    assert_eq!(
        http.metadata.owner_references.as_deref(),
        Some(
            &[OwnerReference {
                api_version: "v1".into(),
                kind: "Service".into(),
                name: "web".into(),
                uid: "web-uid".into(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }][..]
        )
    );
    assert_eq!(http.metadata.namespace.as_deref(), Some(NS));
    let ep = &http.endpoints.as_ref().unwrap()[0];
    let r = ep.target_ref.as_ref().unwrap();
    assert_eq!(
        (
            r.kind.as_deref(),
            r.namespace.as_deref(),
            r.name.as_deref(),
            r.uid.as_deref()
        ),
        (Some("Pod"), Some(NS), Some("a"), Some("a-uid"))
    );
    assert_eq!(ep.node_name.as_deref(), Some("node-a"));
    assert_eq!(ep.zone, None);
    assert_eq!(
        plan.summary.endpoints[&("http".to_string(), "IPv4".to_string())],
        3
    );
    assert_eq!(plan.summary.slices, 3);
    assert_eq!(plan.members.len(), 6);
    assert!(plan.deletes.is_empty() && plan.collisions.is_empty());

    let mut w = World::default();
    w.apply(&plan);
    steady(&w, &svc, &judged, 100);
}

#[test]
fn names_for_unnamed_ports_and_ipv6() {
    let mut svc = service("web", vec![port("", 8080, num(8080))], &["IPv4", "IPv6"]);
    svc.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].name = None;
    let pods = many_pods(2, true);
    let plan = World::default().plan(&svc, &include_all(&svc, &pods), 100);
    assert_eq!(names(&plan), vec!["web-8080", "web-8080--ipv6"]);
    assert_eq!(plan.applies[1].address_type, "IPv6");
    assert_eq!(
        plan.applies[0].ports.as_ref().unwrap()[0].name.as_deref(),
        Some("")
    );
    assert_eq!(
        addresses(&plan.applies[1]),
        vec!["fd00:10:244::1", "fd00:10:244::2"]
    );
}

#[test]
fn dual_stack_publishes_each_family_with_its_own_pods() {
    let svc = service(
        "web",
        vec![port("http", 80, named("web"))],
        &["IPv6", "IPv4"],
    );
    let mut pods = many_pods(3, true);
    pods.push(Arc::new(pod("v4only", &["10.244.9.9"], 8080)));
    let judged = include_all(&svc, &pods);
    let plan = World::default().plan(&svc, &judged, 100);
    assert_eq!(names(&plan), vec!["web-http", "web-http--ipv6"]);
    assert_eq!(plan.applies[0].address_type, "IPv4");
    assert_eq!(addresses(&plan.applies[0]).len(), 4);
    assert_eq!(plan.applies[1].address_type, "IPv6");
    assert_eq!(addresses(&plan.applies[1]).len(), 3);
    assert_eq!(
        plan.summary.endpoints[&("http".to_string(), "IPv6".to_string())],
        3
    );

    // Dropping a family deletes its slices.
    let mut w = World::default();
    w.apply(&plan);
    let v4 = service("web", vec![port("http", 80, named("web"))], &["IPv4"]);
    let judged = include_all(&v4, &pods);
    let plan = w.plan(&v4, &judged, 100);
    assert!(plan.applies.is_empty());
    assert_eq!(plan.deletes, vec!["web-http--ipv6"]);
}

#[test]
fn ipv4_mapped_addresses_publish_as_ipv4() {
    let svc = http_svc();
    let pods = vec![Arc::new(pod("m", &["::ffff:10.244.0.3"], 8080))];
    let plan = World::default().plan(&svc, &include_all(&svc, &pods), 100);
    assert_eq!(addresses(&plan.applies[0]), vec!["10.244.0.3"]);
}

#[test]
fn chunks_250_pods_at_100() {
    let svc = http_svc();
    let pods = many_pods(250, false);
    let judged = include_all(&svc, &pods);
    let plan = World::default().plan(&svc, &judged, 100);
    assert_eq!(names(&plan), vec!["web-http", "web-http--2", "web-http--3"]);
    let sizes: Vec<usize> = plan.applies.iter().map(|s| addresses(s).len()).collect();
    assert_eq!(sizes, vec![100, 100, 50]);
    assert_eq!(plan.summary.slices, 3);
    assert_eq!(
        plan.summary.endpoints[&("http".to_string(), "IPv4".to_string())],
        250
    );
    let mut w = World::default();
    w.apply(&plan);
    steady(&w, &svc, &judged, 100);
    // each endpoint exactly once
    let all = &published(&w, &svc)[&("http".to_string(), "IPv4".to_string())];
    let mut dedup = all.clone();
    dedup.sort();
    dedup.dedup();
    assert_eq!((all.len(), dedup.len()), (250, 250));
}

#[test]
fn max_is_clamped() {
    let svc = http_svc();
    let pods = many_pods(3, false);
    let plan = World::default().plan(&svc, &include_all(&svc, &pods), 0);
    assert_eq!(plan.applies.len(), 3, "max 0 behaves as 1");
    let pods = many_pods(1001, false);
    let plan = World::default().plan(&svc, &include_all(&svc, &pods), 5000);
    let sizes: Vec<usize> = plan.applies.iter().map(|s| addresses(s).len()).collect();
    assert_eq!(sizes, vec![1000, 1]);
}

/// 1000 endpoints in 10 slices per family, every pod backing both ports;
/// one pod at a time flips out of both, back in, becomes terminating:
/// each costs exactly one write per family (the pod's one slice there).
#[test]
fn churn_one_pod_one_write_per_port_and_family() {
    let svc = service(
        "web",
        vec![
            port("http", 80, named("web")),
            port("admin", 9000, num(9000)),
        ],
        &["IPv4", "IPv6"],
    );
    let mut pods = many_pods(1000, true);
    let mut excluded: Option<String> = None;
    let decide = |ex: &Option<String>| {
        let ex = ex.clone();
        move |p: &Pod, _: &str, _: Family| {
            if Some(p.metadata.name.clone().unwrap()) == ex {
                Decision::Exclude
            } else {
                Decision::Include
            }
        }
    };
    let mut w = World::default();
    let first = w.plan(&svc, &judge(&svc, &pods, decide(&excluded)), 100);
    assert_eq!(first.applies.len(), 20);
    assert!(
        first
            .applies
            .iter()
            .all(|s| s.ports.as_ref().unwrap().len() == 2)
    );
    w.apply(&first);

    let check = |w: &mut World, pods: &[Arc<Pod>], excluded: &Option<String>, what: &str| {
        let judged = judge(&svc, pods, decide(excluded));
        let plan = w.plan(&svc, &judged, 100);
        let mut per_group: BTreeMap<String, usize> = BTreeMap::new();
        for s in &plan.applies {
            *per_group.entry(s.address_type.clone()).or_default() += 1;
        }
        assert_eq!(per_group.len(), 2, "{what}: {per_group:?}");
        assert!(per_group.values().all(|n| *n == 1), "{what}: {per_group:?}");
        assert!(plan.deletes.is_empty(), "{what}");
        w.apply(&plan);
        steady(w, &svc, &judged, 100);
    };
    for victim in ["p0000", "p0457", "p0999"] {
        excluded = Some(victim.into());
        check(&mut w, &pods, &excluded, &format!("{victim} out"));
        excluded = None;
        check(&mut w, &pods, &excluded, &format!("{victim} back"));
    }
    // a pod starts terminating: its conditions change in place
    pods[500] = Arc::new(terminating((*pods[500]).clone()));
    check(&mut w, &pods, &excluded, "terminating");
    // a pod is replaced by one with another name and address
    pods[10] = Arc::new(pod(
        "replacement",
        &["10.244.50.1", "fd00:10:244::ffff"],
        8080,
    ));
    check(&mut w, &pods, &excluded, "replaced");
    // a brand-new pod while a slice has room
    pods.push(Arc::new(pod(
        "newcomer",
        &["10.244.60.1", "fd00:10:244::1:0"],
        8080,
    )));
    excluded = Some("p0100".into());
    check(&mut w, &pods, &excluded, "out, making room");
    excluded = None;
    pods.pop();
    check(&mut w, &pods, &excluded, "newcomer leaves, p0100 back");
    for s in w.owned(&svc) {
        assert!(addresses(&s).len() <= 100);
    }
}

#[test]
fn named_target_port_two_numbers_mid_rollout() {
    let svc = http_svc();
    let old: Vec<Arc<Pod>> = (0..3)
        .map(|i| Arc::new(pod(&format!("old{i}"), &[&format!("10.244.1.{i}")], 8081)))
        .collect();
    let mut w = World::default();
    let plan = w.plan(&svc, &include_all(&svc, &old), 100);
    assert_eq!(names(&plan), vec!["web-http"]);
    assert_eq!(plan.applies[0].ports.as_ref().unwrap()[0].port, Some(8081));
    w.apply(&plan);

    // New pods resolve `web` to 8080, a lower number: the live set keeps
    // the bare name, the new one gets --p8080.
    let new: Vec<Arc<Pod>> = (0..2)
        .map(|i| Arc::new(pod(&format!("new{i}"), &[&format!("10.244.2.{i}")], 8080)))
        .collect();
    let mixed: Vec<Arc<Pod>> = old.iter().chain(&new).cloned().collect();
    let judged = include_all(&svc, &mixed);
    let plan = w.plan(&svc, &judged, 100);
    assert_eq!(
        names(&plan),
        vec!["web-http--p8080"],
        "the existing set is not rewritten"
    );
    assert_eq!(plan.applies[0].ports.as_ref().unwrap()[0].port, Some(8080));
    assert_eq!(
        plan.summary.endpoints[&("http".to_string(), "IPv4".to_string())],
        5
    );
    w.apply(&plan);
    steady(&w, &svc, &judged, 100);

    // The rollout finishes: the old set goes, the new one keeps its name.
    let judged = include_all(&svc, &new);
    let plan = w.plan(&svc, &judged, 100);
    assert!(plan.applies.is_empty());
    assert_eq!(plan.deletes, vec!["web-http"]);
    w.apply(&plan);
    steady(&w, &svc, &judged, 100);

    // From scratch, the lowest target gets the bare name.
    let plan = World::default().plan(&svc, &include_all(&svc, &mixed), 100);
    assert_eq!(names(&plan), vec!["web-http", "web-http--p8081"]);
    assert_eq!(plan.applies[0].ports.as_ref().unwrap()[0].port, Some(8080));
}

#[test]
fn rollout_transitions_cost_one_write_each() {
    let svc = http_svc();
    let at = |name: &str, ip: &str, web: u16| Arc::new(pod(name, &[ip], web));
    let a = at("a", "10.244.0.1", 8080);
    let b = at("b", "10.244.0.2", 8081);
    let c = at("c", "10.244.0.3", 8082);
    let mut w = World::default();
    let step = |w: &mut World, pods: &[Arc<Pod>]| {
        let judged = include_all(&svc, pods);
        let plan = w.plan(&svc, &judged, 100);
        w.apply(&plan);
        steady(w, &svc, &judged, 100);
        (names(&plan), plan.deletes.clone())
    };
    assert_eq!(
        step(&mut w, &[a.clone(), b.clone()]).0,
        vec!["web-http", "web-http--p8081"]
    );
    // the 8080 set ends: its slice goes, nothing is renamed
    assert_eq!(
        step(&mut w, std::slice::from_ref(&b)),
        (vec![], vec!["web-http".to_string()])
    );
    // the last member leaves: the remaining slice becomes the placeholder
    // and keeps the target its name says
    assert_eq!(
        step(&mut w, &[]),
        (vec!["web-http--p8081".to_string()], vec![])
    );
    assert_eq!(
        w.get("web-http--p8081").ports.as_ref().unwrap()[0].port,
        Some(8081)
    );
    // a member comes back: one update
    assert_eq!(
        step(&mut w, std::slice::from_ref(&b)),
        (vec!["web-http--p8081".to_string()], vec![])
    );
    // one pod replaced by one with another target: the emptied slice is
    // reused rather than creating one and deleting the other
    assert_eq!(
        step(&mut w, std::slice::from_ref(&c)),
        (vec!["web-http--p8081".to_string()], vec![])
    );
    assert_eq!(
        w.get("web-http--p8081").ports.as_ref().unwrap()[0].port,
        Some(8082)
    );
    assert_eq!(w.names(), vec!["web-http--p8081"]);
}

#[test]
fn sidecar_port_is_published() {
    let svc = service(
        "web",
        vec![port("metrics", 9090, named("metrics"))],
        &["IPv4"],
    );
    let mut p = pod("s", &["10.244.0.1"], 8080);
    p.spec.as_mut().unwrap().init_containers = Some(vec![Container {
        name: "sidecar".into(),
        restart_policy: Some("Always".into()),
        ports: Some(vec![ContainerPort {
            name: Some("metrics".into()),
            container_port: 9102,
            ..Default::default()
        }]),
        ..Default::default()
    }]);
    let pods = vec![Arc::new(p)];
    let plan = World::default().plan(&svc, &include_all(&svc, &pods), 100);
    assert_eq!(plan.applies[0].ports.as_ref().unwrap()[0].port, Some(9102));
    assert_eq!(addresses(&plan.applies[0]), vec!["10.244.0.1"]);
}

#[test]
fn emptied_chunks_are_deleted_but_the_last_stays() {
    let svc = http_svc();
    let pods = many_pods(250, false);
    let mut w = World::default();
    w.apply(&w.plan(&svc, &include_all(&svc, &pods), 100));
    // keep only the first 100 (the first chunk)
    let judged = include_all(&svc, &pods[..100]);
    let plan = w.plan(&svc, &judged, 100);
    assert!(plan.applies.is_empty());
    assert_eq!(plan.deletes, vec!["web-http--2", "web-http--3"]);
    w.apply(&plan);
    // all gone: one placeholder, in place of the first chunk
    let plan = w.plan(&svc, &[], 100);
    assert_eq!(names(&plan), vec!["web-http"]);
    assert!(plan.deletes.is_empty());
}

#[test]
fn abstain_keeps_only_what_is_published() {
    let svc = http_svc();
    let pods: Vec<Arc<Pod>> = vec![
        Arc::new(pod("a", &["10.244.0.1"], 8080)),
        Arc::new(pod("b", &["10.244.0.2"], 8080)),
    ];
    let mut w = World::default();
    // a published, b not
    let only_a = |p: &Pod, _: &str, _: Family| {
        if p.metadata.name.as_deref() == Some("a") {
            Decision::Include
        } else {
            Decision::Exclude
        }
    };
    w.apply(&w.plan(&svc, &judge(&svc, &pods, only_a), 100));

    let abstain = judge(&svc, &pods, |_, _, _| Decision::Abstain);
    let plan = w.plan(&svc, &abstain, 100);
    assert!(
        plan.applies.is_empty() && plan.deletes.is_empty(),
        "a kept, b stays out"
    );
    assert_eq!(plan.members.len(), 1);
    assert_eq!(plan.members[0].pod.metadata.name.as_deref(), Some("a"));

    // Same name and address but a new pod (uid): not what was published.
    let reborn: Vec<Arc<Pod>> = vec![Arc::new({
        let mut p = pod("a", &["10.244.0.1"], 8080);
        p.metadata.uid = Some("a-uid-2".into());
        p
    })];
    let plan = w.plan(
        &svc,
        &judge(&svc, &reborn, |_, _, _| Decision::Abstain),
        100,
    );
    assert_eq!(addresses(&plan.applies[0]), Vec::<String>::new());

    // Same pod, new address: not published either.
    let moved = vec![Arc::new(pod("a", &["10.244.0.9"], 8080))];
    let plan = w.plan(&svc, &judge(&svc, &moved, |_, _, _| Decision::Abstain), 100);
    assert_eq!(addresses(&plan.applies[0]), Vec::<String>::new());

    // Published for another port only: does not count.
    let two = service(
        "web",
        vec![port("http", 80, named("web")), port("admin", 90, num(90))],
        &["IPv4"],
    );
    let plan = w.plan(&two, &judge(&two, &pods, |_, _, _| Decision::Abstain), 100);
    assert_eq!(
        plan.members
            .iter()
            .map(|m| m.port.name.as_str())
            .collect::<Vec<_>>(),
        vec!["http"]
    );
}

#[test]
fn exclude_and_include_win_over_duplicates() {
    let svc = http_svc();
    let pods = many_pods(1, false);
    let mut judged = include_all(&svc, &pods);
    let mut dup = judged[0].clone();
    dup.decision = Decision::Exclude;
    judged.insert(0, dup);
    let plan = World::default().plan(&svc, &judged, 100);
    assert_eq!(addresses(&plan.applies[0]).len(), 1);
    assert_eq!(plan.members.len(), 1);
}

#[test]
fn deterministic_under_input_order() {
    let svc = service(
        "web",
        vec![port("http", 80, named("web")), port("admin", 90, num(90))],
        &["IPv4", "IPv6"],
    );
    let pods = many_pods(120, true);
    let mut w = World::default();
    w.apply(&w.plan(&svc, &include_all(&svc, &pods[..60]), 50));
    let judged = judge(&svc, &pods, |p, _, _| {
        if p.metadata.name.as_deref().unwrap().ends_with('3') {
            Decision::Exclude
        } else {
            Decision::Include
        }
    });
    let a = w.plan(&svc, &judged, 50);
    let mut reversed = judged.clone();
    reversed.reverse();
    let mut owned = w.owned(&svc);
    owned.reverse();
    let lookup = |n: &str| w.slices.get(n).cloned();
    let b = plan(&PlanInput {
        service: &svc,
        managed_by: MANAGER,
        max_endpoints_per_slice: 50,
        judged: &reversed,
        zones: None,
        owned: &owned,
        lookup: &lookup,
        triggers: Triggers::none(),
    });
    assert_eq!(a.applies, b.applies);
    assert_eq!(a.deletes, b.deletes);
    assert_eq!(a.summary, b.summary);
}

/// Cost of planning a large Service (run with `--ignored --nocapture`).
#[test]
#[ignore = "timing figures, not a check"]
fn timing_4000_endpoints() {
    use std::time::Instant;
    let svc = service(
        "web",
        vec![
            port("http", 80, named("web")),
            port("admin", 9000, num(9000)),
        ],
        &["IPv4", "IPv6"],
    );
    let pods = many_pods(1000, true);
    let judged = include_all(&svc, &pods);
    let mut w = World::default();
    let t = Instant::now();
    let first = w.plan(&svc, &judged, 100);
    let from_scratch = t.elapsed();
    w.apply(&first);
    let t = Instant::now();
    let steady_plan = w.plan(&svc, &judged, 100);
    let steady_time = t.elapsed();
    assert!(steady_plan.applies.is_empty());
    let mut flipped = judged.clone();
    flipped[17].decision = Decision::Exclude;
    let t = Instant::now();
    let one = w.plan(&svc, &flipped, 100);
    let flip_time = t.elapsed();
    assert_eq!(one.applies.len(), 1);
    println!(
        "4000 endpoints in {} slices: from scratch {from_scratch:?}, steady {steady_time:?}, one flip {flip_time:?}",
        first.applies.len()
    );
}

/// Issue 12: a headless Service without ports (a StatefulSet's governing
/// Service) gets slices with `ports: []`, as from the native controller,
/// and a second plan against them writes nothing, also when the apiserver
/// returns the empty list as absent.
#[test]
fn portless_headless_service_publishes_slices_without_ports() {
    let mut svc = service("peers", vec![], &["IPv4", "IPv6"]);
    svc.spec.as_mut().unwrap().cluster_ip = Some("None".into());
    let pods = many_pods(3, true);
    let subjects = crate::align::subjects(&Arc::new(svc.clone()), &pods, &Default::default());
    assert_eq!(
        subjects.len(),
        6,
        "one port-less subject per pod and family"
    );
    assert!(subjects.iter().all(|s| s.port.is_portless()));
    let judged = include_all(&svc, &pods);
    let mut world = World::default();
    let plan = world.plan(&svc, &judged, 100);
    let mut names: Vec<String> = plan
        .applies
        .iter()
        .filter_map(|s| s.metadata.name.clone())
        .collect();
    names.sort();
    assert_eq!(names, ["peers-noports", "peers-noports--ipv6"]);
    for s in &plan.applies {
        assert_eq!(s.ports.as_deref(), Some(&[][..]));
        assert_eq!(addresses(s).len(), 3);
    }
    world.apply(&plan);
    let again = world.plan(&svc, &judged, 100);
    assert!(
        again.applies.is_empty() && again.deletes.is_empty(),
        "{again:?}"
    );
    // The apiserver may hand the empty list back as absent.
    for s in world.slices.values_mut() {
        Arc::make_mut(s).ports = None;
    }
    let again = world.plan(&svc, &judged, 100);
    assert!(
        again.applies.is_empty() && again.deletes.is_empty(),
        "{again:?}"
    );

    // A ClusterIP Service cannot lack ports; one that does is not port-less.
    let mut clustered = service("web", vec![], &["IPv4"]);
    clustered.spec.as_mut().unwrap().cluster_ip = Some("10.96.0.9".into());
    assert!(crate::align::subjects(&Arc::new(clustered), &pods, &Default::default()).is_empty());
}

/// The native controller's per-sync figures, in portwise's layout: added
/// and removed endpoints against the live slices, desired slices with
/// perfect packing (a placeholder counts one).
#[test]
fn the_summary_counts_what_a_sync_adds_removes_and_needs() {
    let svc = service(
        "web",
        vec![
            port("http", 80, named("web")),
            port("https", 443, num(8443)),
        ],
        &["IPv4"],
    );
    let pods = many_pods(5, false);
    let mut world = World::default();
    // 5 on http, none on https: 2 slices of 3 for http, 1 placeholder.
    let only_http = |svc: &Service, pods: &[Arc<Pod>], out: &[&str]| {
        judge(svc, pods, |p, port, _| {
            let n = p.metadata.name.as_deref().unwrap();
            if port == "http" && !out.contains(&n) {
                Decision::Include
            } else {
                Decision::Exclude
            }
        })
    };
    let first = world.plan(&svc, &only_http(&svc, &pods, &[]), 3);
    assert_eq!(
        (
            first.summary.endpoints_added,
            first.summary.endpoints_removed,
            first.summary.desired_slices,
            first.summary.slices
        ),
        (5, 0, 3, 3)
    );
    world.apply(&first);
    // Steady: nothing added or removed.
    let again = world.plan(&svc, &only_http(&svc, &pods, &[]), 3);
    assert_eq!(
        (
            again.summary.endpoints_added,
            again.summary.endpoints_removed
        ),
        (0, 0)
    );
    // Two leave http, one joins https: 1 added, 2 removed; http fits one
    // slice now, https has a member instead of its placeholder.
    let judged = judge(&svc, &pods, |p, port, _| {
        let n = p.metadata.name.as_deref().unwrap();
        let yes = match port {
            "http" => !["p0000", "p0001"].contains(&n),
            _ => n == "p0004",
        };
        if yes {
            Decision::Include
        } else {
            Decision::Exclude
        }
    });
    let change = world.plan(&svc, &judged, 3);
    assert_eq!(
        (
            change.summary.endpoints_added,
            change.summary.endpoints_removed,
            change.summary.desired_slices
        ),
        (1, 2, 2)
    );
    world.apply(&change);
    // A port removed from the Service: its endpoints count as removed.
    let http_only = service("web", vec![port("http", 80, named("web"))], &["IPv4"]);
    let judged = only_http(&http_only, &pods, &["p0000", "p0001"]);
    let dropped = world.plan(&http_only, &judged, 3);
    assert_eq!(
        (
            dropped.summary.endpoints_added,
            dropped.summary.endpoints_removed,
            dropped.summary.desired_slices
        ),
        (0, 1, 1)
    );
}
