//! Row 13, a noisy neighbour (issue 45): a readiness flip in a quiet
//! namespace, timed with and without another namespace whose probes never
//! answer, on the same portwise.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use portwise_tests::{GROUP_KEY, HttpListener, HttpMode, SERVICE_NAME_LABEL, TestNs, pod, service};

use crate::Bench;
use crate::objects::{PORTWISE_MANAGER, pod_ip};
use crate::process::{Controller as _, spawn_portwise, stop_portwise, sum_of};
use crate::report::Goal;
use crate::stats::{ms, pct, ratio};

/// The noisy tenant: as issue 45 found it, 8 Services (every
/// `--reconcile-concurrency` slot) × 4 ports × 10 pods whose listeners
/// accept and never answer, `httpGet` with a 5 s timeout: 320 checks
/// against 16 permits, 100 s a round.
const NOISY_SERVICES: usize = 8;
const NOISY_PORTS: u16 = 4;
const NOISY_PODS: usize = 10;
/// The quiet Service's pods.
const QUIET_PODS: usize = 10;

fn config() -> String {
    format!(
        "managedBy: {PORTWISE_MANAGER}\n\
         serviceKey: {{annotation: {GROUP_KEY}}}\n\
         resyncPeriod: 30s\n\
         membership: podReady\n\
         policies:\n  noisy: {{httpGet: {{path: /healthz, timeout: 5s}}}}\n"
    )
}

/// Endpoints in the quiet Service's slices.
async fn published(ns: &TestNs) -> Result<usize> {
    crate::objects::endpoints_of(ns, &format!("{SERVICE_NAME_LABEL}=quiet")).await
}

/// The noisy policy's checks that have ended so far (each by its timeout:
/// exclude or abstain).
async fn noisy_checks(pw: &portwise_tests::Portwise) -> Result<f64> {
    let text = pw.metrics_text().await?;
    Ok(["exclude", "abstain", "include"]
        .iter()
        .map(|d| {
            sum_of(
                &text,
                &format!("portwise_checks_total{{decision=\"{d}\",policy=\"policies.noisy\""),
            )
        })
        .sum())
}

/// `flips` readiness flips of one quiet pod, one at a time: the time from
/// each status patch until the slices show it, in ms.
async fn flip_times(ns: &TestNs, flips: usize) -> Result<Vec<f64>> {
    let victim = "q0";
    let mut times = Vec::with_capacity(flips);
    for i in 0..flips {
        let ready = i % 2 == 1;
        let want = if ready { QUIET_PODS } else { QUIET_PODS - 1 };
        let t = Instant::now();
        ns.set_ready(victim, ready).await?;
        loop {
            if published(ns).await? == want {
                times.push(t.elapsed().as_secs_f64() * 1000.0);
                break;
            }
            if t.elapsed() > Duration::from_secs(60) {
                bail!("flip {i} of the quiet pod not published within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if flips % 2 == 1 {
        ns.set_ready(victim, true).await?;
    }
    Ok(times)
}

impl Bench {
    /// Row 13: a quiet namespace's readiness flips, p99, alone and beside
    /// a namespace whose probes hang.
    pub(crate) async fn noisy_neighbour(&mut self) -> Result<()> {
        let flips = self.knobs.datapath_flips.max(50);
        eprintln!("bench: row 13: {flips} quiet flips, alone and beside hanging probes");
        let quiet = TestNs::new(self.cp, "bench-quiet").await?;
        let noisy = TestNs::new(self.cp, "bench-noisy").await?;
        self.ensure_nodes(&quiet).await?;
        // Addresses past every other row's.
        let base = 2
            * (self.knobs.services * self.knobs.pods_per_service
                + self.knobs.big_pods
                + self.knobs.probe_pods
                + 1000);
        quiet
            .create_service(
                service("quiet")
                    .annotation(GROUP_KEY, "q")
                    .port("http", 8080),
            )
            .await?;
        for i in 0..QUIET_PODS {
            quiet
                .create_pod(
                    pod(&format!("q{i}"))
                        .annotation(GROUP_KEY, "q")
                        .ips([pod_ip(base + i)]),
                )
                .await?;
        }
        let mut hanging = Vec::new();
        for s in 0..NOISY_SERVICES {
            let group = format!("n{s}");
            let mut svc = service(&format!("noisy{s}"))
                .annotation(GROUP_KEY, &group)
                .annotation("portwise.io/membership", "noisy");
            for p in 0..NOISY_PORTS {
                svc = svc.port(&format!("p{p}"), i32::from(8080 + p));
            }
            noisy.create_service(svc).await?;
            for i in 0..NOISY_PODS {
                let ip = pod_ip(base + QUIET_PODS + s * NOISY_PODS + i);
                noisy
                    .create_pod(
                        pod(&format!("n{s}-{i}"))
                            .annotation(GROUP_KEY, &group)
                            .ips([ip]),
                    )
                    .await?;
                for p in 0..NOISY_PORTS {
                    let l = HttpListener::start(ip, 8080 + p).await?;
                    l.set_mode(HttpMode::Hang);
                    hanging.push(l);
                }
            }
        }

        let mut runs = Vec::new();
        for (tag, namespaces) in [
            ("alone", vec![quiet.name()]),
            ("beside-noise", vec![quiet.name(), noisy.name()]),
        ] {
            let mut pw = spawn_portwise(
                self.cp,
                &self.work,
                &format!("noisy-{tag}"),
                &config(),
                &namespaces,
                &[],
            )
            .await?;
            let t = Instant::now();
            while published(&quiet).await? != QUIET_PODS {
                pw.check_alive()?;
                if t.elapsed() > Duration::from_secs(60) {
                    bail!("{tag}: the quiet Service was not published within 60 s");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            // The noisy reconciles began at the cold start and wait on
            // their probes.
            tokio::time::sleep(Duration::from_secs(2)).await;
            let before = noisy_checks(&pw).await?;
            let times = flip_times(&quiet, flips).await?;
            let after = noisy_checks(&pw).await?;
            pw.check_alive()?;
            stop_portwise(&mut pw).await;
            eprintln!(
                "bench:   {tag}: p50 {}, p99 {}; noisy checks ended meanwhile: {}",
                ms(pct(&times, 0.5)),
                ms(pct(&times, 0.99)),
                after - before
            );
            runs.push((times, after - before));
        }
        drop(hanging);
        let (alone, _) = &runs[0];
        let (beside, progress) = &runs[1];
        let row = "13 noisy neighbour (a quiet namespace's readiness flips; another namespace: 8 Services × 4 ports × 10 pods whose probes hang 5 s)";
        for (what, p) in [("p50", 0.5), ("p99", 0.99)] {
            let (b, a) = (pct(beside, p), pct(alone, p));
            let r = ratio(b, a);
            self.report.row(
                row,
                &format!(
                    "status patch → slice shows it, {what} of {flips}: beside the noise (portwise column) ÷ alone (native column)"
                ),
                ms(b),
                ms(a),
                r,
                if what == "p99" {
                    Goal::Stated("≤ 1.2×", r.is_some_and(|r| r <= 1.2))
                } else {
                    Goal::None
                },
            );
        }
        self.report.row(
            row,
            "the noisy namespace's checks that ended (timed out) during the flips",
            format!("{progress:.0}"),
            "n/a".into(),
            None,
            Goal::Stated("> 0 (it still makes progress)", *progress > 0.0),
        );
        Ok(())
    }
}
