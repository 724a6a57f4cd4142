//! What a reconcile reads: the caches and indexes, the checkers, the
//! writers and the per-Service memory, and the reads over them.

use std::sync::Arc;

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
use tokio::sync::watch;

use crate::{
    apply::SliceWriter,
    cache::{GroupIndex, SyncGate},
    events::Events,
    judge::Judge,
    metrics::Metrics,
    migrate,
    shadow::Shadows,
    table::ServiceTable,
    tenure::Leadership,
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
    /// Where this replica may write ([`Leadership`]).
    pub(crate) leader: Leadership,
    /// Everything kept per Service, one row each.
    pub(crate) table: Arc<ServiceTable>,
    pub(crate) migration: migrate::Migrator,
    /// Every watch has listed once: the caches are complete.
    pub(crate) synced: SyncGate,
    /// Which namespaces' pods are in the cache in full, where pods are
    /// watched per namespace ([`crate::pod_scopes`]).
    pub(crate) pods_listed: crate::pod_scopes::ListedPods,
    /// Where every reconcile is asked for ([`crate::queue`]).
    pub(crate) queue: crate::queue::Queue<ObjectRef<Service>>,
    /// The policy objects read (empty without `membershipPolicies`).
    pub(crate) book: Arc<crate::policies::Book>,
    /// Set once the controller stops ([`Stopping`]).
    pub(crate) stopping: Stopping,
}

/// Set when the controller begins to stop. A reconcile still judging gives
/// up, writing nothing, so that a stop waits for the writes in flight and
/// not for probes that may hang until their timeout: behind hanging probes
/// a stop took longer than a pod's 30 s grace period, and the Lease
/// expired instead of being released.
#[derive(Clone, Debug)]
pub(crate) struct Stopping(watch::Receiver<bool>);

impl Stopping {
    /// The flag and the sender that sets it.
    pub(crate) fn new() -> (watch::Sender<bool>, Self) {
        let (tx, rx) = watch::channel(false);
        (tx, Self(rx))
    }

    /// Resolves once the controller stops (or its sender is gone, which
    /// only a stopped controller drops).
    pub(crate) async fn wait(&self) {
        let mut rx = self.0.clone();
        let _ = rx.wait_for(|stopping| *stopping).await;
    }
}

impl Context {
    /// Within this replica's term for `ns` (by the clock, see
    /// [`crate::Tenure`]): the leader's, or sharded, that of `ns`'s bucket.
    pub(crate) fn leads(&self, ns: &str) -> bool {
        self.leader.leads(ns)
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

    /// Drops everything kept for a Service that left the cache: its row
    /// (verdicts, abstain runs, shadow state, cleanup's findings, warning
    /// latches, retry backoff, trigger memory), what the start-up LISTs
    /// said of it, and its metric series (last, after the row: see
    /// [`crate::judge::Judge::judge`]). Idempotent.
    pub(crate) fn forget_service(&self, svc: &Service) {
        self.migration.forget(svc);
        self.table.forget(svc);
        self.metrics
            .forget_service(&svc.namespace().unwrap_or_default(), &svc.name_any());
    }

    /// Keeps what `svc`'s written plan saw for its next plan, unless the
    /// Service was forgotten meanwhile (the entry would never go).
    pub(crate) fn remember_triggers(&self, svc: &Service, memory: TriggerMemory) {
        self.table.update_existing(svc, |row| row.triggers = memory);
    }

    pub(crate) fn zone_of(&self, node: &str) -> Option<String> {
        let nodes = self.nodes.as_ref()?;
        let meta = nodes.get(&ObjectRef::new(node))?;
        meta.labels().get("topology.kubernetes.io/zone").cloned()
    }
}
