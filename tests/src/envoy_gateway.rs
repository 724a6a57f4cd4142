//! Envoy Gateway's translation (egctl v1.9.1, built by
//! tests/envoy-gateway/build) over portwise's slices: Gateway API
//! resources, the Service and the EndpointSlices read from the suite's
//! apiserver go into `egctl x translate --from gateway-api --to xds`, and
//! out comes the xDS Envoy Gateway would serve its Envoys, whose clusters'
//! load assignments are the members Envoy would send each route to.
//!
//! What differs from upstream's egctl (tests/envoy-gateway/README.md): its
//! input loader reads EndpointSlices, and it routes to endpoints as Envoy
//! Gateway's controller does by default; upstream's translate drops slices
//! and forces Service ClusterIP routing. The translation from slices to
//! load assignments (`internal/gatewayapi/route.go`,
//! `getIREndpointsFromEndpointSlice`, then `internal/xds/translator`) is
//! upstream's.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::PathBuf,
    process::Command,
};

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};

use crate::built_tool;

/// The `controllerName` of Envoy Gateway's GatewayClass.
pub const GATEWAY_CONTROLLER: &str = "gateway.envoyproxy.io/gatewayclass-controller";

/// The build's cache directory (`egctl`, and `envoy` beside it), building
/// it if needed (outside ./test; ./test defers a cold build, see
/// tests/src/deferred.rs).
pub fn envoy_gateway_dir() -> Result<PathBuf> {
    built_tool("tests/envoy-gateway/build")
}

/// One endpoint of a cluster's load assignment.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct LbEndpoint {
    pub address: String,
    pub port: u64,
    /// `healthStatus` as Envoy's JSON spells it (`UNKNOWN` when unset):
    /// Envoy Gateway marks a draining endpoint `DRAINING`.
    pub health: String,
}

/// Each cluster's load assignment: cluster name → its endpoints, sorted.
pub type Assignments = BTreeMap<String, Vec<LbEndpoint>>;

/// The GatewayClass, a Gateway in `ns` with one HTTP listener on `port`,
/// and one HTTPRoute per `(route name, hostname, service, port number)`.
pub fn gateway_objects(ns: &str, port: u16, routes: &[(&str, &str, &str, u16)]) -> Vec<Value> {
    let class = "portwise-tests-eg";
    let mut items = vec![
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "GatewayClass",
            "metadata": { "name": class },
            "spec": { "controllerName": GATEWAY_CONTROLLER },
        }),
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": { "name": "gw", "namespace": ns },
            "spec": {
                "gatewayClassName": class,
                "listeners": [{
                    "name": "web",
                    "port": port,
                    "protocol": "HTTP",
                    "allowedRoutes": { "namespaces": { "from": "Same" } },
                }],
            },
        }),
    ];
    for (name, host, svc, port) in routes {
        items.push(json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "HTTPRoute",
            "metadata": { "name": name, "namespace": ns },
            "spec": {
                "parentRefs": [{ "name": "gw" }],
                "hostnames": [host],
                "rules": [{ "backendRefs": [{ "name": svc, "port": port }] }],
            },
        }));
    }
    items
}

/// An object read from the apiserver, as an input document: what the
/// server adds (managedFields, status) left out.
pub fn as_input<K: serde::Serialize>(obj: &K) -> Result<Value> {
    let mut v = serde_json::to_value(obj)?;
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
    }
    if let Some(o) = v.as_object_mut() {
        o.remove("status");
    }
    Ok(v)
}

/// `egctl x translate --from gateway-api --to xds --type all -o json` over
/// `objects` (one YAML document each): the xDS config dump per Gateway.
pub fn translate(egctl: &std::path::Path, objects: &[Value]) -> Result<Value> {
    let dir = tempfile::Builder::new().prefix("egctl-").tempdir()?;
    let input = dir.path().join("input.yaml");
    let text: Vec<String> = objects.iter().map(Value::to_string).collect();
    std::fs::write(&input, text.join("\n---\n"))?;
    let out = Command::new(egctl)
        .args(["x", "translate", "--from", "gateway-api", "--to", "xds"])
        .args(["--type", "all", "--output", "json", "--file"])
        .arg(&input)
        .output()
        .with_context(|| format!("running {}", egctl.display()))?;
    ensure!(
        out.status.success(),
        "egctl x translate failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "egctl's output is not JSON: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// Every cluster load assignment in `xds` (any object with `clusterName`
/// and `endpoints`, wherever the config dump holds it).
pub fn load_assignments(xds: &Value) -> Result<Assignments> {
    fn walk(v: &Value, out: &mut Assignments) -> Result<()> {
        match v {
            Value::Object(o) => {
                if let (Some(Value::String(name)), Some(Value::Array(localities))) =
                    (o.get("clusterName"), o.get("endpoints"))
                {
                    let mut eps = Vec::new();
                    for l in localities {
                        for ep in l["lbEndpoints"].as_array().into_iter().flatten() {
                            let sock = &ep["endpoint"]["address"]["socketAddress"];
                            let address = sock["address"]
                                .as_str()
                                .with_context(|| format!("{name}: no address in {ep}"))?;
                            let port = sock["portValue"]
                                .as_u64()
                                .with_context(|| format!("{name}: no port in {ep}"))?;
                            eps.push(LbEndpoint {
                                address: address.to_string(),
                                port,
                                health: ep["healthStatus"]
                                    .as_str()
                                    .unwrap_or("UNKNOWN")
                                    .to_string(),
                            });
                        }
                    }
                    eps.sort();
                    if out.insert(name.clone(), eps).is_some() {
                        bail!("two load assignments for cluster {name}");
                    }
                    return Ok(());
                }
                for v in o.values() {
                    walk(v, out)?;
                }
            }
            Value::Array(a) => {
                for v in a {
                    walk(v, out)?;
                }
            }
            _ => {}
        }
        Ok(())
    }
    let mut out = Assignments::new();
    walk(xds, &mut out)?;
    Ok(out)
}

/// The cluster Envoy Gateway builds for rule 0 of HTTPRoute `route` in `ns`.
pub fn route_cluster(ns: &str, route: &str) -> String {
    format!("httproute/{ns}/{route}/rule/0")
}

/// The endpoints Envoy would pick: those not draining or unhealthy, as
/// `(address, port)`.
pub fn members(eps: &[LbEndpoint]) -> BTreeSet<(String, u64)> {
    eps.iter()
        .filter(|e| matches!(e.health.as_str(), "UNKNOWN" | "HEALTHY"))
        .map(|e| (e.address.clone(), e.port))
        .collect()
}
