//! Alignment: which pods back which Service port, and on which address.
//!
//! The native controller aligns pods to a Service through `spec.selector`;
//! portwise aligns them through a configured label or annotation and then
//! asks a checker, per (Service port, address family, pod), whether the pod
//! backs the port. This module produces those triples ([`Subject`]s) and
//! nothing else: no verdicts, no I/O. The rules mirror upstream so a Service
//! moved from the native controller to portwise publishes the same
//! addresses and target ports (`podutil.FindPort`, `getEndpointAddresses`,
//! `getAddressTypesForService`).

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr},
    sync::Arc,
};

use crate::{
    config::PodAddresses,
    membership::{Family, ResolvedPort, Subject},
};
use k8s_openapi::{
    api::core::v1::{Container, Pod, Service, ServicePort},
    apimachinery::pkg::{apis::meta::v1::ObjectMeta, util::intstr::IntOrString},
};

pub use crate::config::KeySource;

/// The value of `key` on an object, if present.
pub fn key_value<'a>(meta: &'a ObjectMeta, key: &KeySource) -> Option<&'a str> {
    key.get(meta)
}

/// The name an annotation picks (a policy, a shadow): its value trimmed,
/// `None` when absent or blank.
pub fn picked_by_annotation<'a>(meta: &'a ObjectMeta, annotation: &str) -> Option<&'a str> {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(annotation))
        .map(|v| v.trim())
        .filter(|v| !v.is_empty())
}

/// The address families a Service publishes, in `spec.ipFamilies` order.
///
/// An apiserver always fills `ipFamilies`; when it is empty (objects built by
/// hand, very old servers) the family of `clusterIP` decides, else IPv4.
pub fn families(svc: &Service) -> Vec<Family> {
    let spec = svc.spec.as_ref();
    let mut out = Vec::with_capacity(2);
    for f in spec
        .and_then(|s| s.ip_families.as_ref())
        .into_iter()
        .flatten()
    {
        let fam = match f.as_str() {
            "IPv4" => Family::V4,
            "IPv6" => Family::V6,
            _ => continue,
        };
        if !out.contains(&fam) {
            out.push(fam);
        }
    }
    if out.is_empty() {
        let v6_cluster_ip = spec
            .and_then(|s| s.cluster_ip.as_deref())
            .and_then(parse_ip)
            .is_some_and(|ip| ip.is_ipv6());
        out.push(if v6_cluster_ip {
            Family::V6
        } else {
            Family::V4
        });
    }
    out
}

/// The family of an address (after normalisation).
pub fn family_of(ip: IpAddr) -> Family {
    match ip {
        IpAddr::V4(_) => Family::V4,
        IpAddr::V6(_) => Family::V6,
    }
}

/// `discovery.k8s.io` address type of a family.
pub fn address_type(family: Family) -> &'static str {
    family.as_str()
}

/// Parses an IP the way upstream's `ParseIPSloppy` does (IPv4 octets with
/// leading zeros are decimal) and normalises IPv4-mapped IPv6 to IPv4, so
/// that `::ffff:10.0.0.1` is published as the IPv4 address it is.
pub fn parse_ip(s: &str) -> Option<IpAddr> {
    let s = s.trim();
    let ip = match s.parse::<IpAddr>() {
        Ok(ip) => ip,
        Err(_) => IpAddr::V4(parse_sloppy_v4(s)?),
    };
    Some(ip.to_canonical())
}

fn parse_sloppy_v4(s: &str) -> Option<Ipv4Addr> {
    let mut octets = [0u8; 4];
    let mut parts = s.split('.');
    for o in &mut octets {
        let p = parts.next()?;
        if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *o = p.parse().ok()?;
    }
    parts.next().is_none().then(|| Ipv4Addr::from(octets))
}

/// The pod's addresses as portwise reads them, in order: `status.podIPs`,
/// then `status.podIP` (older objects only carry that), each parsed as
/// [`parse_ip`] does, without those no endpoint may have (see
/// [`is_endpoint_address`]) and without repeats.
///
/// The one reading of a pod's addresses: the planner publishes the first of
/// a family ([`pod_address`]) and the guests are shown the list, so a guest
/// never sees an address the planner would not publish, nor misses one it
/// would.
pub fn pod_addresses(pod: &Pod) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = Vec::with_capacity(2);
    for ip in addresses(pod) {
        if !out.contains(&ip) {
            out.push(ip);
        }
    }
    out
}

/// The pod's address in `family`: the first of [`pod_addresses`] in it.
pub fn pod_address(pod: &Pod, family: Family) -> Option<IpAddr> {
    addresses(pod).find(|ip| family_of(*ip) == family)
}

fn addresses(pod: &Pod) -> impl Iterator<Item = IpAddr> + '_ {
    let status = pod.status.as_ref();
    status
        .and_then(|s| s.pod_ips.as_ref())
        .into_iter()
        .flatten()
        .map(|p| p.ip.as_str())
        .chain(status.and_then(|s| s.pod_ip.as_deref()))
        .filter_map(parse_ip)
        .filter(|ip| is_endpoint_address(*ip) && !is_metadata_address(*ip))
}

/// Cloud metadata and host services outside the link-local ranges that
/// [`is_endpoint_address`] already refuses: Azure's WireServer
/// (168.63.129.16), Alibaba Cloud's metadata (100.100.100.200), AWS's IMDS,
/// DNS resolver and time service over IPv6 (fd00:ec2::254, ::253, ::123),
/// and any refused or listed IPv4 address reached through NAT64
/// (64:ff9b::/96, so 169.254.169.254 as `64:ff9b::a9fe:a9fe`).
///
/// Why: whoever can write `pods/status` (a node's kubelet, or anyone
/// granted it) can claim one of them. Probed, it points portwise's probes
/// (and a guest's) at a service holding the node's or the cloud account's
/// credentials; published, it sends the Service's clients there. Such a
/// pod has no address in that family (docs/reliability.md).
pub fn is_metadata_address(ip: IpAddr) -> bool {
    const V4: [[u8; 4]; 2] = [[168, 63, 129, 16], [100, 100, 100, 200]];
    const AWS_V6: [u16; 3] = [0x254, 0x253, 0x123];
    match ip {
        IpAddr::V4(v4) => V4.contains(&v4.octets()),
        IpAddr::V6(v6) => {
            let s = v6.segments();
            if s[..7] == [0xfd00, 0x0ec2, 0, 0, 0, 0, 0] && AWS_V6.contains(&s[7]) {
                return true;
            }
            // NAT64's well-known prefix: the IPv4 address in its last 32
            // bits is what the packet reaches.
            if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                let [a, b] = s[6].to_be_bytes();
                let [c, d] = s[7].to_be_bytes();
                let v4 = IpAddr::V4(std::net::Ipv4Addr::new(a, b, c, d));
                return !is_endpoint_address(v4) || is_metadata_address(v4);
            }
            false
        }
    }
}

/// Whether EndpointSlice (and Endpoints) validation accepts `ip` as an
/// endpoint address, as apimachinery's `ValidateEndpointIP` does: not
/// unspecified, loopback, link-local unicast (169.254.0.0/16, fe80::/10)
/// or link-local multicast (224.0.0.0/24, ff02::/16).
///
/// The apiserver accepts such addresses in a pod's status (a broken CNI, or
/// anyone allowed to write pod status). Published, one of them makes the
/// write of its whole slice fail, so one pod would keep every other pod of
/// the Service out; probed, it would point portwise's probes at its own
/// pod (127.0.0.1) or at a cloud's metadata service (169.254.169.254).
/// Such a pod has no address in that family (docs/reliability.md).
pub fn is_endpoint_address(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            !(v4.is_unspecified()
                || v4.is_loopback()
                || v4.is_link_local()
                || v4.octets()[..3] == [224, 0, 0])
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            !(v6.is_unspecified()
                || v6.is_loopback()
                || first & 0xffc0 == 0xfe80
                || first & 0xff0f == 0xff02)
        }
    }
}

/// A pod can back a Service unless it has terminated for good.
pub fn is_candidate(pod: &Pod) -> bool {
    !matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// The protocol of a Service or container port; the API defaults it to TCP.
pub fn protocol(p: Option<&str>) -> &str {
    match p {
        None | Some("") => "TCP",
        Some(p) => p,
    }
}

/// The container port `port` reaches on `pod`, as upstream `FindPort`:
/// a numeric `targetPort` is used as is (unset or zero means `port`); a named
/// one is looked up by name and protocol in the containers, then in the
/// restartable init containers (sidecars, `restartPolicy: Always`).
pub fn resolve_target(port: &ServicePort, pod: &Pod) -> Option<u16> {
    match &port.target_port {
        None => valid_port(port.port),
        Some(IntOrString::Int(0)) => valid_port(port.port),
        Some(IntOrString::Int(n)) => valid_port(*n),
        Some(IntOrString::String(name)) if name.is_empty() => valid_port(port.port),
        Some(IntOrString::String(name)) => {
            let want = protocol(port.protocol.as_deref());
            serving_containers(pod).find_map(|(c, _)| named_port(c, name, want))
        }
    }
}

/// The containers whose ports a pod serves, in the order a named port is
/// looked up: the containers, then the restartable init containers
/// (sidecars, `restartPolicy: Always`), each with whether it is a sidecar.
/// A run-to-completion init container serves nothing. The one reading of
/// this rule: the planner resolves target ports by it and the guests are
/// shown the ports it yields.
pub fn serving_containers(pod: &Pod) -> impl Iterator<Item = (&Container, bool)> {
    let spec = pod.spec.as_ref();
    let regular = spec
        .into_iter()
        .flat_map(|s| s.containers.iter())
        .map(|c| (c, false));
    let sidecars = spec
        .and_then(|s| s.init_containers.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"))
        .map(|c| (c, true));
    regular.chain(sidecars)
}

/// The TCP container port named `name` on `pod`, for a probe's `port`
/// field: looked up in the same containers, in the same order, as a named
/// `targetPort`; TCP only because probes dial TCP.
pub fn named_probe_port(pod: &Pod, name: &str) -> Option<u16> {
    serving_containers(pod).find_map(|(c, _)| named_port(c, name, "TCP"))
}

fn named_port(c: &Container, name: &str, proto: &str) -> Option<u16> {
    c.ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some(name) && protocol(p.protocol.as_deref()) == proto)
        .and_then(|p| valid_port(p.container_port))
}

fn valid_port(n: i32) -> Option<u16> {
    u16::try_from(n).ok().filter(|p| *p != 0)
}

/// The Service port as the membership layer sees it on one pod.
pub fn resolved_port(port: &ServicePort, target: u16) -> ResolvedPort {
    ResolvedPort {
        name: port.name.clone().unwrap_or_default(),
        port: port.port,
        protocol: protocol(port.protocol.as_deref()).to_string(),
        target,
    }
}

/// Upstream's rule for a pod whose Node is gone: it is left out (unless the
/// Service publishes not-ready addresses), so that slices do not keep
/// endpoints of a vanished Node until the pod garbage collector gets to
/// them; a kubelet that is gone cannot mark its pods unready. `node_known`
/// answers from the Node cache. A pod without `nodeName` is not scheduled
/// and so has no address in a real cluster; it is judged as usual (the
/// native controller skips it too, which only matters for hand-made pods).
pub fn on_known_node(service: &Service, pod: &Pod, node_known: &dyn Fn(&str) -> bool) -> bool {
    let pnra = service
        .spec
        .as_ref()
        .and_then(|s| s.publish_not_ready_addresses)
        .unwrap_or(false);
    match pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
        Some(node) if !node.is_empty() => pnra || node_known(node),
        _ => true,
    }
}

/// The ports a probe may reach on `pod` while it is judged for `service`:
/// `None` (any port) for a pod with an address of its own. A `hostNetwork`
/// pod's address is its Node's, so there only the target ports that the
/// Service's ports resolve to on that pod: a checker must not reach the
/// kubelet, or anything else that listens on the Node.
pub fn probe_ports(service: &Service, pod: &Pod) -> Option<BTreeSet<u16>> {
    if !is_host_network(pod) {
        return None;
    }
    Some(
        service
            .spec
            .as_ref()
            .and_then(|s| s.ports.as_deref())
            .unwrap_or_default()
            .iter()
            .filter_map(|sp| resolve_target(sp, pod))
            .collect(),
    )
}

/// Why a pod of a Service's group is not judged for it at all, so no port
/// of the Service can include it. Counted per reason (a metric) and named by
/// `check --live`, so that a pod missing from every slice is explained.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NotJudged {
    /// Phase `Succeeded` or `Failed`: it will not serve again.
    Terminal,
    /// Its Node is not in the cache ([`on_known_node`]).
    NodeGone,
    /// A `hostNetwork` pod, and `podAddresses.hostNetwork` is off.
    HostNetwork,
    /// No address of any of the Service's families: not started yet, or
    /// an IP of another family only.
    NoAddress,
    /// Addresses of the Service's families, none in `podAddresses.cidrs`.
    OutsideCidrs,
}

impl NotJudged {
    pub const ALL: [NotJudged; 5] = [
        Self::Terminal,
        Self::NodeGone,
        Self::HostNetwork,
        Self::NoAddress,
        Self::OutsideCidrs,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Terminal => "terminal",
            Self::NodeGone => "node-gone",
            Self::HostNetwork => "host-network",
            Self::NoAddress => "no-address",
            Self::OutsideCidrs => "outside-cidrs",
        }
    }

    /// What it means, for a person.
    pub fn explain(self) -> &'static str {
        match self {
            Self::Terminal => "its phase is Succeeded or Failed: it will not serve again",
            Self::NodeGone => {
                "its Node is gone, and the Service does not publish not-ready addresses"
            }
            Self::HostNetwork => {
                "it is a hostNetwork pod (its address is its Node's), and podAddresses.hostNetwork is off"
            }
            Self::NoAddress => "it has no IP of the Service's address families yet",
            Self::OutsideCidrs => "its addresses are outside podAddresses.cidrs",
        }
    }
}

/// Why `pod` (of the Service's group) is not judged for `service`, if it
/// is not; the first reason that applies, in [`NotJudged`]'s order.
pub fn not_judged(
    service: &Service,
    pod: &Pod,
    node_known: &dyn Fn(&str) -> bool,
    addresses: &PodAddresses,
) -> Option<NotJudged> {
    if !is_candidate(pod) {
        return Some(NotJudged::Terminal);
    }
    if !on_known_node(service, pod, node_known) {
        return Some(NotJudged::NodeGone);
    }
    if is_host_network(pod) && !addresses.host_network {
        return Some(NotJudged::HostNetwork);
    }
    let families = families(service);
    if families.iter().all(|&f| pod_address(pod, f).is_none()) {
        return Some(NotJudged::NoAddress);
    }
    if families
        .iter()
        .all(|&f| judged_address(pod, f, addresses).is_none())
    {
        return Some(NotJudged::OutsideCidrs);
    }
    None
}

/// Whether `pod` runs in its Node's network namespace.
pub fn is_host_network(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
}

/// Whether `podAddresses` lets `pod` be judged at all.
fn judged_pod(pod: &Pod, addresses: &PodAddresses) -> bool {
    addresses.host_network || !is_host_network(pod)
}

/// The pod's address in `family` that portwise probes and publishes: its
/// [`pod_address`], if `podAddresses` admits it (a `hostNetwork` pod's is
/// its Node's, which no pod CIDR holds: `hostNetwork` alone decides for
/// those).
pub fn judged_address(pod: &Pod, family: Family, addresses: &PodAddresses) -> Option<IpAddr> {
    pod_address(pod, family).filter(|ip| is_host_network(pod) || addresses.admits(*ip))
}

/// A headless Service with no ports: judged and published port-less
/// ([`ResolvedPort::portless`]).
pub fn is_portless_headless(service: &Service) -> bool {
    let spec = service.spec.as_ref();
    spec.and_then(|s| s.ports.as_deref())
        .unwrap_or_default()
        .is_empty()
        && matches!(
            spec.and_then(|s| s.cluster_ip.as_deref()),
            None | Some("") | Some("None")
        )
}

/// Every (Service port, family, candidate pod) whose target port resolves
/// and which has an address of that family: what the checker judges.
///
/// Order: Service ports in spec order, then families in `ipFamilies` order,
/// then pods in the order given. Pods of other namespaces are skipped, and
/// pods and addresses that `podAddresses` does not let be judged.
pub fn subjects(
    service: &Arc<Service>,
    pods: &[Arc<Pod>],
    addresses: &PodAddresses,
) -> Vec<Subject> {
    let ports = service
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_deref())
        .unwrap_or_default();
    let families = families(service);
    let ns = service.metadata.namespace.as_deref().unwrap_or_default();
    let pods: Vec<&Arc<Pod>> = pods
        .iter()
        .filter(|p| p.metadata.namespace.as_deref().unwrap_or_default() == ns)
        .filter(|p| is_candidate(p) && judged_pod(p, addresses))
        .collect();
    let mut out = Vec::new();
    // A headless Service without ports (DNS-based peer discovery, e.g. a
    // StatefulSet's governing Service): one port-less subject per pod and
    // family, as the native controller publishes its pods under `ports: []`.
    if ports.is_empty() && is_portless_headless(service) {
        for &family in &families {
            for pod in &pods {
                if let Some(address) = judged_address(pod, family, addresses) {
                    out.push(Subject {
                        service: service.clone(),
                        pod: Arc::clone(pod),
                        port: ResolvedPort::portless(),
                        family,
                        address,
                    });
                }
            }
        }
        return out;
    }
    for sp in ports {
        for &family in &families {
            for pod in &pods {
                let Some(target) = resolve_target(sp, pod) else {
                    continue;
                };
                let Some(address) = judged_address(pod, family, addresses) else {
                    continue;
                };
                out.push(Subject {
                    service: service.clone(),
                    pod: Arc::clone(pod),
                    port: resolved_port(sp, target),
                    family,
                    address,
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod node_tests;
