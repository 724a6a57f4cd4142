//! `portwise check --bench`: decision latencies on a reused instance, and
//! each module's compile, cached-load and instantiation time.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use portwise_core::config::CheckerExpr;
use portwise_wasm::{CompileSource, Limits, ProbeMode, WasmConfig, WasmRuntime};

use super::row;

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
pub(super) async fn bench(
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
pub(super) async fn bench_modules(
    rt: &WasmRuntime,
    expr: &CheckerExpr,
    cache_dir: &Path,
    runs: u32,
) -> anyhow::Result<()> {
    let fresh = |cache_dir: Option<PathBuf>| {
        WasmRuntime::new(WasmConfig {
            supply: std::sync::Arc::new(portwise_supply::Supplier),
            oci: Default::default(),
            modules_dir: None,
            expressions: None,
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
        let compiled = fresh(None).await?.load_file(&info.source).await?;
        let cached = fresh(Some(cache_dir.to_path_buf()))
            .await?
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
