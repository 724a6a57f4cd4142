//! The slice planner: a pure function from (Service, judged members, live
//! slices) to the writes that make the cluster match.
//!
//! Why it is shaped this way:
//! - **Each address in one slice of its family, listing every port it
//!   backs** (the native controller's layout: it groups endpoints by their
//!   resolved ports). Colocated Services serve different pods per port, so
//!   endpoints are grouped by the exact set of Service ports they back
//!   (`group::group_by_port_set`): with `http → a,b,c` and `https → b,c,d`,
//!   `a` sits in a slice of `http`, `b` and `c` in one of both, `d` in one
//!   of `https`. A slice set per port instead put `b` in two slices, and
//!   consumers that keep one slice per address (Cilium, ClusterMesh, AGIC,
//!   Linkerd) then saw one of its ports. A named `targetPort` may resolve
//!   to different numbers on different pods mid-rollout, so a group has a
//!   set per combination of numbers. A pod whose set of ports changes moves
//!   between slices, and a move is finished by one more write ([`moves`]).
//! - **Churn.** Like upstream, endpoints stay in the slice they already sit
//!   in; new ones go to slices that are being rewritten anyway, then to the
//!   fullest slice they fit in, and only then to a new slice. One pod
//!   changing therefore rewrites its one slice of each family (two, and
//!   the write that finishes the move, when its set of ports changes),
//!   even with 1000 endpoints. (The Go library re-chunked a sorted list, so one
//!   pod could shift every later slice.)
//! - **Names are sticky.** A live slice keeps its name; the naming scheme
//!   ([`naming`]) only names new slices, skipping names that other owners
//!   hold (reported as [`Collision`]s, never overwritten; the endpoints go
//!   to the next free name so traffic keeps flowing). Before creating a
//!   slice, one of ours in the same (ports, family) that would otherwise be
//!   deleted is reused, as upstream does, so a change never costs a create
//!   plus a delete where one update would do.
//! - **Placeholders.** A (port, family) without members keeps one empty
//!   slice, reusing a live one where possible, when its number is known; a
//!   family with nothing else to publish keeps one `ports: []` slice, the
//!   native controller's placeholder. No slice port lacks a number
//!   ([`group::family_placeholders`] says why).
//! - **A Service being deleted** gets no new slices; existing ones are
//!   still updated (and filled before anything is dropped).
//! - **Abstain** keeps exactly what the live slices show, so a restart does
//!   not forget what was published.
//! - **Writes only on difference** ([`diff`]): a steady state plans nothing.
//! - **Gainers are written first** ([`Plan::applies`]): an endpoint moving
//!   between slices (say, after `maxEndpointsPerSlice` was lowered) is in its
//!   new slice before its old one drops it, whichever write fails.
//! - **Writes are dated** ([`trigger`]): a write that changes a slice's
//!   endpoints carries the `last-change-trigger-time` of the earliest change
//!   it publishes, as the native controller's do; other writes keep the live
//!   value.
//!
//! One file a job: this one runs the passes of [`plan()`]; `model.rs` is
//! what goes in and comes out; `live.rs` reads the live slices; `settle.rs`
//! settles abstentions; `group.rs` is a (ports, family) and its sets;
//! `moves.rs` orders and finishes moves between slices;
//! `pack.rs` packs a set into slices; `namer.rs` names new slices (after
//! the scheme of [`naming`]); [`object`] builds the objects, [`diff`]
//! compares them and [`trigger`] dates them; [`legacy`] is the `v1/Endpoints`
//! mirror.

pub mod diff;
mod group;
mod live;
mod model;
mod moves;
mod namer;
pub mod naming;
pub mod object;
mod pack;
pub mod replace;
mod settle;
pub mod trigger;
pub mod v1_endpoints;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    sync::Arc,
};

use k8s_openapi::{
    api::discovery::v1::{Endpoint, EndpointPort, EndpointSlice},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};

pub use live::is_ours;
pub use model::{
    Collision, Judged, MAX_ENDPOINTS_PER_SLICE, Member, Plan, PlanInput, Summary, ZoneLookup,
};
pub use moves::MOVING_IN_ANNOTATION;
pub use object::{HEADLESS_LABEL, MANAGED_BY_LABEL, SERVICE_NAME_LABEL};
pub use trigger::{TRIGGER_TIME_ANNOTATION, TriggerMemory, Triggers};
pub use v1_endpoints::{
    ENDPOINTS_MANAGED_BY_LABEL, MAX_LEGACY_ADDRESSES, OVER_CAPACITY_ANNOTATION, SKIP_MIRROR_LABEL,
    endpoints_differ, plan_endpoints,
};

use crate::align::{address_type, protocol};
use crate::membership::Family;
use group::{
    Desired, Group, GroupPlan, SetPlan, family_placeholders, gains, group_by_port_set,
    group_changes, primary_targets,
};
use live::{
    EpKey, GroupKey, PortKey, Targets, live_key, slice_group, slice_port_number, slice_targets,
};
use namer::Namer;
use pack::{Chunk, pack};
use settle::settle;

/// Plans the slices of one Service.
pub fn plan(input: &PlanInput) -> Plan {
    let svc = input.service;
    let max = input
        .max_endpoints_per_slice
        .clamp(1, MAX_ENDPOINTS_PER_SLICE);
    let deleting = svc.metadata.deletion_timestamp.is_some();
    let hints = object::Hints::of(svc);
    let manager = input.managed_by;

    // Our live slices, by name; and by (port, family).
    let mine: BTreeMap<String, Arc<EndpointSlice>> = input
        .owned
        .iter()
        .filter(|s| is_ours(s, svc, manager))
        .filter_map(|s| Some((s.metadata.name.clone()?, s.clone())))
        .collect();
    let mut live_by_group: HashMap<GroupKey, Vec<Arc<EndpointSlice>>> = HashMap::new();
    for s in mine.values() {
        if let Some(k) = slice_group(s) {
            live_by_group.entry(k).or_default().push(s.clone());
        }
    }

    // The (port, family) groups the Service asks for.
    let mut groups = group::groups(svc);
    let wanted_ports: HashSet<PortKey> = groups
        .iter()
        .map(|g| (g.names[0].clone(), g.family))
        .collect();

    // Settle abstentions against what the live slices show.
    let members = settle(input, &mine, &wanted_ports);
    let (dating, trigger_memory) = trigger::Dating::new(
        svc,
        input.triggers,
        input.judged.iter().map(|j| &*j.pod),
        mine.is_empty(),
    );
    let mut desired = Desired::new();
    for m in &members {
        let ep = object::endpoint(svc, hints, &m.pod, m.address, input.zones);
        let key = (m.address, m.pod.metadata.name.clone().unwrap_or_default());
        desired
            .entry((vec![m.port.name.clone()], m.family))
            .or_default()
            .entry(vec![m.port.target])
            .or_default()
            .entry(key)
            .or_insert(ep);
    }
    // Each endpoint in the group of exactly the ports it backs; not while
    // the Service is being deleted, which can create no slice.
    if !deleting {
        group_by_port_set(svc, &mut groups, &mut desired);
    }
    // No slice port without a number: a family with nothing else to show
    // keeps the native controller's `ports: []` placeholder instead.
    family_placeholders(svc, &mut groups);

    let labels = object::slice_labels(svc, manager);
    let owner = object::owner_reference(svc);
    let build = |g: &Group, targets: Option<&Targets>, endpoints: Vec<Endpoint>, name: &str| {
        EndpointSlice {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: svc.metadata.namespace.clone(),
                labels: Some(labels.clone()),
                owner_references: Some(vec![owner.clone()]),
                ..Default::default()
            },
            address_type: address_type(g.family).to_string(),
            // A placeholder with no known number lists no port (the API
            // reads a port without a number as "all ports").
            ports: Some(match targets {
                Some(targets) if !g.portless => g
                    .ports
                    .iter()
                    .map(|sp| {
                        let name = sp.name.clone().unwrap_or_default();
                        // `targets` follow the group's sorted names.
                        let i = g.names.binary_search(&name).unwrap_or_default();
                        EndpointPort {
                            name: Some(name),
                            port: targets.get(i).map(|t| i32::from(*t)),
                            protocol: Some(protocol(sp.protocol.as_deref()).to_string()),
                            app_protocol: sp.app_protocol.clone(),
                        }
                    })
                    .collect(),
                _ => Vec::new(),
            }),
            endpoints: Some(endpoints),
        }
    };

    // Pass 1: pack every set into its live slices (and new ones).
    let mut plans: Vec<GroupPlan> = Vec::new();
    for g in groups {
        let mut live = live_by_group.remove(&g.key()).unwrap_or_default();
        live.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        let mut sets = Vec::new();
        for (targets, want) in desired.remove(&g.key()).unwrap_or_default() {
            let live_t: Vec<_> = live
                .iter()
                .filter(|s| slice_targets(s).as_ref() == Some(&targets))
                .cloned()
                .collect();
            let skeleton = build(&g, Some(&targets), Vec::new(), "");
            let meta_changed = |s: &EndpointSlice| {
                let mut sk = skeleton.clone();
                sk.metadata.name = s.metadata.name.clone();
                diff::slice_meta_differs(&sk, s, manager)
            };
            let chunks = pack(&want, live_t, max, &meta_changed, deleting);
            sets.push(SetPlan {
                targets,
                desired: want,
                chunks,
            });
        }
        plans.push(GroupPlan {
            group: g,
            live,
            sets,
            placeholder: None,
            placeholder_target: None,
        });
    }

    // Names kept by live slices that still hold endpoints.
    let mut used: BTreeSet<String> = BTreeSet::new();
    for p in &plans {
        for c in p.sets.iter().flat_map(|s| &s.chunks) {
            if let (Some(l), false) = (&c.live, c.keys.is_empty()) {
                used.extend(l.metadata.name.clone());
            }
        }
    }
    // Groups left without endpoints keep one live slice as their
    // placeholder (see `GroupPlan::choose_placeholder`).
    for p in &mut plans {
        p.choose_placeholder(&mut used, deleting, false);
    }
    // A family that publishes nothing else keeps one `ports: []` slice.
    for family in plans
        .iter()
        .map(|p| p.group.family)
        .collect::<BTreeSet<_>>()
    {
        let shown = plans.iter().any(|p| {
            p.group.family == family
                && (p.placeholder.is_some()
                    || p.sets
                        .iter()
                        .flat_map(|s| &s.chunks)
                        .any(|c| !c.keys.is_empty()))
        });
        if !shown
            && let Some(p) = plans
                .iter_mut()
                .find(|p| p.group.family == family && p.group.stands_for_family)
        {
            p.choose_placeholder(&mut used, deleting, true);
        }
    }

    // Pass 2: name new slices, in a fixed order.
    let mut namer = Namer {
        used,
        mine: &mine,
        lookup: input.lookup,
        svc,
        manager,
        deleting,
        collisions: Vec::new(),
    };
    for p in &mut plans {
        let primary = primary_targets(p);
        let family = p.group.family;
        for set in &mut p.sets {
            let stem = if Some(&set.targets) == primary.as_ref() {
                p.group.base.clone()
            } else {
                naming::stem(&p.group.base, Some(&set.targets))
            };
            for c in set
                .chunks
                .iter_mut()
                .filter(|c| c.live.is_none() && !c.keys.is_empty())
            {
                if let Some((name, live)) = namer.allocate(&stem, family, &p.live) {
                    c.name = Some(name);
                    c.live = live;
                }
            }
        }
        if let Some(ph) = p.placeholder.as_mut().filter(|c| c.name.is_none()) {
            if let Some((name, live)) = namer.allocate(&p.group.base, family, &p.live) {
                ph.name = Some(name);
                ph.live = live;
            } else {
                p.placeholder = None;
            }
        }
    }

    // Desired objects, and which of them differ.
    let mut out = Plan::default();
    let mut wanted: BTreeSet<String> = BTreeSet::new();
    // (gains an endpoint, slice)
    let mut applies: Vec<(bool, EndpointSlice)> = Vec::new();
    // (port, family, port number, endpoint) this plan publishes.
    let mut published: HashSet<(String, Family, Option<u16>, EpKey)> = HashSet::new();
    for p in &plans {
        let g = &p.group;
        let needed: usize = p
            .sets
            .iter()
            .map(|set| set.desired.len().div_ceil(max))
            .sum();
        // (The placeholder was chosen above: kept or not, it is settled.)
        let placeholder =
            g.keeps_placeholder && g.placeholder_target.is_some() || p.placeholder.is_some();
        out.summary.desired_slices += if placeholder { needed.max(1) } else { needed };
        // (A family's placeholder stands for no Service port.)
        for name in g.names.iter().filter(|_| !g.ports.is_empty()) {
            out.summary
                .endpoints
                .entry((name.clone(), address_type(g.family).to_string()))
                .or_insert(0);
        }
        // The group's endpoints whose publication changes (computed when a
        // write needs dating).
        let mut changes: Option<HashSet<EpKey>> = None;
        // (port numbers, chunk, its endpoints in the set)
        let placeholder_targets = p.placeholder_target.map(|t| vec![t]);
        let mut chunks: Vec<(Option<&Targets>, &Chunk, Option<&SetPlan>)> = Vec::new();
        for set in &p.sets {
            for c in set.chunks.iter().filter(|c| !c.keys.is_empty()) {
                chunks.push((Some(&set.targets), c, Some(set)));
            }
        }
        if let Some(ph) = &p.placeholder {
            chunks.push((placeholder_targets.as_ref(), ph, None));
        }
        for (targets, c, set) in chunks {
            let Some(name) = c
                .name
                .as_deref()
                .or_else(|| c.live.as_ref()?.metadata.name.as_deref())
            else {
                continue; // no name could be had (Service being deleted)
            };
            for (i, n) in g.names.iter().enumerate().filter(|_| !g.ports.is_empty()) {
                *out.summary
                    .endpoints
                    .entry((n.clone(), address_type(g.family).to_string()))
                    .or_insert(0) += c.keys.len();
                let number = targets.and_then(|t| t.get(i).copied());
                published.extend(
                    c.keys
                        .iter()
                        .map(|k| (n.clone(), g.family, number, k.clone())),
                );
            }
            wanted.insert(name.to_string());
            if !c.changed && c.live.is_some() {
                continue; // equal to its live state, as packing found
            }
            let eps = match set {
                Some(set) => c.keys.iter().map(|k| set.desired[k].clone()).collect(),
                None => Vec::new(),
            };
            let mut slice = build(g, targets, eps, name);
            let live = c.live.as_deref();
            if live.is_none_or(|l| diff::slice_differs(&slice, l, manager)) {
                let trigger = if diff::slice_content_differs(&slice, live) {
                    let changes = changes.get_or_insert_with(|| group_changes(p));
                    let touched: Vec<EpKey> = live
                        .into_iter()
                        .flat_map(|l| l.endpoints.iter().flatten())
                        .filter_map(live_key)
                        .chain(c.keys.iter().cloned())
                        .filter(|k| changes.contains(k))
                        .collect();
                    dating
                        .date(touched.iter().map(|(_, pod)| pod.as_str()))
                        .map(trigger::format_trigger_time)
                } else {
                    live.and_then(|l| {
                        l.metadata
                            .annotations
                            .as_ref()?
                            .get(TRIGGER_TIME_ANNOTATION)
                            .cloned()
                    })
                };
                if let Some(t) = trigger {
                    slice.metadata.annotations =
                        Some(BTreeMap::from([(TRIGGER_TIME_ANNOTATION.to_string(), t)]));
                }
                applies.push((gains(live, targets, &c.keys), slice));
            }
        }
    }
    // What the live slices show, against what this plan publishes, per
    // (port, family, port number, endpoint): the endpoints it adds and
    // removes. An endpoint moving between groups is neither.
    let mut shown: HashSet<(String, Family, Option<u16>, EpKey)> = HashSet::new();
    for s in mine.values() {
        let Some((names, family)) = slice_group(s) else {
            continue;
        };
        for n in &names {
            let number = slice_port_number(s, n);
            for k in s.endpoints.iter().flatten().filter_map(live_key) {
                shown.insert((n.clone(), family, number, k.clone()));
            }
        }
    }
    out.summary.endpoints_added += published.difference(&shown).count();
    out.summary.endpoints_removed += shown.difference(&published).count();
    // Gainers first, then by name (see `Plan::applies`).
    applies.sort_by(|(ga, a), (gb, b)| {
        gb.cmp(ga)
            .then_with(|| a.metadata.name.cmp(&b.metadata.name))
    });
    out.applies = moves::order(applies.into_iter().map(|(_, s)| s).collect(), &mine).0;
    out.deletes = mine
        .keys()
        .filter(|n| !wanted.contains(*n))
        .cloned()
        .collect();
    out.finishes = moves::mark_moves(&mut out.applies, &mine, &out.deletes);
    out.summary.slices = wanted.len();
    out.collisions = namer.collisions;
    out.members = members;
    out.trigger_memory = trigger_memory;
    out
}

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
/// Planner fixtures, shared with the tests of the crates built on the core
/// (feature `testutil`).
#[cfg(any(test, feature = "testutil"))]
#[doc(hidden)]
pub mod testutil;
