//! The WIT contract (`wit/membership.wit`) bound once, and the conversion of
//! a [`Subject`] into the records a guest receives.
//!
//! The conversion is pure: it only reads the informer's snapshot of the
//! Service and pod, so it is unit tested here without any WebAssembly.

use std::net::IpAddr;

use k8s_openapi::{
    api::core::v1::{Pod, Service},
    apimachinery::pkg::util::intstr::IntOrString,
};

use crate::membership::{Family, Subject};

wasmtime::component::bindgen!({
    path: "../wit",
    world: "membership-checker",
    // Probes await network I/O: async imports keep a probing guest from
    // blocking a runtime thread. Exports are async so calls run on a fiber
    // that the epoch deadline can interrupt and the caller can time out.
    imports: { default: async },
    exports: { default: async },
});

pub(crate) use portwise::membership::log::Level as WitLevel;
pub(crate) use portwise::membership::probes::{
    HttpRequest, HttpResponse as WitHttpResponse, ProbeError as WitProbeError,
};
pub(crate) use portwise::membership::types::{
    AddressFamily, ContainerPort, Decision as WitDecision, KeyValue, Pod as WitPod, PodCondition,
    Service as WitService, ServicePort, Target as WitTarget, Verdict as WitVerdict,
};

/// Writes an IPv4-mapped IPv6 address as IPv4, everything else canonically.
pub(crate) fn normalise_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

fn pairs(map: Option<&std::collections::BTreeMap<String, String>>) -> Vec<KeyValue> {
    map.into_iter()
        .flatten()
        .map(|(key, value)| KeyValue {
            key: key.clone(),
            value: value.clone(),
        })
        .collect()
}

fn protocol(p: Option<&String>) -> String {
    match p.map(String::as_str) {
        None | Some("") => "TCP".to_string(),
        Some(p) => p.to_string(),
    }
}

/// The Service as the guest sees it.
pub(crate) fn service(svc: &Service) -> WitService {
    let meta = &svc.metadata;
    let ports = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|p| {
            let port = u16::try_from(p.port).ok()?;
            let target_port = match &p.target_port {
                Some(IntOrString::Int(n)) => n.to_string(),
                Some(IntOrString::String(s)) => s.clone(),
                // The API server defaults targetPort to port.
                None => port.to_string(),
            };
            Some(ServicePort {
                name: p.name.clone().unwrap_or_default(),
                port,
                protocol: protocol(p.protocol.as_ref()),
                target_port,
            })
        })
        .collect();
    WitService {
        name: meta.name.clone().unwrap_or_default(),
        namespace: meta.namespace.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        labels: pairs(meta.labels.as_ref()),
        annotations: pairs(meta.annotations.as_ref()),
        ports,
    }
}

/// The pod as the guest sees it.
pub(crate) fn pod(pod: &Pod) -> WitPod {
    let meta = &pod.metadata;
    let status = pod.status.as_ref();
    let spec = pod.spec.as_ref();

    let conditions = status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .map(|c| PodCondition {
            type_: c.type_.clone(),
            status: c.status.clone(),
            reason: c.reason.clone(),
        })
        .collect();

    // `podIPs` when set, else the legacy single `podIP`; unparsable entries
    // are dropped rather than handed to the guest as if they were addresses.
    let mut raw_ips: Vec<&str> = status
        .and_then(|s| s.pod_ips.as_ref())
        .into_iter()
        .flatten()
        .map(|p| p.ip.as_str())
        .collect();
    if raw_ips.is_empty()
        && let Some(ip) = status.and_then(|s| s.pod_ip.as_deref())
    {
        raw_ips.push(ip);
    }
    let mut ips: Vec<String> = Vec::with_capacity(raw_ips.len());
    for ip in raw_ips
        .iter()
        .filter_map(|s| s.trim().parse::<IpAddr>().ok())
    {
        let ip = normalise_ip(ip).to_string();
        if !ips.contains(&ip) {
            ips.push(ip);
        }
    }

    let mut container_ports = Vec::new();
    if let Some(spec) = spec {
        let regular = spec.containers.iter().map(|c| (c, false));
        let sidecars = spec
            .init_containers
            .iter()
            .flatten()
            .filter(|c| c.restart_policy.as_deref() == Some("Always"))
            .map(|c| (c, true));
        for (container, sidecar) in regular.chain(sidecars) {
            for p in container.ports.iter().flatten() {
                let Ok(port) = u16::try_from(p.container_port) else {
                    continue;
                };
                container_ports.push(ContainerPort {
                    container: container.name.clone(),
                    name: p.name.clone().filter(|n| !n.is_empty()),
                    port,
                    protocol: protocol(p.protocol.as_ref()),
                    sidecar,
                });
            }
        }
    }

    WitPod {
        name: meta.name.clone().unwrap_or_default(),
        namespace: meta.namespace.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        labels: pairs(meta.labels.as_ref()),
        annotations: pairs(meta.annotations.as_ref()),
        phase: status
            .and_then(|s| s.phase.clone())
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| "Unknown".to_string()),
        conditions,
        terminating: meta.deletion_timestamp.is_some(),
        node_name: spec
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty()),
        ips,
        container_ports,
    }
}

/// What is being judged: the resolved port, the family and the address.
pub(crate) fn target(subject: &Subject) -> WitTarget {
    let port = &subject.port;
    WitTarget {
        port_name: port.name.clone(),
        service_port: u16::try_from(port.port).unwrap_or(0),
        target_port: port.target,
        protocol: if port.protocol.is_empty() {
            "TCP".to_string()
        } else {
            port.protocol.clone()
        },
        family: match subject.family {
            Family::V4 => AddressFamily::Ipv4,
            Family::V6 => AddressFamily::Ipv6,
        },
        address: normalise_ip(subject.address).to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeMap, sync::Arc};

    use k8s_openapi::api::core::v1::{
        Container, ContainerPort as K8sContainerPort, PodCondition as K8sCondition, PodIP, PodSpec,
        PodStatus, ServicePort as K8sServicePort, ServiceSpec,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    use super::*;
    use crate::membership::ResolvedPort;

    fn labels(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
        Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    fn sample_pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web-0".into()),
                namespace: Some("shop".into()),
                uid: Some("u-1".into()),
                labels: labels(&[("b", "2"), ("a", "1")]),
                annotations: labels(&[("note", "x")]),
                deletion_timestamp: Some(Time("2026-01-01T00:00:00Z".parse().unwrap())),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some("node-a".into()),
                containers: vec![Container {
                    name: "app".into(),
                    ports: Some(vec![
                        K8sContainerPort {
                            container_port: 8080,
                            name: Some("http".into()),
                            ..Default::default()
                        },
                        K8sContainerPort {
                            container_port: 9000,
                            protocol: Some("UDP".into()),
                            ..Default::default()
                        },
                        K8sContainerPort {
                            container_port: 70000,
                            ..Default::default()
                        },
                    ]),
                    ..Default::default()
                }],
                init_containers: Some(vec![
                    Container {
                        name: "proxy".into(),
                        restart_policy: Some("Always".into()),
                        ports: Some(vec![K8sContainerPort {
                            container_port: 15001,
                            name: Some("mesh".into()),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    },
                    Container {
                        name: "migrate".into(),
                        ports: Some(vec![K8sContainerPort {
                            container_port: 5432,
                            ..Default::default()
                        }]),
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some("Running".into()),
                conditions: Some(vec![K8sCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    reason: None,
                    ..Default::default()
                }]),
                pod_ip: Some("10.244.0.5".into()),
                pod_ips: Some(vec![
                    PodIP {
                        ip: "::ffff:10.244.0.5".into(),
                    },
                    PodIP {
                        ip: "fd00:10:244::0005".into(),
                    },
                    PodIP {
                        ip: "garbage".into(),
                    },
                ]),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn pod_fields_are_carried_over() {
        let p = pod(&sample_pod());
        assert_eq!(
            (p.name.as_str(), p.namespace.as_str(), p.uid.as_str()),
            ("web-0", "shop", "u-1")
        );
        // BTreeMap order: sorted by key.
        assert_eq!(
            p.labels
                .iter()
                .map(|kv| kv.key.as_str())
                .collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(p.annotations[0].value, "x");
        assert_eq!(p.phase, "Running");
        assert_eq!(p.conditions[0].type_, "Ready");
        assert!(p.terminating);
        assert_eq!(p.node_name.as_deref(), Some("node-a"));
    }

    #[test]
    fn pod_ips_are_normalised_deduplicated_and_filtered() {
        let p = pod(&sample_pod());
        assert_eq!(p.ips, ["10.244.0.5", "fd00:10:244::5"]);
    }

    #[test]
    fn legacy_pod_ip_is_used_when_pod_ips_is_empty() {
        let mut raw = sample_pod();
        raw.status.as_mut().unwrap().pod_ips = None;
        assert_eq!(pod(&raw).ips, ["10.244.0.5"]);
    }

    #[test]
    fn container_ports_include_sidecars_only() {
        let p = pod(&sample_pod());
        let ports: Vec<_> = p
            .container_ports
            .iter()
            .map(|c| {
                (
                    c.container.as_str(),
                    c.name.as_deref(),
                    c.port,
                    c.protocol.as_str(),
                    c.sidecar,
                )
            })
            .collect();
        assert_eq!(
            ports,
            [
                ("app", Some("http"), 8080, "TCP", false),
                ("app", None, 9000, "UDP", false),
                ("proxy", Some("mesh"), 15001, "TCP", true),
            ]
        );
    }

    #[test]
    fn a_bare_pod_has_defaults() {
        let p = pod(&Pod::default());
        assert_eq!(p.phase, "Unknown");
        assert!(!p.terminating);
        assert!(p.ips.is_empty() && p.container_ports.is_empty() && p.node_name.is_none());
    }

    #[test]
    fn service_ports_and_target_ports() {
        let svc = Service {
            metadata: ObjectMeta {
                name: Some("shop".into()),
                namespace: Some("prod".into()),
                uid: Some("s-1".into()),
                labels: labels(&[("app", "shop")]),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                ports: Some(vec![
                    K8sServicePort {
                        name: Some("http".into()),
                        port: 80,
                        target_port: Some(IntOrString::String("web".into())),
                        ..Default::default()
                    },
                    K8sServicePort {
                        name: Some("admin".into()),
                        port: 9090,
                        protocol: Some("TCP".into()),
                        target_port: Some(IntOrString::Int(9091)),
                        ..Default::default()
                    },
                    K8sServicePort {
                        port: 53,
                        protocol: Some("UDP".into()),
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            }),
            status: None,
        };
        let s = service(&svc);
        assert_eq!(
            (s.name.as_str(), s.namespace.as_str(), s.uid.as_str()),
            ("shop", "prod", "s-1")
        );
        assert_eq!(s.labels[0].key, "app");
        let ports: Vec<_> = s
            .ports
            .iter()
            .map(|p| {
                (
                    p.name.as_str(),
                    p.port,
                    p.protocol.as_str(),
                    p.target_port.as_str(),
                )
            })
            .collect();
        assert_eq!(
            ports,
            [
                ("http", 80, "TCP", "web"),
                ("admin", 9090, "TCP", "9091"),
                ("", 53, "UDP", "53")
            ]
        );
    }

    #[test]
    fn target_normalises_the_address() {
        let subject = Subject {
            service: Arc::new(Service::default()),
            pod: Arc::new(Pod::default()),
            port: ResolvedPort {
                name: "http".into(),
                port: 80,
                protocol: String::new(),
                target: 8080,
            },
            family: Family::V4,
            address: "::ffff:10.244.0.9".parse().unwrap(),
        };
        let t = target(&subject);
        assert_eq!(t.address, "10.244.0.9");
        assert_eq!(
            (t.port_name.as_str(), t.service_port, t.target_port),
            ("http", 80, 8080)
        );
        assert_eq!(t.protocol, "TCP");
        assert!(matches!(t.family, AddressFamily::Ipv4));
    }
}
