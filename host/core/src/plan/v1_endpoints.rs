//! Legacy `v1.Endpoints`, for consumers that still read them (some DNS
//! setups). Pure like the slice planner: the members come from the slice
//! plan (abstentions already settled), so both views always agree.
//!
//! Shape follows the upstream endpoints controller: one address family (the
//! Service's primary), addresses packed by the exact set of ports they serve
//! (`RepackSubsets`), ready ones in `addresses` and the rest in
//! `notReadyAddresses`, at most 1000 addresses with the over-capacity
//! annotation (`truncateEndpoints`). The skip-mirror label keeps the
//! mirroring controller from copying them back into slices.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::{
    api::core::v1::{
        EndpointAddress, EndpointPort, EndpointSubset, Endpoints, Service, ServicePort,
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};

use super::{Member, diff, object};
use crate::align::{self, protocol};

/// Keeps the EndpointSlice mirroring controller away.
pub const SKIP_MIRROR_LABEL: &str = "endpointslice.kubernetes.io/skip-mirror";
/// Who manages an Endpoints object (the upstream controller's label key).
pub const ENDPOINTS_MANAGED_BY_LABEL: &str = "endpoints.kubernetes.io/managed-by";
/// Set to `truncated` when addresses were dropped to stay under the cap.
pub const OVER_CAPACITY_ANNOTATION: &str = "endpoints.kubernetes.io/over-capacity";
/// Upstream's cap on addresses in one Endpoints object.
pub const MAX_LEGACY_ADDRESSES: usize = 1000;

/// (name, number, protocol, appProtocol) of one endpoint port.
type PortKey = (String, i32, String, Option<String>);

/// The Endpoints object for `service` given its published members.
pub fn plan_endpoints(service: &Service, members: &[Member], managed_by: &str) -> Endpoints {
    let family = align::families(service)[0];
    let ports: HashMap<&str, &ServicePort> = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_deref())
        .unwrap_or_default()
        .iter()
        .map(|p| (p.name.as_deref().unwrap_or_default(), p))
        .collect();

    // Per (address, pod, ready): the ports it serves.
    type Unit = (std::net::IpAddr, String, bool);
    let mut units: BTreeMap<Unit, (EndpointAddress, BTreeSet<PortKey>)> = BTreeMap::new();
    for m in members.iter().filter(|m| m.family == family) {
        let Some(sp) = ports.get(m.port.name.as_str()) else {
            continue;
        };
        let pod = &m.pod;
        let ready = object::is_ready(service, pod);
        let key = (
            m.address,
            pod.metadata.name.clone().unwrap_or_default(),
            ready,
        );
        let (_, served) = units.entry(key).or_insert_with(|| {
            (
                EndpointAddress {
                    ip: m.address.to_string(),
                    hostname: object::hostname(service, pod),
                    node_name: object::node_name(pod),
                    target_ref: Some(object::pod_ref(pod)),
                },
                BTreeSet::new(),
            )
        });
        served.insert((
            m.port.name.clone(),
            i32::from(m.port.target),
            protocol(sp.protocol.as_deref()).to_string(),
            sp.app_protocol.clone(),
        ));
    }

    // Group by the exact port set.
    type Lists = (Vec<EndpointAddress>, Vec<EndpointAddress>);
    let mut by_ports: BTreeMap<Vec<PortKey>, Lists> = BTreeMap::new();
    for ((_, _, ready), (addr, served)) in units {
        let (ready_list, not_ready_list) =
            by_ports.entry(served.into_iter().collect()).or_default();
        let list = if ready { ready_list } else { not_ready_list };
        list.push(addr);
    }
    let mut subsets: Vec<EndpointSubset> = by_ports
        .into_iter()
        .map(|(ports, (ready, not_ready))| EndpointSubset {
            addresses: Some(ready),
            not_ready_addresses: Some(not_ready),
            ports: Some(
                ports
                    .into_iter()
                    .map(|(name, port, protocol, app_protocol)| EndpointPort {
                        name: Some(name).filter(|n| !n.is_empty()),
                        port,
                        protocol: Some(protocol),
                        app_protocol,
                    })
                    .collect(),
            ),
        })
        .collect();
    let truncated = truncate(&mut subsets);
    let subsets: Vec<EndpointSubset> = subsets.into_iter().filter_map(tidy_subset).collect();

    let mut labels: BTreeMap<String, String> = service.metadata.labels.clone().unwrap_or_default();
    if object::is_headless(service) {
        labels.insert(object::HEADLESS_LABEL.into(), String::new());
    } else {
        labels.remove(object::HEADLESS_LABEL);
    }
    labels.insert(SKIP_MIRROR_LABEL.into(), "true".into());
    labels.insert(ENDPOINTS_MANAGED_BY_LABEL.into(), managed_by.into());
    let annotations = truncated.then(|| {
        BTreeMap::from([(
            OVER_CAPACITY_ANNOTATION.to_string(),
            "truncated".to_string(),
        )])
    });

    Endpoints {
        metadata: ObjectMeta {
            name: service.metadata.name.clone(),
            namespace: service.metadata.namespace.clone(),
            labels: Some(labels),
            annotations,
            owner_references: Some(vec![object::owner_reference(service)]),
            ..Default::default()
        },
        subsets: (!subsets.is_empty()).then_some(subsets),
    }
}

/// Upstream `truncateEndpoints`: keeps ready addresses first; the allowance
/// is shared between subsets in proportion to their size, rounded up.
fn truncate(subsets: &mut [EndpointSubset]) -> bool {
    let len = |v: &Option<Vec<EndpointAddress>>| v.as_ref().map_or(0, Vec::len);
    let ready: usize = subsets.iter().map(|s| len(&s.addresses)).sum();
    let not_ready: usize = subsets.iter().map(|s| len(&s.not_ready_addresses)).sum();
    if ready + not_ready <= MAX_LEGACY_ADDRESSES {
        return false;
    }
    let truncate_ready = ready > MAX_LEGACY_ADDRESSES;
    let (allowance, total) = if truncate_ready {
        (MAX_LEGACY_ADDRESSES, ready)
    } else {
        (MAX_LEGACY_ADDRESSES - ready, not_ready)
    };
    let mut left = allowance;
    for s in subsets {
        let list = if truncate_ready {
            s.not_ready_addresses = Some(Vec::new());
            &mut s.addresses
        } else {
            &mut s.not_ready_addresses
        };
        let here = len(list);
        let share = (here * allowance).div_ceil(total).min(left);
        if let Some(l) = list.as_mut() {
            l.truncate(share);
        }
        left -= len(list);
    }
    true
}

/// Drops empty lists (the API omits them) and empty subsets.
fn tidy_subset(mut s: EndpointSubset) -> Option<EndpointSubset> {
    s.addresses = s.addresses.filter(|a| !a.is_empty());
    s.not_ready_addresses = s.not_ready_addresses.filter(|a| !a.is_empty());
    (s.addresses.is_some() || s.not_ready_addresses.is_some()).then_some(s)
}

/// Whether `live` must be re-applied to become `desired` (labels,
/// annotations and owner as for slices; subsets exactly, after defaulting).
pub fn endpoints_differ(desired: &Endpoints, live: &Endpoints) -> bool {
    let manager = desired
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(ENDPOINTS_MANAGED_BY_LABEL))
        .map(String::as_str)
        .unwrap_or_default();
    if diff::meta_differs(&desired.metadata, &live.metadata, manager) {
        return true;
    }
    let has_cap = |e: &Endpoints| {
        e.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(OVER_CAPACITY_ANNOTATION))
    };
    if has_cap(live) && !has_cap(desired) {
        return true;
    }
    normalize(desired.subsets.as_deref()) != normalize(live.subsets.as_deref())
}

fn normalize(subsets: Option<&[EndpointSubset]>) -> Vec<EndpointSubset> {
    let addr = |a: &EndpointAddress| {
        let mut a = a.clone();
        a.hostname = a.hostname.filter(|h| !h.is_empty());
        a.node_name = a.node_name.filter(|n| !n.is_empty());
        if let Some(r) = &mut a.target_ref {
            r.resource_version = None;
        }
        a
    };
    let port = |p: &EndpointPort| EndpointPort {
        name: p.name.clone().filter(|n| !n.is_empty()),
        protocol: Some(p.protocol.clone().unwrap_or_else(|| "TCP".into())),
        ..p.clone()
    };
    subsets
        .unwrap_or_default()
        .iter()
        .filter_map(|s| {
            tidy_subset(EndpointSubset {
                addresses: s.addresses.as_ref().map(|v| v.iter().map(addr).collect()),
                not_ready_addresses: s
                    .not_ready_addresses
                    .as_ref()
                    .map(|v| v.iter().map(addr).collect()),
                ports: Some(s.ports.iter().flatten().map(port).collect()),
            })
        })
        .collect()
}
