//! Cilium ClusterMesh's export side: a real `clustermesh-apiserver`
//! (tests/clustermesh/build, the Cilium module and version of
//! cilium-agent) against the suite's control plane, writing what it exports
//! for the other clusters of a mesh into an etcd: the control plane's own
//! (tests/control-plane embeds one), whose client URL the control plane's
//! `env` file names. Each instance gets a cluster name of its own, so its
//! keys (`cilium/state/*/v1/<cluster>/...`, `cilium/synced/<cluster>/...`,
//! `cilium/cluster-config/<cluster>`) are its own, and Kubernetes' keys
//! (`/registry/...`) are never touched.
//!
//! What is read back is the legacy service export, the one the agents of
//! the other clusters read by default (`--clustermesh-service-v2`
//! `prefer-legacy`): `cilium/state/services/v1/<cluster>/<ns>/<svc>`, the
//! JSON of `serviceStore.ClusterService`, whose `backends` map each backend
//! address to the Service ports it serves. Upstream builds it in
//! `DefaultClusterServiceConverter.Convert`
//! (`operator/watchers/service_sync.go`), which writes
//! `Backends[addr]` once per slice: an address in two slices of a Service
//! is exported with the ports of whichever slice came last.
//!
//! Only Services marked global (`service.cilium.io/global: "true"`,
//! [`GLOBAL`]) in global namespaces (all of them by default) are exported.
//! The server needs Cilium's CRDs (it waits for them), which its build
//! copies beside it; it runs without gops, its health API on a free
//! port and its shell socket in its own directory, so that nothing of it
//! reaches past its test.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs::File,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};
use serde::Deserialize;

use crate::{ControlPlane, built_tool, cilium, free_port};

/// The annotation that marks a Service global (Cilium's
/// `annotation.GlobalService`), so that ClusterMesh exports it.
pub const GLOBAL: &str = "service.cilium.io/global";

/// How long the server may take from start to its initial sync.
const STARTUP: Duration = Duration::from_secs(90);

/// Reads every key under a prefix through etcd's JSON gateway
/// (`/v3/kv/range`), printed as one JSON object key → value.
const RANGE: &str = r#"
import base64, json, sys, urllib.request
url, prefix = sys.argv[1], sys.argv[2]
end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
b64 = lambda s: base64.b64encode(s.encode()).decode()
req = urllib.request.Request(url + "/v3/kv/range",
    data=json.dumps({"key": b64(prefix), "range_end": b64(end)}).encode(),
    headers={"Content-Type": "application/json"})
with urllib.request.urlopen(req, timeout=10) as r:
    got = json.load(r)
print(json.dumps({base64.b64decode(kv["key"]).decode(): base64.b64decode(kv.get("value", "")).decode("utf-8", "replace")
                  for kv in got.get("kvs", [])}))
"#;

/// The directory of the built server (`clustermesh-apiserver`, `crds/`),
/// building it if needed (outside ./test; ./test builds it beside cilium-agent, and
/// defers it with it, see tests/src/deferred.rs).
pub fn apiserver_dir() -> Result<PathBuf> {
    built_tool("tests/clustermesh/build")
}

/// One exported port: `loadbalancer.L4Addr` as ClusterMesh writes it.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
pub struct L4Addr {
    #[serde(rename = "Protocol")]
    pub protocol: String,
    #[serde(rename = "Port")]
    pub port: u16,
}

/// `serviceStore.ClusterService`, the fields the tests read.
#[derive(Clone, Debug, Deserialize)]
pub struct ClusterService {
    pub cluster: String,
    pub namespace: String,
    pub name: String,
    /// Backend address → Service port name → target port.
    #[serde(default)]
    pub backends: BTreeMap<String, BTreeMap<String, L4Addr>>,
}

impl ClusterService {
    /// Backend address → the names of the Service ports it is exported
    /// with.
    pub fn ports_by_backend(&self) -> BTreeMap<String, BTreeSet<String>> {
        self.backends
            .iter()
            .map(|(addr, ports)| (addr.clone(), ports.keys().cloned().collect()))
            .collect()
    }
}

/// A running clustermesh-apiserver; see the module docs. Dropping it stops
/// it.
#[derive(Debug)]
pub struct ClusterMeshApiserver {
    child: Option<Child>,
    cluster: String,
    etcd: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

/// The control plane's etcd client URL, from its `env` file.
fn etcd_url(cp: &ControlPlane) -> Result<String> {
    let path = cp.dir().join("env");
    let env = std::fs::read_to_string(&path)
        .with_context(|| format!("reading the control plane's {}", path.display()))?;
    env.lines()
        .find_map(|l| l.strip_prefix("ETCD_URL="))
        .map(|v| v.trim_matches('"').to_string())
        .with_context(|| format!("no ETCD_URL in {}", path.display()))
}

/// Every key under `prefix` in the etcd at `url`, with its value.
async fn etcd_range(url: &str, prefix: &str) -> Result<BTreeMap<String, String>> {
    let out = tokio::process::Command::new("python3")
        .args(["-c", RANGE, url, prefix])
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .context("running python3 (etcd's JSON gateway)")?;
    ensure!(
        out.status.success(),
        "reading {prefix} from etcd at {url}: {}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).context("etcd's range answer")
}

impl ClusterMeshApiserver {
    /// Starts clustermesh-apiserver as cluster `cluster` (ID `id`, 1-255)
    /// against `cp` and its etcd, and returns once its initial sync of
    /// Services to etcd is done.
    pub async fn start(cp: &ControlPlane, cluster: &str, id: u8) -> Result<Self> {
        let built = tokio::task::spawn_blocking(apiserver_dir).await??;
        let bin = built.join("clustermesh-apiserver");
        cilium::apply_crds(cp, &built.join("crds")).await?;
        let etcd = etcd_url(cp)?;
        let dir = tempfile::Builder::new().prefix("clustermesh-").tempdir()?;
        let log = dir.path().join("clustermesh-apiserver.log");
        let out = File::create(&log)?;
        let started = Instant::now();
        let child = Command::new(&bin)
            .arg("clustermesh")
            .arg(format!("--cluster-name={cluster}"))
            .arg(format!("--cluster-id={id}"))
            .arg("--kvstore=etcd")
            .arg(format!("--kvstore-opt=etcd.address={etcd}"))
            .arg(format!(
                "--k8s-kubeconfig-path={}",
                cp.kubeconfig().display()
            ))
            .arg("--enable-gops=false")
            .arg(format!("--health-port={}", free_port()?))
            .arg(format!(
                "--shell-sock-path={}",
                dir.path().join("shell.sock").display()
            ))
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut server = ClusterMeshApiserver {
            child: Some(child),
            cluster: cluster.to_string(),
            etcd,
            log,
            _dir: dir,
        };
        // The sync store writes this key once the initial list of Services
        // is in etcd.
        let synced = format!("cilium/synced/{cluster}/cilium/state/services/v1");
        loop {
            if let Some(status) = server
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                bail!(
                    "clustermesh-apiserver exited with {status}\n{}",
                    server.log_tail()
                );
            }
            if server.etcd_range(&synced).await?.contains_key(&synced) {
                break;
            }
            if started.elapsed() > STARTUP {
                bail!(
                    "clustermesh-apiserver: no {synced} in etcd within {STARTUP:?}; log ({}):\n{}",
                    server.log.display(),
                    server.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        eprintln!(
            "figure: clustermesh-apiserver start to services synced: {} ms",
            started.elapsed().as_millis()
        );
        Ok(server)
    }

    /// Every key under `prefix` in the server's etcd.
    pub async fn etcd_range(&self, prefix: &str) -> Result<BTreeMap<String, String>> {
        etcd_range(&self.etcd, prefix).await
    }

    /// The etcd key of `ns/svc`'s exported record.
    pub fn service_key(&self, ns: &str, svc: &str) -> String {
        format!("cilium/state/services/v1/{}/{ns}/{svc}", self.cluster)
    }

    /// `ns/svc` as this cluster exports it now, if it does.
    pub async fn exported(&self, ns: &str, svc: &str) -> Result<Option<ClusterService>> {
        let key = self.service_key(ns, svc);
        let Some(value) = self.etcd_range(&key).await?.remove(&key) else {
            return Ok(None);
        };
        let cs: ClusterService = serde_json::from_str(&value)
            .with_context(|| format!("{key} is not a ClusterService: {value}"))?;
        ensure!(
            cs.cluster == self.cluster && cs.namespace == ns && cs.name == svc,
            "{key} names {}/{}/{}",
            cs.cluster,
            cs.namespace,
            cs.name
        );
        Ok(Some(cs))
    }

    /// The last lines of the server's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<_> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

/// Checks an exported record against what each pod backs: `want` is (pod
/// name, address, the Service ports it backs). Every address is exported
/// with exactly those ports, and no other address is exported. The error
/// names each pod that is off, with what it was exported with.
pub fn check_backends(cs: &ClusterService, want: &[(&str, String, &[&str])]) -> Result<()> {
    let got = cs.ports_by_backend();
    let mut wrong = Vec::new();
    for (pod, addr, ports) in want {
        let want: BTreeSet<String> = ports.iter().map(|p| p.to_string()).collect();
        match got.get(addr) {
            Some(have) if *have == want => {}
            Some(have) => wrong.push(format!(
                "{pod} ({addr}) backs {want:?} but is exported with {have:?}"
            )),
            None => wrong.push(format!("{pod} ({addr}) backs {want:?} but is not exported")),
        }
    }
    for addr in got.keys() {
        if !want.iter().any(|(_, a, _)| a == addr) {
            wrong.push(format!("{addr} is exported but backs nothing"));
        }
    }
    if wrong.is_empty() {
        return Ok(());
    }
    bail!(
        "ClusterMesh exports {}/{} of cluster {} wrongly:\n  {}\n(backends as exported: {:?})",
        cs.namespace,
        cs.name,
        cs.cluster,
        wrong.join("\n  "),
        cs.backends
    )
}

impl Drop for ClusterMeshApiserver {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            unsafe {
                libc::kill(child.id() as i32, libc::SIGTERM);
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
