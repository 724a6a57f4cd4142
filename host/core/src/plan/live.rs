//! Reading the live slices: whose they are, and the (ports, family), port
//! numbers and endpoints of one as the planner identifies them.

use std::net::IpAddr;

use k8s_openapi::{
    api::{
        core::v1::Service,
        discovery::v1::{Endpoint, EndpointSlice},
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};

use super::object::{MANAGED_BY_LABEL, SERVICE_NAME_LABEL};
use crate::{align, membership::Family};

/// Whether `slice` is ours for `svc`: the Service is its controller owner
/// and the managed-by label is ours or was stripped (then we reclaim it).
pub fn is_ours(slice: &EndpointSlice, svc: &Service, managed_by: &str) -> bool {
    let Some(uid) = svc.metadata.uid.as_deref() else {
        return false;
    };
    let owner = slice.metadata.owner_references.iter().flatten().any(|o| {
        o.controller == Some(true) && o.kind == "Service" && o.api_version == "v1" && o.uid == uid
    });
    owner && label(&slice.metadata, MANAGED_BY_LABEL).is_none_or(|m| m == managed_by)
}

fn label<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.labels.as_ref()?.get(key).map(String::as_str)
}

/// Who holds a slice that is not ours, in words.
pub(super) fn holder(slice: &EndpointSlice) -> String {
    let manager = label(&slice.metadata, MANAGED_BY_LABEL).unwrap_or("an unknown manager");
    let owner = slice
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| format!("{} {}", o.kind, o.name))
        .or_else(|| label(&slice.metadata, SERVICE_NAME_LABEL).map(|s| format!("Service {s}")));
    match owner {
        Some(o) => format!("{manager} for {o}"),
        None => manager.to_string(),
    }
}

pub(super) fn slice_family(slice: &EndpointSlice) -> Option<Family> {
    match slice.address_type.as_str() {
        "IPv4" => Some(Family::V4),
        "IPv6" => Some(Family::V6),
        _ => None,
    }
}

/// (Service port names, family) of a live slice, when it has a shape
/// portwise writes: one port or several of distinct names (the ports an
/// endpoint backs together, see [`super`]), or none (a port-less Service,
/// or a family's placeholder).
pub(super) fn slice_group(slice: &EndpointSlice) -> Option<GroupKey> {
    let family = slice_family(slice)?;
    match slice.ports.as_deref() {
        Some([p]) => Some((vec![p.name.clone().unwrap_or_default()], family)),
        // A port-less Service's slice (the apiserver may drop the empty list).
        None | Some([]) => Some((vec![String::new()], family)),
        Some(ports) => {
            let mut names: Vec<String> = ports
                .iter()
                .map(|p| p.name.clone().unwrap_or_default())
                .collect();
            names.sort();
            names.dedup();
            (names.len() == ports.len()).then_some((names, family))
        }
    }
}

/// The port numbers of a live slice, one per port in the order of its
/// group's (sorted) names: its [`Targets`]. `[0]` for a port-less slice;
/// none when a port lacks a number.
pub(super) fn slice_targets(slice: &EndpointSlice) -> Option<Targets> {
    let ports = match slice.ports.as_deref() {
        None | Some([]) => return Some(vec![0]),
        Some(ports) => ports,
    };
    let mut by_name: Vec<(&str, Option<i32>)> = ports
        .iter()
        .map(|p| (p.name.as_deref().unwrap_or_default(), p.port))
        .collect();
    by_name.sort();
    by_name
        .into_iter()
        .map(|(_, n)| u16::try_from(n?).ok().filter(|n| *n != 0))
        .collect()
}

/// The one port number of a live slice of a single port (0 for a
/// port-less slice).
pub(super) fn slice_target(slice: &EndpointSlice) -> Option<u16> {
    match slice_targets(slice)?.as_slice() {
        [t] => Some(*t),
        _ => None,
    }
}

/// The number of port `name` in a live slice, if it lists that port (0 for
/// a port-less slice, as in [`Targets`]).
pub(super) fn slice_port_number(slice: &EndpointSlice, name: &str) -> Option<u16> {
    if slice.ports.as_deref().is_none_or(<[_]>::is_empty) {
        return Some(0);
    }
    slice
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref().unwrap_or_default() == name)
        .and_then(|p| u16::try_from(p.port?).ok())
}

/// (Service port names, sorted; family): the ports a slice carries, the
/// exact set of ports its endpoints back.
pub(super) type GroupKey = (Vec<String>, Family);
/// The port numbers a slice set publishes: one per port of its group, in
/// the order of the group's names (`[0]` for a port-less group). A named
/// `targetPort` may resolve to other numbers on other pods, so one group
/// can have several sets.
pub(super) type Targets = Vec<u16>;
/// (Service port name, family): what consumers merge per Service port.
pub(super) type PortKey = (String, Family);
/// An endpoint's identity within a set: its address and its pod's name.
pub(super) type EpKey = (IpAddr, String);

pub(super) fn live_key(ep: &Endpoint) -> Option<EpKey> {
    let ip = align::parse_ip(ep.addresses.first()?)?;
    let pod = ep.target_ref.as_ref()?.name.clone()?;
    Some((ip, pod))
}
