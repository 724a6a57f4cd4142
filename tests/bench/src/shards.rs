//! Row 14, sharded replicas (issue 49): what each replica of `--shards 16`
//! keeps, beside one replica of `--shards 1` on the same cluster.
//!
//! The same managed set (one Service per namespace, its Ready pods, over
//! `BENCH_SHARD_NAMESPACES` namespaces) is synced cold by one replica of
//! `--shards 1`, then by 2 and by 4 replicas of `--shards 16` started
//! together. Each run starts from no slice (the previous run's are
//! deleted), so each publishes everything. Measured once every replica is
//! balanced and every slice is right: each replica's pods cached, its peak
//! and current RSS, its CPU seconds, and the time to converge.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::{Api, api::ListParams};
use portwise_tests::{MANAGED_BY_LABEL, Portwise, TestNs};

use crate::Bench;
use crate::knobs::env_usize;
use crate::objects::{COST_KEY, Kind, create_groups, endpoints_of, groups};
use crate::process::{Controller, Usage, scrape, spawn_portwise, stop_portwise};
use crate::report::Goal;
use crate::stats::{ratio, secs};

/// Row 14's manager: no other row's Services are its.
const MANAGER: &str = "portwise-shards";
const SHARDS: usize = 16;

/// One replica's figures once its run has converged.
struct Share {
    usage: Usage,
    cached_pods: f64,
    buckets: f64,
}

impl Bench {
    /// One replica `id` of `--leader-elect --shards SHARDS`, its Leases
    /// `lease_name…` in `lease_ns`, watching every namespace.
    pub(crate) async fn spawn_replica(
        &self,
        id: &str,
        config: &str,
        lease_ns: &str,
        lease_name: &str,
        shards: usize,
    ) -> Result<Portwise> {
        let shards = shards.to_string();
        spawn_portwise(
            self.cp,
            &self.work,
            id,
            config,
            &[],
            &[
                "--leader-elect",
                "--lease-namespace",
                lease_ns,
                "--lease-name",
                lease_name,
                "--identity",
                id,
                "--shards",
                &shards,
            ],
        )
        .await
    }

    pub(crate) async fn sharded_replicas(&mut self) -> Result<()> {
        let spaces = env_usize("BENCH_SHARD_NAMESPACES", 50);
        let pods = env_usize("BENCH_SHARD_PODS", 20_000);
        let per = pods.div_ceil(spaces);
        let conc = self.knobs.setup_concurrency;
        eprintln!("bench: row 14 setup: {spaces} namespaces × 1 Service × {per} pods");
        let mut nss = Vec::new();
        // Past every other row's addresses (row 9's are never reached
        // either: readiness only).
        let base = 120_000;
        for i in 0..spaces {
            let ns = TestNs::new(self.cp, "bench-shard").await?;
            if i == 0 {
                self.ensure_nodes(&ns).await?;
            }
            let gs = groups("h", 1, per, base + i * per);
            create_groups(&ns, Kind::Cost, &gs, &self.nodes, conc).await?;
            nss.push(ns);
        }
        self.protocol.push(format!(
            "- Row 14 setup (not counted): {spaces} namespaces `bench-shard-*`, each one Service with {per} Ready pods (the key `{COST_KEY}` as an annotation; portwise: `managedBy: {MANAGER}`, cluster-wide, `membership: podReady`). Runs: one replica of `--leader-elect --shards 1`, then 2 and then 4 replicas of `--shards {SHARDS}` started together; each run from no slice."
        ));
        let names: Vec<String> = nss.iter().map(|n| n.name().to_string()).collect();
        let lease_ns = names[0].clone();

        let mut runs: Vec<(usize, Duration, Vec<Share>)> = Vec::new();
        for (run, replicas) in [1usize, 2, 4].into_iter().enumerate() {
            for ns in &nss {
                let api: Api<EndpointSlice> = ns.api();
                api.delete_collection(
                    &Default::default(),
                    &ListParams::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGER}")),
                )
                .await?;
            }
            tokio::time::sleep(Duration::from_secs(3)).await;
            eprintln!("bench: row 14: {replicas} replica(s)");
            let shards = if replicas == 1 { 1 } else { SHARDS };
            let config = format!(
                "managedBy: {MANAGER}\nserviceKey: {{annotation: {COST_KEY}}}\nmembership: podReady\n"
            );
            let t0 = Instant::now();
            let mut pws: Vec<Portwise> = Vec::new();
            for r in 0..replicas {
                let id = format!("row14-{run}-{r}");
                pws.push(
                    self.spawn_replica(&id, &config, &lease_ns, &format!("row14-{run}"), shards)
                        .await?,
                );
            }
            let took = converged(&nss, MANAGER, per, &mut pws, shards / replicas).await?;
            // Settled: the gauges are sampled every second.
            tokio::time::sleep(Duration::from_secs(5)).await;
            let mut shares = Vec::new();
            for pw in &pws {
                shares.push(Share {
                    usage: pw.usage(),
                    cached_pods: scrape(pw, "portwise_cache_objects{kind=\"pods\"").await?,
                    buckets: scrape(pw, "portwise_bucket_held").await?,
                });
            }
            for pw in &mut pws {
                stop_portwise(pw).await;
            }
            eprintln!(
                "bench:   converged in {}; per replica: {}",
                secs(took - t0),
                shares
                    .iter()
                    .map(|s| format!(
                        "{:.0} pods, {:.0} buckets, peak RSS {:.0} MiB",
                        s.cached_pods, s.buckets, s.usage.hwm_mib
                    ))
                    .collect::<Vec<_>>()
                    .join("; ")
            );
            runs.push((replicas, took - t0, shares));
        }
        // Deleted (dropped) before row 9, whose portwise manages the same key.
        drop(nss);

        let (_, one_time, one) = &runs[0];
        let one = &one[0];
        let r = &mut self.report;
        let label = format!("14 sharded replicas ({spaces} namespaces, {pods} pods)");
        for (n, time, shares) in &runs[1..] {
            let most = |f: fn(&Share) -> f64| shares.iter().map(f).fold(0.0, f64::max);
            let goal = 1.0 / *n as f64 + 0.25;
            let pods_ratio = ratio(most(|s| s.cached_pods), one.cached_pods);
            r.row(
                &label,
                &format!("pods cached, the fullest of {n} replicas (portwise column) ÷ one replica of --shards 1 (native column)"),
                format!("{:.0}", most(|s| s.cached_pods)),
                format!("{:.0}", one.cached_pods),
                pods_ratio,
                Goal::Stated("≤ 1/N + 0.25", pods_ratio.is_some_and(|x| x <= goal)),
            );
            let rss_ratio = ratio(most(|s| s.usage.rss_mib), one.usage.rss_mib);
            r.row(
                &label,
                &format!("RSS once converged, the largest of {n} ÷ one replica"),
                format!("{:.0} MiB", most(|s| s.usage.rss_mib)),
                format!("{:.0} MiB", one.usage.rss_mib),
                rss_ratio,
                Goal::Stated("≤ 1/N + 0.25", rss_ratio.is_some_and(|x| x <= goal)),
            );
            r.row(
                &label,
                &format!("peak RSS (VmHWM), the largest of {n} ÷ one replica"),
                format!("{:.0} MiB", most(|s| s.usage.hwm_mib)),
                format!("{:.0} MiB", one.usage.hwm_mib),
                ratio(most(|s| s.usage.hwm_mib), one.usage.hwm_mib),
                Goal::None,
            );
            r.row(
                &label,
                &format!("cold publication of everything, {n} replicas ÷ one"),
                secs(*time),
                secs(*one_time),
                ratio(time.as_secs_f64(), one_time.as_secs_f64()),
                Goal::None,
            );
            r.row(
                &label,
                &format!("CPU seconds, all {n} replicas together ÷ one"),
                format!("{:.1}", shares.iter().map(|s| s.usage.cpu).sum::<f64>()),
                format!("{:.1}", one.usage.cpu),
                ratio(shares.iter().map(|s| s.usage.cpu).sum(), one.usage.cpu),
                Goal::None,
            );
        }
        Ok(())
    }
}

/// Waits until every namespace's slices of `manager` publish its `per`
/// pods and each replica holds `buckets` buckets (the single leader: its
/// Lease, 1); returns when.
pub(crate) async fn converged(
    nss: &[TestNs],
    manager: &str,
    per: usize,
    pws: &mut [Portwise],
    buckets: usize,
) -> Result<Instant> {
    let t0 = Instant::now();
    loop {
        for pw in pws.iter_mut() {
            pw.check_alive()?;
        }
        let mut done = true;
        for ns in nss {
            if endpoints_of(ns, &format!("{MANAGED_BY_LABEL}={manager}")).await? != per {
                done = false;
                break;
            }
        }
        if done {
            let mut balanced = true;
            for pw in pws.iter() {
                let held = if pws.len() == 1 {
                    scrape(pw, "portwise_leader").await?
                } else {
                    scrape(pw, "portwise_bucket_held").await?
                };
                balanced &= held as usize == buckets;
            }
            if balanced {
                return Ok(Instant::now());
            }
        }
        if t0.elapsed() > Duration::from_secs(900) {
            bail!("{manager}'s replicas did not converge within 900 s");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
