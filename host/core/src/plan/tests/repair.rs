//! What the planner finds in its way and puts right: name collisions,
//! stripped labels, manual edits, removed ports, a lowered maximum, a
//! Service being deleted.

use super::*;

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
