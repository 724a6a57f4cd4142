//! Property tests of the planner over random pods, verdicts and live state
//! (issue 7, item 5).

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::IpAddr,
    sync::Arc,
};

use k8s_openapi::api::{
    core::v1::{Pod, Service},
    discovery::v1::EndpointSlice,
};
use proptest::prelude::*;

use super::{testutil::*, *};
use crate::{align, membership::Decision};

#[derive(Clone, Debug)]
struct PodSpec {
    v6: bool,
    web: u16,
    terminating: bool,
    node: u8,
}

#[derive(Clone, Debug)]
struct Case {
    families: Vec<&'static str>,
    publish_not_ready: bool,
    traffic: Option<&'static str>,
    deleting: bool,
    max: usize,
    pods: Vec<PodSpec>,
    /// Verdicts that built the live state, then the current ones
    /// (indexed by subject, wrapping).
    before: Vec<Decision>,
    now: Vec<Decision>,
    /// Perturbations of the live state.
    drop_slices: Vec<usize>,
    strip_labels: Vec<usize>,
    drop_endpoints: Vec<usize>,
    foreign: Vec<usize>,
    max_before: usize,
    /// Which subject flips, and which pod starts terminating, for the
    /// churn property.
    flip: usize,
    term: usize,
    /// The admin port's target before (9000) or after a Service edit (9001).
    admin_edit: bool,
    /// After the edit, `admin` targets a container port name no pod has,
    /// so no port of the Service may have a known number.
    admin_named: bool,
}

/// `cases` unless `PROPTEST_CASES` asks for another number (deep runs).
fn config(cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    ProptestConfig {
        cases,
        ..ProptestConfig::default()
    }
}

fn decision() -> impl Strategy<Value = Decision> {
    prop_oneof![
        Just(Decision::Include),
        Just(Decision::Exclude),
        Just(Decision::Abstain)
    ]
}

fn case() -> impl Strategy<Value = Case> {
    let pod = (
        any::<bool>(),
        // 9000: `http` resolves onto `admin`'s target, a shared target port.
        prop_oneof![Just(8080u16), Just(8081u16), Just(9000u16)],
        prop::bool::weighted(0.2),
        0u8..3,
    )
        .prop_map(|(v6, web, terminating, node)| PodSpec {
            v6,
            web,
            terminating,
            node,
        });
    (
        prop_oneof![
            Just(vec!["IPv4"]),
            Just(vec!["IPv6"]),
            Just(vec!["IPv4", "IPv6"]),
            Just(vec!["IPv6", "IPv4"])
        ],
        any::<bool>(),
        prop_oneof![
            Just(None),
            Just(Some("PreferClose")),
            Just(Some("PreferSameNode"))
        ],
        prop::bool::weighted(0.1),
        1usize..6,
        prop::collection::vec(pod, 0..30),
        prop::collection::vec(decision(), 1..40),
        prop::collection::vec(decision(), 1..40),
        (
            prop::collection::vec(0usize..20, 0..3),
            prop::collection::vec(0usize..20, 0..3),
            prop::collection::vec(0usize..20, 0..3),
            prop::collection::vec(0usize..12, 0..3),
            1usize..6,
        ),
        (
            any::<usize>(),
            any::<usize>(),
            prop::bool::weighted(0.2),
            prop::bool::weighted(0.2),
        ),
    )
        .prop_map(
            |(
                families,
                publish_not_ready,
                traffic,
                deleting,
                max,
                pods,
                before,
                now,
                (d, s, e, f, max_before),
                (flip, term, admin_edit, admin_named),
            )| Case {
                families,
                publish_not_ready,
                traffic,
                deleting,
                max,
                pods,
                before,
                now,
                drop_slices: d,
                strip_labels: s,
                drop_endpoints: e,
                foreign: f,
                max_before,
                flip,
                term,
                admin_edit,
                admin_named,
            },
        )
}

fn build(case: &Case) -> (Service, Vec<Arc<Pod>>) {
    let mut svc = service(
        "web",
        vec![
            port("http", 80, named("web")),
            port(
                "admin",
                90,
                if case.admin_named {
                    named("admin")
                } else {
                    num(9000 + i32::from(case.admin_edit))
                },
            ),
        ],
        &case.families,
    );
    let spec = svc.spec.as_mut().unwrap();
    spec.publish_not_ready_addresses = Some(case.publish_not_ready);
    spec.traffic_distribution = case.traffic.map(Into::into);
    let pods = case
        .pods
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let v4 = format!("10.244.0.{}", i + 1);
            let v6 = format!("fd00:10:244::{:x}", i + 1);
            let ips: Vec<&str> = if p.v6 { vec![&v4, &v6] } else { vec![&v4] };
            let mut pod = pod(&format!("p{i}"), &ips, p.web);
            pod.spec.as_mut().unwrap().node_name = Some(format!("node-{}", p.node));
            if p.terminating {
                pod = terminating(pod);
            }
            Arc::new(pod)
        })
        .collect();
    (svc, pods)
}

fn verdicts(svc: &Service, pods: &[Arc<Pod>], table: &[Decision]) -> Vec<Judged> {
    let mut judged = include_all(svc, pods);
    for (i, j) in judged.iter_mut().enumerate() {
        j.decision = table[i % table.len()];
    }
    judged
}

fn zones(node: &str) -> Option<String> {
    (node != "node-2").then(|| format!("zone-{}", &node[5..]))
}

/// Builds a live state by planning earlier verdicts, then damages it.
fn live_state(case: &Case, svc: &Service, pods: &[Arc<Pod>]) -> World {
    let mut w = World::default();
    let mut earlier = svc.clone();
    earlier.metadata.deletion_timestamp = None;
    earlier.spec.as_mut().unwrap().ports.as_mut().unwrap()[1].target_port = Some(num(9000));
    let plan = w.plan_with(
        &earlier,
        &verdicts(&earlier, pods, &case.before),
        case.max_before,
        Some(&zones),
    );
    w.apply(&plan);
    let names = w.names();
    let pick = |i: &usize| names.get(i % names.len().max(1)).cloned();
    for i in &case.drop_slices {
        if let Some(n) = pick(i) {
            w.slices.remove(&n);
        }
    }
    for i in &case.strip_labels {
        if let Some(n) = pick(i)
            && let Some(s) = w.slices.get(&n)
        {
            let mut s = (**s).clone();
            s.metadata.labels.as_mut().unwrap().remove(MANAGED_BY_LABEL);
            w.slices.insert(n, Arc::new(s));
        }
    }
    for i in &case.drop_endpoints {
        if let Some(n) = pick(i)
            && let Some(s) = w.slices.get(&n)
        {
            let mut s = (**s).clone();
            if let Some(e) = s.endpoints.as_mut().filter(|e| !e.is_empty()) {
                e.remove(i % e.len());
            }
            w.slices.insert(n, Arc::new(s));
        }
    }
    // Names other owners hold (some of which we may want).
    let candidates = [
        "web-http",
        "web-http--2",
        "web-http--3",
        "web-admin",
        "web-admin--2",
        "web-http--ipv6",
        "web-http--p8081",
        "web-http--p8080",
        "web-admin--ipv6",
        "web-http--ipv6--2",
        "web-admin--3",
        "web-http--4",
    ];
    for i in &case.foreign {
        let name = candidates[*i];
        if !w.slices.contains_key(name) {
            w.slices
                .insert(name.into(), foreign(name, "someone-else", "other", "IPv4"));
        }
    }
    w
}

/// Every endpoint in our slices: (port name, address type, port number,
/// address, pod).
type Published = BTreeSet<(String, String, Option<i32>, IpAddr, String)>;

fn endpoints(world: &World, svc: &Service) -> Published {
    let mut out = Published::new();
    for s in world.owned(svc) {
        for port in s.ports.iter().flatten() {
            for e in s.endpoints.iter().flatten() {
                out.insert((
                    port.name.clone().unwrap_or_default(),
                    s.address_type.clone(),
                    port.port,
                    align::parse_ip(&e.addresses[0]).unwrap(),
                    e.target_ref.as_ref().unwrap().name.clone().unwrap(),
                ));
            }
        }
    }
    out
}

fn run(w: &World, svc: &Service, judged: &[Judged], max: usize) -> Plan {
    w.plan_with(svc, judged, max, Some(&zones))
}

proptest! {
    #![proptest_config(config(400))]

    #[test]
    fn planner_properties(case in case()) {
        let (mut svc, pods) = build(&case);
        if case.deleting {
            svc.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2026-01-01T00:00:00Z".parse().unwrap(),
            ));
        }
        let before = live_state(&case, &svc, &pods);
        let judged = verdicts(&svc, &pods, &case.now);
        let plan = run(&before, &svc, &judged, case.max);

        // Deterministic: the same input (in any order) gives the same plan.
        let again = run(&before, &svc, &judged, case.max);
        prop_assert_eq!(&plan.applies, &again.applies);
        prop_assert_eq!(&plan.deletes, &again.deletes);
        prop_assert_eq!(&plan.collisions, &again.collisions);
        let mut shuffled = judged.clone();
        shuffled.reverse();
        let reversed = run(&before, &svc, &shuffled, case.max);
        prop_assert_eq!(&plan.applies, &reversed.applies);
        prop_assert_eq!(&plan.deletes, &reversed.deletes);

        // Never touch what is not ours.
        for s in &plan.applies {
            let name = s.metadata.name.clone().unwrap();
            if let Some(live) = before.slices.get(&name) {
                prop_assert!(is_ours(live, &svc, MANAGER), "overwrote {}", name);
            }
            prop_assert!(s.endpoints.as_ref().unwrap().len() <= case.max, "{} too big", name);
            prop_assert!(name.len() <= naming::MAX_NAME_LEN);
        }
        for d in &plan.deletes {
            prop_assert!(is_ours(&before.slices[d], &svc, MANAGER));
        }

        // Apply it.
        let mut after = before.clone();
        after.apply(&plan);
        for s in after.owned(&svc) {
            prop_assert!(s.endpoints.iter().flatten().count() <= case.max);
        }

        // Nothing published is lost on the way: written in order, an
        // endpoint published before and after the plan is published after
        // every prefix of the applies. (The writer stops a (port, family)
        // at its first failed apply, so any failure leaves such a prefix
        // of each set; deletes come last and drop nothing still wanted.)
        let kept: Published = endpoints(&before, &svc)
            .intersection(&endpoints(&after, &svc))
            .cloned()
            .collect();
        // Unless two slices swap endpoints, which no order can keep (see
        // `moves::order`).
        let mine: BTreeMap<String, Arc<EndpointSlice>> = before
            .owned(&svc)
            .into_iter()
            .map(|s| (s.metadata.name.clone().unwrap(), s))
            .collect();
        let swapped = super::moves::order(plan.applies.clone(), &mine).1;
        let mut partial = before.clone();
        for s in plan.applies.iter().filter(|_| !swapped) {
            partial.apply(&Plan { applies: vec![s.clone()], ..Plan::default() });
            let now = endpoints(&partial, &svc);
            let missing: Vec<_> = kept.difference(&now).collect();
            prop_assert!(
                missing.is_empty(),
                "after applying {:?} (order {:?}): {:?} missing",
                s.metadata.name,
                plan.applies.iter().map(|s| s.metadata.name.clone()).collect::<Vec<_>>(),
                missing
            );
        }

        // An oracle independent of the planner's own `members`: from the
        // verdicts and what was live before, per (port, family, address,
        // pod): include is published, exclude is absent, abstain is as it
        // was live; and nothing is published that no verdict allows.
        // (Conflicting verdicts for one key are ranked by their own test.)
        let strip = |p: &Published| -> BTreeSet<(String, String, IpAddr, String)> {
            p.iter().map(|(port, fam, _, ip, pod)| (port.clone(), fam.clone(), *ip, pod.clone())).collect()
        };
        let live_before = strip(&endpoints(&before, &svc));
        let live_after = strip(&endpoints(&after, &svc));
        let mut verdicts_by_key: HashMap<(String, String, IpAddr, String), Vec<Decision>> = HashMap::new();
        for j in &judged {
            verdicts_by_key
                .entry((
                    j.port.name.clone(),
                    align::address_type(j.family).to_string(),
                    j.address,
                    j.pod.metadata.name.clone().unwrap(),
                ))
                .or_default()
                .push(j.decision);
        }
        for ds in verdicts_by_key.values_mut() {
            ds.dedup();
        }
        for (key, ds) in &verdicts_by_key {
            if ds.len() != 1 {
                continue;
            }
            let published_now = live_after.contains(key);
            match ds[0] {
                Decision::Include if !case.deleting => {
                    prop_assert!(published_now, "included {:?} not published", key)
                }
                Decision::Include => {}
                Decision::Exclude => prop_assert!(!published_now, "excluded {:?} published", key),
                Decision::Abstain => {
                    if case.deleting {
                        prop_assert!(!published_now || live_before.contains(key));
                    } else {
                        prop_assert_eq!(
                            published_now,
                            live_before.contains(key),
                            "abstain changed {:?}",
                            key
                        );
                    }
                }
            }
        }
        for key in &live_after {
            let allowed = verdicts_by_key.get(key).is_some_and(|ds| {
                ds.contains(&Decision::Include)
                    || (ds.contains(&Decision::Abstain) && live_before.contains(key))
            });
            prop_assert!(allowed, "{:?} published without a verdict that allows it", key);
        }

        // Each member exactly once per (port, family); nothing else.
        let published = published(&after, &svc);
        let mut want: HashMap<(String, String), Vec<(std::net::IpAddr, String)>> = HashMap::new();
        for m in &plan.members {
            want.entry((m.port.name.clone(), align::address_type(m.family).to_string()))
                .or_default()
                .push((m.address, m.pod.metadata.name.clone().unwrap()));
        }
        for (group, members) in &want {
            let mut got = published.get(group).cloned().unwrap_or_default();
            got.sort();
            let mut members = members.clone();
            members.sort();
            if case.deleting {
                let mut dedup = got.clone();
                dedup.dedup();
                prop_assert_eq!(&dedup, &got, "duplicates in {:?}", group);
                prop_assert!(got.iter().all(|g| members.contains(g)));
            } else {
                prop_assert_eq!(&got, &members, "group {:?}", group);
            }
        }
        for (group, got) in &published {
            prop_assert!(want.contains_key(group) || got.is_empty(), "stray endpoints in {:?}", group);
        }
        // Summary agrees with what is published.
        let counted: BTreeMap<(String, String), usize> =
            published.iter().map(|(k, v)| (k.clone(), v.len())).filter(|(_, n)| *n > 0).collect();
        let summary: BTreeMap<(String, String), usize> =
            plan.summary.endpoints.iter().filter(|(_, n)| **n > 0).map(|(k, v)| (k.clone(), *v)).collect();
        prop_assert_eq!(counted, summary);
        prop_assert_eq!(plan.summary.slices, after.owned(&svc).len());

        // No slice port without a number: the API reads one as "all
        // ports", and consumers that dereference it crash (issue 44).
        for s in after.owned(&svc) {
            for p in s.ports.iter().flatten() {
                prop_assert!(p.port.is_some(), "{:?} has a port without a number: {:?}", s.metadata.name, p);
            }
        }

        // Every (port, family) whose number is known (a member, or a
        // numeric target) has a slice, and every family one at least,
        // unless the Service is going away.
        if !case.deleting {
            for group in plan.summary.endpoints.keys() {
                let known = (group.0 == "admin" && !case.admin_named) || plan.summary.endpoints[group] > 0;
                let has = after.owned(&svc).iter().any(|s| {
                    s.address_type == group.1
                        && s.ports.iter().flatten().any(|p| p.name.as_deref() == Some(group.0.as_str()))
                });
                prop_assert!(has || !known, "no slice for {:?}", group);
                let family = after.owned(&svc).iter().any(|s| s.address_type == group.1);
                prop_assert!(family, "no slice for family {}", group.1);
            }
        }

        // A consumer keying backends by (address, port number, protocol),
        // as Cilium does, finds each in one slice only (issue 26).
        let mut backends: HashMap<(String, IpAddr, Option<i32>, String), usize> = HashMap::new();
        for s in after.owned(&svc) {
            let numbers: BTreeSet<(Option<i32>, String)> = s
                .ports
                .iter()
                .flatten()
                .map(|p| (p.port, p.protocol.clone().unwrap_or_default()))
                .collect();
            for e in s.endpoints.iter().flatten() {
                let ip = align::parse_ip(&e.addresses[0]).unwrap();
                for (n, proto) in &numbers {
                    *backends.entry((s.address_type.clone(), ip, *n, proto.clone())).or_default() += 1;
                }
            }
        }
        if !case.deleting {
            for (b, n) in &backends {
                prop_assert_eq!(*n, 1, "{:?} listed by {} slices", b, n);
            }
        }

        // Each address sits in one slice of its family (the native
        // controller's layout), and that slice lists every port it backs
        // (the per-port comparison above): consumers that keep one slice
        // per address (Cilium ClusterMesh, AGIC, Linkerd) see all of them
        // (issue 44).
        if !case.deleting {
            let mut slices_of: HashMap<(String, IpAddr), Vec<Option<String>>> = HashMap::new();
            for s in after.owned(&svc) {
                for e in s.endpoints.iter().flatten() {
                    for a in e.addresses.iter().filter_map(|a| align::parse_ip(a)) {
                        slices_of.entry((s.address_type.clone(), a)).or_default().push(s.metadata.name.clone());
                    }
                }
            }
            for (a, slices) in &slices_of {
                prop_assert_eq!(slices.len(), 1, "{:?} is in {:?}", a, slices);
            }
        }

        // Re-planning the applied state writes nothing.
        let replan = run(&after, &svc, &judged, case.max);
        prop_assert!(
            replan.applies.is_empty() && replan.deletes.is_empty(),
            "re-plan wrote {:?} / deleted {:?}",
            replan.applies.iter().map(|s| s.metadata.name.clone()).collect::<Vec<_>>(),
            replan.deletes
        );
    }
}

/// Writes per (port name, address type).
fn writes(plan: &Plan, before: &World) -> BTreeMap<(String, String), usize> {
    let mut out: BTreeMap<(String, String), usize> = BTreeMap::new();
    let groups_of = |s: &EndpointSlice| -> Vec<(String, String)> {
        s.ports
            .iter()
            .flatten()
            .map(|p| (p.name.clone().unwrap_or_default(), s.address_type.clone()))
            .collect()
    };
    for s in &plan.applies {
        for g in groups_of(s) {
            *out.entry(g).or_default() += 1;
        }
    }
    for d in &plan.deletes {
        for g in groups_of(before.get(d)) {
            *out.entry(g).or_default() += 1;
        }
    }
    out
}

proptest! {
    #![proptest_config(config(300))]

    /// From a settled state, one verdict flipping, or one pod starting to
    /// terminate, costs one write (the pod's one slice), or a move when
    /// its set of ports changes.
    #[test]
    fn one_change_one_write_per_group(case in case()) {
        let (svc, pods) = build(&case);
        let mut world = live_state(&case, &svc, &pods);
        let judged = verdicts(&svc, &pods, &case.now);
        let plan = run(&world, &svc, &judged, case.max);
        world.apply(&plan);
        prop_assume!(!judged.is_empty());

        let mut flipped = judged.clone();
        let j = &mut flipped[case.flip % judged.len()];
        j.decision = if j.decision == Decision::Include { Decision::Exclude } else { Decision::Include };
        let plan = run(&world, &svc, &flipped, case.max);
        let w = writes(&plan, &world);
        // A flip of a pod that backs another port of the family (or may:
        // an abstention keeps what was published) changes its set of
        // ports: it moves between slices (the gainer, the loser, and the
        // gainer once more to finish the move, see `moves.rs`). Anything
        // else is one write of the pod's one slice.
        let flipped_at = &flipped[case.flip % judged.len()];
        let moves = judged.iter().any(|o| {
            o.port.name != flipped_at.port.name
                && o.family == flipped_at.family
                && o.pod.metadata.name == flipped_at.pod.metadata.name
                && o.decision != Decision::Exclude
        });
        let slices: Vec<_> = plan.applies.iter().map(|s| (s.metadata.name.clone(), s.endpoints.as_ref().map(|e| e.iter().map(|e| e.target_ref.as_ref().unwrap().name.clone()).collect::<Vec<_>>()))).collect();
        if moves {
            // (Three: the pod's port may also lose or regain its placeholder.)
            prop_assert!(
                plan.applies.len() + plan.deletes.len() <= 3,
                "a move: {:?}: applies {:?} deletes {:?}",
                w,
                slices,
                plan.deletes
            );
            prop_assert!(plan.finishes.len() <= 1);
        } else {
            prop_assert!(
                plan.applies.len() + plan.deletes.len() <= 1,
                "flip: {:?}: applies {:?} deletes {:?}",
                w,
                slices,
                plan.deletes
            );
            prop_assert!(plan.finishes.is_empty());
        }

        let victim = &pods[case.term % pods.len()];
        let moved: Vec<Arc<Pod>> = pods
            .iter()
            .map(|p| if Arc::ptr_eq(p, victim) { Arc::new(terminating((**p).clone())) } else { p.clone() })
            .collect();
        let judged_t: Vec<Judged> = judged
            .iter()
            .map(|j| {
                let mut j = j.clone();
                if j.pod.metadata.name == victim.metadata.name {
                    j.pod = moved[case.term % pods.len()].clone();
                }
                j
            })
            .collect();
        let plan = run(&world, &svc, &judged_t, case.max);
        let w = writes(&plan, &world);
        prop_assert!(w.values().all(|n| *n <= 1), "terminating: {:?}", w);
        // Its one slice per family.
        let mut per_family: BTreeMap<&str, usize> = BTreeMap::new();
        for s in &plan.applies {
            *per_family.entry(s.address_type.as_str()).or_default() += 1;
        }
        prop_assert!(per_family.values().all(|n| *n <= 1), "terminating: {:?}", per_family);
        prop_assert!(plan.deletes.is_empty());
    }
}
