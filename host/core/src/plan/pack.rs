//! Packing one slice set's endpoints into slices, upstream style: few
//! writes, and an endpoint stays in the slice it sits in.

use std::{
    collections::{BTreeMap, HashSet},
    sync::Arc,
};

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};

use super::{
    diff,
    live::{EpKey, live_key},
};

/// A slice being planned: a live one (keeps its name) or a new one.
#[derive(Debug)]
pub(super) struct Chunk {
    pub(super) live: Option<Arc<EndpointSlice>>,
    /// Assigned to new chunks in the naming pass.
    pub(super) name: Option<String>,
    pub(super) keys: Vec<EpKey>,
    /// Will be written (so it may as well take new endpoints).
    pub(super) changed: bool,
}

impl Chunk {
    fn sort_name(&self) -> &str {
        self.live
            .as_ref()
            .and_then(|s| s.metadata.name.as_deref())
            .unwrap_or("\u{10ffff}")
    }
}

/// Packs one set's endpoints into its live slices, upstream style:
/// 1. keep each live endpoint that is still wanted where it is (capped at
///    `max`, first occurrence wins);
/// 2. fill slices that are being rewritten anyway, fullest first;
/// 3. put what is left into the fullest untouched slice it fits in whole,
///    else into new slices (while the Service is being deleted, into any
///    room left first, as new slices cannot be had).
pub(super) fn pack(
    desired: &BTreeMap<EpKey, Endpoint>,
    live: Vec<Arc<EndpointSlice>>,
    max: usize,
    meta_changed: &dyn Fn(&EndpointSlice) -> bool,
    fill_any_room: bool,
) -> Vec<Chunk> {
    let mut placed: HashSet<&EpKey> = HashSet::new();
    let mut chunks: Vec<Chunk> = Vec::new();
    for s in live {
        let mut keys: Vec<EpKey> = Vec::new();
        for ep in s.endpoints.iter().flatten() {
            let Some(k) = live_key(ep) else { continue };
            if keys.len() < max
                && let Some((k, _)) = desired.get_key_value(&k)
                && placed.insert(k)
            {
                keys.push(k.clone());
            }
        }
        let mut sorted = keys.clone();
        sorted.sort();
        let same_endpoints = sorted == keys && {
            let live_eps = s.endpoints.as_deref().unwrap_or_default();
            live_eps.len() == keys.len()
                && keys
                    .iter()
                    .zip(live_eps)
                    .all(|(k, l)| diff::endpoint_equal(&desired[k], l))
        };
        let changed = !same_endpoints || meta_changed(&s);
        chunks.push(Chunk {
            live: Some(s),
            name: None,
            keys,
            changed,
        });
    }

    let mut remaining = desired
        .keys()
        .filter(|k| !placed.contains(k))
        .cloned()
        .peekable();

    // 2. slices we write anyway take new endpoints first, fullest first.
    if remaining.peek().is_some() {
        fill_fullest_first(&mut chunks, |c| c.changed, max, &mut remaining);
    }

    // While the Service is being deleted no slice may be created, so every
    // bit of room in the live ones is used first; otherwise a later pass
    // would find room the previous one left and never settle.
    if fill_any_room && remaining.peek().is_some() {
        fill_fullest_first(&mut chunks, |c| c.keys.len() < max, max, &mut remaining);
    }

    // 3. the rest: into one untouched slice it fits in whole, else new ones.
    let rest: Vec<EpKey> = remaining.collect();
    let mut at = 0;
    while at < rest.len() {
        let left = rest.len() - at;
        let fit = if left < max {
            (0..chunks.len())
                .filter(|&i| !chunks[i].changed && chunks[i].keys.len() + left <= max)
                .max_by(|&a, &b| {
                    chunks[a]
                        .keys
                        .len()
                        .cmp(&chunks[b].keys.len())
                        .then_with(|| chunks[b].sort_name().cmp(chunks[a].sort_name()))
                })
        } else {
            None
        };
        let i = fit.unwrap_or_else(|| {
            chunks.push(Chunk {
                live: None,
                name: None,
                keys: Vec::new(),
                changed: true,
            });
            chunks.len() - 1
        });
        chunks[i].changed = true;
        let take = (max - chunks[i].keys.len()).min(left);
        chunks[i].keys.extend_from_slice(&rest[at..at + take]);
        at += take;
    }
    for c in &mut chunks {
        c.keys.sort();
    }
    chunks
}

/// Tops up the chunks `pick` selects (chosen before any is filled) with
/// endpoints from `remaining`, fullest first, then by name, up to `max`
/// each; a chunk that takes one is written.
fn fill_fullest_first(
    chunks: &mut [Chunk],
    pick: impl Fn(&Chunk) -> bool,
    max: usize,
    remaining: &mut impl Iterator<Item = EpKey>,
) {
    let mut order: Vec<usize> = (0..chunks.len()).filter(|&i| pick(&chunks[i])).collect();
    order.sort_by(|&a, &b| {
        chunks[b]
            .keys
            .len()
            .cmp(&chunks[a].keys.len())
            .then_with(|| chunks[a].sort_name().cmp(chunks[b].sort_name()))
    });
    for i in order {
        while chunks[i].keys.len() < max {
            let Some(k) = remaining.next() else { break };
            chunks[i].keys.push(k);
            chunks[i].changed = true;
        }
    }
}
