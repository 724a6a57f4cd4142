//! `portwise run`: the controller process, from flags and configuration
//! file to a clean exit.

use std::{
    net::SocketAddr, num::NonZeroU32, path::PathBuf, process::ExitCode, sync::Arc, time::Duration,
};

use anyhow::Context as _;
use clap::Args;
use tokio::sync::watch;
use tracing::{error, info, warn};

use portwise_checkers::WasmCheckers;
use portwise_controller::{self as controller, Leadership, RunOptions, Tenure, Warmup};
use portwise_core::{config::Config, shard::Shards};
use portwise_supply::default_cache_dir;
use portwise_wasm::{Limits, WasmConfig, WasmRuntime};

use super::{largest_memory_limit, oci_config, report::report_wasm};
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
    /// Buckets of namespaces shared among the replicas (issue 49): each
    /// replica holds some on Leases, and watches pods, probes and writes
    /// only there (Services are watched everywhere). Fixed for the life of
    /// an install: every replica must be started with the same count (see
    /// docs/operations.md, "Sharding").
    /// 1: one leader does everything. Above 1 needs --leader-elect.
    #[arg(long, env = "PORTWISE_SHARDS", default_value_t = NonZeroU32::MIN,
          value_parser = shard_count)]
    pub shards: NonZeroU32,
    /// Lease duration, at least 3 s; a new leader takes over at most this
    /// long after the old one vanished.
    #[arg(long, default_value = "15s", value_parser = lease_duration)]
    pub lease_duration: Duration,
    /// Cache for compiled WebAssembly modules.
    #[arg(long, env = "PORTWISE_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Upper bound on one membership check; past it the check abstains.
    /// Default: the longest worst case of `membership` and every shadow
    /// expression (probe timeouts in sequence, each guest's own
    /// `limits.callTimeout`) plus 5 s, so a hung pod is excluded by its
    /// probe's own timeout rather than kept by an abstain. A value below
    /// that worst case is refused at start, naming the expression.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub check_timeout: Option<Duration>,
    /// Deadline of one call into a WebAssembly guest.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    pub guest_deadline: Duration,
    /// Memory limit of one WebAssembly guest instance, in MiB (1 to 4096: a
    /// 32-bit linear memory holds at most 4 GiB).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub guest_memory_mib: u64,
    /// Services reconciled at once.
    #[arg(long, default_value_t = 8)]
    pub reconcile_concurrency: u16,
    /// With an annotation key and no --namespace: the most namespaces whose
    /// pods are watched one by one, one connection each (only namespaces
    /// that hold a managed Service). If the managed Services span more at
    /// start, pods are watched cluster-wide with one watch instead (every
    /// pod is received). 0: always cluster-wide.
    #[arg(long, default_value_t = 256)]
    pub pod_watch_namespaces: usize,
    /// The managed Services of one namespace whose per-Service metric
    /// series are exposed (the first in name order); the rest are counted
    /// in `portwise_service_series_omitted`. Their labels are chosen by
    /// whoever may create Services, so one tenant must not be able to
    /// grow every scrape without bound.
    #[arg(long, default_value_t = portwise_controller::metrics::DEFAULT_SERVICES_PER_NAMESPACE,
          value_parser = at_least_one)]
    pub max_service_series_per_namespace: usize,
}

/// The most buckets: a bucket is a Lease and an elector's task each.
const MAX_SHARDS: u32 = 1024;

/// `--shards`: 1 to [`MAX_SHARDS`].
fn shard_count(s: &str) -> Result<NonZeroU32, String> {
    let n: u32 = s
        .parse()
        .map_err(|e: std::num::ParseIntError| e.to_string())?;
    match NonZeroU32::new(n) {
        Some(n) if n.get() <= MAX_SHARDS => Ok(n),
        _ => Err(format!("must be 1 to {MAX_SHARDS}")),
    }
}

/// A count of at least one.
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// The shortest Lease: the renew deadline (2/3 of it) and retry period
/// (2/15) must stay whole-second-ish and apart.
const MIN_LEASE_DURATION: Duration = Duration::from_secs(3);

/// `--lease-duration`: a humantime duration of at least
/// [`MIN_LEASE_DURATION`], refused below it rather than raised in silence.
fn lease_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| e.to_string())?;
    if d < MIN_LEASE_DURATION {
        return Err(format!(
            "{} is below the shortest lease, {}",
            humantime::format_duration(d),
            humantime::format_duration(MIN_LEASE_DURATION)
        ));
    }
    Ok(d)
}

/// The WebAssembly runtime's limits: the flags as every expression's
/// defaults, and a memory ceiling that fits the largest per-expression
/// `limits.memoryMiB` (the pooling allocator sizes its slots once, at start).
pub(super) fn runtime_limits(config: &Config, args: &RunArgs) -> Limits {
    let default = (args.guest_memory_mib * 1024 * 1024) as usize;
    let largest = largest_memory_limit(&config.all_wasm_specs());
    Limits {
        deadline: args.guest_deadline,
        memory_bytes: default,
        max_memory_bytes: default.max(largest),
        ..Limits::default()
    }
}

/// How the replicas agree on who writes where.
/// The runtime (one worker thread, `portwise-leases`) and the client that
/// leader election and the shard ring run on.
struct LeaseRuntime {
    runtime: Option<tokio::runtime::Runtime>,
    client: kube::Client,
}

impl LeaseRuntime {
    async fn start(opts: &ClientOptions) -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("portwise-leases")
            .enable_all()
            .build()
            .context("cannot start the Leases' runtime")?;
        // Made there, so that its connections are driven there too.
        let opts = opts.clone();
        let client = runtime
            .spawn(async move { connect(&opts).await })
            .await
            .context("the Leases' runtime")?
            .context("no Kubernetes connection for the Leases")?;
        Ok(Self {
            runtime: Some(runtime),
            client,
        })
    }

    /// Tasks spawned while the guard lives run on this runtime.
    fn enter(&self) -> tokio::runtime::EnterGuard<'_> {
        self.runtime.as_ref().expect("running").enter()
    }

    async fn spawn<T: Send + 'static>(
        &self,
        fut: impl std::future::Future<Output = T> + Send + 'static,
    ) -> anyhow::Result<T> {
        self.runtime
            .as_ref()
            .expect("running")
            .spawn(fut)
            .await
            .context("the Leases' runtime")
    }
}

impl Drop for LeaseRuntime {
    /// Inside the main runtime a runtime may not block on its own drop.
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

enum Coordination {
    /// No election: this replica writes everything.
    Sole,
    /// One leader on one Lease.
    Elector(ops::leader::LeaderElector),
    /// Buckets of namespaces, each on a Lease of its own (issue 49).
    Ring(ops::shards::Ring),
}

/// `portwise run`.
pub async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        args.shards.get() == 1 || args.leader_elect,
        "--shards {} needs --leader-elect: the buckets are held on Leases",
        args.shards
    );
    let config = Config::load(&args.config)
        .with_context(|| format!("invalid configuration {}", args.config.display()))?;
    if config.pod_addresses.cidrs.is_empty() {
        // Allowed, as the native controller publishes any pod address; but
        // whoever can write a pod's status then chooses where portwise
        // probes (docs/operations.md, "Running portwise for many teams").
        tracing::warn!(
            "podAddresses.cidrs is not set: pods are probed and published at any address their \
             status claims; set it to the cluster's pod networks"
        );
    }
    // Before anything connects: a configuration whose guests could outgrow
    // the container would be OOM-killed here and again on the standby.
    let memory_limit = super::budget::container_memory_limit();
    let worst = super::budget::check(&config, &runtime_limits(&config, &args), memory_limit)
        .with_context(|| format!("invalid configuration {}", args.config.display()))?;
    if worst.bytes > 0 {
        info!(
            guest_memory_worst_case_mib = worst.bytes >> 20,
            container_memory_limit_mib = memory_limit.map(|b| b >> 20),
            "WebAssembly guests fit the memory limit"
        );
    }
    // Leader election's timings decide the API connections' TCP timeout
    // (ops::client explains why).
    let timings = args.leader_elect.then(|| {
        let secs = args.lease_duration.as_secs();
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

    let metrics = portwise_controller::metrics::Metrics::with_build(crate::build::INFO);
    metrics
        .services
        .limit(args.max_service_series_per_namespace);
    let readiness = ops::Readiness::new();
    let server = ops::http::OpsServer::bind(args.metrics_addr, metrics.clone(), readiness.clone())
        .await
        .with_context(|| format!("cannot serve metrics on {}", args.metrics_addr))?;
    let (server_stop_tx, server_stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(server.serve(async move {
        let _ = server_stop_rx.await;
    }));

    let identity = ops::leader::identity(args.identity.as_deref());
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let shards = Shards::new(args.shards);
    // Leases are renewed on a thread and a client of their own: the
    // controller's runtime can be busy for seconds on end decoding a large
    // pod list, and renewals queued behind that came too late (bench row
    // 14 at 100,000 pods: every bucket's term lost at once, every 10 s).
    // The kernel shares the cores between threads, so a renewal waits for
    // a time slice, not for the controller's work.
    let leases = match timings {
        None => None,
        Some(timings) => Some((timings, LeaseRuntime::start(&client_opts).await?)),
    };
    let coordination = match &leases {
        None => Coordination::Sole,
        Some((timings, leases)) => {
            let timings = *timings;
            let ns = args
                .lease_namespace
                .clone()
                .unwrap_or_else(|| "default".into());
            if shards.count() == 1 {
                let _on = leases.enter();
                Coordination::Elector(
                    ops::leader::LeaderElector::start(
                        leases.client.clone(),
                        &ns,
                        &args.lease_name,
                        &identity,
                        timings,
                    )
                    .context("cannot start leader election")?,
                )
            } else {
                let cfg = ops::shards::RingConfig {
                    namespace: ns,
                    name: args.lease_name.clone(),
                    identity: identity.clone(),
                    shards,
                    timings,
                    manager: config.managed_by.clone(),
                };
                let client = leases.client.clone();
                Coordination::Ring(
                    leases
                        .spawn(async move { ops::shards::Ring::join(client, cfg).await })
                        .await?
                        .context("cannot join the shard ring")?,
                )
            }
        }
    };
    let (leadership, warmup) = match &coordination {
        Coordination::Sole => (Leadership::Sole, None),
        Coordination::Elector(e) => (Leadership::Leader(Tenure::new(e.subscribe_term())), None),
        Coordination::Ring(ring) => (
            Leadership::Shards {
                shards,
                terms: ring.terms(),
            },
            Some(Warmup {
                warming: ring.warming(),
                warm: ring.warm_reporter(),
            }),
        ),
    };
    let client = match &leadership {
        Leadership::Sole => unfenced.clone(),
        fenced => connect(&client_opts.clone().fenced(fenced.clone())).await?,
    };

    match &coordination {
        Coordination::Sole => metrics.process.set_leader(true),
        Coordination::Elector(e) => e.track(&metrics),
        // The controller reports its buckets as their terms change.
        Coordination::Ring(_) => metrics
            .process
            .set_buckets_held(shards.count(), &Default::default()),
    }

    // Sharded, a SIGTERM first hands the buckets over to warm successors
    // while the controller still writes them (at most a lease duration);
    // then everything stops as without shards.
    let drain = match &coordination {
        Coordination::Ring(ring) => timings.map(|t| (ring.drain(), t.lease_duration)),
        _ => None,
    };
    tokio::spawn(async move {
        wait_for_signal().await;
        if let Some((drain, within)) = drain {
            info!("handing the buckets over to warm successors before shutting down");
            if !drain.run(within).await {
                warn!(
                    ?within,
                    "not every bucket was handed over in time: the rest are released cold"
                );
            }
        }
        info!("shutting down");
        let _ = shutdown_tx.send(true);
    });
    // The config file is read again when it changes: a valid new one is
    // applied by running the controller again on it (the caches are
    // listed again, every Service judged afresh, and only what changes is
    // written; the Lease, the metrics and the HTTP endpoints stay); an
    // invalid one is refused and the running one keeps running.
    let mut changes = super::reload::changes(&args.config)?;
    metrics.process.set_config_loaded(true);
    let mut config = config;
    let mut prepared = wasm_for(&config, &args, &metrics, &unfenced).await?;
    let result = loop {
        let (wasm, module_reports) = prepared;
        let check_timeout =
            config.check_timeout(args.check_timeout, Limits::default().call_timeout)?;
        let opts = RunOptions {
            namespaces: args.namespaces.clone(),
            check_timeout,
            metrics: metrics.clone(),
            leader: leadership.clone(),
            warmup: warmup.clone(),
            ready: Some(readiness.clone()),
            instance: Some(identity.clone()),
            wasm: wasm.clone().map(|w| w as Arc<dyn WasmCheckers>),
            reconcile_concurrency: args.reconcile_concurrency,
            pod_watch_namespaces: args.pod_watch_namespaces,
        };
        let (stop_tx, mut stop_rx) = watch::channel(false);
        let mut rx = shutdown_rx.clone();
        let shutdown = async move {
            tokio::select! {
                _ = rx.wait_for(|s| *s) => {}
                _ = stop_rx.wait_for(|s| *s) => {}
            }
        };
        let run = controller::run(client.clone(), config.clone(), opts, shutdown);
        tokio::pin!(run);
        let next = loop {
            tokio::select! {
                result = &mut run => break Err(result),
                Some(()) = changes.recv() => {
                    match super::reload::load(&args, Limits::default().call_timeout) {
                        Ok(new) if new == config => metrics.process.set_config_loaded(true),
                        // Its modules are loaded before the running
                        // controller stops: one that does not load
                        // refuses the file, as it would at start.
                        Ok(new) => match wasm_for(&new, &args, &metrics, &unfenced).await {
                            Ok(next) => {
                                info!(config = %args.config.display(), "the config file changed: applying it");
                                let _ = stop_tx.send(true);
                                if let Err(e) = (&mut run).await {
                                    break Err(Err(e));
                                }
                                metrics.process.set_config_loaded(true);
                                break Ok((new, next));
                            }
                            Err(e) => refused(&metrics, &unfenced, &config, e).await,
                        },
                        Err(e) => refused(&metrics, &unfenced, &config, e).await,
                    }
                }
            }
        };
        match next {
            Ok((new, next)) => {
                drop((wasm, module_reports));
                config = new;
                prepared = next;
            }
            Err(result) => {
                if result.is_err()
                    && let Some(reports) = &module_reports
                {
                    // A module that failed to load is the usual reason to
                    // stop here: its Event is what `kubectl describe pod`
                    // shows, so let it out.
                    reports.flush(Duration::from_secs(5)).await;
                }
                break result;
            }
        }
    };
    readiness.set_ready(false);
    match coordination {
        Coordination::Sole => {}
        Coordination::Elector(e) => {
            if let Err(err) = e.release().await {
                tracing::warn!(error = %err, "could not release the Lease; a successor waits for it to expire");
            }
        }
        Coordination::Ring(ring) => {
            if let Err(err) = ring.leave().await {
                tracing::warn!(error = %err, "could not leave the shard ring; its buckets wait for their Leases to expire");
            }
        }
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

/// A changed config file that does not load: said, counted, and raised on
/// portwise's Pod; the running one keeps running.
async fn refused(
    metrics: &portwise_controller::metrics::Metrics,
    client: &kube::Client,
    running: &Config,
    e: anyhow::Error,
) {
    let why = format!("{e:#}; the running configuration is kept");
    error!("{why}");
    metrics.process.set_config_loaded(false);
    super::reload::report_refused(client, &running.managed_by, &why).await;
}

/// The WebAssembly runtime a config needs (none without modules), its
/// modules reported on, its `oci://` modules pulled.
async fn wasm_for(
    config: &Config,
    args: &RunArgs,
    metrics: &portwise_controller::metrics::Metrics,
    client: &kube::Client,
) -> anyhow::Result<(
    Option<Arc<WasmRuntime>>,
    Option<super::report::ModuleReports>,
)> {
    let wasm_specs = config.all_wasm_specs();
    let pulls = wasm_specs.iter().any(|s| s.oci().is_some());
    // Teams' policy objects may name modules later, when the file allows.
    let objects_run_wasm = config
        .membership_policies
        .as_ref()
        .is_some_and(|l| l.checkers.iter().any(|c| c == "wasm"));
    let wasm = if config.modules_dir.is_some() || pulls || objects_run_wasm {
        Some(Arc::new(
            WasmRuntime::new(WasmConfig {
                supply: Arc::new(portwise_supply::Supplier),
                oci: oci_config(config),
                probes: Default::default(),
                modules_dir: config.modules_dir.clone(),
                expressions: Some(wasm_specs.iter().map(|s| (*s).clone()).collect()),
                cache_dir: Some(args.cache_dir.clone().unwrap_or_else(default_cache_dir)),
                watch: true,
                limits: runtime_limits(config, args),
            })
            .await
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
            client.clone(),
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

    Ok((wasm, module_reports))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 24: a lease below the floor is refused, not clamped.
    #[test]
    fn a_lease_below_three_seconds_is_refused() {
        assert_eq!(lease_duration("3s"), Ok(Duration::from_secs(3)));
        let err = lease_duration("2s").unwrap_err();
        assert!(err.contains("below the shortest lease, 3s"), "{err}");
        assert!(lease_duration("x").is_err());
    }
}
