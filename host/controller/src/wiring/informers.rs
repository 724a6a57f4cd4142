//! The watches that feed our own objects' caches: our slices (an event
//! asks for its Service unless it is our own write coming back), our legacy
//! Endpoints, and node metadata (zones; a node that comes or goes asks for
//! every Service). Each returns its store and the stream that fills it.

use super::*;

/// What every watch here shares.
pub(super) struct Watches<'a> {
    pub(super) client: &'a Client,
    pub(super) namespaces: &'a [String],
    pub(super) cfg: &'a watcher::Config,
    pub(super) gate: &'a SyncGate,
    pub(super) triggers: &'a Triggers,
    pub(super) services: &'a Store<Service>,
    pub(super) managed_by: &'a str,
}

impl Watches<'_> {
    /// Our slices only (selected by our managed-by label). Another
    /// manager's slice under a name we want is found when the apiserver
    /// refuses the write (`crate::foreign`); native slices to clean up, by
    /// a label-selected LIST (`migrate`).
    pub(super) fn slices(
        &self,
        owners: Arc<GroupIndex>,
        echoes: Arc<Echoes>,
        release_tx: tokio::sync::mpsc::UnboundedSender<Gone>,
    ) -> (Store<EndpointSlice>, BoxFuture<'static, ()>) {
        let (reader, writer) = reflector::store::<EndpointSlice>();
        let tx = self.triggers.clone();
        let keep = self.managed_by.to_string();
        let services = self.services.clone();
        let gate = self.gate.clone();
        let ours = self
            .cfg
            .clone()
            .labels(&format!("{MANAGED_BY_LABEL}={}", self.managed_by));
        let stream =
            watch_all::<EndpointSlice>(self.client, self.namespaces, ours, self.gate, |_| true)
                // Our own managedFields entry tells the planner which labels we
                // applied before, so one the Service dropped is removed too.
                .modify(move |s: &mut EndpointSlice| cache::keep_managed_fields_of(s, &keep))
                .reflect(writer)
                .for_each(move |ev| {
                    match ev {
                        Ok(watcher::Event::Apply(s)) => {
                            let ns = s.namespace().unwrap_or_default();
                            let svc = slice_service(&s);
                            owners.set(&ns, &s.name_any(), svc.as_deref());
                            if let Some(svc) = svc {
                                let r = ObjectRef::new(&svc).within(&ns);
                                // A slice of ours for a Service the cache does
                                // not hold: it may have lost its key.
                                if gate.synced() && services.get(&r).is_none() {
                                    let _ = release_tx.send(Gone::Check(r.clone()));
                                }
                                // Our own write coming back: nothing new to
                                // reconcile (crate::echo).
                                trigger_unless_echo(&echoes, &tx, s, r, Echoes::is_our_apply);
                            }
                        }
                        Ok(watcher::Event::Delete(s)) => {
                            let ns = s.namespace().unwrap_or_default();
                            if let Some(prev) = owners.set(&ns, &s.name_any(), None) {
                                let r = ObjectRef::new(&prev).within(&ns);
                                trigger_unless_echo(&echoes, &tx, s, r, Echoes::is_our_delete);
                            }
                        }
                        Ok(_) => {}
                        Err(e) => warn!(error = %e, "endpointslice watch"),
                    }
                    future::ready(())
                })
                .boxed();
        (reader, stream)
    }

    /// Our own legacy Endpoints only (label-selected: the cluster's others
    /// are never cached), so that one written while `publishLegacyEndpoints`
    /// was on, possibly by an earlier process, is removed once it is off or
    /// the Service leaves, without a GET per reconcile.
    pub(super) fn our_endpoints(&self) -> (Store<Endpoints>, BoxFuture<'static, ()>) {
        let (reader, writer) = reflector::store::<Endpoints>();
        let tx = self.triggers.clone();
        let selector = format!("{ENDPOINTS_MANAGED_BY_LABEL}={}", self.managed_by);
        let stream = watch_all::<Endpoints>(
            self.client,
            self.namespaces,
            self.cfg.clone().labels(&selector),
            self.gate,
            |_: &Endpoints| true,
        )
        .modify(cache::strip_managed_fields)
        .reflect(writer)
        .for_each(move |ev| {
            match ev {
                Ok(watcher::Event::Apply(ep)) | Ok(watcher::Event::InitApply(ep)) => {
                    let ns = ep.namespace().unwrap_or_default();
                    tx.ask(ObjectRef::new(&ep.name_any()).within(&ns));
                }
                Ok(_) => {}
                Err(e) => warn!(error = %e, "endpoints watch"),
            }
            future::ready(())
        })
        .boxed();
        (reader, stream)
    }

    /// Node metadata: zones only. Optional for correctness, so it counts as
    /// synced after its first list.
    pub(super) fn nodes(&self) -> (Store<PartialObjectMeta<Node>>, BoxFuture<'static, ()>) {
        let (reader, writer) = reflector::store::<PartialObjectMeta<Node>>();
        let mut token = Some(self.gate.register());
        // A Node that appears or goes changes which pods are candidates
        // (`align::on_known_node`): re-check every Service then. Node
        // updates (heartbeats) change nothing here and trigger nothing.
        let mut known: std::collections::HashSet<String> = Default::default();
        let tx = self.triggers.clone();
        let services = self.services.clone();
        let stream = crate::watches::streaming_or_listing(
            Api::<PartialObjectMeta<Node>>::all(self.client.clone()),
            self.cfg.clone(),
        )
        .backoff(WatchBackoff::default())
        .modify(cache::strip_managed_fields)
        .reflect(writer)
        .for_each(move |ev| {
            // (Dropping a SyncToken does not complete it: it must be
            // completed explicitly.)
            let changed = match &ev {
                Ok(watcher::Event::InitApply(n)) => {
                    known.insert(n.name_any());
                    false
                }
                Ok(watcher::Event::Apply(n)) => known.insert(n.name_any()),
                Ok(watcher::Event::Delete(n)) => known.remove(&n.name_any()),
                _ => false,
            };
            if changed && token.is_none() {
                tx.ask_all(&services);
            }
            if let Ok(watcher::Event::InitDone) = ev
                && let Some(mut token) = token.take()
            {
                token.complete();
            }
            future::ready(())
        })
        .boxed();
        (reader, stream)
    }
}
