//! The fields of each endpoint and slice: conditions, hostnames, hints,
//! labels, and the placeholders of ports without members.

use super::*;

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
