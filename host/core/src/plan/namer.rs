//! Handing out names for new slices: the scheme's names in order, skipping
//! those others hold (reported as collisions), reusing spare slices of ours.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};

use super::{
    live::{holder, is_ours, slice_family},
    model::Collision,
    naming,
};
use crate::membership::Family;

/// Hands out names for new slices.
pub(super) struct Namer<'a> {
    pub(super) used: BTreeSet<String>,
    pub(super) mine: &'a BTreeMap<String, Arc<EndpointSlice>>,
    pub(super) lookup: &'a dyn Fn(&str) -> Option<Arc<EndpointSlice>>,
    pub(super) svc: &'a Service,
    pub(super) manager: &'a str,
    pub(super) deleting: bool,
    pub(super) collisions: Vec<Collision>,
}

/// Bound on names tried for one slice (each skipped name is a live object).
const MAX_NAME_ATTEMPTS: usize = 10_000;

impl Namer<'_> {
    /// The first name of `stem` held by a slice of ours (same address type,
    /// which is immutable) that nothing else keeps, or free. Names held by
    /// others are reported and skipped. Before creating a slice, a slice of
    /// the same group that would otherwise be deleted (`spares`) is reused
    /// instead, as upstream does: one write rather than a create and a
    /// delete. While the Service is being deleted nothing is created.
    pub(super) fn allocate(
        &mut self,
        stem: &str,
        family: Family,
        spares: &[Arc<EndpointSlice>],
    ) -> Option<(String, Option<Arc<EndpointSlice>>)> {
        for n in 1..=MAX_NAME_ATTEMPTS {
            let name = naming::chunk_name(stem, n);
            if self.used.contains(&name) {
                continue;
            }
            let live = self
                .mine
                .get(&name)
                .cloned()
                .or_else(|| (self.lookup)(&name));
            match live {
                Some(s) if is_ours(&s, self.svc, self.manager) => {
                    if slice_family(&s) != Some(family) {
                        continue;
                    }
                    self.used.insert(name.clone());
                    return Some((name, Some(s)));
                }
                Some(s) => {
                    if !self.collisions.iter().any(|c| c.name == name) {
                        self.collisions.push(Collision {
                            name: name.clone(),
                            holder: holder(&s),
                        });
                    }
                }
                None => {
                    let spare = spares.iter().find(|s| {
                        !self
                            .used
                            .contains(s.metadata.name.as_deref().unwrap_or_default())
                    });
                    if let Some(s) = spare {
                        let name = s.metadata.name.clone().unwrap_or_default();
                        self.used.insert(name.clone());
                        return Some((name, Some(s.clone())));
                    }
                    if self.deleting {
                        return None;
                    }
                    self.used.insert(name.clone());
                    return Some((name, None));
                }
            }
        }
        None
    }
}
