//! The pod and Service as every WIT version shows them to a guest: the
//! facts read out of the informer's objects the way the planner reads
//! them, before either version puts them in its own types (0.1 copies them
//! into records, 0.2 answers queries with them).

use k8s_openapi::{
    api::core::v1::{
        Container, ContainerPort as K8sContainerPort, Pod, PodStatus, Service,
        ServicePort as K8sServicePort,
    },
    apimachinery::pkg::util::intstr::IntOrString,
};

use portwise_core::align;

pub(crate) fn protocol(p: Option<&String>) -> &str {
    align::protocol(p.map(String::as_str))
}

pub(crate) fn pod_status(pod: &Pod) -> Option<&PodStatus> {
    pod.status.as_ref()
}

pub(crate) fn service_ports(svc: &Service) -> impl Iterator<Item = (&K8sServicePort, u16)> {
    svc.spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|p| Some((p, u16::try_from(p.port).ok()?)))
}

/// The pod's addresses exactly as the planner reads them
/// ([`align::pod_addresses`]): a guest sees no address the built-in rules
/// refuse. `podAddresses.cidrs` is not applied here: an address outside it
/// may be listed, but a guest probes only the judged one.
pub(crate) fn pod_ips(pod: &Pod) -> Vec<String> {
    align::pod_addresses(pod)
        .into_iter()
        .map(|ip| ip.to_string())
        .collect()
}

/// A Service port's `targetPort` as written (a number or a name).
pub(crate) fn target_port_text(p: &K8sServicePort, port: u16) -> String {
    match &p.target_port {
        Some(IntOrString::Int(n)) => n.to_string(),
        Some(IntOrString::String(s)) => s.clone(),
        // The API server defaults targetPort to port.
        None => port.to_string(),
    }
}

/// The ports of all containers, then of restartable init containers
/// (sidecars), with the container and whether it is a sidecar. Ports
/// outside u16 are left out.
pub(crate) fn container_ports(
    pod: &Pod,
) -> impl Iterator<Item = (&Container, &K8sContainerPort, u16, bool)> {
    align::serving_containers(pod).flat_map(|(container, sidecar)| {
        container.ports.iter().flatten().filter_map(move |p| {
            Some((container, p, u16::try_from(p.container_port).ok()?, sidecar))
        })
    })
}

/// The pod's phase, `Unknown` when unset.
pub(crate) fn phase(pod: &Pod) -> &str {
    pod_status(pod)
        .and_then(|s| s.phase.as_deref())
        .filter(|p| !p.is_empty())
        .unwrap_or("Unknown")
}

/// The node the pod was scheduled to; an empty `nodeName` is no node.
pub(crate) fn node_name(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}
