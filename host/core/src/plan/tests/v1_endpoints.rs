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
