//! A real Traefik v3 (built by tests/traefik/build) reading portwise's
//! slices from the suite's control plane through its Kubernetes Ingress and
//! Gateway API providers, run inside the test network namespace, with HTTP
//! sent through it to listeners on the pods' addresses that answer with the
//! pod's name.
//!
//! How it runs outside a cluster:
//! - `KUBECONFIG` names the suite's kubeconfig (the providers use it when
//!   they are not in a cluster; `--providers.kubernetesingress.endpoint`,
//!   `.token` and `.certauthfilepath` are the other way).
//! - Both providers watch only the test's namespace; the Gateway API CRDs
//!   (standard channel, beside the binary) are applied first.
//! - Two entry points on free loopback ports: `web` for traffic (a Gateway
//!   listener must use its port number: Traefik maps listeners to entry
//!   points by port) and `traefik` for `/ping` and the API (`/api/rawdata`:
//!   the routers and services it built, each service's servers).
//! - The Ingress provider's `allowEmptyServices` is on: a Service port with
//!   no servers answers 503 (by default Traefik drops such a route, 404).
//! - No version check, no usage report: nothing leaves the namespace.
//!
//! Any number may run at once: each has its own ports and namespace.

use std::{
    collections::BTreeMap,
    fs::File,
    net::{Ipv4Addr, SocketAddr},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use crate::{ControlPlane, built_tool, free_port, http_get, install_crds, wait_for};

/// The `controllerName` Traefik's Gateway API provider claims classes by.
pub const GATEWAY_CONTROLLER: &str = "traefik.io/gateway-controller";

/// A running Traefik; see the module docs.
#[derive(Debug)]
pub struct Traefik {
    child: Child,
    web: SocketAddr,
    api: SocketAddr,
    log: PathBuf,
    /// From spawn to `/ping` answering 200.
    pub ready_after: Duration,
    _dir: tempfile::TempDir,
}

/// The build's cache directory (traefik, crds/), building it if needed
/// (outside ./test; ./test defers a cold build, see tests/src/deferred.rs).
pub fn traefik_dir() -> Result<PathBuf> {
    built_tool("tests/traefik/build")
}

/// What `n` requests through one route met.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Routed {
    /// 200 answers, per body (the pod's name).
    pub by_pod: BTreeMap<String, usize>,
    /// Any other status, per status.
    pub statuses: BTreeMap<u16, usize>,
    /// No HTTP answer at all (refused, reset, timed out).
    pub failed: usize,
}

impl Routed {
    /// The pods that answered, sorted.
    pub fn pods(&self) -> Vec<String> {
        self.by_pod.keys().cloned().collect()
    }

    /// `n` requests for `host` through the proxy listening at `addr` (an
    /// ingress or gateway: Traefik, Envoy), each answer counted.
    pub(crate) async fn count(addr: SocketAddr, host: &str, n: usize) -> Routed {
        let mut out = Routed::default();
        for _ in 0..n {
            match get_through(addr, host).await {
                Ok((200, body)) => *out.by_pod.entry(body).or_default() += 1,
                Ok((status, _)) => *out.statuses.entry(status).or_default() += 1,
                Err(_) => out.failed += 1,
            }
        }
        out
    }
}

/// One `GET /` with `Host: host` through the proxy listening at `addr`: the
/// status and the body (the suite's pods answer with their name).
pub(crate) async fn get_through(addr: SocketAddr, host: &str) -> Result<(u16, String)> {
    let mut s = tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(addr))
        .await
        .with_context(|| format!("connecting to {addr}: timed out"))?
        .with_context(|| format!("connecting to {addr}"))?;
    s.write_all(format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf))
        .await
        .with_context(|| format!("reading from {addr}: timed out"))??;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("no HTTP answer for {host}: {text:?}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("no status line: {head:?}"))?;
    Ok((status, body.trim().to_string()))
}

/// Requests per check. Traefik's default balancer is a weighted round
/// robin, so 30 requests meet every one of up to 4 members several times.
pub const REQUESTS: usize = 30;

impl Traefik {
    /// Applies the Gateway API CRDs, starts Traefik against `cp` with both
    /// providers watching `namespace`, and returns once `/ping` answers.
    pub async fn start(cp: &ControlPlane, namespace: &str) -> Result<Self> {
        let cache = tokio::task::spawn_blocking(traefik_dir).await??;
        let bin = cache.join("traefik");
        install_crds(cp, &cache.join("crds"), "the Gateway API CRDs").await?;

        let dir = tempfile::Builder::new().prefix("traefik-").tempdir()?;
        let log = dir.path().join("traefik.log");
        let local = |port: u16| SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let web = local(free_port()?);
        let api = local(free_port()?);
        let started = Instant::now();
        let child = Command::new(&bin)
            .arg("--global.checkNewVersion=false")
            .arg("--global.sendAnonymousUsage=false")
            .arg(format!("--entryPoints.web.address={web}"))
            .arg(format!("--entryPoints.traefik.address={api}"))
            .arg("--entryPoints.web.transport.lifeCycle.graceTimeOut=0s")
            .arg("--entryPoints.traefik.transport.lifeCycle.graceTimeOut=0s")
            .arg("--api.insecure=true")
            .arg("--ping=true")
            .arg("--providers.providersThrottleDuration=100ms")
            .arg("--providers.kubernetesingress=true")
            .arg(format!(
                "--providers.kubernetesingress.namespaces={namespace}"
            ))
            // A Service port without servers gets an empty load balancer,
            // which answers 503; by default the route is dropped (404).
            .arg("--providers.kubernetesingress.allowEmptyServices=true")
            .arg("--providers.kubernetesgateway=true")
            .arg(format!(
                "--providers.kubernetesgateway.namespaces={namespace}"
            ))
            .arg("--log.level=DEBUG")
            .arg("--log.noColor=true")
            .env("KUBECONFIG", cp.kubeconfig())
            .env_remove("KUBERNETES_SERVICE_HOST")
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(File::create(&log)?)
            .stderr(File::create(&log)?)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut traefik = Traefik {
            child,
            web,
            api,
            log,
            ready_after: Duration::ZERO,
            _dir: dir,
        };
        let deadline = started + Duration::from_secs(60);
        loop {
            traefik.running()?;
            if matches!(http_get(api, "/ping").await, Ok((200, _))) {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "traefik not answering /ping within 60 s; log ({}):\n{}",
                    traefik.log.display(),
                    traefik.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        traefik.ready_after = started.elapsed();
        Ok(traefik)
    }

    /// Fails if Traefik has exited (it must survive whatever portwise
    /// publishes).
    pub fn running(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("traefik exited with {status}; log:\n{}", self.log_tail());
        }
        Ok(())
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The `web` entry point's port: a Gateway listener's port number.
    pub fn web_port(&self) -> u16 {
        self.web.port()
    }

    /// One `GET /` with `Host: host` through the `web` entry point: the
    /// status and the body.
    pub async fn get(&self, host: &str) -> Result<(u16, String)> {
        get_through(self.web, host).await
    }

    /// `n` requests for `host`, each answer counted.
    pub async fn routed(&self, host: &str, n: usize) -> Routed {
        Routed::count(self.web, host, n).await
    }

    /// Waits until [`REQUESTS`] requests for `host` are all answered 200 by
    /// exactly `pods`, every one of them at least once and no other.
    pub async fn expect_members(
        &mut self,
        host: &str,
        pods: &[&str],
        within: Duration,
    ) -> Result<Routed> {
        let want: Vec<String> = pods.iter().map(|p| p.to_string()).collect();
        let got = wait_for(within, || async {
            let got = self.routed(host, REQUESTS).await;
            if got.pods() == want && got.statuses.is_empty() && got.failed == 0 {
                Ok(got)
            } else {
                bail!("{host} through traefik: wanted {want:?}, got {got:?}")
            }
        })
        .await;
        self.checked(got).await
    }

    /// Waits until every one of [`REQUESTS`] requests for `host` is answered
    /// `status` (no pod answers).
    pub async fn expect_status(
        &mut self,
        host: &str,
        status: u16,
        within: Duration,
    ) -> Result<Routed> {
        let got = wait_for(within, || async {
            let got = self.routed(host, REQUESTS).await;
            if got.statuses.get(&status) == Some(&REQUESTS) {
                Ok(got)
            } else {
                bail!("{host} through traefik: wanted {REQUESTS} × {status}, got {got:?}")
            }
        })
        .await;
        self.checked(got).await
    }

    /// `got`, failing also if Traefik has exited; a failure carries the
    /// services Traefik built and its log's tail.
    async fn checked<T>(&mut self, got: Result<T>) -> Result<T> {
        self.running()?;
        match got {
            Ok(got) => Ok(got),
            Err(e) => {
                let servers = match self.servers().await {
                    Ok(s) => format!("{s:#?}"),
                    Err(e) => format!("unknown: {e:#}"),
                };
                Err(e.context(format!(
                    "traefik's services and servers: {servers}\ntraefik log:\n{}",
                    self.log_tail()
                )))
            }
        }
    }

    /// `/api/rawdata`: every router, service and middleware Traefik built.
    pub async fn rawdata(&self) -> Result<Value> {
        let (status, body) = http_get(self.api, "/api/rawdata").await?;
        if status != 200 {
            bail!("traefik /api/rawdata answered {status}: {body}");
        }
        let body = crate::istiod::dechunk(&body).unwrap_or(body);
        serde_json::from_str(&body).with_context(|| format!("/api/rawdata: {body}"))
    }

    /// Each HTTP service Traefik built (name → its load balancer's servers,
    /// each `(url, fenced)`), from [`Traefik::rawdata`].
    pub async fn servers(&self) -> Result<BTreeMap<String, Vec<(String, bool)>>> {
        let raw = self.rawdata().await?;
        let mut out = BTreeMap::new();
        for (name, svc) in raw["services"].as_object().into_iter().flatten() {
            let Some(servers) = svc["loadBalancer"]["servers"].as_array() else {
                continue;
            };
            let mut list: Vec<(String, bool)> = servers
                .iter()
                .map(|s| {
                    (
                        s["url"].as_str().unwrap_or_default().to_string(),
                        s["fenced"].as_bool().unwrap_or(false),
                    )
                })
                .collect();
            list.sort();
            out.insert(name.clone(), list);
        }
        Ok(out)
    }

    /// The servers Traefik holds for the service whose name contains
    /// `part` (exactly one must).
    pub async fn servers_of(&self, part: &str) -> Result<Vec<(String, bool)>> {
        let all = self.servers().await?;
        let mut hits = all.into_iter().filter(|(name, _)| name.contains(part));
        match (hits.next(), hits.next()) {
            (Some((_, servers)), None) => Ok(servers),
            (None, _) => bail!("traefik has no service named like {part:?}"),
            (Some((a, _)), Some((b, _))) => {
                bail!("traefik has several services like {part:?}: {a}, {b}")
            }
        }
    }

    /// The last lines of Traefik's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<_> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for Traefik {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An Ingress in `ns` (no class: Traefik takes it) routing each `(host,
/// service, port name)` to that Service port by name.
pub fn ingress(name: &str, rules: &[(&str, &str, &str)]) -> Value {
    let rules: Vec<Value> = rules
        .iter()
        .map(|(host, svc, port)| {
            json!({
                "host": host,
                "http": { "paths": [{
                    "path": "/",
                    "pathType": "Prefix",
                    "backend": { "service": { "name": svc, "port": { "name": port } } },
                }]},
            })
        })
        .collect();
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": { "name": name },
        "spec": { "rules": rules },
    })
}

/// The GatewayClass every test's Traefik shares (cluster-scoped; Traefik
/// accepts every class naming its controller), a Gateway in `ns` listening on `port` (the
/// `web` entry point's), and one HTTPRoute per `(host, service, port
/// number)`, as one List for `kubectl apply`.
pub fn gateway(ns: &str, port: u16, routes: &[(&str, &str, u16)]) -> Value {
    let named: Vec<(String, &str, &str, u16)> = routes
        .iter()
        .enumerate()
        .map(|(i, &(host, svc, port))| (format!("route-{i}"), host, svc, port))
        .collect();
    let items = gateway_api_objects(
        "portwise-tests-traefik",
        GATEWAY_CONTROLLER,
        ns,
        port,
        &named,
    );
    json!({ "apiVersion": "v1", "kind": "List", "items": items })
}

/// A GatewayClass `class` of `controller`, a Gateway `gw` in `ns` with one
/// HTTP listener on `port`, and one HTTPRoute per `(route name, hostname,
/// service, port number)`: what the Traefik and Envoy Gateway tests route
/// through.
pub(crate) fn gateway_api_objects(
    class: &str,
    controller: &str,
    ns: &str,
    port: u16,
    routes: &[(impl AsRef<str>, &str, &str, u16)],
) -> Vec<Value> {
    let mut items = vec![
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "GatewayClass",
            "metadata": { "name": class },
            "spec": { "controllerName": controller },
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
            "metadata": { "name": name.as_ref(), "namespace": ns },
            "spec": {
                "parentRefs": [{ "name": "gw" }],
                "hostnames": [host],
                "rules": [{ "backendRefs": [{ "name": svc, "port": port }] }],
            },
        }));
    }
    items
}
