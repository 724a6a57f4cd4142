//! The two commands behind the binary, kept in the library so tests and the
//! binary share them.
//!
//! * `run`: load and validate the configuration (refusing to start on any
//!   error, with the offending field's path), connect (KUBECONFIG or
//!   in-cluster), serve metrics and health, elect a leader if asked, and run
//!   the controller until SIGTERM/SIGINT; then release the Lease and exit 0.
//! * `check`: evaluate a checker against one pod and Service, from files or
//!   from the cluster, and print each verdict. Like `kwctl run`: guest
//!   authors try a `.wasm` without deploying it.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::ExitCode,
    sync::Arc,
    time::Duration,
};

use anyhow::{Context as _, bail};
use clap::Args;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::{Api, Client};
use tokio::sync::watch;
use tracing::{error, info};

use portwise_checkers::{BuildContext, WasmCheckers, build};
use portwise_controller::{self as controller, RunOptions};
use portwise_core::{
    align,
    config::{CheckerExpr, Config, WasmSpec},
};
use portwise_supply::{OciConfig, Supplier, default_cache_dir};
use portwise_wasm::{
    CompileSource, Limits, ProbeMode, Recorder, Recording, Replayer, WasmConfig, WasmRuntime,
};

use crate::ops::{
    self,
    client::{ClientOptions, connect},
};

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// The configuration file (see docs/configuration.md).
    #[arg(long, env = "PORTWISE_CONFIG")]
    pub config: PathBuf,
    /// Namespace to watch; repeat for several. Default: all namespaces.
    #[arg(long = "namespace", env = "PORTWISE_NAMESPACES", value_delimiter = ',')]
    pub namespaces: Vec<String>,
    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    #[arg(long, env = "PORTWISE_METRICS_ADDR", default_value = "0.0.0.0:9090")]
    pub metrics_addr: SocketAddr,
    /// Elect a leader on a coordination.k8s.io Lease; only the leader writes.
    #[arg(long, env = "PORTWISE_LEADER_ELECT", default_value_t = false)]
    pub leader_elect: bool,
    /// Namespace of the Lease (default: the pod's namespace, else `default`).
    #[arg(long, env = "POD_NAMESPACE")]
    pub lease_namespace: Option<String>,
    #[arg(long, env = "PORTWISE_LEASE_NAME", default_value = "portwise")]
    pub lease_name: String,
    /// This replica's name in the Lease and in Events.
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Lease duration; a new leader takes over at most this long after the
    /// old one vanished.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    pub lease_duration: Duration,
    /// Cache for compiled WebAssembly modules.
    #[arg(long, env = "PORTWISE_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Upper bound on one membership check; past it the check abstains.
    /// Default: the configured checker's worst case (its probe timeouts in
    /// sequence, guest call timeouts) plus 5 s, so a hung pod is excluded by
    /// its probe's own timeout rather than kept by an abstain.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub check_timeout: Option<Duration>,
    /// Deadline of one call into a WebAssembly guest.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    pub guest_deadline: Duration,
    /// Memory limit of one WebAssembly guest instance, in MiB.
    #[arg(long, default_value_t = 64)]
    pub guest_memory_mib: u64,
    /// Services reconciled at once.
    #[arg(long, default_value_t = 8)]
    pub reconcile_concurrency: u16,
}

#[derive(Args, Debug, Clone)]
pub struct CheckArgs {
    /// Take the membership checker (and modulesDir) from this config file.
    #[arg(long, conflicts_with_all = ["expr", "wasm"])]
    pub config: Option<PathBuf>,
    /// A checker expression in the config file's syntax, e.g.
    /// `{all: [podReady, {tcpDial: {timeout: 1s}}]}`.
    #[arg(long, conflicts_with = "wasm")]
    pub expr: Option<String>,
    /// A WebAssembly checker component to run (`.wasm`, or gzipped
    /// `.wasm.gz`).
    #[arg(long)]
    pub wasm: Option<PathBuf>,
    /// JSON configuration handed to the `--wasm` guest.
    #[arg(long, default_value = "null")]
    pub wasm_config: String,
    /// The pod, as a YAML or JSON file.
    #[arg(long, conflicts_with = "pod_name")]
    pub pod: Option<PathBuf>,
    /// The pod, fetched from the cluster.
    #[arg(long)]
    pub pod_name: Option<String>,
    /// The Service, as a YAML or JSON file.
    #[arg(long, conflicts_with = "service_name")]
    pub service: Option<PathBuf>,
    /// The Service, fetched from the cluster.
    #[arg(long)]
    pub service_name: Option<String>,
    /// Namespace for `--pod-name`/`--service-name`.
    #[arg(long, short = 'n', default_value = "default")]
    pub namespace: String,
    #[arg(long, env = "PORTWISE_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    /// After the verdicts, run every decision N more times on a reused
    /// instance and print p50/p99 per decision, and each module's compile,
    /// cached-load and instantiation time. Probes really happen (unless
    /// `--replay`).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub bench: Option<u32>,
    /// Save every probe the WebAssembly guests make, with its answer, to
    /// FILE (JSON; see docs/guests.md).
    #[arg(long, value_name = "FILE", conflicts_with = "replay")]
    pub record: Option<PathBuf>,
    /// Answer the guests' probes from FILE (made by `--record`) instead of
    /// the network. A probe not in it fails for the guest, is reported on
    /// stderr and makes the command exit 4.
    #[arg(long, value_name = "FILE")]
    pub replay: Option<PathBuf>,
    /// Judge a Service of the cluster with the live and the shadow
    /// membership of `--config` and print both verdicts for every pod and
    /// port, writing nothing. `--service` is then `NAMESPACE/NAME`.
    #[arg(long, requires = "config")]
    pub live: bool,
}

/// The largest `limits.memoryMiB` of these expressions, in bytes (0: none
/// set): what the pooling allocator's slots must fit.
fn largest_memory_limit(specs: &[&portwise_core::config::WasmSpec]) -> usize {
    specs
        .iter()
        .filter_map(|w| w.limits.memory_mib)
        .map(|mib| (mib as usize) << 20)
        .max()
        .unwrap_or(0)
}

/// The WebAssembly runtime's limits: the flags as every expression's
/// defaults, and a memory ceiling that fits the largest per-expression
/// `limits.memoryMiB` (the pooling allocator sizes its slots once, at start).
fn runtime_limits(config: &Config, args: &RunArgs) -> Limits {
    let default = (args.guest_memory_mib * 1024 * 1024) as usize;
    let largest = largest_memory_limit(&config.all_wasm_specs());
    Limits {
        deadline: args.guest_deadline,
        memory_bytes: default,
        max_memory_bytes: default.max(largest),
        ..Limits::default()
    }
}

/// `portwise check --replay` found probes with no recorded answer.
pub const EXIT_REPLAY_MISSED: u8 = 4;

/// `portwise run`.
pub async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let config = Config::load(&args.config)
        .with_context(|| format!("invalid configuration {}", args.config.display()))?;
    // Leader election's timings decide the API connections' TCP timeout
    // (ops::client explains why).
    let timings = args.leader_elect.then(|| {
        let secs = args.lease_duration.as_secs().max(3);
        ops::leader::Timings {
            lease_duration: Duration::from_secs(secs),
            renew_deadline: Duration::from_secs(secs).mul_f64(2.0 / 3.0),
            retry_period: Duration::from_secs(secs).mul_f64(2.0 / 15.0),
        }
    });
    let client_opts = match &timings {
        Some(t) => ClientOptions::elected(t),
        None => ClientOptions::standalone(),
    };
    // The elector renews on a client of its own: the controller's is fenced
    // by the term the elector hands out.
    let unfenced = connect(&client_opts)
        .await
        .context("no Kubernetes connection (set KUBECONFIG or run in a cluster)")?;

    let metrics = portwise_controller::metrics::Metrics::new();
    let readiness = ops::Readiness::new();
    let server = ops::http::OpsServer::bind(args.metrics_addr, metrics.clone(), readiness.clone())
        .await
        .with_context(|| format!("cannot serve metrics on {}", args.metrics_addr))?;
    let (server_stop_tx, server_stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(server.serve(async move {
        let _ = server_stop_rx.await;
    }));

    let wasm_specs = config.all_wasm_specs();
    let pulls = wasm_specs.iter().any(|s| s.oci().is_some());
    let wasm = if config.modules_dir.is_some() || pulls {
        Some(Arc::new(
            WasmRuntime::new(WasmConfig {
                supply: Arc::new(Supplier),
                oci: oci_config(&config),
                probes: Default::default(),
                modules_dir: config.modules_dir.clone(),
                cache_dir: Some(args.cache_dir.clone().unwrap_or_else(default_cache_dir)),
                watch: true,
                limits: runtime_limits(&config, &args),
            })
            .context("cannot start the WebAssembly runtime")?,
        ))
    } else {
        None
    };

    let mut module_reports = None;
    if let Some(rt) = &wasm {
        // Every replica reports its own modules, leading or not.
        module_reports = Some(report_wasm(
            rt.clone(),
            metrics.clone(),
            unfenced.clone(),
            config.managed_by.clone(),
        ));
        // oci:// modules, before the checker tree that uses them is built;
        // failures went to the Events and metrics above, and a checker on
        // a module that did not pull is refused with the reason.
        for (module, result) in rt.pull(&wasm_specs).await {
            match result {
                Ok(info) => info!(%module, sha256 = %info.sha256, "pulled module serving"),
                Err(e) => error!(%module, "{e}"),
            }
        }
    }

    let identity = ops::leader::identity(args.identity.as_deref());
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let elector = match timings {
        Some(timings) => {
            let ns = args
                .lease_namespace
                .clone()
                .unwrap_or_else(|| "default".into());
            Some(
                ops::leader::LeaderElector::start(
                    unfenced.clone(),
                    &ns,
                    &args.lease_name,
                    &identity,
                    timings,
                )
                .context("cannot start leader election")?,
            )
        }
        None => None,
    };
    let tenure = elector
        .as_ref()
        .map(|e| portwise_controller::Tenure::new(e.subscribe_term()));
    let client = match &tenure {
        Some(t) => connect(&client_opts.clone().fenced(t.clone())).await?,
        None => unfenced,
    };

    match &elector {
        Some(e) => e.track(&metrics),
        None => metrics.set_leader(true),
    }

    let check_timeout = args.check_timeout.unwrap_or_else(|| {
        worst_case(&config.membership, Limits::default().call_timeout) + Duration::from_secs(5)
    });
    let opts = RunOptions {
        namespaces: args.namespaces.clone(),
        check_timeout,
        metrics: metrics.clone(),
        leader: tenure,
        ready: Some(readiness.clone()),
        instance: Some(identity),
        wasm: wasm.clone().map(|w| w as Arc<dyn WasmCheckers>),
        reconcile_concurrency: args.reconcile_concurrency,
    };

    tokio::spawn(async move {
        wait_for_signal().await;
        info!("shutting down");
        let _ = shutdown_tx.send(true);
    });
    let mut rx = shutdown_rx.clone();
    let shutdown = async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let result = controller::run(client, config, opts, shutdown).await;
    readiness.set_ready(false);
    if result.is_err()
        && let Some(reports) = &module_reports
    {
        // A module that failed to load is the usual reason to stop here:
        // its Event is what `kubectl describe pod` shows, so let it out.
        reports.flush(Duration::from_secs(5)).await;
    }
    if let Some(e) = elector
        && let Err(err) = e.release().await
    {
        tracing::warn!(error = %err, "could not release the Lease; a successor waits for it to expire");
    }
    let _ = server_stop_tx.send(());
    let _ = server.await;
    match result {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            error!(error = %e, "controller failed");
            Err(e.into())
        }
    }
}

/// How `oci://` modules are pulled, from the configuration file.
fn oci_config(config: &Config) -> OciConfig {
    OciConfig {
        auth_file: config.registry_auth.clone(),
        ca_file: config.registry_ca.clone(),
        max_module_bytes: config.max_module_bytes,
        signature_keys: config
            .module_signatures
            .as_ref()
            .map(|s| s.keys.clone())
            .unwrap_or_default(),
        ..Default::default()
    }
}

/// The longest one evaluation of `expr` can take when every probe runs to
/// its timeout (`all`/`any` evaluate in sequence).
pub fn worst_case(expr: &CheckerExpr, guest_call: Duration) -> Duration {
    match expr {
        CheckerExpr::TcpDial(t) => t.timeout,
        CheckerExpr::HttpGet(h) => h.timeout,
        CheckerExpr::Wasm(_) => guest_call,
        CheckerExpr::All(xs) | CheckerExpr::Any(xs) => {
            xs.iter().map(|x| worst_case(x, guest_call)).sum()
        }
        CheckerExpr::Not(x) => worst_case(x, guest_call),
        CheckerExpr::Stable(s) => worst_case(&s.checker, guest_call),
        CheckerExpr::PerPort(p) => p
            .ports
            .values()
            .chain(p.fallback.as_deref())
            .map(|x| worst_case(x, guest_call))
            .max()
            .unwrap_or_default(),
        _ => Duration::ZERO,
    }
}

/// Feeds the WebAssembly runtime's module loads and guest failures into the
/// metrics, and turns module load failures into Events on portwise's own Pod
/// (when POD_NAME/POD_NAMESPACE tell us which), so an operator sees why a
/// new module version is not serving.
/// The task reporting module loads; [`ModuleReports::flush`] waits until
/// it has reported every load so far.
struct ModuleReports {
    flush: tokio::sync::mpsc::Sender<tokio::sync::oneshot::Sender<()>>,
}

impl ModuleReports {
    /// Waits (at most `limit`) until every module event sent so far has been
    /// logged, counted and published.
    async fn flush(&self, limit: Duration) {
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        if self.flush.send(done_tx).await.is_ok()
            && tokio::time::timeout(limit, done_rx).await.is_err()
        {
            tracing::warn!("module Events not all published within {limit:?}");
        }
    }
}

fn report_wasm(
    rt: Arc<WasmRuntime>,
    metrics: portwise_controller::metrics::Metrics,
    client: Client,
    managed_by: String,
) -> ModuleReports {
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    use portwise_controller::metrics::ModuleLoad;
    use portwise_wasm::CompileSource;

    let pod_ref = match (std::env::var("POD_NAME"), std::env::var("POD_NAMESPACE")) {
        (Ok(name), Ok(ns)) => Some(k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(name),
            namespace: Some(ns),
            ..Default::default()
        }),
        _ => None,
    };
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: managed_by,
            instance: None,
        },
    );
    let mut events = rt.subscribe();
    // Loads that happened while the runtime started, before we listened.
    for info in rt.modules() {
        let result = match info.compiled {
            CompileSource::Cached => ModuleLoad::Cached,
            CompileSource::Compiled => ModuleLoad::Compiled,
        };
        metrics.count_module_load(&info.module, result);
    }
    let m = metrics.clone();
    let (flush_tx, mut flush_rx) =
        tokio::sync::mpsc::channel::<tokio::sync::oneshot::Sender<()>>(1);
    tokio::spawn(async move {
        use tokio::sync::broadcast::error::{RecvError, TryRecvError};
        // A flush request is answered once every event already sent is
        // handled: those are in the channel by then, so draining it is
        // enough.
        let mut flushing: Option<tokio::sync::oneshot::Sender<()>> = None;
        loop {
            let ev = if flushing.is_some() {
                match events.try_recv() {
                    Ok(ev) => Ok(ev),
                    Err(TryRecvError::Lagged(n)) => Err(RecvError::Lagged(n)),
                    Err(TryRecvError::Empty | TryRecvError::Closed) => {
                        if let Some(done) = flushing.take() {
                            let _ = done.send(());
                        }
                        continue;
                    }
                }
            } else {
                tokio::select! {
                    ev = events.recv() => ev,
                    Some(done) = flush_rx.recv() => {
                        flushing = Some(done);
                        continue;
                    }
                }
            };
            let ev = match ev {
                Ok(ev) => ev,
                Err(RecvError::Lagged(n)) => {
                    tracing::warn!(
                        missed = n,
                        "module events came faster than they were reported"
                    );
                    continue;
                }
                Err(RecvError::Closed) => break,
            };
            let result = match (ev.ok, ev.compiled) {
                (false, _) => ModuleLoad::Failed,
                (true, Some(CompileSource::Cached)) => ModuleLoad::Cached,
                (true, _) => ModuleLoad::Compiled,
            };
            m.count_module_load(&ev.module, result);
            if ev.ok {
                info!(module = %ev.module, "{}", ev.message);
                continue;
            }
            tracing::warn!(module = %ev.module, "{}", ev.message);
            if let Some(r) = &pod_ref {
                let note = Event {
                    type_: EventType::Warning,
                    reason: "ModuleLoadFailed".into(),
                    note: Some(ev.message.chars().take(1000).collect()),
                    action: "LoadModule".into(),
                    secondary: None,
                };
                if let Err(e) = recorder.publish(&note, r).await {
                    tracing::debug!(error = %e, "could not publish module Event");
                }
            }
        }
    });
    // Guest failures are atomics in the runtime, read at every scrape.
    read_guest_failures(&metrics, rt);
    ModuleReports { flush: flush_tx }
}

/// Makes `portwise_guest_failures_total` read `rt`'s failure counters at
/// scrape time, with the runtime's kinds mapped to the metric's labels.
fn read_guest_failures(metrics: &portwise_controller::metrics::Metrics, rt: Arc<WasmRuntime>) {
    use portwise_controller::metrics::GuestFailure;
    use portwise_wasm::FailureKind;
    metrics.read_guest_failures(move || {
        rt.failures()
            .into_iter()
            .map(|f| {
                let kind = match f.kind {
                    FailureKind::Load | FailureKind::Config => GuestFailure::Load,
                    FailureKind::Trap => GuestFailure::Trap,
                    FailureKind::Deadline => GuestFailure::Deadline,
                    FailureKind::Memory => GuestFailure::Memory,
                    FailureKind::InvalidAnswer => GuestFailure::Invalid,
                    FailureKind::DeniedProbe => GuestFailure::Denied,
                };
                (f.module, kind, f.count)
            })
            .collect()
    });
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

fn read_object<T: serde::de::DeserializeOwned>(path: &Path) -> anyhow::Result<T> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_saphyr::from_str(&text)
        .with_context(|| format!("{} is not a valid object", path.display()))
}

/// `portwise check --live`: the live and shadow verdicts of every pod of a
/// Service in the cluster, side by side. Reads only (GET and LIST).
async fn check_live(args: &CheckArgs) -> anyhow::Result<ExitCode> {
    use portwise_core::shadow::{self, Pick};
    let path = args.config.as_ref().context("--live needs --config FILE")?;
    let cfg =
        Config::load(path).with_context(|| format!("invalid configuration {}", path.display()))?;
    let target = args
        .service
        .as_ref()
        .map(|p| p.to_string_lossy().to_string())
        .or_else(|| {
            args.service_name
                .as_ref()
                .map(|n| format!("{}/{n}", args.namespace))
        })
        .context("give the Service with --service NAMESPACE/NAME")?;
    let (ns, name) = target
        .split_once('/')
        .with_context(|| format!("--service {target:?}: expected NAMESPACE/NAME"))?;
    let client = connect(&ClientOptions::standalone())
        .await
        .context("no Kubernetes connection (set KUBECONFIG or run in a cluster)")?;
    let svc: Service = Api::namespaced(client.clone(), ns)
        .get(name)
        .await
        .with_context(|| format!("cannot read Service {ns}/{name}"))?;
    let group = portwise_core::align::key_value(&svc.metadata, &cfg.service_key)
        .with_context(|| {
            format!(
                "Service {ns}/{name} does not carry the serviceKey: portwise does not manage it"
            )
        })?
        .to_string();
    let pods: Vec<Arc<Pod>> = Api::<Pod>::namespaced(client, ns)
        .list(&Default::default())
        .await
        .with_context(|| format!("cannot list pods in {ns}"))?
        .items
        .into_iter()
        .filter(|p| {
            portwise_core::align::key_value(&p.metadata, cfg.pod_key()) == Some(group.as_str())
        })
        .map(Arc::new)
        .collect();

    let all_exprs = cfg.all_wasm_specs();
    let pulls = all_exprs.iter().any(|s| s.oci().is_some());
    let runtime = match (&cfg.modules_dir, pulls) {
        (None, false) => None,
        (dir, _) => Some(WasmRuntime::new(WasmConfig {
            supply: Arc::new(Supplier),
            oci: oci_config(&cfg),
            probes: Default::default(),
            modules_dir: dir.clone(),
            cache_dir: Some(args.cache_dir.clone().unwrap_or_else(default_cache_dir)),
            watch: false,
            limits: Limits {
                max_memory_bytes: largest_memory_limit(&all_exprs),
                ..Limits::default()
            },
        })?),
    };
    if let Some(rt) = &runtime {
        for (module, result) in rt.pull(&all_exprs).await {
            if let Err(e) = result {
                eprintln!("{module}: {e}");
            }
        }
    }
    let ctx = BuildContext {
        wasm: runtime.as_ref().map(|r| r as &dyn WasmCheckers),
        ..BuildContext::default()
    };
    let live = build(&cfg.membership, &ctx).map_err(|e| anyhow::anyhow!("{e}"))?;
    let pick = shadow::pick(&svc, cfg.shadow.as_ref());
    let shadow_expr = match (&pick, &cfg.shadow) {
        (Pick::Default, Some(sh)) => sh.membership.as_ref(),
        (Pick::Named(n), Some(sh)) => sh.expressions.get(n),
        _ => None,
    };
    let shadow_checker = shadow_expr
        .map(|e| portwise_checkers::build_at(e, &ctx, &pick.label()))
        .transpose()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    match &pick {
        Pick::Unknown(n) => println!(
            "Service {ns}/{name} names shadow {n:?}, which {} does not have: live verdicts only",
            path.display()
        ),
        Pick::Off => println!("Service {ns}/{name} has no shadow: live verdicts only"),
        _ => println!(
            "Service {ns}/{name}: live membership against {}",
            pick.label()
        ),
    }

    let svc = Arc::new(svc);
    let subjects = align::subjects(&svc, &pods);
    println!(
        "{:<16} {:<6} {:<24} {:<40} {:<8} {:<8} {:<5} REASONS (live | shadow)",
        "PORT", "FAMILY", "POD", "ADDRESS", "LIVE", "SHADOW", "DIFF"
    );
    let word = |d: portwise_core::membership::Decision| format!("{d:?}").to_lowercase();
    let (mut differ, total) = (0usize, subjects.len());
    for s in &subjects {
        let l = live.check(s).await;
        let sh = match &shadow_checker {
            Some(c) => Some(c.check(s).await),
            None => None,
        };
        let diff = sh.as_ref().is_some_and(|v| v.decision != l.decision);
        differ += usize::from(diff);
        let port = if s.port.name.is_empty() {
            s.port.port.to_string()
        } else {
            s.port.name.clone()
        };
        println!(
            "{:<16} {:<6} {:<24} {:<40} {:<8} {:<8} {:<5} {} | {}",
            port,
            format!("{:?}", s.family).to_lowercase(),
            s.pod.metadata.name.as_deref().unwrap_or_default(),
            format!("{}:{}", s.address, s.port.target),
            word(l.decision),
            sh.as_ref().map_or("-".to_string(), |v| word(v.decision)),
            if diff { "yes" } else { "" },
            l.reason.unwrap_or_default(),
            sh.and_then(|v| v.reason).unwrap_or_default(),
        );
    }
    if shadow_checker.is_some() {
        println!("{differ} of {total} verdicts differ; nothing was written");
    }
    Ok(ExitCode::SUCCESS)
}

/// `portwise check`.
pub async fn check(args: CheckArgs) -> anyhow::Result<ExitCode> {
    if args.live {
        return check_live(&args).await;
    }
    let needs_cluster = args.pod_name.is_some() || args.service_name.is_some();
    let client = if needs_cluster {
        Some(
            connect(&ClientOptions::standalone())
                .await
                .context("no Kubernetes connection")?,
        )
    } else {
        None
    };
    let pod: Pod = match (&args.pod, &args.pod_name) {
        (Some(p), _) => read_object(p)?,
        (None, Some(n)) => {
            Api::namespaced(client.clone().unwrap(), &args.namespace)
                .get(n)
                .await?
        }
        _ => bail!("give the pod with --pod FILE or --pod-name NAME"),
    };
    let svc: Service = match (&args.service, &args.service_name) {
        (Some(p), _) => read_object(p)?,
        (None, Some(n)) => {
            Api::namespaced(client.unwrap(), &args.namespace)
                .get(n)
                .await?
        }
        _ => bail!("give the Service with --service FILE or --service-name NAME"),
    };

    let mut oci = OciConfig::default();
    let (expr, modules_dir): (CheckerExpr, Option<PathBuf>) = if let Some(path) = &args.config {
        let cfg = Config::load(path)
            .with_context(|| format!("invalid configuration {}", path.display()))?;
        oci = oci_config(&cfg);
        (cfg.membership.clone(), cfg.modules_dir.clone())
    } else if let Some(e) = &args.expr {
        let expr: CheckerExpr = serde_saphyr::from_str(e).context("invalid --expr")?;
        expr.validate_at("--expr", true)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        (expr, None)
    } else if let Some(w) = &args.wasm {
        let dir = w
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        let file = w
            .file_name()
            .context("--wasm must name a file")?
            .to_string_lossy()
            .to_string();
        let config: serde_json::Value =
            serde_json::from_str(&args.wasm_config).context("--wasm-config is not JSON")?;
        let dir = if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir
        };
        (
            CheckerExpr::Wasm(WasmSpec {
                module: file,
                config,
                sha256: None,
                limits: Default::default(),
                allow_tags: false,
            }),
            Some(dir),
        )
    } else {
        (CheckerExpr::default(), None)
    };

    let (probes, recorder, replayer) = if let Some(path) = &args.replay {
        let recording = Recording::read(path).map_err(|e| anyhow::anyhow!("--replay {e}"))?;
        let replayer = Arc::new(Replayer::new(recording));
        (ProbeMode::Replay(replayer.clone()), None, Some(replayer))
    } else if args.record.is_some() {
        let recorder = Arc::new(Recorder::new());
        (ProbeMode::Record(recorder.clone()), Some(recorder), None)
    } else {
        (ProbeMode::Live, None, None)
    };
    if (args.record.is_some() || args.replay.is_some()) && uses_builtin_probes(&expr) {
        eprintln!(
            "portwise: note: only WebAssembly guests' probes are recorded and replayed; \
             the built-in tcpDial and httpGet checkers in this expression probe the network"
        );
    }
    let cache_dir = args.cache_dir.clone().unwrap_or_else(default_cache_dir);
    let pulls = expr.wasm_specs().iter().any(|s| s.oci().is_some());
    let runtime = match (modules_dir, pulls) {
        (None, false) => None,
        (dir, _) => Some(WasmRuntime::new(WasmConfig {
            supply: Arc::new(Supplier),
            oci,
            modules_dir: dir,
            cache_dir: Some(cache_dir.clone()),
            watch: false,
            limits: Limits {
                max_memory_bytes: largest_memory_limit(&expr.wasm_specs()),
                ..Limits::default()
            },
            probes,
        })?),
    };
    if let Some(rt) = &runtime {
        for (module, result) in rt.pull(&expr.wasm_specs()).await {
            if let Err(e) = result {
                eprintln!("{module}: {e}");
            }
        }
    }
    let checker = build(
        &expr,
        &BuildContext {
            wasm: runtime.as_ref().map(|r| r as &dyn WasmCheckers),
            ..BuildContext::default()
        },
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;

    let svc = Arc::new(svc);
    let pod = Arc::new(pod);
    let subjects = align::subjects(&svc, std::slice::from_ref(&pod));
    if subjects.is_empty() {
        // The controller's candidate rules apply unchanged, so that a verdict
        // here is the one a cluster would get; say which rule bit when it is
        // the one people trip over trying a probe on their own machine.
        let claimed: std::collections::BTreeSet<String> = pod
            .status
            .iter()
            .flat_map(|s| {
                s.pod_ips
                    .iter()
                    .flatten()
                    .map(|i| i.ip.clone())
                    .chain(s.pod_ip.clone())
            })
            .collect();
        let unusable: Vec<&String> = claimed
            .iter()
            .filter(|ip| align::parse_ip(ip).is_some_and(|ip| !align::is_endpoint_address(ip)))
            .collect();
        if !unusable.is_empty() && unusable.len() == claimed.len() {
            println!(
                "pod is not a candidate: its addresses ({}) are loopback, link-local or \
                 otherwise not valid endpoint addresses, which portwise never probes or \
                 publishes; give the pod an address where your server listens (see \
                 docs/guests.md, \"Trying a checker without a cluster\")",
                unusable
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        } else {
            println!(
                "pod is not a candidate for any port of the Service (terminal phase, no IP of the Service's families, or no matching target port)"
            );
        }
        return Ok(ExitCode::from(3));
    }
    println!(
        "{:<16} {:<6} {:<40} {:<8} REASON",
        "PORT", "FAMILY", "ADDRESS", "VERDICT"
    );
    for s in &subjects {
        let v = checker.check(s).await;
        let (port, family, address) = row(s);
        println!(
            "{port:<16} {family:<6} {address:<40} {:<8} {}",
            format!("{:?}", v.decision).to_lowercase(),
            v.reason.unwrap_or_default()
        );
    }
    // The recording holds the probes behind the table, not the benchmark's
    // repeats of them (a replay answers repeats with the last answer).
    if let (Some(recorder), Some(path)) = (&recorder, &args.record) {
        let recording = recorder.finish();
        recording
            .write(path)
            .map_err(|e| anyhow::anyhow!("--record {e}"))?;
        eprintln!(
            "portwise: recorded {} probe(s) to {}",
            recording.probes.len(),
            path.display()
        );
    }
    if let Some(runs) = args.bench {
        let how = if args.replay.is_some() {
            "probes replayed"
        } else {
            "probes live"
        };
        bench(&*checker, &subjects, runs, how).await;
        if let Some(rt) = &runtime {
            bench_modules(rt, &expr, &cache_dir, runs).await?;
        }
    }
    if let Some(replayer) = &replayer {
        let misses = replayer.misses();
        if !misses.is_empty() {
            let path = args.replay.as_deref().unwrap_or(Path::new(""));
            eprintln!(
                "portwise: replay: {} probe(s) had no recorded answer in {} \
                 (the guest got probe-error.io):",
                misses.len(),
                path.display()
            );
            for m in &misses {
                eprintln!("  {} ({}×)", m.probe, m.count);
            }
            return Ok(ExitCode::from(EXIT_REPLAY_MISSED));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The port, family and address columns of a subject's row.
fn row(s: &portwise_core::membership::Subject) -> (String, String, String) {
    let port = if s.port.name.is_empty() {
        s.port.port.to_string()
    } else {
        s.port.name.clone()
    };
    (
        port,
        format!("{:?}", s.family).to_lowercase(),
        format!("{}:{}", s.address, s.port.target),
    )
}

/// Whether `expr` has a built-in checker that probes (not recorded or
/// replayed: only guests' probes go through the WebAssembly host).
fn uses_builtin_probes(expr: &CheckerExpr) -> bool {
    match expr {
        CheckerExpr::TcpDial(_) | CheckerExpr::HttpGet(_) => true,
        CheckerExpr::All(xs) | CheckerExpr::Any(xs) => xs.iter().any(uses_builtin_probes),
        CheckerExpr::Not(x) => uses_builtin_probes(x),
        CheckerExpr::Stable(s) => uses_builtin_probes(&s.checker),
        CheckerExpr::PerPort(p) => p
            .ports
            .values()
            .chain(p.fallback.as_deref())
            .any(uses_builtin_probes),
        _ => false,
    }
}

/// The modules `expr` runs, as the runtime names them (`x` is `x.wasm`).
fn wasm_modules(expr: &CheckerExpr) -> std::collections::BTreeSet<String> {
    let mut found = std::collections::BTreeSet::new();
    let mut stack = vec![expr];
    while let Some(e) = stack.pop() {
        match e {
            CheckerExpr::Wasm(w) => {
                let m = &w.module;
                found.insert(if m.ends_with(".wasm") || m.ends_with(".wasm.gz") {
                    m.clone()
                } else {
                    format!("{m}.wasm")
                });
            }
            CheckerExpr::All(xs) | CheckerExpr::Any(xs) => stack.extend(xs),
            CheckerExpr::Not(x) => stack.push(x),
            CheckerExpr::Stable(s) => stack.push(&s.checker),
            CheckerExpr::PerPort(p) => stack.extend(p.ports.values().chain(p.fallback.as_deref())),
            _ => {}
        }
    }
    found
}

/// The `q` quantile (nearest rank) of sorted durations.
fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// `--bench`: each decision `runs` times in a row (after the table's run,
/// which warmed the instance up), timed one by one.
async fn bench(
    checker: &dyn portwise_checkers::Checker,
    subjects: &[portwise_core::membership::Subject],
    runs: u32,
    how: &str,
) {
    println!();
    println!("bench: {runs} runs of each decision on a reused instance, {how}");
    println!(
        "{:<16} {:<6} {:<40} {:>10} {:>10} {:>10} {:>10}",
        "PORT", "FAMILY", "ADDRESS", "P50 (ms)", "P99 (ms)", "MIN (ms)", "MAX (ms)"
    );
    for s in subjects {
        let mut times = Vec::with_capacity(runs as usize);
        for _ in 0..runs {
            let started = std::time::Instant::now();
            let _ = checker.check(s).await;
            times.push(started.elapsed());
        }
        times.sort_unstable();
        let (port, family, address) = row(s);
        println!(
            "{port:<16} {family:<6} {address:<40} {:>10.3} {:>10.3} {:>10.3} {:>10.3}",
            ms(quantile(&times, 0.5)),
            ms(quantile(&times, 0.99)),
            ms(times[0]),
            ms(times[times.len() - 1]),
        );
    }
}

/// `--bench`, per module: a compile with no cache, a load from the
/// compiled-code cache (which the first load filled), and fresh
/// instantiations.
async fn bench_modules(
    rt: &WasmRuntime,
    expr: &CheckerExpr,
    cache_dir: &Path,
    runs: u32,
) -> anyhow::Result<()> {
    let fresh = |cache_dir: Option<PathBuf>| {
        WasmRuntime::new(WasmConfig {
            supply: Arc::new(Supplier),
            oci: Default::default(),
            modules_dir: None,
            cache_dir,
            watch: false,
            limits: Limits::default(),
            probes: ProbeMode::Live,
        })
    };
    let instantiations = runs.min(20) as usize;
    let used = wasm_modules(expr);
    for info in rt
        .modules()
        .into_iter()
        .filter(|m| used.contains(&m.module))
    {
        let compiled = fresh(None)?.load_file(&info.source).await?;
        let cached = fresh(Some(cache_dir.to_path_buf()))?
            .load_file(&info.source)
            .await?;
        let cached = match cached.compiled {
            CompileSource::Cached => format!("{:.1} ms", ms(cached.load_time)),
            CompileSource::Compiled => "n/a (the cache did not keep it)".into(),
        };
        let mut inst = rt.time_instantiation(&info.module, instantiations).await?;
        inst.sort_unstable();
        println!(
            "module {} (portwise:membership@{}, {:.1} KB): compile {:.1} ms, cached load {cached}, \
             instantiate {:.3} ms (p50 of {instantiations})",
            info.module,
            info.interface,
            info.size as f64 / 1000.0,
            ms(compiled.load_time),
            ms(quantile(&inst, 0.5)),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worst_case_adds_sequences_and_takes_the_longest_port() {
        let expr: CheckerExpr = serde_saphyr::from_str(
            "perPort: {ports: {http: {all: [podReady, {httpGet: {path: /, timeout: 2s}}, {tcpDial: {timeout: 3s}}]}}, \
             fallback: {not: {wasm: {module: x.wasm}}}}",
        )
        .unwrap();
        assert_eq!(
            worst_case(&expr, Duration::from_secs(1)),
            Duration::from_secs(5)
        );
        assert_eq!(
            worst_case(&expr, Duration::from_secs(9)),
            Duration::from_secs(9)
        );
        assert_eq!(
            worst_case(&CheckerExpr::PodReady, Duration::from_secs(9)),
            Duration::ZERO
        );
    }

    #[tokio::test]
    async fn guest_failures_metric_reads_the_runtimes_counters_at_scrape_time() {
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("bad.wasm");
        std::fs::write(&bad, b"not a component").unwrap();
        let rt = Arc::new(
            WasmRuntime::new(WasmConfig {
                supply: Arc::new(Supplier),
                oci: Default::default(),
                probes: Default::default(),
                modules_dir: None,
                cache_dir: None,
                watch: false,
                limits: Limits::default(),
            })
            .unwrap(),
        );
        let metrics = portwise_controller::metrics::Metrics::new();
        read_guest_failures(&metrics, rt.clone());
        let series = |text: &str, kind: &str| {
            let prefix =
                format!(r#"portwise_guest_failures_total{{module="bad.wasm",kind="{kind}"}} "#);
            text.lines()
                .find_map(|l| l.strip_prefix(prefix.as_str()).map(str::to_string))
        };
        assert_eq!(series(&metrics.encode(), "load"), None);
        // A load failure is counted by the runtime (kind `load`) ...
        rt.load_file(&bad).await.unwrap_err();
        rt.load_file(&bad).await.unwrap_err();
        // ... and the next scrape sees it, with the zeros of the other kinds.
        let text = metrics.encode();
        assert_eq!(series(&text, "load").as_deref(), Some("2"), "{text}");
        assert_eq!(series(&text, "trap").as_deref(), Some("0"), "{text}");
        assert!(
            text.contains("# TYPE portwise_guest_failures counter\n"),
            "{text}"
        );
    }
}
