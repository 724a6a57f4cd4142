//! A real istiod (pilot-discovery, sidecar mode, built by tests/istiod/build)
//! reading portwise's slices from the suite's control plane, run inside the
//! test network namespace. What it made of them is read from its debug
//! endpoint `/debug/endpointShardz`: per Service host and namespace, the
//! endpoints it would send to sidecars, each with its address, Service port
//! name, endpoint port and health.
//!
//! How it runs outside a cluster:
//! - Istio's CRDs (crd-all.gen.yaml, beside the binary) are applied to the
//!   control plane, and `istio-system` is created: istiod keeps its leader
//!   leases there and reads its mesh ConfigMap from there (none exists, so
//!   it uses the file given).
//! - Every listener on a free loopback port (`--httpAddr`, `--grpcAddr`,
//!   `--monitoringAddr`, `--ctrlz_port`); the TLS listeners (webhooks on
//!   `--httpsAddr`, secure xDS on `--secureGRPCAddr`) are off.
//! - No CA and no certificates (`ENABLE_CA_SERVER=false`,
//!   `PILOT_CERT_PROVIDER=none`): so it writes no `istio-ca-root-cert`
//!   ConfigMap into the tests' namespaces. No webhooks to patch, no Gateway
//!   API (its CRDs are not installed). It only reads, apart from its leases.
//!
//! Any number may run at once: each has its own ports and pod name.

use std::{
    collections::BTreeMap,
    fs::File,
    net::{Ipv4Addr, SocketAddr},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, api::PostParams};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::{ControlPlane, built_tool, free_port, http_get, install_crds};

/// The namespace istiod runs as (`POD_NAMESPACE`).
pub const ISTIO_NAMESPACE: &str = "istio-system";
/// The cluster domain istiod builds Service hosts with.
pub const DOMAIN: &str = "cluster.local";

/// How istiod rates an endpoint (`model.HealthStatus`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Health {
    Healthy,
    Unhealthy,
    Draining,
    Terminating,
    Other(i64),
}

impl Health {
    fn from_code(code: i64) -> Self {
        match code {
            1 => Health::Healthy,
            2 => Health::Unhealthy,
            3 => Health::Draining,
            4 => Health::Terminating,
            n => Health::Other(n),
        }
    }
}

/// One endpoint as istiod holds it for a Service host: what a sidecar would
/// be sent for that Service port.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct IstioEndpoint {
    /// The Service port's name, as the slice's port names it.
    pub port_name: String,
    pub address: String,
    /// The endpoint (target) port.
    pub port: u32,
    pub health: Health,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RawEndpoint {
    #[serde(default)]
    addresses: Vec<String>,
    #[serde(default)]
    service_port_name: String,
    #[serde(default)]
    endpoint_port: u32,
    #[serde(default)]
    health_status: i64,
}

/// A running istiod; see the module docs.
#[derive(Debug)]
pub struct Istiod {
    child: Child,
    http: SocketAddr,
    monitoring: SocketAddr,
    log: PathBuf,
    /// From spawn to `/ready` answering 200.
    pub ready_after: Duration,
    _dir: tempfile::TempDir,
}

/// The build's cache directory (pilot-discovery, crd-all.gen.yaml),
/// building it if needed (outside ./test; ./test defers a cold build, see
/// tests/src/deferred.rs).
pub fn istiod_dir() -> Result<PathBuf> {
    built_tool("tests/istiod/build")
}

impl Istiod {
    /// Applies Istio's CRDs, creates `istio-system`, starts pilot-discovery
    /// against `cp` and returns once its `/ready` answers 200 (its caches
    /// have synced).
    pub async fn start(cp: &ControlPlane) -> Result<Self> {
        let cache = tokio::task::spawn_blocking(istiod_dir).await??;
        let bin = cache.join("pilot-discovery");
        install_crds(cp, &cache.join("crd-all.gen.yaml"), "Istio's CRDs").await?;
        ensure_namespace(cp).await?;

        let dir = tempfile::Builder::new().prefix("istiod-").tempdir()?;
        let mesh = dir.path().join("mesh.yaml");
        std::fs::write(&mesh, format!("trustDomain: {DOMAIN}\n"))?;
        let networks = dir.path().join("meshNetworks.yaml");
        std::fs::write(&networks, "networks: {}\n")?;
        let log = dir.path().join("istiod.log");
        let local = |port: u16| SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let http = local(free_port()?);
        let grpc = local(free_port()?);
        let monitoring = local(free_port()?);
        let ctrlz = free_port()?;
        let pod_name = format!("istiod-{}", std::process::id());
        let started = Instant::now();
        let child = Command::new(&bin)
            .arg("discovery")
            .arg(format!("--kubeconfig={}", cp.kubeconfig().display()))
            .arg("--registries=Kubernetes")
            .arg("--clusterID=Kubernetes")
            .arg(format!("--domain={DOMAIN}"))
            .arg(format!("--meshConfig={}", mesh.display()))
            .arg(format!("--networksConfig={}", networks.display()))
            .arg(format!("--httpAddr={http}"))
            .arg(format!("--grpcAddr={grpc}"))
            .arg(format!("--monitoringAddr={monitoring}"))
            .arg("--httpsAddr=")
            .arg("--secureGRPCAddr=")
            .arg("--ctrlz_address=127.0.0.1")
            .arg(format!("--ctrlz_port={ctrlz}"))
            .arg("--keepaliveMaxServerConnectionAge=30m")
            .arg("--shutdownDuration=1s")
            .arg("--log_output_level=default:info")
            .env("POD_NAMESPACE", ISTIO_NAMESPACE)
            .env("POD_NAME", &pod_name)
            .env("REVISION", "default")
            .env("ENABLE_CA_SERVER", "false")
            .env("PILOT_CERT_PROVIDER", "none")
            .env("PILOT_ENABLE_GATEWAY_API", "false")
            .env("PILOT_ENABLE_GATEWAY_API_STATUS", "false")
            .env("PILOT_ENABLE_GATEWAY_API_DEPLOYMENT_CONTROLLER", "false")
            .env("PILOT_ENABLE_ALPHA_GATEWAY_API", "false")
            .env("PILOT_ENABLE_STATUS", "false")
            .env("VALIDATION_WEBHOOK_CONFIG_NAME", "")
            .env("INJECTION_WEBHOOK_CONFIG_NAME", "")
            .env("ISTIOD_CUSTOM_HOST", "")
            .env("CLUSTER_ID", "Kubernetes")
            .env("KUBECONFIG", cp.kubeconfig())
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(File::create(&log)?)
            .stderr(File::create(&log)?)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut istiod = Istiod {
            child,
            http,
            monitoring,
            log,
            ready_after: Duration::ZERO,
            _dir: dir,
        };
        let deadline = started + Duration::from_secs(120);
        loop {
            if let Some(status) = istiod.child.try_wait()? {
                bail!("istiod exited with {status}\n{}", istiod.log_tail());
            }
            if matches!(http_get(http, "/ready").await, Ok((200, _))) {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "istiod not ready within 120 s; log ({}):\n{}",
                    istiod.log.display(),
                    istiod.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        istiod.ready_after = started.elapsed();
        Ok(istiod)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `/debug/endpointShardz` as JSON: Service host -> namespace ->
    /// `{Shards: {"provider/cluster": [endpoint...]}, ServiceAccounts}`.
    pub async fn endpoint_shardz(&self) -> Result<Value> {
        let (status, body) = http_get(self.monitoring, "/debug/endpointShardz").await?;
        if status != 200 {
            bail!("istiod /debug/endpointShardz answered {status}: {body}");
        }
        let body = dechunk(&body).unwrap_or(body);
        serde_json::from_str(&body).with_context(|| format!("endpointShardz: {body}"))
    }

    /// Every endpoint istiod holds for Service `svc` in `ns`, over all
    /// shards, one per address, sorted.
    pub async fn endpoints(&self, ns: &str, svc: &str) -> Result<Vec<IstioEndpoint>> {
        endpoints_in(&self.endpoint_shardz().await?, ns, svc)
    }

    /// [`Istiod::endpoints`] grouped by Service port name.
    pub async fn endpoints_by_port(
        &self,
        ns: &str,
        svc: &str,
    ) -> Result<BTreeMap<String, Vec<IstioEndpoint>>> {
        let mut out: BTreeMap<String, Vec<IstioEndpoint>> = BTreeMap::new();
        for e in self.endpoints(ns, svc).await? {
            out.entry(e.port_name.clone()).or_default().push(e);
        }
        Ok(out)
    }

    /// The last lines of istiod's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<_> = text.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }

    /// Its HTTP address (`/ready`, and the debug handlers too).
    pub fn http_addr(&self) -> SocketAddr {
        self.http
    }
}

/// The body of a `Transfer-Encoding: chunked` answer ([`http_get`] returns
/// it as sent, and istiod chunks large answers), or `None` if `body` is not
/// chunked.
pub(crate) fn dechunk(body: &str) -> Option<String> {
    let mut out = String::new();
    let mut rest = body;
    loop {
        let (size, after) = rest.split_once("\r\n")?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(out);
        }
        out.push_str(after.get(..size)?);
        rest = after.get(size..)?.strip_prefix("\r\n")?;
    }
}

/// The endpoints of `svc.ns.svc.cluster.local` in an endpointShardz answer.
pub fn endpoints_in(shardz: &Value, ns: &str, svc: &str) -> Result<Vec<IstioEndpoint>> {
    let host = format!("{svc}.{ns}.svc.{DOMAIN}");
    let mut out = Vec::new();
    let Some(shards) = shardz.get(&host).and_then(|h| h.get(ns)) else {
        return Ok(out);
    };
    let Some(shards) = shards.get("Shards").and_then(Value::as_object) else {
        return Ok(out);
    };
    for endpoints in shards.values() {
        let raw: Vec<RawEndpoint> = serde_json::from_value(endpoints.clone())
            .with_context(|| format!("endpoints of {host}: {endpoints}"))?;
        for e in raw {
            for address in &e.addresses {
                out.push(IstioEndpoint {
                    port_name: e.service_port_name.clone(),
                    address: address.clone(),
                    port: e.endpoint_port,
                    health: Health::from_code(e.health_status),
                });
            }
        }
    }
    out.sort();
    Ok(out)
}

impl Drop for Istiod {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn ensure_namespace(cp: &ControlPlane) -> Result<()> {
    let namespaces: Api<Namespace> = Api::all(cp.client().await?);
    let ns: Namespace = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": { "name": ISTIO_NAMESPACE },
    }))?;
    match namespaces.create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e).context("creating istio-system"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dechunks_only_a_chunked_body() {
        assert_eq!(
            dechunk("4\r\n{\"a\"\r\n3\r\n:1}\r\n0\r\n\r\n").as_deref(),
            Some("{\"a\":1}")
        );
        assert_eq!(dechunk("{\"a\":1}"), None);
    }
}
