//! Builders for the Pods and Services a scenario needs.
//!
//! Built as JSON and parsed into k8s-openapi types, so a builder reads like
//! the manifest it stands for. There is no kubelet: a pod's status (phase,
//! Ready, IPs) is set afterwards through the status subresource, from the
//! `ready`/`phase`/`ips` recorded here (see [`crate::TestNs::create_pod`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, Service};
use serde_json::{Value, json};

/// Finalizer the tests put on pods that must stay terminating after delete.
pub const HOLD_FINALIZER: &str = "portwise.test/hold";

/// A pod named `name` with one container `app` (no ports until added).
pub fn pod(name: &str) -> PodBuilder {
    PodBuilder {
        name: name.to_string(),
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        containers: vec![("app".into(), Vec::new())],
        sidecars: Vec::new(),
        init_ports: Vec::new(),
        node: None,
        subdomain: None,
        hostname: None,
        host_network: false,
        finalizers: Vec::new(),
        ips: Vec::new(),
        ready: true,
        phase: "Running".into(),
        set_status: true,
    }
}

type Ports = Vec<(String, i32, String)>;

#[derive(Clone, Debug)]
pub struct PodBuilder {
    pub(crate) name: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    containers: Vec<(String, Ports)>,
    sidecars: Ports,
    init_ports: Ports,
    node: Option<String>,
    subdomain: Option<String>,
    hostname: Option<String>,
    host_network: bool,
    finalizers: Vec<String>,
    pub(crate) ips: Vec<String>,
    pub(crate) ready: bool,
    pub(crate) phase: String,
    pub(crate) set_status: bool,
}

impl PodBuilder {
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.labels.insert(k.into(), v.into());
        self
    }
    pub fn annotation(mut self, k: &str, v: &str) -> Self {
        self.annotations.insert(k.into(), v.into());
        self
    }
    /// A port on the main container. `proto` "" leaves it to the apiserver's
    /// default (TCP).
    pub fn container_port(self, name: &str, port: i32, proto: &str) -> Self {
        self.container_port_in("app", name, port, proto)
    }
    /// A port on container `container` (added if new): pods with several
    /// containers resolve named ports across all of them.
    pub fn container_port_in(
        mut self,
        container: &str,
        name: &str,
        port: i32,
        proto: &str,
    ) -> Self {
        let entry = (name.to_string(), port, proto.to_string());
        match self.containers.iter_mut().find(|(c, _)| c == container) {
            Some((_, ports)) => ports.push(entry),
            None => self.containers.push((container.to_string(), vec![entry])),
        }
        self
    }
    /// A port on a sidecar: an init container with `restartPolicy: Always`.
    pub fn sidecar_port(mut self, name: &str, port: i32, proto: &str) -> Self {
        self.sidecars.push((name.into(), port, proto.into()));
        self
    }
    /// A port on an ordinary (run-to-completion) init container, which must
    /// never back a Service port.
    pub fn init_port(mut self, name: &str, port: i32, proto: &str) -> Self {
        self.init_ports.push((name.into(), port, proto.into()));
        self
    }
    /// `spec.nodeName`: without it the apiserver deletes a pod at once
    /// instead of letting it terminate.
    pub fn node(mut self, node: &str) -> Self {
        self.node = Some(node.into());
        self
    }
    pub fn subdomain(mut self, subdomain: &str) -> Self {
        self.subdomain = Some(subdomain.into());
        self
    }
    pub fn hostname(mut self, hostname: &str) -> Self {
        self.hostname = Some(hostname.into());
        self
    }
    /// `spec.hostNetwork: true`: its address (set with [`PodBuilder::ips`])
    /// stands for its Node's.
    pub fn host_network(mut self) -> Self {
        self.host_network = true;
        self
    }
    /// Adds the test finalizer so that delete leaves the pod terminating.
    pub fn held(mut self) -> Self {
        self.finalizers.push(HOLD_FINALIZER.into());
        self
    }
    /// `status.podIPs` (the first is also `status.podIP`).
    pub fn ips<T: ToString>(mut self, ips: impl IntoIterator<Item = T>) -> Self {
        self.ips = ips.into_iter().map(|ip| ip.to_string()).collect();
        self
    }
    /// The Ready condition (default true).
    pub fn ready(mut self, ready: bool) -> Self {
        self.ready = ready;
        self
    }
    /// `status.phase` (default Running).
    pub fn phase(mut self, phase: &str) -> Self {
        self.phase = phase.into();
        self
    }
    /// Create the pod without setting any status (Pending, no IPs).
    pub fn no_status(mut self) -> Self {
        self.set_status = false;
        self
    }

    pub fn build(&self) -> Pod {
        let containers: Vec<Value> = self
            .containers
            .iter()
            .map(|(name, ports)| container(name, ports, None))
            .collect();
        let mut init: Vec<Value> = Vec::new();
        if !self.init_ports.is_empty() {
            init.push(container("init", &self.init_ports, None));
        }
        if !self.sidecars.is_empty() {
            init.push(container("sidecar", &self.sidecars, Some("Always")));
        }
        let mut spec = json!({ "containers": containers });
        if !init.is_empty() {
            spec["initContainers"] = json!(init);
        }
        if let Some(n) = &self.node {
            spec["nodeName"] = json!(n);
        }
        if let Some(s) = &self.subdomain {
            spec["subdomain"] = json!(s);
        }
        if let Some(h) = &self.hostname {
            spec["hostname"] = json!(h);
        }
        if self.host_network {
            spec["hostNetwork"] = json!(true);
        }
        let value = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": self.name,
                "labels": self.labels,
                "annotations": self.annotations,
                "finalizers": self.finalizers,
            },
            "spec": spec,
        });
        serde_json::from_value(value).expect("pod builder produces a valid Pod")
    }
}

fn container(name: &str, ports: &Ports, restart_policy: Option<&str>) -> Value {
    let ports: Vec<Value> = ports
        .iter()
        .map(|(n, p, proto)| {
            let mut v = json!({ "containerPort": p });
            if !n.is_empty() {
                v["name"] = json!(n);
            }
            if !proto.is_empty() {
                v["protocol"] = json!(proto);
            }
            v
        })
        .collect();
    let mut c =
        json!({ "name": name, "image": "registry.invalid/portwise-test:1", "ports": ports });
    if let Some(rp) = restart_policy {
        c["restartPolicy"] = json!(rp);
    }
    c
}

/// The JSON merge patch for a pod's status: phase, Ready condition, IPs.
pub(crate) fn status_patch(ready: bool, phase: &str, ips: &[String]) -> Value {
    let status = if ready { "True" } else { "False" };
    let mut s = json!({
        "phase": phase,
        "conditions": [
            { "type": "Ready", "status": status },
            { "type": "ContainersReady", "status": status },
        ],
    });
    if let Some(first) = ips.first() {
        s["podIP"] = json!(first);
        s["podIPs"] = json!(ips.iter().map(|ip| json!({ "ip": ip })).collect::<Vec<_>>());
    }
    json!({ "status": s })
}

/// A Service named `name`: ClusterIP, no selector, no ports until added.
pub fn service(name: &str) -> ServiceBuilder {
    ServiceBuilder {
        name: name.to_string(),
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        ports: Vec::new(),
        spec: json!({}),
        finalizers: Vec::new(),
    }
}

#[derive(Clone, Debug)]
pub struct ServiceBuilder {
    pub(crate) name: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    ports: Vec<Value>,
    spec: Value,
    finalizers: Vec<String>,
}

impl ServiceBuilder {
    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.labels.insert(k.into(), v.into());
        self
    }
    pub fn annotation(mut self, k: &str, v: &str) -> Self {
        self.annotations.insert(k.into(), v.into());
        self
    }
    /// A TCP port whose targetPort is the same number.
    pub fn port(mut self, name: &str, port: i32) -> Self {
        self.ports
            .push(json!({ "name": name, "port": port, "protocol": "TCP" }));
        self
    }
    /// A TCP port with a numeric (`json!(8080)`) or named (`json!("web")`)
    /// targetPort.
    pub fn port_to(self, name: &str, port: i32, target: Value) -> Self {
        self.port_full(name, port, target, "TCP")
    }
    /// A TCP port whose targetPort is the same number, with an
    /// `appProtocol` (`http`, `kubernetes.io/h2c`, ...).
    pub fn port_app(mut self, name: &str, port: i32, app_protocol: &str) -> Self {
        self.ports.push(json!({
            "name": name, "port": port, "protocol": "TCP", "appProtocol": app_protocol,
        }));
        self
    }
    pub fn port_full(mut self, name: &str, port: i32, target: Value, protocol: &str) -> Self {
        self.ports.push(
            json!({ "name": name, "port": port, "targetPort": target, "protocol": protocol }),
        );
        self
    }
    pub fn selector(mut self, k: &str, v: &str) -> Self {
        self.spec["selector"][k] = json!(v);
        self
    }
    /// `RequireDualStack` with `[IPv4, IPv6]`.
    pub fn dual_stack(mut self) -> Self {
        self.spec["ipFamilyPolicy"] = json!("RequireDualStack");
        self.spec["ipFamilies"] = json!(["IPv4", "IPv6"]);
        self
    }
    /// Single stack in `family` ("IPv4" or "IPv6").
    pub fn family(mut self, family: &str) -> Self {
        self.spec["ipFamilyPolicy"] = json!("SingleStack");
        self.spec["ipFamilies"] = json!([family]);
        self
    }
    pub fn headless(mut self) -> Self {
        self.spec["clusterIP"] = json!("None");
        self
    }
    pub fn publish_not_ready(mut self) -> Self {
        self.spec["publishNotReadyAddresses"] = json!(true);
        self
    }
    pub fn traffic_distribution(mut self, value: &str) -> Self {
        self.spec["trafficDistribution"] = json!(value);
        self
    }
    /// `internalTrafficPolicy` (`Cluster` or `Local`).
    pub fn internal_traffic_policy(mut self, value: &str) -> Self {
        self.spec["internalTrafficPolicy"] = json!(value);
        self
    }
    pub fn external_name(mut self, host: &str) -> Self {
        self.spec["type"] = json!("ExternalName");
        self.spec["externalName"] = json!(host);
        self
    }
    /// A finalizer, so that a delete leaves the Service being deleted.
    pub fn held(mut self) -> Self {
        self.finalizers.push(HOLD_FINALIZER.into());
        self
    }

    pub fn build(&self) -> Service {
        let mut spec = self.spec.clone();
        spec["ports"] = json!(self.ports);
        let value = json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": self.name,
                "labels": self.labels,
                "annotations": self.annotations,
                "finalizers": self.finalizers,
            },
            "spec": spec,
        });
        serde_json::from_value(value).expect("service builder produces a valid Service")
    }
}
