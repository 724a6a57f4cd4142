//! Row 9, the cost of unmanaged pods: a cluster-wide portwise's cold sync
//! of the same managed set before and after 100,000 pods without its key
//! appear in other namespaces.

use std::{
    sync::atomic::{AtomicUsize, Ordering},
    time::{Duration, Instant},
};

use anyhow::Result;
use futures::{TryStreamExt, stream};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use portwise_tests::{MANAGED_BY_LABEL, TestNs, pod};

use crate::Bench;
use crate::objects::{COST_KEY, COST_MANAGER, Kind, create_groups, expected_of, groups};
use crate::process::{Controller, Usage, scrape, spawn_portwise, stop_portwise};
use crate::report::Goal;
use crate::stats::{ratio, secs};
use crate::tracker::Tracker;

/// One of row 9's cold syncs.
pub(crate) struct CostRun {
    pub(crate) time: Duration,
    pub(crate) usage: Usage,
    pub(crate) cached_pods: f64,
}

impl Bench {
    /// Row 9: what unmanaged objects cost portwise. The same managed set
    /// (own key and manager, so every other row's objects are unmanaged to
    /// it) is synced cold by a cluster-wide portwise, first alone, then
    /// again after `unmanaged_pods` pods without the key were created in
    /// other namespaces; once with the key as a label (the apiserver
    /// selects), once as an annotation (portwise filters before its cache).
    pub(crate) async fn unmanaged_pods(&mut self) -> Result<()> {
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
            alone.push(self.unmanaged_run(&ns, &tracker, key, "alone").await?);
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
            with.push(self.unmanaged_run(&ns, &tracker, key, "with").await?);
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
    pub(crate) async fn unmanaged_run(
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
}
