//! Writes a plan: creates and updates of the slices that differ, deletes of
//! the ones no longer wanted.
//!
//! The planner only hands over slices whose live state differs from the
//! desired one, so a steady state reaches this module with nothing to do.
//! Writes use `managedBy` as field manager. They are plain creates and
//! updates, as the native controller makes them, not server-side applies:
//! the apiserver spent 1.5–2.9× the CPU on an apply as on an update of the
//! same slice (measured on slices of 10 and 1000 endpoints), which a cold
//! start's write wave and every pod flip wait for.
//! Slices held by other managers never get here (the planner reports them
//! as collisions), but the planner's view is a cache, so every write is
//! guarded against what it cannot see:
//! - A name our view does not hold is created (POST): if another writer
//!   created it after our snapshot, the apiserver refuses (409) rather than
//!   hand it to us. The writer then fetches the holder ([`crate::foreign`])
//!   and the next reconcile reports the collision.
//! - A slice our view holds is updated (PUT) from our view of it
//!   ([`portwise_core::plan::replace`]: other writers' labels, annotations
//!   and owners kept), with our view's resourceVersion as the
//!   precondition. If the object changed since (a manual edit whose event
//!   has not come, say), the apiserver refuses (409) and the write falls
//!   back to a server-side apply with `force` (which is what repairs a
//!   manual edit made by another field manager) and with the uid we saw as
//!   a precondition: if the slice was deleted and re-created by another
//!   writer since, the apiserver refuses that too ("uid mismatch") instead
//!   of letting us take the new object over.
//! - Deletes carry the uid our view holds as a precondition, so a
//!   re-created object is never deleted by mistake; no GET is needed.
//!
//! Failures are contained per slice set. The planner moves endpoints
//! between slices of one (Service port, address family), which is what
//! consumers merge, or, when a pod's set of ports changes, between the
//! slices of one port and those of several; so a failed apply holds back
//! the remaining applies and deletes of its own (port, family), and a
//! failed slice of several ports holds back its whole family: writing them
//! could drop endpoints whose new slice was just refused. Writes of other (port, family) pairs go
//! ahead, so one refused slice (a 422, say) leaves only its own set stale.
//! The planner puts the slices that gain endpoints first, so the writes made
//! before a refusal never drop an endpoint either.
//! The target port is not part of the key: a targetPort change rewrites the
//! slices of a (port, family) in place, from one target to the other.
//!
//! Reads after our own writes: the informer cache lags a write by one watch
//! event. A reconcile that starts in between would see the old slice and
//! write again, so the writer remembers what it wrote until the cache has
//! caught up (see [`SliceWriter::overlay`]). resourceVersions are opaque by
//! the API's contract, so "caught up" is decided the way the native
//! controller's EndpointSliceTracker decides it: by uid, and by
//! `metadata.generation`, which the apiserver increments on every change to
//! a slice's endpoints, ports or labels.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions},
};
use portwise_core::plan::replace::replacement;
use tracing::{debug, info};

use crate::{
    echo::Echoes,
    metrics::{Metrics, SliceChange, WriteKind},
};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("apply EndpointSlice {name}: {source}")]
    Apply {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("delete EndpointSlice {name}: {source}")]
    Delete {
        name: String,
        #[source]
        source: kube::Error,
    },
    /// Several writes failed, or a failed apply held back other writes of
    /// its slice set. Names every failed and every held-back slice.
    #[error("{}", describe(.failed, .held_back))]
    Several {
        /// Each an [`Error::Apply`] or [`Error::Delete`], in write order.
        failed: Vec<Error>,
        /// Slices left unwritten (neither applied nor deleted) because an
        /// apply of their set failed.
        held_back: Vec<String>,
    },
}

fn describe(failed: &[Error], held_back: &[String]) -> String {
    let errors: Vec<String> = failed.iter().map(ToString::to_string).collect();
    let mut s = format!(
        "{} EndpointSlice write{} failed: {}",
        failed.len(),
        if failed.len() == 1 { "" } else { "s" },
        errors.join("; ")
    );
    if !held_back.is_empty() {
        s.push_str(&format!(
            "; held back behind them (same Service port and address type): {}",
            held_back.join(", ")
        ));
    }
    s
}

impl Error {
    /// The outcome of a plan's writes.
    fn of(mut failed: Vec<Error>, held_back: Vec<String>) -> Result<(), Error> {
        match (failed.len(), held_back.is_empty()) {
            (0, _) => Ok(()),
            (1, true) => Err(failed.remove(0)),
            _ => Err(Error::Several { failed, held_back }),
        }
    }
}

/// The slice set a slice belongs to, for containing failures: (address
/// type, Service port name), as the planner groups slices; no port name for
/// a slice of several ports (or none), which stands for its whole family:
/// its endpoints may move to or from any set of the family. Endpoints never
/// move between families, so a failure never holds back another family.
type SetKey = (String, Option<String>);

fn set_of(slice: &EndpointSlice) -> SetKey {
    let port = match slice.ports.as_deref() {
        Some([p]) => Some(p.name.clone().unwrap_or_default()),
        _ => None,
    };
    (slice.address_type.clone(), port)
}

/// The sets that had an apply fail; their remaining writes are held back.
#[derive(Debug, Default)]
struct Held {
    sets: HashSet<SetKey>,
}

impl Held {
    /// Whether writes of `set` wait: a failure in the same set, or in its
    /// family's whole-family set, or (for a whole-family set) in any set
    /// of the family.
    fn holds(&self, (family, port): &SetKey) -> bool {
        self.sets
            .iter()
            .any(|(f, p)| f == family && (p.is_none() || port.is_none() || p == port))
    }

    fn fail(&mut self, set: SetKey) {
        self.sets.insert(set);
    }
}

/// The calls a plan's writes need: the apiserver, or a fake in tests.
trait SliceApi {
    /// The field manager the writes are made as.
    fn manager(&self) -> &str;
    /// Creates the slice; 409 if its name is taken.
    async fn create(&self, slice: &EndpointSlice) -> kube::Result<EndpointSlice>;
    /// Replaces the slice; 409 unless its `metadata.resourceVersion` (and
    /// uid) are the live object's.
    async fn replace(&self, slice: &EndpointSlice) -> kube::Result<EndpointSlice>;
    /// Server-side apply of the whole slice (its `metadata.uid`, when set,
    /// is a precondition); the object as written. Without `force`, fields
    /// another manager owns make it fail with 409.
    async fn apply(&self, slice: &EndpointSlice, force: bool) -> kube::Result<EndpointSlice>;
    /// Deletes `name` if its uid is still `uid`.
    async fn delete(&self, name: &str, uid: Option<String>) -> kube::Result<()>;
}

struct Server {
    api: Api<EndpointSlice>,
    manager: String,
}

impl Server {
    fn post_params(&self) -> PostParams {
        PostParams {
            field_manager: Some(self.manager.clone()),
            ..PostParams::default()
        }
    }
}

impl SliceApi for Server {
    fn manager(&self) -> &str {
        &self.manager
    }

    async fn create(&self, slice: &EndpointSlice) -> kube::Result<EndpointSlice> {
        self.api.create(&self.post_params(), slice).await
    }

    async fn replace(&self, slice: &EndpointSlice) -> kube::Result<EndpointSlice> {
        self.api
            .replace(&slice.name_any(), &self.post_params(), slice)
            .await
    }

    async fn apply(&self, slice: &EndpointSlice, force: bool) -> kube::Result<EndpointSlice> {
        let mut params = PatchParams::apply(&self.manager);
        params.force = force;
        self.api
            .patch(&slice.name_any(), &params, &Patch::Apply(slice))
            .await
    }

    async fn delete(&self, name: &str, uid: Option<String>) -> kube::Result<()> {
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid,
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        self.api.delete(name, &dp).await.map(|_| ())
    }
}

/// What we last wrote to a slice: the object the API returned, or `None`
/// for a delete of the object with `uid`.
#[derive(Clone, Debug)]
struct Written {
    slice: Option<Arc<EndpointSlice>>,
    uid: Option<String>,
    at: Instant,
}

/// How long a write is overlaid at most. The watch delivers a write within
/// moments; this bounds what a watch gap could leave behind (our object
/// created and deleted by someone else while the watch was down, so the
/// cache never shows it), after which the cache is trusted again.
const OVERLAY_FOR: Duration = Duration::from_secs(60);

/// Our writes the cache may not show yet, by (namespace, name).
#[derive(Debug, Default)]
struct Recent(Mutex<HashMap<(String, String), Written>>);

pub struct SliceWriter {
    client: Client,
    manager: String,
    recent: Recent,
    /// Our last write per name, so its watch event is not reconciled again.
    echoes: Arc<Echoes>,
    /// Names refused because another manager holds them ([`crate::foreign`]).
    foreign: crate::foreign::Foreign,
}

/// What our view held for a name when the plan was made.
#[derive(Clone, Debug)]
struct Seen {
    /// The object as our view held it: an update is made from it.
    view: Arc<EndpointSlice>,
    uid: Option<String>,
    set: SetKey,
}

impl Seen {
    fn of(slice: Arc<EndpointSlice>) -> Self {
        Seen {
            uid: slice.uid(),
            set: set_of(&slice),
            view: slice,
        }
    }
}

/// A plan's writes, each with what our view held for its name:
/// [`SliceWriter::prepare`] resolves them before anything is awaited.
#[derive(Clone, Debug, Default)]
pub struct Writes {
    applies: Vec<(EndpointSlice, Option<Seen>)>,
    deletes: Vec<(String, Option<Seen>)>,
    /// Applied again after the deletes, each onto what its apply wrote
    /// (the planner's `finishes`: a move between slices ends with the
    /// slice that took the endpoint in, for Cilium, see
    /// `portwise_core::plan::MOVING_IN_ANNOTATION`).
    finishes: Vec<EndpointSlice>,
}

impl Writes {
    /// Resolves `applies` and `deletes` against `view` (our cache read
    /// through our own recent writes).
    pub fn new(
        applies: &[EndpointSlice],
        deletes: &[String],
        view: impl Fn(&str) -> Option<Arc<EndpointSlice>>,
    ) -> Self {
        Writes {
            applies: applies
                .iter()
                .map(|s| (s.clone(), view(&s.name_any()).map(Seen::of)))
                .collect(),
            deletes: deletes
                .iter()
                .map(|n| (n.clone(), view(n).map(Seen::of)))
                .collect(),
            finishes: Vec::new(),
        }
    }

    /// With the writes that finish the plan's moves, made last.
    pub fn finishing(mut self, finishes: &[EndpointSlice]) -> Self {
        self.finishes = finishes.to_vec();
        self
    }
}

impl SliceWriter {
    pub fn new(client: Client, manager: String) -> Self {
        Self {
            client,
            manager,
            recent: Recent::default(),
            echoes: Arc::default(),
            foreign: Default::default(),
        }
    }

    /// Marks each write in `echoes`, which the slice watch reads
    /// ([`crate::echo`]).
    pub(crate) fn with_echoes(mut self, echoes: Arc<Echoes>) -> Self {
        self.echoes = echoes;
        self
    }

    /// The freshest view of slice `ns/name`: the cached object, unless we
    /// wrote it more recently than the cache knows (by uid and generation;
    /// resourceVersions are never compared).
    pub fn overlay(
        &self,
        ns: &str,
        name: &str,
        cached: Option<Arc<EndpointSlice>>,
    ) -> Option<Arc<EndpointSlice>> {
        match self.recent.overlay_with(ns, name, cached, &self.echoes) {
            Some(view) => {
                self.foreign.forget(ns, name);
                Some(view)
            }
            None => self.foreign.get(ns, name),
        }
    }

    /// Names we wrote in `ns` that the cache may not show yet.
    pub fn recent_names(&self, ns: &str) -> Vec<String> {
        self.recent.names(ns)
    }

    /// Makes `writes`: the applies, then the deletes, each guarded as the
    /// module docs say.
    ///
    /// A failed apply holds back the later applies and the deletes of its
    /// slice set (see the module docs); every other write is still made.
    /// The error names every failed and every held-back slice.
    pub async fn execute(&self, ns: &str, writes: &Writes, metrics: &Metrics) -> Result<(), Error> {
        let api = Server {
            api: Api::namespaced(self.client.clone(), ns),
            manager: self.manager.clone(),
        };
        let result = write(&api, &self.recent, &self.echoes, ns, writes, metrics).await;
        if let Err(e) = &result {
            self.learn_foreign(&api.api, ns, writes, e).await;
        }
        result
    }

    /// After a refused create of a name our view did not hold, fetches
    /// what holds the name so the next plan sees it ([`crate::foreign`]).
    async fn learn_foreign(&self, api: &Api<EndpointSlice>, ns: &str, writes: &Writes, e: &Error) {
        let failed = match e {
            Error::Several { failed, .. } => failed.as_slice(),
            single => std::slice::from_ref(single),
        };
        for f in failed {
            let Error::Apply {
                name,
                source: kube::Error::Api(status),
            } = f
            else {
                continue;
            };
            let unseen = writes
                .applies
                .iter()
                .any(|(s, seen)| seen.is_none() && s.metadata.name.as_deref() == Some(name));
            if status.code != 409 || !unseen {
                continue;
            }
            match api.get_opt(name).await {
                Ok(Some(holder)) => {
                    info!(namespace = ns, slice = %name, "name held by another writer");
                    self.foreign.remember(ns, name, holder);
                }
                Ok(None) => {}
                Err(err) => {
                    debug!(namespace = ns, slice = %name, error = %err, "GET after refused create")
                }
            }
        }
    }
}

/// [`SliceWriter::execute`] against any [`SliceApi`].
async fn write(
    api: &impl SliceApi,
    recent: &Recent,
    echoes: &Echoes,
    ns: &str,
    writes: &Writes,
    metrics: &Metrics,
) -> Result<(), Error> {
    let mut held = Held::default();
    let mut failed = Vec::new();
    let mut held_back = Vec::new();
    // What each successful write left: the object, to finish onto.
    let mut written_objects: HashMap<String, EndpointSlice> = HashMap::new();
    for (slice, seen) in &writes.applies {
        let name = slice.name_any();
        let set = set_of(slice);
        if held.holds(&set) {
            held_back.push(name);
            continue;
        }
        // Known: updated from what we saw. New: created.
        let flight = echoes.writing(ns, &name);
        let applied = match seen {
            Some(seen) => update(api, &seen.view, slice).await,
            None => api.create(slice).await,
        };
        match applied {
            Ok(written) => {
                metrics.writes.count(WriteKind::Apply);
                metrics.native.count_slice_change(if seen.is_some() {
                    SliceChange::Update
                } else {
                    SliceChange::Create
                });
                debug!(namespace = ns, slice = %name, "wrote EndpointSlice");
                echoes.applied(&written);
                drop(flight);
                written_objects.insert(name.clone(), written.clone());
                recent.remember(ns, &name, written);
            }
            Err(source) => {
                // The reconcile's error names it; this shows the order.
                debug!(namespace = ns, slice = %name, error = %source,
                    "apply failed; holding back the rest of its slice set");
                held.fail(set);
                failed.push(Error::Apply { name, source });
            }
        }
    }
    for (name, seen) in &writes.deletes {
        // Gone from our view already: nothing to delete.
        let Some(seen) = seen else { continue };
        // A slice serves the set it was written for; the planner names a
        // slice by its set, so our view of it tells which set it is.
        if held.holds(&seen.set) {
            held_back.push(name.clone());
            continue;
        }
        let flight = echoes.writing(ns, name);
        let deleted = api.delete(name, seen.uid.clone()).await;
        match deleted {
            Ok(()) => {
                metrics.writes.count(WriteKind::Delete);
                metrics.native.count_slice_change(SliceChange::Delete);
                info!(namespace = ns, slice = %name, "deleted EndpointSlice");
            }
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(source) => {
                // Deletes hold nothing back: each removes only a slice the
                // plan no longer wants.
                failed.push(Error::Delete {
                    name: name.clone(),
                    source,
                });
                continue;
            }
        }
        echoes.deleted(ns, name, seen.uid.clone());
        drop(flight);
        recent.remember_delete(ns, name, seen.uid.clone());
    }
    for slice in &writes.finishes {
        let name = slice.name_any();
        // Only onto the object its write left; a write that failed or was
        // held back leaves nothing to finish.
        let Some(onto) = written_objects.get(&name) else {
            continue;
        };
        if held.holds(&set_of(slice)) {
            held_back.push(name);
            continue;
        }
        let flight = echoes.writing(ns, &name);
        match update(api, onto, slice).await {
            Ok(written) => {
                metrics.writes.count(WriteKind::Apply);
                metrics.native.count_slice_change(SliceChange::Update);
                debug!(namespace = ns, slice = %name, "finished a move into EndpointSlice");
                echoes.applied(&written);
                drop(flight);
                recent.remember(ns, &name, written);
            }
            // The next reconcile sees the annotation and writes it off.
            Err(source) => failed.push(Error::Apply { name, source }),
        }
    }
    Error::of(failed, held_back)
}

/// Updates `onto` (the object as we saw it) to `desired`: a PUT with its
/// resourceVersion as precondition; if the object changed since, a
/// server-side apply with `force` onto its uid (module docs).
async fn update(
    api: &impl SliceApi,
    onto: &EndpointSlice,
    desired: &EndpointSlice,
) -> kube::Result<EndpointSlice> {
    // Without a resourceVersion a PUT would be unconditional.
    if onto.resource_version().is_some() {
        match api
            .replace(&replacement(onto, desired, api.manager()))
            .await
        {
            Err(kube::Error::Api(s)) if s.code == 409 => {
                debug!(slice = %desired.name_any(), reason = %s.message,
                    "update refused (the slice changed since our view): applying");
            }
            done => return done,
        }
    }
    let mut slice = desired.clone();
    slice.metadata.uid = onto.uid();
    api.apply(&slice, true).await
}

impl Recent {
    /// [`Recent::overlay_with`], knowing of no watch event.
    #[cfg(test)]
    fn overlay(
        &self,
        ns: &str,
        name: &str,
        cached: Option<Arc<EndpointSlice>>,
    ) -> Option<Arc<EndpointSlice>> {
        self.overlay_with(ns, name, cached, &Echoes::default())
    }

    /// The view of `ns/name`: `cached`, unless our write is newer than what
    /// the cache shows; `echoes` says which of our writes the watch showed.
    fn overlay_with(
        &self,
        ns: &str,
        name: &str,
        cached: Option<Arc<EndpointSlice>>,
        echoes: &Echoes,
    ) -> Option<Arc<EndpointSlice>> {
        let key = (ns.to_string(), name.to_string());
        let mut recent = self.0.lock().unwrap();
        let Some(w) = recent.get(&key) else {
            return cached;
        };
        let (caught_up, view) = if w.at.elapsed() > OVERLAY_FOR {
            (true, cached)
        } else {
            match (&w.slice, cached.as_deref()) {
                // Applied, and the cache shows our object at our generation
                // or later.
                (Some(mine), Some(c)) if c.uid() == mine.uid() => {
                    if newer_or_same(c, mine) {
                        (true, cached)
                    } else {
                        (false, Some(mine.clone()))
                    }
                }
                // Another object under the name: we applied onto the uid
                // our view held (or onto none), so this one came after ours
                // (re-created since). The cache is ahead of us.
                (Some(_), Some(_)) => (true, cached),
                // The watch showed our object, and the cache has it no
                // more: deleted (or unlabelled) since.
                (Some(mine), None) if echoes.shown(mine) => (true, None),
                // Our object is not in the cache yet.
                (Some(mine), None) => (false, Some(mine.clone())),
                // Deleted, and the cache agrees, or shows a re-creation (a
                // uid that was deleted never comes back).
                (None, None) => (true, None),
                (None, Some(c)) if w.uid.is_none() || c.uid() != w.uid => (true, cached),
                (None, Some(_)) => (false, None),
            }
        };
        if caught_up {
            recent.remove(&key);
        }
        view
    }

    fn names(&self, ns: &str) -> Vec<String> {
        let mut recent = self.0.lock().unwrap();
        recent.retain(|_, w| w.at.elapsed() <= OVERLAY_FOR);
        recent
            .iter()
            .filter(|((n, _), w)| n == ns && w.slice.is_some())
            .map(|((_, name), _)| name.clone())
            .collect()
    }

    fn remember(&self, ns: &str, name: &str, slice: EndpointSlice) {
        self.0.lock().unwrap().insert(
            (ns.to_string(), name.to_string()),
            Written {
                uid: slice.uid(),
                slice: Some(Arc::new(slice)),
                at: Instant::now(),
            },
        );
    }

    fn remember_delete(&self, ns: &str, name: &str, uid: Option<String>) {
        self.0.lock().unwrap().insert(
            (ns.to_string(), name.to_string()),
            Written {
                slice: None,
                uid,
                at: Instant::now(),
            },
        );
    }
}

/// Does `cached` show `mine` or a later state of the same object?
/// `metadata.generation` is ordered by the API's contract (the apiserver
/// increments it on every change to a slice's endpoints, ports or labels);
/// resourceVersions are not, so without generations (fakes) only the very
/// same resourceVersion counts.
fn newer_or_same(cached: &EndpointSlice, mine: &EndpointSlice) -> bool {
    match (cached.metadata.generation, mine.metadata.generation) {
        (Some(c), Some(m)) => c >= m,
        _ => {
            cached.resource_version().is_some()
                && cached.resource_version() == mine.resource_version()
        }
    }
}

#[cfg(test)]
mod tests;
