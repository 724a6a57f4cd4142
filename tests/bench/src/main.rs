//! `./bench`: portwise side by side with kube-controller-manager's native
//! EndpointSlice controller, on one local control plane, in one run.
//!
//! These machines are shared and noisy, so absolute figures mean little;
//! every comparison is a ratio of two figures measured in the same run on
//! the same apiserver. The table is printed and written to
//! `docs/benchmarks.md` with the machine it ran on. Anything below a line
//! `<!-- analysis -->` in that file is kept across runs (hand-written
//! findings).
//!
//! Protocol (the fairness rules are spelled out in the results file):
//! 1. start a control plane with `--controllers endpointslice`, then stop
//!    the controller-manager at once, keeping its exact command line;
//! 2. create Nodes, and in two namespaces the same 1000 Services × 10 Ready
//!    pods: selector Services in `native`, selector-less grouped Services in
//!    `portwise` (setup, timed but not counted);
//! 3. start the controller-manager again (same argv) and measure until every
//!    native slice is right; then start the release `portwise` binary and do
//!    the same. Both thus make a cold sync of an identical, settled state;
//! 4. steady state, churn, probes, WebAssembly, as the rows say;
//! 5. row 8 (late, so that its kube-proxy Node and objects touch no other
//!    row): one upstream kube-proxy routes a native and a portwise Service,
//!    and readiness flips are timed until the traffic shows them; row 10
//!    does the same with Cilium's agent as the data path.
//!
//! Requests per client come from the apiserver's audit log (a policy that
//! records every request at Metadata level), split by User-Agent.

mod audit;
mod capacity;
mod churn;
mod cold_start;
mod control_plane;
mod datapath;
mod datapath_report;
mod go_library;
mod handover;
mod identity;
mod knobs;
mod machine;
mod noisy;
mod objects;
mod prober;
mod probes;
mod process;
mod profile;
mod reconcile;
mod report;
mod rollout;
mod shards;
mod stats;
mod steady_state;
mod tracker;
mod unmanaged;
mod wasm;
mod write_verbs;

use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Result;
use portwise_tests::{ControlPlane, GROUP_KEY, Portwise, TestNs};

use crate::control_plane::BenchCp;
use crate::knobs::{Knobs, repo_root};
use crate::machine::machine;
use crate::objects::{NODES, ZONES};
use crate::prober::probe_main;
use crate::process::{Controller, Proc, stop_portwise};
use crate::report::{Goal, Report, with_analysis};
use crate::stats::ratio;
use crate::tracker::Tracker;

struct Bench {
    knobs: Knobs,
    cp: &'static ControlPlane,
    bcp: BenchCp,
    work: PathBuf,
    report: Report,
    protocol: Vec<String>,
    nodes: Vec<String>,
}

/// Row 1's running controllers, kept for rows 2 and 3.
struct Pair {
    native_ns: TestNs,
    portwise_ns: TestNs,
    native: Proc,
    portwise: Portwise,
    native_tracker: Tracker,
    portwise_tracker: Tracker,
}

impl Bench {
    /// The fake Nodes every row's pods sit on (cluster-scoped, made once,
    /// whichever row runs first).
    async fn ensure_nodes(&mut self, ns: &TestNs) -> Result<()> {
        if self.nodes.is_empty() {
            for i in 0..NODES {
                let n = ns
                    .ensure_node(&format!("node-{i}"), ZONES[i % ZONES.len()])
                    .await?;
                self.nodes.push(n);
            }
        }
        Ok(())
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--probe") {
        return match &args[2..] {
            [addr, victim] => probe_main(addr, victim),
            _ => {
                eprintln!("usage: bench --probe ADDR VICTIM");
                ExitCode::from(2)
            }
        };
    }
    let knobs = Knobs::from_env();
    let work = match tempfile::Builder::new().prefix("portwise-bench.").tempdir() {
        Ok(t) => t.keep(),
        Err(e) => {
            eprintln!("bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    eprintln!("bench: work dir {}", work.display());
    let machine = machine();
    let bcp = match BenchCp::start(&work) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("bench: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let dir = bcp.dir.clone();
    let res = rt.block_on(run(knobs, bcp, work.clone(), machine));
    // Stop everything this run started, then drop its (large) state.
    let stop = repo_root().join("tests/control-plane/stop");
    let _ = std::process::Command::new(stop).arg(&dir).status();
    rt.shutdown_timeout(Duration::from_secs(5));
    if std::env::var("BENCH_KEEP").as_deref() != Ok("1") {
        let _ = std::fs::remove_dir_all(&work);
    }
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(knobs: Knobs, bcp: BenchCp, work: PathBuf, machine: String) -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let mut b = Bench {
        knobs,
        cp,
        bcp,
        work,
        report: Report::default(),
        protocol: Vec::new(),
        nodes: Vec::new(),
    };
    println!(
        "| row | measure | portwise | native | ratio | goal | |\n|---|---|---|---|---|---|---|"
    );
    let mut pair = None;
    if b.knobs.row(1) || b.knobs.row(2) || b.knobs.row(3) || b.knobs.row(4) {
        match b.cold_start().await {
            Ok(p) => pair = Some(p),
            Err(e) => b
                .report
                .not_measured("1 convergence", "all", &format!("{e:#}")),
        }
    }
    if let Some(p) = pair.as_mut() {
        if b.knobs.row(2)
            && let Err(e) = b.steady_state(p).await
        {
            b.report
                .not_measured("2 steady state", "all", &format!("{e:#}"));
        }
        if b.knobs.row(3)
            && let Err(e) = b.churn(p).await
        {
            b.report.not_measured("3 churn", "all", &format!("{e:#}"));
        }
        if b.knobs.row(4) {
            let u = p.portwise.usage();
            b.report.row(
                "4 scale",
                &format!(
                    "portwise at {} pods over {} Services: see row 1 (time, peak RSS); RSS now",
                    b.knobs.services * b.knobs.pods_per_service,
                    b.knobs.services
                ),
                format!("{:.0} MiB", u.rss_mib),
                format!("{:.0} MiB", p.native.usage().rss_mib),
                ratio(u.rss_mib, p.native.usage().rss_mib),
                Goal::None,
            );
        }
        if b.knobs.native_fast
            && b.knobs.row(1)
            && let Err(e) = b.native_without_rate_limit(p).await
        {
            b.report
                .not_measured("1b native without rate limit", "all", &format!("{e:#}"));
        }
    }
    if let Some(mut p) = pair.take() {
        stop_portwise(&mut p.portwise).await;
        p.native.stop().await;
    }
    if b.knobs.row(5)
        && let Err(e) = b.probe_rates().await
    {
        b.report.not_measured("5 probes", "all", &format!("{e:#}"));
    }
    if b.knobs.row(6)
        && let Err(e) = b.wasm_checks().await
    {
        b.report.not_measured("6 WASM", "all", &format!("{e:#}"));
    }
    if b.knobs.row(7) {
        b.go_library();
    }
    if b.knobs.row(8)
        && let Err(e) = b.datapath().await
    {
        b.report
            .not_measured("8 pod change to data path", "all", &format!("{e:#}"));
    }
    // After row 8: the agent takes the data path from kube-proxy (one at a
    // time in a namespace).
    if b.knobs.row(10)
        && let Err(e) = b.cilium_datapath().await
    {
        b.report.not_measured(
            "10 pod change to Cilium's data path",
            "all",
            &format!("{e:#}"),
        );
    }
    // A cluster of its own with a real node, whose kube-proxy owns the
    // namespace's data path: after rows 8 and 10.
    if b.knobs.row(11)
        && let Err(e) = b.rollout().await
    {
        b.report
            .not_measured("11 rollout of real pods", "all", &format!("{e:#}"));
    }
    if b.knobs.row(13)
        && let Err(e) = b.noisy_neighbour().await
    {
        b.report
            .not_measured("13 noisy neighbour", "all", &format!("{e:#}"));
    }
    if b.knobs.row(14)
        && let Err(e) = b.sharded_replicas().await
    {
        b.report
            .not_measured("14 sharded replicas", "all", &format!("{e:#}"));
    }
    if b.knobs.row(15)
        && let Err(e) = b.handovers().await
    {
        b.report
            .not_measured("15 handovers", "all", &format!("{e:#}"));
    }
    if b.knobs.row(16)
        && let Err(e) = b.capacity().await
    {
        b.report
            .not_measured("16 capacity", "all", &format!("{e:#}"));
    }
    if b.knobs.row(17)
        && let Err(e) = b.one_replica().await
    {
        b.report
            .not_measured("17 one replica", "all", &format!("{e:#}"));
    }
    // Last: its 100k pods would weigh on every later row.
    if b.knobs.row(9)
        && let Err(e) = b.unmanaged_pods().await
    {
        b.report
            .not_measured("9 cost of unmanaged pods", "all", &format!("{e:#}"));
    }

    let protocol = protocol_text(&b);
    let md = b.report.markdown(&machine, &protocol);
    if let Some(out) = &b.knobs.out {
        let old = std::fs::read_to_string(out).ok();
        std::fs::write(out, with_analysis(&md, old.as_deref()))?;
        eprintln!("bench: wrote {}", out.display());
    }
    Ok(())
}

fn protocol_text(b: &Bench) -> String {
    let k = &b.knobs;
    let mut p = vec![
        format!(
            "- One control plane (`tests/control-plane/start DIR --controllers endpointslice`) inside \
             `tests/netns`, with an audit policy that records every request at Metadata level. The \
             controller-manager is stopped right after it starts and its exact command line kept."
        ),
        format!(
            "- Two namespaces get the same {} Services × {} pods (pod addresses 10.244.0.0/16, {NODES} \
             Nodes in 3 zones, one container, every pod Running and Ready): in `bench-native-*` \
             Services with `spec.selector`, in `bench-portwise-*` selector-less Services with the \
             group annotation `{GROUP_KEY}` and `membership: podReady`. Each Service has one port \
             (80 → 8080), so every controller publishes one slice of 10 endpoints per Service.",
            k.services, k.pods_per_service
        ),
    ];
    p.extend(b.protocol.iter().cloned());
    if !k.portwise_extra.is_empty() {
        p.push(format!(
            "- **Experiment:** row 1's portwise config has the extra lines `{}` \
             (BENCH_PORTWISE_EXTRA).",
            k.portwise_extra.trim().replace('\n', "; ")
        ));
    }
    p.push(
        "- **Fairness: both controllers make a cold sync of the same settled state.** Nothing \
         runs while the objects are created. Then kube-controller-manager starts (same argv, \
         controllers `endpointslice` only) and is timed from its exec until the bench's watch on \
         the namespace shows every Service's slices holding exactly its 10 Ready addresses. Then \
         the release `portwise` binary starts (`--namespace` of its namespace, default flags) and \
         is timed the same way. A fresh LIST confirms each result. Both start with empty caches, \
         so both times include listing and watching."
            .into(),
    );
    p.push(
        "- Requests are counted from the audit log by User-Agent: `portwise/<version>` for \
         portwise, `kube-controller-manager/…` for the native process (its writes come from \
         `…/endpointslice-controller`, its informers' lists and watches from \
         `…/shared-informers`). CPU is utime+stime of the process from /proc/PID/stat, peak RSS \
         its VmHWM."
            .into(),
    );
    p.push(
        "- Not identical in row 1, by design of each: the native controller-manager is one \
         process hosting more than the endpointslice controller (controller framework, health \
         server, informers for secrets and service accounts), and its informers are \
         cluster-wide, so it caches the pods of *both* namespaces (2× the pods portwise caches \
         with `--namespace`). The native controller runs with its upstream defaults (client \
         rate limit `--kube-api-qps=20 --kube-api-burst=30`, \
         `--concurrent-service-endpoint-syncs=5`), portwise with its own (no client rate limit, \
         `--reconcile-concurrency=8`, `resyncPeriod: 30s`). **Row 1b removes both \
         differences**: after rows 2–4 each controller is stopped, its slices deleted, and it \
         is started cold again, the native one with `--kube-api-qps=1000 --kube-api-burst=1000` \
         and portwise without `--namespace`, so both watch the whole cluster as installed by \
         default (row 3's 1000-pod Service included): Services and slices of both namespaces; \
         pods of both for the native controller, of its own namespace for portwise, which with \
         an annotation key watches pods only where a keyed Service is (since the pod scopes). \
         On a noisy machine one run decides \
         nothing: each controller is started cold BENCH_FAIR_RUNS (3) times, alternating, \
         every run is reported, and the goal applies to the median ratio."
            .into(),
    );
    p.join("\n")
}
