//! The slice planner: a pure function from (Service, judged members, live
//! slices) to the writes that make the cluster match.
//!
//! Why it is shaped this way:
//! - **One slice set per (Service port, family, target port).** Colocated
//!   Services serve different pods per port, and a named `targetPort` may
//!   resolve to different numbers on different pods mid-rollout, so a slice
//!   carries exactly one port.
//! - **Churn.** Like upstream, endpoints stay in the slice they already sit
//!   in; new ones go to slices that are being rewritten anyway, then to the
//!   fullest slice they fit in, and only then to a new slice. One pod
//!   changing therefore rewrites at most one slice per (port, family), even
//!   with 1000 endpoints. (The Go library re-chunked a sorted list, so one
//!   pod could shift every later slice.)
//! - **Names are sticky.** A live slice keeps its name; the naming scheme
//!   ([`naming`]) only names new slices, skipping names that other owners
//!   hold (reported as [`Collision`]s, never overwritten; the endpoints go
//!   to the next free name so traffic keeps flowing). Before creating a
//!   slice, one of ours in the same (port, family) that would otherwise be
//!   deleted is reused, as upstream does, so a change never costs a create
//!   plus a delete where one update would do.
//! - **Placeholders.** A (port, family) without members keeps one empty
//!   slice, reusing a live one where possible.
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

pub mod diff;
pub mod legacy;
pub mod naming;
pub mod object;
pub mod trigger;

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    net::IpAddr,
    sync::Arc,
};

use k8s_openapi::{
    api::{
        core::v1::{Pod, Service, ServicePort},
        discovery::v1::{Endpoint, EndpointPort, EndpointSlice},
    },
    apimachinery::pkg::{apis::meta::v1::ObjectMeta, util::intstr::IntOrString},
};

pub use legacy::{
    ENDPOINTS_MANAGED_BY_LABEL, MAX_LEGACY_ADDRESSES, OVER_CAPACITY_ANNOTATION, SKIP_MIRROR_LABEL,
    endpoints_differ, plan_endpoints,
};
pub use object::{HEADLESS_LABEL, MANAGED_BY_LABEL, SERVICE_NAME_LABEL};
pub use trigger::{TRIGGER_TIME_ANNOTATION, TriggerMemory, Triggers};

use crate::{
    align::{self, address_type, protocol},
    membership::{Decision, Family, ResolvedPort},
};

/// The largest `maxEndpointsPerSlice` the API accepts.
pub const MAX_ENDPOINTS_PER_SLICE: usize = 1000;

/// The zone of a node, by name (`topology.kubernetes.io/zone`).
pub type ZoneLookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// One judged (Service port, family, pod): what the checker said.
#[derive(Clone, Debug)]
pub struct Judged {
    pub port: ResolvedPort,
    pub family: Family,
    pub pod: Arc<Pod>,
    pub address: IpAddr,
    pub decision: Decision,
}

/// A member after abstentions are settled: it is published.
#[derive(Clone, Debug)]
pub struct Member {
    pub port: ResolvedPort,
    pub family: Family,
    pub pod: Arc<Pod>,
    pub address: IpAddr,
}

/// Everything the planner looks at.
pub struct PlanInput<'a> {
    pub service: &'a Service,
    /// Value of the managed-by label; also the server-side apply field owner.
    pub managed_by: &'a str,
    /// Clamped to 1..=1000.
    pub max_endpoints_per_slice: usize,
    pub judged: &'a [Judged],
    /// Zone of a node; `None` when node lookups are disabled.
    pub zones: Option<ZoneLookup<'a>>,
    /// Live slices this manager owns for this Service. Others are ignored.
    pub owned: &'a [Arc<EndpointSlice>],
    /// Any live slice in the Service's namespace, by name.
    pub lookup: &'a dyn Fn(&str) -> Option<Arc<EndpointSlice>>,
    /// What dates the writes (the trigger-time annotation).
    pub triggers: Triggers<'a>,
}

/// The writes to make.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    /// Complete desired slices for server-side apply; only those that differ
    /// from their live state. Slices that gain an endpoint (publish one their
    /// live state does not show; every new slice with endpoints) come first,
    /// the rest after; by name within each part. Written in this order, an
    /// endpoint moving between slices of its (port, family) is in its new
    /// slice before its old slice drops it, so a failed apply (which holds
    /// back the rest of its set, see `apply.rs`) never unpublishes it.
    pub applies: Vec<EndpointSlice>,
    /// Names of owned slices that are no longer wanted. Sorted.
    pub deletes: Vec<String>,
    /// Names we wanted but someone else holds.
    pub collisions: Vec<Collision>,
    pub summary: Summary,
    /// The members published, abstentions settled (input order).
    pub members: Vec<Member>,
    /// The trigger times this plan saw, for the next plan of the Service
    /// ([`PlanInput::triggers`]) once this one is written.
    pub trigger_memory: TriggerMemory,
}

/// A wanted slice name held by a slice that is not ours.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Collision {
    pub name: String,
    /// Who holds it, for the Event (manager and Service).
    pub holder: String,
}

/// Figures for metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Endpoints published per (Service port name, `IPv4`/`IPv6`); every
    /// (port, family) of the Service is present, also with 0.
    pub endpoints: BTreeMap<(String, String), usize>,
    /// Slices that exist for the Service once the plan is applied.
    pub slices: usize,
}

/// Whether `slice` is ours for `svc`: the Service is its controller owner
/// and the managed-by label is ours or was stripped (then we reclaim it).
pub fn is_ours(slice: &EndpointSlice, svc: &Service, managed_by: &str) -> bool {
    let Some(uid) = svc.metadata.uid.as_deref() else {
        return false;
    };
    let owner = slice.metadata.owner_references.iter().flatten().any(|o| {
        o.controller == Some(true) && o.kind == "Service" && o.api_version == "v1" && o.uid == uid
    });
    owner && label(&slice.metadata, MANAGED_BY_LABEL).is_none_or(|m| m == managed_by)
}

fn label<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.labels.as_ref()?.get(key).map(String::as_str)
}

/// Who holds a slice that is not ours, in words.
fn holder(slice: &EndpointSlice) -> String {
    let manager = label(&slice.metadata, MANAGED_BY_LABEL).unwrap_or("an unknown manager");
    let owner = slice
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| format!("{} {}", o.kind, o.name))
        .or_else(|| label(&slice.metadata, SERVICE_NAME_LABEL).map(|s| format!("Service {s}")));
    match owner {
        Some(o) => format!("{manager} for {o}"),
        None => manager.to_string(),
    }
}

fn slice_family(slice: &EndpointSlice) -> Option<Family> {
    match slice.address_type.as_str() {
        "IPv4" => Some(Family::V4),
        "IPv6" => Some(Family::V6),
        _ => None,
    }
}

/// (Service port name, family) of a live slice, when it has the one-port
/// shape portwise writes.
fn slice_group(slice: &EndpointSlice) -> Option<GroupKey> {
    let family = slice_family(slice)?;
    match slice.ports.as_deref() {
        Some([p]) => Some((p.name.clone().unwrap_or_default(), family)),
        // A port-less Service's slice (the apiserver may drop the empty list).
        None | Some([]) => Some((String::new(), family)),
        _ => None,
    }
}

/// Target port of a live slice (its only port's number); 0 for a
/// port-less slice.
fn slice_target(slice: &EndpointSlice) -> Option<u16> {
    match slice.ports.as_deref() {
        None | Some([]) => Some(0),
        Some([p, ..]) => u16::try_from(p.port?).ok().filter(|p| *p != 0),
    }
}

/// The Service port a port-less headless Service is planned under.
static PORTLESS: ServicePort = ServicePort {
    app_protocol: None,
    name: None,
    node_port: None,
    port: 0,
    protocol: None,
    target_port: None,
};

/// (Service port name, family).
type GroupKey = (String, Family);
/// An endpoint's identity within a set: its address and its pod's name.
type EpKey = (IpAddr, String);

fn live_key(ep: &Endpoint) -> Option<EpKey> {
    let ip = align::parse_ip(ep.addresses.first()?)?;
    let pod = ep.target_ref.as_ref()?.name.clone()?;
    Some((ip, pod))
}

/// A (Service port, family): one or more slice sets, one per target port.
struct Group<'a> {
    sp: &'a ServicePort,
    name: String,
    family: Family,
    /// Stem of the primary set and of the placeholder.
    base: String,
    /// The placeholder's port number: a numeric `targetPort` (or `port`).
    placeholder_target: Option<u16>,
    /// A port-less headless Service's group: its slices carry `ports: []`.
    portless: bool,
}

impl Group<'_> {
    fn key(&self) -> GroupKey {
        (self.name.clone(), self.family)
    }
}

fn placeholder_target(sp: &ServicePort) -> Option<u16> {
    let n = match &sp.target_port {
        None | Some(IntOrString::Int(0)) => sp.port,
        Some(IntOrString::Int(n)) => *n,
        Some(IntOrString::String(s)) if s.is_empty() => sp.port,
        Some(IntOrString::String(_)) => return None,
    };
    u16::try_from(n).ok().filter(|p| *p != 0)
}

/// A slice being planned: a live one (keeps its name) or a new one.
#[derive(Debug)]
struct Chunk {
    live: Option<Arc<EndpointSlice>>,
    /// Assigned to new chunks in the naming pass.
    name: Option<String>,
    keys: Vec<EpKey>,
    /// Will be written (so it may as well take new endpoints).
    changed: bool,
}

impl Chunk {
    fn sort_name(&self) -> &str {
        self.live
            .as_ref()
            .and_then(|s| s.metadata.name.as_deref())
            .unwrap_or("\u{10ffff}")
    }
}

struct SetPlan {
    target: u16,
    desired: BTreeMap<EpKey, Endpoint>,
    chunks: Vec<Chunk>,
}

struct GroupPlan<'a> {
    group: Group<'a>,
    /// Live owned slices of this group, by name.
    live: Vec<Arc<EndpointSlice>>,
    sets: Vec<SetPlan>,
    /// Set when the group has no endpoints.
    placeholder: Option<Chunk>,
    /// The placeholder's port number.
    placeholder_target: Option<u16>,
}

/// Plans the slices of one Service.
pub fn plan(input: &PlanInput) -> Plan {
    let svc = input.service;
    let svc_name = svc.metadata.name.as_deref().unwrap_or_default();
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
    let families = align::families(svc);
    let mut groups: Vec<Group> = Vec::new();
    let mut seen_ports = HashSet::new();
    if align::is_portless_headless(svc) {
        for &family in &families {
            groups.push(Group {
                sp: &PORTLESS,
                name: String::new(),
                family,
                base: naming::portless_base_name(svc_name, family),
                placeholder_target: Some(0),
                portless: true,
            });
        }
    }
    for sp in svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_deref())
        .unwrap_or_default()
    {
        let name = sp.name.clone().unwrap_or_default();
        if !seen_ports.insert(name.clone()) {
            continue;
        }
        for &family in &families {
            groups.push(Group {
                sp,
                name: name.clone(),
                family,
                base: naming::base_name(svc_name, &name, sp.port, family),
                placeholder_target: placeholder_target(sp),
                portless: false,
            });
        }
    }
    let wanted_groups: HashSet<GroupKey> = groups.iter().map(Group::key).collect();

    // Settle abstentions against what the live slices show.
    let members = settle(input, &mine, &wanted_groups);
    let (dating, trigger_memory) = trigger::Dating::new(
        svc,
        input.triggers,
        input.judged.iter().map(|j| &*j.pod),
        mine.is_empty(),
    );
    let mut desired: HashMap<GroupKey, BTreeMap<u16, BTreeMap<EpKey, Endpoint>>> = HashMap::new();
    for m in &members {
        let ep = object::endpoint(svc, hints, &m.pod, m.address, input.zones);
        let key = (m.address, m.pod.metadata.name.clone().unwrap_or_default());
        desired
            .entry((m.port.name.clone(), m.family))
            .or_default()
            .entry(m.port.target)
            .or_default()
            .entry(key)
            .or_insert(ep);
    }

    let labels = object::slice_labels(svc, manager);
    let owner = object::owner_reference(svc);
    let build =
        |g: &Group, target: Option<u16>, endpoints: Vec<Endpoint>, name: &str| EndpointSlice {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: svc.metadata.namespace.clone(),
                labels: Some(labels.clone()),
                owner_references: Some(vec![owner.clone()]),
                ..Default::default()
            },
            address_type: address_type(g.family).to_string(),
            ports: Some(if g.portless {
                Vec::new()
            } else {
                vec![EndpointPort {
                    name: Some(g.name.clone()),
                    port: target.map(i32::from),
                    protocol: Some(protocol(g.sp.protocol.as_deref()).to_string()),
                    app_protocol: g.sp.app_protocol.clone(),
                }]
            }),
            endpoints: Some(endpoints),
        };

    // Pass 1: pack every set into its live slices (and new ones).
    let mut plans: Vec<GroupPlan> = Vec::new();
    for g in groups {
        let mut live = live_by_group.remove(&g.key()).unwrap_or_default();
        live.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        let mut sets = Vec::new();
        for (target, want) in desired.remove(&g.key()).unwrap_or_default() {
            let live_t: Vec<_> = live
                .iter()
                .filter(|s| slice_target(s) == Some(target))
                .cloned()
                .collect();
            let skeleton = build(&g, Some(target), Vec::new(), "");
            let meta_changed = |s: &EndpointSlice| {
                let mut sk = skeleton.clone();
                sk.metadata.name = s.metadata.name.clone();
                diff::slice_meta_differs(&sk, s, manager)
            };
            let chunks = pack(&want, live_t, max, &meta_changed, deleting);
            sets.push(SetPlan {
                target,
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
    // placeholder, so emptying a group costs one write: the base name if it
    // exists, else a chunk of the base, else any slice of the group whose
    // target agrees (a `--p<target>` name keeps its target, so names stay
    // truthful).
    for p in &mut plans {
        if p.sets
            .iter()
            .flat_map(|s| &s.chunks)
            .any(|c| !c.keys.is_empty())
        {
            continue;
        }
        let base = &p.group.base;
        let wanted = p.group.placeholder_target;
        let free = |s: &&Arc<EndpointSlice>| {
            !used.contains(s.metadata.name.as_deref().unwrap_or_default())
        };
        let named = |s: &Arc<EndpointSlice>, f: &dyn Fn(&str) -> bool| {
            s.metadata.name.as_deref().is_some_and(f)
        };
        let canonical = naming::chunk_name(base, 1);
        let bare = p
            .live
            .iter()
            .filter(free)
            .find(|s| named(s, &|n| n == canonical))
            .or_else(|| {
                p.live
                    .iter()
                    .filter(free)
                    .find(|s| named(s, &|n| naming::is_chunk_of(n, base)))
            });
        let (reuse, target) = match bare {
            Some(s) => (Some(s), wanted),
            None => match p
                .live
                .iter()
                .filter(free)
                .find(|s| wanted.is_none() || slice_target(s) == wanted)
            {
                Some(s) => (Some(s), wanted.or_else(|| slice_target(s))),
                None => (None, wanted),
            },
        };
        if let Some(s) = reuse {
            used.extend(s.metadata.name.clone());
        }
        p.placeholder_target = target;
        if reuse.is_some() || !deleting {
            p.placeholder = Some(Chunk {
                live: reuse.cloned(),
                name: reuse.and_then(|s| s.metadata.name.clone()),
                keys: Vec::new(),
                changed: true,
            });
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
        let primary = primary_target(p);
        let family = p.group.family;
        for set in &mut p.sets {
            let stem = if Some(set.target) == primary {
                p.group.base.clone()
            } else {
                naming::stem(&p.group.base, Some(set.target))
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
    for p in &plans {
        let g = &p.group;
        let count = out
            .summary
            .endpoints
            .entry((g.name.clone(), address_type(g.family).to_string()))
            .or_insert(0);
        // The group's endpoints whose publication changes (computed when a
        // write needs dating).
        let mut changes: Option<HashSet<EpKey>> = None;
        // (target, chunk, its endpoints in the set)
        let mut chunks: Vec<(Option<u16>, &Chunk, Option<&SetPlan>)> = Vec::new();
        for set in &p.sets {
            for c in set.chunks.iter().filter(|c| !c.keys.is_empty()) {
                chunks.push((Some(set.target), c, Some(set)));
            }
        }
        if let Some(ph) = &p.placeholder {
            chunks.push((p.placeholder_target, ph, None));
        }
        for (target, c, set) in chunks {
            let Some(name) = c
                .name
                .as_deref()
                .or_else(|| c.live.as_ref()?.metadata.name.as_deref())
            else {
                continue; // no name could be had (Service being deleted)
            };
            *count += c.keys.len();
            wanted.insert(name.to_string());
            if !c.changed && c.live.is_some() {
                continue; // equal to its live state, as packing found
            }
            let eps = match set {
                Some(set) => c.keys.iter().map(|k| set.desired[k].clone()).collect(),
                None => Vec::new(),
            };
            let mut slice = build(g, target, eps, name);
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
                applies.push((gains(live, target, &c.keys), slice));
            }
        }
    }
    // Gainers first, then by name (see `Plan::applies`).
    applies.sort_by(|(ga, a), (gb, b)| {
        gb.cmp(ga)
            .then_with(|| a.metadata.name.cmp(&b.metadata.name))
    });
    out.applies = applies.into_iter().map(|(_, s)| s).collect();
    out.deletes = mine
        .keys()
        .filter(|n| !wanted.contains(*n))
        .cloned()
        .collect();
    out.summary.slices = wanted.len();
    out.collisions = namer.collisions;
    out.members = members;
    out.trigger_memory = trigger_memory;
    out
}

/// The endpoints of a group whose publication changes: shown by its live
/// slices and no longer wanted, wanted and not shown, or shown otherwise
/// (another target port, other fields). An endpoint that only moves between
/// slices of its set is not among them.
fn group_changes(p: &GroupPlan) -> HashSet<EpKey> {
    let mut shown: HashMap<EpKey, (Option<u16>, &Endpoint)> = HashMap::new();
    for s in &p.live {
        let target = slice_target(s);
        for ep in s.endpoints.iter().flatten() {
            if let Some(k) = live_key(ep) {
                shown.entry(k).or_insert((target, ep));
            }
        }
    }
    let mut changes = HashSet::new();
    let mut wanted: HashSet<&EpKey> = HashSet::new();
    for set in &p.sets {
        for (k, ep) in &set.desired {
            wanted.insert(k);
            let same = shown
                .get(k)
                .is_some_and(|(t, l)| *t == Some(set.target) && diff::endpoint_equal(ep, l));
            if !same {
                changes.insert(k.clone());
            }
        }
    }
    changes.extend(shown.into_keys().filter(|k| !wanted.contains(k)));
    changes
}

/// Whether a slice planned to hold `keys` at port `target` publishes an
/// endpoint that its live state `live` does not show. Endpoints are compared
/// as the planner identifies them (address and pod), together with the port:
/// a new slice gains whatever it holds, a live slice whose port changes
/// gains all of its endpoints.
fn gains(live: Option<&EndpointSlice>, target: Option<u16>, keys: &[EpKey]) -> bool {
    let Some(live) = live else {
        return !keys.is_empty();
    };
    if keys.is_empty() {
        return false;
    }
    if slice_target(live) != target {
        return true;
    }
    let shown: HashSet<EpKey> = live
        .endpoints
        .iter()
        .flatten()
        .filter_map(live_key)
        .collect();
    keys.iter().any(|k| !shown.contains(k))
}

/// Settles abstentions: an abstaining member stays iff the live slices we
/// own show it (same pod, same address) for that (port, family). Drops
/// members of ports or families the Service does not have, and duplicates.
fn settle(
    input: &PlanInput,
    mine: &BTreeMap<String, Arc<EndpointSlice>>,
    wanted_groups: &HashSet<GroupKey>,
) -> Vec<Member> {
    // (port, family, address, pod name) -> pod uid, as published.
    let mut published: HashMap<(GroupKey, EpKey), Option<String>> = HashMap::new();
    for s in mine.values() {
        let Some(g) = slice_group(s) else { continue };
        for ep in s.endpoints.iter().flatten() {
            let Some(r) = &ep.target_ref else { continue };
            let Some(pod) = &r.name else { continue };
            for a in ep.addresses.iter().filter_map(|a| align::parse_ip(a)) {
                published.insert((g.clone(), (a, pod.clone())), r.uid.clone());
            }
        }
    }
    let is_published = |j: &Judged| {
        let key = (
            (j.port.name.clone(), j.family),
            (j.address, j.pod.metadata.name.clone().unwrap_or_default()),
        );
        published
            .get(&key)
            .is_some_and(|uid| match (uid, &j.pod.metadata.uid) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            })
    };

    // One answer per (port, family, address, pod): include wins, then abstain.
    let rank = |d: Decision| match d {
        Decision::Include => 2,
        Decision::Abstain => 1,
        Decision::Exclude => 0,
    };
    let mut order: Vec<(&Judged, Decision)> = Vec::new();
    let mut index: HashMap<(GroupKey, EpKey), usize> = HashMap::new();
    for j in input.judged {
        let g = (j.port.name.clone(), j.family);
        if !wanted_groups.contains(&g) || align::family_of(j.address) != j.family {
            continue;
        }
        let key = (
            g,
            (j.address, j.pod.metadata.name.clone().unwrap_or_default()),
        );
        match index.get(&key) {
            Some(&i) => {
                if rank(j.decision) > rank(order[i].1) {
                    order[i].1 = j.decision;
                }
            }
            None => {
                index.insert(key, order.len());
                order.push((j, j.decision));
            }
        }
    }
    order
        .into_iter()
        .filter(|(j, d)| match d {
            Decision::Include => true,
            Decision::Exclude => false,
            Decision::Abstain => is_published(j),
        })
        .map(|(j, _)| Member {
            port: j.port.clone(),
            family: j.family,
            pod: j.pod.clone(),
            address: j.address,
        })
        .collect()
}

/// Packs one set's endpoints into its live slices, upstream style:
/// 1. keep each live endpoint that is still wanted where it is (capped at
///    `max`, first occurrence wins);
/// 2. fill slices that are being rewritten anyway, fullest first;
/// 3. put what is left into the fullest untouched slice it fits in whole,
///    else into new slices (while the Service is being deleted, into any
///    room left first, as new slices cannot be had).
fn pack(
    desired: &BTreeMap<EpKey, Endpoint>,
    live: Vec<Arc<EndpointSlice>>,
    max: usize,
    meta_changed: &dyn Fn(&EndpointSlice) -> bool,
    fill_any_room: bool,
) -> Vec<Chunk> {
    let mut placed: HashSet<&EpKey> = HashSet::new();
    let mut chunks: Vec<Chunk> = Vec::new();
    for s in live {
        let mut keys: Vec<EpKey> = Vec::new();
        for ep in s.endpoints.iter().flatten() {
            let Some(k) = live_key(ep) else { continue };
            if keys.len() < max
                && let Some((k, _)) = desired.get_key_value(&k)
                && placed.insert(k)
            {
                keys.push(k.clone());
            }
        }
        let mut sorted = keys.clone();
        sorted.sort();
        let same_endpoints = sorted == keys && {
            let live_eps = s.endpoints.as_deref().unwrap_or_default();
            live_eps.len() == keys.len()
                && keys
                    .iter()
                    .zip(live_eps)
                    .all(|(k, l)| diff::endpoint_equal(&desired[k], l))
        };
        let changed = !same_endpoints || meta_changed(&s);
        chunks.push(Chunk {
            live: Some(s),
            name: None,
            keys,
            changed,
        });
    }

    let mut remaining = desired
        .keys()
        .filter(|k| !placed.contains(k))
        .cloned()
        .peekable();

    // 2. slices we write anyway take new endpoints first, fullest first.
    if remaining.peek().is_some() {
        let mut order: Vec<usize> = (0..chunks.len()).filter(|&i| chunks[i].changed).collect();
        order.sort_by(|&a, &b| {
            chunks[b]
                .keys
                .len()
                .cmp(&chunks[a].keys.len())
                .then_with(|| chunks[a].sort_name().cmp(chunks[b].sort_name()))
        });
        for i in order {
            while chunks[i].keys.len() < max {
                let Some(k) = remaining.next() else { break };
                chunks[i].keys.push(k);
            }
        }
    }

    // While the Service is being deleted no slice may be created, so every
    // bit of room in the live ones is used first; otherwise a later pass
    // would find room the previous one left and never settle.
    if fill_any_room && remaining.peek().is_some() {
        let mut order: Vec<usize> = (0..chunks.len())
            .filter(|&i| chunks[i].keys.len() < max)
            .collect();
        order.sort_by(|&a, &b| {
            chunks[b]
                .keys
                .len()
                .cmp(&chunks[a].keys.len())
                .then_with(|| chunks[a].sort_name().cmp(chunks[b].sort_name()))
        });
        for i in order {
            while chunks[i].keys.len() < max {
                let Some(k) = remaining.next() else { break };
                chunks[i].keys.push(k);
                chunks[i].changed = true;
            }
        }
    }

    // 3. the rest: into one untouched slice it fits in whole, else new ones.
    let rest: Vec<EpKey> = remaining.collect();
    let mut at = 0;
    while at < rest.len() {
        let left = rest.len() - at;
        let fit = if left < max {
            (0..chunks.len())
                .filter(|&i| !chunks[i].changed && chunks[i].keys.len() + left <= max)
                .max_by(|&a, &b| {
                    chunks[a]
                        .keys
                        .len()
                        .cmp(&chunks[b].keys.len())
                        .then_with(|| chunks[b].sort_name().cmp(chunks[a].sort_name()))
                })
        } else {
            None
        };
        let i = fit.unwrap_or_else(|| {
            chunks.push(Chunk {
                live: None,
                name: None,
                keys: Vec::new(),
                changed: true,
            });
            chunks.len() - 1
        });
        chunks[i].changed = true;
        let take = (max - chunks[i].keys.len()).min(left);
        chunks[i].keys.extend_from_slice(&rest[at..at + take]);
        at += take;
    }
    for c in &mut chunks {
        c.keys.sort();
    }
    chunks
}

/// The target whose set is named without `--p<target>`: the one a live
/// chunk of the base stem already carries (so a second target appearing
/// mid-rollout does not rename the existing set), else the lowest.
fn primary_target(p: &GroupPlan) -> Option<u16> {
    let wanted: BTreeSet<u16> = p.sets.iter().map(|s| s.target).collect();
    p.live
        .iter()
        .filter(|s| {
            s.metadata
                .name
                .as_deref()
                .is_some_and(|n| naming::is_chunk_of(n, &p.group.base))
        })
        .filter_map(|s| slice_target(s))
        .find(|t| wanted.contains(t))
        .or_else(|| wanted.first().copied())
}

/// Hands out names for new slices.
struct Namer<'a> {
    used: BTreeSet<String>,
    mine: &'a BTreeMap<String, Arc<EndpointSlice>>,
    lookup: &'a dyn Fn(&str) -> Option<Arc<EndpointSlice>>,
    svc: &'a Service,
    manager: &'a str,
    deleting: bool,
    collisions: Vec<Collision>,
}

/// Bound on names tried for one slice (each skipped name is a live object).
const MAX_NAME_ATTEMPTS: usize = 10_000;

impl Namer<'_> {
    /// The first name of `stem` held by a slice of ours (same address type,
    /// which is immutable) that nothing else keeps, or free. Names held by
    /// others are reported and skipped. Before creating a slice, a slice of
    /// the same group that would otherwise be deleted (`spares`) is reused
    /// instead, as upstream does: one write rather than a create and a
    /// delete. While the Service is being deleted nothing is created.
    fn allocate(
        &mut self,
        stem: &str,
        family: Family,
        spares: &[Arc<EndpointSlice>],
    ) -> Option<(String, Option<Arc<EndpointSlice>>)> {
        for n in 1..=MAX_NAME_ATTEMPTS {
            let name = naming::chunk_name(stem, n);
            if self.used.contains(&name) {
                continue;
            }
            let live = self
                .mine
                .get(&name)
                .cloned()
                .or_else(|| (self.lookup)(&name));
            match live {
                Some(s) if is_ours(&s, self.svc, self.manager) => {
                    if slice_family(&s) != Some(family) {
                        continue;
                    }
                    self.used.insert(name.clone());
                    return Some((name, Some(s)));
                }
                Some(s) => {
                    if !self.collisions.iter().any(|c| c.name == name) {
                        self.collisions.push(Collision {
                            name: name.clone(),
                            holder: holder(&s),
                        });
                    }
                }
                None => {
                    let spare = spares.iter().find(|s| {
                        !self
                            .used
                            .contains(s.metadata.name.as_deref().unwrap_or_default())
                    });
                    if let Some(s) = spare {
                        let name = s.metadata.name.clone().unwrap_or_default();
                        self.used.insert(name.clone());
                        return Some((name, Some(s.clone())));
                    }
                    if self.deleting {
                        return None;
                    }
                    self.used.insert(name.clone());
                    return Some((name, None));
                }
            }
        }
        None
    }
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
