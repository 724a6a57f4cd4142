//! The native-shaped layout: each address in one slice of its family,
//! listing every port it backs; moves between port sets.

use super::*;

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
