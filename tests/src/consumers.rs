//! Real consumers of portwise's slices: kube-proxy and CoreDNS, built from
//! upstream (tests/control-plane, tests/coredns) and run inside the test
//! network namespace, plus pods that answer with their own name so that only
//! the slices can explain who answers.
//!
//! kube-proxy programs the whole namespace's nftables or iptables rules for
//! every Service of the shared control plane, so two of them would fight
//! over the same tables: [`KubeProxy::start`] takes a lock (a file in the
//! namespace's run directory, so it also holds across test binaries) that
//! its value holds until it is dropped, and dropping it kills the process by
//! PID and removes its rules. CoreDNS only reads, so any number may run.

use std::{
    collections::BTreeMap,
    fs::File,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    task::JoinHandle,
};

use crate::{ControlPlane, Metrics, free_port, http_get, wait_for};

/// The Node kube-proxy runs as. Without a Node object kube-proxy waits 30 s
/// before it programs anything.
pub const PROXY_NODE: &str = "portwise-proxy-node";
/// The node's addresses; tests/netns makes them local.
pub const NODE_IP4: Ipv4Addr = Ipv4Addr::new(10, 240, 0, 1);
pub const NODE_IP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x240, 0, 0, 0, 0, 1);
/// The cluster's pod ranges, as kube-proxy's `--cluster-cidr` needs them.
const CLUSTER_CIDRS: &str = "10.244.0.0/16,fd00:10:244::/64";

/// kube-proxy's data-path backends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyMode {
    Nftables,
    Iptables,
}

impl ProxyMode {
    pub fn flag(self) -> &'static str {
        match self {
            ProxyMode::Nftables => "nftables",
            ProxyMode::Iptables => "iptables",
        }
    }
}

/// The upstream control-plane binary (`portwise-cp`), which also holds
/// kube-proxy.
fn cp_binary(cp: &ControlPlane) -> Result<PathBuf> {
    let link = cp.dir().join("bin/kubectl");
    std::fs::canonicalize(&link)
        .with_context(|| format!("resolving {} to the portwise-cp binary", link.display()))
}

/// Where this run keeps cross-process state (the kube-proxy lock).
fn run_dir() -> PathBuf {
    std::env::var_os("PORTWISE_NETNS_RUN")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
}

/// A running kube-proxy; see the module docs.
#[derive(Debug)]
pub struct KubeProxy {
    child: Child,
    mode: ProxyMode,
    bin: PathBuf,
    metrics: SocketAddr,
    log: PathBuf,
    _dir: tempfile::TempDir,
    /// Held for the proxy's lifetime; released last, after the cleanup.
    _lock: File,
}

impl KubeProxy {
    /// Starts kube-proxy in `mode` against `cp`, once the lock is free, and
    /// returns when it has programmed its first full sync.
    pub async fn start(cp: &ControlPlane, mode: ProxyMode) -> Result<Self> {
        let path = run_dir().join("kube-proxy.lock");
        let lock = tokio::task::spawn_blocking(move || -> Result<File> {
            let f = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
            f.lock()
                .with_context(|| format!("locking {}", path.display()))?;
            Ok(f)
        })
        .await??;
        ensure_proxy_node(cp).await?;
        let bin = cp_binary(cp)?;
        // A previous proxy that died without its cleanup must not leave
        // rules of the other mode behind.
        cleanup(&bin);
        let dir = tempfile::Builder::new().prefix("kube-proxy-").tempdir()?;
        let log = dir.path().join("kube-proxy.log");
        let metrics = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()?));
        let healthz = SocketAddr::from((Ipv4Addr::LOCALHOST, free_port()?));
        let child = Command::new(&bin)
            .arg("kube-proxy")
            .arg(format!("--kubeconfig={}", cp.kubeconfig().display()))
            .arg(format!("--proxy-mode={}", mode.flag()))
            .arg(format!("--hostname-override={PROXY_NODE}"))
            .arg(format!("--cluster-cidr={CLUSTER_CIDRS}"))
            // Leave the namespace's conntrack table size alone.
            .arg("--conntrack-max-per-core=0")
            .arg(format!("--metrics-bind-address={metrics}"))
            .arg(format!("--healthz-bind-address={healthz}"))
            .arg("--v=2")
            .stdin(Stdio::null())
            .stdout(File::create(&log)?)
            .stderr(File::create(&log)?)
            .spawn()
            .with_context(|| format!("starting {} kube-proxy", bin.display()))?;
        let mut proxy = KubeProxy {
            child,
            mode,
            bin,
            metrics,
            log,
            _dir: dir,
            _lock: lock,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = proxy.child.try_wait()? {
                bail!("kube-proxy exited with {status}\n{}", proxy.log_tail());
            }
            // One sample per IP family; every family must have synced.
            let synced = match proxy.metrics().await {
                Ok(m) => {
                    let families: Vec<_> = m
                        .select("kubeproxy_sync_proxy_rules_last_timestamp_seconds", &[])
                        .collect();
                    !families.is_empty() && families.iter().all(|s| s.value > 0.0)
                }
                Err(_) => false,
            };
            if synced {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "kube-proxy did not sync within 60 s; log ({}):\n{}",
                    proxy.log.display(),
                    proxy.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(proxy)
    }

    pub fn mode(&self) -> ProxyMode {
        self.mode
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// kube-proxy's own `/metrics`.
    pub async fn metrics(&self) -> Result<Metrics> {
        let (status, body) = http_get(self.metrics, "/metrics").await?;
        if status != 200 {
            bail!("kube-proxy /metrics answered {status}");
        }
        Ok(Metrics::parse(&body))
    }

    /// The last lines of kube-proxy's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<_> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for KubeProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        cleanup(&self.bin);
    }
}

/// `kube-proxy --cleanup`: removes the rules of every mode and exits.
fn cleanup(bin: &Path) {
    let _ = Command::new(bin)
        .args(["kube-proxy", "--cleanup"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// The Node kube-proxy runs as, with its addresses, created once per
/// control plane.
async fn ensure_proxy_node(cp: &ControlPlane) -> Result<()> {
    let nodes: Api<Node> = Api::all(cp.client().await?);
    let status = json!({ "addresses": [
        { "type": "InternalIP", "address": NODE_IP4.to_string() },
        { "type": "InternalIP", "address": NODE_IP6.to_string() },
        { "type": "Hostname", "address": PROXY_NODE },
    ]});
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": { "name": PROXY_NODE, "labels": {
            "kubernetes.io/hostname": PROXY_NODE,
            "topology.kubernetes.io/zone": "proxy-zone",
        }},
        "status": status.clone(),
    }))?;
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e).context("creating kube-proxy's Node"),
    }
    nodes
        .patch_status(
            PROXY_NODE,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
        .context("setting kube-proxy's Node addresses")?;
    Ok(())
}

// ---- CoreDNS (feature `dns`, off for the demo driver) -----------------

#[cfg(feature = "dns")]
#[path = "coredns.rs"]
mod coredns;
#[cfg(feature = "dns")]
pub use coredns::*;

// ---- pods that answer with their name ------------------------------------

/// A TCP server standing in for one pod on one address and port: it writes
/// the pod's name and closes, so a client through a ClusterIP learns which
/// pod kube-proxy picked.
#[derive(Debug)]
pub struct NameServer {
    task: JoinHandle<()>,
}

impl NameServer {
    pub async fn start(name: &str, ip: IpAddr, port: u16) -> Result<Self> {
        let addr = SocketAddr::new(ip, port);
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {addr} for pod {name}"))?;
        let reply = format!("{name}\n").into_bytes();
        let task = tokio::spawn(async move {
            loop {
                if let Ok((mut s, _)) = listener.accept().await {
                    let reply = reply.clone();
                    tokio::spawn(async move {
                        let _ = s.write_all(&reply).await;
                        let _ = s.shutdown().await;
                    });
                }
            }
        });
        Ok(Self { task })
    }
}

impl Drop for NameServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Pods listening on every given port of every given address.
pub async fn name_servers(pods: &[(&str, Vec<IpAddr>)], ports: &[u16]) -> Result<Vec<NameServer>> {
    let mut out = Vec::new();
    for (name, ips) in pods {
        for ip in ips {
            for port in ports {
                out.push(NameServer::start(name, *ip, *port).await?);
            }
        }
    }
    Ok(out)
}

/// What `n` fresh connections to one address met.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Answers {
    /// Answers per pod name.
    pub by_pod: BTreeMap<String, usize>,
    /// Connections refused (kube-proxy rejects a Service port without
    /// endpoints).
    pub refused: usize,
    /// Anything else: timeouts, resets, empty replies.
    pub failed: usize,
}

impl Answers {
    /// The pods that answered, sorted.
    pub fn pods(&self) -> Vec<String> {
        self.by_pod.keys().cloned().collect()
    }
}

/// How many connections a traffic check makes per address. A member that
/// kube-proxy picks with probability 1/4 is missed by all 40 with
/// probability (3/4)^40 < 1e-5.
pub const CONNECTIONS: usize = 40;

/// How a client asks a listener who it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Speak {
    /// Connect and read: the test's name servers answer at once.
    Raw,
    /// `GET /` first: the demo's pods serve HTTP on some ports.
    Http,
}

/// `n` new connections to `addr`, each asked who answered.
pub async fn who_answers(addr: SocketAddr, n: usize) -> Answers {
    who_answers_speaking(addr, n, Speak::Raw).await
}

/// [`who_answers`], asking as `speak` says.
pub async fn who_answers_speaking(addr: SocketAddr, n: usize, speak: Speak) -> Answers {
    let mut out = Answers::default();
    for _ in 0..n {
        match ask_speaking(addr, speak).await {
            Ok(Some(name)) => *out.by_pod.entry(name).or_default() += 1,
            Ok(None) => out.refused += 1,
            Err(_) => out.failed += 1,
        }
    }
    out
}

/// One connection: Some(pod name), None if refused.
pub async fn ask(addr: SocketAddr) -> Result<Option<String>> {
    ask_speaking(addr, Speak::Raw).await
}

/// [`ask`], asking as `speak` says (an HTTP answer's body is the name).
pub async fn ask_speaking(addr: SocketAddr, speak: Speak) -> Result<Option<String>> {
    let connect = tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(addr))
        .await
        .with_context(|| format!("connecting to {addr}: timed out"))?;
    let mut s = match connect {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("connecting to {addr}")),
    };
    if speak == Speak::Http {
        s.write_all(b"GET / HTTP/1.1\r\nHost: portwise\r\nConnection: close\r\n\r\n")
            .await?;
    }
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut buf))
        .await
        .with_context(|| format!("reading from {addr}: timed out"))??;
    let text = String::from_utf8(buf)?;
    let name = match text.split_once("\r\n\r\n") {
        Some((_, body)) if speak == Speak::Http => body,
        _ => text.as_str(),
    }
    .trim();
    if name.is_empty() {
        bail!("{addr} closed without a name");
    }
    Ok(Some(name.to_string()))
}

/// Waits until [`CONNECTIONS`] connections to `addr` are answered by
/// exactly `pods` (none refused, none failed), or, with `pods` empty, all
/// refused.
pub async fn expect_answers(addr: SocketAddr, pods: &[&str], within: Duration) -> Result<Answers> {
    let want: Vec<String> = pods.iter().map(|p| p.to_string()).collect();
    wait_for(within, || async {
        let got = who_answers(addr, CONNECTIONS).await;
        let ok = if want.is_empty() {
            got.refused == CONNECTIONS
        } else {
            got.pods() == want && got.refused == 0 && got.failed == 0
        };
        if ok {
            Ok(got)
        } else {
            bail!("{addr}: wanted {want:?}, got {got:?}")
        }
    })
    .await
}

/// Time from `since` until a single connection to `addr` first meets
/// `reflects` (polling one connection at a time), up to `within`.
pub async fn first_reflecting_answer(
    addr: SocketAddr,
    since: Instant,
    within: Duration,
    reflects: impl Fn(&Option<String>) -> bool,
) -> Result<Duration> {
    loop {
        if let Ok(answer) = ask(addr).await
            && reflects(&answer)
        {
            return Ok(since.elapsed());
        }
        if since.elapsed() > within {
            bail!("{addr}: no answer reflected the change within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A Service's ClusterIP of one family.
pub fn cluster_ip(svc: &k8s_openapi::api::core::v1::Service, v6: bool) -> Result<IpAddr> {
    let spec = svc.spec.as_ref().context("Service without spec")?;
    let ips = spec
        .cluster_ips
        .clone()
        .or_else(|| spec.cluster_ip.clone().map(|ip| vec![ip]))
        .unwrap_or_default();
    ips.iter()
        .filter_map(|ip| ip.parse::<IpAddr>().ok())
        .find(|ip| ip.is_ipv6() == v6)
        .with_context(|| {
            format!(
                "Service has no {} ClusterIP: {ips:?}",
                if v6 { "IPv6" } else { "IPv4" }
            )
        })
}
