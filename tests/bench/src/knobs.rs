//! The environment knobs (`./bench --help` lists them) and the repository
//! root.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    time::Duration,
};

pub(crate) struct Knobs {
    pub(crate) services: usize,
    pub(crate) pods_per_service: usize,
    pub(crate) big_pods: usize,
    pub(crate) steady: Duration,
    pub(crate) probe_pods: usize,
    pub(crate) probe_window: Duration,
    pub(crate) setup_concurrency: usize,
    /// Row 8: readiness flips per controller.
    pub(crate) datapath_flips: usize,
    /// Row 9: unmanaged pods created in other namespaces.
    pub(crate) unmanaged_pods: usize,
    /// Row 1b: cold starts of each controller.
    pub(crate) fair_runs: usize,
    pub(crate) rows: BTreeSet<u32>,
    pub(crate) out: Option<PathBuf>,
    pub(crate) native_fast: bool,
    /// Extra top-level config lines for row 1's portwise (experiments,
    /// e.g. `nativeCleanup: false`); empty for the published run.
    pub(crate) portwise_extra: String,
    /// Row 8's runs (each `datapath_flips` flips per controller).
    pub(crate) datapath_runs: usize,
    /// Row 3's readiness flips per Service size for reconcile times.
    pub(crate) reconcile_flips: usize,
    /// Row 3's slice writes per verb and size.
    pub(crate) verb_writes: usize,
    /// Extra flags for row 1b's portwise (e.g. `--reconcile-concurrency=16`).
    pub(crate) row1b_args: String,
}

pub(crate) fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

impl Knobs {
    pub(crate) fn from_env() -> Self {
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
    pub(crate) fn row(&self, n: u32) -> bool {
        self.rows.contains(&n)
    }
}

pub(crate) fn repo_root() -> PathBuf {
    // This crate is tests/bench.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("tests/bench has a grandparent")
        .to_path_buf()
}
