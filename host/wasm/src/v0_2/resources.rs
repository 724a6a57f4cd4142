//! The pod and Service of a call as 0.2's resources: the views the
//! bindings name as the resource types, and the queries a guest makes on
//! them.
//!
//! Why resources: 0.1 lowered the whole pod and Service into the guest on
//! every call, about 125 strings for a pod with 30 labels and 30
//! annotations, read or not. Here a call hands over two handles, and each
//! query copies only its answer. The views hold `Arc`s of the informer's
//! objects, so creating them copies nothing either.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, Service};
use wasmtime::component::Resource;

use super::portwise::membership::types;
use crate::{
    facts::{
        container_ports, node_name, phase, pod_ips, pod_status, protocol, service_ports,
        target_port_text,
    },
    state::HostState,
};

/// The pod under judgement, as a 0.2 guest sees it.
pub struct PodView {
    pub(crate) pod: Arc<Pod>,
}

/// The Service the slices are published for, as a 0.2 guest sees it.
pub struct ServiceView {
    pub(crate) service: Arc<Service>,
}

fn text(s: Option<&String>) -> String {
    s.cloned().unwrap_or_default()
}

fn lookup(map: Option<&std::collections::BTreeMap<String, String>>, key: &str) -> Option<String> {
    map.and_then(|m| m.get(key)).cloned()
}

fn all(map: Option<&std::collections::BTreeMap<String, String>>) -> Vec<types::KeyValue> {
    map.into_iter()
        .flatten()
        .map(|(key, value)| types::KeyValue {
            key: key.clone(),
            value: value.clone(),
        })
        .collect()
}

fn condition(c: &k8s_openapi::api::core::v1::PodCondition) -> types::PodCondition {
    types::PodCondition {
        type_: c.type_.clone(),
        status: c.status.clone(),
        reason: c.reason.clone(),
    }
}

fn container_port(
    (container, p, port, sidecar): (
        &k8s_openapi::api::core::v1::Container,
        &k8s_openapi::api::core::v1::ContainerPort,
        u16,
        bool,
    ),
) -> types::ContainerPort {
    types::ContainerPort {
        container: container.name.clone(),
        name: p.name.clone().filter(|n| !n.is_empty()),
        port,
        protocol: protocol(p.protocol.as_ref()).to_string(),
        sidecar,
    }
}

impl HostState {
    fn pod_of(&self, handle: &Resource<PodView>) -> wasmtime::Result<&Pod> {
        Ok(&self.table.get(handle)?.pod)
    }

    fn service_of(&self, handle: &Resource<ServiceView>) -> wasmtime::Result<&Service> {
        Ok(&self.table.get(handle)?.service)
    }

    /// Hands the call's pod and Service to the table; the handles are
    /// borrowed by the guest for one call and removed by [`Self::end_views`].
    pub(crate) fn begin_views(
        &mut self,
        pod: Arc<Pod>,
        service: Arc<Service>,
    ) -> wasmtime::Result<(Resource<PodView>, Resource<ServiceView>)> {
        let pod = self.table.push(PodView { pod })?;
        let service = self.table.push(ServiceView { service })?;
        Ok((pod, service))
    }

    pub(crate) fn end_views(&mut self, pod: u32, service: u32) {
        // By rep: the handles themselves were moved into the call. A failed
        // delete means the call never got as far as owning them; either way
        // nothing of the call stays in the table.
        let _ = self.table.delete(Resource::<PodView>::new_own(pod));
        let _ = self.table.delete(Resource::<ServiceView>::new_own(service));
    }
}

impl types::HostPod for HostState {
    fn name(&mut self, this: Resource<PodView>) -> wasmtime::Result<String> {
        Ok(text(self.pod_of(&this)?.metadata.name.as_ref()))
    }
    fn namespace(&mut self, this: Resource<PodView>) -> wasmtime::Result<String> {
        Ok(text(self.pod_of(&this)?.metadata.namespace.as_ref()))
    }
    fn uid(&mut self, this: Resource<PodView>) -> wasmtime::Result<String> {
        Ok(text(self.pod_of(&this)?.metadata.uid.as_ref()))
    }
    fn label(&mut self, this: Resource<PodView>, key: String) -> wasmtime::Result<Option<String>> {
        Ok(lookup(self.pod_of(&this)?.metadata.labels.as_ref(), &key))
    }
    fn labels(&mut self, this: Resource<PodView>) -> wasmtime::Result<Vec<types::KeyValue>> {
        Ok(all(self.pod_of(&this)?.metadata.labels.as_ref()))
    }
    fn annotation(
        &mut self,
        this: Resource<PodView>,
        key: String,
    ) -> wasmtime::Result<Option<String>> {
        Ok(lookup(
            self.pod_of(&this)?.metadata.annotations.as_ref(),
            &key,
        ))
    }
    fn annotations(&mut self, this: Resource<PodView>) -> wasmtime::Result<Vec<types::KeyValue>> {
        Ok(all(self.pod_of(&this)?.metadata.annotations.as_ref()))
    }
    fn phase(&mut self, this: Resource<PodView>) -> wasmtime::Result<String> {
        Ok(phase(self.pod_of(&this)?).to_string())
    }
    fn condition(
        &mut self,
        this: Resource<PodView>,
        kind: String,
    ) -> wasmtime::Result<Option<types::PodCondition>> {
        Ok(pod_status(self.pod_of(&this)?)
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == kind))
            .map(condition))
    }
    fn conditions(
        &mut self,
        this: Resource<PodView>,
    ) -> wasmtime::Result<Vec<types::PodCondition>> {
        Ok(pod_status(self.pod_of(&this)?)
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .map(condition)
            .collect())
    }
    fn terminating(&mut self, this: Resource<PodView>) -> wasmtime::Result<bool> {
        Ok(self.pod_of(&this)?.metadata.deletion_timestamp.is_some())
    }
    fn node_name(&mut self, this: Resource<PodView>) -> wasmtime::Result<Option<String>> {
        Ok(node_name(self.pod_of(&this)?).map(str::to_string))
    }
    fn ips(&mut self, this: Resource<PodView>) -> wasmtime::Result<Vec<String>> {
        Ok(pod_ips(self.pod_of(&this)?))
    }
    fn container_port(
        &mut self,
        this: Resource<PodView>,
        name: String,
    ) -> wasmtime::Result<Option<types::ContainerPort>> {
        Ok(container_ports(self.pod_of(&this)?)
            .find(|(_, p, _, _)| p.name.as_deref() == Some(name.as_str()) && !name.is_empty())
            .map(container_port))
    }
    fn container_ports(
        &mut self,
        this: Resource<PodView>,
    ) -> wasmtime::Result<Vec<types::ContainerPort>> {
        Ok(container_ports(self.pod_of(&this)?)
            .map(container_port)
            .collect())
    }
    fn drop(&mut self, this: Resource<PodView>) -> wasmtime::Result<()> {
        self.table.delete(this)?;
        Ok(())
    }
}

fn service_port((p, port): (&k8s_openapi::api::core::v1::ServicePort, u16)) -> types::ServicePort {
    types::ServicePort {
        name: p.name.clone().unwrap_or_default(),
        port,
        protocol: protocol(p.protocol.as_ref()).to_string(),
        target_port: target_port_text(p, port),
    }
}

impl types::HostService for HostState {
    fn name(&mut self, this: Resource<ServiceView>) -> wasmtime::Result<String> {
        Ok(text(self.service_of(&this)?.metadata.name.as_ref()))
    }
    fn namespace(&mut self, this: Resource<ServiceView>) -> wasmtime::Result<String> {
        Ok(text(self.service_of(&this)?.metadata.namespace.as_ref()))
    }
    fn uid(&mut self, this: Resource<ServiceView>) -> wasmtime::Result<String> {
        Ok(text(self.service_of(&this)?.metadata.uid.as_ref()))
    }
    fn label(
        &mut self,
        this: Resource<ServiceView>,
        key: String,
    ) -> wasmtime::Result<Option<String>> {
        Ok(lookup(
            self.service_of(&this)?.metadata.labels.as_ref(),
            &key,
        ))
    }
    fn labels(&mut self, this: Resource<ServiceView>) -> wasmtime::Result<Vec<types::KeyValue>> {
        Ok(all(self.service_of(&this)?.metadata.labels.as_ref()))
    }
    fn annotation(
        &mut self,
        this: Resource<ServiceView>,
        key: String,
    ) -> wasmtime::Result<Option<String>> {
        Ok(lookup(
            self.service_of(&this)?.metadata.annotations.as_ref(),
            &key,
        ))
    }
    fn annotations(
        &mut self,
        this: Resource<ServiceView>,
    ) -> wasmtime::Result<Vec<types::KeyValue>> {
        Ok(all(self.service_of(&this)?.metadata.annotations.as_ref()))
    }
    fn port(
        &mut self,
        this: Resource<ServiceView>,
        name: String,
    ) -> wasmtime::Result<Option<types::ServicePort>> {
        Ok(service_ports(self.service_of(&this)?)
            .find(|(p, _)| p.name.as_deref().unwrap_or_default() == name)
            .map(service_port))
    }
    fn ports(&mut self, this: Resource<ServiceView>) -> wasmtime::Result<Vec<types::ServicePort>> {
        Ok(service_ports(self.service_of(&this)?)
            .map(service_port)
            .collect())
    }
    fn drop(&mut self, this: Resource<ServiceView>) -> wasmtime::Result<()> {
        self.table.delete(this)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{
        Container, ContainerPort as K8sContainerPort, PodCondition as K8sCondition, PodIP, PodSpec,
        PodStatus, ServicePort as K8sServicePort, ServiceSpec,
    };
    use k8s_openapi::apimachinery::pkg::{apis::meta::v1::ObjectMeta, util::intstr::IntOrString};

    use super::super::portwise::membership::probes;
    use super::*;
    use crate::{Limits, failures::ModuleCounters, state::CallLabels};
    use types::{HostPod, HostService};

    fn map(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
        Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    fn pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web-0".into()),
                namespace: Some("shop".into()),
                labels: map(&[("tier", "backend"), ("app", "web")]),
                annotations: map(&[("note", "x")]),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some(String::new()),
                containers: vec![Container {
                    name: "app".into(),
                    ports: Some(vec![K8sContainerPort {
                        container_port: 8080,
                        name: Some("http".into()),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }],
                init_containers: Some(vec![Container {
                    name: "mesh".into(),
                    restart_policy: Some("Always".into()),
                    ports: Some(vec![K8sContainerPort {
                        container_port: 15001,
                        name: Some("proxy".into()),
                        protocol: Some("UDP".into()),
                        ..Default::default()
                    }]),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            status: Some(PodStatus {
                conditions: Some(vec![K8sCondition {
                    type_: "Ready".into(),
                    status: "False".into(),
                    reason: Some("ContainersNotReady".into()),
                    ..Default::default()
                }]),
                pod_ips: Some(vec![
                    PodIP {
                        ip: "::ffff:10.244.0.5".into(),
                    },
                    PodIP {
                        ip: "fd00:10:244::5".into(),
                    },
                ]),
                ..Default::default()
            }),
        }
    }

    fn service(pnra: bool) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("shop".into()),
                annotations: map(&[("a", "b")]),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                publish_not_ready_addresses: Some(pnra),
                ports: Some(vec![
                    K8sServicePort {
                        name: Some("http".into()),
                        port: 80,
                        target_port: Some(IntOrString::String("http".into())),
                        ..Default::default()
                    },
                    K8sServicePort {
                        name: Some("dns".into()),
                        port: 53,
                        protocol: Some("UDP".into()),
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn state(pnra: bool) -> (HostState, Resource<PodView>, Resource<ServiceView>) {
        let limits = Limits::default();
        let call = limits.for_expression(&Default::default()).unwrap();
        let mut s = HostState::new(
            Arc::new(limits),
            Arc::new(ModuleCounters::default()),
            64 << 20,
        );
        let (pod, service) = (Arc::new(pod()), Arc::new(service(pnra)));
        s.begin_call(
            Some("10.244.0.5".parse().unwrap()),
            CallLabels {
                service: Some(service.clone()),
                pod: Some(pod.clone()),
                ..Default::default()
            },
            &call,
        );
        let (p, sv) = s.begin_views(pod, service).unwrap();
        (s, p, sv)
    }

    fn again<T: 'static>(r: &Resource<T>) -> Resource<T> {
        Resource::new_borrow(r.rep())
    }

    #[test]
    fn pod_queries_answer_by_key_and_in_full() {
        let (mut s, p, _) = state(false);
        assert_eq!(HostPod::name(&mut s, again(&p)).unwrap(), "web-0");
        assert_eq!(
            HostPod::label(&mut s, again(&p), "tier".into()).unwrap(),
            Some("backend".into())
        );
        assert_eq!(
            HostPod::label(&mut s, again(&p), "nope".into()).unwrap(),
            None
        );
        let keys: Vec<_> = HostPod::labels(&mut s, again(&p))
            .unwrap()
            .into_iter()
            .map(|kv| kv.key)
            .collect();
        assert_eq!(keys, ["app", "tier"]);
        assert_eq!(
            HostPod::annotation(&mut s, again(&p), "note".into()).unwrap(),
            Some("x".into())
        );
        assert_eq!(s.phase(again(&p)).unwrap(), "Unknown");
        let ready = s.condition(again(&p), "Ready".into()).unwrap().unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_deref()),
            ("False", Some("ContainersNotReady"))
        );
        assert!(
            s.condition(again(&p), "Scheduled".into())
                .unwrap()
                .is_none()
        );
        assert!(!s.terminating(again(&p)).unwrap());
        // An empty nodeName is no node.
        assert_eq!(s.node_name(again(&p)).unwrap(), None);
        assert_eq!(s.ips(again(&p)).unwrap(), ["10.244.0.5", "fd00:10:244::5"]);
        let sidecar = s
            .container_port(again(&p), "proxy".into())
            .unwrap()
            .unwrap();
        assert_eq!(
            (
                sidecar.container.as_str(),
                sidecar.port,
                sidecar.protocol.as_str(),
                sidecar.sidecar
            ),
            ("mesh", 15001, "UDP", true)
        );
        assert!(
            s.container_port(again(&p), String::new())
                .unwrap()
                .is_none()
        );
        assert_eq!(s.container_ports(again(&p)).unwrap().len(), 2);
    }

    #[test]
    fn service_queries_write_target_ports_out() {
        let (mut s, _, sv) = state(false);
        assert_eq!(HostService::name(&mut s, again(&sv)).unwrap(), "shop");
        let dns = s.port(again(&sv), "dns".into()).unwrap().unwrap();
        assert_eq!(
            (dns.port, dns.protocol.as_str(), dns.target_port.as_str()),
            (53, "UDP", "53")
        );
        let ports = s.ports(again(&sv)).unwrap();
        assert_eq!(ports[0].target_port, "http");
        assert_eq!(ports[0].protocol, "TCP");
        assert_eq!(
            HostService::annotation(&mut s, again(&sv), "a".into()).unwrap(),
            Some("b".into())
        );
    }

    #[test]
    fn views_are_gone_after_the_call() {
        let (mut s, p, sv) = state(false);
        let (pr, sr) = (p.rep(), sv.rep());
        s.end_views(pr, sr);
        // A guest that kept a handle past the call would get a trap, not
        // the next call's pod.
        assert!(HostPod::name(&mut s, Resource::new_borrow(pr)).is_err());
        assert!(HostService::name(&mut s, Resource::new_borrow(sr)).is_err());
    }

    #[test]
    fn pod_ready_follows_the_builtin_and_yields_to_pnra() {
        use probes::Host;
        let (mut s, _, _) = state(false);
        assert!(!s.pod_ready().unwrap(), "Ready is False");
        let (mut s, _, _) = state(true);
        assert!(
            s.pod_ready().unwrap(),
            "publishNotReadyAddresses: readiness yields"
        );
        let limits = Limits::default();
        let call = limits.for_expression(&Default::default()).unwrap();
        let mut s = HostState::new(
            Arc::new(limits),
            Arc::new(ModuleCounters::default()),
            64 << 20,
        );
        s.begin_call(None, CallLabels::default(), &call);
        assert!(!s.pod_ready().unwrap(), "validate-config has no pod");
    }
}
