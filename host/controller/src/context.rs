//! What a reconcile reads: the caches and indexes, the checkers, the
//! writers and the per-Service memory, and the reads over them.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
};

use k8s_openapi::api::{
    core::v1::{Endpoints, Node, Pod, Service},
    discovery::v1::EndpointSlice,
};
use kube::{
    ResourceExt,
    core::PartialObjectMeta,
    runtime::reflector::{ObjectRef, Store},
};

use portwise_core::{config::Config, plan::TriggerMemory};

use crate::{
    apply::SliceWriter,
    cache::{GroupIndex, SyncGate},
    events::Events,
    judge::Judge,
    metrics::Metrics,
    migrate,
    retry::Retries,
    shadow::Shadows,
    tenure::Tenure,
};

/// Everything a reconcile reads: caches, indexes, the checker, writers.
pub(crate) struct Context {
    pub(crate) config: Arc<Config>,
    /// The Service cache (per-Service state is kept only for Services it
    /// still holds).
    pub(crate) services: Store<Service>,
    pub(crate) pods: Store<Pod>,
    pub(crate) slices: Store<EndpointSlice>,
    /// The legacy Endpoints objects that carry our managed-by label.
    pub(crate) our_endpoints: Store<Endpoints>,
    pub(crate) nodes: Option<Store<PartialObjectMeta<Node>>>,
    pub(crate) pod_groups: Arc<GroupIndex>,
    /// slices by the Service they belong to (owner or service-name label)
    pub(crate) slice_owners: Arc<GroupIndex>,
    pub(crate) judge: Judge,
    /// The configuration's shadow expressions, if any (`crate::shadow`).
    pub(crate) shadows: Option<Arc<Shadows>>,
    /// What shadow runs report through (`crate::shadow::Shadows::submit`).
    pub(crate) shadow_outlets: crate::shadow::Outlets,
    pub(crate) writer: SliceWriter,
    /// Events on the Services served.
    pub(crate) events: Arc<Events>,
    pub(crate) metrics: Metrics,
    pub(crate) leader: Option<Tenure>,
    /// Services whose selector warning was emitted (per transition).
    pub(crate) selector_warned: Mutex<HashSet<String>>,
    /// Services whose ExternalName event was emitted.
    pub(crate) external_warned: Mutex<HashSet<String>>,
    /// Services warned about an unknown policy, with the name warned about
    /// (another wrong name warns again).
    pub(crate) policy_warned: Mutex<HashMap<String, String>>,
    /// Consecutive failed reconciles per Service, for the retry backoff.
    pub(crate) retries: Retries,
    /// Per Service UID: the trigger times its last written plan saw, so
    /// the next plan knows which changed since (the trigger-time
    /// annotation, `portwise_core::plan::trigger`). Dropped when the Service
    /// is deleted or no longer served.
    pub(crate) trigger_memory: Mutex<HashMap<String, TriggerMemory>>,
    pub(crate) migration: migrate::Migrator,
    /// Every watch has listed once: the caches are complete.
    pub(crate) synced: SyncGate,
    /// Which namespaces' pods are in the cache in full, where pods are
    /// watched per namespace ([`crate::pod_scopes`]).
    pub(crate) pods_listed: crate::pod_scopes::ListedPods,
    /// Where every reconcile is asked for ([`crate::queue`]).
    pub(crate) queue: crate::queue::Queue<kube::runtime::reflector::ObjectRef<Service>>,
    /// When a pod change first asked for each Service's next reconcile.
    pub(crate) asked: Arc<crate::asked::Asked>,
}

impl Context {
    /// Within this replica's term (by the clock, see [`Tenure`]).
    pub(crate) fn is_leader(&self) -> bool {
        self.leader.as_ref().is_none_or(Tenure::leads)
    }

    pub(crate) fn pods_in_group(&self, ns: &str, group: &str) -> Vec<Arc<Pod>> {
        self.pod_groups
            .members(ns, group)
            .into_iter()
            .filter_map(|name| self.pods.get(&ObjectRef::new(&name).within(ns)))
            .collect()
    }

    /// The Node exists (always, without Node lookups: nothing to go by).
    pub(crate) fn node_known(&self, node: &str) -> bool {
        self.nodes
            .as_ref()
            .is_none_or(|nodes| nodes.get(&ObjectRef::new(node)).is_some())
    }

    pub(crate) fn slice_by_name(&self, ns: &str, name: &str) -> Option<Arc<EndpointSlice>> {
        self.writer
            .overlay(ns, name, self.slices.get(&ObjectRef::new(name).within(ns)))
    }

    /// Live slices that may be ours for `svc` (indexed under its name, or
    /// written by us lately), read through our own recent writes so a
    /// reconcile that races the watch does not write twice. Which of them
    /// are ours is the core's call (`plan::is_ours`), made there once.
    pub(crate) fn candidate_slices(&self, svc: &Service) -> Vec<Arc<EndpointSlice>> {
        let ns = svc.namespace().unwrap_or_default();
        let mut names: Vec<String> = self.slice_owners.members(&ns, &svc.name_any());
        names.extend(self.writer.recent_names(&ns));
        names.sort();
        names.dedup();
        names
            .into_iter()
            .filter_map(|n| self.slice_by_name(&ns, &n))
            .collect()
    }

    /// Whether the Service cache still holds `svc` (this object, by uid).
    pub(crate) fn still_cached(&self, svc: &Service) -> bool {
        self.services
            .get(&ObjectRef::from_obj(svc))
            .is_some_and(|s| s.uid() == svc.uid())
    }

    /// Drops everything kept for a Service that left the cache: verdicts,
    /// abstain runs, shadow state, migration sets, warning latches, retry
    /// backoff, trigger memory, and its metric series (last, after the
    /// judge's: see [`crate::judge::Judge::forget`]). Idempotent.
    pub(crate) fn forget_service(&self, svc: &Service) {
        let ns = svc.namespace().unwrap_or_default();
        let uid = svc.uid().unwrap_or_default();
        self.judge.forget(&uid);
        if let Some(shadows) = &self.shadows {
            shadows.forget(&uid);
        }
        self.migration.forget(svc);
        self.selector_warned.lock().unwrap().remove(&uid);
        self.external_warned.lock().unwrap().remove(&uid);
        self.policy_warned.lock().unwrap().remove(&uid);
        let key = format!("{ns}/{}", svc.name_any());
        self.retries.succeeded(&key);
        self.asked.take(&key);
        self.trigger_memory.lock().unwrap().remove(&uid);
        self.metrics.forget_service(&ns, &svc.name_any());
    }

    /// Keeps what `svc`'s written plan saw for its next plan, if the
    /// Service still exists. Checked under the lock that its deletion takes
    /// to drop the entry, after the cache has dropped the Service: an entry
    /// kept by a reconcile that raced the deletion would never go.
    pub(crate) fn remember_triggers(&self, svc: &Service, memory: TriggerMemory) {
        let uid = svc.uid().unwrap_or_default();
        let mut all = self.trigger_memory.lock().unwrap();
        let current = self.services.get(&ObjectRef::from_obj(svc));
        if current.is_some_and(|s| s.uid().as_deref() == Some(uid.as_str())) {
            all.insert(uid, memory);
        }
    }

    pub(crate) fn zone_of(&self, node: &str) -> Option<String> {
        let nodes = self.nodes.as_ref()?;
        let meta = nodes.get(&ObjectRef::new(node))?;
        meta.labels().get("topology.kubernetes.io/zone").cloned()
    }
}
