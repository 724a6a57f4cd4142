//! A real cilium-agent (tests/cilium/build) as the cluster's data path:
//! kube-proxy replacement with socket load balancing, run against the
//! suite's control plane inside the test network namespace. Socket LB
//! rewrites a `connect()` to a ClusterIP into one to a backend, so a
//! client's answer (pods answer with their own name, [`NameServer`]) shows
//! whom Cilium picked from portwise's slices.
//!
//! How it runs (measured first: /work/shared/notes/cilium.md):
//! - **Its own mount namespace** (`unshare --mount`): a bpffs on
//!   `/sys/fs/bpf`, a tmpfs on `/run/cilium` and the bind-mounted cgroup are
//!   the agent's alone, so every BPF map, program and link it pins goes away
//!   with it, even when the test dies without its cleanup.
//! - **A cgroup2 sub-cgroup** as `--cgroup-root`: socket LB applies only to
//!   processes in it. The test process stays outside; [`CiliumAgent::who_answers`]
//!   runs a small client moved into the cgroup, and [`who_answers_outside`]
//!   the same client left outside (which Cilium does not translate: the
//!   negative control). The cgroup is bind-mounted for the agent: given a
//!   plain directory, Cilium mounts a fresh cgroup2 hierarchy there, which
//!   is the *root* cgroup, and would translate every process on the machine.
//! - **A veth** `pwcil0` (never `eth0`) with the node addresses, as
//!   `--devices`.
//! - **Dual-stack, pod CIDRs 10.245.0.0/24 and fd00:10:245::/112**, outside
//!   the test pods' 10.244/16 and fd00:10:244::/64: Cilium routes its pod
//!   CIDRs via `cilium_host`, which would beat the namespace's local routes
//!   for the test pods' addresses.
//! - **clang-19 and llc-19** (tests/setup) first on its PATH as `clang` and
//!   `llc`: Cilium compiles its data path at start and needs clang >= 18.1;
//!   the system `clang` stays 14 (the C guests).
//!
//! Cilium owns the namespace's data path as kube-proxy does, so
//! [`CiliumAgent::start`] takes kube-proxy's lock (tests/src/consumers.rs):
//! one of them at a time. Dropping it kills the agent and removes what it
//! left in the network namespace: its links (`cilium_host`, `cilium_net`,
//! the veth, and with them their routes and tc programs), its iptables
//! chains and the sysctls it changed; then the cgroup.

use std::{
    fs::File,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::{
    core::v1::{Namespace, Node, Service},
    discovery::v1::EndpointSlice,
};
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;

use crate::{
    ControlPlane, built_tool,
    consumers::{Answers, NameServer, cluster_ip},
    next_ips, wait_for,
};

/// The Node the agent runs as (`K8S_NODE_NAME`).
pub const CILIUM_NODE: &str = "portwise-cilium-node";
/// The node's address (tests/netns puts it on lo; the veth gets it too).
pub const NODE_IP4: Ipv4Addr = Ipv4Addr::new(10, 240, 0, 1);
pub const NODE_IP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x240, 0, 0, 0, 0, 1);
/// The Node's pod CIDR: outside 10.244/16 (see the module docs).
/// The agent runs dual-stack: the IPv6 ones are outside fd00:10:244::/64.
const POD_CIDR: &str = "10.245.0.0/24";
const POD_CIDR6: &str = "fd00:10:245::/112";
const NATIVE_ROUTING_CIDR: &str = "10.245.0.0/16";
const NATIVE_ROUTING_CIDR6: &str = "fd00:10:245::/64";
/// The veth the agent takes as its device, and its peer.
const DEVICE: &str = "pwcil0";
const DEVICE_PEER: &str = "pwcil0p";
/// What the agent creates in the namespace besides the veth.
const AGENT_LINKS: &[&str] = &["cilium_host", "cilium_vxlan", "cilium_geneve"];
/// How many connections a Cilium traffic check makes per address: with at
/// most three members, one is missed by all 30 with probability < 1e-5.
pub const CONNECTIONS: usize = 30;
/// Where the probe Service lives: the readiness check connects through it.
const PROBE_NS: &str = "portwise-cilium";
const PROBE_POD: &str = "cilium-probe";

/// One client connection, as the in-cgroup client reports it: a line per
/// connection, `ok NAME`, `refused` or `failed WHY`.
const CLIENT: &str = r#"
import socket, sys
host, port, n, t = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
fam = socket.AF_INET6 if ":" in host else socket.AF_INET
for _ in range(n):
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(t)
    try:
        s.connect((host, port))
        data = b""
        while True:
            b = s.recv(256)
            if not b:
                break
            data += b
        name = data.decode().strip()
        print("ok " + name if name else "failed empty reply", flush=True)
    except ConnectionRefusedError:
        print("refused", flush=True)
    except Exception as e:
        print("failed " + type(e).__name__, flush=True)
    finally:
        s.close()
"#;

/// Per-connection timeout of the client, connect and read alike.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);

/// A running cilium-agent; see the module docs.
#[derive(Debug)]
pub struct CiliumAgent {
    child: Option<Child>,
    cgroup: PathBuf,
    log: PathBuf,
    sysctls: Vec<(PathBuf, String)>,
    /// When the agent was started, and how long until socket LB answered.
    pub ready_after: Duration,
    _probe: NameServer,
    _dir: tempfile::TempDir,
    /// kube-proxy's lock, held for the agent's lifetime; released last.
    _lock: File,
}

/// Where this run keeps cross-process state: the same directory, and so
/// the same lock file, as `KubeProxy` (tests/src/consumers.rs).
fn run_dir() -> PathBuf {
    std::env::var_os("PORTWISE_NETNS_RUN")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
}

/// The agent's cache directory (cilium-agent, bpf/, crds/), building it if
/// needed (outside ./test; ./test defers a cold build, see
/// tests/src/deferred.rs).
pub fn agent_dir() -> Result<PathBuf> {
    built_tool("tests/cilium/build")
}

/// Runs a command to success.
fn run(cmd: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(cmd)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {cmd}"))?;
    if !out.status.success() {
        bail!(
            "{cmd} {}: {}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs a command, ignoring failure (cleanup of what may not exist).
fn run_quiet(cmd: &str, args: &[&str]) {
    let _ = Command::new(cmd)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Refuses to touch links, routes or iptables anywhere but in a portwise
/// test network namespace (what tests/netns checks before nesting).
fn ensure_test_netns() -> Result<()> {
    ensure!(
        std::env::var("PORTWISE_NETNS").as_deref() == Ok("1"),
        "the Cilium tests run only inside tests/netns"
    );
    let local = run("ip", &["route", "show", "table", "local", "10.244.0.0/16"])?;
    ensure!(
        !local.trim().is_empty(),
        "PORTWISE_NETNS=1 but 10.244.0.0/16 is not local here: not a portwise test namespace"
    );
    Ok(())
}

/// The cgroup2 hierarchy's mount point (`/sys/fs/cgroup/unified` on a
/// hybrid machine, `/sys/fs/cgroup` on a pure v2 one).
fn cgroup2_root() -> Result<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts")?;
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, dir, fstype) = (f.next()?, f.next()?, f.next()?);
            (fstype == "cgroup2").then(|| PathBuf::from(dir))
        })
        .next()
        .context("no cgroup2 hierarchy is mounted: Cilium's socket LB needs one")
}

/// The per-namespace sysctls the agent changes (forwarding, redirects,
/// multipath), to be put back as they were.
fn sysctl_files() -> Vec<PathBuf> {
    let mut out = vec![
        PathBuf::from("/proc/sys/net/ipv4/ip_forward"),
        PathBuf::from("/proc/sys/net/ipv4/fib_multipath_use_neigh"),
    ];
    for fam in ["ipv4", "ipv6"] {
        for dev in ["all", "default", "lo"] {
            let dir = PathBuf::from(format!("/proc/sys/net/{fam}/conf/{dev}"));
            if let Ok(entries) = std::fs::read_dir(&dir) {
                out.extend(entries.flatten().map(|e| e.path()));
            }
        }
    }
    out
}

fn read_sysctls() -> Vec<(PathBuf, String)> {
    sysctl_files()
        .into_iter()
        .filter_map(|p| Some((p.clone(), std::fs::read_to_string(&p).ok()?)))
        .collect()
}

impl CiliumAgent {
    /// Starts cilium-agent against `cp`, once kube-proxy's lock is free,
    /// and returns when a connection from inside the cgroup through a probe
    /// Service's ClusterIP reaches the probe pod: socket LB is attached and
    /// the agent has synced Services and slices.
    pub async fn start(cp: &ControlPlane) -> Result<Self> {
        ensure_test_netns()?;
        for tool in ["/usr/bin/clang-19", "/usr/bin/llc-19"] {
            ensure!(
                Path::new(tool).exists(),
                "{tool} is missing: Cilium needs clang >= 18.1 (run tests/setup)"
            );
        }
        let cache = tokio::task::spawn_blocking(agent_dir).await??;
        let path = run_dir().join("kube-proxy.lock");
        let lock = tokio::task::spawn_blocking(move || -> Result<File> {
            let f = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
            f.lock()
                .with_context(|| format!("locking {}", path.display()))?;
            Ok(f)
        })
        .await??;
        apply_crds(cp, &cache.join("crds")).await?;
        ensure_cilium_node(cp).await?;
        let probe_ip = next_ips().v4;
        let probe = NameServer::start(PROBE_POD, probe_ip.into(), 8080).await?;
        let probe_addr = ensure_probe_service(cp, probe_ip.into()).await?;

        let dir = tempfile::Builder::new().prefix("cilium-").tempdir()?;
        let d = dir.path();
        // clang and llc are the -19 tools, first on the agent's PATH.
        std::fs::create_dir(d.join("bin"))?;
        std::os::unix::fs::symlink("/usr/bin/clang-19", d.join("bin/clang"))?;
        std::os::unix::fs::symlink("/usr/bin/llc-19", d.join("bin/llc"))?;
        // The agent writes beside its BPF sources (features.h, ...).
        std::fs::create_dir(d.join("lib"))?;
        run(
            "cp",
            &[
                "-r",
                &cache.join("bpf").to_string_lossy(),
                &d.join("lib/bpf").to_string_lossy(),
            ],
        )?;
        std::fs::create_dir(d.join("cgroup"))?;
        let cgroup = cgroup2_root()?.join(format!(
            "portwise-cilium-{}-{}",
            std::process::id(),
            fastrand::u32(..)
        ));
        std::fs::create_dir(&cgroup)
            .with_context(|| format!("creating cgroup {}", cgroup.display()))?;

        // Whatever an earlier agent of this run left (one whose test died
        // before its cleanup) goes first.
        cleanup_namespace(&[]);
        let sysctls = read_sysctls();
        let mut agent = CiliumAgent {
            child: None,
            cgroup: cgroup.clone(),
            log: d.join("cilium-agent.log"),
            sysctls,
            ready_after: Duration::ZERO,
            _probe: probe,
            _dir: dir,
            _lock: lock,
        };
        let d = agent._dir.path();
        run(
            "ip",
            &[
                "link",
                "add",
                DEVICE,
                "type",
                "veth",
                "peer",
                "name",
                DEVICE_PEER,
            ],
        )?;
        run("ip", &["link", "set", DEVICE, "up"])?;
        run("ip", &["link", "set", DEVICE_PEER, "up"])?;
        run(
            "ip",
            &["addr", "add", &format!("{NODE_IP4}/24"), "dev", DEVICE],
        )?;
        run(
            "ip",
            &[
                "-6",
                "addr",
                "add",
                &format!("{NODE_IP6}/64"),
                "dev",
                DEVICE,
                "nodad",
            ],
        )?;

        let path = format!(
            "{}:{}",
            d.join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let cgroot = d.join("cgroup");
        // In a mount namespace of its own: bpffs, the state tmpfs and the
        // cgroup bind mount are the agent's, and die with it.
        let setup = r#"set -e
mount -t bpf bpffs /sys/fs/bpf
mkdir -p /run/cilium
mount -t tmpfs tmpfs /run/cilium
mount --bind "$0" "$1"
shift
exec "$@""#;
        let log = File::create(&agent.log)?;
        let started = Instant::now();
        let child = Command::new("unshare")
            .args([
                "--mount",
                "--propagation",
                "private",
                "--",
                "sh",
                "-c",
                setup,
            ])
            .arg(&cgroup)
            .arg(&cgroot)
            .arg(cache.join("cilium-agent"))
            .args([
                "--kube-proxy-replacement=true",
                "--bpf-lb-sock=true",
                "--enable-ipv4=true",
                "--enable-ipv6=true",
                "--routing-mode=native",
                &format!("--ipv4-native-routing-cidr={NATIVE_ROUTING_CIDR}"),
                &format!("--ipv6-native-routing-cidr={NATIVE_ROUTING_CIDR6}"),
                "--enable-ipv4-masquerade=false",
                "--enable-ipv6-masquerade=false",
                "--ipam=kubernetes",
                "--k8s-require-ipv4-pod-cidr=true",
                "--k8s-require-ipv6-pod-cidr=true",
                "--enable-l7-proxy=false",
                "--enable-envoy-config=false",
                "--enable-hubble=false",
                "--enable-health-checking=false",
                "--enable-endpoint-health-checking=false",
                "--enable-policy=never",
                "--identity-allocation-mode=crd",
                // kube-proxy replacement refuses `false`.
                "--install-iptables-rules=true",
                &format!("--devices={DEVICE}"),
                &format!("--lib-dir={}", d.join("lib").display()),
                "--state-dir=/run/cilium",
                "--socket-path=/run/cilium/cilium.sock",
                "--bpf-root=/sys/fs/bpf",
                &format!("--cgroup-root={}", cgroot.display()),
                &format!("--k8s-kubeconfig-path={}", cp.kubeconfig().display()),
            ])
            .env("PATH", path)
            .env("K8S_NODE_NAME", CILIUM_NODE)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting cilium-agent")?;
        agent.child = Some(child);

        let deadline = started + Duration::from_secs(180);
        loop {
            if let Some(status) = agent
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                bail!("cilium-agent exited with {status}\n{}", agent.log_tail());
            }
            let got = agent.who_answers(probe_addr, 1).await?;
            if got.by_pod.contains_key(PROBE_POD) {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "cilium-agent: no answer through the probe ClusterIP {probe_addr} from inside \
                     the cgroup within 180 s (last: {got:?}); log ({}):\n{}",
                    agent.log.display(),
                    agent.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        agent.ready_after = started.elapsed();
        eprintln!(
            "figure: cilium-agent start to socket LB routing: {} ms",
            agent.ready_after.as_millis()
        );
        Ok(agent)
    }

    /// The cgroup whose processes Cilium's socket LB translates.
    pub fn cgroup(&self) -> &Path {
        &self.cgroup
    }

    /// `n` new connections to `addr` from a client inside the cgroup, each
    /// asked who answered.
    pub async fn who_answers(&self, addr: SocketAddr, n: usize) -> Result<Answers> {
        client(Some(&self.cgroup), addr, n).await
    }

    /// One connection from inside the cgroup: Some(pod name), None if
    /// refused.
    pub async fn ask(&self, addr: SocketAddr) -> Result<Option<String>> {
        let got = self.who_answers(addr, 1).await?;
        if let Some(name) = got.by_pod.keys().next() {
            return Ok(Some(name.clone()));
        }
        if got.refused == 1 {
            return Ok(None);
        }
        bail!("{addr}: the connection failed")
    }

    /// Waits until [`CONNECTIONS`] connections from inside the cgroup to
    /// `addr` are answered by exactly `pods` (none refused, none failed),
    /// or, with `pods` empty, by no pod at all.
    pub async fn expect_answers(
        &self,
        addr: SocketAddr,
        pods: &[&str],
        within: Duration,
    ) -> Result<Answers> {
        let want: Vec<String> = pods.iter().map(|p| p.to_string()).collect();
        let checked = wait_for(within, || async {
            let got = self.who_answers(addr, CONNECTIONS).await?;
            let ok = if want.is_empty() {
                got.by_pod.is_empty()
            } else {
                got.pods() == want && got.refused == 0 && got.failed == 0
            };
            if ok {
                Ok(got)
            } else {
                bail!("Cilium socket LB, {addr}: wanted {want:?}, got {got:?}")
            }
        })
        .await;
        checked.map_err(|e| {
            anyhow::anyhow!(
                "{e:#}\n(cilium-agent log, last lines:\n{})",
                self.log_tail()
            )
        })
    }

    /// The last lines of the agent's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<_> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

/// `n` new connections to `addr` from the same client as
/// [`CiliumAgent::who_answers`], left outside the cgroup: Cilium does not
/// translate them.
pub async fn who_answers_outside(addr: SocketAddr, n: usize) -> Result<Answers> {
    client(None, addr, n).await
}

/// Runs the client (python3, from tests/setup's python3-venv), first moved
/// into `cgroup` when given: `sh` writes its own PID into `cgroup.procs`
/// and only then execs the client, which inherits the cgroup.
async fn client(cgroup: Option<&Path>, addr: SocketAddr, n: usize) -> Result<Answers> {
    let procs = cgroup.map(|c| c.join("cgroup.procs"));
    let mut cmd = tokio::process::Command::new("sh");
    cmd.arg("-c")
        .arg(r#"if [ -n "$0" ]; then echo $$ >"$0" || exit 97; fi; exec "$@""#)
        .arg(procs.as_deref().unwrap_or(Path::new("")))
        .args(["python3", "-c", CLIENT])
        .arg(addr.ip().to_string())
        .arg(addr.port().to_string())
        .arg(n.to_string())
        .arg(CLIENT_TIMEOUT.as_secs_f64().to_string())
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let within = CLIENT_TIMEOUT * 2 * n as u32 + Duration::from_secs(10);
    let out = tokio::time::timeout(within, cmd.output())
        .await
        .with_context(|| format!("the client to {addr} ran over {within:?}"))?
        .context("running the client")?;
    if !out.status.success() {
        bail!(
            "the client to {addr} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut answers = Answers::default();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        match line.split_once(' ') {
            Some(("ok", name)) => *answers.by_pod.entry(name.to_string()).or_default() += 1,
            _ if line == "refused" => answers.refused += 1,
            _ => answers.failed += 1,
        }
    }
    ensure!(
        answers.by_pod.values().sum::<usize>() + answers.refused + answers.failed == n,
        "the client to {addr} reported {answers:?} for {n} connections"
    );
    Ok(answers)
}

impl Drop for CiliumAgent {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGTERM first (the agent stops its jobs), then SIGKILL.
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
        cleanup_namespace(&self.sysctls);
        // Empty now (clients exit); removing it detaches any program still
        // attached to it. A clang the agent started may take a moment to
        // leave it.
        for _ in 0..50 {
            match std::fs::remove_dir(&self.cgroup) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
                Ok(()) => break,
            }
        }
    }
}

/// What of an agent is left in the network namespace: its links and the
/// veth, its iptables chains. Empty once every [`CiliumAgent`] is dropped.
pub fn leftovers() -> Result<Vec<String>> {
    ensure_test_netns()?;
    let mut out = Vec::new();
    for link in AGENT_LINKS.iter().chain([&DEVICE, &"cilium_net"]) {
        if run("ip", &["link", "show", link]).is_ok() {
            out.push(format!("link {link}"));
        }
    }
    for tool in ["iptables", "ip6tables"] {
        for table in ["filter", "nat", "mangle", "raw"] {
            let rules = run(tool, &["-w", "-t", table, "-S"])?;
            out.extend(
                rules
                    .lines()
                    .filter(|r| r.contains("CILIUM_"))
                    .map(|r| format!("{tool} -t {table}: {r}")),
            );
        }
    }
    Ok(out)
}

/// Removes what an agent leaves in the network namespace: its links and
/// the veth (their addresses, routes and tc programs go with them), its
/// iptables chains and the feeder rules jumping to them, and puts back
/// `sysctls` (read before it started).
fn cleanup_namespace(sysctls: &[(PathBuf, String)]) {
    if ensure_test_netns().is_err() {
        return;
    }
    for link in AGENT_LINKS.iter().chain([&DEVICE]) {
        run_quiet("ip", &["link", "del", link]);
    }
    for tool in ["iptables", "ip6tables"] {
        for table in ["filter", "nat", "mangle", "raw"] {
            let Ok(rules) = run(tool, &["-w", "-t", table, "-S"]) else {
                continue;
            };
            // Feeder rules in the built-in chains first, then Cilium's
            // chains, flushed and deleted. -S quotes as a shell would.
            for rule in rules.lines() {
                if rule.starts_with("-A ") && rule.contains("-j CILIUM_") {
                    let delete = format!("{tool} -w -t {table} -D {}", &rule[3..]);
                    run_quiet("sh", &["-c", &delete]);
                }
            }
            let chains: Vec<&str> = rules
                .lines()
                .filter_map(|r| r.strip_prefix("-N "))
                .filter(|c| c.starts_with("CILIUM_"))
                .collect();
            for c in &chains {
                run_quiet(tool, &["-w", "-t", table, "-F", c]);
            }
            for c in &chains {
                run_quiet(tool, &["-w", "-t", table, "-X", c]);
            }
        }
    }
    // Forwarding first: writing `all` resets the devices' values, which
    // the loop then puts back one by one.
    let mut sysctls = sysctls.to_vec();
    sysctls.sort_by_key(|(p, _)| !p.ends_with("ip_forward") && !p.ends_with("all/forwarding"));
    for (path, value) in &sysctls {
        if std::fs::read_to_string(path).ok().as_deref() != Some(value.as_str()) {
            let _ = std::fs::write(path, value);
        }
    }
}

/// Cilium's CRDs (the agent waits for them), server-side: some are too big
/// for client-side apply's annotation.
pub(crate) async fn apply_crds(cp: &ControlPlane, dir: &Path) -> Result<()> {
    let kubectl = cp.dir().join("bin/kubectl");
    let kubeconfig = cp.kubeconfig().to_path_buf();
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || {
        run(
            &kubectl.to_string_lossy(),
            &[
                "--kubeconfig",
                &kubeconfig.to_string_lossy(),
                "apply",
                "--server-side",
                "--force-conflicts",
                "-f",
                &dir.to_string_lossy(),
            ],
        )
        .context("applying Cilium's CRDs")
    })
    .await??;
    Ok(())
}

/// The Node the agent runs as: its pod CIDRs are where Cilium's IPAM takes
/// its router addresses from. They are immutable: a Node with others (a
/// control plane kept from an older version of this file) is replaced.
async fn ensure_cilium_node(cp: &ControlPlane) -> Result<()> {
    let nodes: Api<Node> = Api::all(cp.client().await?);
    let want = vec![POD_CIDR.to_string(), POD_CIDR6.to_string()];
    if let Some(old) = nodes.get_opt(CILIUM_NODE).await?
        && old.spec.and_then(|s| s.pod_cidrs) != Some(want.clone())
    {
        nodes
            .delete(CILIUM_NODE, &Default::default())
            .await
            .context("replacing Cilium's Node")?;
    }
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": { "name": CILIUM_NODE, "labels": {
            "kubernetes.io/hostname": CILIUM_NODE,
        }},
        "spec": { "podCIDR": POD_CIDR, "podCIDRs": want },
    }))?;
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e).context("creating Cilium's Node"),
    }
    nodes
        .patch_status(
            CILIUM_NODE,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "addresses": [
                { "type": "InternalIP", "address": NODE_IP4.to_string() },
                { "type": "InternalIP", "address": NODE_IP6.to_string() },
                { "type": "Hostname", "address": CILIUM_NODE },
            ]}})),
        )
        .await
        .context("setting Cilium's Node addresses")?;
    Ok(())
}

/// A selector-less Service `probe` (port 80) in [`PROBE_NS`] whose one
/// slice, written here, points at `ip`:8080: the readiness check's target.
async fn ensure_probe_service(cp: &ControlPlane, ip: IpAddr) -> Result<SocketAddr> {
    let client = cp.client().await?;
    let ns: Namespace = serde_json::from_value(json!({ "metadata": { "name": PROBE_NS } }))?;
    match Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e).context("creating the probe namespace"),
    }
    let services: Api<Service> = Api::namespaced(client.clone(), PROBE_NS);
    let svc: Service = serde_json::from_value(json!({
        "metadata": { "name": "probe" },
        "spec": { "ports": [{ "name": "p", "port": 80, "targetPort": 8080, "protocol": "TCP" }] },
    }))?;
    match services.create(&PostParams::default(), &svc).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e).context("creating the probe Service"),
    }
    let slice: EndpointSlice = serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": { "name": "probe-1", "labels": {
            "kubernetes.io/service-name": "probe",
            "endpointslice.kubernetes.io/managed-by": "portwise-tests",
        }},
        "addressType": "IPv4",
        "ports": [{ "name": "p", "port": 8080, "protocol": "TCP" }],
        "endpoints": [{ "addresses": [ip.to_string()], "conditions": { "ready": true } }],
    }))?;
    Api::<EndpointSlice>::namespaced(client, PROBE_NS)
        .patch(
            "probe-1",
            &PatchParams::apply("portwise-tests").force(),
            &Patch::Apply(&slice),
        )
        .await
        .context("writing the probe slice")?;
    let svc = services.get("probe").await?;
    Ok(SocketAddr::new(cluster_ip(&svc, false)?, 80))
}
