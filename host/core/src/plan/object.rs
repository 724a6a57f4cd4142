//! Building the objects portwise publishes: endpoints with their conditions,
//! topology and hints, and the labels and owner reference every slice
//! carries. Mirrors upstream `podToEndpoint`, `setEndpointSliceLabels` and
//! the `trafficDistribution` heuristic.

use std::{collections::BTreeMap, net::IpAddr};

use k8s_openapi::{
    api::{
        core::v1::{ObjectReference, Pod, Service},
        discovery::v1::{Endpoint, EndpointConditions, EndpointHints, ForNode, ForZone},
    },
    apimachinery::pkg::apis::meta::v1::OwnerReference,
};

/// Label naming the Service a slice serves.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Label naming the controller that manages a slice.
pub const MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// Label set (empty value) on the slices of a headless Service.
pub const HEADLESS_LABEL: &str = "service.kubernetes.io/headless";

/// The node label the zone comes from.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// Which hints `spec.trafficDistribution` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hints {
    None,
    /// `PreferClose` / `PreferSameZone`: the endpoint's own zone.
    Zone,
    /// `PreferSameNode`: the endpoint's own node, and its zone as fallback.
    NodeAndZone,
}

impl Hints {
    pub fn of(svc: &Service) -> Self {
        match svc
            .spec
            .as_ref()
            .and_then(|s| s.traffic_distribution.as_deref())
        {
            Some("PreferClose" | "PreferSameZone") => Hints::Zone,
            Some("PreferSameNode") => Hints::NodeAndZone,
            _ => Hints::None,
        }
    }
}

/// Is the Service headless? Upstream: no ClusterIP set, `None` or empty.
pub fn is_headless(svc: &Service) -> bool {
    matches!(
        svc.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()),
        None | Some("") | Some("None")
    )
}

/// Labels of every slice of `svc`: the Service's own (minus the reserved
/// keys), the Service name, the manager, and the headless marker.
pub fn slice_labels(svc: &Service, managed_by: &str) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = svc
        .metadata
        .labels
        .iter()
        .flatten()
        .filter(|(k, _)| {
            ![SERVICE_NAME_LABEL, MANAGED_BY_LABEL, HEADLESS_LABEL].contains(&k.as_str())
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if is_headless(svc) {
        labels.insert(HEADLESS_LABEL.into(), String::new());
    }
    labels.insert(
        SERVICE_NAME_LABEL.into(),
        svc.metadata.name.clone().unwrap_or_default(),
    );
    labels.insert(MANAGED_BY_LABEL.into(), managed_by.into());
    labels
}

/// The controller owner reference to `svc`.
pub fn owner_reference(svc: &Service) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Service".into(),
        name: svc.metadata.name.clone().unwrap_or_default(),
        uid: svc.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// Is the pod terminating?
pub fn is_terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

/// The `ready` condition of a member: members serve; terminating ones are
/// not ready unless the Service publishes not-ready addresses.
pub fn is_ready(svc: &Service, pod: &Pod) -> bool {
    publish_not_ready(svc) || !is_terminating(pod)
}

/// The `serving` condition of a member: it serves (membership said so),
/// except where readiness yielded to `publishNotReadyAddresses`: there, as
/// for the native controller, serving is the pod's own Ready condition.
pub fn is_serving(svc: &Service, pod: &Pod) -> bool {
    !publish_not_ready(svc) || pod_condition_ready(pod)
}

fn pod_condition_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn publish_not_ready(svc: &Service) -> bool {
    svc.spec
        .as_ref()
        .and_then(|s| s.publish_not_ready_addresses)
        .unwrap_or(false)
}

/// Upstream `ShouldSetHostname`: the pod's hostname when its subdomain is
/// the Service's name (in the Service's namespace).
pub fn hostname(svc: &Service, pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    let host = spec.hostname.as_deref().filter(|h| !h.is_empty())?;
    let same_ns = pod.metadata.namespace == svc.metadata.namespace;
    (same_ns && spec.subdomain.is_some() && spec.subdomain == svc.metadata.name)
        .then(|| host.to_string())
}

/// The node a pod runs on, if scheduled.
pub fn node_name(pod: &Pod) -> Option<String> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .filter(|n| !n.is_empty())
}

/// A `targetRef` to the pod.
pub fn pod_ref(pod: &Pod) -> ObjectReference {
    ObjectReference {
        kind: Some("Pod".into()),
        namespace: pod.metadata.namespace.clone(),
        name: pod.metadata.name.clone(),
        uid: pod.metadata.uid.clone(),
        ..Default::default()
    }
}

/// The endpoint for one member.
pub fn endpoint(
    svc: &Service,
    hints: Hints,
    pod: &Pod,
    address: IpAddr,
    zones: Option<super::ZoneLookup>,
) -> Endpoint {
    let terminating = is_terminating(pod);
    let ready = is_ready(svc, pod);
    let node = node_name(pod);
    let zone = match (&node, zones) {
        (Some(n), Some(z)) => z(n).filter(|z| !z.is_empty()),
        _ => None,
    };
    // Upstream's preferClose heuristic, per endpoint: ready ones only; a
    // hint is left out when its zone (or node) is unknown.
    let hints = if ready && hints != Hints::None {
        let for_zones = zone.clone().map(|name| vec![ForZone { name }]);
        let for_nodes = match hints {
            Hints::NodeAndZone => node.clone().map(|name| vec![ForNode { name }]),
            _ => None,
        };
        (for_zones.is_some() || for_nodes.is_some()).then_some(EndpointHints {
            for_zones,
            for_nodes,
        })
    } else {
        None
    };
    Endpoint {
        addresses: vec![address.to_string()],
        conditions: Some(EndpointConditions {
            ready: Some(ready),
            serving: Some(is_serving(svc, pod)),
            terminating: Some(terminating),
        }),
        hostname: hostname(svc, pod),
        node_name: node,
        target_ref: Some(pod_ref(pod)),
        zone,
        hints,
        deprecated_topology: None,
    }
}
