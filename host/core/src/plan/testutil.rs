//! Builders and a tiny fake apiserver for planner tests.

use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
    sync::Arc,
};

use k8s_openapi::{
    api::{
        core::v1::{
            Container, ContainerPort, Pod, PodIP, PodSpec, PodStatus, Service, ServicePort,
            ServiceSpec,
        },
        discovery::v1::EndpointSlice,
    },
    apimachinery::pkg::{
        apis::meta::v1::{ObjectMeta, OwnerReference, Time},
        util::intstr::IntOrString,
    },
};

use super::{Judged, Plan, PlanInput, TRIGGER_TIME_ANNOTATION, Triggers, is_ours, plan};
use crate::{
    align,
    membership::{Decision, Family},
};

pub const NS: &str = "ns";
pub const MANAGER: &str = "portwise";

pub fn service(name: &str, ports: Vec<ServicePort>, families: &[&str]) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            uid: Some(format!("{name}-uid")),
            labels: Some(BTreeMap::from([("app".to_string(), name.to_string())])),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            cluster_ip: Some("10.96.0.10".into()),
            ip_families: Some(families.iter().map(|f| f.to_string()).collect()),
            ports: Some(ports),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn port(name: &str, port: i32, target: IntOrString) -> ServicePort {
    ServicePort {
        name: Some(name.into()),
        port,
        target_port: Some(target),
        protocol: Some("TCP".into()),
        ..Default::default()
    }
}

pub fn named(s: &str) -> IntOrString {
    IntOrString::String(s.into())
}

pub fn num(n: i32) -> IntOrString {
    IntOrString::Int(n)
}

pub fn pod(name: &str, ips: &[&str], web: u16) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            uid: Some(format!("{name}-uid")),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "app".into(),
                ports: Some(vec![ContainerPort {
                    name: Some("web".into()),
                    container_port: i32::from(web),
                    ..Default::default()
                }]),
                ..Default::default()
            }],
            node_name: Some("node-a".into()),
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some("Running".into()),
            pod_ips: Some(ips.iter().map(|ip| PodIP { ip: ip.to_string() }).collect()),
            ..Default::default()
        }),
    }
}

pub fn terminating(mut p: Pod) -> Pod {
    p.metadata.deletion_timestamp = Some(Time("2026-01-01T00:00:00Z".parse().unwrap()));
    p
}

/// `n` IPv4(+IPv6) pods `p0000…` with sequential addresses.
pub fn many_pods(n: usize, dual: bool) -> Vec<Arc<Pod>> {
    (0..n)
        .map(|i| {
            let v4 = format!("10.244.{}.{}", i / 250, i % 250 + 1);
            let v6 = format!("fd00:10:244::{:x}", i + 1);
            let ips: Vec<&str> = if dual { vec![&v4, &v6] } else { vec![&v4] };
            Arc::new(pod(&format!("p{i:04}"), &ips, 8080))
        })
        .collect()
}

/// Judges every subject of `svc` with `decide`.
pub fn judge(
    svc: &Service,
    pods: &[Arc<Pod>],
    decide: impl Fn(&Pod, &str, Family) -> Decision,
) -> Vec<Judged> {
    align::subjects(&Arc::new(svc.clone()), pods, &Default::default())
        .into_iter()
        .map(|s| Judged {
            decision: decide(&s.pod, &s.port.name, s.family),
            port: s.port,
            family: s.family,
            pod: s.pod,
            address: s.address,
        })
        .collect()
}

pub fn include_all(svc: &Service, pods: &[Arc<Pod>]) -> Vec<Judged> {
    judge(svc, pods, |_, _, _| Decision::Include)
}

/// A namespace's EndpointSlices, by name.
#[derive(Clone, Debug, Default)]
pub struct World {
    pub slices: BTreeMap<String, Arc<EndpointSlice>>,
}

impl World {
    pub fn owned(&self, svc: &Service) -> Vec<Arc<EndpointSlice>> {
        self.slices
            .values()
            .filter(|s| is_ours(s, svc, MANAGER))
            .cloned()
            .collect()
    }

    pub fn plan(&self, svc: &Service, judged: &[Judged], max: usize) -> Plan {
        self.plan_with(svc, judged, max, None)
    }

    pub fn plan_with(
        &self,
        svc: &Service,
        judged: &[Judged],
        max: usize,
        zones: Option<super::ZoneLookup>,
    ) -> Plan {
        self.plan_full(svc, judged, max, zones, Triggers::none())
    }

    /// A plan dated by `triggers`.
    pub fn plan_dated(
        &self,
        svc: &Service,
        judged: &[Judged],
        max: usize,
        triggers: Triggers,
    ) -> Plan {
        self.plan_full(svc, judged, max, None, triggers)
    }

    fn plan_full(
        &self,
        svc: &Service,
        judged: &[Judged],
        max: usize,
        zones: Option<super::ZoneLookup>,
        triggers: Triggers,
    ) -> Plan {
        let owned = self.owned(svc);
        let lookup = |n: &str| self.slices.get(n).cloned();
        plan(&PlanInput {
            service: svc,
            managed_by: MANAGER,
            max_endpoints_per_slice: max,
            judged,
            zones,
            owned: &owned,
            lookup: &lookup,
            triggers,
        })
    }

    /// Applies a plan the way the apiserver would: applies replace our
    /// fields (others' labels, annotations and owner references survive;
    /// the trigger-time annotation is ours), deletes delete.
    pub fn apply(&mut self, plan: &Plan) {
        for s in &plan.applies {
            let name = s.metadata.name.clone().unwrap();
            let mut next = s.clone();
            if let Some(live) = self.slices.get(&name) {
                assert_eq!(
                    live.address_type, s.address_type,
                    "addressType is immutable ({name})"
                );
                let mut labels = live.metadata.labels.clone().unwrap_or_default();
                labels.extend(s.metadata.labels.clone().unwrap_or_default());
                next.metadata.labels = Some(labels);
                let mut annotations = live.metadata.annotations.clone().unwrap_or_default();
                annotations.remove(TRIGGER_TIME_ANNOTATION);
                annotations.remove(super::MOVING_IN_ANNOTATION);
                annotations.extend(s.metadata.annotations.clone().unwrap_or_default());
                next.metadata.annotations = (!annotations.is_empty()).then_some(annotations);
                let mut refs: Vec<OwnerReference> =
                    live.metadata.owner_references.clone().unwrap_or_default();
                for r in s.metadata.owner_references.iter().flatten() {
                    if !refs.contains(r) {
                        refs.retain(|o| o.uid != r.uid);
                        refs.push(r.clone());
                    }
                }
                next.metadata.owner_references = Some(refs);
            }
            self.slices.insert(name, Arc::new(next));
        }
        for d in &plan.deletes {
            assert!(
                self.slices.remove(d).is_some(),
                "deleting a slice that does not exist: {d}"
            );
        }
        if !plan.finishes.is_empty() {
            self.apply(&Plan {
                applies: plan.finishes.clone(),
                ..Plan::default()
            });
        }
    }

    pub fn get(&self, name: &str) -> &EndpointSlice {
        self.slices
            .get(name)
            .unwrap_or_else(|| panic!("no slice {name}; have {:?}", self.names()))
    }

    pub fn names(&self) -> Vec<String> {
        self.slices.keys().cloned().collect()
    }
}

/// Addresses of a slice, in order.
pub fn addresses(s: &EndpointSlice) -> Vec<String> {
    s.endpoints
        .iter()
        .flatten()
        .map(|e| e.addresses[0].clone())
        .collect()
}

/// (port name, family) → every (address, pod) in our slices, with repeats.
pub fn published(world: &World, svc: &Service) -> HashMap<(String, String), Vec<(IpAddr, String)>> {
    let mut out: HashMap<(String, String), Vec<(IpAddr, String)>> = HashMap::new();
    for s in world.owned(svc) {
        // A port-less slice counts under "".
        let ports: Vec<String> = match s.ports.as_deref() {
            None | Some([]) => vec![String::new()],
            Some(ports) => ports
                .iter()
                .map(|p| p.name.clone().unwrap_or_default())
                .collect(),
        };
        for e in s.endpoints.iter().flatten() {
            let ip = align::parse_ip(&e.addresses[0]).unwrap();
            let pod = e.target_ref.as_ref().unwrap().name.clone().unwrap();
            for port in &ports {
                out.entry((port.clone(), s.address_type.clone()))
                    .or_default()
                    .push((ip, pod.clone()));
            }
        }
    }
    out
}

/// A slice someone else holds.
pub fn foreign(name: &str, manager: &str, service: &str, address_type: &str) -> Arc<EndpointSlice> {
    Arc::new(EndpointSlice {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            labels: Some(BTreeMap::from([
                (super::MANAGED_BY_LABEL.to_string(), manager.to_string()),
                (super::SERVICE_NAME_LABEL.to_string(), service.to_string()),
            ])),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Service".into(),
                name: service.into(),
                uid: format!("{service}-uid"),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..Default::default()
        },
        address_type: address_type.into(),
        endpoints: Some(vec![]),
        ports: None,
    })
}
