//! The objects rows create: Services and Ready pods in groups, their
//! addresses, and portwise's config for them.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use anyhow::{Result, bail};
use futures::{TryStreamExt, stream};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::{Api, api::ListParams};
use portwise_tests::{GROUP_KEY, MANAGED_BY_LABEL, SERVICE_NAME_LABEL, TestNs, pod, service};
use serde_json::json;

use crate::tracker::Expected;

/// Row 3's two-port Service: a policy (picked by its annotation) that
/// includes a ready pod on the ports its [`PORTS_KEY`] annotation lists, so
/// a pod's set of ports can change without touching its readiness.
pub(crate) const PORT_SETS_POLICY: &str = "policies:\n  port-sets: {all: [podReady, {portNames: {annotation: bench.portwise.io/ports}}]}\n";
pub(crate) const PORTS_KEY: &str = "bench.portwise.io/ports";

/// Label the native Services select their pods by.
pub(crate) const APP_LABEL: &str = "bench.portwise.io/svc";
pub(crate) const TARGET_PORT: i32 = 8080;
pub(crate) const TCP_PORT: i32 = 8443;
pub(crate) const NODES: usize = 10;
pub(crate) const ZONES: [&str; 3] = ["zone-a", "zone-b", "zone-c"];
pub(crate) const PORTWISE_MANAGER: &str = "portwise";

/// The `n`th pod address: 10.244.0.0/16 first (the addresses `tests/netns`
/// makes local, which rows that reach pods stay within), then on into
/// 10.245–10.247 for the 5000-Service scale of row 1 (`BENCH_SERVICES`),
/// whose pods are judged by readiness alone and never reached.
pub(crate) fn pod_ip(n: usize) -> Ipv4Addr {
    const PER_16: usize = 250 * 250;
    assert!(n < 4 * PER_16, "pod address space exhausted");
    let (block, n) = (n / PER_16, n % PER_16);
    Ipv4Addr::new(10, 244 + block as u8, (n / 250) as u8, (n % 250 + 1) as u8)
}

#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Kind {
    Native,
    Portwise,
    /// Row 9: the key both as a label and as an annotation ([`COST_KEY`]).
    Cost,
}

/// Row 9's key (label and annotation) and manager: no other row's objects
/// carry them, so the other rows' objects are unmanaged to row 9's portwise.
pub(crate) const COST_KEY: &str = "bench.portwise.io/cost-group";
pub(crate) const COST_MANAGER: &str = "portwise-cost";

pub(crate) struct Group {
    pub(crate) service: String,
    pub(crate) pods: Vec<(String, Ipv4Addr)>,
}

/// Services `s-0000…` with `per` pods each, pod addresses from `base` on.
pub(crate) fn groups(prefix: &str, count: usize, per: usize, base: usize) -> Vec<Group> {
    (0..count)
        .map(|i| Group {
            service: format!("{prefix}-{i:04}"),
            pods: (0..per)
                .map(|j| {
                    (
                        format!("{prefix}-{i:04}-{j:04}"),
                        pod_ip(base + i * per + j),
                    )
                })
                .collect(),
        })
        .collect()
}

pub(crate) fn expected_of(groups: &[Group]) -> Expected {
    groups
        .iter()
        .map(|g| {
            (
                g.service.clone(),
                g.pods.iter().map(|(_, ip)| ip.to_string()).collect(),
            )
        })
        .collect()
}

/// Creates the Services and Ready pods of `groups` in `ns`, `conc` requests
/// in flight.
pub(crate) async fn create_groups(
    ns: &TestNs,
    kind: Kind,
    groups: &[Group],
    nodes: &[String],
    conc: usize,
) -> Result<()> {
    stream::iter(groups.iter().map(Ok::<_, anyhow::Error>))
        .try_for_each_concurrent(conc.min(16), |g| async move {
            let mut svc = service(&g.service).port_to("http", 80, json!(TARGET_PORT));
            svc = match kind {
                Kind::Native => svc.selector(APP_LABEL, &g.service),
                Kind::Portwise => svc.annotation(GROUP_KEY, &g.service),
                Kind::Cost => svc
                    .label(COST_KEY, &g.service)
                    .annotation(COST_KEY, &g.service),
            };
            ns.create_service(svc).await?;
            Ok(())
        })
        .await?;
    let pods: Vec<(usize, &Group, &(String, Ipv4Addr))> = groups
        .iter()
        .flat_map(|g| g.pods.iter().map(move |p| (g, p)))
        .enumerate()
        .map(|(i, (g, p))| (i, g, p))
        .collect();
    let done = std::sync::atomic::AtomicUsize::new(0);
    let total = pods.len();
    let t = Instant::now();
    stream::iter(pods.into_iter().map(Ok::<_, anyhow::Error>))
        .try_for_each_concurrent(conc, |(i, g, (name, ip))| {
            let node = &nodes[i % nodes.len()];
            let done = &done;
            async move {
                // Identical pods in both namespaces: the label for the
                // native selector, the annotation for portwise's group.
                let p = match kind {
                    Kind::Native | Kind::Portwise => pod(name)
                        .label(APP_LABEL, &g.service)
                        .annotation(GROUP_KEY, &g.service),
                    Kind::Cost => pod(name)
                        .label(COST_KEY, &g.service)
                        .annotation(COST_KEY, &g.service),
                }
                .node(node)
                .ips([ip]);
                ns.create_pod(p).await?;
                let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                if n.is_multiple_of(2000) {
                    eprintln!(
                        "bench:   {} {n}/{total} pods ({:.0}/s)",
                        ns.name(),
                        n as f64 / t.elapsed().as_secs_f64()
                    );
                }
                Ok(())
            }
        })
        .await
}

/// Waits until portwise's slices of `svc` list exactly `http` and `https`
/// (addresses) on those ports.
/// Endpoints in `ns`'s slices whose labels match `selector`.
pub(crate) async fn endpoints_of(ns: &TestNs, selector: &str) -> Result<usize> {
    let slices = ns
        .api::<EndpointSlice>()
        .list(&ListParams::default().labels(selector))
        .await?;
    Ok(slices
        .items
        .iter()
        .map(|s| s.endpoints.as_ref().map_or(0, Vec::len))
        .sum())
}

pub(crate) async fn port_members_are(
    ns: &TestNs,
    svc: &str,
    http: &BTreeSet<String>,
    https: &BTreeSet<String>,
    timeout: Duration,
) -> Result<()> {
    let api: Api<EndpointSlice> = ns.api();
    let selector = format!("{SERVICE_NAME_LABEL}={svc},{MANAGED_BY_LABEL}={PORTWISE_MANAGER}");
    let t = Instant::now();
    loop {
        let mut by_port: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for s in api
            .list(&ListParams::default().labels(&selector))
            .await?
            .items
        {
            for p in s.ports.iter().flatten() {
                let set = by_port
                    .entry(p.name.clone().unwrap_or_default())
                    .or_default();
                set.extend(
                    s.endpoints
                        .iter()
                        .flatten()
                        .flat_map(|e| e.addresses.clone()),
                );
            }
        }
        let got = |p: &str| by_port.get(p).cloned().unwrap_or_default();
        if got("http") == *http && got("https") == *https {
            return Ok(());
        }
        if t.elapsed() > timeout {
            bail!(
                "{svc}: http {} of {}, https {} of {} after {timeout:?}",
                got("http").len(),
                http.len(),
                got("https").len(),
                https.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(crate) fn portwise_config(extra: &str, membership: &str) -> String {
    format!(
        "managedBy: {PORTWISE_MANAGER}\n\
         serviceKey: {{annotation: {GROUP_KEY}}}\n\
         {extra}\
         membership: {membership}\n"
    )
}
