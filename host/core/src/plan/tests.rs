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

fn conditions(s: &EndpointSlice, i: usize) -> (Option<bool>, Option<bool>, Option<bool>) {
    let c = s.endpoints.as_ref().unwrap()[i].conditions.clone().unwrap();
    (c.ready, c.serving, c.terminating)
}

#[test]
fn terminating_members_and_publish_not_ready() {
    let mut svc = http_svc();
    let pods = vec![
        Arc::new(pod("a", &["10.244.0.1"], 8080)),
        Arc::new(terminating(pod("b", &["10.244.0.2"], 8080))),
    ];
    let plan = World::default().plan(&svc, &include_all(&svc, &pods), 100);
    let s = &plan.applies[0];
    assert_eq!(conditions(s, 0), (Some(true), Some(true), Some(false)));
    assert_eq!(conditions(s, 1), (Some(false), Some(true), Some(true)));

    // publishNotReadyAddresses: every member ready; serving is the pod's
    // own Ready condition, as from the native controller (a has Ready=True,
    // b none).
    svc.spec.as_mut().unwrap().publish_not_ready_addresses = Some(true);
    let mut a = pod("a", &["10.244.0.1"], 8080);
    a.status.get_or_insert_with(Default::default).conditions =
        Some(vec![k8s_openapi::api::core::v1::PodCondition {
            type_: "Ready".into(),
            status: "True".into(),
            ..Default::default()
        }]);
    let pods = vec![Arc::new(a), pods[1].clone()];
    let plan = World::default().plan(&svc, &include_all(&svc, &pods), 100);
    let s = &plan.applies[0];
    assert_eq!(conditions(s, 0), (Some(true), Some(true), Some(false)));
    assert_eq!(conditions(s, 1), (Some(true), Some(false), Some(true)));
}

#[test]
fn hostname_when_subdomain_is_the_service() {
    let svc = http_svc();
    let mut a = pod("a", &["10.244.0.1"], 8080);
    let spec = a.spec.as_mut().unwrap();
    spec.hostname = Some("host-a".into());
    spec.subdomain = Some("web".into());
    let mut b = pod("b", &["10.244.0.2"], 8080);
    let spec = b.spec.as_mut().unwrap();
    spec.hostname = Some("host-b".into());
    spec.subdomain = Some("other".into());
    let pods = vec![Arc::new(a), Arc::new(b)];
    let plan = World::default().plan(&svc, &include_all(&svc, &pods), 100);
    let eps = plan.applies[0].endpoints.as_ref().unwrap();
    assert_eq!(eps[0].hostname.as_deref(), Some("host-a"));
    assert_eq!(eps[1].hostname, None);
}

#[test]
fn traffic_distribution_hints_on_ready_endpoints() {
    let zones = |node: &str| match node {
        "node-a" => Some("zone-1".to_string()),
        _ => None,
    };
    let mut nozone = pod("c", &["10.244.0.3"], 8080);
    nozone.spec.as_mut().unwrap().node_name = Some("node-x".into());
    let mut unscheduled = pod("d", &["10.244.0.4"], 8080);
    unscheduled.spec.as_mut().unwrap().node_name = None;
    let pods = vec![
        Arc::new(pod("a", &["10.244.0.1"], 8080)),
        Arc::new(terminating(pod("b", &["10.244.0.2"], 8080))),
        Arc::new(nozone),
        Arc::new(unscheduled),
    ];
    let hints = |td: Option<&str>, zones: Option<ZoneLookup>| {
        let mut svc = http_svc();
        svc.spec.as_mut().unwrap().traffic_distribution = td.map(Into::into);
        let plan = World::default().plan_with(&svc, &include_all(&svc, &pods), 100, zones);
        plan.applies[0]
            .endpoints
            .clone()
            .unwrap()
            .into_iter()
            .map(|e| {
                let h = e.hints.unwrap_or_default();
                (
                    e.zone,
                    h.for_zones
                        .map(|z| z.into_iter().map(|z| z.name).collect::<Vec<_>>()),
                    h.for_nodes
                        .map(|n| n.into_iter().map(|n| n.name).collect::<Vec<_>>()),
                )
            })
            .collect::<Vec<_>>()
    };
    let z = |s: &str| Some(s.to_string());
    let v = |s: &str| Some(vec![s.to_string()]);
    // no trafficDistribution: zones published, no hints
    assert_eq!(hints(None, Some(&zones))[0], (z("zone-1"), None, None));
    for td in ["PreferClose", "PreferSameZone"] {
        let got = hints(Some(td), Some(&zones));
        assert_eq!(got[0], (z("zone-1"), v("zone-1"), None), "{td}");
        assert_eq!(
            got[1],
            (z("zone-1"), None, None),
            "{td}: terminating is not ready"
        );
        assert_eq!(got[2], (None, None, None), "{td}: zone unknown");
        assert_eq!(got[3], (None, None, None), "{td}: no node");
    }
    let got = hints(Some("PreferSameNode"), Some(&zones));
    assert_eq!(got[0], (z("zone-1"), v("zone-1"), v("node-a")));
    assert_eq!(got[1], (z("zone-1"), None, None));
    assert_eq!(got[2], (None, None, v("node-x")));
    // node lookups disabled: no zones, only node hints
    let got = hints(Some("PreferSameNode"), None);
    assert_eq!(got[0], (None, None, v("node-a")));
    assert_eq!(hints(Some("PreferClose"), None)[0], (None, None, None));
}

#[test]
fn headless_label_and_reserved_service_labels() {
    let mut svc = http_svc();
    svc.spec.as_mut().unwrap().cluster_ip = Some("None".into());
    svc.metadata.labels.as_mut().unwrap().extend([
        (
            MANAGED_BY_LABEL.to_string(),
            "endpointslice-controller.k8s.io".to_string(),
        ),
        (SERVICE_NAME_LABEL.to_string(), "spoofed".to_string()),
        ("team".to_string(), "blue".to_string()),
    ]);
    let pods = many_pods(1, false);
    let plan = World::default().plan(&svc, &include_all(&svc, &pods), 100);
    let labels = plan.applies[0].metadata.labels.clone().unwrap();
    assert_eq!(
        labels,
        BTreeMap::from([
            ("app".to_string(), "web".to_string()),
            ("team".to_string(), "blue".to_string()),
            (HEADLESS_LABEL.to_string(), String::new()),
            (SERVICE_NAME_LABEL.to_string(), "web".to_string()),
            (MANAGED_BY_LABEL.to_string(), MANAGER.to_string()),
        ])
    );
}

#[test]
fn placeholder_for_ports_without_members() {
    let svc = service(
        "web",
        vec![
            port("http", 80, named("web")),
            port("admin", 9000, num(9001)),
            port("plain", 70, num(0)),
        ],
        &["IPv4"],
    );
    let mut w = World::default();
    let plan = w.plan(&svc, &[], 100);
    // `http`'s number is unknown without a member: it publishes no slice
    // (a port without a number reads as "all ports" and crashes consumers
    // that dereference it, issue 44); the others keep numbered placeholders.
    assert_eq!(names(&plan), vec!["web-admin", "web-plain"]);
    for s in &plan.applies {
        assert_eq!(s.endpoints.as_deref(), Some(&[][..]));
    }
    let port_of = |p: &Plan, i: usize| p.applies[i].ports.as_ref().unwrap()[0].port;
    assert_eq!(port_of(&plan, 0), Some(9001));
    assert_eq!(port_of(&plan, 1), Some(70), "targetPort 0 means port");
    assert_eq!(plan.summary.endpoints.values().sum::<usize>(), 0);
    assert_eq!(plan.summary.endpoints.len(), 3);
    w.apply(&plan);
    steady(&w, &svc, &[], 100);

    // A member of `http` alone arrives: `http` gets its slice.
    let pods = many_pods(1, false);
    let judged = judge(&svc, &pods[..1], |_, port, _| {
        if port == "http" {
            Decision::Include
        } else {
            Decision::Exclude
        }
    });
    let plan = w.plan(&svc, &judged, 100);
    assert_eq!(
        names(&plan),
        vec!["web-http"],
        "the placeholders stay as they are"
    );
    assert!(plan.deletes.is_empty());
    let http = plan
        .applies
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some("web-http"))
        .unwrap();
    assert_eq!(http.ports.as_ref().unwrap()[0].port, Some(8080));
    w.apply(&plan);
    steady(&w, &svc, &judged, 100);

    // It leaves again: the numbered placeholders stay untouched, `http`'s
    // slice goes.
    let plan = w.plan(&svc, &[], 100);
    assert!(plan.applies.is_empty(), "{:?}", names(&plan));
    assert_eq!(plan.deletes, vec!["web-http"]);
    w.apply(&plan);
    steady(&w, &svc, &[], 100);
}

/// Every port of the Service named and unresolved: each family publishes
/// the native controller's placeholder, one slice with `ports: []`, never a
/// port without a number (issue 44). Before the fix this planned
/// `web-http` and `web-https` with `{name, protocol}` ports and no number.
#[test]
fn unknown_numbers_publish_the_native_placeholder() {
    let svc = service(
        "web",
        vec![
            port("http", 80, named("web")),
            port("https", 443, named("tls")),
        ],
        &["IPv4", "IPv6"],
    );
    let mut w = World::default();
    let plan = w.plan(&svc, &[], 100);
    assert_eq!(names(&plan), vec!["web-http", "web-http--ipv6"]);
    for s in &plan.applies {
        assert_eq!(s.ports.as_deref(), Some(&[][..]), "{:?}", s.metadata.name);
        assert_eq!(s.endpoints.as_deref(), Some(&[][..]));
    }
    assert_eq!(
        plan.summary.endpoints.len(),
        4,
        "per port and family, 0 each"
    );
    assert!(plan.summary.endpoints.values().all(|n| *n == 0));
    assert_eq!(plan.summary.slices, 2);
    w.apply(&plan);
    steady(&w, &svc, &[], 100);

    // A member of `http` arrives (the pods have no `tls` port, so `https`
    // stays unknown): it takes the IPv4 placeholder over (one write, no
    // create or delete); IPv6 keeps its placeholder.
    let pods = many_pods(1, false);
    let judged = include_all(&svc, &pods);
    assert_eq!(judged.len(), 1);
    let plan = w.plan(&svc, &judged, 100);
    assert!(plan.deletes.is_empty(), "{:?}", plan.deletes);
    assert_eq!(names(&plan), vec!["web-http"]);
    let ports = plan.applies[0].ports.clone().unwrap();
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0].name.as_deref(), Some("http"));
    assert_eq!(ports[0].port, Some(8080));
    w.apply(&plan);
    steady(&w, &svc, &judged, 100);

    // It leaves: back to the placeholder in place.
    let plan = w.plan(&svc, &[], 100);
    assert!(plan.deletes.is_empty());
    assert_eq!(names(&plan), vec!["web-http"]);
    assert_eq!(plan.applies[0].ports.as_deref(), Some(&[][..]));
    w.apply(&plan);
    steady(&w, &svc, &[], 100);
}

/// A Service whose only port is unnamed and resolves by name: its own
/// group is the family's placeholder, `ports: []`, as native publishes.
#[test]
fn unnamed_port_with_unknown_number_publishes_ports_empty() {
    let svc = service("web", vec![port("", 80, named("web"))], &["IPv4"]);
    let mut w = World::default();
    let plan = w.plan(&svc, &[], 100);
    assert_eq!(names(&plan), vec!["web-80"]);
    assert_eq!(plan.applies[0].ports.as_deref(), Some(&[][..]));
    w.apply(&plan);
    steady(&w, &svc, &[], 100);
    let pods = many_pods(2, false);
    let judged = include_all(&svc, &pods);
    let plan = w.plan(&svc, &judged, 100);
    assert_eq!(names(&plan), vec!["web-80"]);
    assert!(plan.deletes.is_empty());
    assert_eq!(plan.applies[0].ports.as_ref().unwrap()[0].port, Some(8080));
    w.apply(&plan);
    steady(&w, &svc, &judged, 100);
}

/// Upgrade: a placeholder written before the fix (a port with a name and
/// no number) is rewritten in place to `ports: []`, one update.
#[test]
fn numberless_placeholder_from_before_is_rewritten_in_place() {
    let svc = service("web", vec![port("http", 80, named("web"))], &["IPv4"]);
    let mut w = World::default();
    w.apply(&w.plan(&svc, &[], 100));
    let mut old = w.get("web-http").clone();
    old.ports = Some(vec![k8s_openapi::api::discovery::v1::EndpointPort {
        name: Some("http".into()),
        port: None,
        protocol: Some("TCP".into()),
        app_protocol: None,
    }]);
    w.slices.insert("web-http".into(), Arc::new(old));
    let plan = w.plan(&svc, &[], 100);
    assert_eq!(names(&plan), vec!["web-http"]);
    assert!(plan.deletes.is_empty(), "{:?}", plan.deletes);
    assert_eq!(plan.applies[0].ports.as_deref(), Some(&[][..]));
    w.apply(&plan);
    steady(&w, &svc, &[], 100);
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
fn collisions_are_reported_and_never_written() {
    let svc = http_svc();
    let pods = many_pods(150, false);
    let judged = include_all(&svc, &pods);
    let mut w = World::default();
    // Another Service of ours named `web-http`'s ... and a native slice.
    w.slices.insert(
        "web-http".into(),
        foreign("web-http", MANAGER, "web-h", "IPv4"),
    );
    w.slices.insert(
        "web-http--3".into(),
        foreign(
            "web-http--3",
            "endpointslice-controller.k8s.io",
            "other",
            "IPv4",
        ),
    );
    let plan = w.plan(&svc, &judged, 100);
    assert_eq!(names(&plan), vec!["web-http--2", "web-http--4"]);
    assert_eq!(
        plan.collisions,
        vec![
            Collision {
                name: "web-http".into(),
                holder: "portwise for Service web-h".into(),
            },
            Collision {
                name: "web-http--3".into(),
                holder: "endpointslice-controller.k8s.io for Service other".into(),
            },
        ]
    );
    assert!(plan.deletes.is_empty());
    let before = w.slices["web-http"].clone();
    w.apply(&plan);
    assert_eq!(w.slices["web-http"], before);
    // Sticky: the next plan neither writes nor reports again.
    let again = w.plan(&svc, &judged, 100);
    assert!(again.applies.is_empty() && again.deletes.is_empty() && again.collisions.is_empty());
    // The other owner's slice is not in our owned set even if handed in.
    let owned = vec![w.slices["web-http"].clone()];
    let lookup = |n: &str| w.slices.get(n).cloned();
    let p = plan_fn(&svc, &judged, &owned, &lookup);
    assert!(!p.deletes.contains(&"web-http".to_string()));
}

fn plan_fn(
    svc: &Service,
    judged: &[Judged],
    owned: &[Arc<EndpointSlice>],
    lookup: &dyn Fn(&str) -> Option<Arc<EndpointSlice>>,
) -> Plan {
    plan(&PlanInput {
        service: svc,
        managed_by: MANAGER,
        max_endpoints_per_slice: 100,
        judged,
        zones: None,
        owned,
        lookup,
        triggers: Triggers::none(),
    })
}

#[test]
fn reclaims_a_slice_whose_manager_label_was_stripped() {
    let svc = http_svc();
    let pods = many_pods(3, false);
    let judged = include_all(&svc, &pods);
    let mut w = World::default();
    w.apply(&w.plan(&svc, &judged, 100));
    let mut stripped = (*w.slices["web-http"]).clone();
    stripped
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .remove(MANAGED_BY_LABEL);
    w.slices.insert("web-http".into(), Arc::new(stripped));
    assert!(is_ours(&w.slices["web-http"], &svc, MANAGER));
    let plan = w.plan(&svc, &judged, 100);
    assert_eq!(names(&plan), vec!["web-http"]);
    assert_eq!(
        plan.applies[0]
            .metadata
            .labels
            .as_ref()
            .unwrap()
            .get(MANAGED_BY_LABEL)
            .map(String::as_str),
        Some(MANAGER)
    );
    w.apply(&plan);
    steady(&w, &svc, &judged, 100);

    // Someone else's manager label with our owner: not ours, left alone.
    let mut taken = (*w.slices["web-http"]).clone();
    taken
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(MANAGED_BY_LABEL.into(), "someone".into());
    w.slices.insert("web-http".into(), Arc::new(taken));
    let plan = w.plan(&svc, &judged, 100);
    assert_eq!(names(&plan), vec!["web-http--2"]);
    assert_eq!(plan.collisions.len(), 1);
    assert!(plan.deletes.is_empty());
}

#[test]
fn manual_edits_are_repaired() {
    let svc = http_svc();
    let pods = many_pods(3, false);
    let judged = include_all(&svc, &pods);
    let mut w = World::default();
    w.apply(&w.plan(&svc, &judged, 100));
    let clean = w.clone();

    let edit = |f: &dyn Fn(&mut EndpointSlice)| {
        let mut w = clean.clone();
        let mut s = (*w.slices["web-http"]).clone();
        f(&mut s);
        w.slices.insert("web-http".into(), Arc::new(s));
        w
    };
    let cases: Vec<(&str, World)> = vec![
        (
            "condition flipped",
            edit(&|s| {
                s.endpoints.as_mut().unwrap()[0]
                    .conditions
                    .as_mut()
                    .unwrap()
                    .ready = Some(false)
            }),
        ),
        (
            "endpoint removed",
            edit(&|s| {
                s.endpoints.as_mut().unwrap().remove(1);
            }),
        ),
        (
            "foreign endpoint added",
            edit(&|s| {
                let mut e = s.endpoints.as_ref().unwrap()[0].clone();
                e.addresses = vec!["192.0.2.1".into()];
                s.endpoints.as_mut().unwrap().push(e);
            }),
        ),
        (
            "reordered",
            edit(&|s| s.endpoints.as_mut().unwrap().reverse()),
        ),
        (
            "port changed",
            edit(&|s| s.ports.as_mut().unwrap()[0].port = Some(1)),
        ),
        (
            "service label changed",
            edit(&|s| {
                s.metadata
                    .labels
                    .as_mut()
                    .unwrap()
                    .insert("app".into(), "x".into());
            }),
        ),
        (
            "owner reference loosened",
            edit(&|s| s.metadata.owner_references.as_mut().unwrap()[0].block_owner_deletion = None),
        ),
    ];
    for (what, w) in cases {
        let plan = w.plan(&svc, &judged, 100);
        assert_eq!(names(&plan), vec!["web-http"], "{what}");
        assert!(plan.deletes.is_empty(), "{what}");
        let mut w = w;
        w.apply(&plan);
        steady(&w, &svc, &judged, 100);
    }

    // Labels others add are theirs: no write.
    let w = edit(&|s| {
        s.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("extra".into(), "x".into());
    });
    assert!(w.plan(&svc, &judged, 100).applies.is_empty());
}

#[test]
fn removed_port_is_deleted_and_max_shrink_rechunks() {
    let svc = service(
        "web",
        vec![port("http", 80, named("web")), port("admin", 90, num(90))],
        &["IPv4"],
    );
    let pods = many_pods(20, false);
    let mut w = World::default();
    w.apply(&w.plan(&svc, &include_all(&svc, &pods), 100));
    assert_eq!(w.names(), vec!["web-admin.http"]);

    // The port goes: its members now back `http` alone, and move to that
    // group's slice, written before the old one is deleted.
    let only_http = http_svc();
    let judged = include_all(&only_http, &pods);
    let plan = w.plan(&only_http, &judged, 100);
    assert_eq!(names(&plan), vec!["web-http"]);
    assert_eq!(plan.deletes, vec!["web-admin.http"]);
    w.apply(&plan);
    steady(&w, &only_http, &judged, 100);

    let plan = w.plan(&only_http, &judged, 8);
    for s in &plan.applies {
        assert!(addresses(s).len() <= 8);
    }
    assert_eq!(
        names(&plan),
        vec!["web-http--2", "web-http--3", "web-http"],
        "the slices gaining the overflow first"
    );
    w.apply(&plan);
    steady(&w, &only_http, &judged, 8);
    let total: usize = w.owned(&only_http).iter().map(|s| addresses(s).len()).sum();
    assert_eq!(total, 20);
}

/// `maxEndpointsPerSlice` lowered from 100 to 40 over 250 endpoints: the
/// overflow moves from the live slices to new ones. Whichever apply fails
/// (the writer then holds back the rest of the set), no endpoint that was
/// published is missing.
#[test]
fn lowered_max_writes_the_gaining_slices_first() {
    let svc = http_svc();
    let pods = many_pods(250, false);
    let judged = include_all(&svc, &pods);
    let mut w = World::default();
    w.apply(&w.plan(&svc, &judged, 100));
    assert_eq!(w.names(), vec!["web-http", "web-http--2", "web-http--3"]);
    let published_set = |w: &World| {
        let mut all = published(w, &svc)[&("http".to_string(), "IPv4".to_string())].clone();
        all.sort();
        all.dedup();
        all
    };
    let before = published_set(&w);
    assert_eq!(before.len(), 250);

    let plan = w.plan(&svc, &judged, 40);
    assert_eq!(
        names(&plan),
        vec![
            "web-http--4",
            "web-http--5",
            "web-http--6",
            "web-http--7",
            "web-http",
            "web-http--2",
            "web-http--3",
        ],
        "new slices (gaining) before the live ones losing their overflow"
    );
    assert!(plan.deletes.is_empty());
    for refused in 0..plan.applies.len() {
        let mut partial = w.clone();
        partial.apply(&Plan {
            applies: plan.applies[..refused].to_vec(),
            ..Plan::default()
        });
        assert_eq!(
            published_set(&partial),
            before,
            "apply {refused} ({}) refused",
            names(&plan)[refused]
        );
    }
    w.apply(&plan);
    assert_eq!(published_set(&w), before);
    steady(&w, &svc, &judged, 40);
}

#[test]
fn target_port_change_rewrites_in_place() {
    let svc = service("web", vec![port("admin", 90, num(9000))], &["IPv4"]);
    let pods = many_pods(150, false);
    let mut w = World::default();
    w.apply(&w.plan(&svc, &include_all(&svc, &pods), 100));
    let svc2 = service("web", vec![port("admin", 90, num(9001))], &["IPv4"]);
    let judged = include_all(&svc2, &pods);
    let plan = w.plan(&svc2, &judged, 100);
    assert_eq!(
        names(&plan),
        vec!["web-admin", "web-admin--2"],
        "recycled, not renamed"
    );
    assert!(plan.deletes.is_empty());
    w.apply(&plan);
    steady(&w, &svc2, &judged, 100);
}

#[test]
fn no_new_slices_while_the_service_is_deleted() {
    let mut svc = http_svc();
    let pods = many_pods(150, false);
    let mut w = World::default();
    w.apply(&w.plan(&svc, &include_all(&svc, &pods[..50]), 100));
    svc.metadata.deletion_timestamp = Some(Time("2026-01-01T00:00:00Z".parse().unwrap()));

    // Ten members leave and a hundred arrive: the live slice is rewritten
    // and filled, but no new slice is created for the rest.
    let plan = w.plan(&svc, &include_all(&svc, &pods[10..150]), 100);
    assert_eq!(names(&plan), vec!["web-http"]);
    assert_eq!(addresses(&plan.applies[0]).len(), 100);
    assert_eq!(plan.summary.slices, 1);
    assert!(plan.deletes.is_empty());

    // No placeholder for a port that has none.
    let two = {
        let mut s = service(
            "web",
            vec![port("http", 80, named("web")), port("admin", 90, num(90))],
            &["IPv4"],
        );
        s.metadata.deletion_timestamp = svc.metadata.deletion_timestamp.clone();
        s
    };
    let plan = w.plan(
        &two,
        &judge(&two, &pods[..50], |_, p, _| {
            if p == "http" {
                Decision::Include
            } else {
                Decision::Exclude
            }
        }),
        100,
    );
    assert!(plan.applies.is_empty(), "{:?}", names(&plan));

    // Members gone: the existing slice becomes the placeholder (an update).
    let plan = w.plan(&svc, &[], 100);
    assert_eq!(names(&plan), vec!["web-http"]);
    assert!(plan.deletes.is_empty());
    assert_eq!(addresses(&plan.applies[0]).len(), 0);
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

/// The `last-change-trigger-time` annotation on the writes of a plan
/// (`trigger.rs` holds the rule's own tests).
mod trigger_time {
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
}

mod v1_endpoints {
    use k8s_openapi::api::core::v1::{EndpointAddress, Endpoints};

    use super::*;

    fn ips(a: &Option<Vec<EndpointAddress>>) -> Vec<String> {
        a.iter().flatten().map(|a| a.ip.clone()).collect()
    }

    #[test]
    fn grouped_by_port_set_with_ready_and_not_ready() {
        let svc = service(
            "web",
            vec![
                port("http", 80, named("web")),
                port("https", 443, num(8443)),
            ],
            &["IPv4", "IPv6"],
        );
        let pods = vec![
            Arc::new(pod("a", &["10.244.0.1", "fd00::1"], 8080)),
            Arc::new(pod("b", &["10.244.0.2", "fd00::2"], 8080)),
            Arc::new(terminating(pod("c", &["10.244.0.3", "fd00::3"], 8080))),
            Arc::new(pod("d", &["10.244.0.4", "fd00::4"], 8080)),
        ];
        // http: a, b, c; https: b, c, d
        let judged = judge(&svc, &pods, |p, port, _| {
            let n = p.metadata.name.as_deref().unwrap();
            if (port == "http" && n != "d") || (port == "https" && n != "a") {
                Decision::Include
            } else {
                Decision::Exclude
            }
        });
        let plan = World::default().plan(&svc, &judged, 100);
        let ep = plan_endpoints(&svc, &plan.members, MANAGER);
        let subsets = ep.subsets.clone().unwrap();
        let ports = |i: usize| {
            subsets[i]
                .ports
                .iter()
                .flatten()
                .map(|p| (p.name.clone().unwrap(), p.port))
                .collect::<Vec<_>>()
        };
        assert_eq!(subsets.len(), 3);
        assert_eq!(ports(0), vec![("http".to_string(), 8080)]);
        assert_eq!(ips(&subsets[0].addresses), vec!["10.244.0.1"]);
        assert_eq!(
            ports(1),
            vec![("http".to_string(), 8080), ("https".to_string(), 8443)]
        );
        assert_eq!(ips(&subsets[1].addresses), vec!["10.244.0.2"]);
        assert_eq!(
            ips(&subsets[1].not_ready_addresses),
            vec!["10.244.0.3"],
            "terminating"
        );
        assert_eq!(ports(2), vec![("https".to_string(), 8443)]);
        assert_eq!(ips(&subsets[2].addresses), vec!["10.244.0.4"]);
        let labels = ep.metadata.labels.clone().unwrap();
        assert_eq!(labels[SKIP_MIRROR_LABEL], "true");
        assert_eq!(labels[ENDPOINTS_MANAGED_BY_LABEL], MANAGER);
        assert_eq!(labels["app"], "web");
        assert_eq!(ep.metadata.name.as_deref(), Some("web"));
        assert_eq!(ep.metadata.annotations, None);
        let t = subsets[0].addresses.as_ref().unwrap()[0]
            .target_ref
            .clone()
            .unwrap();
        assert_eq!(t.name.as_deref(), Some("a"));

        // Diff: identical is quiet; defaulting is ignored; edits are seen.
        assert!(!endpoints_differ(&ep, &ep));
        let mut defaulted = ep.clone();
        for s in defaulted.subsets.as_mut().unwrap() {
            for p in s.ports.as_mut().unwrap() {
                p.protocol = None;
            }
        }
        defaulted
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("theirs".into(), "x".into());
        assert!(!endpoints_differ(&ep, &defaulted));
        let mut edited = ep.clone();
        edited.subsets.as_mut().unwrap().pop();
        assert!(endpoints_differ(&ep, &edited));
        let mut capped = ep.clone();
        capped.metadata.annotations = Some(BTreeMap::from([(
            OVER_CAPACITY_ANNOTATION.into(),
            "truncated".into(),
        )]));
        assert!(endpoints_differ(&ep, &capped));
        assert!(endpoints_differ(&ep, &Endpoints::default()));
    }

    #[test]
    fn capped_at_1000_with_annotation() {
        let svc = http_svc();
        let mut pods = many_pods(1100, false);
        for p in pods.iter_mut().skip(1050) {
            *p = Arc::new(terminating((**p).clone()));
        }
        let plan = World::default().plan(&svc, &include_all(&svc, &pods), 100);
        let ep = plan_endpoints(&svc, &plan.members, MANAGER);
        let total: usize = ep
            .subsets
            .iter()
            .flatten()
            .map(|s| ips(&s.addresses).len() + ips(&s.not_ready_addresses).len())
            .sum();
        assert_eq!(total, MAX_LEGACY_ADDRESSES);
        let s = &ep.subsets.as_ref().unwrap()[0];
        assert_eq!(ips(&s.addresses).len(), 1000, "ready ones are kept first");
        assert_eq!(s.not_ready_addresses, None);
        assert_eq!(
            ep.metadata.annotations.as_ref().unwrap()[OVER_CAPACITY_ANNOTATION],
            "truncated"
        );

        // under the cap with not-ready ones: ready all kept, not-ready trimmed
        let mut pods = many_pods(1010, false);
        for p in pods.iter_mut().skip(900) {
            *p = Arc::new(terminating((**p).clone()));
        }
        let plan = World::default().plan(&svc, &include_all(&svc, &pods), 100);
        let ep = plan_endpoints(&svc, &plan.members, MANAGER);
        let s = &ep.subsets.as_ref().unwrap()[0];
        assert_eq!(
            (ips(&s.addresses).len(), ips(&s.not_ready_addresses).len()),
            (900, 100)
        );
    }

    #[test]
    fn primary_family_only_and_headless_label() {
        let mut svc = service(
            "web",
            vec![port("http", 80, named("web"))],
            &["IPv6", "IPv4"],
        );
        svc.spec.as_mut().unwrap().cluster_ip = Some("None".into());
        let pods = many_pods(2, true);
        let plan = World::default().plan(&svc, &include_all(&svc, &pods), 100);
        let ep = plan_endpoints(&svc, &plan.members, MANAGER);
        let s = &ep.subsets.as_ref().unwrap()[0];
        assert_eq!(ips(&s.addresses), vec!["fd00:10:244::1", "fd00:10:244::2"]);
        assert_eq!(ep.metadata.labels.as_ref().unwrap()[HEADLESS_LABEL], "");

        let empty = plan_endpoints(&svc, &[], MANAGER);
        assert_eq!(empty.subsets, None);
    }
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
    let subjects = crate::align::subjects(&Arc::new(svc.clone()), &pods);
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
    assert!(crate::align::subjects(&Arc::new(clustered), &pods).is_empty());
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

/// `web: 80→8080` and `alt: 8080→8080`, with `members(port)` deciding who
/// backs which (issue 26: Cilium keys a backend by address and port).
fn shared_target(members: &[(&str, &[&str])]) -> (Service, Vec<Arc<Pod>>, Vec<Judged>) {
    let svc = service(
        "colo",
        vec![port("web", 80, num(8080)), port("alt", 8080, num(8080))],
        &["IPv4"],
    );
    let pods: Vec<Arc<Pod>> = ["a", "b", "c"]
        .iter()
        .enumerate()
        .map(|(i, n)| Arc::new(pod(n, &[&format!("10.244.0.{}", i + 1)], 8080)))
        .collect();
    let judged = judge(&svc, &pods, |p, port, _| {
        let n = p.metadata.name.as_deref().unwrap();
        let yes = members
            .iter()
            .any(|(pt, pods)| *pt == port && pods.contains(&n));
        if yes {
            Decision::Include
        } else {
            Decision::Exclude
        }
    });
    (svc, pods, judged)
}

/// Every (address type, address, port number, protocol) of our slices, and
/// how many slices list it: a consumer keying backends by them (Cilium)
/// must find each in one slice only.
fn backends_once(w: &World, svc: &Service) {
    let mut seen: BTreeMap<(String, String, Option<i32>, String), Vec<String>> = BTreeMap::new();
    for s in w.owned(svc) {
        let numbers: BTreeSet<(Option<i32>, String)> = s
            .ports
            .iter()
            .flatten()
            .map(|p| (p.port, p.protocol.clone().unwrap_or_default()))
            .collect();
        for a in addresses(&s) {
            for (n, proto) in &numbers {
                seen.entry((s.address_type.clone(), a.clone(), *n, proto.clone()))
                    .or_default()
                    .push(s.metadata.name.clone().unwrap());
            }
        }
    }
    for (backend, slices) in seen {
        assert_eq!(slices.len(), 1, "{backend:?} is in {slices:?}");
    }
}

fn port_names(s: &EndpointSlice) -> Vec<String> {
    s.ports
        .iter()
        .flatten()
        .map(|p| p.name.clone().unwrap())
        .collect()
}

fn members_of(w: &World, svc: &Service, port: &str) -> Vec<String> {
    let mut pods: Vec<String> = published(w, svc)
        .get(&(port.to_string(), "IPv4".to_string()))
        .into_iter()
        .flatten()
        .map(|(_, p)| p.clone())
        .collect();
    pods.sort();
    pods
}

#[test]
fn ports_sharing_a_target_publish_shared_endpoints_once() {
    let (svc, _, judged) = shared_target(&[("web", &["a", "b"]), ("alt", &["b", "c"])]);
    let mut w = World::default();
    let plan = w.plan(&svc, &judged, 100);
    w.apply(&plan);
    assert_eq!(w.names(), vec!["colo-alt", "colo-alt.web", "colo-web"]);
    assert_eq!(addresses(w.get("colo-web")), vec!["10.244.0.1"]);
    assert_eq!(addresses(w.get("colo-alt")), vec!["10.244.0.3"]);
    assert_eq!(addresses(w.get("colo-alt.web")), vec!["10.244.0.2"]);
    // Ports in the Service's order, both at the shared number.
    assert_eq!(port_names(w.get("colo-alt.web")), vec!["web", "alt"]);
    assert!(
        w.get("colo-alt.web")
            .ports
            .iter()
            .flatten()
            .all(|p| p.port == Some(8080) && p.protocol.as_deref() == Some("TCP"))
    );
    assert_eq!(members_of(&w, &svc, "web"), vec!["a", "b"]);
    assert_eq!(members_of(&w, &svc, "alt"), vec!["b", "c"]);
    backends_once(&w, &svc);
    assert_eq!(plan.summary.endpoints[&("web".into(), "IPv4".into())], 2);
    assert_eq!(plan.summary.endpoints[&("alt".into(), "IPv4".into())], 2);
    assert_eq!(plan.summary.endpoints_added, 4);
    assert_eq!(plan.summary.desired_slices, 3);
    assert!(plan.finishes.is_empty(), "nothing moved");
    steady(&w, &svc, &judged, 100);
}

/// Slices written by the one-slice-set-per-port layout (before issue 44)
/// are rewritten on the first plan into one slice per address, and no
/// write along the way leaves a member out of every slice of its port.
#[test]
fn the_per_port_layout_is_rewritten_with_no_member_missing() {
    let (svc, pods, judged) = seed();
    // The old layout: a slice per port, b and c in both.
    let mut w = World::default();
    for (only, members) in [("http", ["a", "b", "c"]), ("https", ["b", "c", "d"])] {
        let mut one = svc.clone();
        one.spec
            .as_mut()
            .unwrap()
            .ports
            .as_mut()
            .unwrap()
            .retain(|p| p.name.as_deref() == Some(only));
        let mine: Vec<Arc<Pod>> = pods
            .iter()
            .filter(|p| members.contains(&p.metadata.name.as_deref().unwrap()))
            .cloned()
            .collect();
        let mut old = World::default();
        old.apply(&old.plan(&one, &include_all(&one, &mine), 100));
        w.slices.extend(old.slices);
    }
    assert_eq!(w.names(), vec!["web-http", "web-https"]);
    assert_eq!(members_of(&w, &svc, "http"), vec!["a", "b", "c"]);

    let plan = w.plan(&svc, &judged, 100);
    // b and c move into the slice of both ports, created first; each old
    // slice is rewritten once, keeping its own port's member alone.
    assert_eq!(
        names(&plan),
        vec!["web-http.https", "web-http", "web-https"]
    );
    assert!(plan.deletes.is_empty());
    assert_eq!(
        names(&Plan {
            applies: plan.finishes.clone(),
            ..Plan::default()
        }),
        vec!["web-http.https"]
    );
    let mut step = w.clone();
    let writes = plan.applies.iter().chain(&plan.finishes);
    // (Between the writes b and c sit in two slices at once.)
    for (i, s) in writes.enumerate() {
        step.apply(&Plan {
            applies: vec![s.clone()],
            ..Plan::default()
        });
        assert_eq!(
            {
                let mut m = members_of(&step, &svc, "http");
                m.dedup();
                m
            },
            vec!["a", "b", "c"],
            "after write {i}"
        );
        assert_eq!(
            {
                let mut m = members_of(&step, &svc, "https");
                m.dedup();
                m
            },
            vec!["b", "c", "d"],
            "after write {i}"
        );
    }
    w.apply(&plan);
    assert_eq!(addresses(w.get("web-http")), vec!["10.244.0.10"]);
    assert_eq!(
        addresses(w.get("web-http.https")),
        vec!["10.244.0.8", "10.244.0.9"]
    );
    assert_eq!(addresses(w.get("web-https")), vec!["10.244.0.7"]);
    steady(&w, &svc, &judged, 100);
}

#[test]
fn a_pod_changing_its_port_set_moves_and_finishes_the_move() {
    let (svc, _, judged) = shared_target(&[("web", &["a", "b"]), ("alt", &["b", "c"])]);
    let mut w = World::default();
    w.apply(&w.plan(&svc, &judged, 100));

    // b leaves alt: it moves from the shared slice to web's.
    let (_, _, judged) = shared_target(&[("web", &["a", "b"]), ("alt", &["c"])]);
    let plan = w.plan(&svc, &judged, 100);
    assert_eq!(names(&plan), vec!["colo-web"]);
    assert_eq!(plan.deletes, vec!["colo-alt.web"]);
    assert_eq!(
        plan.applies[0]
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(MOVING_IN_ANNOTATION))
            .map(String::as_str),
        Some("10.244.0.2"),
        "the first write names what moves in"
    );
    assert_eq!(
        plan.finishes.len(),
        1,
        "then it is written again, after the delete"
    );
    assert_eq!(plan.finishes[0].metadata.name.as_deref(), Some("colo-web"));
    assert!(
        plan.finishes[0]
            .metadata
            .annotations
            .iter()
            .flatten()
            .all(|(k, _)| k != MOVING_IN_ANNOTATION)
    );
    assert_eq!(plan.summary.endpoints_added, 0, "b was in web already");
    assert_eq!(plan.summary.endpoints_removed, 1, "b leaves alt");
    // Written in order, no write ever drops b from web.
    let mut partial = w.clone();
    partial.apply(&Plan {
        applies: plan.applies.clone(),
        ..Plan::default()
    });
    assert!(members_of(&partial, &svc, "web").contains(&"b".to_string()));
    w.apply(&plan);
    assert_eq!(members_of(&w, &svc, "web"), vec!["a", "b"]);
    assert_eq!(members_of(&w, &svc, "alt"), vec!["c"]);
    backends_once(&w, &svc);
    steady(&w, &svc, &judged, 100);

    // b rejoins alt, c joins web: b and c move into one shared slice.
    let (_, _, judged) = shared_target(&[("web", &["a", "b", "c"]), ("alt", &["b", "c"])]);
    let plan = w.plan(&svc, &judged, 100);
    w.apply(&plan);
    assert_eq!(members_of(&w, &svc, "web"), vec!["a", "b", "c"]);
    assert_eq!(members_of(&w, &svc, "alt"), vec!["b", "c"]);
    assert_eq!(
        addresses(w.get("colo-alt.web")),
        vec!["10.244.0.2", "10.244.0.3"]
    );
    assert!(!plan.finishes.is_empty());
    backends_once(&w, &svc);
    steady(&w, &svc, &judged, 100);

    // Everyone leaves alt: its port keeps a placeholder.
    let (_, _, judged) = shared_target(&[("web", &["a", "b", "c"])]);
    w.apply(&w.plan(&svc, &judged, 100));
    assert_eq!(members_of(&w, &svc, "alt"), Vec::<String>::new());
    assert_eq!(addresses(w.get("colo-alt")), Vec::<String>::new());
    assert_eq!(members_of(&w, &svc, "web"), vec!["a", "b", "c"]);
    backends_once(&w, &svc);
    steady(&w, &svc, &judged, 100);
}

#[test]
fn a_change_within_a_port_set_is_one_write() {
    let (svc, pods, judged) = shared_target(&[("web", &["a", "b"]), ("alt", &["b", "c"])]);
    let mut w = World::default();
    w.apply(&w.plan(&svc, &judged, 100));
    // b starts terminating: its endpoint's conditions change, in place.
    let mut pods = pods;
    pods[1] = Arc::new(terminating((*pods[1]).clone()));
    let judged = judge(&svc, &pods, |p, port, _| {
        let n = p.metadata.name.as_deref().unwrap();
        match (port, n) {
            ("web", "a" | "b") | ("alt", "b" | "c") => Decision::Include,
            _ => Decision::Exclude,
        }
    });
    let plan = w.plan(&svc, &judged, 100);
    assert_eq!(names(&plan), vec!["colo-alt.web"]);
    assert!(plan.deletes.is_empty() && plan.finishes.is_empty());
}

/// TCP and UDP on one number (DNS): a pod that backs both sits in one
/// slice listing both, as the native controller publishes it.
#[test]
fn ports_of_one_number_and_other_protocols_share_the_pods_slice() {
    let mut udp = port("dns-udp", 53, num(53));
    udp.protocol = Some("UDP".into());
    let svc = service("dns", vec![port("dns-tcp", 53, num(53)), udp], &["IPv4"]);
    let pods = vec![Arc::new(pod("a", &["10.244.0.1"], 53))];
    let judged = include_all(&svc, &pods);
    let mut w = World::default();
    w.apply(&w.plan(&svc, &judged, 100));
    assert_eq!(w.names(), vec!["dns-dns-tcp.dns-udp"]);
    let ports: Vec<_> = w
        .get("dns-dns-tcp.dns-udp")
        .ports
        .iter()
        .flatten()
        .map(|p| {
            (
                p.name.clone().unwrap(),
                p.port.unwrap(),
                p.protocol.clone().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        ports,
        vec![
            ("dns-tcp".to_string(), 53, "TCP".to_string()),
            ("dns-udp".to_string(), 53, "UDP".to_string())
        ]
    );
}
