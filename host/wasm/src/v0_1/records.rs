//! A call's pod and Service as 0.1's records: copied into the guest on
//! every call, borrowed from the informer's objects on the way.
//!
//! The conversion is pure: it only reads the informer's snapshot of the
//! Service and pod, so it is unit tested here without any WebAssembly.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, Service};

use super::portwise::membership::types::{
    ContainerPort, KeyValue, Pod as WitPod, PodCondition, Service as WitService, ServicePort,
};
use crate::facts::{
    container_ports, node_name, phase, pod_ips, pod_status, protocol, service_ports,
    target_port_text,
};
use portwise_core::membership::Subject;

fn pairs(map: Option<&BTreeMap<String, String>>) -> Vec<KeyValue<'_>> {
    map.into_iter()
        .flatten()
        .map(|(key, value)| KeyValue { key, value })
        .collect()
}

/// The strings the host computes for a call (normalised addresses, target
/// ports written out); everything else is borrowed from the [`Subject`].
///
/// The records handed to a guest borrow instead of copy: with 30 labels and
/// 30 annotations, cloning them into owned records cost more than the whole
/// rest of a call.
pub(crate) struct Computed {
    ips: Vec<String>,
    target_ports: Vec<String>,
    /// The subject's address, normalised: what [`super::target`] borrows.
    pub(crate) address: String,
}

impl Computed {
    pub(crate) fn new(subject: &Subject) -> Self {
        let ips = pod_ips(&subject.pod);
        let target_ports = service_ports(&subject.service)
            .map(|(p, port)| target_port_text(p, port))
            .collect();
        Computed {
            ips,
            target_ports,
            address: subject.address.to_canonical().to_string(),
        }
    }
}

/// The lists the borrowed records point into.
pub(crate) struct Lists<'a> {
    pod_labels: Vec<KeyValue<'a>>,
    pod_annotations: Vec<KeyValue<'a>>,
    conditions: Vec<PodCondition<'a>>,
    ips: Vec<&'a str>,
    container_ports: Vec<ContainerPort<'a>>,
    service_labels: Vec<KeyValue<'a>>,
    service_annotations: Vec<KeyValue<'a>>,
    service_ports: Vec<ServicePort<'a>>,
}

impl<'a> Lists<'a> {
    pub(crate) fn new(subject: &'a Subject, computed: &'a Computed) -> Self {
        let pod = &*subject.pod;
        let svc = &*subject.service;
        let conditions = pod_status(pod)
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .map(|c| PodCondition {
                type_: &c.type_,
                status: &c.status,
                reason: c.reason.as_deref(),
            })
            .collect();

        let container_ports = container_ports(pod)
            .map(|(container, p, port, sidecar)| ContainerPort {
                container: &container.name,
                name: p.name.as_deref().filter(|n| !n.is_empty()),
                port,
                protocol: protocol(p.protocol.as_ref()),
                sidecar,
            })
            .collect();

        let service_ports = service_ports(svc)
            .zip(&computed.target_ports)
            .map(|((p, port), target_port)| ServicePort {
                name: p.name.as_deref().unwrap_or_default(),
                port,
                protocol: protocol(p.protocol.as_ref()),
                target_port,
            })
            .collect();

        Lists {
            pod_labels: pairs(pod.metadata.labels.as_ref()),
            pod_annotations: pairs(pod.metadata.annotations.as_ref()),
            conditions,
            ips: computed.ips.iter().map(String::as_str).collect(),
            container_ports,
            service_labels: pairs(svc.metadata.labels.as_ref()),
            service_annotations: pairs(svc.metadata.annotations.as_ref()),
            service_ports,
        }
    }
}

/// The Service as the guest sees it.
pub(crate) fn service<'a>(svc: &'a Service, lists: &'a Lists<'a>) -> WitService<'a> {
    let meta = &svc.metadata;
    WitService {
        name: meta.name.as_deref().unwrap_or_default(),
        namespace: meta.namespace.as_deref().unwrap_or_default(),
        uid: meta.uid.as_deref().unwrap_or_default(),
        labels: &lists.service_labels,
        annotations: &lists.service_annotations,
        ports: &lists.service_ports,
    }
}

/// The pod as the guest sees it.
pub(crate) fn pod<'a>(pod: &'a Pod, lists: &'a Lists<'a>) -> WitPod<'a> {
    let meta = &pod.metadata;
    WitPod {
        name: meta.name.as_deref().unwrap_or_default(),
        namespace: meta.namespace.as_deref().unwrap_or_default(),
        uid: meta.uid.as_deref().unwrap_or_default(),
        labels: &lists.pod_labels,
        annotations: &lists.pod_annotations,
        phase: phase(pod),
        conditions: &lists.conditions,
        terminating: meta.deletion_timestamp.is_some(),
        node_name: node_name(pod),
        ips: &lists.ips,
        container_ports: &lists.container_ports,
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
    use crate::v0_1::portwise::membership::types::{AddressFamily, Target as WitTarget};
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use portwise_core::membership::{Family, ResolvedPort};

    /// Runs `f` on the records a guest would get for `pod` and `svc`.
    fn records<R>(p: Pod, svc: Service, f: impl FnOnce(WitService, WitPod, WitTarget) -> R) -> R {
        let subject = Subject {
            service: Arc::new(svc),
            pod: Arc::new(p),
            port: ResolvedPort {
                name: "http".into(),
                port: 80,
                protocol: String::new(),
                target: 8080,
            },
            family: Family::V4,
            address: "::ffff:10.244.0.9".parse().unwrap(),
        };
        let computed = Computed::new(&subject);
        let lists = Lists::new(&subject, &computed);
        f(
            service(&subject.service, &lists),
            pod(&subject.pod, &lists),
            super::super::target(&subject, &computed.address),
        )
    }

    fn with_pod<R>(p: Pod, f: impl FnOnce(WitPod) -> R) -> R {
        records(p, Service::default(), |_, p, _| f(p))
    }

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
        with_pod(sample_pod(), |p| {
            assert_eq!((p.name, p.namespace, p.uid), ("web-0", "shop", "u-1"));
            // BTreeMap order: sorted by key.
            assert_eq!(
                p.labels.iter().map(|kv| kv.key).collect::<Vec<_>>(),
                ["a", "b"]
            );
            assert_eq!(p.annotations[0].value, "x");
            assert_eq!(p.phase, "Running");
            assert_eq!(p.conditions[0].type_, "Ready");
            assert!(p.terminating);
            assert_eq!(p.node_name, Some("node-a"));
        });
    }

    #[test]
    fn pod_ips_are_normalised_deduplicated_and_filtered() {
        with_pod(sample_pod(), |p| {
            assert_eq!(p.ips, ["10.244.0.5", "fd00:10:244::5"])
        });
    }

    /// A guest is shown exactly the addresses the planner reads (issue 43):
    /// before one parser served both, the guest got `127.0.0.1`, the
    /// metadata address and a link-local one (which the planner never
    /// publishes) and missed `010.244.000.007` (which it does, read as
    /// upstream's `ParseIPSloppy` reads it).
    #[test]
    fn guests_see_the_addresses_the_planner_publishes() {
        let mut raw = sample_pod();
        let status = raw.status.as_mut().unwrap();
        status.pod_ip = None;
        status.pod_ips = Some(
            [
                "127.0.0.1",
                "010.244.000.007",
                "169.254.169.254",
                "fe80::1",
                "fd00:10:244::7",
            ]
            .into_iter()
            .map(|ip| PodIP { ip: ip.into() })
            .collect(),
        );
        let planner: Vec<String> = portwise_core::align::pod_addresses(&raw)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(planner, ["10.244.0.7", "fd00:10:244::7"]);
        for family in [Family::V4, Family::V6] {
            let first = portwise_core::align::pod_address(&raw, family).map(|ip| ip.to_string());
            assert!(first.is_some_and(|ip| planner.contains(&ip)));
        }
        with_pod(raw, |p| assert_eq!(p.ips, planner));
    }

    #[test]
    fn legacy_pod_ip_is_used_when_pod_ips_is_empty() {
        let mut raw = sample_pod();
        raw.status.as_mut().unwrap().pod_ips = None;
        with_pod(raw, |p| assert_eq!(p.ips, ["10.244.0.5"]));
    }

    #[test]
    fn container_ports_include_sidecars_only() {
        with_pod(sample_pod(), |p| {
            let ports: Vec<_> = p
                .container_ports
                .iter()
                .map(|c| (c.container, c.name, c.port, c.protocol, c.sidecar))
                .collect();
            assert_eq!(
                ports,
                [
                    ("app", Some("http"), 8080, "TCP", false),
                    ("app", None, 9000, "UDP", false),
                    ("proxy", Some("mesh"), 15001, "TCP", true),
                ]
            );
        });
    }

    #[test]
    fn a_bare_pod_has_defaults() {
        with_pod(Pod::default(), |p| {
            assert_eq!(p.phase, "Unknown");
            assert!(!p.terminating);
            assert!(p.ips.is_empty() && p.container_ports.is_empty() && p.node_name.is_none());
        });
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
        records(Pod::default(), svc, |s, _, _| {
            assert_eq!((s.name, s.namespace, s.uid), ("shop", "prod", "s-1"));
            assert_eq!(s.labels[0].key, "app");
            let ports: Vec<_> = s
                .ports
                .iter()
                .map(|p| (p.name, p.port, p.protocol, p.target_port))
                .collect();
            assert_eq!(
                ports,
                [
                    ("http", 80, "TCP", "web"),
                    ("admin", 9090, "TCP", "9091"),
                    ("", 53, "UDP", "53")
                ]
            );
        });
    }

    #[test]
    fn target_normalises_the_address() {
        records(Pod::default(), Service::default(), |_, _, t| {
            assert_eq!(t.address, "10.244.0.9");
            assert_eq!(
                (t.port_name, t.service_port, t.target_port),
                ("http", 80, 8080)
            );
            assert_eq!(t.protocol, "TCP");
            assert!(matches!(t.family, AddressFamily::Ipv4));
        });
    }
}

/// What the conversion costs: `cargo test --release -p portwise-wasm --lib
/// v0_1::records::speed -- --ignored --nocapture`.
#[cfg(test)]
mod speed {
    use std::{collections::BTreeMap, sync::Arc, time::Instant};

    use k8s_openapi::{
        api::core::v1::{Pod, Service},
        apimachinery::pkg::apis::meta::v1::ObjectMeta,
    };

    use super::*;
    use portwise_core::membership::{Family, ResolvedPort};

    #[test]
    #[ignore]
    fn conversion_speed() {
        let kv = |p: &str| -> BTreeMap<String, String> {
            (0..30)
                .map(|i| {
                    (
                        format!("{p}.example.com/key-{i:02}"),
                        format!("value-{i:02}-{}", "v".repeat(20)),
                    )
                })
                .collect()
        };
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some("web-0".into()),
                labels: Some(kv("l")),
                annotations: Some(kv("a")),
                ..Default::default()
            },
            ..Default::default()
        };
        let s = Subject {
            service: Arc::new(Service::default()),
            pod: Arc::new(pod),
            port: ResolvedPort {
                name: "http".into(),
                port: 80,
                protocol: "TCP".into(),
                target: 80,
            },
            family: Family::V4,
            address: "10.0.0.1".parse().unwrap(),
        };
        let n = 20000;
        let t = Instant::now();
        for _ in 0..n {
            let computed = Computed::new(&s);
            let lists = Lists::new(&s, &computed);
            std::hint::black_box((
                super::service(&s.service, &lists),
                super::pod(&s.pod, &lists),
                super::super::target(&s, &computed.address),
            ));
        }
        eprintln!("conversion: {:?} per call", t.elapsed() / n);
    }
}
