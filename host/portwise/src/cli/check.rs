//! `portwise check`: one checker against one pod and Service, from files
//! or from the cluster, each verdict printed; with `--record`/`--replay`
//! for the guests' probes. `--live` is in `live.rs`, `--bench` in
//! `bench.rs`.

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
    sync::Arc,
};

use anyhow::{Context as _, bail};
use clap::Args;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::Api;

use portwise_checkers::{BuildContext, WasmCheckers, build};
use portwise_core::{
    align,
    config::{CheckerExpr, Config, WasmSpec},
};
use portwise_wasm::{Limits, ProbeMode, Recorder, Recording, Replayer, WasmConfig, WasmRuntime};

use super::{
    bench::{bench, bench_modules},
    largest_memory_limit,
    live::check_live,
    oci_config, row,
};
use crate::ops::client::{ClientOptions, connect};

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

/// `portwise check --replay` found probes with no recorded answer.
pub const EXIT_REPLAY_MISSED: u8 = 4;

/// `portwise check`.
pub async fn check(args: CheckArgs) -> anyhow::Result<ExitCode> {
    if args.live {
        // `--service` is then NAMESPACE/NAME.
        let target = args
            .service
            .as_ref()
            .map(|p| p.to_string_lossy().to_string())
            .or_else(|| {
                args.service_name
                    .as_ref()
                    .map(|n| format!("{}/{n}", args.namespace))
            });
        let cache_dir = args
            .cache_dir
            .clone()
            .unwrap_or_else(portwise_supply::default_cache_dir);
        return check_live(args.config.as_deref(), target, cache_dir).await;
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

    let mut oci = portwise_supply::OciConfig::default();
    // A configuration's `podAddresses` judges here as in the cluster;
    // without one, any address is judged (as the default file does).
    let mut pod_addresses = portwise_core::config::PodAddresses::default();
    let (expr, modules_dir): (CheckerExpr, Option<PathBuf>) = if let Some(path) = &args.config {
        let cfg = Config::load(path)
            .with_context(|| format!("invalid configuration {}", path.display()))?;
        oci = oci_config(&cfg);
        pod_addresses = cfg.pod_addresses.clone();
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
             the built-in tcpDial, httpGet and grpc checkers in this expression probe the network"
        );
    }
    let cache_dir = args
        .cache_dir
        .clone()
        .unwrap_or_else(portwise_supply::default_cache_dir);
    let pulls = expr.wasm_specs().iter().any(|s| s.oci().is_some());
    let runtime = match (modules_dir, pulls) {
        (None, false) => None,
        (dir, _) => Some(
            WasmRuntime::new(WasmConfig {
                supply: Arc::new(portwise_supply::Supplier),
                oci,
                modules_dir: dir,
                expressions: Some(expr.wasm_specs().into_iter().cloned().collect()),
                cache_dir: Some(cache_dir.clone()),
                watch: false,
                limits: Limits {
                    max_memory_bytes: largest_memory_limit(&expr.wasm_specs()),
                    ..Limits::default()
                },
                probes,
            })
            .await?,
        ),
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
    .await
    .map_err(|e| anyhow::anyhow!("{e}"))?;

    let svc = Arc::new(svc);
    let pod = Arc::new(pod);
    let subjects = align::subjects(&svc, std::slice::from_ref(&pod), &pod_addresses);
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
                "pod is not a candidate for any port of the Service (terminal phase, no IP of the Service's families, \
                 a hostNetwork pod or addresses outside the configuration's podAddresses, or no matching target port)"
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

/// Whether `expr` has a built-in checker that probes (not recorded or
/// replayed: only guests' probes go through the WebAssembly host).
fn uses_builtin_probes(expr: &CheckerExpr) -> bool {
    match expr {
        CheckerExpr::TcpDial(_) | CheckerExpr::HttpGet(_) | CheckerExpr::Grpc(_) => true,
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

fn read_object<T: serde::de::DeserializeOwned>(path: &Path) -> anyhow::Result<T> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_saphyr::from_str(&text)
        .with_context(|| format!("{} is not a valid object", path.display()))
}
