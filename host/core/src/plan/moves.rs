//! Endpoints that move between slices, and the write that finishes a move.
//!
//! Why a move needs care: Cilium keys a backend by (Service, IP:port,
//! protocol), and when a slice update drops an address it releases that
//! backend, whatever other slice of the Service still lists it
//! (`UpsertAndReleaseBackends` in `pkg/loadbalancer/reflectors/k8s.go`,
//! v1.20). It reads events in batches (up to 500 ms), and within a batch it
//! releases first and inserts after, so a move whose two writes land in one
//! batch is fine; when they straddle a batch boundary, the slice the
//! endpoint left is read last and the endpoint is lost until its new slice
//! is written again.
//!
//! Writing the losing slice first would be safe for Cilium but would leave
//! kube-proxy, which merges every slice of a port, without the endpoint
//! until both writes are read (up to its `minSyncPeriod`). So portwise keeps
//! the order that is safe for kube-proxy (gainers first, see
//! [`super::Plan::applies`]) and finishes the move with one more write: a
//! slice that takes in an endpoint another slice of ours drops is applied
//! first with the [`MOVING_IN_ANNOTATION`] naming what moves in, and, after
//! the losers and the deletes, once more without it
//! ([`super::Plan::finishes`]). Its last event then comes after the
//! release, in Cilium's order too. A move costs three writes instead of
//! two; a change that moves nothing costs what it did.

use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    net::IpAddr,
    sync::Arc,
};

use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::align;

/// Set on the first write of a slice that takes in endpoints another slice
/// drops in the same plan: the addresses moving in (at most
/// [`MAX_LISTED`], then a count). Removed by the write that finishes the
/// move.
pub const MOVING_IN_ANNOTATION: &str = "portwise.io/moving-in";

/// Addresses the annotation lists before it counts the rest.
const MAX_LISTED: usize = 8;

/// What a consumer keys a backend by, within a Service: address type,
/// address, port number, protocol.
type Backend = (String, IpAddr, Option<i32>, String);

fn backends(slice: &EndpointSlice) -> BTreeSet<Backend> {
    let ports: Vec<(Option<i32>, String)> = slice
        .ports
        .iter()
        .flatten()
        .map(|p| (p.port, align::protocol(p.protocol.as_deref()).to_string()))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut out = BTreeSet::new();
    for ep in slice.endpoints.iter().flatten() {
        for ip in ep.addresses.iter().filter_map(|a| align::parse_ip(a)) {
            for (port, proto) in &ports {
                out.insert((slice.address_type.clone(), ip, *port, proto.clone()));
            }
        }
    }
    out
}

/// What kube-proxy and CoreDNS merge, per endpoint: port name, address
/// type, port number, address.
type Published = (String, String, Option<i32>, IpAddr);

fn published(slice: &EndpointSlice) -> BTreeSet<Published> {
    let mut out = BTreeSet::new();
    for ep in slice.endpoints.iter().flatten() {
        for ip in ep.addresses.iter().filter_map(|a| align::parse_ip(a)) {
            for p in slice.ports.iter().flatten() {
                let name = p.name.clone().unwrap_or_default();
                out.insert((name, slice.address_type.clone(), p.port, ip));
            }
        }
    }
    out
}

/// Orders `applies` (gainers first, by name) so that a slice that drops an
/// endpoint of a port is written after the slice that takes it in, when
/// that is a different slice. Endpoints move between slices when a pod's
/// set of ports changes, and a slice can lose one
/// endpoint and gain another, so "gainers first" alone is not enough. When
/// two slices swap endpoints no order keeps both: the earlier of them goes
/// first, and its dropped endpoint is back one write later; the second
/// value says whether that happened.
pub(super) fn order(
    applies: Vec<EndpointSlice>,
    live: &BTreeMap<String, Arc<EndpointSlice>>,
) -> (Vec<EndpointSlice>, bool) {
    let before = |s: &EndpointSlice| {
        s.metadata
            .name
            .as_deref()
            .and_then(|n| live.get(n))
            .map(|l| published(l))
            .unwrap_or_default()
    };
    let mut gained_by: BTreeMap<Published, Vec<usize>> = BTreeMap::new();
    let mut dropped: Vec<BTreeSet<Published>> = Vec::new();
    for (i, s) in applies.iter().enumerate() {
        let (was, now) = (before(s), published(s));
        for k in now.difference(&was) {
            gained_by.entry(k.clone()).or_default().push(i);
        }
        dropped.push(was.difference(&now).cloned().collect());
    }
    // after[b] = the applies that must come before b.
    let after: Vec<BTreeSet<usize>> = dropped
        .iter()
        .enumerate()
        .map(|(b, ks)| {
            ks.iter()
                .flat_map(|k| gained_by.get(k).into_iter().flatten())
                .copied()
                .filter(|&a| a != b)
                .collect()
        })
        .collect();
    if after.iter().all(BTreeSet::is_empty) {
        return (applies, false);
    }
    let mut swapped = false;
    let mut done = vec![false; applies.len()];
    let mut order = Vec::with_capacity(applies.len());
    while order.len() < applies.len() {
        let ready = (0..applies.len())
            .filter(|&i| !done[i])
            .find(|&i| after[i].iter().all(|&a| done[a]));
        let next = ready.unwrap_or_else(|| {
            swapped = true;
            (0..applies.len()).find(|&i| !done[i]).unwrap_or(0)
        });
        done[next] = true;
        order.push(next);
    }
    let mut slots: Vec<Option<EndpointSlice>> = applies.into_iter().map(Some).collect();
    let ordered = order.into_iter().filter_map(|i| slots[i].take()).collect();
    (ordered, swapped)
}

/// Marks the applies that take in a backend some live slice of ours gives
/// up in this plan (rewritten without it, or deleted), and returns their
/// unmarked copies: the writes that finish the moves, in apply order.
///
/// `applies` are the plan's writes, `live` our live slices by name, and
/// `deletes` the names the plan deletes.
pub(super) fn mark_moves(
    applies: &mut [EndpointSlice],
    live: &BTreeMap<String, Arc<EndpointSlice>>,
    deletes: &[String],
) -> Vec<EndpointSlice> {
    let written: BTreeMap<&str, &EndpointSlice> = applies
        .iter()
        .filter_map(|s| Some((s.metadata.name.as_deref()?, s)))
        .collect();
    let mut released: HashSet<Backend> = HashSet::new();
    for (name, l) in live {
        let after = match written.get(name.as_str()) {
            Some(s) => backends(s),
            None if deletes.contains(name) => BTreeSet::new(),
            None => continue, // not written: shows what it showed
        };
        released.extend(backends(l).difference(&after).cloned());
    }
    if released.is_empty() {
        return Vec::new();
    }
    let mut finishes = Vec::new();
    for s in applies.iter_mut() {
        let before = s
            .metadata
            .name
            .as_deref()
            .and_then(|n| live.get(n))
            .map(|l| backends(l))
            .unwrap_or_default();
        let moving: BTreeSet<IpAddr> = backends(s)
            .difference(&before)
            .filter(|b| released.contains(*b))
            .map(|(_, ip, _, _)| *ip)
            .collect();
        if moving.is_empty() {
            continue;
        }
        finishes.push(s.clone());
        let mut listed: Vec<String> = moving
            .iter()
            .take(MAX_LISTED)
            .map(|ip| ip.to_string())
            .collect();
        if moving.len() > MAX_LISTED {
            listed.push(format!("+{} more", moving.len() - MAX_LISTED));
        }
        s.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(MOVING_IN_ANNOTATION.to_string(), listed.join(","));
    }
    finishes
}
