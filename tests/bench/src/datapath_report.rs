//! What rows 8 and 10 write: the table's figures (medians over runs of
//! each run's percentiles, with bootstrap intervals) and their sections.

use std::{fmt::Write as _, time::Duration};

use portwise_tests::{cilium::CILIUM_NODE, consumers::PROXY_NODE};

use crate::Bench;
use crate::datapath::{Flip, FlipRun};
use crate::prober::{DROPPED_AFTER, FLIP_GAP, PROBE_EVERY, SETTLED_RUN};
use crate::profile::Reconciled;
use crate::report::Goal;
use crate::stats::{BOOTSTRAP_ROUNDS, median_of, ms, pct, ratio, ratio_interval, secs};

/// A flip row's detail: per controller and direction, the PATCH, the
/// slice, the routing and the data path's part, p50 / p99.
pub(crate) fn flip_table(results: &[Vec<Flip>; 2], path: &str) -> String {
    let [nat, pw] = results;
    let routed = |f: &Flip| f.routed;
    let slice = |f: &Flip| f.slice;
    let path_part = |f: &Flip| f.routed - f.slice;
    let mut table = format!(
        "| controller | flip | flips | PATCH returned, p50 | slice seen, p50 / p99 | routed, p50 / p99 | {path} part (routed − slice), p50 / p99 | bracket, p50 / max | probes out of order |\n\
         |---|---|---|---|---|---|---|---|---|\n",
    );
    for (client, v) in [("portwise", pw), ("native", nat)] {
        for (dir, sel) in [
            ("→ NotReady", Some(false)),
            ("→ Ready", Some(true)),
            ("all", None),
        ] {
            let v: Vec<&Flip> = v
                .iter()
                .filter(|f| sel.is_none_or(|r| f.ready == r))
                .collect();
            let c = |f: fn(&Flip) -> f64| v.iter().map(|x| f(x)).collect::<Vec<f64>>();
            let two = |xs: Vec<f64>| format!("{} / {}", ms(pct(&xs, 0.5)), ms(pct(&xs, 0.99)));
            let _ = writeln!(
                table,
                "| {client} | {dir} | {} | {} | {} | {} | {} | {} / {} | {} |",
                v.len(),
                ms(pct(&c(|f| f.patch), 0.5)),
                two(c(slice)),
                two(c(routed)),
                two(c(path_part)),
                ms(pct(&c(|f| f.bracket), 0.5)),
                ms(pct(&c(|f| f.bracket), 1.0)),
                v.iter().map(|f| f.anomalies).sum::<usize>(),
            );
        }
    }
    table
}

impl Bench {
    /// A flip row's four figures (routed p50 and p99 against native, with
    /// the goal; the split into publication and data path) in the table:
    /// each the median over `runs` of the run's percentile.
    pub(crate) fn flip_figures(&mut self, label: &str, path: &str, runs: &[FlipRun]) {
        let routed = |f: &Flip| f.routed;
        let slice = |f: &Flip| f.slice;
        let path_part = |f: &Flip| f.routed - f.slice;
        let flips = runs.first().map_or(0, |r| r.results[1].len());
        let of_runs = if runs.len() > 1 {
            format!(", median of {} runs", runs.len())
        } else {
            String::new()
        };
        for (what, f, p, goal) in [
            (
                format!("status patch → {path} routes by it (first connection), p50{of_runs}"),
                routed as fn(&Flip) -> f64,
                0.5,
                true,
            ),
            (
                if flips >= 100 {
                    format!("same, p99 (of {flips}){of_runs}")
                } else {
                    format!("same, p99 (of {flips}: the slowest){of_runs}")
                },
                routed,
                0.99,
                true,
            ),
            (
                format!("of which slice publication (patch → slice seen by a watch), p50{of_runs}"),
                slice,
                0.5,
                false,
            ),
            (
                format!("of which {path} (slice seen → routed), p50{of_runs}"),
                path_part,
                0.5,
                false,
            ),
        ] {
            // Per run: (portwise, native).
            let per_run: Vec<(f64, f64)> = runs
                .iter()
                .map(|r| {
                    let [nat, pw] = &r.results;
                    let col = |v: &[Flip]| v.iter().map(f).collect::<Vec<f64>>();
                    (pct(&col(pw), p), pct(&col(nat), p))
                })
                .collect();
            let a = median_of(&per_run.iter().map(|x| x.0).collect::<Vec<_>>());
            let b = median_of(&per_run.iter().map(|x| x.1).collect::<Vec<_>>());
            let pairs: Vec<Vec<(f64, f64)>> = runs
                .iter()
                .map(|r| {
                    let [nat, pw] = &r.results;
                    pw.iter().zip(nat).map(|(x, y)| (f(x), f(y))).collect()
                })
                .collect();
            let interval = ratio_interval(&pairs, p, BOOTSTRAP_ROUNDS);
            let each = |v: Vec<f64>| {
                if v.len() > 1 {
                    format!(
                        " ({})",
                        v.iter().map(|x| ms(*x)).collect::<Vec<_>>().join(", ")
                    )
                } else {
                    String::new()
                }
            };
            self.report.row_within(
                label,
                &what,
                format!("{}{}", ms(a), each(per_run.iter().map(|x| x.0).collect())),
                format!("{}{}", ms(b), each(per_run.iter().map(|x| x.1).collect())),
                ratio(a, b),
                interval,
                if goal {
                    Goal::RatioAtMost(1.0)
                } else {
                    Goal::None
                },
            );
        }
    }

    pub(crate) fn datapath_report(&mut self, flips: usize, per: usize, runs: &[FlipRun]) {
        let Some(first) = runs.first() else { return };
        let label = format!(
            "8 pod change to data path (one kube-proxy, nftables; {flips} readiness flips each)"
        );
        self.flip_figures(&label, "kube-proxy", runs);
        let services = first.services;
        let mut table = String::new();
        for (i, run) in runs.iter().enumerate() {
            let (syncs, sync_secs) = run.syncs.unwrap_or((0.0, 0.0));
            let mean_sync = if syncs > 0.0 {
                ms(sync_secs / syncs * 1000.0)
            } else {
                "—".into()
            };
            let p = &run.profile;
            let col = |f: fn(&Reconciled) -> f64| p.iter().map(f).collect::<Vec<f64>>();
            let two = |v: Vec<f64>| format!("{} / {}", ms(pct(&v, 0.5)), ms(pct(&v, 0.99)));
            let _ = write!(
                table,
                "**Run {} of {}.**\n\n{}\nEndpointSlice writes during the flips (audit log): \
                 portwise {}, native {} (one per flip expected). kube-proxy's IPv4 syncs during \
                 the flips: {syncs:.0}, {mean_sync} each on average \
                 (`kubeproxy_sync_proxy_rules_duration_seconds`). portwise's {} reconciles of \
                 its Service during the flips (its reconcile histograms, scraped around each flip), p50 / p99: \
                 trigger (pod event → its turn) {}, judge + plan {}, write {}, whole reconcile \
                 {}.\n\n",
                i + 1,
                runs.len(),
                flip_table(&run.results, "kube-proxy"),
                run.requests.slice_writes("portwise"),
                run.requests.slice_writes("native"),
                p.len(),
                two(col(|r| r.trigger)),
                two(col(|r| r.judge + r.plan)),
                two(col(|r| r.write)),
                two(col(|r| r.total)),
            );
        }
        let body = format!(
            "One upstream kube-proxy (`portwise-cp kube-proxy --proxy-mode=nftables`, upstream \
             defaults otherwise: `minSyncPeriod` 1 s; tests/src/consumers.rs) runs in the bench's \
             network namespace as Node `{PROXY_NODE}` and programs every Service of the control \
             plane ({services} at the time, earlier rows' included). Two Services of the same \
             shape, one port 80 → 8080, {per} pods each, on {per} Nodes (one pod per Node, one of \
             them kube-proxy's), every pod a real TCP server on its own pod address that answers \
             with its name: in `bench-dp-native-*` with `spec.selector`, judged by \
             kube-controller-manager's endpointslice controller (its recorded argv, upstream \
             defaults, as in row 1); in `bench-dp-portwise-*` selector-less with \
             `membership: podReady`, judged by the release `portwise` binary with row 1's config \
             (`resyncPeriod` 30 s default, default flags, `--namespace` of its namespace; \
             portwise has no coalescing delay, and the native controller's \
             `--endpoint-updates-batch-period` is 0 by default).\n\n\
             **Exact by construction.** Both Services have `internalTrafficPolicy: Local`, so \
             through their ClusterIP this node's kube-proxy sends connections only to the pod on \
             its own node: the Service keeps {per} Ready pods and its slices change exactly as \
             for any Service (one endpoint's readiness), yet the flipped pod is the only member \
             the probe can reach. Every connection is then deterministic: with the old rules it \
             is answered by the pod (or, pod not ready, its SYN is dropped: kube-proxy's verdict \
             for a Local Service without a local endpoint), with the new rules the opposite. No \
             sampling over {per} members is needed, so no run of K answers to wait for. Each \
             flip makes the node's pod NotReady or Ready again, alternately, {flips} times per \
             Service, one Service at a time, in turns (who goes first alternates), and \
             {:.1} s plus up to 0.5 s apart, so that kube-proxy's 1 s `minSyncPeriod` never holds \
             a flip back.\n\n\
             **What is timed.** From just **before the status PATCH is sent** (the PATCH's own \
             return is the third column) to the start of the first connection after which every \
             connection met the new rules (at least {SETTLED_RUN} in a row). A new connection \
             starts every {} ms on its own task (one dropped SYN must not delay the next), each \
             timed just before its `connect`; a SYN unanswered for {} ms counts as dropped (a \
             local one is answered in microseconds; a dropped one is retransmitted only after \
             1 s). The rules changed between the last connection that met the old rules and the \
             first that met the new: that gap (*bracket*) is the resolution, shown per flip. \
             Probes out of order (neither outcome, or the new one before the last old one) are \
             counted; none is expected. *Slice seen*: the bench's own watch on the namespace's \
             EndpointSlices showed the Service's slices with the new Ready set (the same moment \
             kube-proxy's informer can have it, give or take the two watches' delivery); the \
             kube-proxy part is routed − slice seen. p99 is nearest-rank over the {} flips per \
             controller of a run; the table's figures are the median of the {} runs' \
             percentiles, each run in fresh namespaces with fresh controllers. Each ratio's \
             95 % interval comes from a bootstrap ({BOOTSTRAP_ROUNDS} rounds): every round \
             resamples each run's flip pairs (a portwise flip and the native flip of the same \
             turn) with replacement and computes the table's figure again, so it shows how far \
             the flips' own spread alone moves the ratio.\n\n{table}",
            FLIP_GAP.as_secs_f64(),
            PROBE_EVERY.as_millis(),
            DROPPED_AFTER.as_millis(),
            flips,
            runs.len(),
        );
        self.report.section("Row 8: pod change to data path", body);
    }

    pub(crate) fn cilium_datapath_report(
        &mut self,
        flips: usize,
        per: usize,
        run: &FlipRun,
        agent_ready: Duration,
    ) {
        let label = format!(
            "10 pod change to Cilium's data path (cilium-agent v1.20.2, socket LB; {flips} \
             readiness flips each)"
        );
        self.flip_figures(&label, "Cilium", std::slice::from_ref(run));
        let table = flip_table(&run.results, "Cilium");
        let req = &run.requests;
        let body = format!(
            "Row 8's protocol with Cilium as the data path instead of kube-proxy: a real \
             cilium-agent (tests/cilium/build, v1.20.2; kube-proxy replacement with socket load \
             balancing, confined to a cgroup2 sub-cgroup of its own; tests/src/cilium.rs), ready \
             {} after its start, runs as Node `{CILIUM_NODE}` against the same apiserver. Two \
             Services of the same shape (80 → 8080, {per} pods, `internalTrafficPolicy: Local`, \
             pod 0 on Cilium's Node, the others on the bench Nodes), one native with \
             `spec.selector`, one selector-less judged by portwise (`membership: podReady`), \
             each pod a real TCP server answering with its name. Each flip makes the Node's pod \
             NotReady or Ready again, {flips} times per Service, in turns.\n\n\
             **How connections are made.** Socket LB rewrites `connect()` only for the \
             processes of Cilium's cgroup, so the prober is a child process (`bench --probe`) \
             moved into that cgroup; it opens a new connection every {} ms and reports each \
             `connect`'s CLOCK_MONOTONIC time and outcome, which the bench puts on its own clock \
             (the same clock). While the pod is no member, socket LB fails the `connect` itself \
             (no local backend), so any refusal or failure counts as the old or new state; an \
             answer by another pod is out of order. Everything else (settling after \
             {SETTLED_RUN} probes in a row, brackets, the slice seen by the bench's own watch) is \
             as in row 8.\n\n{table}\n\
             EndpointSlice writes during the flips (audit log): portwise {}, native {} (one per \
             flip expected).",
            secs(agent_ready),
            PROBE_EVERY.as_millis(),
            req.slice_writes("portwise"),
            req.slice_writes("native"),
        );
        self.report
            .section("Row 10: pod change to Cilium's data path", body);
    }
}
