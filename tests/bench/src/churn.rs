//! Row 3, churn: pods flipping readiness in a 1000-pod Service, and a
//! pod's set of ports changing without its readiness; until each
//! controller's slices show it, and what it costs in writes.

use std::{
    collections::BTreeSet,
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use anyhow::Result;
use futures::{TryStreamExt, stream};
use portwise_tests::{GROUP_KEY, pod, service};
use serde_json::json;

use crate::objects::{
    Kind, PORTS_KEY, TARGET_PORT, TCP_PORT, create_groups, expected_of, groups, pod_ip,
    port_members_are,
};
use crate::report::Goal;
use crate::stats::{ratio, secs};
use crate::{Bench, Pair};

impl Bench {
    pub(crate) async fn churn(&mut self, pair: &mut Pair) -> Result<()> {
        let big = self.knobs.big_pods;
        eprintln!("bench: row 3 setup: one Service with {big} pods per namespace");
        let base = self.knobs.services * self.knobs.pods_per_service;
        let stride = base + big + 500;
        let nb = groups("big", 1, big, base);
        let pb = groups("big", 1, big, stride + base);
        let conc = self.knobs.setup_concurrency / 2;
        let (a, b) = tokio::join!(
            create_groups(&pair.native_ns, Kind::Native, &nb, &self.nodes, conc),
            create_groups(&pair.portwise_ns, Kind::Portwise, &pb, &self.nodes, conc),
        );
        a?;
        b?;
        let svc = nb[0].service.clone();
        pair.native_tracker
            .expect(&svc, expected_of(&nb).remove(&svc).unwrap());
        pair.portwise_tracker
            .expect(&svc, expected_of(&pb).remove(&svc).unwrap());
        pair.native_tracker
            .service_converged(&svc, Duration::from_secs(300))
            .await?;
        pair.portwise_tracker
            .service_converged(&svc, Duration::from_secs(300))
            .await?;
        tokio::time::sleep(Duration::from_secs(5)).await;

        let audit = self.bcp.audit();
        let mut results = Vec::new();
        for (ns, tracker, group, client) in [
            (&pair.native_ns, &pair.native_tracker, &nb[0], "native"),
            (
                &pair.portwise_ns,
                &pair.portwise_tracker,
                &pb[0],
                "portwise",
            ),
        ] {
            let (victim, ip) = &group.pods[big / 2];
            let mut want: BTreeSet<String> =
                group.pods.iter().map(|(_, ip)| ip.to_string()).collect();
            want.remove(&ip.to_string());
            let a0 = audit.offset();
            let t = Instant::now();
            tracker.expect(&svc, want);
            ns.set_ready(victim, false).await?;
            let done = tracker
                .service_converged(&svc, Duration::from_secs(120))
                .await?;
            let latency = done - t;
            // Trailing writes, if any, land within a few seconds.
            tokio::time::sleep(Duration::from_secs(5)).await;
            let req = audit.between(a0, audit.offset())?;
            eprintln!(
                "bench:   {client}: flip seen after {} with {} slice writes",
                secs(latency),
                req.slice_writes(client)
            );
            results.push((latency, req.slice_writes(client), req.by_verb(client)));
        }
        let (nat, pw) = (&results[0], &results[1]);
        let label = format!("3 churn (one pod Ready→NotReady in a {big}-endpoint Service)");
        self.report.row(
            &label,
            "EndpointSlice writes",
            pw.1.to_string(),
            nat.1.to_string(),
            ratio(pw.1 as f64, nat.1 as f64),
            Goal::Stated("portwise 1", pw.1 == 1),
        );
        self.report.row(
            &label,
            "time from the status patch until the slice shows it",
            format!("{:.0} ms", pw.0.as_secs_f64() * 1000.0),
            format!("{:.0} ms", nat.0.as_secs_f64() * 1000.0),
            ratio(pw.0.as_secs_f64(), nat.0.as_secs_f64()),
            Goal::None,
        );
        self.report.row(
            &label,
            "API requests in the 5 s after",
            pw.2.clone(),
            nat.2.clone(),
            None,
            Goal::None,
        );
        self.port_set_churn(pair).await?;
        self.reconcile_costs(pair, &pb[0]).await
    }

    /// Row 3's third part: what a flip costs when every pod sits in one
    /// slice listing the two ports it backs (the native controller's
    /// layout). A readiness flip keeps the pod's set of ports (it leaves
    /// both, or rejoins both): one write. A flip of its ports annotation
    /// changes the set: it moves between slices. portwise only: the native
    /// controller has no per-port membership, so no pod of it changes its
    /// set of ports without being re-created.
    pub(crate) async fn port_set_churn(&mut self, pair: &mut Pair) -> Result<()> {
        let big = self.knobs.big_pods;
        let svc = "two-0000";
        eprintln!("bench: row 3 port sets: one Service of two ports, {big} pods backing both");
        let ns = &pair.portwise_ns;
        ns.create_service(
            service(svc)
                .annotation(GROUP_KEY, svc)
                .annotation("portwise.io/membership", "port-sets")
                .port_to("http", 80, json!(TARGET_PORT))
                .port_to("https", 443, json!(TCP_PORT)),
        )
        .await?;
        // The last addresses, past every other row's (row 1 at 5000
        // Services included): these pods are never reached.
        let last = 4 * 250 * 250 - 1 - big;
        let pods: Vec<(String, Ipv4Addr)> = (0..big)
            .map(|j| (format!("{svc}-{j:04}"), pod_ip(last + j)))
            .collect();
        let nodes = &self.nodes;
        stream::iter(pods.iter().enumerate().map(Ok::<_, anyhow::Error>))
            .try_for_each_concurrent(
                self.knobs.setup_concurrency.max(1),
                |(i, (name, ip))| async move {
                    let p = pod(name)
                        .annotation(GROUP_KEY, svc)
                        .annotation(PORTS_KEY, "http,https")
                        .node(&nodes[i % nodes.len()])
                        .ips([ip]);
                    ns.create_pod(p).await?;
                    Ok(())
                },
            )
            .await?;
        let all: BTreeSet<String> = pods.iter().map(|(_, ip)| ip.to_string()).collect();
        let without = |ip: &Ipv4Addr| {
            let mut s = all.clone();
            s.remove(&ip.to_string());
            s
        };
        port_members_are(ns, svc, &all, &all, Duration::from_secs(300)).await?;
        tokio::time::sleep(Duration::from_secs(5)).await;

        let audit = self.bcp.audit();
        // (what, the change, http's members after, https's after)
        let (ready_pod, ready_ip) = &pods[big / 3];
        let (ports_pod, ports_ip) = &pods[2 * big / 3];
        let mut keeps = Vec::new();
        let mut changes = Vec::new();
        for step in 0..4 {
            let a0 = audit.offset();
            let (http, https) = match step {
                0 => {
                    ns.set_ready(ready_pod, false).await?;
                    (without(ready_ip), without(ready_ip))
                }
                1 => {
                    ns.set_ready(ready_pod, true).await?;
                    (all.clone(), all.clone())
                }
                2 => {
                    ns.annotate_pod(ports_pod, PORTS_KEY, Some("http")).await?;
                    (all.clone(), without(ports_ip))
                }
                _ => {
                    ns.annotate_pod(ports_pod, PORTS_KEY, Some("http,https"))
                        .await?;
                    (all.clone(), all.clone())
                }
            };
            port_members_are(ns, svc, &http, &https, Duration::from_secs(60)).await?;
            // Trailing writes (a move's finish) land within a few seconds.
            tokio::time::sleep(Duration::from_secs(5)).await;
            let writes = audit.between(a0, audit.offset())?.slice_writes("portwise");
            eprintln!("bench:   port sets step {step}: {writes} slice writes");
            if step < 2 {
                keeps.push(writes);
            } else {
                changes.push(writes);
            }
        }
        let label = format!(
            "3 churn, two ports ({big} pods, each in one slice listing the ports it backs)"
        );
        let shown = |w: &[u64]| w.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
        self.report.row(
            &label,
            "EndpointSlice writes per flip that keeps the pod's port set (readiness out, in)",
            shown(&keeps),
            "1 (row 3's first part)".into(),
            None,
            Goal::Stated("1", keeps.iter().all(|w| *w == 1)),
        );
        self.report.row(
            &label,
            "EndpointSlice writes per flip that changes it (https out, in: a move)",
            shown(&changes),
            "no such flip".into(),
            None,
            Goal::Stated("≤ 2", changes.iter().all(|w| *w <= 2)),
        );
        Ok(())
    }
}
