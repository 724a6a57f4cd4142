//! Settling abstentions against what the live slices show.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
};

use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::{
    live::{EpKey, PortKey, slice_group},
    model::{Judged, Member, PlanInput},
};
use crate::{align, membership::Decision};

/// Settles abstentions: an abstaining member stays iff the live slices we
/// own show it (same pod, same address) for that (port, family). Drops
/// members of ports or families the Service does not have, and duplicates.
pub(super) fn settle(
    input: &PlanInput,
    mine: &BTreeMap<String, Arc<EndpointSlice>>,
    wanted_ports: &HashSet<PortKey>,
) -> Vec<Member> {
    // (port, family, address, pod name) -> pod uid, as published.
    let mut published: HashMap<(PortKey, EpKey), Option<String>> = HashMap::new();
    for s in mine.values() {
        let Some((names, family)) = slice_group(s) else {
            continue;
        };
        for ep in s.endpoints.iter().flatten() {
            let Some(r) = &ep.target_ref else { continue };
            let Some(pod) = &r.name else { continue };
            for a in ep.addresses.iter().filter_map(|a| align::parse_ip(a)) {
                for name in &names {
                    published.insert(((name.clone(), family), (a, pod.clone())), r.uid.clone());
                }
            }
        }
    }
    let is_published = |j: &Judged| {
        let key = (
            (j.port.name.clone(), j.family),
            (j.address, j.pod.metadata.name.clone().unwrap_or_default()),
        );
        published
            .get(&key)
            .is_some_and(|uid| match (uid, &j.pod.metadata.uid) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            })
    };

    // One answer per (port, family, address, pod): include wins, then abstain.
    let rank = |d: Decision| match d {
        Decision::Include => 2,
        Decision::Abstain => 1,
        Decision::Exclude => 0,
    };
    let mut order: Vec<(&Judged, Decision)> = Vec::new();
    let mut index: HashMap<(PortKey, EpKey), usize> = HashMap::new();
    for j in input.judged {
        let g = (j.port.name.clone(), j.family);
        if !wanted_ports.contains(&g) || align::family_of(j.address) != j.family {
            continue;
        }
        let key = (
            g,
            (j.address, j.pod.metadata.name.clone().unwrap_or_default()),
        );
        match index.get(&key) {
            Some(&i) => {
                if rank(j.decision) > rank(order[i].1) {
                    order[i].1 = j.decision;
                }
            }
            None => {
                index.insert(key, order.len());
                order.push((j, j.decision));
            }
        }
    }
    order
        .into_iter()
        .filter(|(j, d)| match d {
            Decision::Include => true,
            Decision::Exclude => false,
            Decision::Abstain => is_published(j),
        })
        .map(|(j, _)| Member {
            port: j.port.clone(),
            family: j.family,
            pod: j.pod.clone(),
            address: j.address,
        })
        .collect()
}
