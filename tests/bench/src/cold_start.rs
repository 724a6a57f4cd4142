//! Rows 1 and 1b, cold start: both controllers sync an identical, settled
//! state from cold (row 1 as released; row 1b with the native controller's
//! rate limit off, several runs each), timed by the bench's watch, with
//! where portwise's time went from its metrics.

use std::{
    fmt::Write as _,
    time::{Duration, Instant},
};

use anyhow::Result;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use portwise_tests::{MANAGED_BY_LABEL, Metrics, NATIVE_MANAGER, TestNs};

use crate::control_plane::caches_synced_in_klog;
use crate::objects::{
    Kind, PORT_SETS_POLICY, PORTWISE_MANAGER, create_groups, expected_of, groups, portwise_config,
};
use crate::process::{Controller, Usage, UsageRow, apiserver_cpu, spawn_portwise, stop_portwise};
use crate::profile::{Phases, ReconcileStats};
use crate::report::Goal;
use crate::stats::{median_of, ms, ratio, secs};
use crate::tracker::{Tracker, verify_by_list};
use crate::{Bench, Pair};

/// Where one portwise cold start spent its time (row 1b), from its
/// metrics.
#[derive(Debug, Default)]
pub(crate) struct ColdTimings {
    /// From its controller's start to every cache's first list.
    pub(crate) synced: Option<Duration>,
    /// To every Service reconciled once.
    pub(crate) reconciled: Option<Duration>,
    pub(crate) reconciles: f64,
    pub(crate) mean_reconcile_ms: f64,
    pub(crate) writes: f64,
    /// From the reconcile histograms.
    pub(crate) profile: ReconcileStats,
    /// The apiserver's CPU seconds from portwise's start until its caches
    /// were synced, and until every slice was right.
    pub(crate) api_cpu_synced: f64,
    pub(crate) api_cpu: f64,
}

impl ColdTimings {
    /// What a scrape of a portwise started cold tells (the cold start's
    /// stages, its reconciles and writes so far); `api_cpu*` NaN.
    pub(crate) fn of(m: &Metrics) -> Self {
        let stage = |stage: &str| {
            m.value("portwise_cold_start_seconds", &[("stage", stage)])
                .ok()
                .flatten()
                .map(Duration::from_secs_f64)
        };
        let count = m.sum("portwise_reconcile_duration_seconds_count", &[]);
        let sum = m.sum("portwise_reconcile_duration_seconds_sum", &[]);
        ColdTimings {
            synced: stage("synced"),
            reconciled: stage("reconciled"),
            reconciles: count,
            mean_reconcile_ms: if count > 0.0 {
                1000.0 * sum / count
            } else {
                0.0
            },
            writes: m.sum("portwise_writes_total", &[]),
            profile: Phases::of(m).stats(),
            api_cpu_synced: f64::NAN,
            api_cpu: f64::NAN,
        }
    }
}

impl Bench {
    pub(crate) async fn cold_start(&mut self) -> Result<Pair> {
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
        let mut portwise = spawn_portwise(
            self.cp,
            &self.work,
            "row1",
            &portwise_config(
                &format!("{}{PORT_SETS_POLICY}", self.knobs.portwise_extra),
                "podReady",
            ),
            &[portwise_ns.name()],
            &[],
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
    pub(crate) async fn native_without_rate_limit(&mut self, pair: &mut Pair) -> Result<()> {
        let runs = self.knobs.fair_runs;
        let mut results = Vec::new();
        for i in 1..=runs {
            let nat = self.uncapped_native_start(pair, i).await?;
            let pw = self.uncapped_portwise_start(pair, i).await?;
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
            "Where portwise's cold start spends its time, per run: from its exec to its caches synced (every watch's first LIST, and the start-up LISTs of native Endpoints and EndpointSlices), to every Service reconciled once (both `portwise_cold_start_seconds`), to every slice right (the bench's watch); reconcile durations, phases and writes from its metrics (reconcile p50 / p99 estimated from `portwise_reconcile_duration_seconds`' buckets, as `histogram_quantile` does).\n\n| run | caches synced | every Service reconciled | every slice right | reconciles | mean reconcile | reconcile p50 / p99 | mean per phase (ms) | queued for a slot, mean | slice writes | apiserver CPU: to synced / to right (native: to right) | native: caches synced / every slice right |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n",
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

    pub(crate) async fn uncapped_native_start(
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

    pub(crate) async fn uncapped_portwise_start(
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
        let mut portwise = spawn_portwise(
            self.cp,
            &self.work,
            &format!("row1b-{run}"),
            &portwise_config("", "podReady"),
            &[],
            &extra,
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
        let mut timings = ColdTimings::of(&portwise.scrape().await.unwrap_or_default());
        timings.api_cpu_synced = api_synced;
        timings.api_cpu = u.api_cpu;
        pair.portwise = portwise;
        eprintln!(
            "bench:   portwise (all namespaces) converged in {} ({timings:?})",
            secs(time)
        );
        Ok((time, req.slice_writes("portwise"), u, timings))
    }
}
