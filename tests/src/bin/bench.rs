//! `./bench`: portwise side by side with kube-controller-manager's native
//! EndpointSlice controller, on one local control plane, in one run.
//!
//! These machines are shared and noisy, so absolute figures mean little;
//! every comparison is a ratio of two figures measured in the same run on
//! the same apiserver. The table is printed and written to
//! `docs/benchmarks.md` with the machine it ran on. Anything below a line
//! `<!-- analysis -->` in that file is kept across runs (hand-written
//! findings).
//!
//! Protocol (the fairness rules are spelled out in the results file):
//! 1. start a control plane with `--controllers endpointslice`, then stop
//!    the controller-manager at once, keeping its exact command line;
//! 2. create Nodes, and in two namespaces the same 1000 Services × 10 Ready
//!    pods: selector Services in `native`, selector-less grouped Services in
//!    `portwise` (setup, timed but not counted);
//! 3. start the controller-manager again (same argv) and measure until every
//!    native slice is right; then start the release `portwise` binary and do
//!    the same. Both thus make a cold sync of an identical, settled state;
//! 4. steady state, churn, probes, WebAssembly, as the rows say;
//! 5. row 8 (late, so that its kube-proxy Node and objects touch no other
//!    row): one upstream kube-proxy routes a native and a portwise Service,
//!    and readiness flips are timed until the traffic shows them; row 10
//!    does the same with Cilium's agent as the data path.
//!
//! Requests per client come from the apiserver's audit log (a policy that
//! records every request at Metadata level), split by User-Agent.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    fmt::Write as _,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    process::{ExitCode, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use kube::{
    Api, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use portwise_tests::{
    ControlPlane, GROUP_KEY, HttpListener, MANAGED_BY_LABEL, Metrics, NATIVE_MANAGER, Portwise,
    SERVICE_NAME_LABEL, TcpListener, TestNs,
    cilium::{CILIUM_NODE, CiliumAgent},
    consumers::{KubeProxy, NameServer, PROXY_NODE, ProxyMode, cluster_ip, expect_answers},
    faults::{proc_cpu_time, proc_memory_kib},
    pod, service,
};
use serde_json::{Value, json};
use tokio::{io::AsyncReadExt, net::TcpStream, process::Child, sync::watch};

/// Row 3's two-port Service: a policy (picked by its annotation) that
/// includes a ready pod on the ports its [`PORTS_KEY`] annotation lists, so
/// a pod's set of ports can change without touching its readiness.
const PORT_SETS_POLICY: &str = "policies:\n  port-sets: {all: [podReady, {portNames: {annotation: bench.portwise.io/ports}}]}\n";
const PORTS_KEY: &str = "bench.portwise.io/ports";

/// Label the native Services select their pods by.
const APP_LABEL: &str = "bench.portwise.io/svc";
const TARGET_PORT: i32 = 8080;
const TCP_PORT: i32 = 8443;
const NODES: usize = 10;
const ZONES: [&str; 3] = ["zone-a", "zone-b", "zone-c"];
const PORTWISE_MANAGER: &str = "portwise";
const ANALYSIS_MARK: &str = "<!-- analysis -->";

// ---- knobs ----------------------------------------------------------------

struct Knobs {
    services: usize,
    pods_per_service: usize,
    big_pods: usize,
    steady: Duration,
    probe_pods: usize,
    probe_window: Duration,
    setup_concurrency: usize,
    /// Row 8: readiness flips per controller.
    datapath_flips: usize,
    /// Row 9: unmanaged pods created in other namespaces.
    unmanaged_pods: usize,
    /// Row 1b: cold starts of each controller.
    fair_runs: usize,
    rows: BTreeSet<u32>,
    out: Option<PathBuf>,
    native_fast: bool,
    /// Extra top-level config lines for row 1's portwise (experiments,
    /// e.g. `nativeCleanup: false`); empty for the published run.
    portwise_extra: String,
    /// Row 8's runs (each `datapath_flips` flips per controller).
    datapath_runs: usize,
    /// Row 3's readiness flips per Service size for reconcile times.
    reconcile_flips: usize,
    /// Row 3's slice writes per verb and size.
    verb_writes: usize,
    /// Extra flags for row 1b's portwise (e.g. `--reconcile-concurrency=16`).
    row1b_args: String,
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

impl Knobs {
    fn from_env() -> Self {
        let rows = std::env::var("BENCH_ROWS")
            .ok()
            .map(|s| s.split(',').filter_map(|r| r.trim().parse().ok()).collect())
            .unwrap_or_else(|| (1..=11).collect());
        let out = match std::env::var("BENCH_OUT") {
            Ok(s) if s.is_empty() || s == "-" => None,
            Ok(s) => Some(PathBuf::from(s)),
            Err(_) => Some(repo_root().join("docs/benchmarks.md")),
        };
        Self {
            services: env_usize("BENCH_SERVICES", 1000),
            pods_per_service: env_usize("BENCH_PODS", 10),
            big_pods: env_usize("BENCH_BIG_PODS", 1000),
            steady: Duration::from_secs(env_usize("BENCH_STEADY_SECS", 60) as u64),
            probe_pods: env_usize("BENCH_PROBE_PODS", 3000),
            probe_window: Duration::from_secs(env_usize("BENCH_PROBE_SECS", 20) as u64),
            setup_concurrency: env_usize("BENCH_SETUP_CONCURRENCY", 48),
            datapath_flips: env_usize("BENCH_DATAPATH_FLIPS", 100),
            datapath_runs: env_usize("BENCH_DATAPATH_RUNS", 3).max(1),
            unmanaged_pods: env_usize("BENCH_UNMANAGED_PODS", 100_000),
            fair_runs: env_usize("BENCH_FAIR_RUNS", 3).max(1),
            reconcile_flips: env_usize("BENCH_RECONCILE_FLIPS", 50),
            verb_writes: env_usize("BENCH_VERB_WRITES", 200),
            row1b_args: std::env::var("BENCH_ROW1B_ARGS").unwrap_or_default(),
            rows,
            out,
            native_fast: std::env::var("BENCH_NATIVE_FAST").as_deref() != Ok("0"),
            portwise_extra: std::env::var("BENCH_PORTWISE_EXTRA")
                .map(|s| {
                    let s = s.replace("\\n", "\n");
                    if s.is_empty() || s.ends_with('\n') {
                        s
                    } else {
                        s + "\n"
                    }
                })
                .unwrap_or_default(),
        }
    }
    fn row(&self, n: u32) -> bool {
        self.rows.contains(&n)
    }
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

// ---- the report -------------------------------------------------------------

/// What a row must reach to be "met".
enum Goal {
    /// A figure without a goal.
    None,
    /// portwise ÷ native at most this.
    RatioAtMost(f64),
    /// A goal of its own, as the row states it, and whether it was met.
    Stated(&'static str, bool),
}

#[derive(Default)]
struct Report {
    /// (row, what, portwise, native, ratio, goal, verdict)
    rows: Vec<[String; 7]>,
    sections: Vec<(String, String)>,
    behind: Vec<String>,
}

impl Report {
    fn row(
        &mut self,
        row: &str,
        what: &str,
        portwise: String,
        native: String,
        ratio: Option<f64>,
        goal: Goal,
    ) {
        self.row_within(row, what, portwise, native, ratio, None, goal);
    }

    /// [`Report::row`] with the ratio's 95 % interval, where the row has
    /// one ([`ratio_interval`]): a ratio past its goal whose interval
    /// reaches the goal is still "behind", and says it is within noise.
    #[allow(clippy::too_many_arguments)]
    fn row_within(
        &mut self,
        row: &str,
        what: &str,
        portwise: String,
        native: String,
        ratio: Option<f64>,
        interval: Option<(f64, f64)>,
        goal: Goal,
    ) {
        let most = match goal {
            Goal::RatioAtMost(most) => Some(most),
            _ => None,
        };
        let (goal, met) = match goal {
            Goal::None => (String::new(), None),
            Goal::RatioAtMost(most) => (format!("≤ {most:.1}×"), ratio.map(|x| x <= most)),
            Goal::Stated(text, met) => (text.to_string(), Some(met)),
        };
        let verdict = match met {
            Some(true) => "met".to_string(),
            Some(false) => {
                self.behind.push(format!("{row} {what}"));
                match (interval, most) {
                    (Some((lo, _)), Some(most)) if lo <= most => {
                        format!("**behind**, within noise (its 95 % interval reaches {most:.1}×)")
                    }
                    _ => "**behind**".to_string(),
                }
            }
            None => String::new(),
        };
        let ratio = match (ratio, interval) {
            (Some(r), Some((lo, hi))) => format!("{r:.2}× (95 %: {lo:.2}–{hi:.2}×)"),
            (Some(r), None) => format!("{r:.2}×"),
            (None, _) => String::new(),
        };
        let r = [
            row.into(),
            what.into(),
            portwise,
            native,
            ratio,
            goal,
            verdict,
        ];
        println!("| {} |", r.join(" | "));
        self.rows.push(r);
    }
    fn not_measured(&mut self, row: &str, what: &str, why: &str) {
        self.row(
            row,
            what,
            format!("not measured: {why}"),
            String::new(),
            None,
            Goal::None,
        );
    }
    fn section(&mut self, title: &str, body: String) {
        println!("\n### {title}\n\n{body}");
        self.sections.push((title.to_string(), body));
    }

    fn markdown(&self, machine: &str, protocol: &str) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "# Benchmarks\n\nWritten by `./bench` (tests/src/bin/bench.rs); do not edit above the \
             analysis mark, the next run rewrites it.\n"
        );
        let _ = writeln!(s, "## Machine\n\n{machine}\n");
        let _ = writeln!(s, "## Protocol\n\n{protocol}\n");
        let _ = writeln!(
            s,
            "## Results\n\nRatios are portwise ÷ native, both measured in this run \
             (lower is better for time, requests, CPU and memory).\n"
        );
        let _ = writeln!(
            s,
            "| row | measure | portwise | native | ratio | goal | |\n|---|---|---|---|---|---|---|"
        );
        // Rows in row order (1b, measured last, belongs after 1).
        let mut rows: Vec<&[String; 7]> = self.rows.iter().collect();
        rows.sort_by_key(|r| r[0].split(' ').next().unwrap_or("").to_string());
        for r in rows {
            let _ = writeln!(s, "| {} |", r.join(" | "));
        }
        if self.behind.is_empty() {
            let _ = writeln!(s, "\nEvery measured row meets its goal.");
        } else {
            let _ = writeln!(s, "\nBehind goal in this run: {}.", self.behind.join("; "));
        }
        for (title, body) in &self.sections {
            let _ = writeln!(s, "\n### {title}\n\n{body}");
        }
        s
    }
}

// ---- machine ----------------------------------------------------------------

fn sh(cmd: &str, args: &[&str]) -> String {
    std::process::Command::new(cmd)
        .args(args)
        .current_dir(repo_root())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "?".into())
}

fn machine() -> String {
    let mem = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map(|kib| format!("{:.1} GiB", kib as f64 / 1024.0 / 1024.0))
        .unwrap_or_else(|| "?".into());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "?".into());
    let load = std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ");
    let commit = sh("git", &["rev-parse", "--short=12", "HEAD"]);
    let dirty = sh("git", &["status", "--porcelain", "--untracked-files=no"]);
    let dirty = if dirty.is_empty() || dirty == "?" {
        ""
    } else {
        " (with uncommitted changes in the work tree)"
    };
    format!(
        "| | |\n|---|---|\n\
         | date | {} |\n\
         | git commit | {commit}{dirty} |\n\
         | nproc | {} |\n\
         | CPU | {cpu} |\n\
         | memory | {mem} |\n\
         | kernel | {} |\n\
         | load average at start | {load} |\n\
         | control plane | kube-apiserver + kube-controller-manager v1.37.2 (tests/control-plane), embedded etcd |",
        sh("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        sh("nproc", &[]),
        sh("uname", &["-srm"]),
    )
}

// ---- the control plane --------------------------------------------------------

/// The bench's own control plane: a fresh directory, a full audit policy,
/// and the controller-manager's command line kept for a later cold start.
struct BenchCp {
    dir: PathBuf,
    cm_argv: Vec<String>,
}

const AUDIT_POLICY: &str = "\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [\"RequestReceived\"]
rules:
- level: None
  users: [\"system:apiserver\"]
- level: Metadata
";

impl BenchCp {
    /// Runs before any thread exists (the support crate reads the
    /// environment, and setting it is only sound then).
    fn start(work: &Path) -> Result<Self> {
        let dir = work.join("cp");
        let policy = work.join("audit-policy-all.yaml");
        std::fs::write(&policy, AUDIT_POLICY)?;
        let start = repo_root().join("tests/control-plane/start");
        let mut extra = std::env::var("PORTWISE_APISERVER_ARGS").unwrap_or_default();
        // The last --audit-policy-file wins: every request, not only writes,
        // so reads per client are counted too.
        extra.push_str(&format!(" --audit-policy-file={}", policy.display()));
        let status = std::process::Command::new(&start)
            .arg(&dir)
            .args(["--controllers", "endpointslice"])
            .env("PORTWISE_APISERVER_ARGS", extra.trim())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            .status()
            .context("running tests/control-plane/start")?;
        if !status.success() {
            bail!("tests/control-plane/start failed: {status}");
        }
        let pid: i32 = std::fs::read_to_string(dir.join("controller-manager.pid"))?
            .trim()
            .parse()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))?;
        let cm_argv: Vec<String> = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).to_string())
            .collect();
        if cm_argv.len() < 2 {
            bail!("could not read the controller-manager's command line");
        }
        // Stop it before any object exists: the native controller must
        // start cold on the full state, as portwise will.
        stop_pid(pid, Duration::from_secs(30))?;
        // SAFETY: no other thread exists yet.
        unsafe {
            std::env::set_var("PORTWISE_TEST_KUBECONFIG", dir.join("kubeconfig"));
            std::env::set_var("PORTWISE_TEST_CP_DIR", &dir);
            // Namespaces go with the whole control plane at the end.
            std::env::set_var("PORTWISE_TEST_KEEP", "1");
        }
        Ok(Self { dir, cm_argv })
    }

    fn audit(&self) -> Audit {
        Audit {
            path: self.dir.join("audit.log"),
        }
    }

    /// Starts kube-controller-manager with the recorded argv plus `extra`.
    fn spawn_cm(&self, extra: &[&str]) -> Result<Proc> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("controller-manager.log"))?;
        let mut cmd = tokio::process::Command::new(&self.cm_argv[0]);
        cmd.args(&self.cm_argv[1..])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true);
        let child = cmd.spawn().context("starting kube-controller-manager")?;
        let pid = child.id().context("no pid")?;
        // So that tests/control-plane/stop (and the netns wrapper) end it.
        std::fs::write(self.dir.join("controller-manager.pid"), format!("{pid}\n"))?;
        Ok(Proc {
            child,
            pid,
            started: Instant::now(),
            log: self.dir.join("controller-manager.log"),
        })
    }
}

/// When kube-controller-manager's informers had all synced, after
/// `spawned_at`: the last klog `"Caches are synced"` line it wrote to `log`
/// past byte `from` within its first minute (klog stamps time of day, UTC
/// here, without a year).
fn caches_synced_in_klog(
    log: &Path,
    from: u64,
    spawned_at: std::time::SystemTime,
) -> Option<Duration> {
    let text = std::fs::read(log).ok()?;
    let text = String::from_utf8_lossy(text.get(from as usize..)?);
    let day = 86_400.0;
    let spawned = spawned_at
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_secs_f64()
        % day;
    text.lines()
        .filter(|l| l.contains("\"Caches are synced\""))
        .filter_map(|l| {
            // "I1204 10:20:54.210502   155 shared_informer.go:531] ..."
            let clock = l.split_whitespace().nth(1)?;
            let mut hms = clock.split(':');
            let h: f64 = hms.next()?.parse().ok()?;
            let m: f64 = hms.next()?.parse().ok()?;
            let s: f64 = hms.next()?.parse().ok()?;
            let after = (h * 3600.0 + m * 60.0 + s - spawned).rem_euclid(day);
            (after < 60.0).then_some(after)
        })
        .max_by(f64::total_cmp)
        .map(Duration::from_secs_f64)
}

fn stop_pid(pid: i32, wait: Duration) -> Result<()> {
    // SAFETY: signalling a process we started (or that `start` started for us).
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + wait;
    while Path::new(&format!("/proc/{pid}")).exists() {
        // A zombie child of `start` is reaped by the netns init; count it gone.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if stat
            .rsplit(')')
            .next()
            .is_some_and(|s| s.trim_start().starts_with('Z'))
        {
            break;
        }
        if Instant::now() > deadline {
            unsafe { libc::kill(pid, libc::SIGKILL) };
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

// ---- processes -----------------------------------------------------------------

/// kube-controller-manager, started by the bench (portwise runs through the
/// support library's [`Portwise`]).
struct Proc {
    child: Child,
    pid: u32,
    started: Instant,
    log: PathBuf,
}

/// What the bench needs of a running controller, native or portwise.
trait Controller {
    fn pid(&self) -> Option<u32>;
    /// Fails if it exited on its own.
    fn check_alive(&mut self) -> Result<()>;
    fn usage(&self) -> Usage {
        self.pid()
            .and_then(|pid| usage(pid).ok())
            .unwrap_or_default()
    }
}

impl Controller for Portwise {
    fn pid(&self) -> Option<u32> {
        Portwise::pid(self)
    }
    fn check_alive(&mut self) -> Result<()> {
        self.check_running()
    }
}

/// A report row of one [`Usage`] figure: (measure, figure, decimals, unit).
type UsageRow = (&'static str, fn(&Usage) -> f64, usize, &'static str);

#[derive(Clone, Copy, Debug, Default)]
struct Usage {
    cpu: f64,
    hwm_mib: f64,
    rss_mib: f64,
    /// The apiserver's CPU seconds over the same span (where measured): the
    /// cost of the controller's requests and watches to the control plane.
    api_cpu: f64,
}

/// CPU seconds the apiserver (with its embedded etcd) has used so far.
fn apiserver_cpu(cp: &ControlPlane) -> f64 {
    std::fs::read_to_string(cp.dir().join("apiserver.pid"))
        .ok()
        .and_then(|p| p.trim().parse::<u32>().ok())
        .and_then(|pid| proc_cpu_time(pid).ok())
        .map_or(f64::NAN, |d| d.as_secs_f64())
}

impl Proc {
    /// SIGTERM, then SIGKILL after 30 s.
    async fn stop(&mut self) {
        // SAFETY: signalling our own child by pid; not reaped yet.
        unsafe { libc::kill(self.pid as i32, libc::SIGTERM) };
        if tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

impl Controller for Proc {
    fn pid(&self) -> Option<u32> {
        Some(self.pid)
    }
    fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            bail!(
                "process {} exited with {status}; last log lines:\n{}",
                self.pid,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        Ok(())
    }
}

/// CPU seconds and memory of `pid`, from the support library's /proc readers.
fn usage(pid: u32) -> Result<Usage> {
    let cpu = proc_cpu_time(pid)?;
    let (rss, hwm) = proc_memory_kib(pid)?;
    Ok(Usage {
        cpu: cpu.as_secs_f64(),
        hwm_mib: hwm as f64 / 1024.0,
        rss_mib: rss as f64 / 1024.0,
        api_cpu: f64::NAN,
    })
}

/// The release binary: `$PORTWISE_BIN`, which `./bench` sets.
fn release_bin() -> Result<PathBuf> {
    std::env::var_os("PORTWISE_BIN")
        .map(PathBuf::from)
        .filter(|p| p.is_file())
        .ok_or_else(|| {
            anyhow!("PORTWISE_BIN must name the release portwise binary (./bench sets it)")
        })
}

/// Starts the release `portwise` binary on `config`, watching `namespaces`,
/// its config and log kept in the work directory as `portwise-TAG.*`.
async fn spawn_portwise(
    cp: &'static ControlPlane,
    work: &Path,
    tag: &str,
    config: &str,
    namespaces: &[&str],
    extra: &[&str],
) -> Result<Portwise> {
    // The release default, whatever the bench's own environment says.
    spawn_portwise_with_log(cp, work, tag, config, namespaces, extra, "info").await
}

/// The log filter of rows that report reconcile times: the release
/// default plus one `reconcile profile` line per reconcile ([`Reconciled`]).
const PROFILE_LOG: &str = "info,portwise::profile=debug";

/// [`spawn_portwise`] with the log filter `filter`.
async fn spawn_portwise_with_log(
    cp: &'static ControlPlane,
    work: &Path,
    tag: &str,
    config: &str,
    namespaces: &[&str],
    extra: &[&str],
    filter: &str,
) -> Result<Portwise> {
    Portwise::builder(cp)
        .name(&format!("portwise-{tag}"))
        .dir(work)
        .bin(&release_bin()?)
        .namespaces(namespaces)
        .config(config)
        .args(extra)
        .log_filter(filter)
        .quiet()
        .start()
        .await
}

/// One reconcile as portwise's `portwise::profile` debug line tells it
/// (host/controller/src/reconcile.rs `Profile`), times in ms.
#[derive(Debug, Clone, Default)]
struct Reconciled {
    namespace: String,
    service: String,
    /// NaN when no pod change asked for the reconcile.
    trigger: f64,
    queue: f64,
    judge: f64,
    plan: f64,
    write: f64,
    finish: f64,
    total: f64,
}

/// Every `reconcile profile` line of `log`, in order.
fn reconciles_in(log: &str) -> Vec<Reconciled> {
    fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
        let at = line.find(&format!(" {key}="))? + key.len() + 2;
        let v = line[at..].split(' ').next()?;
        Some(v.trim_matches('"'))
    }
    let num = |line: &str, key: &str| -> f64 {
        field(line, key)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    log.lines()
        .filter(|l| l.contains("reconcile profile"))
        .map(|l| Reconciled {
            namespace: field(l, "namespace").unwrap_or_default().to_string(),
            service: field(l, "service").unwrap_or_default().to_string(),
            trigger: num(l, "trigger_us") / 1000.0,
            queue: num(l, "queue_us") / 1000.0,
            judge: num(l, "judge_us") / 1000.0,
            plan: num(l, "plan_us") / 1000.0,
            write: num(l, "write_us") / 1000.0,
            finish: num(l, "finish_us") / 1000.0,
            total: num(l, "total_us") / 1000.0,
        })
        .collect()
}

/// The slice writes row 3 compares: how portwise writes and how the native
/// controller does, for a known slice and for a new name.
#[derive(Clone, Copy)]
enum Verb {
    Apply,
    Put,
    ApplyNew,
    Post,
}

impl Verb {
    const ALL: [Verb; 4] = [Verb::Apply, Verb::Put, Verb::ApplyNew, Verb::Post];

    fn label(self) -> &'static str {
        match self {
            Verb::Apply => "server-side apply",
            Verb::Put => "update (PUT)",
            Verb::ApplyNew => "server-side apply of a new name (create)",
            Verb::Post => "create (POST)",
        }
    }
}

/// Mean and percentiles of some reconciles, and the mean of each phase.
#[derive(Debug, Clone, Default)]
struct ReconcileStats {
    n: usize,
    mean: f64,
    p50: f64,
    p99: f64,
    queue: f64,
    judge: f64,
    plan: f64,
    write: f64,
    finish: f64,
}

impl ReconcileStats {
    fn of(rs: &[Reconciled]) -> Self {
        let mean = |f: fn(&Reconciled) -> f64| {
            if rs.is_empty() {
                f64::NAN
            } else {
                rs.iter().map(f).sum::<f64>() / rs.len() as f64
            }
        };
        let totals: Vec<f64> = rs.iter().map(|r| r.total).collect();
        ReconcileStats {
            n: rs.len(),
            mean: mean(|r| r.total),
            p50: pct(&totals, 0.5),
            p99: pct(&totals, 0.99),
            queue: mean(|r| r.queue),
            judge: mean(|r| r.judge),
            plan: mean(|r| r.plan),
            write: mean(|r| r.write),
            finish: mean(|r| r.finish),
        }
    }

    /// "judge 0.1 / plan 0.0 / write 12 / finish 0.0 ms"
    fn phases(&self) -> String {
        format!(
            "judge {} / plan {} / write {} / finish {}",
            ms(self.judge),
            ms(self.plan),
            ms(self.write),
            ms(self.finish)
        )
    }
}

/// Stops portwise; a failure to stop cleanly is reported, not fatal.
async fn stop_portwise(pw: &mut Portwise) {
    if let Err(e) = pw.stop().await {
        eprintln!("bench: {e:#}");
    }
}

/// `GET /metrics`, summing every sample of `metric` (all label sets).
async fn scrape(pw: &Portwise, metric: &str) -> Result<f64> {
    let body = pw.metrics_text().await?;
    let mut total = 0.0;
    for line in body.lines() {
        let Some(rest) = line.strip_prefix(metric) else {
            continue;
        };
        // `metric` may end inside a label set (`name{decision="include"`).
        let boundary = if metric.contains('{') {
            rest.starts_with(',') || rest.starts_with('}')
        } else {
            rest.starts_with('{') || rest.starts_with(' ')
        };
        if !boundary {
            continue;
        }
        if let Some(v) = rest.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
            total += v;
        }
    }
    Ok(total)
}

// ---- the audit log ---------------------------------------------------------------

struct Audit {
    path: PathBuf,
}

/// Requests per (client, component, verb, resource).
#[derive(Default, Debug, Clone)]
struct Requests(BTreeMap<(String, String, String, String), u64>);

const WRITE_VERBS: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];

impl Requests {
    fn total(&self, client: &str, filter: impl Fn(&str, &str) -> bool) -> u64 {
        self.0
            .iter()
            .filter(|((c, _, verb, res), _)| c == client && filter(verb, res))
            .map(|(_, n)| n)
            .sum()
    }
    fn slice_writes(&self, client: &str) -> u64 {
        self.total(client, |v, r| {
            WRITE_VERBS.contains(&v) && r == "endpointslices"
        })
    }
    fn all(&self, client: &str) -> u64 {
        self.total(client, |_, _| true)
    }
    /// "create 1000, list 4, watch 5" for one client.
    fn by_verb(&self, client: &str) -> String {
        let mut verbs: BTreeMap<&str, u64> = BTreeMap::new();
        for ((c, _, v, _), n) in &self.0 {
            if c == client {
                *verbs.entry(v).or_default() += n;
            }
        }
        if verbs.is_empty() {
            return "none".into();
        }
        verbs
            .iter()
            .map(|(v, n)| format!("{v} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
    /// One table line per (component, verb, resource) of `client`.
    fn detail(&self, client: &str) -> String {
        let mut s = String::new();
        for ((c, comp, v, r), n) in &self.0 {
            if c == client {
                let _ = writeln!(s, "| {comp} | {v} | {r} | {n} |");
            }
        }
        s
    }
}

/// Which controller a User-Agent belongs to, and the component suffix.
fn classify(agent: &str) -> Option<(&'static str, String)> {
    if agent.starts_with("portwise/") {
        return Some((
            "portwise",
            agent.split(' ').next().unwrap_or(agent).to_string(),
        ));
    }
    if agent.starts_with("kube-controller-manager/") {
        let comp = agent.rsplit('/').next().unwrap_or("").to_string();
        return Some(("native", comp));
    }
    None
}

impl Audit {
    /// Requests since `from`, read 2 s from now: a request's
    /// ResponseComplete event can reach the file just after its response
    /// (and the watch event it caused) reached us.
    async fn settled_between(&self, from: u64) -> Result<Requests> {
        tokio::time::sleep(Duration::from_secs(2)).await;
        self.between(from, self.offset())
    }
    fn offset(&self) -> u64 {
        std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0)
    }
    /// Requests logged between two offsets. The audit backend is blocking,
    /// so a request is in the file by the time it has returned. Watches
    /// count when they start, everything else when it completes.
    fn between(&self, from: u64, to: u64) -> Result<Requests> {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = std::fs::File::open(&self.path)?;
        f.seek(SeekFrom::Start(from))?;
        let mut buf = Vec::with_capacity((to.saturating_sub(from)) as usize);
        f.take(to.saturating_sub(from)).read_to_end(&mut buf)?;
        let mut out = Requests::default();
        for line in buf.split(|b| *b == b'\n') {
            if line.is_empty() {
                continue;
            }
            let Ok(ev) = serde_json::from_slice::<Value>(line) else {
                continue;
            };
            let verb = ev["verb"].as_str().unwrap_or("");
            let stage = ev["stage"].as_str().unwrap_or("");
            let counted = if verb == "watch" {
                stage == "ResponseStarted"
            } else {
                stage == "ResponseComplete"
            };
            if !counted {
                continue;
            }
            let Some((client, comp)) = classify(ev["userAgent"].as_str().unwrap_or("")) else {
                continue;
            };
            let mut res = ev["objectRef"]["resource"]
                .as_str()
                .unwrap_or("(non-resource)")
                .to_string();
            if let Some(sub) = ev["objectRef"]["subresource"].as_str() {
                res = format!("{res}/{sub}");
            }
            *out.0
                .entry((client.to_string(), comp, verb.to_string(), res))
                .or_default() += 1;
        }
        Ok(out)
    }
}

// ---- watching slices converge -------------------------------------------------------

/// What one Service's slices should hold: exactly these Ready addresses.
type Expected = HashMap<String, BTreeSet<String>>;

#[derive(Clone, Debug, Default)]
struct SliceInfo {
    service: String,
    manager: String,
    ready: Vec<String>,
    port_ok: bool,
}

struct TrackerState {
    manager: String,
    expected: Expected,
    slices: HashMap<String, SliceInfo>,
    by_service: HashMap<String, HashSet<String>>,
    correct: HashSet<String>,
    initial: Option<HashMap<String, SliceInfo>>,
}

impl TrackerState {
    fn service_correct(&self, svc: &str) -> bool {
        let Some(want) = self.expected.get(svc) else {
            return false;
        };
        let mut got: Vec<&String> = Vec::new();
        for name in self.by_service.get(svc).into_iter().flatten() {
            let s = &self.slices[name];
            if s.manager != self.manager {
                continue;
            }
            if !s.port_ok && !s.ready.is_empty() {
                return false;
            }
            got.extend(s.ready.iter());
        }
        got.len() == want.len() && got.iter().all(|a| want.contains(*a))
    }
    fn refresh(&mut self, svc: &str) {
        if self.service_correct(svc) {
            self.correct.insert(svc.to_string());
        } else {
            self.correct.remove(svc);
        }
    }
    fn upsert(&mut self, name: String, info: SliceInfo) {
        let old = self.slices.insert(name.clone(), info.clone());
        if let Some(old) = old
            && old.service != info.service
        {
            if let Some(set) = self.by_service.get_mut(&old.service) {
                set.remove(&name);
            }
            self.refresh(&old.service);
        }
        self.by_service
            .entry(info.service.clone())
            .or_default()
            .insert(name);
        self.refresh(&info.service);
    }
    fn remove(&mut self, name: &str) {
        if let Some(old) = self.slices.remove(name) {
            if let Some(set) = self.by_service.get_mut(&old.service) {
                set.remove(name);
            }
            self.refresh(&old.service);
        }
    }
    fn all_correct(&self) -> bool {
        self.correct.len() == self.expected.len()
    }
}

fn slice_info(s: &EndpointSlice) -> (String, SliceInfo) {
    let labels = s.labels();
    let ready = s
        .endpoints
        .iter()
        .flatten()
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
        .flat_map(|e| e.addresses.iter().cloned())
        .collect();
    let port_ok = s
        .ports
        .iter()
        .flatten()
        .any(|p| p.port == Some(TARGET_PORT) || p.port == Some(TCP_PORT));
    (
        s.name_any(),
        SliceInfo {
            service: labels.get(SERVICE_NAME_LABEL).cloned().unwrap_or_default(),
            manager: labels.get(MANAGED_BY_LABEL).cloned().unwrap_or_default(),
            ready,
            port_ok,
        },
    )
}

/// Watches one namespace's EndpointSlices and tells when every expected
/// Service's slices hold exactly its expected Ready addresses.
#[derive(Clone)]
struct Tracker {
    state: Arc<Mutex<TrackerState>>,
    /// (services correct, total) after each event.
    progress: watch::Receiver<(usize, usize)>,
    tx: Arc<watch::Sender<(usize, usize)>>,
}

impl Tracker {
    fn start(ns: &TestNs, manager: &str, expected: Expected) -> Self {
        let total = expected.len();
        let state = Arc::new(Mutex::new(TrackerState {
            manager: manager.into(),
            expected,
            slices: HashMap::new(),
            by_service: HashMap::new(),
            correct: HashSet::new(),
            initial: None,
        }));
        let (tx, rx) = watch::channel((0, total));
        let tx = Arc::new(tx);
        let api: Api<EndpointSlice> = ns.api();
        let st = state.clone();
        let txc = tx.clone();
        tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(ev) = events.next().await {
                let Ok(ev) = ev else { continue };
                let mut s = st.lock().unwrap();
                match ev {
                    watcher::Event::Init => s.initial = Some(HashMap::new()),
                    watcher::Event::InitApply(obj) => {
                        let (n, i) = slice_info(&obj);
                        if let Some(init) = s.initial.as_mut() {
                            init.insert(n, i);
                        }
                    }
                    watcher::Event::InitDone => {
                        let init = s.initial.take().unwrap_or_default();
                        let gone: Vec<String> = s
                            .slices
                            .keys()
                            .filter(|k| !init.contains_key(*k))
                            .cloned()
                            .collect();
                        for g in gone {
                            s.remove(&g);
                        }
                        for (n, i) in init {
                            s.upsert(n, i);
                        }
                    }
                    watcher::Event::Apply(obj) => {
                        let (n, i) = slice_info(&obj);
                        s.upsert(n, i);
                    }
                    watcher::Event::Delete(obj) => s.remove(&obj.name_any()),
                }
                let p = (s.correct.len(), s.expected.len());
                drop(s);
                txc.send_replace(p);
            }
        });
        Self {
            state,
            progress: rx,
            tx,
        }
    }

    /// Replaces what one Service should hold.
    fn expect(&self, svc: &str, ready: BTreeSet<String>) {
        let mut s = self.state.lock().unwrap();
        s.expected.insert(svc.to_string(), ready);
        s.refresh(svc);
        let p = (s.correct.len(), s.expected.len());
        drop(s);
        self.tx.send_replace(p);
    }

    fn correct(&self, svc: &str) -> bool {
        self.state.lock().unwrap().correct.contains(svc)
    }

    /// Waits until every expected Service is right; returns when that was
    /// first seen. `proc` is checked for an early exit.
    async fn converged(&self, timeout: Duration, proc: &mut dyn Controller) -> Result<Instant> {
        let mut rx = self.progress.clone();
        let deadline = Instant::now() + timeout;
        let mut last_print = Instant::now();
        loop {
            if self.state.lock().unwrap().all_correct() {
                return Ok(Instant::now());
            }
            proc.check_alive()?;
            if Instant::now() > deadline {
                let (c, t) = *rx.borrow();
                bail!("not converged within {timeout:?}: {c}/{t} Services right");
            }
            if last_print.elapsed() > Duration::from_secs(10) {
                let (c, t) = *rx.borrow();
                eprintln!("bench:   … {c}/{t} Services right");
                last_print = Instant::now();
            }
            let _ = tokio::time::timeout(Duration::from_millis(500), rx.changed()).await;
        }
    }

    async fn service_converged(&self, svc: &str, timeout: Duration) -> Result<Instant> {
        let mut rx = self.progress.clone();
        let deadline = Instant::now() + timeout;
        loop {
            if self.correct(svc) {
                return Ok(Instant::now());
            }
            if Instant::now() > deadline {
                bail!("{svc} not right within {timeout:?}");
            }
            let _ = tokio::time::timeout(Duration::from_millis(200), rx.changed()).await;
        }
    }
}

/// A final LIST, independent of the watch: every expected Service right.
async fn verify_by_list(ns: &TestNs, manager: &str, expected: &Expected) -> Result<()> {
    let slices = ns.all_slices().await?;
    let mut st = TrackerState {
        manager: manager.into(),
        expected: expected.clone(),
        slices: HashMap::new(),
        by_service: HashMap::new(),
        correct: HashSet::new(),
        initial: None,
    };
    for s in &slices {
        let (n, i) = slice_info(s);
        st.upsert(n, i);
    }
    if !st.all_correct() {
        let wrong: Vec<&String> = expected
            .keys()
            .filter(|k| !st.correct.contains(*k))
            .take(5)
            .collect();
        bail!(
            "{} of {} Services wrong in a fresh LIST, e.g. {wrong:?}",
            expected.len() - st.correct.len(),
            expected.len()
        );
    }
    Ok(())
}

// ---- the objects -----------------------------------------------------------------------

/// The `n`th pod address: 10.244.0.0/16 first (the addresses `tests/netns`
/// makes local, which rows that reach pods stay within), then on into
/// 10.245–10.247 for the 5000-Service scale of row 1 (`BENCH_SERVICES`),
/// whose pods are judged by readiness alone and never reached.
fn pod_ip(n: usize) -> Ipv4Addr {
    const PER_16: usize = 250 * 250;
    assert!(n < 4 * PER_16, "pod address space exhausted");
    let (block, n) = (n / PER_16, n % PER_16);
    Ipv4Addr::new(10, 244 + block as u8, (n / 250) as u8, (n % 250 + 1) as u8)
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Native,
    Portwise,
    /// Row 9: the key both as a label and as an annotation ([`COST_KEY`]).
    Cost,
}

/// Row 9's key (label and annotation) and manager: no other row's objects
/// carry them, so the other rows' objects are unmanaged to row 9's portwise.
const COST_KEY: &str = "bench.portwise.io/cost-group";
const COST_MANAGER: &str = "portwise-cost";

struct Group {
    service: String,
    pods: Vec<(String, Ipv4Addr)>,
}

/// Services `s-0000…` with `per` pods each, pod addresses from `base` on.
fn groups(prefix: &str, count: usize, per: usize, base: usize) -> Vec<Group> {
    (0..count)
        .map(|i| Group {
            service: format!("{prefix}-{i:04}"),
            pods: (0..per)
                .map(|j| {
                    (
                        format!("{prefix}-{i:04}-{j:04}"),
                        pod_ip(base + i * per + j),
                    )
                })
                .collect(),
        })
        .collect()
}

fn expected_of(groups: &[Group]) -> Expected {
    groups
        .iter()
        .map(|g| {
            (
                g.service.clone(),
                g.pods.iter().map(|(_, ip)| ip.to_string()).collect(),
            )
        })
        .collect()
}

/// Creates the Services and Ready pods of `groups` in `ns`, `conc` requests
/// in flight.
async fn create_groups(
    ns: &TestNs,
    kind: Kind,
    groups: &[Group],
    nodes: &[String],
    conc: usize,
) -> Result<()> {
    stream::iter(groups.iter().map(Ok::<_, anyhow::Error>))
        .try_for_each_concurrent(conc.min(16), |g| async move {
            let mut svc = service(&g.service).port_to("http", 80, json!(TARGET_PORT));
            svc = match kind {
                Kind::Native => svc.selector(APP_LABEL, &g.service),
                Kind::Portwise => svc.annotation(GROUP_KEY, &g.service),
                Kind::Cost => svc
                    .label(COST_KEY, &g.service)
                    .annotation(COST_KEY, &g.service),
            };
            ns.create_service(svc).await?;
            Ok(())
        })
        .await?;
    let pods: Vec<(usize, &Group, &(String, Ipv4Addr))> = groups
        .iter()
        .flat_map(|g| g.pods.iter().map(move |p| (g, p)))
        .enumerate()
        .map(|(i, (g, p))| (i, g, p))
        .collect();
    let done = std::sync::atomic::AtomicUsize::new(0);
    let total = pods.len();
    let t = Instant::now();
    stream::iter(pods.into_iter().map(Ok::<_, anyhow::Error>))
        .try_for_each_concurrent(conc, |(i, g, (name, ip))| {
            let node = &nodes[i % nodes.len()];
            let done = &done;
            async move {
                // Identical pods in both namespaces: the label for the
                // native selector, the annotation for portwise's group.
                let p = match kind {
                    Kind::Native | Kind::Portwise => pod(name)
                        .label(APP_LABEL, &g.service)
                        .annotation(GROUP_KEY, &g.service),
                    Kind::Cost => pod(name)
                        .label(COST_KEY, &g.service)
                        .annotation(COST_KEY, &g.service),
                }
                .node(node)
                .ips([ip]);
                ns.create_pod(p).await?;
                let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                if n.is_multiple_of(2000) {
                    eprintln!(
                        "bench:   {} {n}/{total} pods ({:.0}/s)",
                        ns.name(),
                        n as f64 / t.elapsed().as_secs_f64()
                    );
                }
                Ok(())
            }
        })
        .await
}

/// Waits until portwise's slices of `svc` list exactly `http` and `https`
/// (addresses) on those ports.
async fn port_members_are(
    ns: &TestNs,
    svc: &str,
    http: &BTreeSet<String>,
    https: &BTreeSet<String>,
    timeout: Duration,
) -> Result<()> {
    let api: Api<EndpointSlice> = ns.api();
    let selector = format!("{SERVICE_NAME_LABEL}={svc},{MANAGED_BY_LABEL}={PORTWISE_MANAGER}");
    let t = Instant::now();
    loop {
        let mut by_port: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for s in api
            .list(&ListParams::default().labels(&selector))
            .await?
            .items
        {
            for p in s.ports.iter().flatten() {
                let set = by_port
                    .entry(p.name.clone().unwrap_or_default())
                    .or_default();
                set.extend(
                    s.endpoints
                        .iter()
                        .flatten()
                        .flat_map(|e| e.addresses.clone()),
                );
            }
        }
        let got = |p: &str| by_port.get(p).cloned().unwrap_or_default();
        if got("http") == *http && got("https") == *https {
            return Ok(());
        }
        if t.elapsed() > timeout {
            bail!(
                "{svc}: http {} of {}, https {} of {} after {timeout:?}",
                got("http").len(),
                http.len(),
                got("https").len(),
                https.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn portwise_config(extra: &str, membership: &str) -> String {
    format!(
        "managedBy: {PORTWISE_MANAGER}\n\
         serviceKey: {{annotation: {GROUP_KEY}}}\n\
         {extra}\
         membership: {membership}\n"
    )
}

// ---- formatting --------------------------------------------------------------------------

fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0).then(|| a / b)
}
fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// One of row 9's cold syncs.
struct CostRun {
    time: Duration,
    usage: Usage,
    cached_pods: f64,
}

fn median_of(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Where one portwise cold start spent its time (row 1b), from its log and
/// metrics.
#[derive(Debug, Default)]
struct ColdTimings {
    /// From its controller's start to every cache's first list.
    synced: Option<Duration>,
    /// To every Service reconciled once.
    reconciled: Option<Duration>,
    reconciles: f64,
    mean_reconcile_ms: f64,
    writes: f64,
    /// From the profile lines (when portwise logged them).
    profile: ReconcileStats,
    /// The apiserver's CPU seconds from portwise's start until its caches
    /// were synced, and until every slice was right.
    api_cpu_synced: f64,
    api_cpu: f64,
}

/// `after_ms=N` of the first log line with `message`.
fn logged_after(log: &str, message: &str) -> Option<Duration> {
    let line = log.lines().find(|l| l.contains(message))?;
    let v = line.split("after_ms=").nth(1)?;
    let digits: String = v.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok().map(Duration::from_millis)
}

async fn cold_timings(pw: &Portwise) -> ColdTimings {
    let log = pw.current_logs();
    let count = scrape(pw, "portwise_reconcile_duration_seconds_count")
        .await
        .unwrap_or(0.0);
    let sum = scrape(pw, "portwise_reconcile_duration_seconds_sum")
        .await
        .unwrap_or(0.0);
    ColdTimings {
        synced: logged_after(&log, "caches synced"),
        reconciled: logged_after(&log, "every Service reconciled once"),
        reconciles: count,
        mean_reconcile_ms: if count > 0.0 {
            1000.0 * sum / count
        } else {
            0.0
        },
        writes: scrape(pw, "portwise_writes_total").await.unwrap_or(0.0),
        profile: ReconcileStats::of(&reconciles_in(&log)),
        api_cpu_synced: f64::NAN,
        api_cpu: f64::NAN,
    }
}

// ---- rows -----------------------------------------------------------------------------------

struct Bench {
    knobs: Knobs,
    cp: &'static ControlPlane,
    bcp: BenchCp,
    work: PathBuf,
    report: Report,
    protocol: Vec<String>,
    nodes: Vec<String>,
}

/// Row 1's running controllers, kept for rows 2 and 3.
struct Pair {
    native_ns: TestNs,
    portwise_ns: TestNs,
    native: Proc,
    portwise: Portwise,
    native_tracker: Tracker,
    portwise_tracker: Tracker,
}

impl Bench {
    /// The fake Nodes every row's pods sit on (cluster-scoped, made once,
    /// whichever row runs first).
    async fn ensure_nodes(&mut self, ns: &TestNs) -> Result<()> {
        if self.nodes.is_empty() {
            for i in 0..NODES {
                let n = ns
                    .ensure_node(&format!("node-{i}"), ZONES[i % ZONES.len()])
                    .await?;
                self.nodes.push(n);
            }
        }
        Ok(())
    }

    async fn row1(&mut self) -> Result<Pair> {
        let k = &self.knobs;
        let (n_svc, per) = (k.services, k.pods_per_service);
        eprintln!("bench: row 1 setup: {n_svc} Services × {per} pods, twice");
        let native_ns = TestNs::new(self.cp, "bench-native").await?;
        let portwise_ns = TestNs::new(self.cp, "bench-portwise").await?;
        self.ensure_nodes(&native_ns).await?;
        let k = &self.knobs;
        let stride = n_svc * per + k.big_pods + 500;
        let native_groups = groups("s", n_svc, per, 0);
        let portwise_groups = groups("s", n_svc, per, stride);
        let t = Instant::now();
        let conc = k.setup_concurrency / 2;
        let (a, b) = tokio::join!(
            create_groups(&native_ns, Kind::Native, &native_groups, &self.nodes, conc),
            create_groups(
                &portwise_ns,
                Kind::Portwise,
                &portwise_groups,
                &self.nodes,
                conc
            ),
        );
        a?;
        b?;
        let setup = t.elapsed();
        let objects = 2 * (n_svc + n_svc * per);
        eprintln!("bench: setup took {}", secs(setup));
        self.protocol.push(format!(
            "- Setup (not counted): {objects} objects ({n_svc} Services and {} pods per namespace, \
             each pod created and then marked Ready with a podIP through the status subresource, \
             {} requests in flight) took {} ({:.0} pods/s).",
            n_svc * per,
            k.setup_concurrency,
            secs(setup),
            (2 * n_svc * per) as f64 / setup.as_secs_f64()
        ));
        // Let the apiserver's watch caches and etcd settle.
        tokio::time::sleep(Duration::from_secs(5)).await;

        let audit = self.bcp.audit();
        let native_expected = expected_of(&native_groups);
        let portwise_expected = expected_of(&portwise_groups);
        let native_tracker = Tracker::start(&native_ns, NATIVE_MANAGER, native_expected.clone());
        let portwise_tracker =
            Tracker::start(&portwise_ns, PORTWISE_MANAGER, portwise_expected.clone());
        tokio::time::sleep(Duration::from_secs(2)).await;

        // Native: cold start of the controller-manager on the full state.
        eprintln!("bench: row 1 native: starting kube-controller-manager");
        let a0 = audit.offset();
        let mut native = self.bcp.spawn_cm(&[])?;
        let done = native_tracker
            .converged(Duration::from_secs(1200), &mut native)
            .await?;
        let native_time = done - native.started;
        let native_use = native.usage();
        let native_req = audit.settled_between(a0).await?;
        verify_by_list(&native_ns, NATIVE_MANAGER, &native_expected).await?;
        eprintln!("bench:   native converged in {}", secs(native_time));
        tokio::time::sleep(Duration::from_secs(5)).await;

        // portwise: the release binary, cold, on its namespace.
        eprintln!("bench: row 1 portwise: starting portwise");
        let a0 = audit.offset();
        let mut portwise = spawn_portwise_with_log(
            self.cp,
            &self.work,
            "row1",
            &portwise_config(
                &format!("{}{PORT_SETS_POLICY}", self.knobs.portwise_extra),
                "podReady",
            ),
            &[portwise_ns.name()],
            &[],
            PROFILE_LOG,
        )
        .await?;
        let done = portwise_tracker
            .converged(Duration::from_secs(1200), &mut portwise)
            .await?;
        let pw_time = done - portwise.started_at();
        let pw_use = portwise.usage();
        let pw_req = audit.settled_between(a0).await?;
        verify_by_list(&portwise_ns, PORTWISE_MANAGER, &portwise_expected).await?;
        eprintln!("bench:   portwise converged in {}", secs(pw_time));

        let r = &mut self.report;
        let label = format!("1 convergence ({n_svc} Services × {per} pods)");
        let t_ratio = ratio(pw_time.as_secs_f64(), native_time.as_secs_f64());
        r.row(
            &label,
            "time until every slice is right",
            secs(pw_time),
            secs(native_time),
            t_ratio,
            Goal::RatioAtMost(1.0),
        );
        let (pw_w, nat_w) = (
            pw_req.slice_writes("portwise"),
            native_req.slice_writes("native"),
        );
        let w_ratio = ratio(pw_w as f64, nat_w as f64);
        r.row(
            &label,
            "EndpointSlice writes",
            pw_w.to_string(),
            nat_w.to_string(),
            w_ratio,
            Goal::RatioAtMost(1.0),
        );
        let (pw_all, nat_all) = (pw_req.all("portwise"), native_req.all("native"));
        let all_ratio = ratio(pw_all as f64, nat_all as f64);
        r.row(
            &label,
            "API requests at cold start, all verbs",
            format!("{pw_all} ({})", pw_req.by_verb("portwise")),
            format!("{nat_all} ({})", native_req.by_verb("native")),
            all_ratio,
            Goal::RatioAtMost(1.0),
        );
        r.row(
            &label,
            "CPU seconds of the controller process",
            format!("{:.1}", pw_use.cpu),
            format!("{:.1}", native_use.cpu),
            ratio(pw_use.cpu, native_use.cpu),
            Goal::None,
        );
        r.row(
            &label,
            "peak RSS (VmHWM)",
            format!("{:.0} MiB", pw_use.hwm_mib),
            format!("{:.0} MiB", native_use.hwm_mib),
            ratio(pw_use.hwm_mib, native_use.hwm_mib),
            Goal::None,
        );
        let mut detail = String::from(
            "Requests from start until every slice was right, from the audit log, by User-Agent \
             component.\n\n| client | component | verb | resource | requests |\n|---|---|---|---|---|\n",
        );
        for (client, req) in [("portwise", &pw_req), ("native", &native_req)] {
            for line in req.detail(client).lines() {
                let _ = writeln!(detail, "| {client} |{}", line.trim_start_matches('|'));
            }
        }
        r.section("Row 1: requests in detail", detail);

        Ok(Pair {
            native_ns,
            portwise_ns,
            native,
            portwise,
            native_tracker,
            portwise_tracker,
        })
    }

    /// Row 1b: the native controller with its client rate limit lifted, to
    /// show how much of its time is the default `--kube-api-qps=20`; both
    /// cluster-wide. One run decides nothing on a noisy machine, so each
    /// controller starts cold `fair_runs` times, alternating, and the
    /// median ratio is the verdict.
    async fn row1b(&mut self, pair: &mut Pair) -> Result<()> {
        let runs = self.knobs.fair_runs;
        let mut results = Vec::new();
        for i in 1..=runs {
            let nat = self.row1b_native(pair, i).await?;
            let pw = self.row1b_portwise(pair, i).await?;
            results.push((nat, pw));
        }
        let services = pair.portwise_tracker.state.lock().unwrap().expected.len();
        let label =
            format!("1b convergence, both unthrottled and cluster-wide ({services} Services)");
        let r = &mut self.report;
        let mut ratios = Vec::new();
        for (i, (nat, pw)) in results.iter().enumerate() {
            let t_ratio = ratio(pw.0.as_secs_f64(), nat.0.as_secs_f64());
            ratios.extend(t_ratio);
            r.row(
                &label,
                &format!("time until every slice is right, run {}", i + 1),
                secs(pw.0),
                secs(nat.0),
                t_ratio,
                Goal::None,
            );
        }
        ratios.sort_by(|a, b| a.total_cmp(b));
        let median = ratios.get(ratios.len() / 2).copied();
        let pw_times: Vec<f64> = results.iter().map(|(_, p)| p.0.as_secs_f64()).collect();
        let nat_times: Vec<f64> = results.iter().map(|(n, _)| n.0.as_secs_f64()).collect();
        r.row(
            &label,
            &format!("time until every slice is right, median ratio of {runs} runs"),
            format!("{:.1} s (median)", median_of(&pw_times)),
            format!("{:.1} s (median)", median_of(&nat_times)),
            median,
            Goal::RatioAtMost(0.5),
        );
        let (nat, pw) = results.last().expect("at least one run");
        let w_ratio = ratio(pw.1 as f64, nat.1 as f64);
        r.row(
            &label,
            "EndpointSlice writes (last run)",
            pw.1.to_string(),
            nat.1.to_string(),
            w_ratio,
            Goal::RatioAtMost(1.0),
        );
        let usage: [UsageRow; 3] = [
            (
                "CPU seconds of the controller process (last run)",
                |u| u.cpu,
                1,
                "",
            ),
            (
                "apiserver CPU seconds from start to converged (last run)",
                |u| u.api_cpu,
                1,
                "",
            ),
            ("peak RSS (VmHWM, last run)", |u| u.hwm_mib, 0, " MiB"),
        ];
        for (measure, figure, decimals, unit) in usage {
            let (p, n) = (figure(&pw.2), figure(&nat.2));
            r.row(
                &label,
                measure,
                format!("{p:.decimals$}{unit}"),
                format!("{n:.decimals$}{unit}"),
                ratio(p, n),
                Goal::None,
            );
        }
        let mut detail = String::from(
            "Where portwise's cold start spends its time, per run: from its exec to its caches synced (every watch's first LIST, and the start-up LISTs of native Endpoints and EndpointSlices), to every Service reconciled once (its own log), to every slice right (the bench's watch); reconcile durations and writes from its metrics.\n\n| run | caches synced | every Service reconciled | every slice right | reconciles | mean reconcile | reconcile p50 / p99 | mean per phase (ms) | queued for a slot, mean | slice writes | apiserver CPU: to synced / to right (native: to right) | native: caches synced / every slice right |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        );
        for (i, (nat, pw)) in results.iter().enumerate() {
            let t = &pw.3;
            let _ = writeln!(
                detail,
                "| {} | {} | {} | {} | {:.0} | {:.1} ms | {} / {} | {} | {} | {:.0} | {:.1} s / {:.1} s ({:.1} s) | {} / {} |",
                i + 1,
                t.synced.map(secs).unwrap_or_else(|| "?".into()),
                t.reconciled.map(secs).unwrap_or_else(|| "?".into()),
                secs(pw.0),
                t.reconciles,
                t.mean_reconcile_ms,
                ms(t.profile.p50),
                ms(t.profile.p99),
                t.profile.phases(),
                ms(t.profile.queue),
                t.writes,
                t.api_cpu_synced,
                t.api_cpu,
                nat.2.api_cpu,
                nat.3.map(secs).unwrap_or_else(|| "?".into()),
                secs(nat.0),
            );
        }
        r.section(
            "Row 1b: where portwise's cold start spends its time",
            detail,
        );
        Ok(())
    }

    async fn row1b_native(
        &mut self,
        pair: &mut Pair,
        run: usize,
    ) -> Result<(Duration, u64, Usage, Option<Duration>)> {
        eprintln!("bench: row 1b run {run}: native with --kube-api-qps=1000 --kube-api-burst=1000");
        // Both controllers again, on the same state (now with row 3's big
        // Service too): the native one without its client rate limit, then
        // portwise without `--namespace`, so both cache all pods.
        pair.native.stop().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let api: Api<EndpointSlice> = pair.native_ns.api();
        api.delete_collection(&Default::default(), &Default::default())
            .await?;
        let expected = pair.native_tracker.state.lock().unwrap().expected.clone();
        // Wait for the watch to see the slices gone.
        let t = Instant::now();
        while pair.native_tracker.progress.borrow().0 > 0 && t.elapsed() < Duration::from_secs(120)
        {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        let audit = self.bcp.audit();
        let a0 = audit.offset();
        let api0 = apiserver_cpu(self.cp);
        let cm_log = self.bcp.dir.join("controller-manager.log");
        let log_from = std::fs::metadata(&cm_log).map_or(0, |m| m.len());
        let spawned_at = std::time::SystemTime::now();
        let mut native = self
            .bcp
            .spawn_cm(&["--kube-api-qps=1000", "--kube-api-burst=1000"])?;
        let done = pair
            .native_tracker
            .converged(Duration::from_secs(1200), &mut native)
            .await?;
        let time = done - native.started;
        let mut u = native.usage();
        u.api_cpu = apiserver_cpu(self.cp) - api0;
        let req = audit.settled_between(a0).await?;
        verify_by_list(&pair.native_ns, NATIVE_MANAGER, &expected).await?;
        pair.native = native;
        let synced = caches_synced_in_klog(&cm_log, log_from, spawned_at);
        eprintln!(
            "bench:   native (no rate limit) converged in {} (caches synced after {})",
            secs(time),
            synced.map(secs).unwrap_or_else(|| "?".into())
        );
        Ok((time, req.slice_writes("native"), u, synced))
    }

    async fn row1b_portwise(
        &mut self,
        pair: &mut Pair,
        run: usize,
    ) -> Result<(Duration, u64, Usage, ColdTimings)> {
        // portwise's counterpart: all namespaces, so it caches the same
        // 2 × (Services, pods) the native informers hold.
        eprintln!("bench: row 1b run {run}: portwise watching all namespaces");
        stop_portwise(&mut pair.portwise).await;
        let api: Api<EndpointSlice> = pair.portwise_ns.api();
        api.delete_collection(
            &Default::default(),
            &kube::api::ListParams::default()
                .labels(&format!("{MANAGED_BY_LABEL}={PORTWISE_MANAGER}")),
        )
        .await?;
        let expected = pair.portwise_tracker.state.lock().unwrap().expected.clone();
        let t = Instant::now();
        while pair.portwise_tracker.progress.borrow().0 > 0
            && t.elapsed() < Duration::from_secs(120)
        {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        let audit = self.bcp.audit();
        let a0 = audit.offset();
        let extra: Vec<&str> = self.knobs.row1b_args.split_whitespace().collect();
        let api0 = apiserver_cpu(self.cp);
        let mut portwise = spawn_portwise_with_log(
            self.cp,
            &self.work,
            &format!("row1b-{run}"),
            &portwise_config("", "podReady"),
            &[],
            &extra,
            PROFILE_LOG,
        )
        .await?;
        // The apiserver's CPU until portwise's caches are synced (its
        // /readyz turns 200), to split its cost into lists and writes.
        let synced_cpu = {
            let (addr, cp) = (portwise.metrics_addr()?, self.cp);
            tokio::spawn(async move {
                loop {
                    if let Ok((200, _)) = portwise_tests::ops::http_get(addr, "/readyz").await {
                        return apiserver_cpu(cp);
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
        };
        let done = pair
            .portwise_tracker
            .converged(Duration::from_secs(1200), &mut portwise)
            .await?;
        let time = done - portwise.started_at();
        let mut u = portwise.usage();
        u.api_cpu = apiserver_cpu(self.cp) - api0;
        let api_synced = tokio::time::timeout(Duration::from_secs(5), synced_cpu)
            .await
            .ok()
            .and_then(Result::ok)
            .map_or(f64::NAN, |c| c - api0);
        let req = audit.settled_between(a0).await?;
        verify_by_list(&pair.portwise_ns, PORTWISE_MANAGER, &expected).await?;
        let mut timings = cold_timings(&portwise).await;
        timings.api_cpu_synced = api_synced;
        timings.api_cpu = u.api_cpu;
        pair.portwise = portwise;
        eprintln!(
            "bench:   portwise (all namespaces) converged in {} ({timings:?})",
            secs(time)
        );
        Ok((time, req.slice_writes("portwise"), u, timings))
    }

    /// Row 9: what unmanaged objects cost portwise. The same managed set
    /// (own key and manager, so every other row's objects are unmanaged to
    /// it) is synced cold by a cluster-wide portwise, first alone, then
    /// again after `unmanaged_pods` pods without the key were created in
    /// other namespaces; once with the key as a label (the apiserver
    /// selects), once as an annotation (portwise filters before its cache).
    async fn row9(&mut self) -> Result<()> {
        let k = &self.knobs;
        let (n_svc, per, unmanaged) = (k.services, k.pods_per_service, k.unmanaged_pods);
        let conc = k.setup_concurrency;
        let base = 2 * (k.services * k.pods_per_service + k.big_pods + 500) + k.probe_pods + 1200;
        eprintln!("bench: row 9 setup: {n_svc} managed Services × {per} pods");
        let ns = TestNs::new(self.cp, "bench-cost").await?;
        self.ensure_nodes(&ns).await?;
        let gs = groups("c", n_svc, per, base);
        create_groups(&ns, Kind::Cost, &gs, &self.nodes, conc).await?;
        let tracker = Tracker::start(&ns, COST_MANAGER, expected_of(&gs));
        tokio::time::sleep(Duration::from_secs(5)).await;

        let keys = ["label", "annotation"];
        let mut alone = Vec::new();
        for key in keys {
            alone.push(self.row9_run(&ns, &tracker, key, "alone").await?);
        }

        eprintln!("bench: row 9 setup: {unmanaged} unmanaged pods in other namespaces");
        let spaces = unmanaged.div_ceil(10_000).max(1);
        let mut namespaces = Vec::new();
        for _ in 0..spaces {
            namespaces.push(TestNs::new(self.cp, "bench-unmanaged").await?);
        }
        let t = Instant::now();
        let done = AtomicUsize::new(0);
        let names: Vec<(usize, usize)> = (0..unmanaged).map(|i| (i % spaces, i)).collect();
        stream::iter(names.into_iter().map(Ok::<_, anyhow::Error>))
            .try_for_each_concurrent(4 * conc, |(space, i)| {
                let ns = &namespaces[space];
                let done = &done;
                async move {
                    // An ordinary workload's pod: labelled, no key, never
                    // scheduled (no status).
                    ns.create_pod(
                        pod(&format!("u-{i:06}"))
                            .label("app", &format!("app-{}", i % 500))
                            .annotation("example.com/owner", "someone")
                            .no_status(),
                    )
                    .await?;
                    let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                    if n.is_multiple_of(10_000) {
                        eprintln!(
                            "bench:   {n}/{unmanaged} unmanaged pods ({:.0}/s)",
                            n as f64 / t.elapsed().as_secs_f64()
                        );
                    }
                    Ok(())
                }
            })
            .await?;
        let setup = t.elapsed();
        self.protocol.push(format!(
            "- Row 9 setup (not counted): {n_svc} Services × {per} Ready pods in `bench-cost-*` carrying the key `{COST_KEY}` as a label and as an annotation (portwise: `managedBy: {COST_MANAGER}`, cluster-wide, once with `serviceKey: {{label: …}}`, once with `{{annotation: …}}`); then {unmanaged} pods without the key (a label, an annotation, no status) in {spaces} other namespaces, created in {} ({:.0} pods/s, {} requests in flight).",
            secs(setup),
            unmanaged as f64 / setup.as_secs_f64(),
            4 * conc
        ));
        tokio::time::sleep(Duration::from_secs(5)).await;
        let mut with = Vec::new();
        for key in keys {
            with.push(self.row9_run(&ns, &tracker, key, "with").await?);
        }

        let r = &mut self.report;
        for ((key, a), w) in keys.iter().zip(&alone).zip(&with) {
            let label = format!("9 cost of {unmanaged} unmanaged pods ({key} keys)");
            let t_ratio = ratio(w.time.as_secs_f64(), a.time.as_secs_f64());
            r.row(
                &label,
                "cold-sync time, portwise with them (portwise column) ÷ alone (native column)",
                secs(w.time),
                secs(a.time),
                t_ratio,
                Goal::RatioAtMost(1.2),
            );
            let m_ratio = ratio(w.usage.hwm_mib, a.usage.hwm_mib);
            r.row(
                &label,
                "peak RSS (VmHWM), with them ÷ alone",
                format!("{:.0} MiB", w.usage.hwm_mib),
                format!("{:.0} MiB", a.usage.hwm_mib),
                m_ratio,
                Goal::RatioAtMost(1.2),
            );
            r.row(
                &label,
                "pods cached (`portwise_cache_objects`), with them ÷ alone",
                format!("{:.0}", w.cached_pods),
                format!("{:.0}", a.cached_pods),
                ratio(w.cached_pods, a.cached_pods),
                Goal::None,
            );
            r.row(
                &label,
                "CPU seconds of the cold sync, with them ÷ alone",
                format!("{:.1}", w.usage.cpu),
                format!("{:.1}", a.usage.cpu),
                ratio(w.usage.cpu, a.usage.cpu),
                Goal::None,
            );
        }
        Ok(())
    }

    /// One cold sync of row 9's managed set by a cluster-wide portwise.
    async fn row9_run(
        &self,
        ns: &TestNs,
        tracker: &Tracker,
        key: &str,
        tag: &str,
    ) -> Result<CostRun> {
        let api: Api<EndpointSlice> = ns.api();
        api.delete_collection(
            &Default::default(),
            &kube::api::ListParams::default().labels(&format!("{MANAGED_BY_LABEL}={COST_MANAGER}")),
        )
        .await?;
        let t = Instant::now();
        while tracker.progress.borrow().0 > 0 && t.elapsed() < Duration::from_secs(120) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        eprintln!("bench: row 9: portwise, {key} keys, {tag}");
        let config = format!(
            "managedBy: {COST_MANAGER}\nserviceKey: {{{key}: {COST_KEY}}}\nmembership: podReady\n"
        );
        let mut pw = spawn_portwise(
            self.cp,
            &self.work,
            &format!("row9-{key}-{tag}"),
            &config,
            &[],
            &[],
        )
        .await?;
        let done = tracker
            .converged(Duration::from_secs(1200), &mut pw)
            .await?;
        let time = done - pw.started_at();
        let usage = pw.usage();
        // The gauge is sampled every second.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let cached_pods = scrape(&pw, "portwise_cache_objects{kind=\"pods\"")
            .await
            .unwrap_or(f64::NAN);
        stop_portwise(&mut pw).await;
        eprintln!(
            "bench:   converged in {}, peak RSS {:.0} MiB, {cached_pods} pods cached",
            secs(time),
            usage.hwm_mib
        );
        Ok(CostRun {
            time,
            usage,
            cached_pods,
        })
    }

    async fn row2(&mut self, pair: &mut Pair) -> Result<()> {
        let window = self.knobs.steady;
        eprintln!("bench: row 2: quiet for {}", secs(window));
        tokio::time::sleep(Duration::from_secs(3)).await;
        let audit = self.bcp.audit();
        let (n0, p0) = (pair.native.usage(), pair.portwise.usage());
        let a0 = audit.offset();
        tokio::time::sleep(window).await;
        let req = audit.between(a0, audit.offset())?;
        pair.native.check_alive()?;
        pair.portwise.check_alive()?;
        let (n1, p1) = (pair.native.usage(), pair.portwise.usage());
        let (pw, nat) = (req.slice_writes("portwise"), req.slice_writes("native"));
        let label = format!("2 steady state ({} quiet)", secs(window));
        self.report.row(
            &label,
            "EndpointSlice writes",
            pw.to_string(),
            nat.to_string(),
            None,
            Goal::Stated("portwise 0", pw == 0),
        );
        self.report.row(
            &label,
            "API requests, all verbs",
            format!("{} ({})", req.all("portwise"), req.by_verb("portwise")),
            format!("{} ({})", req.all("native"), req.by_verb("native")),
            None,
            Goal::None,
        );
        self.report.row(
            &label,
            "CPU seconds in the window / RSS at its end",
            format!("{:.2} s / {:.0} MiB", p1.cpu - p0.cpu, p1.rss_mib),
            format!("{:.2} s / {:.0} MiB", n1.cpu - n0.cpu, n1.rss_mib),
            ratio(p1.cpu - p0.cpu, n1.cpu - n0.cpu),
            Goal::None,
        );
        Ok(())
    }

    async fn row3(&mut self, pair: &mut Pair) -> Result<()> {
        let big = self.knobs.big_pods;
        eprintln!("bench: row 3 setup: one Service with {big} pods per namespace");
        let base = self.knobs.services * self.knobs.pods_per_service;
        let stride = base + big + 500;
        let nb = groups("big", 1, big, base);
        let pb = groups("big", 1, big, stride + base);
        let conc = self.knobs.setup_concurrency / 2;
        let (a, b) = tokio::join!(
            create_groups(&pair.native_ns, Kind::Native, &nb, &self.nodes, conc),
            create_groups(&pair.portwise_ns, Kind::Portwise, &pb, &self.nodes, conc),
        );
        a?;
        b?;
        let svc = nb[0].service.clone();
        pair.native_tracker
            .expect(&svc, expected_of(&nb).remove(&svc).unwrap());
        pair.portwise_tracker
            .expect(&svc, expected_of(&pb).remove(&svc).unwrap());
        pair.native_tracker
            .service_converged(&svc, Duration::from_secs(300))
            .await?;
        pair.portwise_tracker
            .service_converged(&svc, Duration::from_secs(300))
            .await?;
        tokio::time::sleep(Duration::from_secs(5)).await;

        let audit = self.bcp.audit();
        let mut results = Vec::new();
        for (ns, tracker, group, client) in [
            (&pair.native_ns, &pair.native_tracker, &nb[0], "native"),
            (
                &pair.portwise_ns,
                &pair.portwise_tracker,
                &pb[0],
                "portwise",
            ),
        ] {
            let (victim, ip) = &group.pods[big / 2];
            let mut want: BTreeSet<String> =
                group.pods.iter().map(|(_, ip)| ip.to_string()).collect();
            want.remove(&ip.to_string());
            let a0 = audit.offset();
            let t = Instant::now();
            tracker.expect(&svc, want);
            ns.set_ready(victim, false).await?;
            let done = tracker
                .service_converged(&svc, Duration::from_secs(120))
                .await?;
            let latency = done - t;
            // Trailing writes, if any, land within a few seconds.
            tokio::time::sleep(Duration::from_secs(5)).await;
            let req = audit.between(a0, audit.offset())?;
            eprintln!(
                "bench:   {client}: flip seen after {} with {} slice writes",
                secs(latency),
                req.slice_writes(client)
            );
            results.push((latency, req.slice_writes(client), req.by_verb(client)));
        }
        let (nat, pw) = (&results[0], &results[1]);
        let label = format!("3 churn (one pod Ready→NotReady in a {big}-endpoint Service)");
        self.report.row(
            &label,
            "EndpointSlice writes",
            pw.1.to_string(),
            nat.1.to_string(),
            ratio(pw.1 as f64, nat.1 as f64),
            Goal::Stated("portwise 1", pw.1 == 1),
        );
        self.report.row(
            &label,
            "time from the status patch until the slice shows it",
            format!("{:.0} ms", pw.0.as_secs_f64() * 1000.0),
            format!("{:.0} ms", nat.0.as_secs_f64() * 1000.0),
            ratio(pw.0.as_secs_f64(), nat.0.as_secs_f64()),
            Goal::None,
        );
        self.report.row(
            &label,
            "API requests in the 5 s after",
            pw.2.clone(),
            nat.2.clone(),
            None,
            Goal::None,
        );
        self.row3_port_sets(pair).await?;
        self.row3_reconciles(pair, &pb[0]).await
    }

    /// Row 3's third part: what a flip costs when every pod sits in one
    /// slice listing the two ports it backs (the native controller's
    /// layout). A readiness flip keeps the pod's set of ports (it leaves
    /// both, or rejoins both): one write. A flip of its ports annotation
    /// changes the set: it moves between slices. portwise only: the native
    /// controller has no per-port membership, so no pod of it changes its
    /// set of ports without being re-created.
    async fn row3_port_sets(&mut self, pair: &mut Pair) -> Result<()> {
        let big = self.knobs.big_pods;
        let svc = "two-0000";
        eprintln!("bench: row 3 port sets: one Service of two ports, {big} pods backing both");
        let ns = &pair.portwise_ns;
        ns.create_service(
            service(svc)
                .annotation(GROUP_KEY, svc)
                .annotation("portwise.io/membership", "port-sets")
                .port_to("http", 80, json!(TARGET_PORT))
                .port_to("https", 443, json!(TCP_PORT)),
        )
        .await?;
        // The last addresses, past every other row's (row 1 at 5000
        // Services included): these pods are never reached.
        let last = 4 * 250 * 250 - 1 - big;
        let pods: Vec<(String, Ipv4Addr)> = (0..big)
            .map(|j| (format!("{svc}-{j:04}"), pod_ip(last + j)))
            .collect();
        let nodes = &self.nodes;
        stream::iter(pods.iter().enumerate().map(Ok::<_, anyhow::Error>))
            .try_for_each_concurrent(
                self.knobs.setup_concurrency.max(1),
                |(i, (name, ip))| async move {
                    let p = pod(name)
                        .annotation(GROUP_KEY, svc)
                        .annotation(PORTS_KEY, "http,https")
                        .node(&nodes[i % nodes.len()])
                        .ips([ip]);
                    ns.create_pod(p).await?;
                    Ok(())
                },
            )
            .await?;
        let all: BTreeSet<String> = pods.iter().map(|(_, ip)| ip.to_string()).collect();
        let without = |ip: &Ipv4Addr| {
            let mut s = all.clone();
            s.remove(&ip.to_string());
            s
        };
        port_members_are(ns, svc, &all, &all, Duration::from_secs(300)).await?;
        tokio::time::sleep(Duration::from_secs(5)).await;

        let audit = self.bcp.audit();
        // (what, the change, http's members after, https's after)
        let (ready_pod, ready_ip) = &pods[big / 3];
        let (ports_pod, ports_ip) = &pods[2 * big / 3];
        let mut keeps = Vec::new();
        let mut changes = Vec::new();
        for step in 0..4 {
            let a0 = audit.offset();
            let (http, https) = match step {
                0 => {
                    ns.set_ready(ready_pod, false).await?;
                    (without(ready_ip), without(ready_ip))
                }
                1 => {
                    ns.set_ready(ready_pod, true).await?;
                    (all.clone(), all.clone())
                }
                2 => {
                    ns.annotate_pod(ports_pod, PORTS_KEY, Some("http")).await?;
                    (all.clone(), without(ports_ip))
                }
                _ => {
                    ns.annotate_pod(ports_pod, PORTS_KEY, Some("http,https"))
                        .await?;
                    (all.clone(), all.clone())
                }
            };
            port_members_are(ns, svc, &http, &https, Duration::from_secs(60)).await?;
            // Trailing writes (a move's finish) land within a few seconds.
            tokio::time::sleep(Duration::from_secs(5)).await;
            let writes = audit.between(a0, audit.offset())?.slice_writes("portwise");
            eprintln!("bench:   port sets step {step}: {writes} slice writes");
            if step < 2 {
                keeps.push(writes);
            } else {
                changes.push(writes);
            }
        }
        let label = format!(
            "3 churn, two ports ({big} pods, each in one slice listing the ports it backs)"
        );
        let shown = |w: &[u64]| w.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
        self.report.row(
            &label,
            "EndpointSlice writes per flip that keeps the pod's port set (readiness out, in)",
            shown(&keeps),
            "1 (row 3's first part)".into(),
            None,
            Goal::Stated("1", keeps.iter().all(|w| *w == 1)),
        );
        self.report.row(
            &label,
            "EndpointSlice writes per flip that changes it (https out, in: a move)",
            shown(&changes),
            "no such flip".into(),
            None,
            Goal::Stated("≤ 2", changes.iter().all(|w| *w <= 2)),
        );
        Ok(())
    }

    /// Row 3's second part: what one reconcile costs at 10 and at 1000
    /// pods, unloaded. One pod of a 10-pod Service (row 1's first) and one
    /// of the 1000-pod one flip readiness `reconcile_flips` times each, one
    /// at a time, each waited for in the slices; portwise's profile lines
    /// of those Services give each reconcile's time and its phases.
    async fn row3_reconciles(&mut self, pair: &mut Pair, big: &Group) -> Result<()> {
        let flips = self.knobs.reconcile_flips;
        if flips == 0 {
            return Ok(());
        }
        let k = &self.knobs;
        let stride = k.services * k.pods_per_service + k.big_pods + 500;
        let small = groups("s", 1, k.pods_per_service, stride).remove(0);
        eprintln!(
            "bench: row 3 reconciles: {flips} flips at {} and at {} pods",
            small.pods.len(),
            big.pods.len()
        );
        let before = reconciles_in(&pair.portwise.current_logs()).len();
        for group in [&small, big] {
            // What the slices hold now (row 3's first part left one pod of
            // the big Service NotReady); the victim is one of those.
            let all: BTreeSet<String> = pair
                .portwise_tracker
                .state
                .lock()
                .unwrap()
                .expected
                .get(&group.service)
                .cloned()
                .context("the Service is not tracked")?;
            let (victim, ip) = group
                .pods
                .iter()
                .find(|(_, ip)| all.contains(&ip.to_string()))
                .context("no Ready pod to flip")?;
            for i in 0..flips {
                let ready = i % 2 == 1;
                let mut want = all.clone();
                if !ready {
                    want.remove(&ip.to_string());
                }
                pair.portwise_tracker.expect(&group.service, want);
                pair.portwise_ns.set_ready(victim, ready).await?;
                pair.portwise_tracker
                    .service_converged(&group.service, Duration::from_secs(60))
                    .await?;
                // Apart, so that each flip is a reconcile of its own.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            // Leave it Ready, as found.
            if flips % 2 == 1 {
                pair.portwise_tracker.expect(&group.service, all.clone());
                pair.portwise_ns.set_ready(victim, true).await?;
                pair.portwise_tracker
                    .service_converged(&group.service, Duration::from_secs(60))
                    .await?;
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let ns = pair.portwise_ns.name().to_string();
        let logged = reconciles_in(&pair.portwise.current_logs());
        let label = "3 reconcile cost (one pod flips readiness; portwise's profile lines)";
        let mut detail = format!(
            "Each reconcile of row 3's second part: one pod flips readiness {flips} times in a Service of 10 and in one of 1000 pods, one flip at a time (each waited for in the slices, 100 ms apart), on an otherwise idle controller (row 1's portwise). Times from portwise's `portwise::profile` debug line per reconcile: the reconcile's own time (not its wait for a slot) and its phases: judge (read the caches, decide, run the checkers: podReady here), plan, write (the server-side apply of one slice), finish (metrics and what follows the writes).\n\n| pods | reconciles | mean | p50 | p99 | mean per phase (ms) |\n|---|---|---|---|---|---|\n"
        );
        for group in [&small, big] {
            let rs: Vec<Reconciled> = logged[before.min(logged.len())..]
                .iter()
                .filter(|r| r.namespace == ns && r.service == group.service)
                .cloned()
                .collect();
            let st = ReconcileStats::of(&rs);
            let pods = group.pods.len();
            self.report.row(
                label,
                &format!("reconcile time at {pods} pods, mean / p99 (of {})", st.n),
                format!("{} / {}", ms(st.mean), ms(st.p99)),
                "n/a".into(),
                None,
                Goal::None,
            );
            let _ = writeln!(
                detail,
                "| {pods} | {} | {} | {} | {} | {} |",
                st.n,
                ms(st.mean),
                ms(st.p50),
                ms(st.p99),
                st.phases()
            );
        }
        self.report.section(
            "Row 3: what one reconcile costs at 10 and 1000 pods",
            detail,
        );
        self.row3_write_verbs().await
    }

    /// What a slice write costs the apiserver by verb: server-side apply
    /// (portwise: `force`, the whole slice) against an update with the
    /// object's resourceVersion (the native controller's PUT), on slices of
    /// 10 and 1000 endpoints that nobody else writes, one write at a time,
    /// each flipping one endpoint's readiness.
    async fn row3_write_verbs(&mut self) -> Result<()> {
        let writes = self.knobs.verb_writes;
        if writes == 0 {
            return Ok(());
        }
        eprintln!("bench: row 3 write verbs: {writes} writes each");
        let ns = TestNs::new(self.cp, "bench-verbs").await?;
        let api: Api<EndpointSlice> = ns.api();
        let slice = |name: &str, n: usize, first_ready: bool| -> Result<EndpointSlice> {
            let endpoints: Vec<Value> = (0..n)
                .map(|i| {
                    json!({
                        "addresses": [format!("10.250.{}.{}", i / 250, 1 + i % 250)],
                        "conditions": { "ready": i != 0 || first_ready },
                    })
                })
                .collect();
            Ok(serde_json::from_value(json!({
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": name,
                    "labels": {
                        "kubernetes.io/service-name": "verbs",
                        "endpointslice.kubernetes.io/managed-by": "bench.portwise.io",
                    },
                },
                "addressType": "IPv4",
                "ports": [{ "name": "http", "port": 8080, "protocol": "TCP" }],
                "endpoints": endpoints,
            }))?)
        };
        let mut detail = format!(
            "What one EndpointSlice write costs by verb, on slices nobody else writes: {writes} writes per row, one at a time, each flipping one endpoint's `ready`. Server-side apply as portwise writes (the whole slice, `force`, its field manager) against an update (PUT) of the object last returned, with its resourceVersion, as the native controller writes; and the same for new names: a server-side apply without `force` (portwise's create) against a POST (the native controller's). Latency is the client's round trip; apiserver CPU is its utime+stime over the writes (embedded etcd included), per write.\n\n| endpoints | verb | writes | p50 | p99 | apiserver CPU per write |\n|---|---|---|---|---|---|\n"
        );
        for n in [10usize, 1000] {
            let ssa = format!("ssa-{n}");
            let params = PatchParams::apply("bench-ssa").force();
            api.patch(&ssa, &params, &Patch::Apply(slice(&ssa, n, true)?))
                .await?;
            let put = format!("put-{n}");
            let mut current = api
                .create(&PostParams::default(), &slice(&put, n, true)?)
                .await?;
            let created = PatchParams::apply("bench-ssa");
            for verb in Verb::ALL {
                let mut took = Vec::with_capacity(writes);
                let cpu0 = apiserver_cpu(self.cp);
                for i in 0..writes {
                    let ready = i % 2 == 1;
                    let t = Instant::now();
                    match verb {
                        Verb::Put => {
                            let mut next = slice(&put, n, ready)?;
                            next.metadata = current.metadata.clone();
                            current = api.replace(&put, &PostParams::default(), &next).await?;
                        }
                        Verb::Apply => {
                            api.patch(&ssa, &params, &Patch::Apply(slice(&ssa, n, ready)?))
                                .await?;
                        }
                        Verb::Post => {
                            let name = format!("post-{n}-{i}");
                            api.create(&PostParams::default(), &slice(&name, n, ready)?)
                                .await?;
                        }
                        Verb::ApplyNew => {
                            let name = format!("ssa-{n}-{i}");
                            api.patch(&name, &created, &Patch::Apply(slice(&name, n, ready)?))
                                .await?;
                        }
                    }
                    took.push(t.elapsed().as_secs_f64() * 1000.0);
                }
                let verb = verb.label();
                let cpu = (apiserver_cpu(self.cp) - cpu0) / writes as f64;
                let _ = writeln!(
                    detail,
                    "| {n} | {verb} | {writes} | {} | {} | {} |",
                    ms(pct(&took, 0.5)),
                    ms(pct(&took, 0.99)),
                    ms(cpu * 1000.0),
                );
                self.report.row(
                    "3 write cost by verb (one slice, one write at a time)",
                    &format!("{verb}, {n} endpoints: round trip p50 / apiserver CPU per write"),
                    format!("{} / {}", ms(pct(&took, 0.5)), ms(cpu * 1000.0)),
                    "n/a".into(),
                    None,
                    Goal::None,
                );
            }
        }
        self.report
            .section("Row 3: what a slice write costs by verb", detail);
        Ok(())
    }

    /// Row 5: probes per second against real listeners.
    async fn row5(&mut self) -> Result<()> {
        let n = self.knobs.probe_pods;
        let per = 10;
        let services = n / per;
        eprintln!(
            "bench: row 5 setup: {n} pods with HTTP and TCP listeners, {services} Services per probe kind"
        );
        let ns = TestNs::new(self.cp, "bench-probes").await?;
        self.ensure_nodes(&ns).await?;
        let base =
            2 * (self.knobs.services * self.knobs.pods_per_service + self.knobs.big_pods + 500);
        let gs = groups("p", services, per, base);
        let ctl = groups("ctl", 1, per, base + n + 10);
        // Listeners: every pod answers HTTP on 8080 and accepts TCP on 8443.
        let mut listeners = Vec::new();
        for g in &gs {
            for (_, ip) in &g.pods {
                listeners.push((
                    HttpListener::start(*ip, TARGET_PORT as u16).await?,
                    TcpListener::start(*ip, TCP_PORT as u16).await?,
                ));
            }
        }
        // Per probe kind its own Services over the same pods, told apart by
        // the key portwise is configured with.
        let http_key = "bench.portwise.io/http-group";
        let tcp_key = "bench.portwise.io/tcp-group";
        for g in gs.iter().chain(ctl.iter()) {
            for (key, port_name, port) in
                [(http_key, "http", TARGET_PORT), (tcp_key, "tcp", TCP_PORT)]
            {
                let name = format!("{}-{port_name}", g.service);
                let port_name = if g.service.starts_with("ctl") {
                    "plain"
                } else {
                    port_name
                };
                ns.create_service(service(&name).annotation(key, &g.service).port_to(
                    port_name,
                    80,
                    json!(port),
                ))
                .await?;
            }
        }
        let all: Vec<_> = gs.iter().chain(ctl.iter()).collect();
        let pods: Vec<(usize, &Group, &(String, Ipv4Addr))> = all
            .iter()
            .flat_map(|g| g.pods.iter().map(move |p| (*g, p)))
            .enumerate()
            .map(|(i, (g, p))| (i, g, p))
            .collect();
        let nodes = &self.nodes;
        stream::iter(pods.into_iter().map(Ok::<_, anyhow::Error>))
            .try_for_each_concurrent(self.knobs.setup_concurrency, |(i, g, (name, ip))| {
                let ns = &ns;
                async move {
                    ns.create_pod(
                        pod(name)
                            .annotation(GROUP_KEY, &g.service)
                            .node(&nodes[i % nodes.len()])
                            .ips([ip]),
                    )
                    .await?;
                    Ok(())
                }
            })
            .await?;
        tokio::time::sleep(Duration::from_secs(3)).await;

        let window = self.knobs.probe_window;
        let mut lines = String::from(
            "| probe | maxConcurrentChecks | checks/s | demand (subjects ÷ resyncPeriod) | of which include | \
             portwise CPU (cores) | listeners' CPU (cores) | podReady flip in another Service, seen \
             after |\n|---|---|---|---|---|---|---|---|\n",
        );
        let mut best: BTreeMap<&str, f64> = BTreeMap::new();
        // Worst time for another Service's pod change to show (None: never).
        let mut worst_flip: Option<Option<Duration>> = None;
        for (kind, key, expr) in [
            (
                "httpGet",
                http_key,
                "{httpGet: {path: /healthz, timeout: 1s}}",
            ),
            ("tcpDial", tcp_key, "{tcpDial: {timeout: 1s}}"),
        ] {
            for conc in [16usize, 64, 256] {
                let membership = format!(
                    "{{perPort: {{ports: {{http: {expr}, tcp: {expr}}}, fallback: podReady}}}}"
                );
                let config = format!(
                    "managedBy: {PORTWISE_MANAGER}\n\
                     serviceKey: {{annotation: {key}}}\n\
                     podKey: {{annotation: {GROUP_KEY}}}\n\
                     resyncPeriod: 100ms\n\
                     maxConcurrentChecks: {conc}\n\
                     membership: {membership}\n"
                );
                let tag = format!("probes-{kind}-{conc}");
                let mut pw =
                    spawn_portwise(self.cp, &self.work, &tag, &config, &[ns.name()], &[]).await?;
                // Warm up: every Service published once.
                let t = Instant::now();
                loop {
                    pw.check_alive()?;
                    let published = scrape(&pw, "portwise_slices_managed").await.unwrap_or(0.0);
                    if published >= (services + 1) as f64 || t.elapsed() > Duration::from_secs(120)
                    {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                tokio::time::sleep(Duration::from_secs(3)).await;
                let c0 = scrape(&pw, "portwise_checks_total").await?;
                let i0 = scrape(&pw, "portwise_checks_total{decision=\"include\"").await?;
                let u0 = pw.usage();
                let me0 = usage(std::process::id()).unwrap_or_default();
                let t0 = Instant::now();
                // Half-way, flip a pod of the podReady-only Service and time
                // until its slice shows it: checks must not hold it up.
                tokio::time::sleep(window / 2).await;
                let ctl_svc = format!(
                    "{}-{}",
                    ctl[0].service,
                    if kind == "httpGet" { "http" } else { "tcp" }
                );
                let (victim, _) = &ctl[0].pods[0];
                let flip = Instant::now();
                ns.set_ready(victim, false).await?;
                let mut seen = None;
                while flip.elapsed() < Duration::from_secs(30) {
                    let slices = ns
                        .api::<EndpointSlice>()
                        .list(
                            &kube::api::ListParams::default()
                                .labels(&format!("{SERVICE_NAME_LABEL}={ctl_svc}")),
                        )
                        .await?;
                    let n: usize = slices
                        .items
                        .iter()
                        .map(|s| s.endpoints.as_ref().map_or(0, Vec::len))
                        .sum();
                    if n == per - 1 {
                        seen = Some(flip.elapsed());
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                ns.set_ready(victim, true).await?;
                let rest = window.saturating_sub(t0.elapsed());
                tokio::time::sleep(rest).await;
                let c1 = scrape(&pw, "portwise_checks_total").await?;
                let i1 = scrape(&pw, "portwise_checks_total{decision=\"include\"").await?;
                let el = t0.elapsed().as_secs_f64();
                let u1 = pw.usage();
                let me1 = usage(std::process::id()).unwrap_or_default();
                pw.check_alive()?;
                stop_portwise(&mut pw).await;
                let rate = (c1 - c0) / el;
                worst_flip = Some(match (worst_flip, seen) {
                    (None, s) => s,
                    (Some(None), _) | (_, None) => None,
                    (Some(Some(a)), Some(b)) => Some(a.max(b)),
                });
                let incl = if c1 > c0 { (i1 - i0) / (c1 - c0) } else { 0.0 };
                let e = best.entry(kind).or_default();
                *e = e.max(rate);
                let _ = writeln!(
                    lines,
                    "| {kind} | {conc} | {rate:.0} | {:.0} | {:.1}% | {:.2} | {:.2} | {} |",
                    (services * per + per) as f64 / 0.1,
                    incl * 100.0,
                    (u1.cpu - u0.cpu) / el,
                    (me1.cpu - me0.cpu) / el,
                    seen.map(|d| format!("{:.0} ms", d.as_secs_f64() * 1000.0))
                        .unwrap_or_else(|| "not within 30 s".into())
                );
                eprintln!("bench:   {kind} maxConcurrentChecks={conc}: {rate:.0} checks/s");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
        let total_listeners = listeners.len();
        drop(listeners);
        for (kind, rate) in &best {
            self.report.row(
                "5 probes (sustained, real listeners in the netns)",
                &format!("{kind} checks per second (best maxConcurrentChecks)"),
                format!("{rate:.0}/s"),
                "n/a (no probes)".into(),
                None,
                Goal::Stated("≥ 5000/s", *rate >= 5000.0),
            );
        }
        if let Some(w) = worst_flip {
            self.report.row(
                "5 probes (sustained, real listeners in the netns)",
                "a pod change in another (podReady) Service while probes saturate: slice updated after (worst run)",
                w.map(|d| format!("{:.0} ms", d.as_secs_f64() * 1000.0))
                    .unwrap_or_else(|| "not within 30 s".into()),
                "n/a".into(),
                None,
                Goal::Stated("no delay (< 1 s)", w.is_some_and(|d| d < Duration::from_secs(1))),
            );
        }
        self.report.section(
            "Row 5: probes in detail",
            format!(
                "{services} Services × {per} pods per probe kind, over {total_listeners} pods, each with a real HTTP \
                 listener on :8080 and a TCP listener on :8443 at its pod address (in the bench's \
                 own process, on the same 2 cores; the bench's own CPU is almost all theirs while it \
                 waits). `resyncPeriod: 100ms` sets the demand: every subject is due again 100 ms \
                 after its Service's last reconcile; a rate well below the demand is portwise's \
                 capacity on this machine, one close to it is bound by the demand. Rate = growth of \
                 `portwise_checks_total` over {}. One extra podReady-only Service (10 pods) shares \
                 the controller: half-way through, one of its pods turns NotReady and the time until \
                 its slice shows it is the last column.\n\n{lines}",
                secs(window)
            ),
        );
        Ok(())
    }

    /// Row 6: WebAssembly decision overhead and restart with cached modules.
    async fn row6(&mut self) -> Result<()> {
        // (a) the WebAssembly issue's own benchmark, if ./bench built it.
        match std::env::var_os("BENCH_WASM_OVERHEAD_BIN").map(PathBuf::from) {
            Some(bin) if bin.is_file() => {
                eprintln!("bench: row 6: running {}", bin.display());
                let out = tokio::process::Command::new(&bin)
                    .arg("--bench")
                    .env(
                        "BENCH_CALLS",
                        std::env::var("BENCH_CALLS").unwrap_or_else(|_| "2000".into()),
                    )
                    .output()
                    .await?;
                let text = String::from_utf8_lossy(&out.stdout).to_string();
                if out.status.success() {
                    self.report.row(
                        "6 WASM",
                        "decision overhead per guest language",
                        "see the table below".into(),
                        "n/a".into(),
                        None,
                        Goal::None,
                    );
                    self.report.section(
                        "Row 6: WebAssembly decision overhead (host/wasm/benches/wasm_overhead.rs)",
                        text,
                    );
                } else {
                    let err = String::from_utf8_lossy(&out.stderr);
                    self.report.not_measured(
                        "6 WASM",
                        "decision overhead per guest language",
                        &format!(
                            "wasm_overhead failed ({}): {}",
                            out.status,
                            err.lines().last().unwrap_or("")
                        ),
                    );
                }
            }
            _ => self.report.not_measured(
                "6 WASM",
                "decision overhead per guest language",
                "the wasm_overhead bench was not built (BENCH_WASM_OVERHEAD_BIN unset)",
            ),
        }

        // (b) restart to first decision with 10 cached modules.
        let guests = portwise_tests::guests_dir();
        let python = guests.join("python-tier-check.wasm");
        if !python.is_file() {
            self.report.not_measured(
                "6 WASM",
                "restart to first decision, 10 cached modules",
                &format!("{} is missing (guests/build python)", python.display()),
            );
            return Ok(());
        }
        let others: Vec<PathBuf> = [
            "admin-check",
            "ready-role",
            "js-drain-check",
            "c-port-names",
        ]
        .iter()
        .map(|n| guests.join(format!("{n}.wasm")))
        .filter(|p| p.is_file())
        .collect();
        if others.is_empty() {
            self.report.not_measured(
                "6 WASM",
                "restart to first decision, 10 cached modules",
                "no other guests built",
            );
            return Ok(());
        }
        let modules = self.work.join("modules");
        std::fs::create_dir_all(&modules)?;
        std::fs::copy(&python, modules.join("python-tier-check.wasm"))?;
        let mut names = vec!["python-tier-check (Python)".to_string()];
        for i in 0..9 {
            let src = &others[i % others.len()];
            let stem = src.file_stem().unwrap().to_string_lossy().to_string();
            std::fs::copy(src, modules.join(format!("{stem}-{i}.wasm")))?;
            names.push(stem);
        }
        let ns = TestNs::new(self.cp, "bench-wasm").await?;
        self.ensure_nodes(&ns).await?;
        let ip = pod_ip(
            2 * (self.knobs.services * self.knobs.pods_per_service + self.knobs.big_pods + 500)
                + self.knobs.probe_pods
                + 100,
        );
        let _http = HttpListener::start(ip, TARGET_PORT as u16).await?;
        ns.create_service(service("w").annotation(GROUP_KEY, "w").port_to(
            "http",
            80,
            json!(TARGET_PORT),
        ))
        .await?;
        ns.create_pod(
            pod("w-0")
                .annotation(GROUP_KEY, "w")
                .label("tier", "frontend")
                .node(&self.nodes[0])
                .ips([ip]),
        )
        .await?;
        let cache = self.work.join("wasm-cache");
        let wasm_config = format!("modulesDir: {}\n", modules.display());
        let membership = "{perPort: {ports: {http: {wasm: {module: python-tier-check.wasm, config: {tiers: [frontend]}}}}, fallback: exclude}}";
        let cache_arg = cache.display().to_string();
        let mut times = Vec::new();
        for (run, cfg) in [
            (
                "cold (empty code cache)",
                portwise_config(&wasm_config, membership),
            ),
            (
                "restart (10 cached modules)",
                portwise_config(&wasm_config, membership),
            ),
            (
                "restart, podReady only (no modules)",
                portwise_config("", "podReady"),
            ),
        ] {
            let mut pw = spawn_portwise(
                self.cp,
                &self.work,
                &format!("wasm-{}", times.len()),
                &cfg,
                &[ns.name()],
                &["--cache-dir", &cache_arg],
            )
            .await?;
            let t0 = pw.started_at();
            let mut first_check = None;
            let mut first_slice = None;
            while t0.elapsed() < Duration::from_secs(300) {
                pw.check_alive()?;
                if first_check.is_none()
                    && scrape(&pw, "portwise_checks_total").await.unwrap_or(0.0) >= 1.0
                {
                    first_check = Some(t0.elapsed());
                }
                if first_check.is_some() {
                    let s = ns.api::<EndpointSlice>().list(&Default::default()).await?;
                    let published = s.items.iter().any(|s| {
                        s.labels().get(MANAGED_BY_LABEL).map(String::as_str)
                            == Some(PORTWISE_MANAGER)
                            && s.endpoints
                                .iter()
                                .flatten()
                                .any(|e| e.addresses.contains(&ip.to_string()))
                            && s.metadata.creation_timestamp.is_some()
                    });
                    // After the first run the slice already exists: count the
                    // decision alone then.
                    if published {
                        first_slice = Some(t0.elapsed());
                        break;
                    }
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            stop_portwise(&mut pw).await;
            times.push((run, first_check, first_slice));
        }
        let fmt = |d: Option<Duration>| {
            d.map(|d| format!("{:.2} s", d.as_secs_f64()))
                .unwrap_or_else(|| "—".into())
        };
        let mut body = format!(
            "modulesDir holds 10 modules: {}. Each row starts the release binary; times are from \
             the spawn to the first membership check counted on `/metrics` (polled every 10 ms) and \
             to the slice holding the pod (the slice may already exist from the previous run). The \
             Service's one port is decided by the Python guest.\n\n| run | first decision | slice has the pod |\n|---|---|---|\n",
            names.join(", ")
        );
        for (run, c, s) in &times {
            let _ = writeln!(body, "| {run} | {} | {} |", fmt(*c), fmt(*s));
        }
        self.report
            .section("Row 6: restart to first decision", body);
        let restart = times[1].1;
        let base = times[2].1;
        self.report.row(
            "6 WASM",
            "restart to first decision, 10 cached modules (one Python)",
            fmt(restart),
            "n/a".into(),
            None,
            match restart {
                Some(d) => Goal::Stated("< 1 s", d < Duration::from_secs(1)),
                None => Goal::None,
            },
        );
        self.report.row(
            "6 WASM",
            "same restart without modules (podReady), for scale",
            fmt(base),
            "n/a".into(),
            restart
                .zip(base)
                .and_then(|(a, b)| ratio(a.as_secs_f64(), b.as_secs_f64())),
            Goal::None,
        );
        Ok(())
    }

    fn row7(&mut self) {
        let text = std::env::var("BENCH_GO_LIBRARY").unwrap_or_default();
        let served = !text.is_empty() && !text.contains("\"Error\"");
        let what = if text.is_empty() {
            "not tried (./bench records the one try in $PORTWISE_CACHE/bench/go-library.txt)"
                .to_string()
        } else if served {
            "served; running its example controller is not implemented in this harness yet"
                .to_string()
        } else {
            let when = text
                .lines()
                .next()
                .unwrap_or("")
                .trim_start_matches("tried: ");
            format!(
                "not served by the Go module proxy (tried once, {when}: `go mod download` of \
                 `github.com/redpanda-data/common-go/portmapper@latest` and of \
                 `github.com/redpanda-data/common-go@latest` both answered 403 \"This module \
                 version is not available\"), so there is no third column"
            )
        };
        self.report.row(
            "7 Go library (portmapper)",
            "third column",
            what,
            String::new(),
            None,
            Goal::None,
        );
        if !text.is_empty() {
            self.report
                .section("Row 7: the one try", format!("```\n{}\n```", text.trim()));
        }
    }
}

// ---- row 8: pod change to data path ----------------------------------------------------------

/// What one new connection through a row-8 ClusterIP met.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reach {
    /// Answered by the flipped pod, the only one on kube-proxy's node.
    Victim,
    /// Answered by another pod: never expected (`internalTrafficPolicy: Local`).
    Other,
    /// Refused: kube-proxy rejects a Service without any endpoint.
    Refused,
    /// The SYN went unanswered for [`DROPPED_AFTER`]: kube-proxy drops
    /// ClusterIP traffic of a `Local` Service without a local endpoint.
    Dropped,
    /// Anything else (a reset, an empty or slow reply).
    Failed,
}

/// A local SYN is answered within microseconds; a dropped one is only
/// retransmitted after 1 s.
const DROPPED_AFTER: Duration = Duration::from_millis(250);
/// One new connection this often while a flip is timed.
const PROBE_EVERY: Duration = Duration::from_millis(1);
/// A flip is routed once this many consecutive probes (by start) meet the
/// new rules.
const SETTLED_RUN: usize = 100;
/// The pause after a routed flip: kube-proxy's sync runner waits
/// `minSyncPeriod` (1 s by default) after a sync before it starts the next,
/// so a flip sooner than that would time kube-proxy's rate limit.
const FLIP_GAP: Duration = Duration::from_millis(1500);

async fn reach(addr: SocketAddr, victim: &str) -> Reach {
    let mut s = match tokio::time::timeout(DROPPED_AFTER, TcpStream::connect(addr)).await {
        Err(_) => return Reach::Dropped,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => return Reach::Refused,
        Ok(Err(_)) => return Reach::Failed,
        Ok(Ok(s)) => s,
    };
    let mut buf = Vec::new();
    match tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut buf)).await {
        Ok(Ok(_)) if String::from_utf8_lossy(&buf).trim() == victim => Reach::Victim,
        Ok(Ok(_)) => Reach::Other,
        _ => Reach::Failed,
    }
}

/// Where a row-8 prober runs: in the bench process (kube-proxy translates
/// every process of the namespace), or as a child process moved into a
/// cgroup first (Cilium's socket LB translates only the processes of its
/// cgroup, and a cgroup holds processes, not threads).
#[derive(Clone, Debug)]
enum ProbeFrom {
    Bench,
    Cgroup(PathBuf),
}

/// CLOCK_MONOTONIC in nanoseconds: what `Instant` reads on Linux, and the
/// same clock in every process, so the child prober's times can be put on
/// the bench's own `Instant`s.
fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// An `Instant` and the monotonic clock read together, to convert between
/// the two.
#[derive(Clone, Copy)]
struct ClockBase {
    at: Instant,
    ns: u64,
}

impl ClockBase {
    fn now() -> Self {
        Self {
            at: Instant::now(),
            ns: mono_ns(),
        }
    }
    fn to_ns(self, t: Instant) -> u64 {
        self.ns + t.saturating_duration_since(self.at).as_nanos() as u64
    }
    fn to_instant(self, ns: u64) -> Instant {
        if ns >= self.ns {
            self.at + Duration::from_nanos(ns - self.ns)
        } else {
            self.at - Duration::from_nanos(self.ns - ns)
        }
    }
}

type Record = Arc<dyn Fn(Instant, Reach) + Send + Sync>;

/// Opens a new connection to `addr` every [`PROBE_EVERY`], each on its own
/// task (a dropped SYN must not hold up the next probe), and records when
/// each called `connect` and what it met, until `stop`.
fn probe_loop(
    addr: SocketAddr,
    victim: Arc<str>,
    stop: Arc<AtomicBool>,
    in_flight: Arc<AtomicUsize>,
    record: Record,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(PROBE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            // At most DROPPED_AFTER / PROBE_EVERY wait on dropped
            // SYNs; the bound only guards against a stalled runtime.
            if in_flight.load(Ordering::Relaxed) > 2000 {
                continue;
            }
            in_flight.fetch_add(1, Ordering::Relaxed);
            let (record, in_flight, victim) = (record.clone(), in_flight.clone(), victim.clone());
            tokio::spawn(async move {
                let at = Instant::now();
                let r = reach(addr, &victim).await;
                record(at, r);
                in_flight.fetch_sub(1, Ordering::Relaxed);
            });
        }
    })
}

/// `bench --probe ADDR VICTIM`: the prober as a process of its own, which
/// the bench starts inside Cilium's cgroup (row 10). Prints one line per
/// probe, `<CLOCK_MONOTONIC ns at connect> <Reach>`, until its stdin
/// closes, then waits for the probes in flight.
fn probe_main(addr: &str, victim: &str) -> ExitCode {
    let Ok(addr) = addr.parse::<SocketAddr>() else {
        eprintln!("bench --probe: not an address: {addr}");
        return ExitCode::from(2);
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("tokio runtime");
    rt.block_on(async {
        let base = ClockBase::now();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(u64, Reach)>();
        let stop = Arc::new(AtomicBool::new(false));
        let in_flight = Arc::new(AtomicUsize::new(0));
        let record: Record = Arc::new(move |at, r| {
            let _ = tx.send((base.to_ns(at), r));
        });
        let task = probe_loop(addr, victim.into(), stop.clone(), in_flight.clone(), record);
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let mut out = tokio::io::stdout();
            while let Some((ns, r)) = rx.recv().await {
                if out
                    .write_all(format!("{ns} {r:?}\n").as_bytes())
                    .await
                    .is_err()
                {
                    break;
                }
                let _ = out.flush().await;
            }
        });
        let mut stdin = tokio::io::stdin();
        let mut buf = [0u8; 64];
        while matches!(stdin.read(&mut buf).await, Ok(n) if n > 0) {}
        stop.store(true, Ordering::Relaxed);
        let _ = task.await;
        let deadline = Instant::now() + Duration::from_secs(5);
        while in_flight.load(Ordering::Relaxed) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Every sender (the loop's tasks) is gone: the writer drains and ends.
        let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
    });
    ExitCode::SUCCESS
}

fn parse_reach(s: &str) -> Option<Reach> {
    Some(match s {
        "Victim" => Reach::Victim,
        "Other" => Reach::Other,
        "Refused" => Reach::Refused,
        "Dropped" => Reach::Dropped,
        "Failed" => Reach::Failed,
        _ => return None,
    })
}

/// New connections to a ClusterIP, one every [`PROBE_EVERY`] (see
/// [`probe_loop`]), from the bench process or from a child in a cgroup
/// ([`ProbeFrom`]), with a log of when each called `connect` and what it met.
struct Prober {
    log: Arc<Mutex<Vec<(Instant, Reach)>>>,
    in_flight: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
    /// The child prober (cgroup), its stdin kept open until `finish`.
    child: Option<(Child, tokio::process::ChildStdin)>,
}

impl Prober {
    fn start(addr: SocketAddr, victim: &str, from: &ProbeFrom) -> Result<Self> {
        let log = Arc::new(Mutex::new(Vec::new()));
        let in_flight = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (task, child) = match from {
            ProbeFrom::Bench => {
                let log = log.clone();
                let record: Record = Arc::new(move |at, r| log.lock().unwrap().push((at, r)));
                let task = probe_loop(addr, victim.into(), stop.clone(), in_flight.clone(), record);
                (task, None)
            }
            ProbeFrom::Cgroup(cgroup) => {
                // `sh` moves itself into the cgroup, then execs the prober,
                // which inherits it (as tests/src/cilium.rs's client does).
                let mut child = tokio::process::Command::new("sh")
                    .arg("-c")
                    .arg(r#"echo $$ >"$0" || exit 97; exec "$@""#)
                    .arg(cgroup.join("cgroup.procs"))
                    .arg(std::env::current_exe()?)
                    .args(["--probe", &addr.to_string(), victim])
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .kill_on_drop(true)
                    .spawn()
                    .context("starting the prober in Cilium's cgroup")?;
                let stdin = child.stdin.take().context("the prober's stdin")?;
                let stdout = child.stdout.take().context("the prober's stdout")?;
                let base = ClockBase::now();
                let log = log.clone();
                let task = tokio::spawn(async move {
                    use tokio::io::AsyncBufReadExt;
                    let mut lines = tokio::io::BufReader::new(stdout).lines();
                    while let Ok(Some(line)) = lines.next_line().await {
                        let parsed = line.split_once(' ').and_then(|(ns, r)| {
                            Some((base.to_instant(ns.parse().ok()?), parse_reach(r)?))
                        });
                        match parsed {
                            Some(p) => log.lock().unwrap().push(p),
                            None => eprintln!("bench: the prober printed {line:?}"),
                        }
                    }
                });
                (task, Some((child, stdin)))
            }
        };
        Ok(Self {
            log,
            in_flight,
            stop,
            task,
            child,
        })
    }

    /// The probes finished so far, by start.
    fn completed(&self) -> Vec<(Instant, Reach)> {
        let mut v = self.log.lock().unwrap().clone();
        v.sort_by_key(|p| p.0);
        v
    }

    /// Waits until the last [`SETTLED_RUN`] finished probes (by start) all
    /// started after `since` and met one of `want`.
    async fn settled(&self, want: &[Reach], since: Instant, within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let v = self.completed();
            if v.len() >= SETTLED_RUN
                && v[v.len() - SETTLED_RUN..]
                    .iter()
                    .all(|(at, r)| want.contains(r) && *at >= since)
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                let mut seen: BTreeMap<String, usize> = BTreeMap::new();
                for (_, r) in v.iter().rev().take(200) {
                    *seen.entry(format!("{r:?}")).or_default() += 1;
                }
                bail!(
                    "probes did not settle to {want:?} within {within:?}; the last 200: {seen:?}"
                );
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Stops probing and returns every probe, once the last has finished.
    async fn finish(mut self) -> Vec<(Instant, Reach)> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some((mut child, stdin)) = self.child.take() {
            // EOF on its stdin stops the child; it prints its last probes
            // and exits, which ends the reader.
            drop(stdin);
            let _ = tokio::time::timeout(Duration::from_secs(15), &mut self.task).await;
            let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
            return self.completed();
        }
        let _ = (&mut self.task).await;
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.in_flight.load(Ordering::Relaxed) > 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.completed()
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        // A flip that failed drops its prober unfinished: stop its loop.
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// One row-8 flip, in milliseconds from just before the status PATCH was
/// sent.
struct Flip {
    ready: bool,
    /// The PATCH returned.
    patch: f64,
    /// The bench's own watch saw the Service's slices right.
    slice: f64,
    /// The first probe after which every probe met the new rules.
    routed: f64,
    /// From the last probe that met the old rules to `routed`: the rules
    /// changed in between.
    bracket: f64,
    /// Probes out of order: neither state, or the new one before the last
    /// old one (a probe delayed past [`DROPPED_AFTER`], for instance).
    anomalies: usize,
}

/// One Service of row 8 and how to flip it.
struct DpSide<'a> {
    client: &'static str,
    ns: &'a TestNs,
    tracker: &'a Tracker,
    service: String,
    addr: SocketAddr,
    victim: String,
    victim_ip: String,
    all: BTreeSet<String>,
    /// What a connection meets while the victim is no member: kube-proxy
    /// drops the SYN (a `Local` Service without a local endpoint); Cilium's
    /// socket LB fails the `connect` itself.
    gone: &'static [Reach],
    from: ProbeFrom,
}

/// Flips the victim's readiness and times it: the slice by the bench's
/// watch, the data path by connections through the ClusterIP.
async fn datapath_flip(side: &DpSide<'_>, ready: bool) -> Result<Flip> {
    let (old, new): (&[Reach], &[Reach]) = if ready {
        (side.gone, &[Reach::Victim])
    } else {
        (&[Reach::Victim], side.gone)
    };
    let prober = Prober::start(side.addr, &side.victim, &side.from)?;
    // The old rules must hold when the flip starts.
    prober
        .settled(old, Instant::now(), Duration::from_secs(30))
        .await
        .with_context(|| format!("{}: before the flip", side.client))?;
    let mut want = side.all.clone();
    if !ready {
        want.remove(&side.victim_ip);
    }
    side.tracker.expect(&side.service, want);
    let t0 = Instant::now();
    side.ns.set_ready(&side.victim, ready).await?;
    let patched = Instant::now();
    let (slice, routed) = tokio::join!(
        side.tracker
            .service_converged(&side.service, Duration::from_secs(60)),
        prober.settled(new, t0, Duration::from_secs(60)),
    );
    let log = prober.finish().await;
    let slice = slice.with_context(|| format!("{}: the slice", side.client))?;
    routed.with_context(|| format!("{}: the data path", side.client))?;
    let last_old = log
        .iter()
        .filter(|(_, r)| old.contains(r))
        .map(|p| p.0)
        .max();
    let first_new = log
        .iter()
        .filter(|(at, r)| new.contains(r) && last_old.is_none_or(|l| *at > l))
        .map(|p| p.0)
        .min()
        .context("no probe met the new rules")?;
    if first_new <= t0 {
        bail!("{}: the new rules answered before the flip", side.client);
    }
    let anomalies = log
        .iter()
        .filter(|(at, r)| {
            (!old.contains(r) && !new.contains(r))
                || (new.contains(r) && last_old.is_some_and(|l| *at < l))
        })
        .count();
    let ms = |t: Instant| t.saturating_duration_since(t0).as_secs_f64() * 1000.0;
    Ok(Flip {
        ready,
        patch: ms(patched),
        slice: ms(slice),
        routed: ms(first_new),
        bracket: last_old
            .map(|l| first_new.saturating_duration_since(l).as_secs_f64() * 1000.0)
            .unwrap_or(f64::NAN),
        anomalies,
    })
}

/// Nearest-rank percentile (`p` in 0..=1) of `xs`.
fn pct(xs: &[f64], p: f64) -> f64 {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let i = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

/// Bootstrap rounds behind [`ratio_interval`]: enough that its 2.5th and
/// 97.5th percentiles move by less than the table's two decimals.
const BOOTSTRAP_ROUNDS: usize = 4000;

/// The 95 % interval of a flip row's ratio: portwise ÷ native of the
/// median over runs of each run's `p` percentile, the table's own figure.
/// A bootstrap: each round resamples every run's flip pairs (a portwise
/// flip and the native flip of the same turn, which met the machine in the
/// same state) with replacement and computes the ratio again. It says how
/// far the ratio moves from the flips' own spread alone, so a ratio past
/// its goal can be told from one that noise puts there. A fixed seed: the
/// same flips give the same interval.
fn ratio_interval(runs: &[Vec<(f64, f64)>], p: f64, rounds: usize) -> Option<(f64, f64)> {
    if runs.is_empty() || runs.iter().any(|r| r.is_empty()) {
        return None;
    }
    let mut rng = fastrand::Rng::with_seed(0x5eed);
    let mut ratios = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for pairs in runs {
            let (pw, nat): (Vec<f64>, Vec<f64>) = (0..pairs.len())
                .map(|_| pairs[rng.usize(..pairs.len())])
                .unzip();
            a.push(pct(&pw, p));
            b.push(pct(&nat, p));
        }
        ratios.extend(ratio(median_of(&a), median_of(&b)));
    }
    (ratios.len() == rounds).then(|| (pct(&ratios, 0.025), pct(&ratios, 0.975)))
}

fn ms(x: f64) -> String {
    if x.is_nan() {
        "—".into()
    } else if x.abs() < 10.0 {
        format!("{x:.1} ms")
    } else {
        format!("{x:.0} ms")
    }
}

/// A flip row's detail: per controller and direction, the PATCH, the
/// slice, the routing and the data path's part, p50 / p99.
fn flip_table(results: &[Vec<Flip>; 2], path: &str) -> String {
    let [nat, pw] = results;
    let routed = |f: &Flip| f.routed;
    let slice = |f: &Flip| f.slice;
    let path_part = |f: &Flip| f.routed - f.slice;
    let mut table = format!(
        "| controller | flip | flips | PATCH returned, p50 | slice seen, p50 / p99 | routed, p50 / p99 | {path} part (routed − slice), p50 / p99 | bracket, p50 / max | probes out of order |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for (client, v) in [("portwise", pw), ("native", nat)] {
        for (dir, sel) in [
            ("→ NotReady", Some(false)),
            ("→ Ready", Some(true)),
            ("all", None),
        ] {
            let v: Vec<&Flip> = v
                .iter()
                .filter(|f| sel.is_none_or(|r| f.ready == r))
                .collect();
            let c = |f: fn(&Flip) -> f64| v.iter().map(|x| f(x)).collect::<Vec<f64>>();
            let two = |xs: Vec<f64>| format!("{} / {}", ms(pct(&xs, 0.5)), ms(pct(&xs, 0.99)));
            let _ = writeln!(
                table,
                "| {client} | {dir} | {} | {} | {} | {} | {} | {} / {} | {} |",
                v.len(),
                ms(pct(&c(|f| f.patch), 0.5)),
                two(c(slice)),
                two(c(routed)),
                two(c(path_part)),
                ms(pct(&c(|f| f.bracket), 0.5)),
                ms(pct(&c(|f| f.bracket), 1.0)),
                v.iter().map(|f| f.anomalies).sum::<usize>(),
            );
        }
    }
    table
}

/// The data path a flip row times: kube-proxy (row 8), or Cilium's
/// socket LB (row 10).
#[derive(Clone, Copy)]
enum DataPath<'a> {
    KubeProxy(&'a KubeProxy),
    Cilium(&'a CiliumAgent),
}

impl DataPath<'_> {
    /// The Node whose pods the data path routes to (`internalTrafficPolicy:
    /// Local`).
    fn node(self) -> &'static str {
        match self {
            DataPath::KubeProxy(_) => PROXY_NODE,
            DataPath::Cilium(_) => CILIUM_NODE,
        }
    }
    fn probe_from(self) -> ProbeFrom {
        match self {
            DataPath::KubeProxy(_) => ProbeFrom::Bench,
            DataPath::Cilium(agent) => ProbeFrom::Cgroup(agent.cgroup().to_path_buf()),
        }
    }
    /// What a connection meets while the Service has no local member.
    fn gone(self) -> &'static [Reach] {
        match self {
            DataPath::KubeProxy(_) => &[Reach::Dropped],
            // Socket LB decides at `connect()`: no SYN is sent, the call
            // fails; which errno is Cilium's business, not the bench's.
            DataPath::Cilium(_) => &[Reach::Refused, Reach::Dropped, Reach::Failed],
        }
    }
    async fn expect_answers(self, addr: SocketAddr, pods: &[&str]) -> Result<()> {
        let within = Duration::from_secs(60);
        match self {
            DataPath::KubeProxy(_) => expect_answers(addr, pods, within).await.map(drop),
            DataPath::Cilium(agent) => agent.expect_answers(addr, pods, within).await.map(drop),
        }
    }
    fn name(self) -> &'static str {
        match self {
            DataPath::KubeProxy(_) => "kube-proxy",
            DataPath::Cilium(_) => "Cilium",
        }
    }
}

/// What a flip row measured, for its report.
struct FlipRun {
    /// Native's flips, then portwise's.
    results: [Vec<Flip>; 2],
    requests: Requests,
    services: usize,
    /// kube-proxy's IPv4 syncs during the flips, and their seconds (row 8).
    syncs: Option<(f64, f64)>,
    /// portwise's reconciles of its Service during the flips (its profile
    /// lines).
    profile: Vec<Reconciled>,
}

impl Bench {
    /// Row 8: from a pod's readiness flip to kube-proxy routing by it, one
    /// kube-proxy for a native and a portwise Service of the same shape.
    async fn row8(&mut self) -> Result<()> {
        let flips = self.knobs.datapath_flips.max(2);
        let per = self.knobs.pods_per_service.max(2);
        eprintln!(
            "bench: row 8: kube-proxy (nftables), two Services × {per} pods, {flips} flips each"
        );
        // kube-proxy first: it creates its Node, and the native controller
        // leaves out a pod whose Node it does not know.
        let proxy = KubeProxy::start(self.cp, ProxyMode::Nftables).await?;
        let mut runs = Vec::new();
        for run in 1..=self.knobs.datapath_runs {
            eprintln!("bench: row 8 run {run} of {}", self.knobs.datapath_runs);
            match self
                .flip_row(DataPath::KubeProxy(&proxy), flips, per, run)
                .await
            {
                Ok(r) => runs.push(r),
                Err(e) => {
                    eprintln!("bench: row 8: kube-proxy's log ends:\n{}", proxy.log_tail());
                    return Err(e);
                }
            }
        }
        self.row8_report(flips, per, &runs);
        Ok(())
    }

    /// Row 10: row 8 with Cilium's agent (kube-proxy replacement, socket
    /// LB; tests/src/cilium.rs) as the data path instead of kube-proxy.
    async fn row10(&mut self) -> Result<()> {
        let flips = self.knobs.datapath_flips.max(2);
        let per = self.knobs.pods_per_service.max(2);
        eprintln!(
            "bench: row 10: Cilium (socket LB), two Services × {per} pods, {flips} flips each"
        );
        // Like kube-proxy, the agent creates its Node before any pod is
        // placed on it.
        let agent = CiliumAgent::start(self.cp).await?;
        let res = self.flip_row(DataPath::Cilium(&agent), flips, per, 1).await;
        match res {
            Ok(run) => {
                self.row10_report(flips, per, &run, agent.ready_after);
                Ok(())
            }
            Err(e) => {
                eprintln!("bench: row 10: the agent's log ends:\n{}", agent.log_tail());
                Err(e)
            }
        }
    }

    /// Rows 8 and 10: a native and a portwise Service of the same shape,
    /// their node-local pod's readiness flipped in turns, each flip timed
    /// until `path` routes by it.
    async fn flip_row(
        &mut self,
        path: DataPath<'_>,
        flips: usize,
        per: usize,
        run: usize,
    ) -> Result<FlipRun> {
        let (native_prefix, portwise_prefix, row_id) = match path {
            DataPath::KubeProxy(_) => ("bench-dp-native", "bench-dp-portwise", "row8"),
            DataPath::Cilium(_) => ("bench-cilium-native", "bench-cilium-portwise", "row10"),
        };
        let native_ns = TestNs::new(self.cp, native_prefix).await?;
        let portwise_ns = TestNs::new(self.cp, portwise_prefix).await?;
        self.ensure_nodes(&native_ns).await?;
        let base = 2
            * (self.knobs.services * self.knobs.pods_per_service + self.knobs.big_pods + 500)
            + self.knobs.probe_pods
            + 200
            // Row 10's pods after row 8's, whose servers are gone but whose
            // pods and slices may still be held.
            + if matches!(path, DataPath::Cilium(_)) { 2 * per } else { 0 };
        let ng = groups("dp", 1, per, base).remove(0);
        let pg = groups("dp", 1, per, base + per).remove(0);
        let mut servers = Vec::new();
        for (ns, kind, g) in [
            (&native_ns, Kind::Native, &ng),
            (&portwise_ns, Kind::Portwise, &pg),
        ] {
            let svc = service(&g.service)
                .port_to("http", 80, json!(TARGET_PORT))
                .internal_traffic_policy("Local");
            let svc = match kind {
                Kind::Native => svc.selector(APP_LABEL, &g.service),
                Kind::Portwise | Kind::Cost => svc.annotation(GROUP_KEY, &g.service),
            };
            ns.create_service(svc).await?;
            for (j, (name, ip)) in g.pods.iter().enumerate() {
                // Pod 0 on the data path's node, the others one per bench
                // Node.
                let node = if j == 0 {
                    path.node().to_string()
                } else {
                    self.nodes[j % self.nodes.len()].clone()
                };
                ns.create_pod(
                    pod(name)
                        .label(APP_LABEL, &g.service)
                        .annotation(GROUP_KEY, &g.service)
                        .node(&node)
                        .ips([ip]),
                )
                .await?;
                servers.push(NameServer::start(name, IpAddr::V4(*ip), TARGET_PORT as u16).await?);
            }
        }
        let native_tracker = Tracker::start(
            &native_ns,
            NATIVE_MANAGER,
            expected_of(std::slice::from_ref(&ng)),
        );
        let portwise_tracker = Tracker::start(
            &portwise_ns,
            PORTWISE_MANAGER,
            expected_of(std::slice::from_ref(&pg)),
        );
        // Both controllers as rows 1 and 3 run them: the controller-manager
        // with its recorded argv, portwise with row 1's config and flags.
        let mut native = self.bcp.spawn_cm(&[])?;
        let mut portwise = spawn_portwise_with_log(
            self.cp,
            &self.work,
            &format!("{row_id}-{run}"),
            &portwise_config("", "podReady"),
            &[portwise_ns.name()],
            &[],
            PROFILE_LOG,
        )
        .await?;
        let res = async {
            native_tracker
                .converged(Duration::from_secs(600), &mut native)
                .await?;
            portwise_tracker
                .converged(Duration::from_secs(600), &mut portwise)
                .await?;
            let mut sides = Vec::new();
            for (client, ns, tracker, g) in [
                ("native", &native_ns, &native_tracker, &ng),
                ("portwise", &portwise_ns, &portwise_tracker, &pg),
            ] {
                let addr =
                    SocketAddr::new(cluster_ip(&ns.get_service(&g.service).await?, false)?, 80);
                let (victim, victim_ip) = &g.pods[0];
                // Before any flip: only the data path node's pod answers.
                path.expect_answers(addr, &[victim.as_str()])
                    .await
                    .with_context(|| format!("{client}: routed before the flips"))?;
                sides.push(DpSide {
                    client,
                    ns,
                    tracker,
                    service: g.service.clone(),
                    addr,
                    victim: victim.clone(),
                    victim_ip: victim_ip.to_string(),
                    all: g.pods.iter().map(|(_, ip)| ip.to_string()).collect(),
                    gone: path.gone(),
                    from: path.probe_from(),
                });
            }
            let services = Api::<Service>::all(native_ns.client())
                .list(&Default::default())
                .await?
                .items
                .len();
            let sync_metric = |m: &Metrics, what: &str| {
                m.sum(
                    &format!("kubeproxy_sync_proxy_rules_duration_seconds_{what}"),
                    &[("ip_family", "IPv4")],
                )
            };
            let m0 = match path {
                DataPath::KubeProxy(proxy) => Some(proxy.metrics().await?),
                DataPath::Cilium(_) => None,
            };
            tokio::time::sleep(FLIP_GAP).await;
            let audit = self.bcp.audit();
            let a0 = audit.offset();
            let profiled = reconciles_in(&portwise.current_logs()).len();
            let mut results: [Vec<Flip>; 2] = [Vec::new(), Vec::new()];
            for i in 0..flips {
                // unready, ready, unready, …; who goes first alternates
                // every two flips, so each goes first in both directions.
                let ready = i % 2 == 1;
                let order = if (i / 2) % 2 == 0 { [0, 1] } else { [1, 0] };
                for k in order {
                    native.check_alive()?;
                    portwise.check_alive()?;
                    let f = datapath_flip(&sides[k], ready).await?;
                    eprintln!(
                        "bench:   {} {} flip {}/{flips} ({}): slice {}, routed {} (±{})",
                        path.name(),
                        sides[k].client,
                        i + 1,
                        if ready { "ready" } else { "unready" },
                        ms(f.slice),
                        ms(f.routed),
                        ms(f.bracket),
                    );
                    results[k].push(f);
                    tokio::time::sleep(FLIP_GAP + Duration::from_millis(fastrand::u64(0..500)))
                        .await;
                }
            }
            let req = audit.settled_between(a0).await?;
            let syncs = match (path, m0) {
                (DataPath::KubeProxy(proxy), Some(m0)) => {
                    let m1 = proxy.metrics().await?;
                    Some((
                        sync_metric(&m1, "count") - sync_metric(&m0, "count"),
                        sync_metric(&m1, "sum") - sync_metric(&m0, "sum"),
                    ))
                }
                _ => None,
            };
            let profile = reconciles_in(&portwise.current_logs())
                .split_off(profiled)
                .into_iter()
                .filter(|r| r.namespace == portwise_ns.name() && r.service == pg.service)
                .collect();
            Ok::<_, anyhow::Error>(FlipRun {
                results,
                requests: req,
                services,
                syncs,
                profile,
            })
        }
        .await;
        stop_portwise(&mut portwise).await;
        native.stop().await;
        drop(servers);
        res
    }

    /// A flip row's four figures (routed p50 and p99 against native, with
    /// the goal; the split into publication and data path) in the table:
    /// each the median over `runs` of the run's percentile.
    fn flip_figures(&mut self, label: &str, path: &str, runs: &[FlipRun]) {
        let routed = |f: &Flip| f.routed;
        let slice = |f: &Flip| f.slice;
        let path_part = |f: &Flip| f.routed - f.slice;
        let flips = runs.first().map_or(0, |r| r.results[1].len());
        let of_runs = if runs.len() > 1 {
            format!(", median of {} runs", runs.len())
        } else {
            String::new()
        };
        for (what, f, p, goal) in [
            (
                format!("status patch → {path} routes by it (first connection), p50{of_runs}"),
                routed as fn(&Flip) -> f64,
                0.5,
                true,
            ),
            (
                if flips >= 100 {
                    format!("same, p99 (of {flips}){of_runs}")
                } else {
                    format!("same, p99 (of {flips}: the slowest){of_runs}")
                },
                routed,
                0.99,
                true,
            ),
            (
                format!("of which slice publication (patch → slice seen by a watch), p50{of_runs}"),
                slice,
                0.5,
                false,
            ),
            (
                format!("of which {path} (slice seen → routed), p50{of_runs}"),
                path_part,
                0.5,
                false,
            ),
        ] {
            // Per run: (portwise, native).
            let per_run: Vec<(f64, f64)> = runs
                .iter()
                .map(|r| {
                    let [nat, pw] = &r.results;
                    let col = |v: &[Flip]| v.iter().map(f).collect::<Vec<f64>>();
                    (pct(&col(pw), p), pct(&col(nat), p))
                })
                .collect();
            let a = median_of(&per_run.iter().map(|x| x.0).collect::<Vec<_>>());
            let b = median_of(&per_run.iter().map(|x| x.1).collect::<Vec<_>>());
            let pairs: Vec<Vec<(f64, f64)>> = runs
                .iter()
                .map(|r| {
                    let [nat, pw] = &r.results;
                    pw.iter().zip(nat).map(|(x, y)| (f(x), f(y))).collect()
                })
                .collect();
            let interval = ratio_interval(&pairs, p, BOOTSTRAP_ROUNDS);
            let each = |v: Vec<f64>| {
                if v.len() > 1 {
                    format!(
                        " ({})",
                        v.iter().map(|x| ms(*x)).collect::<Vec<_>>().join(", ")
                    )
                } else {
                    String::new()
                }
            };
            self.report.row_within(
                label,
                &what,
                format!("{}{}", ms(a), each(per_run.iter().map(|x| x.0).collect())),
                format!("{}{}", ms(b), each(per_run.iter().map(|x| x.1).collect())),
                ratio(a, b),
                interval,
                if goal {
                    Goal::RatioAtMost(1.0)
                } else {
                    Goal::None
                },
            );
        }
    }

    fn row8_report(&mut self, flips: usize, per: usize, runs: &[FlipRun]) {
        let Some(first) = runs.first() else { return };
        let label = format!(
            "8 pod change to data path (one kube-proxy, nftables; {flips} readiness flips each)"
        );
        self.flip_figures(&label, "kube-proxy", runs);
        let services = first.services;
        let mut table = String::new();
        for (i, run) in runs.iter().enumerate() {
            let (syncs, sync_secs) = run.syncs.unwrap_or((0.0, 0.0));
            let mean_sync = if syncs > 0.0 {
                ms(sync_secs / syncs * 1000.0)
            } else {
                "—".into()
            };
            let p = &run.profile;
            let col = |f: fn(&Reconciled) -> f64| p.iter().map(f).collect::<Vec<f64>>();
            let two = |v: Vec<f64>| format!("{} / {}", ms(pct(&v, 0.5)), ms(pct(&v, 0.99)));
            let _ = write!(
                table,
                "**Run {} of {}.**\n\n{}\nEndpointSlice writes during the flips (audit log): \
                 portwise {}, native {} (one per flip expected). kube-proxy's IPv4 syncs during \
                 the flips: {syncs:.0}, {mean_sync} each on average \
                 (`kubeproxy_sync_proxy_rules_duration_seconds`). portwise's {} reconciles of \
                 its Service during the flips (its `portwise::profile` lines), p50 / p99: \
                 trigger (pod event → its turn) {}, judge + plan {}, write {}, whole reconcile \
                 {}.\n\n",
                i + 1,
                runs.len(),
                flip_table(&run.results, "kube-proxy"),
                run.requests.slice_writes("portwise"),
                run.requests.slice_writes("native"),
                p.len(),
                two(col(|r| r.trigger)),
                two(col(|r| r.judge + r.plan)),
                two(col(|r| r.write)),
                two(col(|r| r.total)),
            );
        }
        let body = format!(
            "One upstream kube-proxy (`portwise-cp kube-proxy --proxy-mode=nftables`, upstream \
             defaults otherwise: `minSyncPeriod` 1 s; tests/src/consumers.rs) runs in the bench's \
             network namespace as Node `{PROXY_NODE}` and programs every Service of the control \
             plane ({services} at the time, earlier rows' included). Two Services of the same \
             shape, one port 80 → 8080, {per} pods each, on {per} Nodes (one pod per Node, one of \
             them kube-proxy's), every pod a real TCP server on its own pod address that answers \
             with its name: in `bench-dp-native-*` with `spec.selector`, judged by \
             kube-controller-manager's endpointslice controller (its recorded argv, upstream \
             defaults, as in row 1); in `bench-dp-portwise-*` selector-less with \
             `membership: podReady`, judged by the release `portwise` binary with row 1's config \
             (`resyncPeriod` 30 s default, default flags, `--namespace` of its namespace; \
             portwise has no coalescing delay, and the native controller's \
             `--endpoint-updates-batch-period` is 0 by default).\n\n\
             **Exact by construction.** Both Services have `internalTrafficPolicy: Local`, so \
             through their ClusterIP this node's kube-proxy sends connections only to the pod on \
             its own node: the Service keeps {per} Ready pods and its slices change exactly as \
             for any Service (one endpoint's readiness), yet the flipped pod is the only member \
             the probe can reach. Every connection is then deterministic: with the old rules it \
             is answered by the pod (or, pod not ready, its SYN is dropped: kube-proxy's verdict \
             for a Local Service without a local endpoint), with the new rules the opposite. No \
             sampling over {per} members is needed, so no run of K answers to wait for. Each \
             flip makes the node's pod NotReady or Ready again, alternately, {flips} times per \
             Service, one Service at a time, in turns (who goes first alternates), and \
             {:.1} s plus up to 0.5 s apart, so that kube-proxy's 1 s `minSyncPeriod` never holds \
             a flip back.\n\n\
             **What is timed.** From just **before the status PATCH is sent** (the PATCH's own \
             return is the third column) to the start of the first connection after which every \
             connection met the new rules (at least {SETTLED_RUN} in a row). A new connection \
             starts every {} ms on its own task (one dropped SYN must not delay the next), each \
             timed just before its `connect`; a SYN unanswered for {} ms counts as dropped (a \
             local one is answered in microseconds; a dropped one is retransmitted only after \
             1 s). The rules changed between the last connection that met the old rules and the \
             first that met the new: that gap (*bracket*) is the resolution, shown per flip. \
             Probes out of order (neither outcome, or the new one before the last old one) are \
             counted; none is expected. *Slice seen*: the bench's own watch on the namespace's \
             EndpointSlices showed the Service's slices with the new Ready set (the same moment \
             kube-proxy's informer can have it, give or take the two watches' delivery); the \
             kube-proxy part is routed − slice seen. p99 is nearest-rank over the {} flips per \
             controller of a run; the table's figures are the median of the {} runs' \
             percentiles, each run in fresh namespaces with fresh controllers. Each ratio's \
             95 % interval comes from a bootstrap ({BOOTSTRAP_ROUNDS} rounds): every round \
             resamples each run's flip pairs (a portwise flip and the native flip of the same \
             turn) with replacement and computes the table's figure again, so it shows how far \
             the flips' own spread alone moves the ratio.\n\n{table}",
            FLIP_GAP.as_secs_f64(),
            PROBE_EVERY.as_millis(),
            DROPPED_AFTER.as_millis(),
            flips,
            runs.len(),
        );
        self.report.section("Row 8: pod change to data path", body);
    }

    fn row10_report(&mut self, flips: usize, per: usize, run: &FlipRun, agent_ready: Duration) {
        let label = format!(
            "10 pod change to Cilium's data path (cilium-agent v1.20.2, socket LB; {flips} \
             readiness flips each)"
        );
        self.flip_figures(&label, "Cilium", std::slice::from_ref(run));
        let table = flip_table(&run.results, "Cilium");
        let req = &run.requests;
        let body = format!(
            "Row 8's protocol with Cilium as the data path instead of kube-proxy: a real \
             cilium-agent (tests/cilium/build, v1.20.2; kube-proxy replacement with socket load \
             balancing, confined to a cgroup2 sub-cgroup of its own; tests/src/cilium.rs), ready \
             {} after its start, runs as Node `{CILIUM_NODE}` against the same apiserver. Two \
             Services of the same shape (80 → 8080, {per} pods, `internalTrafficPolicy: Local`, \
             pod 0 on Cilium's Node, the others on the bench Nodes), one native with \
             `spec.selector`, one selector-less judged by portwise (`membership: podReady`), \
             each pod a real TCP server answering with its name. Each flip makes the Node's pod \
             NotReady or Ready again, {flips} times per Service, in turns.\n\n\
             **How connections are made.** Socket LB rewrites `connect()` only for the \
             processes of Cilium's cgroup, so the prober is a child process (`bench --probe`) \
             moved into that cgroup; it opens a new connection every {} ms and reports each \
             `connect`'s CLOCK_MONOTONIC time and outcome, which the bench puts on its own clock \
             (the same clock). While the pod is no member, socket LB fails the `connect` itself \
             (no local backend), so any refusal or failure counts as the old or new state; an \
             answer by another pod is out of order. Everything else (settling after \
             {SETTLED_RUN} probes in a row, brackets, the slice seen by the bench's own watch) is \
             as in row 8.\n\n{table}\n\
             EndpointSlice writes during the flips (audit log): portwise {}, native {} (one per \
             flip expected).",
            secs(agent_ready),
            PROBE_EVERY.as_millis(),
            req.slice_writes("portwise"),
            req.slice_writes("native"),
        );
        self.report
            .section("Row 10: pod change to Cilium's data path", body);
    }
}

// ---- main ------------------------------------------------------------------------------------

// ---- row 11: a Deployment rollout of real pods ------------------------------

/// The real node of row 11 (tests/node/start), stopped on drop; one per
/// machine at a time (the lock tests/node/run-suite takes).
struct StartedNode {
    dir: PathBuf,
    _lock: std::fs::File,
}

impl StartedNode {
    fn start(dir: &Path) -> Result<Self> {
        let cache = std::env::var_os("PORTWISE_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/portwise")
            });
        let lock = std::fs::File::create(cache.join("node.lock"))?;
        use std::os::fd::AsRawFd as _;
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            bail!(
                "locking {}: {}",
                cache.join("node.lock").display(),
                std::io::Error::last_os_error()
            );
        }
        let status = std::process::Command::new(repo_root().join("tests/node/start"))
            .arg(dir)
            .stdin(Stdio::null())
            .status()?;
        let node = StartedNode {
            dir: dir.to_path_buf(),
            _lock: lock,
        };
        if !status.success() {
            bail!("tests/node/start {} failed ({status})", dir.display());
        }
        Ok(node)
    }
}

impl Drop for StartedNode {
    fn drop(&mut self) {
        let _ = std::process::Command::new(repo_root().join("tests/node/stop"))
            .arg(&self.dir)
            .stdin(Stdio::null())
            .status();
    }
}

/// Row 11's watches: every slice version and pod readiness, when it arrived.
struct RolloutLog {
    events: Arc<std::sync::Mutex<Vec<(Instant, RolloutEvent)>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

#[derive(Clone, Debug)]
enum RolloutEvent {
    /// A slice of `service` now lists these ready pods (None: deleted).
    Slice {
        name: String,
        service: String,
        ready: Option<BTreeSet<String>>,
    },
    /// A pod's Ready condition.
    Pod { name: String, ready: bool },
}

impl RolloutLog {
    fn start(client: kube::Client, ns: &str) -> Self {
        let events = Arc::new(std::sync::Mutex::new(Vec::new()));
        let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), ns);
        let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client, ns);
        let sink = events.clone();
        let slice_task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(watcher(slices, watcher::Config::default()));
            while let Some(Ok(ev)) = stream.next().await {
                let (s, gone) = match ev {
                    watcher::Event::Apply(s) | watcher::Event::InitApply(s) => (s, false),
                    watcher::Event::Delete(s) => (s, true),
                    _ => continue,
                };
                let service = s
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("kubernetes.io/service-name"))
                    .cloned()
                    .unwrap_or_default();
                let ready = (!gone).then(|| {
                    s.endpoints
                        .iter()
                        .flatten()
                        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
                        .filter_map(|e| e.target_ref.as_ref().and_then(|r| r.name.clone()))
                        .collect()
                });
                let name = s.metadata.name.unwrap_or_default();
                sink.lock().expect("log").push((
                    Instant::now(),
                    RolloutEvent::Slice {
                        name,
                        service,
                        ready,
                    },
                ));
            }
        });
        let sink = events.clone();
        let pod_task = tokio::spawn(async move {
            let mut stream =
                std::pin::pin!(watcher(pods, watcher::Config::default()).applied_objects());
            while let Some(Ok(p)) = stream.next().await {
                let ready = p
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
                let name = p.metadata.name.unwrap_or_default();
                sink.lock()
                    .expect("log")
                    .push((Instant::now(), RolloutEvent::Pod { name, ready }));
            }
        });
        RolloutLog {
            events,
            tasks: vec![slice_task, pod_task],
        }
    }

    /// From `t0` on: when the last of `new` pods was first seen Ready, and
    /// when each of `services` first had exactly `new` as its ready pods.
    fn replay(
        &self,
        t0: Instant,
        new: &BTreeSet<String>,
        services: &[&str; 2],
    ) -> (Option<Instant>, [Option<Instant>; 2]) {
        let events = self.events.lock().expect("log").clone();
        let mut slices: HashMap<String, (String, BTreeSet<String>)> = HashMap::new();
        let mut first_ready: HashMap<&String, Instant> = HashMap::new();
        let mut done = [None, None];
        for (at, ev) in &events {
            match ev {
                RolloutEvent::Slice {
                    name,
                    service,
                    ready,
                } => {
                    match ready {
                        Some(r) => slices.insert(name.clone(), (service.clone(), r.clone())),
                        None => slices.remove(name),
                    };
                    if *at < t0 {
                        continue;
                    }
                    for (i, svc) in services.iter().enumerate() {
                        if done[i].is_some() {
                            continue;
                        }
                        let union: BTreeSet<String> = slices
                            .values()
                            .filter(|(s, _)| s == svc)
                            .flat_map(|(_, r)| r.iter().cloned())
                            .collect();
                        if &union == new {
                            done[i] = Some(*at);
                        }
                    }
                }
                RolloutEvent::Pod { name, ready } => {
                    if *at >= t0
                        && *ready
                        && let Some(n) = new.get(name)
                    {
                        first_ready.entry(n).or_insert(*at);
                    }
                }
            }
        }
        let last = (first_ready.len() == new.len())
            .then(|| first_ready.values().max().copied())
            .flatten();
        (last, done)
    }
}

impl Drop for RolloutLog {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// The ready endpoints' pods of each Service in `ns`, by Service name.
async fn ready_pods_by_service(
    slices: &Api<EndpointSlice>,
) -> Result<HashMap<String, BTreeSet<String>>> {
    let mut out: HashMap<String, BTreeSet<String>> = HashMap::new();
    for s in slices.list(&kube::api::ListParams::default()).await?.items {
        let Some(svc) = s
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("kubernetes.io/service-name"))
            .cloned()
        else {
            continue;
        };
        let set = out.entry(svc).or_default();
        for e in s.endpoints.iter().flatten() {
            if e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true)
                && let Some(pod) = e.target_ref.as_ref().and_then(|r| r.name.clone())
            {
                set.insert(pod);
            }
        }
    }
    Ok(out)
}

impl Bench {
    /// Row 11: `kubectl rollout restart` of a Deployment of N real pods on
    /// a real node (tests/node), and how long until each controller's slices
    /// hold exactly the N new pods as ready: portwise (a selector-less
    /// Service aligned by annotation, `membership: podReady`) and the
    /// native controller (a selector twin of it), in the same rollouts.
    async fn row11(&mut self) -> Result<()> {
        const NS: &str = "bench-rollout";
        let pods = env_usize("BENCH_ROLLOUT_PODS", 20).max(2);
        let runs = self.knobs.fair_runs;
        eprintln!("bench: row 11: a real node, a Deployment of {pods} pods, {runs} rollouts");
        let dir = self.work.join("node");
        let _ = std::fs::remove_dir_all(&dir);
        let started = StartedNode::start(&dir)?;
        let node = portwise_tests::node::RealNode::open(dir.clone()).await?;
        let client = node.client();
        let image = node.workload_image()?.to_string();
        node.apply(&format!(
            r#"apiVersion: v1
kind: Namespace
metadata: {{name: {NS}}}
---
apiVersion: v1
kind: Service
metadata: {{name: native, namespace: {NS}}}
spec:
  selector: {{app: web}}
  ports: [{{name: http, port: 80, targetPort: 8080}}]
---
apiVersion: v1
kind: Service
metadata: {{name: colocated, namespace: {NS}, annotations: {{{GROUP_KEY}: web}}}}
spec:
  ports: [{{name: http, port: 80, targetPort: 8080}}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: {NS}}}
spec:
  replicas: {pods}
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata:
      labels: {{app: web}}
      annotations: {{{GROUP_KEY}: web}}
    spec:
      terminationGracePeriodSeconds: 2
      containers:
      - name: serve
        image: {image}
        imagePullPolicy: Never
        args: ["serve", "web", "8080"]
        readinessProbe:
          exec: {{command: ["/pw-workload", "ready"]}}
          periodSeconds: 1
"#
        ))?;
        let mut pw = Portwise::builder(self.cp)
            .name("portwise-row11")
            .dir(&self.work)
            .bin(&release_bin()?)
            .namespaces(&[NS])
            .config(&portwise_config("", "podReady"))
            .identity(Path::new(node.kubeconfig()?))
            .log_filter("info")
            .quiet()
            .start()
            .await?;
        let slices: Api<EndpointSlice> = Api::namespaced(client, NS);
        let res = async {
            node.kubectl(&[
                "-n",
                NS,
                "rollout",
                "status",
                "deployment/web",
                "--timeout=300s",
            ])?;
            let settle = Instant::now();
            loop {
                let by = ready_pods_by_service(&slices).await?;
                let n = |s: &str| by.get(s).map_or(0, |p| p.len());
                if n("native") == pods && n("colocated") == pods {
                    break;
                }
                if settle.elapsed() > Duration::from_secs(120) {
                    bail!("the slices never held the {pods} pods before the rollouts: {by:?}");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            // What the bench's watches saw, as it arrived: the slices of
            // both Services and the pods' readiness, so that each
            // controller's lag after the last new pod turned Ready is
            // measured to the event, not to a poll.
            let log = RolloutLog::start(node.client(), NS);
            let mut times: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
            let mut lags: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
            let mut rollout_times = Vec::new();
            for run in 0..runs {
                let old = ready_pods_by_service(&slices)
                    .await?
                    .remove("native")
                    .unwrap_or_default();
                let t0 = Instant::now();
                node.kubectl(&["-n", NS, "rollout", "restart", "deployment/web"])?;
                node.kubectl(&[
                    "-n",
                    NS,
                    "rollout",
                    "status",
                    "deployment/web",
                    "--timeout=300s",
                ])?;
                rollout_times.push(t0.elapsed().as_secs_f64());
                // Until both Services' slices hold exactly the new pods.
                let deadline = Instant::now() + Duration::from_secs(60);
                let (new, last_ready, done) = loop {
                    let new = ready_pods_by_service(&slices)
                        .await?
                        .remove("native")
                        .unwrap_or_default();
                    let r = log.replay(t0, &new, &["colocated", "native"]);
                    if new.len() == pods
                        && new.is_disjoint(&old)
                        && let (Some(last), [Some(a), Some(b)]) = r
                    {
                        break (new, last, [a, b]);
                    }
                    if Instant::now() > deadline {
                        bail!("rollout {run}: the slices did not follow within 60 s of the rollout: {r:?}");
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                };
                for i in 0..2 {
                    times[i].push((done[i] - t0).as_secs_f64());
                    lags[i].push(done[i].saturating_duration_since(last_ready).as_secs_f64() * 1e3);
                }
                eprintln!(
                    "bench: row 11: rollout {run} ({} new pods, last Ready at {:.2} s): portwise {:.2} s (+{:.0} ms), native {:.2} s (+{:.0} ms)",
                    new.len(),
                    (last_ready - t0).as_secs_f64(),
                    times[0][run],
                    lags[0][run],
                    times[1][run],
                    lags[1][run]
                );
            }
            Ok((times, lags, rollout_times))
        }
        .await;
        stop_portwise(&mut pw).await;
        drop(started);
        let (times, lags, rollout_times) = res?;
        let (p, n) = (median_of(&times[0]), median_of(&times[1]));
        let (pl, nl) = (median_of(&lags[0]), median_of(&lags[1]));
        let each = |xs: &[f64]| {
            xs.iter()
                .map(|x| format!("{x:.2}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        self.report.row(
            "11 rollout",
            &format!(
                "`kubectl rollout restart` of {pods} real pods → slices hold exactly the new pods, median of {runs} (each run, s: portwise {}; native {})",
                each(&times[0]),
                each(&times[1])
            ),
            format!("{p:.2} s"),
            format!("{n:.2} s"),
            ratio(p, n),
            Goal::RatioAtMost(1.0),
        );
        self.report.row(
            "11 rollout",
            &format!(
                "of which the lag after the last new pod turned Ready (pod watch → slice watch), \
                 median of {runs} (each run, ms: portwise {}; native {})",
                lags[0]
                    .iter()
                    .map(|x| format!("{x:.0}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                lags[1]
                    .iter()
                    .map(|x| format!("{x:.0}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            format!("{pl:.0} ms"),
            format!("{nl:.0} ms"),
            ratio(pl, nl),
            Goal::RatioAtMost(1.0),
        );
        self.protocol.push(format!(
            "- **Row 11** runs on a real node (tests/node: kubelet, containerd, CNI bridge, a              control plane in node mode with the native controllers), in a cluster of its own. A              Deployment of {pods} pods (`pw-workload serve`, exec readiness probe every 1 s,              default rolling update: 25 % surge, 25 % unavailable) backs two Services: `native`              with `spec.selector` (the native endpointslice controller) and `colocated` without              one, aligned by `{GROUP_KEY}` (the release `portwise`, as a process, `membership:              podReady`). Each run times, from just before `kubectl rollout restart`, when each              Service's slices first list exactly {pods} ready pods, none of them an old one              (polled every 20 ms). Both follow the same pods in the same rollout. The rollout              itself (`kubectl rollout status` done) took a median of {:.2} s.",
            median_of(&rollout_times)
        ));
        Ok(())
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--probe") {
        return match &args[2..] {
            [addr, victim] => probe_main(addr, victim),
            _ => {
                eprintln!("usage: bench --probe ADDR VICTIM");
                ExitCode::from(2)
            }
        };
    }
    let knobs = Knobs::from_env();
    let work = match tempfile::Builder::new().prefix("portwise-bench.").tempdir() {
        Ok(t) => t.keep(),
        Err(e) => {
            eprintln!("bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    eprintln!("bench: work dir {}", work.display());
    let machine = machine();
    let bcp = match BenchCp::start(&work) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("bench: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let dir = bcp.dir.clone();
    let res = rt.block_on(run(knobs, bcp, work.clone(), machine));
    // Stop everything this run started, then drop its (large) state.
    let stop = repo_root().join("tests/control-plane/stop");
    let _ = std::process::Command::new(stop).arg(&dir).status();
    rt.shutdown_timeout(Duration::from_secs(5));
    if std::env::var("BENCH_KEEP").as_deref() != Ok("1") {
        let _ = std::fs::remove_dir_all(&work);
    }
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(knobs: Knobs, bcp: BenchCp, work: PathBuf, machine: String) -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let mut b = Bench {
        knobs,
        cp,
        bcp,
        work,
        report: Report::default(),
        protocol: Vec::new(),
        nodes: Vec::new(),
    };
    println!(
        "| row | measure | portwise | native | ratio | goal | |\n|---|---|---|---|---|---|---|"
    );
    let mut pair = None;
    if b.knobs.row(1) || b.knobs.row(2) || b.knobs.row(3) || b.knobs.row(4) {
        match b.row1().await {
            Ok(p) => pair = Some(p),
            Err(e) => b
                .report
                .not_measured("1 convergence", "all", &format!("{e:#}")),
        }
    }
    if let Some(p) = pair.as_mut() {
        if b.knobs.row(2)
            && let Err(e) = b.row2(p).await
        {
            b.report
                .not_measured("2 steady state", "all", &format!("{e:#}"));
        }
        if b.knobs.row(3)
            && let Err(e) = b.row3(p).await
        {
            b.report.not_measured("3 churn", "all", &format!("{e:#}"));
        }
        if b.knobs.row(4) {
            let u = p.portwise.usage();
            b.report.row(
                "4 scale",
                &format!(
                    "portwise at {} pods over {} Services: see row 1 (time, peak RSS); RSS now",
                    b.knobs.services * b.knobs.pods_per_service,
                    b.knobs.services
                ),
                format!("{:.0} MiB", u.rss_mib),
                format!("{:.0} MiB", p.native.usage().rss_mib),
                ratio(u.rss_mib, p.native.usage().rss_mib),
                Goal::None,
            );
        }
        if b.knobs.native_fast
            && b.knobs.row(1)
            && let Err(e) = b.row1b(p).await
        {
            b.report
                .not_measured("1b native without rate limit", "all", &format!("{e:#}"));
        }
    }
    if let Some(mut p) = pair.take() {
        stop_portwise(&mut p.portwise).await;
        p.native.stop().await;
    }
    if b.knobs.row(5)
        && let Err(e) = b.row5().await
    {
        b.report.not_measured("5 probes", "all", &format!("{e:#}"));
    }
    if b.knobs.row(6)
        && let Err(e) = b.row6().await
    {
        b.report.not_measured("6 WASM", "all", &format!("{e:#}"));
    }
    if b.knobs.row(7) {
        b.row7();
    }
    if b.knobs.row(8)
        && let Err(e) = b.row8().await
    {
        b.report
            .not_measured("8 pod change to data path", "all", &format!("{e:#}"));
    }
    // After row 8: the agent takes the data path from kube-proxy (one at a
    // time in a namespace).
    if b.knobs.row(10)
        && let Err(e) = b.row10().await
    {
        b.report.not_measured(
            "10 pod change to Cilium's data path",
            "all",
            &format!("{e:#}"),
        );
    }
    // A cluster of its own with a real node, whose kube-proxy owns the
    // namespace's data path: after rows 8 and 10.
    if b.knobs.row(11)
        && let Err(e) = b.row11().await
    {
        b.report
            .not_measured("11 rollout of real pods", "all", &format!("{e:#}"));
    }
    // Last: its 100k pods would weigh on every later row.
    if b.knobs.row(9)
        && let Err(e) = b.row9().await
    {
        b.report
            .not_measured("9 cost of unmanaged pods", "all", &format!("{e:#}"));
    }

    let protocol = protocol_text(&b);
    let md = b.report.markdown(&machine, &protocol);
    if let Some(out) = &b.knobs.out {
        let kept = std::fs::read_to_string(out)
            .ok()
            .and_then(|old| old.find(ANALYSIS_MARK).map(|i| old[i..].to_string()))
            .unwrap_or_else(|| format!("{ANALYSIS_MARK}\n\n## Analysis\n\n(none yet)\n"));
        std::fs::write(out, format!("{md}\n{kept}"))?;
        eprintln!("bench: wrote {}", out.display());
    }
    Ok(())
}

fn protocol_text(b: &Bench) -> String {
    let k = &b.knobs;
    let mut p = vec![
        format!(
            "- One control plane (`tests/control-plane/start DIR --controllers endpointslice`) inside \
             `tests/netns`, with an audit policy that records every request at Metadata level. The \
             controller-manager is stopped right after it starts and its exact command line kept."
        ),
        format!(
            "- Two namespaces get the same {} Services × {} pods (pod addresses 10.244.0.0/16, {NODES} \
             Nodes in 3 zones, one container, every pod Running and Ready): in `bench-native-*` \
             Services with `spec.selector`, in `bench-portwise-*` selector-less Services with the \
             group annotation `{GROUP_KEY}` and `membership: podReady`. Each Service has one port \
             (80 → 8080), so every controller publishes one slice of 10 endpoints per Service.",
            k.services, k.pods_per_service
        ),
    ];
    p.extend(b.protocol.iter().cloned());
    if !k.portwise_extra.is_empty() {
        p.push(format!(
            "- **Experiment:** row 1's portwise config has the extra lines `{}` \
             (BENCH_PORTWISE_EXTRA).",
            k.portwise_extra.trim().replace('\n', "; ")
        ));
    }
    p.push(
        "- **Fairness: both controllers make a cold sync of the same settled state.** Nothing \
         runs while the objects are created. Then kube-controller-manager starts (same argv, \
         controllers `endpointslice` only) and is timed from its exec until the bench's watch on \
         the namespace shows every Service's slices holding exactly its 10 Ready addresses. Then \
         the release `portwise` binary starts (`--namespace` of its namespace, default flags) and \
         is timed the same way. A fresh LIST confirms each result. Both start with empty caches, \
         so both times include listing and watching."
            .into(),
    );
    p.push(
        "- Requests are counted from the audit log by User-Agent: `portwise/<version>` for \
         portwise, `kube-controller-manager/…` for the native process (its writes come from \
         `…/endpointslice-controller`, its informers' lists and watches from \
         `…/shared-informers`). CPU is utime+stime of the process from /proc/PID/stat, peak RSS \
         its VmHWM."
            .into(),
    );
    p.push(
        "- Not identical in row 1, by design of each: the native controller-manager is one \
         process hosting more than the endpointslice controller (controller framework, health \
         server, informers for secrets and service accounts), and its informers are \
         cluster-wide, so it caches the pods of *both* namespaces (2× the pods portwise caches \
         with `--namespace`). The native controller runs with its upstream defaults (client \
         rate limit `--kube-api-qps=20 --kube-api-burst=30`, \
         `--concurrent-service-endpoint-syncs=5`), portwise with its own (no client rate limit, \
         `--reconcile-concurrency=8`, `resyncPeriod: 30s`). **Row 1b removes both \
         differences**: after rows 2–4 each controller is stopped, its slices deleted, and it \
         is started cold again, the native one with `--kube-api-qps=1000 --kube-api-burst=1000` \
         and portwise without `--namespace`, so both watch the whole cluster as installed by \
         default (row 3's 1000-pod Service included): Services and slices of both namespaces; \
         pods of both for the native controller, of its own namespace for portwise, which with \
         an annotation key watches pods only where a keyed Service is (since the pod scopes). \
         On a noisy machine one run decides \
         nothing: each controller is started cold BENCH_FAIR_RUNS (3) times, alternating, \
         every run is reported, and the goal applies to the median ratio."
            .into(),
    );
    p.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pairs whose two sides come from the same spread, in `runs` runs of
    /// `n`: one side's order shuffled, so pairs are no copies.
    fn same_spread(runs: usize, n: usize, scale: f64) -> Vec<Vec<(f64, f64)>> {
        let mut rng = fastrand::Rng::with_seed(7);
        (0..runs)
            .map(|_| {
                (0..n)
                    .map(|_| {
                        let x = 50.0 + 20.0 * rng.f64();
                        let y = 50.0 + 20.0 * rng.f64();
                        (x * scale, y)
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn the_interval_spans_parity_when_both_sides_share_a_spread() {
        let (lo, hi) = ratio_interval(&same_spread(3, 100, 1.0), 0.5, 2000).unwrap();
        assert!(lo < 1.0 && hi > 1.0, "{lo}–{hi}");
        assert!(hi - lo < 0.2, "{lo}–{hi}: too wide for 300 pairs");
    }

    #[test]
    fn the_interval_excludes_parity_when_one_side_is_slower() {
        let (lo, hi) = ratio_interval(&same_spread(3, 100, 1.3), 0.5, 2000).unwrap();
        assert!(lo > 1.0, "{lo}–{hi}");
        assert!(lo < 1.3 && hi > 1.2, "{lo}–{hi}");
    }

    #[test]
    fn no_interval_without_flips() {
        assert_eq!(ratio_interval(&[], 0.5, 10), None);
        assert_eq!(ratio_interval(&[vec![]], 0.5, 10), None);
    }
}
