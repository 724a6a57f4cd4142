//! `./demo`: the whole portwise story on a local control plane, in well
//! under a minute once built.
//!
//! Runs inside the test network namespace (`tests/netns`), where pod
//! addresses are local, so that real sockets can stand in for the pods and
//! portwise's probes judge real answers:
//!
//! 1. start a control plane (or, under the test suite, reuse the one named by
//!    `PORTWISE_TEST_KUBECONFIG`);
//! 2. create the seed's colocated Service (http 8080, https 8443, plus admin
//!    9000) and pods a–d, with listeners on the pods' addresses;
//! 3. run the real `portwise` binary, with built-in checkers deciding http
//!    and https and a WebAssembly guest deciding admin, and print the slices;
//!    then connect through each port's ClusterIP, which upstream kube-proxy
//!    (nftables mode) routes by those slices, and print who answered;
//! 4. make pod b's `/healthz` answer 500 and show b leave http but not https,
//!    in the slices and in who answers;
//! 5. stop everything it started, also on error or Ctrl-C.
//!
//! It checks what it shows: when the expected slices do not appear it says
//! so and exits 1, so it doubles as a smoke test (tests/tests/it/demo.rs).

use std::{
    fmt::Write as _,
    net::{IpAddr, Ipv4Addr},
    path::{Path, PathBuf},
    process::{ExitCode, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use portwise_tests::{
    ByPort, ControlPlane, GROUP_KEY, HttpListener, Portwise, TestNs, V4, by_port,
    consumers::{
        Answers, CONNECTIONS, KubeProxy, NameServer, ProxyMode, Speak, cluster_ip,
        who_answers_speaking,
    },
    endpoints_by_port, next_ips, pod, portwise_bin, service, slices_for,
};

const SERVICE: &str = "my-service";
const GROUP: &str = "my-group";
/// The admin-check guest's default `key`: a pod marked with it backs the
/// admin port whatever its sockets say.
const ADMIN_KEY: &str = "port-mapper.example.com/admin";
const GUEST: &str = "admin-check.wasm";
/// Service ports in the order the tables show them.
const PORTS: [(&str, u16); 3] = [("http", 8080), ("https", 8443), ("admin", 9000)];
/// The pod that turns unhealthy.
const VICTIM: &str = "b";
/// How long the demo waits for a change to show in the slices before it
/// calls the run a failure. Generous: the machine may be busy building.
const SETTLE: Duration = Duration::from_secs(45);
const INDENT: &str = "      ";

/// One pod and the sockets standing in for its servers.
struct PodPlan {
    name: &'static str,
    /// HTTP on 8080, `/healthz` answering 200.
    http: bool,
    /// TCP accepting on 8443.
    https: bool,
    /// TCP accepting on 9000.
    admin: bool,
    /// Annotated `port-mapper.example.com/admin: "true"`.
    marked: bool,
}

/// Chosen so that every port has its own subset: http → a b c (HTTP
/// answers), https → b c d (TCP accepts), admin → a (marked) and c (accepts).
#[rustfmt::skip]
const PODS: [PodPlan; 4] = [
    PodPlan { name: "a", http: true,  https: false, admin: true,  marked: true },
    PodPlan { name: "b", http: true,  https: true,  admin: false, marked: false },
    PodPlan { name: "c", http: true,  https: true,  admin: true,  marked: false },
    PodPlan { name: "d", http: false, https: true,  admin: false, marked: false },
];

const MEMBERSHIP: [(&str, &str, &str); 3] = [
    (
        "http",
        "{all: [podReady, {httpGet: {path: /healthz, timeout: 1s}}]}",
        "built-in",
    ),
    ("https", "{tcpDial: {timeout: 1s}}", "built-in"),
    (
        "admin",
        "{wasm: {module: admin-check.wasm, config: {timeoutMs: 500}}}",
        "WebAssembly guest (Rust): marked pods, else TCP dial",
    ),
];

fn expected_before() -> ByPort {
    by_port([
        (("http", V4), &["a", "b", "c"][..]),
        (("https", V4), &["b", "c", "d"][..]),
        (("admin", V4), &["a", "c"][..]),
    ])
}

/// Who answers through each port's ClusterIP: every member, and every
/// connection (no pick is refused). `a` is an admin pod by its mark (the
/// guest includes it without dialling) and serves 9000 like `c`.
const ANSWER_BEFORE: [(&str, &[&str], bool); 3] = [
    ("http", &["a", "b", "c"], false),
    ("https", &["b", "c", "d"], false),
    ("admin", &["a", "c"], false),
];
const ANSWER_AFTER: [(&str, &[&str], bool); 3] = [
    ("http", &["a", "c"], false),
    ("https", &["b", "c", "d"], false),
    ("admin", &["a", "c"], false),
];

fn expected_after() -> ByPort {
    by_port([
        (("http", V4), &["a", "c"][..]),
        (("https", V4), &["b", "c", "d"][..]),
        (("admin", V4), &["a", "c"][..]),
    ])
}

fn main() -> ExitCode {
    let started = Instant::now();
    let work = match tempfile::Builder::new().prefix("portwise-demo.").tempdir() {
        Ok(t) => t.keep(),
        Err(e) => {
            eprintln!("demo: cannot create a work directory: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("portwise demo (work dir {})", work.display());

    // Under the test suite a control plane is already running; otherwise
    // start one, before any thread exists (the support crate finds it
    // through the environment, and setting it is only sound now).
    let own_cp = std::env::var_os("PORTWISE_TEST_KUBECONFIG").is_none();
    let mut cp_guard = None;
    if own_cp {
        step(1, "control plane (kube-apiserver with embedded etcd)");
        let dir = work.join("cp");
        let t = Instant::now();
        match start_control_plane(&dir, &work.join("control-plane.log")) {
            Ok(guard) => cp_guard = Some(guard),
            Err(e) => return fail(&work, &e, None),
        }
        done(&format!("ready in {}", secs(t.elapsed())));
        // SAFETY: single-threaded so far; nothing reads the environment
        // concurrently.
        unsafe {
            std::env::set_var("PORTWISE_TEST_KUBECONFIG", dir.join("kubeconfig"));
            std::env::set_var("PORTWISE_TEST_CP_DIR", &dir);
        }
    } else {
        heading(1, "control plane: reusing PORTWISE_TEST_KUBECONFIG");
    }

    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&work, &e.into(), None),
    };
    let mut rig = Rig::default();
    let (outcome, stopped) = rt.block_on(async {
        let outcome = tokio::select! {
            res = demo(&mut rig, &work, own_cp) => res.map_err(Outcome::Failed),
            sig = signalled() => Err(Outcome::Interrupted(sig)),
        };
        if let Err(Outcome::Interrupted(sig)) = &outcome {
            println!("\n{INDENT}{sig}: stopping what the demo started");
        } else {
            let what = if own_cp {
                "stopping portwise, the listeners and the control plane"
            } else {
                "stopping portwise and the listeners"
            };
            step(5, what);
        }
        let t = Instant::now();
        let stopped = rig.shutdown(own_cp).await;
        (outcome, stopped.map(|()| t.elapsed()))
    });
    drop(rt);
    let t = Instant::now();
    let cp_stopped = cp_guard.take().map(CpGuard::stop).transpose();
    let (stop_time, stop_error) = match (stopped, cp_stopped) {
        (Ok(d), Ok(_)) => (d + t.elapsed(), None),
        (Err(e), _) | (_, Err(e)) => (Duration::ZERO, Some(e)),
    };
    let log = work.join("portwise.log");

    match outcome {
        Err(Outcome::Interrupted(_)) => {
            if let Some(e) = stop_error {
                eprintln!("{INDENT}while stopping: {e:#}");
            }
            println!("{INDENT}stopped; logs kept in {}", work.display());
            ExitCode::from(130)
        }
        Err(Outcome::Failed(e)) => {
            match stop_error {
                None => done(&format!("stopped in {}", secs(stop_time))),
                Some(stop) => done(&format!("failed: {stop:#}")),
            }
            fail(&work, &e, Some(&log))
        }
        Ok(()) => {
            if let Some(e) = stop_error {
                done("failed");
                return fail(&work, &e, Some(&log));
            }
            done(&format!("stopped in {}", secs(stop_time)));
            let total = secs(started.elapsed());
            if own_cp {
                // Keep the logs, drop the cluster's state (etcd data, keys).
                let _ = std::fs::remove_dir_all(work.join("cp"));
                println!("\ndemo passed in {total} (portwise log: {})", log.display());
            } else {
                // Under the test suite: nothing worth keeping after a pass.
                let _ = std::fs::remove_dir_all(&work);
                println!("\ndemo passed in {total}");
            }
            ExitCode::SUCCESS
        }
    }
}

enum Outcome {
    Failed(anyhow::Error),
    Interrupted(&'static str),
}

/// What the demo started inside the runtime, kept outside the demo's future
/// so that it can be stopped however that future ends.
#[derive(Default)]
struct Rig {
    portwise: Option<Portwise>,
    /// HTTP listeners by pod name.
    http: Vec<(&'static str, HttpListener)>,
    /// Kept for their `Drop`, which closes the sockets.
    tcp: Vec<NameServer>,
    /// Dropped last among the demo's parts: kills kube-proxy and removes
    /// its rules.
    proxy: Option<KubeProxy>,
    ns: Option<TestNs>,
}

impl Rig {
    async fn shutdown(&mut self, own_cp: bool) -> Result<()> {
        let mut result = Ok(());
        if let Some(mut pw) = self.portwise.take() {
            // portwise promises exit 0 on SIGTERM, and soon.
            result = pw.stop_within(Duration::from_secs(15)).await.map(|_| ());
        }
        self.http.clear();
        self.tcp.clear();
        self.proxy = None;
        if let Some(ns) = self.ns.take() {
            if own_cp {
                // The whole control plane goes next: no need to tidy it.
                std::mem::forget(ns);
            } else {
                drop(ns);
            }
        }
        result
    }

    fn http(&self, pod: &str) -> Option<&HttpListener> {
        self.http.iter().find(|(p, _)| *p == pod).map(|(_, h)| h)
    }
}

async fn demo(rig: &mut Rig, work: &Path, own_cp: bool) -> Result<()> {
    // ---- 2. the colocated Service, its pods, real listeners ---------------
    step(
        2,
        "Service my-service (http 8080, https 8443, admin 9000), pods a-d",
    );
    let t = Instant::now();
    let cp = ControlPlane::shared().await?;
    let ns = rig.ns.insert(TestNs::new(cp, "demo").await?);
    let mut svc = service(SERVICE).annotation(GROUP_KEY, GROUP);
    for (name, port) in PORTS {
        svc = svc.port(name, port.into());
    }
    ns.create_service(svc).await?;
    let mut lines = Vec::new();
    for (i, plan) in PODS.iter().enumerate() {
        // Readable fixed addresses on our own control plane; unique ones
        // when sharing the test suite's network namespace with other tests.
        let ip: IpAddr = if own_cp {
            Ipv4Addr::new(10, 244, 0, 11 + i as u8).into()
        } else {
            next_ips().v4.into()
        };
        let mut servers = Vec::new();
        // Every server answers with its pod's name, so that a client
        // through the ClusterIP learns whom kube-proxy picked.
        if plan.http {
            let l = HttpListener::start(ip, 8080).await?;
            l.set_body(plan.name);
            rig.http.push((plan.name, l));
            servers.push("HTTP :8080");
        } else {
            servers.push("");
        }
        if plan.https {
            rig.tcp.push(NameServer::start(plan.name, ip, 8443).await?);
            servers.push("TCP :8443");
        } else {
            servers.push("");
        }
        if plan.admin {
            rig.tcp.push(NameServer::start(plan.name, ip, 9000).await?);
            servers.push("TCP :9000");
        } else {
            servers.push("");
        }
        let mut p = pod(plan.name)
            .annotation(GROUP_KEY, GROUP)
            .container_port("http", 8080, "TCP")
            .container_port("https", 8443, "TCP")
            .container_port("admin", 9000, "TCP")
            .ips([ip]);
        let mut note = String::new();
        if plan.marked {
            p = p.annotation(ADMIN_KEY, "true");
            note = format!("annotated {ADMIN_KEY}=true");
        }
        ns.create_pod(p).await?;
        lines.push(vec![
            format!("pod {}", plan.name),
            ip.to_string(),
            servers[0].into(),
            servers[1].into(),
            servers[2].into(),
            note,
        ]);
    }
    done(&format!("created in {}", secs(t.elapsed())));
    println!("{INDENT}all Ready; listening on their addresses:");
    print!("{}", columns(&lines));

    // ---- 3. portwise ---------------------------------------------------------
    heading(3, "portwise run (the real binary), one checker per port:");
    print!(
        "{}",
        columns(
            &MEMBERSHIP
                .iter()
                .map(|(p, e, k)| vec![p.to_string(), e.to_string(), k.to_string()])
                .collect::<Vec<_>>()
        )
    );
    let config = write_config(work)?;
    let t = Instant::now();
    // kube-proxy first, so that it routes as soon as the slices exist.
    rig.proxy = Some(KubeProxy::start(cp, ProxyMode::Nftables).await?);
    let pw = rig.portwise.insert(
        Portwise::builder(cp)
            .namespace(ns.name())
            .config(&config)
            .bin(&portwise_path()?)
            .dir(work)
            .quiet()
            .start()
            .await?,
    );
    println!("{INDENT}log: {}", pw.log_path().display());
    let ns = rig.ns.as_ref().expect("set above");
    converge(ns, pw, &expected_before()).await?;
    println!("{INDENT}slices converged in {}", secs(t.elapsed()));
    print_slices(ns).await?;
    println!(
        "{INDENT}http: a b c answer /healthz; https: b c d accept TCP; \
         admin (guest): a is marked, c accepts on 9000"
    );
    show_traffic(ns, &ANSWER_BEFORE).await?;

    // ---- 4. one pod turns unhealthy ------------------------------------------
    heading(4, &format!("pod {VICTIM}'s /healthz now answers 500"));
    rig.http(VICTIM)
        .ok_or_else(|| anyhow!("pod {VICTIM} has no HTTP listener"))?
        .route("/healthz", 500);
    let t = Instant::now();
    let pw = rig.portwise.as_mut().expect("started above");
    converge(ns, pw, &expected_after()).await?;
    println!(
        "{INDENT}{VICTIM} left http's slice in {}; it stays in https, whose TCP port still accepts (one slice per pod: it moved to https's)",
        secs(t.elapsed())
    );
    print_slices(ns).await?;
    show_traffic(ns, &ANSWER_AFTER).await?;
    Ok(())
}

/// Connects [`CONNECTIONS`] times through each port's ClusterIP until the
/// answers match `expected` (port, who answers, whether some picks are
/// refused), then prints them. kube-proxy programs its rules a moment after
/// the slices change, so this waits up to [`SETTLE`].
async fn show_traffic(ns: &TestNs, expected: &[(&str, &[&str], bool)]) -> Result<()> {
    let svc = ns.get_service(SERVICE).await?;
    let ip = cluster_ip(&svc, false)?;
    let t = Instant::now();
    let mut rows = Vec::new();
    loop {
        rows.clear();
        let mut all_match = true;
        for (port_name, answering, refusals) in expected {
            let port = PORTS
                .iter()
                .find(|(p, _)| p == port_name)
                .map(|(_, n)| *n)
                .context("unknown port")?;
            let speak = if *port_name == "http" {
                Speak::Http
            } else {
                Speak::Raw
            };
            let got =
                who_answers_speaking(std::net::SocketAddr::new(ip, port), CONNECTIONS, speak).await;
            let want: Vec<String> = answering.iter().map(|p| p.to_string()).collect();
            all_match &= got.pods() == want && (got.refused > 0) == *refusals && got.failed == 0;
            rows.push(traffic_row(port_name, ip, port, &got));
        }
        if all_match {
            break;
        }
        if t.elapsed() >= SETTLE {
            bail!(
                "traffic through {ip} did not match the slices within {}:\n{}",
                secs(SETTLE),
                columns(&rows)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "{INDENT}through the ClusterIP (kube-proxy, nftables mode), {CONNECTIONS} connections per port:"
    );
    print!("{}", columns(&rows));
    Ok(())
}

fn traffic_row(port_name: &str, ip: IpAddr, port: u16, got: &Answers) -> Vec<String> {
    let mut who: Vec<String> = got
        .by_pod
        .iter()
        .map(|(pod, n)| format!("{pod} x{n}"))
        .collect();
    if got.refused > 0 {
        who.push(format!("refused x{}", got.refused));
    }
    if got.failed > 0 {
        who.push(format!("failed x{}", got.failed));
    }
    vec![
        port_name.to_string(),
        std::net::SocketAddr::new(ip, port).to_string(),
        format!("answered by: {}", who.join(", ")),
    ]
}

/// [`CONNECTIONS`] new connections to `ip:port`; `http` asks `GET /` (the
/// listeners answer with their pod's name), else the server writes it.
/// Starts the control plane in `dir` (no native controllers: portwise is
/// the only writer of slices here), its chatter going to `log`.
fn start_control_plane(dir: &Path, log: &Path) -> Result<CpGuard> {
    let start = repo_root().join("tests/control-plane/start");
    let out = std::fs::File::create(log)?;
    let status = std::process::Command::new(&start)
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .status()
        .with_context(|| format!("running {}", start.display()))?;
    if !status.success() {
        let tail = tail(log, 40);
        bail!(
            "{} {} failed ({status}):\n{tail}",
            start.display(),
            dir.display()
        );
    }
    Ok(CpGuard {
        dir: Some(dir.to_path_buf()),
        log: log.to_path_buf(),
    })
}

/// Stops the control plane it names when dropped (errors and panics too).
struct CpGuard {
    dir: Option<PathBuf>,
    log: PathBuf,
}

impl CpGuard {
    fn stop(mut self) -> Result<()> {
        self.stop_now()
    }

    fn stop_now(&mut self) -> Result<()> {
        let Some(dir) = self.dir.take() else {
            return Ok(());
        };
        let stop = repo_root().join("tests/control-plane/stop");
        let out = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&self.log)?;
        let status = std::process::Command::new(&stop)
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .status()
            .with_context(|| format!("running {}", stop.display()))?;
        if !status.success() {
            bail!("{} {} failed ({status})", stop.display(), dir.display());
        }
        Ok(())
    }
}

impl Drop for CpGuard {
    fn drop(&mut self) {
        let _ = self.stop_now();
    }
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The config; puts the guest in the modules directory it names.
fn write_config(work: &Path) -> Result<String> {
    let guest = portwise_tests::guests_dir().join(GUEST);
    if !guest.is_file() {
        bail!(
            "{} is missing: build the guests first (guests/build rust)",
            guest.display()
        );
    }
    let modules = work.join("modules");
    std::fs::create_dir_all(&modules)?;
    std::fs::copy(&guest, modules.join(GUEST))
        .with_context(|| format!("copying {}", guest.display()))?;

    let mut yaml = format!(
        "managedBy: portwise\n\
         serviceKey: {{annotation: {GROUP_KEY}}}\n\
         resyncPeriod: 2s\n\
         modulesDir: {}\n\
         membership:\n  perPort:\n    ports:\n",
        modules.display()
    );
    for (port, expr, _) in MEMBERSHIP {
        writeln!(yaml, "      {port}: {expr}")?;
    }
    Ok(yaml)
}

/// The `portwise` binary: `$PORTWISE_BIN`, else the one built next to this
/// program, else wherever the support crate finds one.
fn portwise_path() -> Result<PathBuf> {
    if std::env::var_os("PORTWISE_BIN").is_none()
        && let Some(sibling) = std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(|d| d.join("portwise")))
        && sibling.is_file()
    {
        return Ok(sibling);
    }
    portwise_bin()
}

/// Polls until portwise publishes exactly `expected`, failing early when
/// portwise exits and after [`SETTLE`] otherwise.
async fn converge(ns: &TestNs, pw: &mut Portwise, expected: &ByPort) -> Result<()> {
    let start = Instant::now();
    loop {
        pw.check_running()
            .with_context(|| format!("see {}", pw.log_path().display()))?;
        let actual = endpoints_by_port(ns, SERVICE).await;
        if let Ok(actual) = &actual
            && actual == expected
        {
            return Ok(());
        }
        if start.elapsed() >= SETTLE {
            let actual = match actual {
                Ok(a) => show_by_port(&a),
                Err(e) => format!("(cannot read slices: {e:#})"),
            };
            bail!(
                "the expected slices did not appear within {}\n  expected: {}\n  actual:   {}",
                secs(SETTLE),
                show_by_port(expected),
                actual
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn show_by_port(by_port: &ByPort) -> String {
    if by_port.is_empty() {
        return "no slices".into();
    }
    by_port
        .iter()
        .map(|((port, family), pods)| {
            let pods: Vec<&str> = pods.iter().map(String::as_str).collect();
            format!(
                "{port}/{family} → {}",
                if pods.is_empty() {
                    "-".into()
                } else {
                    pods.join(" ")
                }
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

async fn print_slices(ns: &TestNs) -> Result<()> {
    let slices = slices_for(ns, SERVICE).await?;
    print!("{}", slice_table(&slices));
    Ok(())
}

/// One row per slice: SLICE, PORTS (every port its endpoints back, in the
/// Service's order), FAMILY, ENDPOINTS (pod and address). Each pod sits in
/// one slice of its family, as the native controller lays them out.
fn slice_table(slices: &[EndpointSlice]) -> String {
    let order = |port: &str| {
        PORTS
            .iter()
            .position(|(p, _)| *p == port)
            .unwrap_or(PORTS.len())
    };
    let mut rows: Vec<(Vec<usize>, Vec<String>)> = slices
        .iter()
        .map(|s| {
            let mut ports: Vec<(usize, String)> = s
                .ports
                .iter()
                .flatten()
                .map(|p| {
                    let name = p.name.clone().unwrap_or_default();
                    let num = p.port.map(|n| format!(" {n}")).unwrap_or_default();
                    (order(&name), format!("{name}{num}"))
                })
                .collect();
            ports.sort();
            let mut eps: Vec<(String, String)> = s
                .endpoints
                .iter()
                .flatten()
                .map(|e| {
                    let who = e
                        .target_ref
                        .as_ref()
                        .and_then(|r| r.name.clone())
                        .unwrap_or_else(|| "?".into());
                    (who, e.addresses.join(","))
                })
                .collect();
            eps.sort();
            let eps = if eps.is_empty() {
                "(none)".to_string()
            } else {
                eps.iter()
                    .map(|(who, addr)| format!("{who} {addr}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            (
                ports.iter().map(|(i, _)| *i).collect(),
                vec![
                    s.metadata.name.clone().unwrap_or_default(),
                    ports
                        .into_iter()
                        .map(|(_, p)| p)
                        .collect::<Vec<_>>()
                        .join(", "),
                    s.address_type.clone(),
                    eps,
                ],
            )
        })
        .collect();
    rows.sort();
    let mut table = vec![
        ["SLICE", "PORTS", "FAMILY", "ENDPOINTS"]
            .map(String::from)
            .to_vec(),
    ];
    table.extend(rows.into_iter().map(|(_, r)| r));
    columns(&table)
}

/// Left-aligned columns, two spaces apart, indented; trailing blanks cut.
fn columns(rows: &[Vec<String>]) -> String {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..n)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::from(INDENT);
        for (i, cell) in row.iter().enumerate() {
            line.push_str(cell);
            if i + 1 < row.len() {
                let pad = widths[i] - cell.chars().count() + 2;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

async fn signalled() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        // Without handlers the default dispositions apply; wait forever.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => "interrupted",
        _ = term.recv() => "terminated",
    }
}

/// A step whose outcome [`done`] completes on the same line.
fn step(n: u32, what: &str) {
    use std::io::Write;
    print!("\n[{n}/5] {what} ");
    let _ = std::io::stdout().flush();
}

/// A step whose details follow on lines of their own.
fn heading(n: u32, what: &str) {
    println!("\n[{n}/5] {what}");
}

fn done(what: &str) {
    println!("... {what}");
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Reports a failure, with the end of portwise's log when there is one.
fn fail(work: &Path, e: &anyhow::Error, log: Option<&Path>) -> ExitCode {
    eprintln!("\ndemo FAILED: {e:#}");
    if let Some(log) = log
        && log.is_file()
    {
        eprintln!(
            "---- last lines of {} ----\n{}",
            log.display(),
            tail(log, 25)
        );
    }
    eprintln!("everything the demo wrote is kept in {}", work.display());
    ExitCode::FAILURE
}
