//! The keyed watches: Services and pods, each indexed by group. A
//! Service's own change asks for it and a pod's change asks for its
//! group's Services; a Service's deletion is reported so its row and
//! series are dropped, and one that lost its key is released. Each returns
//! its store and the stream that fills it, like the watches of
//! `informers.rs`.

use super::*;

/// The Service watch: its index, what it reports, and its stream.
pub(super) struct Services {
    /// Service names by group, for a pod change to find its Services.
    pub(super) groups: Arc<GroupIndex>,
    /// Services deleted or dropped from the cache, to be forgotten
    /// ([`Context::forget_service`]).
    pub(super) gone: UnboundedReceiver<Arc<Service>>,
    /// With pods watched per namespace: the namespaces that hold keyed
    /// Services, and the Service watch's own gate (it opens once every
    /// namespace it holds has been reported).
    pub(super) seen: Option<(UnboundedReceiver<ServiceSeen>, SyncGate)>,
    pub(super) stream: BoxFuture<'static, ()>,
}

/// The pod watch: its store, which namespaces it holds in full, and its
/// stream.
pub(super) struct Pods {
    pub(super) store: Store<Pod>,
    pub(super) groups: Arc<GroupIndex>,
    pub(super) listed: ListedPods,
    pub(super) stream: BoxFuture<'static, ()>,
}

/// How pods are watched: sharded, or with every namespace watched and an
/// annotation key, one watch per namespace that holds a keyed Service
/// ([`crate::pod_scopes`]; sharded, of this replica's buckets only);
/// otherwise one watch of keyed pods (per listed namespace).
pub(super) fn per_namespace_pods(config: &Config, namespaces: &[String], sharded: bool) -> bool {
    sharded || (namespaces.is_empty() && matches!(config.pod_key(), KeySource::Annotation(_)))
}

impl Watches<'_> {
    /// Keyed Services, into `writer` (whose reader is `self.services`).
    pub(super) fn services(
        &self,
        writer: reflector::store::Writer<Service>,
        key: &KeySource,
        per_namespace_pods: bool,
        release_tx: UnboundedSender<Gone>,
    ) -> Services {
        let groups = Arc::new(GroupIndex::default());
        let (gone_tx, gone) = unbounded_channel::<Arc<Service>>();
        let (seen_tx, seen_rx) = unbounded_channel::<ServiceSeen>();
        let seen_tx = per_namespace_pods.then_some(seen_tx);
        let gate = if per_namespace_pods {
            SyncGate::default()
        } else {
            self.gate.clone()
        };
        let tx = self.triggers.clone();
        let (index, key) = (groups.clone(), key.clone());
        let stream = watch_keyed(self.client, self.namespaces, self.cfg, &key, &gate)
            .reflect(writer)
            .for_each(move |ev| {
                match ev {
                    Ok(watcher::Event::Apply(svc)) | Ok(watcher::Event::InitApply(svc)) => {
                        let (ns, name) = (svc.namespace().unwrap_or_default(), svc.name_any());
                        index.set(&ns, &name, key_value(&svc.metadata, &key));
                        if let Some(seen) = &seen_tx {
                            let _ = seen.send(ServiceSeen::Present {
                                ns,
                                name: name.clone(),
                            });
                        }
                        // Like every other ask, heard only once the caches
                        // have synced (`Triggers`).
                        tx.ask(ObjectRef::from_obj(&svc));
                    }
                    Ok(watcher::Event::Delete(svc)) => {
                        let (ns, name) = (svc.namespace().unwrap_or_default(), svc.name_any());
                        index.set(&ns, &name, None);
                        if let Some(seen) = &seen_tx {
                            let _ = seen.send(ServiceSeen::Gone { ns, name });
                        }
                        let svc = Arc::new(svc);
                        let _ = gone_tx.send(svc.clone());
                        // Deleted, or dropped from the cache for losing its
                        // key: only the latter needs its slices released.
                        let lost = svc.metadata.resource_version.is_some()
                            && key_value(&svc.metadata, &key).is_none();
                        let _ = release_tx.send(if lost {
                            Gone::Lost(svc)
                        } else {
                            Gone::Check(ObjectRef::from_obj(svc.as_ref()))
                        });
                    }
                    Ok(_) => {}
                    Err(e) => warn!(error = %e, "service watch"),
                }
                future::ready(())
            })
            .boxed();
        Services {
            groups,
            gone,
            seen: per_namespace_pods.then_some((seen_rx, gate)),
            stream,
        }
    }

    /// Keyed pods; a change asks for the Services of its group, before and
    /// after. `seen` is [`Services::seen`].
    pub(super) fn pods(
        &self,
        key: &KeySource,
        seen: Option<(UnboundedReceiver<ServiceSeen>, SyncGate)>,
        interest: Option<Interest>,
        limit: usize,
        services: &Services,
        table: Arc<ServiceTable>,
    ) -> Pods {
        let (store, writer) = reflector::store::<Pod>();
        let (events, listed) = match seen {
            Some((seen_rx, services_listed)) => PodScopes {
                client: self.client.clone(),
                cfg: self.cfg.clone(),
                key: key.clone(),
                interest,
                services_listed,
                gate: self.gate.clone(),
                pods: store.clone(),
                limit,
                on_listed: Box::new({
                    let (tx, services) = (self.triggers.clone(), self.services.clone());
                    move |ns: &str| {
                        for svc in services.state() {
                            if svc.namespace().as_deref() == Some(ns) {
                                tx.ask(ObjectRef::from_obj(svc.as_ref()));
                            }
                        }
                    }
                }),
            }
            .stream(seen_rx),
            None => (
                watch_keyed(self.client, self.namespaces, self.cfg, key, self.gate),
                ListedPods::with_the_caches(),
            ),
        };
        let groups = Arc::new(GroupIndex::default());
        let (pod_groups, svc_groups) = (groups.clone(), services.groups.clone());
        let (tx, key) = (self.triggers.clone(), key.clone());
        let stream = events
            .reflect(writer)
            .for_each(move |ev| {
                match ev {
                    Ok(ev) => on_pod_event(&ev, &key, &pod_groups, &svc_groups, &tx, &table),
                    Err(e) => warn!(error = %e, "pod watch"),
                }
                future::ready(())
            })
            .boxed();
        Pods {
            store,
            groups,
            listed,
            stream,
        }
    }
}
