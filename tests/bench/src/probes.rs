//! Row 5, probes: a portwise policy that probes every pod, its check rate
//! and what it costs, for each probe kind side by side (plain HTTP, HTTPS,
//! gRPC health, a TCP dial) against the same pods.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use anyhow::Result;
use futures::{TryStreamExt, stream};
use portwise_tests::{
    GROUP_KEY, GrpcHealthServer, HttpListener, SERVICE_NAME_LABEL, TcpListener, TestNs, pod,
    service,
};
use serde_json::json;

use crate::Bench;
use crate::objects::{Group, PORTWISE_MANAGER, TARGET_PORT, TCP_PORT, endpoints_of, groups};
use crate::process::{Controller, scrape, spawn_portwise, stop_portwise, usage};
use crate::report::Goal;
use crate::stats::secs;

/// The pods' HTTPS port (a self-signed certificate) and gRPC health port.
const HTTPS_PORT: i32 = 9443;
const GRPC_PORT: i32 = 50051;

/// One probe kind: its name in the table, the key its Services are found
/// by, their port's name and target, and the expression judging that port.
struct Kind {
    name: &'static str,
    key: &'static str,
    port_name: &'static str,
    port: i32,
    expr: &'static str,
    /// The ≥ 5000/s goal is stated for the probes the row was set for.
    goal: bool,
}

const KINDS: [Kind; 4] = [
    Kind {
        name: "httpGet",
        key: "bench.portwise.io/http-group",
        port_name: "http",
        port: TARGET_PORT,
        expr: "{httpGet: {path: /healthz, timeout: 1s}}",
        goal: true,
    },
    Kind {
        name: "httpGet HTTPS",
        key: "bench.portwise.io/https-group",
        port_name: "https",
        port: HTTPS_PORT,
        expr: "{httpGet: {path: /healthz, scheme: HTTPS, timeout: 1s}}",
        goal: false,
    },
    Kind {
        name: "grpc",
        key: "bench.portwise.io/grpc-group",
        port_name: "grpc",
        port: GRPC_PORT,
        expr: "{grpc: {timeout: 1s}}",
        goal: false,
    },
    Kind {
        name: "tcpDial",
        key: "bench.portwise.io/tcp-group",
        port_name: "tcp",
        port: TCP_PORT,
        expr: "{tcpDial: {timeout: 1s}}",
        goal: true,
    },
];

impl Bench {
    /// Row 5: probes per second against real listeners.
    pub(crate) async fn probe_rates(&mut self) -> Result<()> {
        let n = self.knobs.probe_pods;
        let per = 10;
        let services = n / per;
        eprintln!(
            "bench: row 5 setup: {n} pods with HTTP, HTTPS, gRPC health and TCP listeners, {services} Services per probe kind"
        );
        let ns = TestNs::new(self.cp, "bench-probes").await?;
        self.ensure_nodes(&ns).await?;
        let base =
            2 * (self.knobs.services * self.knobs.pods_per_service + self.knobs.big_pods + 500);
        let gs = groups("p", services, per, base);
        let ctl = groups("ctl", 1, per, base + n + 10);
        // Listeners: every pod answers HTTP on 8080, HTTPS on 9443 and gRPC
        // health on 50051, and accepts TCP on 8443.
        let mut listeners = Vec::new();
        for g in &gs {
            for (_, ip) in &g.pods {
                let grpc = GrpcHealthServer::start(*ip, GRPC_PORT as u16).await?;
                grpc.set("", true).await;
                listeners.push((
                    HttpListener::start(*ip, TARGET_PORT as u16).await?,
                    HttpListener::start_tls(*ip, HTTPS_PORT as u16).await?,
                    grpc,
                    TcpListener::start(*ip, TCP_PORT as u16).await?,
                ));
            }
        }
        // Per probe kind its own Services over the same pods, told apart by
        // the key portwise is configured with.
        for g in gs.iter().chain(ctl.iter()) {
            for kind in &KINDS {
                let name = format!("{}-{}", g.service, kind.port_name);
                let port_name = if g.service.starts_with("ctl") {
                    "plain"
                } else {
                    kind.port_name
                };
                ns.create_service(service(&name).annotation(kind.key, &g.service).port_to(
                    port_name,
                    80,
                    json!(kind.port),
                ))
                .await?;
            }
        }
        let all: Vec<_> = gs.iter().chain(ctl.iter()).collect();
        let pods: Vec<(usize, &Group, &(String, Ipv4Addr))> = all
            .iter()
            .flat_map(|g| g.pods.iter().map(move |p| (*g, p)))
            .enumerate()
            .map(|(i, (g, p))| (i, g, p))
            .collect();
        let nodes = &self.nodes;
        stream::iter(pods.into_iter().map(Ok::<_, anyhow::Error>))
            .try_for_each_concurrent(self.knobs.setup_concurrency, |(i, g, (name, ip))| {
                let ns = &ns;
                async move {
                    ns.create_pod(
                        pod(name)
                            .annotation(GROUP_KEY, &g.service)
                            .node(&nodes[i % nodes.len()])
                            .ips([ip]),
                    )
                    .await?;
                    Ok(())
                }
            })
            .await?;
        tokio::time::sleep(Duration::from_secs(3)).await;

        let window = self.knobs.probe_window;
        let mut lines = String::from(
            "| probe | maxConcurrentChecks | checks/s | demand (subjects ÷ resyncPeriod) | of which include | \
             portwise CPU (cores) | listeners' CPU (cores) | podReady flip in another Service, seen \
             after |\n|---|---|---|---|---|---|---|---|\n",
        );
        let mut best: BTreeMap<&str, f64> = BTreeMap::new();
        // Worst time for another Service's pod change to show (None: never).
        let mut worst_flip: Option<Option<Duration>> = None;
        for Kind {
            name: kind,
            key,
            port_name,
            expr,
            ..
        } in &KINDS
        {
            let kind = *kind;
            for conc in [16usize, 64, 256] {
                let membership =
                    format!("{{perPort: {{ports: {{{port_name}: {expr}}}, fallback: podReady}}}}");
                let config = format!(
                    "managedBy: {PORTWISE_MANAGER}\n\
                     serviceKey: {{annotation: {key}}}\n\
                     podKey: {{annotation: {GROUP_KEY}}}\n\
                     resyncPeriod: 100ms\n\
                     maxConcurrentChecks: {conc}\n\
                     membership: {membership}\n"
                );
                let tag = format!("probes-{}-{conc}", kind.replace(' ', "-"));
                let mut pw =
                    spawn_portwise(self.cp, &self.work, &tag, &config, &[ns.name()], &[]).await?;
                // Warm up: every Service published once.
                let t = Instant::now();
                loop {
                    pw.check_alive()?;
                    let published = scrape(&pw, "portwise_slices_managed").await.unwrap_or(0.0);
                    if published >= (services + 1) as f64 || t.elapsed() > Duration::from_secs(120)
                    {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                tokio::time::sleep(Duration::from_secs(3)).await;
                let c0 = scrape(&pw, "portwise_checks_total").await?;
                let i0 = scrape(&pw, "portwise_checks_total{decision=\"include\"").await?;
                let u0 = pw.usage();
                let me0 = usage(std::process::id()).unwrap_or_default();
                let t0 = Instant::now();
                // Half-way, flip a pod of the podReady-only Service and time
                // until its slice shows it: checks must not hold it up.
                tokio::time::sleep(window / 2).await;
                let ctl_svc = format!("{}-{port_name}", ctl[0].service);
                let (victim, _) = &ctl[0].pods[0];
                let flip = Instant::now();
                ns.set_ready(victim, false).await?;
                let mut seen = None;
                while flip.elapsed() < Duration::from_secs(30) {
                    let n = endpoints_of(&ns, &format!("{SERVICE_NAME_LABEL}={ctl_svc}")).await?;
                    if n == per - 1 {
                        seen = Some(flip.elapsed());
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                ns.set_ready(victim, true).await?;
                let rest = window.saturating_sub(t0.elapsed());
                tokio::time::sleep(rest).await;
                let c1 = scrape(&pw, "portwise_checks_total").await?;
                let i1 = scrape(&pw, "portwise_checks_total{decision=\"include\"").await?;
                let el = t0.elapsed().as_secs_f64();
                let u1 = pw.usage();
                let me1 = usage(std::process::id()).unwrap_or_default();
                pw.check_alive()?;
                stop_portwise(&mut pw).await;
                let rate = (c1 - c0) / el;
                worst_flip = Some(match (worst_flip, seen) {
                    (None, s) => s,
                    (Some(None), _) | (_, None) => None,
                    (Some(Some(a)), Some(b)) => Some(a.max(b)),
                });
                let incl = if c1 > c0 { (i1 - i0) / (c1 - c0) } else { 0.0 };
                let e = best.entry(kind).or_default();
                *e = e.max(rate);
                let _ = writeln!(
                    lines,
                    "| {kind} | {conc} | {rate:.0} | {:.0} | {:.1}% | {:.2} | {:.2} | {} |",
                    (services * per + per) as f64 / 0.1,
                    incl * 100.0,
                    (u1.cpu - u0.cpu) / el,
                    (me1.cpu - me0.cpu) / el,
                    seen.map(|d| format!("{:.0} ms", d.as_secs_f64() * 1000.0))
                        .unwrap_or_else(|| "not within 30 s".into())
                );
                eprintln!("bench:   {kind} maxConcurrentChecks={conc}: {rate:.0} checks/s");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
        let total_listeners = listeners.len();
        drop(listeners);
        for kind in &KINDS {
            let Some(rate) = best.get(kind.name) else {
                continue;
            };
            self.report.row(
                "5 probes (sustained, real listeners in the netns)",
                &format!("{} checks per second (best maxConcurrentChecks)", kind.name),
                format!("{rate:.0}/s"),
                "n/a (no probes)".into(),
                None,
                if kind.goal {
                    Goal::Stated("≥ 5000/s", *rate >= 5000.0)
                } else {
                    Goal::None
                },
            );
        }
        if let Some(w) = worst_flip {
            self.report.row(
                "5 probes (sustained, real listeners in the netns)",
                "a pod change in another (podReady) Service while probes saturate: slice updated after (worst run)",
                w.map(|d| format!("{:.0} ms", d.as_secs_f64() * 1000.0))
                    .unwrap_or_else(|| "not within 30 s".into()),
                "n/a".into(),
                None,
                Goal::Stated("no delay (< 1 s)", w.is_some_and(|d| d < Duration::from_secs(1))),
            );
        }
        self.report.section(
            "Row 5: probes in detail",
            format!(
                "{services} Services × {per} pods per probe kind, over {total_listeners} pods, each with a real HTTP \
                 listener on :8080, an HTTPS one on :9443 (self-signed, a TLS handshake per probe: \
                 probes reuse no connection), tonic-health's gRPC server on :50051 and a TCP \
                 listener on :8443 at its pod address (in the bench's \
                 own process, on the same 2 cores; the bench's own CPU is almost all theirs while it \
                 waits). `resyncPeriod: 100ms` sets the demand: every subject is due again 100 ms \
                 after its Service's last reconcile; a rate well below the demand is portwise's \
                 capacity on this machine, one close to it is bound by the demand. Rate = growth of \
                 `portwise_checks_total` over {}. One extra podReady-only Service (10 pods) shares \
                 the controller: half-way through, one of its pods turns NotReady and the time until \
                 its slice shows it is the last column.\n\n{lines}",
                secs(window)
            ),
        );
        Ok(())
    }
}
