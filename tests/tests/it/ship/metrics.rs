//! `/metrics` tells the truth: `portwise_endpoints_published` and
//! `portwise_slices_managed` of the real binary agree with the slices the
//! apiserver holds, for a dual-stack Service split over several slices,
//! before and after changes, and the Service's series go when it does.
//! `/healthz` and `/readyz` answer 200 once caches are synced.

use std::collections::BTreeMap;

use anyhow::{Result, ensure};
use portwise_tests::*;

/// (port, family) → endpoints, from the live slices.
type Figures = BTreeMap<(String, String), f64>;

/// What the apiserver holds for `svc`: endpoints per (port, family), and
/// how many slices.
async fn live(ns: &TestNs, svc: &str) -> Result<(Figures, f64)> {
    let slices = slices_for(ns, svc).await?;
    let mut figures = Figures::new();
    for s in &slices {
        // A slice lists every port its endpoints back.
        for p in s.ports.iter().flatten() {
            let port = p.name.clone().unwrap_or_default();
            *figures.entry((port, s.address_type.clone())).or_default() +=
                s.endpoints.as_ref().map_or(0, Vec::len) as f64;
        }
    }
    Ok((figures, slices.len() as f64))
}

/// name port/family: endpoints, per slice (for failure messages).
fn describe(slices: &[k8s_openapi::api::discovery::v1::EndpointSlice]) -> String {
    slices
        .iter()
        .map(|s| {
            let ports: Vec<String> = s
                .ports
                .iter()
                .flatten()
                .map(|p| p.name.clone().unwrap_or_default())
                .collect();
            format!(
                "{} {}/{}: {}",
                s.metadata.name.as_deref().unwrap_or_default(),
                ports.join("+"),
                s.address_type,
                s.endpoints.as_ref().map_or(0, Vec::len)
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// What portwise reports for `svc`.
fn reported(m: &Metrics, ns: &str, svc: &str) -> Result<(Figures, Option<f64>)> {
    let labels = [("namespace", ns), ("service", svc)];
    let mut figures = Figures::new();
    for s in m.select("portwise_endpoints_published", &labels) {
        let key = (s.labels["port"].clone(), s.labels["family"].clone());
        ensure!(
            figures.insert(key.clone(), s.value).is_none(),
            "{key:?} reported twice"
        );
    }
    Ok((figures, m.value("portwise_slices_managed", &labels)?))
}

fn figures(rows: &[(&str, &str, f64)]) -> Figures {
    rows.iter()
        .map(|(p, f, n)| ((p.to_string(), f.to_string()), *n))
        .collect()
}

#[derive(Clone, Copy, Debug)]
enum Slices {
    Exactly(f64),
    AtLeast(f64),
}

/// Waits until the live slices hold `expected` in `slices` slices and the
/// metrics say exactly what the apiserver holds.
async fn agree(pw: &Portwise, ns: &TestNs, expected: &Figures, slices: Slices) -> Result<()> {
    wait_for(SETTLE, || async {
        let (live, live_slices) = live(ns, "web").await?;
        let (said, said_slices) = reported(&pw.scrape().await?, ns.name(), "web")?;
        let live_nonzero: Figures = live
            .iter()
            .filter(|(_, n)| **n > 0.0)
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        expect_eq(&live_nonzero, expected)?;
        match slices {
            // Created from scratch: packed full.
            Slices::Exactly(n) => ensure!(
                live_slices == n,
                "{live_slices} slices, expected {n}: {}",
                describe(&slices_for(ns, "web").await?)
            ),
            // After changes slices are kept rather than repacked (fewer
            // writes), so only a lower bound is fixed.
            Slices::AtLeast(n) => ensure!(
                live_slices >= n,
                "{live_slices} slices, expected at least {n}: {}",
                describe(&slices_for(ns, "web").await?)
            ),
        }
        // Every port and family has a series, also at 0.
        let said_nonzero: Figures = said
            .iter()
            .filter(|(_, n)| **n > 0.0)
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        expect_eq(&said_nonzero, &live_nonzero)?;
        for port in ["http", "https"] {
            for family in [V4, V6] {
                ensure!(
                    said.contains_key(&(port.to_string(), family.to_string())),
                    "no portwise_endpoints_published series for {port}/{family}: {said:?}"
                );
            }
        }
        expect_eq(said.len(), 4)?;
        expect_eq(said_slices, Some(live_slices))?;
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_agree_with_the_live_slices() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "ship-metrics").await?;
    ns.create_service(
        service("web")
            .annotation(GROUP_KEY, "g")
            .dual_stack()
            .port("http", 8080)
            .port("https", 8443),
    )
    .await?;
    let pods = [
        ("p0", "http"),
        ("p1", "http,https"),
        ("p2", "http,https"),
        ("p3", "https"),
        ("p4", "http"),
    ]
    .into_iter()
    .map(|(name, ports)| {
        seed_pod(name, ports)
            .annotation(GROUP_KEY, "g")
            .ips(next_ips().dual())
    })
    .collect();
    ns.create_pods(pods).await?;

    let mut pw = Portwise::builder(cp)
        .name("portwise-metrics")
        .namespace(ns.name())
        .config(&config_with(SEED_MEMBERSHIP, "maxEndpointsPerSlice: 2\n"))
        .binary()
        .start()
        .await?;
    let ready_after = pw.wait_ready().await?;
    let (code, body) = pw.get("/healthz").await?;
    expect_eq((code, body.trim()), (200, "ok"))?;
    println!("/readyz 200 after {:.2}s", ready_after.as_secs_f64());

    // http: p0 p1 p2 p4, https: p1 p2 p3; per family one slice for each
    // set of ports: {http} p0 p4, {http, https} p1 p2, {https} p3.
    agree(
        &pw,
        &ns,
        &figures(&[
            ("http", V4, 4.0),
            ("http", V6, 4.0),
            ("https", V4, 3.0),
            ("https", V6, 3.0),
        ]),
        Slices::Exactly(6.0),
    )
    .await?;
    // The native controller's figures, under its names: 14 endpoints (per
    // port) in 6 slices, 6 with perfect packing (2 per slice: 2, 2 and 1
    // per family), all 14 added by the syncs so far, in 6 creates.
    wait_for(SETTLE, || async {
        let m = pw.scrape().await?;
        let value = |name: &str, labels: &[(&str, &str)]| m.value(name, labels);
        expect_eq(
            (
                value("portwise_endpoints_desired", &[])?,
                value("portwise_num_endpoint_slices", &[])?,
                value("portwise_desired_endpoint_slices", &[])?,
                value("portwise_endpoints_added_per_sync_sum", &[])?,
                value("portwise_endpoints_removed_per_sync_sum", &[])?,
                value("portwise_changes_total", &[("operation", "create")])?,
                value("portwise_changes_total", &[("operation", "delete")])?,
            ),
            (
                Some(14.0),
                Some(6.0),
                Some(6.0),
                Some(14.0),
                Some(0.0),
                Some(6.0),
                Some(0.0),
            ),
        )?;
        let syncs = value("portwise_syncs_total", &[("result", "success")])?.unwrap_or(0.0);
        ensure!(syncs >= 1.0, "no successful sync counted: {syncs}");
        // The tests share the workspace's version with the binary.
        expect_eq(
            value(
                "portwise_build_info",
                &[("version", env!("CARGO_PKG_VERSION"))],
            )?,
            Some(1.0),
        )?;
        Ok(())
    })
    .await?;

    // p3 serves http too, p1 turns unready (leaves both
    // ports), p4 goes away.
    ns.annotate_pod("p3", PORTS_KEY, Some("http,https")).await?;
    ns.set_ready("p1", false).await?;
    ns.delete_pod("p4").await?;
    // http: p0 p2 p3, https: p2 p3: {http} p0, {http, https} p2 p3 (the
    // slice of {https} alone goes).
    agree(
        &pw,
        &ns,
        &figures(&[
            ("http", V4, 3.0),
            ("http", V6, 3.0),
            ("https", V4, 2.0),
            ("https", V6, 2.0),
        ]),
        Slices::AtLeast(4.0),
    )
    .await?;

    // Nobody serves https any more: its series stay, at 0.
    ns.annotate_pod("p2", PORTS_KEY, Some("http")).await?;
    ns.annotate_pod("p3", PORTS_KEY, Some("http")).await?;
    wait_for(SETTLE, || async {
        let (said, _) = reported(&pw.scrape().await?, ns.name(), "web")?;
        for family in [V4, V6] {
            expect_eq(
                said.get(&("https".to_string(), family.to_string())),
                Some(&0.0),
            )?;
            expect_eq(
                said.get(&("http".to_string(), family.to_string())),
                Some(&3.0),
            )?;
        }
        let (live, live_slices) = live(&ns, "web").await?;
        expect_eq(
            live.get(&("https".to_string(), V4.to_string()))
                .copied()
                .unwrap_or(0.0),
            0.0,
        )?;
        let (_, said_slices) = reported(&pw.scrape().await?, ns.name(), "web")?;
        expect_eq(said_slices, Some(live_slices))?;
        Ok(())
    })
    .await?;

    // Pods of the group that no port can include are counted by reason.
    ns.create_pods(vec![
        seed_pod("done", "http")
            .annotation(GROUP_KEY, "g")
            .phase("Succeeded")
            .ips(next_ips().dual()),
        seed_pod("orphan", "http")
            .annotation(GROUP_KEY, "g")
            .node("a-node-that-is-gone")
            .ips(next_ips().dual()),
        seed_pod("pending", "http")
            .annotation(GROUP_KEY, "g")
            .no_status(),
    ])
    .await?;
    wait_for(SETTLE, || async {
        let m = pw.scrape().await?;
        for reason in ["terminal", "node-gone", "no-address"] {
            let labels = [
                ("namespace", ns.name()),
                ("service", "web"),
                ("reason", reason),
            ];
            expect_eq(
                (reason, m.value("portwise_pods_not_judged", &labels)?),
                (reason, Some(1.0)),
            )?;
        }
        Ok(())
    })
    .await?;
    ns.delete_pod("done").await?;
    wait_for(SETTLE, || async {
        let labels = [
            ("namespace", ns.name()),
            ("service", "web"),
            ("reason", "terminal"),
        ];
        expect_eq(
            pw.scrape()
                .await?
                .value("portwise_pods_not_judged", &labels)?,
            Some(0.0),
        )
    })
    .await?;

    // The Service goes: so do its series.
    ns.delete_service("web").await?;
    wait_for(SETTLE, || async {
        let m = pw.scrape().await?;
        let left: Vec<_> =
            m.0.iter()
                .filter(|s| s.labels.get("service").map(String::as_str) == Some("web"))
                .collect();
        ensure!(
            left.is_empty(),
            "series left for a deleted Service: {left:?}"
        );
        // ... and its share of the totals.
        expect_eq(
            (
                m.value("portwise_endpoints_desired", &[])?,
                m.value("portwise_num_endpoint_slices", &[])?,
            ),
            (Some(0.0), Some(0.0)),
        )?;
        Ok(())
    })
    .await?;
    expect_eq(pw.scrape().await?.value("portwise_leader", &[])?, Some(1.0))?;

    // Every family the binary serves is in the one metrics table of the
    // docs (docs/operations.md; deploy/README.md points there).
    let text = pw.metrics_text().await?;
    let docs = std::fs::read_to_string(super::support::repo().join("docs/operations.md"))?;
    let undocumented: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|family| {
            // OpenMetrics names a counter's family without `_total`.
            let listed = [
                format!("`{family}`"),
                format!("`{family}_total`"),
                format!("`{family}_seconds`"),
            ];
            !listed.iter().any(|name| docs.contains(name.as_str()))
        })
        .collect();
    ensure!(
        undocumented.is_empty(),
        "served but not in docs/operations.md's metrics table: {undocumented:?}"
    );

    // Every metric the alerts (deploy/helm/files/rules.yaml) and the
    // dashboard (files/dashboard.json) read is served: a renamed metric
    // would leave an alert that can never fire.
    let families: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    for file in ["rules.yaml", "dashboard.json"] {
        let body =
            std::fs::read_to_string(super::support::repo().join("deploy/helm/files").join(file))?;
        let mut named: Vec<&str> = body
            .match_indices("portwise_")
            .map(|(at, _)| {
                let rest = &body[at..];
                let end = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len());
                &rest[..end]
            })
            .collect();
        named.sort_unstable();
        named.dedup();
        ensure!(named.len() >= 5, "{file} names only {named:?}");
        let unknown: Vec<&&str> = named
            .iter()
            .filter(|name| {
                let stem = ["_total", "_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|suffix| name.strip_suffix(suffix))
                    .unwrap_or(name);
                !families.contains(name) && !families.contains(&stem)
            })
            .collect();
        ensure!(
            unknown.is_empty(),
            "{file} reads metrics portwise does not serve: {unknown:?} (served: {families:?})"
        );
    }
    pw.check_running()?;
    pw.stop().await?;
    Ok(())
}
