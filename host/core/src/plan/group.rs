//! A (Service ports, family) being planned: its slice sets, one per set of
//! port numbers, and its placeholder.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    sync::Arc,
};

use k8s_openapi::{
    api::{
        core::v1::{Service, ServicePort},
        discovery::v1::{Endpoint, EndpointSlice},
    },
    apimachinery::pkg::util::intstr::IntOrString,
};

use super::{
    diff,
    live::{EpKey, GroupKey, Targets, live_key, slice_target, slice_targets},
    naming,
    pack::Chunk,
};
use crate::{align, membership::Family};

/// The Service port a port-less headless Service is planned under.
static PORTLESS: ServicePort = ServicePort {
    app_protocol: None,
    name: None,
    node_port: None,
    port: 0,
    protocol: None,
    target_port: None,
};

/// A (Service ports, family): one or more slice sets, one per set of port
/// numbers ([`Targets`]).
///
/// First one group per Service port; an endpoint that backs several ports
/// moves to the group of exactly the ports it backs (see
/// [`group_by_port_set`]), so a group of one port holds the endpoints that
/// back that port alone.
pub(super) struct Group<'a> {
    /// The Service ports its slices carry, in the Service's order.
    pub(super) ports: Vec<&'a ServicePort>,
    /// Their names, sorted: the group's identity, and the order of its
    /// [`Targets`].
    pub(super) names: Vec<String>,
    pub(super) family: Family,
    /// Stem of the primary set and of the placeholder.
    pub(super) base: String,
    /// The placeholder's port number: a numeric `targetPort` (or `port`).
    pub(super) placeholder_target: Option<u16>,
    /// A group whose slices carry `ports: []`: a port-less headless
    /// Service's, or a family's placeholder (no `ports` then).
    pub(super) portless: bool,
    /// Whether the group keeps a placeholder when it has no endpoints: a
    /// Service port does when it publishes no endpoint in any group (so
    /// that consumers see the port) and its number is known, a shared
    /// group never (it exists for its endpoints).
    pub(super) keeps_placeholder: bool,
    /// Whether the group can stand for its family when nothing else of the
    /// family is published: it then keeps the native controller's
    /// placeholder, `ports: []` (see [`family_placeholders`]).
    pub(super) stands_for_family: bool,
}

impl Group<'_> {
    pub(super) fn key(&self) -> GroupKey {
        (self.names.clone(), self.family)
    }
}

pub(super) fn placeholder_target(sp: &ServicePort) -> Option<u16> {
    let n = match &sp.target_port {
        None | Some(IntOrString::Int(0)) => sp.port,
        Some(IntOrString::Int(n)) => *n,
        Some(IntOrString::String(s)) if s.is_empty() => sp.port,
        Some(IntOrString::String(_)) => return None,
    };
    u16::try_from(n).ok().filter(|p| *p != 0)
}

pub(super) struct SetPlan {
    pub(super) targets: Targets,
    pub(super) desired: BTreeMap<EpKey, Endpoint>,
    pub(super) chunks: Vec<Chunk>,
}

pub(super) struct GroupPlan<'a> {
    pub(super) group: Group<'a>,
    /// Live owned slices of this group, by name.
    pub(super) live: Vec<Arc<EndpointSlice>>,
    pub(super) sets: Vec<SetPlan>,
    /// Set when the group has no endpoints.
    pub(super) placeholder: Option<Chunk>,
    /// The placeholder's port number.
    pub(super) placeholder_target: Option<u16>,
}

/// The (port, family) groups `svc` asks for: one per named port and
/// family (the first port of a name wins), and for a port-less headless
/// Service one per family.
pub(super) fn groups(svc: &Service) -> Vec<Group<'_>> {
    let svc_name = svc.metadata.name.as_deref().unwrap_or_default();
    let families = align::families(svc);
    let mut groups: Vec<Group> = Vec::new();
    let mut seen_ports = HashSet::new();
    if align::is_portless_headless(svc) {
        for &family in &families {
            groups.push(Group {
                ports: vec![&PORTLESS],
                names: vec![String::new()],
                family,
                base: naming::portless_base_name(svc_name, family),
                placeholder_target: Some(0),
                portless: true,
                keeps_placeholder: true,
                stands_for_family: false,
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
                ports: vec![sp],
                names: vec![name.clone()],
                family,
                base: naming::base_name(svc_name, &name, sp.port, family),
                placeholder_target: placeholder_target(sp),
                portless: false,
                keeps_placeholder: true,
                stands_for_family: false,
            });
        }
    }
    groups
}

/// Desired endpoints per group, then per set of port numbers.
pub(super) type Desired = HashMap<GroupKey, BTreeMap<Targets, BTreeMap<EpKey, Endpoint>>>;

/// Moves every endpoint that backs several Service ports of its family out
/// of those ports' groups, into the group of exactly the ports it backs,
/// and adds those groups to `groups`: each address sits in one slice of
/// its family, which lists every port it backs.
///
/// Why: this is the native controller's layout (it groups endpoints by
/// their resolved ports), and consumers keyed by address read only that
/// layout right. Cilium keys a backend by (Service, address:port,
/// protocol) and keeps the port names of the slice that wrote it last;
/// Cilium ClusterMesh exports `Backends[address]` from the slice read
/// last, so a pod in one slice per port was exported with one port; AGIC
/// and Linkerd keep one subset or drop a pod any slice drops. A slice set
/// per port fails all of them; one slice per address fails none, and
/// kube-proxy and CoreDNS merge it alike.
pub(super) fn group_by_port_set<'a>(
    svc: &Service,
    groups: &mut Vec<Group<'a>>,
    desired: &mut Desired,
) {
    let svc_name = svc.metadata.name.as_deref().unwrap_or_default();
    // (family, endpoint) -> (group index, port number) of each single-port
    // group that publishes it. Group indices come in `groups`' order (the
    // Service's), names are unique, so sorting by name is stable.
    let mut backs: BTreeMap<(Family, EpKey), Vec<(usize, u16)>> = BTreeMap::new();
    for (i, g) in groups.iter().enumerate() {
        if g.portless || g.names.len() != 1 {
            continue;
        }
        for (targets, eps) in desired.get(&g.key()).into_iter().flatten() {
            let [target] = targets.as_slice() else {
                continue;
            };
            for k in eps.keys() {
                backs
                    .entry((g.family, k.clone()))
                    .or_default()
                    .push((i, *target));
            }
        }
    }
    // New groups, by key: the indices of their ports' groups.
    let mut new_groups: BTreeMap<GroupKey, Vec<usize>> = BTreeMap::new();
    for ((family, k), mut ports) in backs.into_iter().filter(|(_, p)| p.len() > 1) {
        ports.sort_by(|a, b| groups[a.0].names[0].cmp(&groups[b.0].names[0]));
        let names: Vec<String> = ports
            .iter()
            .map(|&(i, _)| groups[i].names[0].clone())
            .collect();
        let targets: Targets = ports.iter().map(|&(_, t)| t).collect();
        let mut ep = None;
        for &(i, t) in &ports {
            let Some(sets) = desired.get_mut(&groups[i].key()) else {
                continue;
            };
            let single = vec![t];
            if let Some(set) = sets.get_mut(&single) {
                ep = set.remove(&k).or(ep);
                if set.is_empty() {
                    sets.remove(&single);
                }
            }
        }
        let Some(ep) = ep else { continue };
        let key = (names, family);
        new_groups
            .entry(key.clone())
            .or_insert_with(|| ports.iter().map(|&(i, _)| i).collect());
        desired
            .entry(key)
            .or_default()
            .entry(targets)
            .or_default()
            .insert(k, ep);
    }
    for ((names, family), mut ports) in new_groups {
        // The slice lists its ports in the Service's order.
        ports.sort_unstable();
        let ports: Vec<&ServicePort> = ports.iter().map(|&i| groups[i].ports[0]).collect();
        let base = naming::shared_base_name(svc_name, &names, family);
        groups.push(Group {
            ports,
            names,
            family,
            base,
            placeholder_target: None,
            portless: false,
            keeps_placeholder: false,
            stands_for_family: false,
        });
    }
    // A port keeps a placeholder only when no group publishes it.
    let published: HashSet<(&str, Family)> = desired
        .iter()
        .filter(|(_, sets)| sets.values().any(|eps| !eps.is_empty()))
        .flat_map(|((names, family), _)| names.iter().map(move |n| (n.as_str(), *family)))
        .collect();
    for g in groups
        .iter_mut()
        .filter(|g| g.names.len() == 1 && !g.portless)
    {
        g.keeps_placeholder = !published.contains(&(g.names[0].as_str(), g.family));
    }
}

/// Adds, per family with a port whose number is unknown (a named
/// `targetPort` that no member resolves), the group that stands for the
/// family when nothing else of it is published: the Service's only port
/// when it is unnamed (its key is the one a `ports: []` slice reads as,
/// `([""], family)`), else a group of no port of its own, named after the
/// family's first port (so a placeholder written before this rule is
/// rewritten in place, and the first member to arrive takes it over).
///
/// Why: a port whose number is unknown cannot have a placeholder of its
/// own. A slice port without a `port` means "all ports" in the API, and
/// consumers that read the number without a nil check crash on it
/// (ingress-nginx, Linkerd's destination, the GKE NEG controller, older
/// CoreDNS and Traefik); the native controller never writes one, and its
/// placeholder is `ports: []`. Whether the family needs it is known only
/// once every other group has chosen its placeholder
/// ([`GroupPlan::choose_placeholder`]).
pub(super) fn family_placeholders(svc: &Service, groups: &mut Vec<Group<'_>>) {
    if align::is_portless_headless(svc) {
        return;
    }
    for family in align::families(svc) {
        let unknown = groups.iter().any(|g| {
            g.family == family
                && !g.portless
                && g.names.len() == 1
                && g.placeholder_target.is_none()
        });
        if !unknown {
            continue;
        }
        let key = (vec![String::new()], family);
        if let Some(g) = groups.iter_mut().find(|g| g.key() == key) {
            g.stands_for_family = true;
            continue;
        }
        let Some(first) = groups
            .iter()
            .find(|g| g.family == family && g.names.len() == 1)
        else {
            continue;
        };
        let base = first.base.clone();
        groups.push(Group {
            ports: Vec::new(),
            names: vec![String::new()],
            family,
            base,
            placeholder_target: None,
            portless: true,
            keeps_placeholder: false,
            stands_for_family: true,
        });
    }
}

impl GroupPlan<'_> {
    /// A group left without endpoints keeps one live slice as its
    /// placeholder, so emptying a group costs one write: the base name if it
    /// exists, else a chunk of the base, else any slice of the group whose
    /// target agrees (a `--p<target>` name keeps its target, so names stay
    /// truthful).
    ///
    /// A port whose number is unknown keeps no placeholder of its own
    /// unless a live slice tells its number; for the family, a group that
    /// [stands for it](Group::stands_for_family) keeps one (`for_family`)
    /// when nothing else of the family is published.
    pub(super) fn choose_placeholder(
        &mut self,
        used: &mut BTreeSet<String>,
        deleting: bool,
        for_family: bool,
    ) {
        let keeps = if for_family {
            self.group.stands_for_family
        } else {
            self.group.keeps_placeholder
        };
        if !keeps
            || self.placeholder.is_some()
            || self
                .sets
                .iter()
                .flat_map(|s| &s.chunks)
                .any(|c| !c.keys.is_empty())
        {
            return;
        }
        let base = &self.group.base;
        let wanted = self.group.placeholder_target;
        let free = |s: &&Arc<EndpointSlice>| {
            !used.contains(s.metadata.name.as_deref().unwrap_or_default())
        };
        let named = |s: &Arc<EndpointSlice>, f: &dyn Fn(&str) -> bool| {
            s.metadata.name.as_deref().is_some_and(f)
        };
        let canonical = naming::chunk_name(base, 1);
        let bare = self
            .live
            .iter()
            .filter(free)
            .find(|s| named(s, &|n| n == canonical))
            .or_else(|| {
                self.live
                    .iter()
                    .filter(free)
                    .find(|s| named(s, &|n| naming::is_chunk_of(n, base)))
            });
        let (reuse, target) = match bare {
            Some(s) => (Some(s), wanted),
            None => match self
                .live
                .iter()
                .filter(free)
                .find(|s| wanted.is_none() || slice_target(s) == wanted)
            {
                Some(s) => (Some(s), wanted.or_else(|| slice_target(s))),
                None => (None, wanted),
            },
        };
        if target.is_none() && !for_family && !self.group.portless {
            return; // no number to publish: the family's turn decides
        }
        if let Some(s) = reuse {
            used.extend(s.metadata.name.clone());
        }
        self.placeholder_target = target;
        // (The family's placeholder may still find a spare slice of the
        // family by name, see `Namer::allocate`, even while deleting.)
        if reuse.is_some() || !deleting || for_family {
            self.placeholder = Some(Chunk {
                live: reuse.cloned(),
                name: reuse.and_then(|s| s.metadata.name.clone()),
                keys: Vec::new(),
                changed: true,
            });
        }
    }
}

/// The endpoints of a group whose publication changes: shown by its live
/// slices and no longer wanted, wanted and not shown, or shown otherwise
/// (another target port, other fields). An endpoint that only moves between
/// slices of its set is not among them.
pub(super) fn group_changes(p: &GroupPlan) -> HashSet<EpKey> {
    let mut shown: HashMap<EpKey, (Option<Targets>, &Endpoint)> = HashMap::new();
    for s in &p.live {
        let targets = slice_targets(s);
        for ep in s.endpoints.iter().flatten() {
            if let Some(k) = live_key(ep) {
                shown.entry(k).or_insert((targets.clone(), ep));
            }
        }
    }
    let mut changes = HashSet::new();
    let mut wanted: HashSet<&EpKey> = HashSet::new();
    for set in &p.sets {
        for (k, ep) in &set.desired {
            wanted.insert(k);
            let same = shown.get(k).is_some_and(|(t, l)| {
                t.as_ref() == Some(&set.targets) && diff::endpoint_equal(ep, l)
            });
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
pub(super) fn gains(
    live: Option<&EndpointSlice>,
    targets: Option<&Targets>,
    keys: &[EpKey],
) -> bool {
    let Some(live) = live else {
        return !keys.is_empty();
    };
    if keys.is_empty() {
        return false;
    }
    if slice_targets(live).as_ref() != targets {
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

/// The port numbers whose set is named without `--p<numbers>`: the ones a
/// live chunk of the base stem already carries (so a second number
/// appearing mid-rollout does not rename the existing set), else the
/// lowest.
pub(super) fn primary_targets(p: &GroupPlan) -> Option<Targets> {
    let wanted: BTreeSet<&Targets> = p.sets.iter().map(|s| &s.targets).collect();
    p.live
        .iter()
        .filter(|s| {
            s.metadata
                .name
                .as_deref()
                .is_some_and(|n| naming::is_chunk_of(n, &p.group.base))
        })
        .filter_map(|s| slice_targets(s))
        .find(|t| wanted.contains(t))
        .or_else(|| wanted.first().map(|t| (*t).clone()))
}
