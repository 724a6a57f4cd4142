//! Where events ask for reconciles: the sync gate before the queue, and
//! our own writes' echoes left out.

use super::*;

/// Where events ask for reconciles.
///
/// Until every cache has listed, an ask is dropped: a reconcile then finds
/// the caches incomplete and does nothing, and worse, one that passes its
/// sync check just after the gate opens runs beside the cold start's
/// trigger of every Service, so that Service is reconciled twice. The
/// gate's opening triggers every Service the cache holds, once; what
/// changed before then is in the caches it reads.
#[derive(Clone)]
pub(super) struct Triggers {
    pub(super) queue: Queue<ObjectRef<Service>>,
    pub(super) gate: SyncGate,
}

impl Triggers {
    /// Whether an ask would be heard now.
    pub(super) fn open(&self) -> bool {
        self.gate.synced()
    }

    /// Asks for `svc` to be reconciled, unless the caches are still listing.
    pub(super) fn ask(&self, svc: ObjectRef<Service>) {
        if self.open() {
            self.queue.add(svc);
        }
    }

    /// Asks for every Service in `services`.
    pub(super) fn ask_all(&self, services: &Store<Service>) {
        for svc in services.state() {
            self.ask(ObjectRef::from_obj(svc.as_ref()));
        }
    }
}

/// Triggers `svc` for a slice event unless `ours` says the event is our
/// own write coming back. An event that overtook its write's response
/// waits for it off the watch task ([`Echoes::settled`]), so the watch is
/// never held up.
pub(super) fn trigger_unless_echo(
    echoes: &Arc<Echoes>,
    tx: &Triggers,
    slice: EndpointSlice,
    svc: ObjectRef<Service>,
    ours: fn(&Echoes, &EndpointSlice) -> bool,
) {
    let judge = move |echoes: &Echoes, slice: &EndpointSlice, tx: &Triggers, waited| {
        let echo = ours(echoes, slice);
        debug!(slice = %slice.name_any(), resource_version = ?slice.resource_version(),
            echo, waited, "slice event");
        if !echo {
            tx.ask(svc);
        }
    };
    if !echoes.in_flight(&slice) {
        return judge(echoes, &slice, tx, false);
    }
    let (echoes, tx) = (echoes.clone(), tx.clone());
    tokio::spawn(async move {
        echoes.settled(&slice).await;
        judge(&echoes, &slice, &tx, true);
    });
}

pub(super) fn on_pod_event(
    ev: &watcher::Event<Pod>,
    key: &KeySource,
    pod_groups: &GroupIndex,
    svc_groups: &GroupIndex,
    tx: &Triggers,
    table: &crate::table::ServiceTable,
) {
    let (pod, group) = match ev {
        watcher::Event::Apply(p) | watcher::Event::InitApply(p) => (p, key_value(&p.metadata, key)),
        watcher::Event::Delete(p) => (p, None),
        _ => return,
    };
    let ns = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let before = pod_groups.group_of(&ns, &name);
    pod_groups.set(&ns, &name, group);
    let mut groups: Vec<String> = before.into_iter().collect();
    groups.extend(group.map(str::to_string));
    groups.dedup();
    if !tx.open() {
        return;
    }
    for g in groups {
        for svc in svc_groups.members(&ns, &g) {
            debug!(namespace = %ns, pod = %name, service = %svc, "pod event asks for its Service");
            let key = ObjectRef::new(&svc).within(&ns);
            table.mark_asked(&key);
            tx.ask(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Asks before the caches sync are dropped (the gate's opening asks
    /// for every Service instead); once open, every ask is heard.
    #[tokio::test]
    async fn asks_before_the_caches_sync_are_dropped_and_heard_after() {
        let gate = SyncGate::default();
        let mut listing = gate.register();
        let queue = Queue::new();
        let triggers = Triggers {
            queue: queue.clone(),
            gate: gate.clone(),
        };
        let web = ObjectRef::<Service>::new("web").within("ns");
        triggers.ask(web.clone());
        assert!(!triggers.open());
        let now = || async {
            tokio::time::timeout(Duration::from_millis(50), queue.next())
                .await
                .ok()
                .flatten()
                .map(|t| t.key)
        };
        assert_eq!(now().await, None, "an ask before sync was heard");
        listing.complete();
        assert!(triggers.open());
        triggers.ask(web.clone());
        assert_eq!(now().await, Some(web));
    }
}
