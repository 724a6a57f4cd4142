//! Informer caches that can span several namespaces, and the group indexes
//! that map a pod group to its pods and Services without scanning.
//!
//! kube-runtime's `Store` swaps its whole content on every relist
//! (`InitDone`). That is right for one watch, but when several
//! namespace-scoped watches feed one store, a relist of namespace A would
//! erase namespace B. [`flatten_relists`] turns each watch's relist into the
//! plain `Apply`/`Delete` events a shared store needs, so any number of
//! namespace watches (or one cluster-wide watch) look the same downstream.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc, RwLock,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use backon::BackoffBuilder as _;

use futures::{Stream, StreamExt, stream};
use kube::{
    Resource,
    runtime::{reflector::ObjectRef, utils::Backoff, watcher},
};

/// How a watch waits between failed attempts: 250 ms doubling to 3 s, plus
/// up to as much again of jitter (so never more than 6 s), never giving up;
/// reset by the next event that arrives.
///
/// kube-runtime's `default_backoff()` grows to 30 s. After an apiserver
/// outage of a minute, a watch could then notice the apiserver's return up
/// to 30 s late, and every pod change of that half minute with it
/// (docs/reliability.md 1.1). Four watches retrying every few seconds cost
/// an apiserver nothing.
pub struct WatchBackoff {
    builder: backon::ExponentialBuilder,
    current: backon::ExponentialBackoff,
}

impl WatchBackoff {
    pub const FIRST: Duration = Duration::from_millis(250);
    pub const MAX: Duration = Duration::from_secs(3);
}

impl Default for WatchBackoff {
    fn default() -> Self {
        let builder = backon::ExponentialBuilder::default()
            .with_min_delay(Self::FIRST)
            .with_max_delay(Self::MAX)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times();
        Self {
            current: builder.build(),
            builder,
        }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        self.current.next()
    }
}

impl Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.current = self.builder.build();
    }
}

/// Counts watches that have not finished their first list yet. The
/// controller is ready (`/readyz`) once it reaches zero.
#[derive(Clone, Debug, Default)]
pub struct SyncGate(Arc<GateState>);

#[derive(Debug, Default)]
pub struct GateState {
    pending: AtomicUsize,
    /// Woken when `pending` reaches zero, so that the cold start's first
    /// reconciles begin at once rather than at the next poll.
    opened: tokio::sync::Notify,
}

impl SyncGate {
    /// Registers one more watch that must list before we are synced.
    pub fn register(&self) -> SyncToken {
        self.0.pending.fetch_add(1, Ordering::SeqCst);
        SyncToken {
            gate: self.clone(),
            done: false,
        }
    }
    pub fn synced(&self) -> bool {
        self.pending() == 0
    }
    /// Watches still listing for the first time.
    pub fn pending(&self) -> usize {
        self.0.pending.load(Ordering::SeqCst)
    }
    /// Returns once every registered watch has listed.
    pub async fn opened(&self) {
        loop {
            let notified = self.0.opened.notified();
            tokio::pin!(notified);
            // Registered before the check, so a completion in between is
            // not missed.
            notified.as_mut().enable();
            if self.synced() {
                return;
            }
            notified.await;
        }
    }
}

/// Held by one watch until its first list completed.
#[derive(Debug)]
pub struct SyncToken {
    gate: SyncGate,
    done: bool,
}

impl SyncToken {
    pub fn complete(&mut self) {
        if !self.done {
            self.done = true;
            if self.gate.0.pending.fetch_sub(1, Ordering::SeqCst) == 1 {
                self.gate.0.opened.notify_waiters();
            }
        }
    }
}

/// Rewrites relist phases (`Init`/`InitApply`/`InitDone`) of one watch into
/// `Apply` for every listed object and `Delete` for every object this watch
/// had delivered before but the relist no longer contains (it was deleted
/// while the watch was down, e.g. after a 410 Gone).
///
/// Objects that fail `keep` never reach the store: the caches hold only
/// what portwise manages, also when the apiserver cannot filter for it (an
/// annotation key). An object that stops passing `keep` (it lost its key)
/// becomes a `Delete` carrying its current state, so the store forgets it
/// and whoever reads the stream sees the transition; one that starts
/// passing becomes an `Apply`. Only kept objects are remembered here.
///
/// A synthetic `Delete` carries the uid of the object it stands for, since
/// per-object state is keyed by uid (a Service's verdicts, warnings,
/// migration state) and would otherwise outlive it. An object deleted and
/// re-created under the same name during the gap is listed with a new uid:
/// the old one gets its `Delete` before the new one's `Apply`.
pub fn flatten_relists<K, S, F>(
    watch: S,
    mut token: SyncToken,
    keep: F,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send
where
    K: Resource + Clone + Default + Send + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    F: Fn(&K) -> bool + Send + 'static,
{
    // Every object delivered so far, with its uid.
    let mut known: HashMap<ObjectRef<K>, Option<String>> = HashMap::new();
    let mut relist: Option<HashSet<ObjectRef<K>>> = None;
    watch.flat_map(move |event| {
        let out: Vec<Result<watcher::Event<K>, watcher::Error>> = match event {
            Err(e) => vec![Err(e)],
            Ok(watcher::Event::Init) => {
                relist = Some(HashSet::new());
                vec![]
            }
            Ok(watcher::Event::InitApply(obj)) if !keep(&obj) => {
                // Not listed as far as the store is concerned: if it was
                // kept before, the relist's end deletes it, but with its
                // current state rather than a stub.
                let r = ObjectRef::from_obj(&obj);
                match known.remove(&r) {
                    Some(_) => vec![Ok(watcher::Event::Delete(obj))],
                    None => vec![],
                }
            }
            Ok(watcher::Event::InitApply(obj)) => {
                let r = ObjectRef::from_obj(&obj);
                let mut out = Vec::with_capacity(2);
                if let Some(old) = known.insert(r.clone(), obj.meta().uid.clone())
                    && old != obj.meta().uid
                {
                    out.push(Ok(watcher::Event::Delete(stub(&r, old))));
                }
                relist.get_or_insert_with(HashSet::new).insert(r);
                out.push(Ok(watcher::Event::Apply(obj)));
                out
            }
            Ok(watcher::Event::InitDone) => {
                token.complete();
                let seen = relist.take().unwrap_or_default();
                let gone: Vec<(ObjectRef<K>, Option<String>)> = known
                    .iter()
                    .filter(|(r, _)| !seen.contains(*r))
                    .map(|(r, uid)| (r.clone(), uid.clone()))
                    .collect();
                for (r, _) in &gone {
                    known.remove(r);
                }
                gone.into_iter()
                    .map(|(r, uid)| Ok(watcher::Event::Delete(stub(&r, uid))))
                    .collect()
            }
            Ok(watcher::Event::Apply(obj)) if !keep(&obj) => {
                match known.remove(&ObjectRef::from_obj(&obj)) {
                    Some(_) => vec![Ok(watcher::Event::Delete(obj))],
                    None => vec![],
                }
            }
            Ok(watcher::Event::Apply(obj)) => {
                known.insert(ObjectRef::from_obj(&obj), obj.meta().uid.clone());
                vec![Ok(watcher::Event::Apply(obj))]
            }
            Ok(watcher::Event::Delete(obj)) => match known.remove(&ObjectRef::from_obj(&obj)) {
                Some(_) => vec![Ok(watcher::Event::Delete(obj))],
                // Never delivered (never kept): nothing to forget.
                None => vec![],
            },
        };
        stream::iter(out)
    })
}

/// An object that carries only name, namespace and uid: enough for a store
/// to forget it, and for per-uid state to be dropped with it.
fn stub<K: Resource + Default>(r: &ObjectRef<K>, uid: Option<String>) -> K {
    let mut obj = K::default();
    obj.meta_mut().name = Some(r.name.clone());
    obj.meta_mut().namespace = r.namespace.clone();
    obj.meta_mut().uid = uid;
    obj
}

/// (namespace, group value)
pub type GroupKey = (String, String);

/// Maps pod groups to object names in one namespace, for pods and for
/// Services. Finding a group's pods is a hash lookup, whether the key is a
/// label or an annotation (the apiserver cannot select on annotations).
#[derive(Debug, Default)]
pub struct GroupIndex {
    inner: RwLock<IndexInner>,
}

#[derive(Debug, Default)]
struct IndexInner {
    by_group: HashMap<GroupKey, HashSet<String>>,
    by_object: HashMap<(String, String), String>,
}

impl GroupIndex {
    /// Records that `ns/name` is now in `group` (or in none). Returns the
    /// group it was in before, if that differs, so both can be reconciled.
    pub fn set(&self, ns: &str, name: &str, group: Option<&str>) -> Option<String> {
        let mut inner = self.inner.write().expect("group index poisoned");
        let obj = (ns.to_string(), name.to_string());
        let previous = match group {
            Some(g) => inner.by_object.insert(obj, g.to_string()),
            None => inner.by_object.remove(&obj),
        };
        if previous.as_deref() == group {
            return None;
        }
        if let Some(prev) = &previous {
            let key = (ns.to_string(), prev.clone());
            if let Some(set) = inner.by_group.get_mut(&key) {
                set.remove(name);
                if set.is_empty() {
                    inner.by_group.remove(&key);
                }
            }
        }
        if let Some(g) = group {
            inner
                .by_group
                .entry((ns.to_string(), g.to_string()))
                .or_default()
                .insert(name.to_string());
        }
        previous
    }

    /// Names of the objects in `ns` whose group is `group`.
    pub fn members(&self, ns: &str, group: &str) -> Vec<String> {
        let inner = self.inner.read().expect("group index poisoned");
        let mut names: Vec<String> = inner
            .by_group
            .get(&(ns.to_string(), group.to_string()))
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default();
        names.sort();
        names
    }

    /// The group `ns/name` is in.
    pub fn group_of(&self, ns: &str, name: &str) -> Option<String> {
        let inner = self.inner.read().expect("group index poisoned");
        inner
            .by_object
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
    }
}

/// Strips what the caches never read, to keep memory flat at scale.
pub fn strip_managed_fields<K: Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

/// Keeps only `manager`'s managedFields entries.
pub fn keep_managed_fields_of<K: Resource>(obj: &mut K, manager: &str) {
    if let Some(fields) = obj.meta_mut().managed_fields.as_mut() {
        fields.retain(|f| f.manager.as_deref() == Some(manager));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::executor::block_on;
    use k8s_openapi::api::core::v1::Pod;
    use kube::ResourceExt;

    #[test]
    fn watch_backoff_stays_within_seconds_and_resets() {
        let mut b = WatchBackoff::default();
        let delays: Vec<Duration> = (&mut b).take(50).collect();
        assert_eq!(delays.len(), 50, "the watch backoff gave up");
        for d in &delays {
            assert!(
                *d >= WatchBackoff::FIRST && *d <= 2 * WatchBackoff::MAX,
                "delay {d:?} outside [{:?}, {:?}]",
                WatchBackoff::FIRST,
                2 * WatchBackoff::MAX
            );
        }
        // It does grow: by the tenth failure it is at its cap.
        assert!(delays[9] >= WatchBackoff::MAX, "{:?}", delays[9]);
        b.reset();
        let first = b.next().unwrap();
        assert!(
            first < 2 * WatchBackoff::FIRST + Duration::from_millis(1),
            "{first:?}"
        );
    }

    fn pod(name: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.metadata.namespace = Some("ns".into());
        p.metadata.uid = Some(format!("uid-{name}"));
        p
    }

    #[test]
    fn relist_becomes_applies_and_deletes_of_vanished_objects() {
        let gate = SyncGate::default();
        let events = vec![
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(pod("a"))),
            Ok(watcher::Event::InitApply(pod("b"))),
            Ok(watcher::Event::InitDone),
            Ok(watcher::Event::Apply(pod("c"))),
            // The watch broke; meanwhile b was deleted.
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(pod("a"))),
            Ok(watcher::Event::InitApply(pod("c"))),
            Ok(watcher::Event::InitDone),
        ];
        let token = gate.register();
        assert!(!gate.synced());
        let out: Vec<_> =
            block_on(flatten_relists(stream::iter(events), token, |_: &Pod| true).collect());
        let summary: Vec<String> = out
            .into_iter()
            .map(|e| match e.unwrap() {
                watcher::Event::Apply(p) => format!("+{}", p.name_any()),
                watcher::Event::Delete(p) => format!("-{}", p.name_any()),
                _ => "?".into(),
            })
            .collect();
        assert_eq!(summary, ["+a", "+b", "+c", "+a", "+c", "-b"]);
        assert!(gate.synced());
    }

    #[tokio::test]
    async fn the_gate_opens_when_the_last_watch_has_listed_and_not_before() {
        let gate = SyncGate::default();
        let (mut a, mut b) = (gate.register(), gate.register());
        let waiter = tokio::spawn({
            let gate = gate.clone();
            async move { gate.opened().await }
        });
        a.complete();
        // Completing twice counts once.
        a.complete();
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "opened with a watch still listing");
        assert_eq!(gate.pending(), 1);
        b.complete();
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("the gate did not open")
            .unwrap();
        // Already open: returns at once.
        tokio::time::timeout(std::time::Duration::from_secs(1), gate.opened())
            .await
            .expect("an open gate waits");
    }

    /// Per-uid state (a Service's verdicts, warnings) is dropped on the
    /// uid a delete carries, so a relist's deletes must carry it: for an
    /// object gone during the gap, and for one re-created under its name.
    #[test]
    fn relist_deletes_carry_the_uid_of_what_vanished() {
        let gate = SyncGate::default();
        let mut recreated = pod("b");
        recreated.metadata.uid = Some("uid-b-2".into());
        let events = vec![
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(pod("a"))),
            Ok(watcher::Event::InitApply(pod("b"))),
            Ok(watcher::Event::InitDone),
            // The watch broke; meanwhile a was deleted, and b deleted and
            // created again.
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(recreated)),
            Ok(watcher::Event::InitDone),
        ];
        let out: Vec<_> = block_on(
            flatten_relists(stream::iter(events), gate.register(), |_: &Pod| true).collect(),
        );
        let summary: Vec<String> = out
            .into_iter()
            .map(|e| match e.unwrap() {
                watcher::Event::Apply(p) => format!("+{} {}", p.name_any(), p.uid().unwrap()),
                watcher::Event::Delete(p) => format!("-{} {}", p.name_any(), p.uid().unwrap()),
                _ => "?".into(),
            })
            .collect();
        assert_eq!(
            summary,
            ["+a uid-a", "+b uid-b", "-b uid-b", "+b uid-b-2", "-a uid-a"]
        );
    }

    /// Objects without the key never pass; one that loses it is deleted
    /// with its current state, one that gains it is applied; a relist
    /// drops one that lost it meanwhile.
    #[test]
    fn unkept_objects_never_pass_and_losing_the_key_deletes() {
        let gate = SyncGate::default();
        let keyed = |name: &str| {
            let mut p = pod(name);
            p.metadata.annotations = Some([("k".to_string(), "g".to_string())].into());
            p
        };
        let events = vec![
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(keyed("a"))),
            Ok(watcher::Event::InitApply(pod("b"))),
            Ok(watcher::Event::InitApply(keyed("c"))),
            Ok(watcher::Event::InitDone),
            // b is updated, still without the key; then gains it.
            Ok(watcher::Event::Apply(pod("b"))),
            Ok(watcher::Event::Apply(keyed("b"))),
            // a loses the key; an unkept pod is deleted.
            Ok(watcher::Event::Apply(pod("a"))),
            Ok(watcher::Event::Delete(pod("z"))),
            // The watch broke; meanwhile c lost its key.
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(keyed("b"))),
            Ok(watcher::Event::InitApply(pod("c"))),
            Ok(watcher::Event::InitDone),
        ];
        let keep = |p: &Pod| p.annotations().contains_key("k");
        let out: Vec<_> =
            block_on(flatten_relists(stream::iter(events), gate.register(), keep).collect());
        let summary: Vec<String> = out
            .into_iter()
            .map(|e| match e.unwrap() {
                watcher::Event::Apply(p) => format!("+{}", p.name_any()),
                watcher::Event::Delete(p) => {
                    // A lost key is reported with the object's state.
                    assert!(!p.annotations().contains_key("k"));
                    format!("-{}", p.name_any())
                }
                _ => "?".into(),
            })
            .collect();
        assert_eq!(summary, ["+a", "+c", "+b", "-a", "+b", "-c"]);
        assert!(gate.synced());
    }

    #[test]
    fn group_index_tracks_moves_between_groups() {
        let idx = GroupIndex::default();
        assert_eq!(idx.set("ns", "a", Some("g1")), None);
        idx.set("ns", "b", Some("g1"));
        idx.set("other", "a", Some("g1"));
        assert_eq!(idx.members("ns", "g1"), ["a", "b"]);
        assert_eq!(idx.set("ns", "a", Some("g2")), Some("g1".into()));
        assert_eq!(idx.members("ns", "g1"), ["b"]);
        assert_eq!(idx.members("ns", "g2"), ["a"]);
        assert_eq!(idx.set("ns", "a", Some("g2")), None, "no move, no report");
        assert_eq!(idx.set("ns", "b", None), Some("g1".into()));
        assert!(idx.members("ns", "g1").is_empty());
        assert_eq!(idx.group_of("other", "a").as_deref(), Some("g1"));
    }
}
