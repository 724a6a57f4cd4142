//! Row 16, capacity (issue 49): how many checks sharded replicas make when
//! each is held to the same CPU quota, beside one replica of `--shards 1`
//! under that quota.
//!
//! The demand is far above what one quota can serve (every pod's HTTP
//! port judged by `httpGet`, due again 100 ms after its Service's last
//! reconcile), so the rate is each run's capacity: 2 replicas should make
//! close to twice the checks of one, 4 close to four times, and the work
//! should split evenly between them. One HTTP listener on 0.0.0.0 answers
//! every pod address (the test network namespace makes 10.244.0.0/16
//! local), in the bench's own process.
//!
//! The quota is the kernel's CFS bandwidth control: cgroup v2's `cpu.max`
//! where the cpu controller is delegated, else cgroup v1's
//! `cpu.cfs_quota_us` (what this machine has), one cgroup per replica.

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use portwise_tests::{HttpListener, Portwise, TestNs};

use crate::Bench;
use crate::knobs::env_usize;
use crate::objects::{COST_KEY, Kind, TARGET_PORT, create_groups, groups};
use crate::process::{Controller, scrape, stop_portwise};
use crate::report::Goal;
use crate::shards::converged;
use crate::stats::ratio;

const MANAGER: &str = "portwise-capacity";
const SHARDS: usize = 16;

/// A cgroup holding processes to `cores` CPUs (CFS bandwidth), removed on
/// drop (once its processes are gone).
pub(crate) struct Quota {
    dir: PathBuf,
    v2: bool,
}

impl Quota {
    pub(crate) fn new(name: &str, cores: f64) -> Result<Self> {
        const PERIOD: u64 = 100_000;
        let quota = (cores * PERIOD as f64).round() as u64;
        let v2root = Path::new("/sys/fs/cgroup");
        let v2 = std::fs::read_to_string(v2root.join("cgroup.subtree_control"))
            .is_ok_and(|c| c.split_whitespace().any(|c| c == "cpu"));
        let dir = if v2 {
            v2root.join(name)
        } else {
            Path::new("/sys/fs/cgroup/cpu").join(name)
        };
        if dir.exists() {
            let _ = std::fs::remove_dir(&dir);
        }
        std::fs::create_dir(&dir).with_context(|| {
            format!(
                "cannot make the cgroup {} (cgroup v2's cpu controller or v1's cpu hierarchy is needed)",
                dir.display()
            )
        })?;
        if v2 {
            std::fs::write(dir.join("cpu.max"), format!("{quota} {PERIOD}"))?;
        } else {
            std::fs::write(dir.join("cpu.cfs_period_us"), PERIOD.to_string())?;
            std::fs::write(dir.join("cpu.cfs_quota_us"), quota.to_string())?;
        }
        Ok(Self { dir, v2 })
    }

    /// Moves process `pid` (all its threads) into the cgroup.
    pub(crate) fn add(&self, pid: u32) -> Result<()> {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
            .with_context(|| format!("cannot move {pid} into {}", self.dir.display()))
    }

    /// Periods in which the cgroup was throttled, of all periods so far.
    pub(crate) fn throttled(&self) -> (u64, u64) {
        let stat = std::fs::read_to_string(self.dir.join("cpu.stat")).unwrap_or_default();
        let get = |k: &str| {
            stat.lines()
                .find_map(|l| l.strip_prefix(k)?.trim().parse::<u64>().ok())
                .unwrap_or(0)
        };
        let _ = self.v2;
        (get("nr_throttled "), get("nr_periods "))
    }
}

impl Drop for Quota {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// One run's figures: per replica, checks per second, CPU cores used, and
/// throttled periods of all.
struct Run {
    replicas: usize,
    rates: Vec<f64>,
    cores: Vec<f64>,
    throttled: Vec<(u64, u64)>,
}

impl Bench {
    pub(crate) async fn capacity(&mut self) -> Result<()> {
        let spaces = env_usize("BENCH_CAPACITY_NAMESPACES", 50);
        let pods = env_usize("BENCH_CAPACITY_PODS", 2000);
        let millicores = env_usize("BENCH_CAPACITY_MILLICORES", 150);
        let window = Duration::from_secs(env_usize("BENCH_CAPACITY_SECS", 20) as u64);
        let cores = millicores as f64 / 1000.0;
        let per = pods.div_ceil(spaces);
        eprintln!(
            "bench: row 16 setup: {spaces} namespaces × 1 Service × {per} pods, one listener for all"
        );
        let listener = HttpListener::start(Ipv4Addr::UNSPECIFIED, TARGET_PORT as u16)
            .await
            .context("one HTTP listener for every pod address")?;
        let mut nss = Vec::new();
        // Within 10.244.0.0/16 (reachable), past row 5's pods.
        let base = 40_000;
        for i in 0..spaces {
            let ns = TestNs::new(self.cp, "bench-capacity").await?;
            if i == 0 {
                self.ensure_nodes(&ns).await?;
            }
            let gs = groups("c", 1, per, base + i * per);
            create_groups(
                &ns,
                Kind::Cost,
                &gs,
                &self.nodes,
                self.knobs.setup_concurrency,
            )
            .await?;
            nss.push(ns);
        }
        let lease_ns = nss[0].name().to_string();
        let config = format!(
            "managedBy: {MANAGER}\n\
             serviceKey: {{annotation: {COST_KEY}}}\n\
             resyncPeriod: 100ms\n\
             maxConcurrentChecks: 64\n\
             membership: {{perPort: {{ports: {{http: {{httpGet: {{path: /healthz, timeout: 1s}}}}}}, fallback: podReady}}}}\n"
        );
        let mut runs = Vec::new();
        for (run, replicas) in [1usize, 2, 4].into_iter().enumerate() {
            let shards = if replicas == 1 { 1 } else { SHARDS };
            eprintln!(
                "bench: row 16: {replicas} replica(s) of --shards {shards}, {cores} cores each"
            );
            let mut pws: Vec<Portwise> = Vec::new();
            let mut quotas = Vec::new();
            for r in 0..replicas {
                let id = format!("row16-{run}-{r}");
                let quota = Quota::new(&format!("portwise-bench-{id}"), cores)?;
                let pw = self
                    .spawn_replica(&id, &config, &lease_ns, &format!("row16-{run}"), shards)
                    .await?;
                quota.add(pw.pid().context("portwise has no pid")?)?;
                pws.push(pw);
                quotas.push(quota);
            }
            let measured = async {
                converged(&nss, MANAGER, per, &mut pws, shards / replicas).await?;
                // Past the cold start: steady probing only.
                tokio::time::sleep(Duration::from_secs(5)).await;
                let mut c0 = Vec::new();
                for pw in &pws {
                    c0.push((scrape(pw, "portwise_checks_total").await?, pw.usage().cpu));
                }
                let t0 = Instant::now();
                let q0: Vec<(u64, u64)> = quotas.iter().map(Quota::throttled).collect();
                tokio::time::sleep(window).await;
                let el = t0.elapsed().as_secs_f64();
                let mut rates = Vec::new();
                let mut used = Vec::new();
                for (pw, (c, cpu)) in pws.iter_mut().zip(&c0) {
                    pw.check_alive()?;
                    rates.push((scrape(pw, "portwise_checks_total").await? - c) / el);
                    used.push((pw.usage().cpu - cpu) / el);
                }
                let throttled = quotas
                    .iter()
                    .zip(&q0)
                    .map(|(q, (t0, p0))| {
                        let (t, p) = q.throttled();
                        (t - t0, p - p0)
                    })
                    .collect();
                anyhow::Ok(Run {
                    replicas,
                    rates,
                    cores: used,
                    throttled,
                })
            }
            .await;
            for pw in &mut pws {
                stop_portwise(pw).await;
            }
            drop(quotas);
            let r = measured?;
            eprintln!(
                "bench:   {:.0} checks/s in all; per replica {:?} checks/s, {:?} cores, throttled {:?}",
                r.rates.iter().sum::<f64>(),
                r.rates.iter().map(|x| x.round()).collect::<Vec<_>>(),
                r.cores
                    .iter()
                    .map(|x| (x * 100.0).round() / 100.0)
                    .collect::<Vec<_>>(),
                r.throttled
            );
            runs.push(r);
        }
        let answered = listener.request_count();
        listener.stop();
        drop(nss);
        if runs.len() != 3 {
            bail!("row 16: a run is missing");
        }
        self.protocol.push(format!(
            "- Row 16 (capacity) setup (not counted): {spaces} namespaces `bench-capacity-*`, each one Service with {per} Ready pods whose port `http` is judged by `httpGet` (`resyncPeriod: 100ms`, `maxConcurrentChecks: 64`: the demand, {:.0} checks/s, is far above any run's rate); one HTTP listener on 0.0.0.0:{TARGET_PORT} in the bench answers them all ({answered} requests over the row). Runs: one replica of `--leader-elect --shards 1`, then 2 and 4 of `--shards {SHARDS}`; every replica in a cgroup of its own held to {cores} CPUs (CFS bandwidth: `cpu.max`, or cgroup v1's `cpu.cfs_quota_us`). Rate = growth of `portwise_checks_total` over {} s, 5 s after every slice was published and the buckets balanced.",
            (spaces * per) as f64 / 0.1,
            window.as_secs()
        ));
        let one: f64 = runs[0].rates.iter().sum();
        let label = format!("16 capacity ({} CPUs per replica, S={SHARDS})", cores);
        let r = &mut self.report;
        for run in &runs[1..] {
            let n = run.replicas;
            let all: f64 = run.rates.iter().sum();
            let goal = if n == 2 { 1.8 } else { 3.4 };
            let x = ratio(all, one);
            r.row(
                &label,
                &format!("checks/s, all {n} replicas (portwise column) ÷ one replica of --shards 1 (native column)"),
                format!("{all:.0}/s"),
                format!("{one:.0}/s"),
                x,
                Goal::Stated(
                    if n == 2 { "≥ 1.8×" } else { "≥ 3.4×" },
                    x.is_some_and(|x| x >= goal),
                ),
            );
            let mean = all / n as f64;
            let busiest = run.rates.iter().copied().fold(0.0, f64::max);
            let spread = ratio(busiest, mean);
            r.row(
                &label,
                &format!(
                    "the busiest of {n} replicas' checks ÷ the mean (per replica: {}; CPU used: {} cores)",
                    run.rates
                        .iter()
                        .map(|x| format!("{x:.0}/s"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    run.cores
                        .iter()
                        .map(|x| format!("{x:.2}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                format!("{busiest:.0}/s"),
                format!("{mean:.0}/s"),
                spread,
                Goal::Stated("≤ 1.25×", spread.is_some_and(|x| x <= 1.25)),
            );
        }
        let base = &runs[0];
        r.row(
            &label,
            "one replica of --shards 1: CPU used in the window, and periods throttled by its quota",
            format!(
                "{:.2} cores, {} of {} periods",
                base.cores[0], base.throttled[0].0, base.throttled[0].1
            ),
            "n/a".into(),
            None,
            Goal::None,
        );
        Ok(())
    }
}
