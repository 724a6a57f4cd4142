//! Reading back what the apiserver holds, and waiting for it.
//!
//! portwise converges asynchronously, so assertions poll: `wait_for` retries
//! a fallible check until it passes, `stays_for` requires one to keep passing
//! for a whole window (for "never" and "does not change" claims). Checks
//! return `anyhow::Result` so a timeout reports the last reason it failed.

use std::{
    collections::{BTreeMap, BTreeSet},
    future::Future,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::{
    core::v1::Event,
    discovery::v1::{EndpointPort, EndpointSlice},
};
use kube::api::ListParams;

use crate::{MANAGED_BY, MANAGED_BY_LABEL, SERVICE_NAME_LABEL, TestNs};

const POLL: Duration = Duration::from_millis(250);

/// Polls `check` until it returns `Ok`, or fails with its last error once
/// `timeout` has passed.
pub async fn wait_for<T, F, Fut>(timeout: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let start = Instant::now();
    loop {
        match check().await {
            Ok(v) => return Ok(v),
            Err(e) if start.elapsed() >= timeout => {
                bail!("not true within {timeout:?}: {e:#}")
            }
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
}

/// Requires `check` to pass at every poll for `window`; fails at the first
/// poll that does not, saying when.
pub async fn stays_for<F, Fut>(window: Duration, mut check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<()>>,
{
    let start = Instant::now();
    loop {
        if let Err(e) = check().await {
            bail!("stopped holding after {:?}: {e:#}", start.elapsed());
        }
        if start.elapsed() >= window {
            return Ok(());
        }
        tokio::time::sleep(POLL).await;
    }
}

/// `Ok` when equal, else an error showing both sides.
pub fn expect_eq<T: PartialEq + std::fmt::Debug>(actual: T, expected: T) -> Result<()> {
    ensure!(
        actual == expected,
        "\n  actual:   {actual:?}\n  expected: {expected:?}"
    );
    Ok(())
}

/// Membership per (Service port name, address type): the pod names
/// (`targetRef.name`, or the address when there is none) across all of the
/// port's slices. A placeholder slice shows up as an empty set.
pub type ByPort = BTreeMap<(String, String), BTreeSet<String>>;

/// Builds an expected [`ByPort`]: `by_port([(("http", V4), &["a", "b"][..])])`.
pub fn by_port<'a>(
    entries: impl IntoIterator<Item = ((&'a str, &'a str), &'a [&'a str])>,
) -> ByPort {
    entries
        .into_iter()
        .map(|((port, family), pods)| {
            (
                (port.to_string(), family.to_string()),
                pods.iter().map(|p| p.to_string()).collect(),
            )
        })
        .collect()
}

/// The live EndpointSlices portwise (managed-by `portwise`) publishes for `svc`.
pub async fn slices_for(ns: &TestNs, svc: &str) -> Result<Vec<EndpointSlice>> {
    slices_managed_by(ns, svc, Some(MANAGED_BY)).await
}

/// The first of portwise's slices for `svc` that carries the port named
/// `port`: the slice a test edits by hand to play another writer.
pub async fn slice_for_port(ns: &TestNs, svc: &str, port: &str) -> Result<EndpointSlice> {
    slices_for(ns, svc)
        .await?
        .into_iter()
        .find(|s| {
            s.ports
                .iter()
                .flatten()
                .any(|p| p.name.as_deref() == Some(port))
        })
        .with_context(|| format!("no slice of {svc} carries port {port}"))
}

/// The live slices labelled for `svc`, by one manager or (None) by anyone.
pub async fn slices_managed_by(
    ns: &TestNs,
    svc: &str,
    manager: Option<&str>,
) -> Result<Vec<EndpointSlice>> {
    let mut selector = format!("{SERVICE_NAME_LABEL}={svc}");
    if let Some(m) = manager {
        selector.push_str(&format!(",{MANAGED_BY_LABEL}={m}"));
    }
    let mut items = ns
        .api::<EndpointSlice>()
        .list(&ListParams::default().labels(&selector))
        .await?
        .items;
    items.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    Ok(items)
}

/// One slice as a consumer keyed by address reads it: (its port names, in
/// order; its address type; its pods, sorted).
pub type SliceShape = (Vec<String>, String, Vec<String>);

/// Every slice portwise publishes for `svc`, as a [`SliceShape`], sorted.
pub async fn slice_shapes(ns: &TestNs, svc: &str) -> Result<Vec<SliceShape>> {
    let mut out: Vec<SliceShape> = slices_for(ns, svc)
        .await?
        .iter()
        .map(|s| {
            let ports = s
                .ports
                .iter()
                .flatten()
                .map(|p| p.name.clone().unwrap_or_default())
                .collect();
            let mut pods: Vec<String> = s
                .endpoints
                .iter()
                .flatten()
                .filter_map(|e| e.target_ref.as_ref()?.name.clone())
                .collect();
            pods.sort();
            (ports, s.address_type.clone(), pods)
        })
        .collect();
    out.sort();
    Ok(out)
}

/// Builds an expected [`SliceShape`] list: `shapes([(&["http"], V4, &["a"])])`.
pub fn shapes<'a>(
    entries: impl IntoIterator<Item = (&'a [&'a str], &'a str, &'a [&'a str])>,
) -> Vec<SliceShape> {
    let mut out: Vec<SliceShape> = entries
        .into_iter()
        .map(|(ports, family, pods)| {
            (
                ports.iter().map(|p| p.to_string()).collect(),
                family.to_string(),
                pods.iter().map(|p| p.to_string()).collect(),
            )
        })
        .collect();
    out.sort();
    out
}

/// The pods published for `svc`'s `port` in `family` (`V4`/`V6`).
pub async fn members(ns: &TestNs, svc: &str, port: &str, family: &str) -> Result<BTreeSet<String>> {
    Ok(endpoints_by_port(ns, svc)
        .await?
        .remove(&(port.to_string(), family.to_string()))
        .unwrap_or_default())
}

/// Pod names as a set, to compare with [`members`].
pub fn names(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// See [`ByPort`].
pub async fn endpoints_by_port(ns: &TestNs, svc: &str) -> Result<ByPort> {
    Ok(group_by_port(&slices_for(ns, svc).await?))
}

pub(crate) fn group_by_port(slices: &[EndpointSlice]) -> ByPort {
    let mut out = ByPort::new();
    for s in slices {
        // Every port a slice lists (several when they share a target
        // port); a port-less slice counts under "".
        let mut ports: Vec<String> = s
            .ports
            .iter()
            .flatten()
            .map(|p| p.name.clone().unwrap_or_default())
            .collect();
        if ports.is_empty() {
            ports.push(String::new());
        }
        for port in ports {
            let set = out.entry((port, s.address_type.clone())).or_default();
            for e in s.endpoints.iter().flatten() {
                let who = e
                    .target_ref
                    .as_ref()
                    .and_then(|r| r.name.clone())
                    .unwrap_or_else(|| e.addresses.join(","));
                set.insert(who);
            }
        }
    }
    out
}

/// One endpoint of one slice, flattened for assertions.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct EndpointView {
    pub port_name: String,
    pub address_type: String,
    pub pod: String,
    pub slice: String,
    pub port: Option<i32>,
    pub protocol: Option<String>,
    pub addresses: Vec<String>,
    pub ready: Option<bool>,
    pub serving: Option<bool>,
    pub terminating: Option<bool>,
    pub node_name: Option<String>,
    pub zone: Option<String>,
    pub hostname: Option<String>,
    pub hint_zones: Option<Vec<String>>,
    pub hint_nodes: Option<Vec<String>>,
    pub target_kind: Option<String>,
    pub target_namespace: Option<String>,
    pub target_uid: Option<String>,
}

/// Every endpoint portwise publishes for `svc`, sorted by (port, family, pod).
pub async fn endpoint_views(ns: &TestNs, svc: &str) -> Result<Vec<EndpointView>> {
    let mut out = Vec::new();
    for s in slices_for(ns, svc).await? {
        let mut ports: Vec<EndpointPort> = s.ports.clone().unwrap_or_default();
        if ports.is_empty() {
            ports.push(EndpointPort::default());
        }
        for (port, e) in ports
            .iter()
            .flat_map(|p| s.endpoints.iter().flatten().map(move |e| (p, e)))
        {
            let cond = e.conditions.clone().unwrap_or_default();
            let tr = e.target_ref.clone().unwrap_or_default();
            let hints = e.hints.clone();
            out.push(EndpointView {
                port_name: port.name.clone().unwrap_or_default(),
                address_type: s.address_type.clone(),
                pod: tr.name.clone().unwrap_or_else(|| e.addresses.join(",")),
                slice: s.metadata.name.clone().unwrap_or_default(),
                port: port.port,
                protocol: port.protocol.clone(),
                addresses: e.addresses.clone(),
                ready: cond.ready,
                serving: cond.serving,
                terminating: cond.terminating,
                node_name: e.node_name.clone(),
                zone: e.zone.clone(),
                hostname: e.hostname.clone(),
                hint_zones: hints.as_ref().and_then(|h| {
                    h.for_zones
                        .as_ref()
                        .map(|z| z.iter().map(|z| z.name.clone()).collect())
                }),
                hint_nodes: hints.as_ref().and_then(|h| {
                    h.for_nodes
                        .as_ref()
                        .map(|n| n.iter().map(|n| n.name.clone()).collect())
                }),
                target_kind: tr.kind.clone(),
                target_namespace: tr.namespace.clone(),
                target_uid: tr.uid.clone(),
            });
        }
    }
    out.sort();
    Ok(out)
}

/// The endpoint of `pod` on (`port`, `family`), failing unless exactly one.
pub async fn endpoint_of(
    ns: &TestNs,
    svc: &str,
    port: &str,
    family: &str,
    pod: &str,
) -> Result<EndpointView> {
    let all = endpoint_views(ns, svc).await?;
    let mut hits: Vec<_> = all
        .into_iter()
        .filter(|e| e.port_name == port && e.address_type == family && e.pod == pod)
        .collect();
    ensure!(
        hits.len() == 1,
        "expected one endpoint for {pod} on {port}/{family}, found {hits:?}"
    );
    Ok(hits.remove(0))
}

/// Structural promises that hold for every slice portwise publishes for
/// `svc` at any time: labels, controller owner reference, one port or
/// several of distinct names, size bound, and each address in one slice
/// of its family (the native controller's layout: consumers that keep one
/// slice per address, such as Cilium ClusterMesh, see every port it
/// backs), so no (address, number, protocol) sits in two slices either
/// (what Cilium keys a backend by).
pub async fn slice_invariants(ns: &TestNs, svc: &str, max_per_slice: usize) -> Result<()> {
    let service = ns.get_service(svc).await?;
    let uid = service.metadata.uid.clone().unwrap_or_default();
    let slices = slices_for(ns, svc).await?;
    // (address type, address) -> the slice that lists it.
    let mut homes: BTreeMap<(String, String), String> = BTreeMap::new();
    for s in &slices {
        let name = s.metadata.name.clone().unwrap_or_default();
        let labels = s.metadata.labels.clone().unwrap_or_default();
        ensure!(
            labels.get(SERVICE_NAME_LABEL).map(String::as_str) == Some(svc),
            "{name}: service-name label {labels:?}"
        );
        ensure!(
            labels.get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGED_BY),
            "{name}: managed-by label {labels:?}"
        );
        let owners = s.metadata.owner_references.clone().unwrap_or_default();
        ensure!(
            owners.iter().any(|o| o.kind == "Service"
                && o.name == svc
                && o.uid == uid
                && o.controller == Some(true)),
            "{name}: no controller owner reference to Service {svc} ({uid}): {owners:?}"
        );
        let ports = s.ports.clone().unwrap_or_default();
        let names: BTreeSet<String> = ports
            .iter()
            .map(|p| p.name.clone().unwrap_or_default())
            .collect();
        ensure!(
            !ports.is_empty() && names.len() == ports.len(),
            "{name}: expected one port or several of distinct names, got {ports:?}"
        );
        let eps = s.endpoints.clone().unwrap_or_default();
        ensure!(
            eps.len() <= max_per_slice,
            "{name}: {} endpoints > {max_per_slice}",
            eps.len()
        );
        for e in &eps {
            for a in &e.addresses {
                let key = (s.address_type.clone(), a.clone());
                if let Some(other) = homes.insert(key.clone(), name.clone()) {
                    ensure!(
                        other != name,
                        "{name}: address {a} published twice in one slice"
                    );
                    bail!("{key:?} is in slices {other} and {name}");
                }
            }
        }
    }
    Ok(())
}

/// The message of the newest Event about `name` with `reason`, once there
/// is one (waits up to 20 s).
pub async fn newest_event_message(ns: &TestNs, name: &str, reason: &str) -> Result<String> {
    wait_for(Duration::from_secs(20), || async {
        events_for(ns, name, Some(reason))
            .await?
            .last()
            .and_then(|e| e.message.clone())
            .ok_or_else(|| anyhow::anyhow!("no {reason} Event about {name} yet"))
    })
    .await
}

/// Events in the namespace about object `name` (any kind), optionally with
/// a given reason, oldest first.
pub async fn events_for(ns: &TestNs, name: &str, reason: Option<&str>) -> Result<Vec<Event>> {
    let mut events: Vec<Event> = ns
        .api::<Event>()
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(name))
        .filter(|e| reason.is_none() || e.reason.as_deref() == reason)
        .collect();
    events.sort_by(|a, b| {
        a.metadata
            .creation_timestamp
            .cmp(&b.metadata.creation_timestamp)
    });
    Ok(events)
}
