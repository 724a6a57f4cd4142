//! Writes a plan: server-side apply of the slices that differ, deletes of
//! the ones no longer wanted.
//!
//! The planner only hands over slices whose live state differs from the
//! desired one, so a steady state reaches this module with nothing to do.
//! Applies use `managedBy` as field manager and force ownership, which is
//! what repairs a manual edit made by another field manager; slices held by
//! other managers never get here (the planner reports them as collisions).
//!
//! Failures are contained per slice set. The planner moves endpoints only
//! between slices of one (Service port, address family), and that is also
//! what consumers merge, so a failed apply holds back the remaining applies
//! and deletes of its own (port, family): writing them could drop endpoints
//! whose new slice was just refused. Writes of other (port, family) pairs go
//! ahead, so one refused slice (a 422, say) leaves only its own set stale.
//! The planner puts the slices that gain endpoints first, so the writes made
//! before a refusal never drop an endpoint either.
//! The target port is not part of the key: a targetPort change rewrites the
//! slices of a (port, family) in place, from one target to the other.
//!
//! Reads after our own writes: the informer cache lags a write by one watch
//! event. A reconcile that starts in between would see the old slice and
//! write again, so the writer remembers what it wrote until the cache has
//! caught up (see [`SliceWriter::overlay`]).

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, Preconditions},
};
use tracing::{debug, info};

use crate::metrics::{Metrics, WriteKind};

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

/// The slice set a slice belongs to, for containing failures: (Service port
/// name, address type), as the planner groups slices. `None` for a shape
/// portwise does not write (no port, or several), which may hold endpoints
/// of any set.
type SetKey = (String, String);

fn set_of(slice: &EndpointSlice) -> Option<SetKey> {
    match slice.ports.as_deref() {
        Some([p]) => Some((
            p.name.clone().unwrap_or_default(),
            slice.address_type.clone(),
        )),
        _ => None,
    }
}

/// The sets that had an apply fail; their remaining writes are held back.
#[derive(Debug, Default)]
struct Held {
    sets: HashSet<SetKey>,
    /// A slice of unknown set failed: every set is held.
    all: bool,
}

impl Held {
    fn holds(&self, set: Option<&SetKey>) -> bool {
        self.all
            || match set {
                Some(s) => self.sets.contains(s),
                None => !self.sets.is_empty(),
            }
    }

    fn fail(&mut self, set: Option<SetKey>) {
        match set {
            Some(s) => {
                self.sets.insert(s);
            }
            None => self.all = true,
        }
    }
}

/// The calls a plan's writes need: the apiserver, or a fake in tests.
trait SliceApi {
    /// Server-side apply of the whole slice; the object as written.
    async fn apply(&self, slice: &EndpointSlice) -> kube::Result<EndpointSlice>;
    async fn get(&self, name: &str) -> kube::Result<Option<EndpointSlice>>;
    /// Deletes `name` if its uid is still `uid`.
    async fn delete(&self, name: &str, uid: Option<String>) -> kube::Result<()>;
}

struct Server {
    api: Api<EndpointSlice>,
    params: PatchParams,
}

impl SliceApi for Server {
    async fn apply(&self, slice: &EndpointSlice) -> kube::Result<EndpointSlice> {
        self.api
            .patch(&slice.name_any(), &self.params, &Patch::Apply(slice))
            .await
    }

    async fn get(&self, name: &str) -> kube::Result<Option<EndpointSlice>> {
        self.api.get_opt(name).await
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
/// for a delete; with the resourceVersion it carried.
#[derive(Clone, Debug)]
struct Written {
    slice: Option<Arc<EndpointSlice>>,
    resource_version: u64,
}

/// Our writes the cache may not show yet, by (namespace, name).
#[derive(Debug, Default)]
struct Recent(Mutex<HashMap<(String, String), Written>>);

pub struct SliceWriter {
    client: Client,
    manager: String,
    recent: Recent,
}

fn rv(s: &EndpointSlice) -> u64 {
    s.resource_version()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

impl SliceWriter {
    pub fn new(client: Client, manager: String) -> Self {
        Self {
            client,
            manager,
            recent: Recent::default(),
        }
    }

    /// The freshest view of slice `ns/name`: the cached object, unless we
    /// wrote it more recently than the cache knows.
    ///
    /// resourceVersions are opaque by contract, but every apiserver backed by
    /// etcd hands out increasing integers; when one does not parse we trust
    /// the cache.
    pub fn overlay(
        &self,
        ns: &str,
        name: &str,
        cached: Option<Arc<EndpointSlice>>,
    ) -> Option<Arc<EndpointSlice>> {
        self.recent.overlay(ns, name, cached)
    }

    /// Names we wrote in `ns` that the cache may not show yet.
    pub fn recent_names(&self, ns: &str) -> Vec<String> {
        self.recent.names(ns)
    }

    /// Applies `applies`, then deletes `deletes` (by name, guarded by the
    /// uid we saw so a re-created object is never deleted by mistake).
    ///
    /// A failed apply holds back the later applies and the deletes of its
    /// slice set (see the module docs); every other write is still made.
    /// The error names every failed and every held-back slice.
    pub async fn execute(
        &self,
        ns: &str,
        applies: &[EndpointSlice],
        deletes: &[String],
        metrics: &Metrics,
    ) -> Result<(), Error> {
        let api = Server {
            api: Api::namespaced(self.client.clone(), ns),
            params: PatchParams::apply(&self.manager).force(),
        };
        write(&api, &self.recent, ns, applies, deletes, metrics).await
    }
}

/// [`SliceWriter::execute`] against any [`SliceApi`].
async fn write(
    api: &impl SliceApi,
    recent: &Recent,
    ns: &str,
    applies: &[EndpointSlice],
    deletes: &[String],
    metrics: &Metrics,
) -> Result<(), Error> {
    let mut held = Held::default();
    let mut failed = Vec::new();
    let mut held_back = Vec::new();
    for slice in applies {
        let name = slice.name_any();
        let set = set_of(slice);
        if held.holds(set.as_ref()) {
            held_back.push(name);
            continue;
        }
        match api.apply(slice).await {
            Ok(written) => {
                metrics.count_write(WriteKind::Apply);
                debug!(namespace = ns, slice = %name, "applied EndpointSlice");
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
    for name in deletes {
        // The live object tells which set the slice serves now.
        let current = match api.get(name).await {
            Ok(c) => c,
            Err(source) => {
                failed.push(Error::Delete {
                    name: name.clone(),
                    source,
                });
                continue;
            }
        };
        let Some(current) = current else {
            recent.remember_delete(ns, name, 0);
            continue;
        };
        if held.holds(set_of(&current).as_ref()) {
            held_back.push(name.clone());
            continue;
        }
        match api.delete(name, current.uid()).await {
            Ok(()) => {
                metrics.count_write(WriteKind::Delete);
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
        recent.remember_delete(ns, name, rv(&current));
    }
    Error::of(failed, held_back)
}

impl Recent {
    fn overlay(
        &self,
        ns: &str,
        name: &str,
        cached: Option<Arc<EndpointSlice>>,
    ) -> Option<Arc<EndpointSlice>> {
        let key = (ns.to_string(), name.to_string());
        let mut recent = self.0.lock().unwrap();
        let Some(w) = recent.get(&key) else {
            return cached;
        };
        let cached_rv = cached.as_deref().map(rv);
        let (caught_up, view) = match (&w.slice, cached_rv) {
            // Applied: the cache has our write or something newer.
            (Some(_), Some(c)) if c == 0 || c >= w.resource_version => (true, cached),
            (Some(mine), _) => (false, Some(mine.clone())),
            // Deleted, and the cache agrees (or shows a newer re-creation).
            (None, None) => (true, None),
            (None, Some(c)) if c == 0 || c > w.resource_version => (true, cached),
            (None, Some(_)) => (false, None),
        };
        if caught_up {
            recent.remove(&key);
        }
        view
    }

    fn names(&self, ns: &str) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|((n, _), w)| n == ns && w.slice.is_some())
            .map(|((_, name), _)| name.clone())
            .collect()
    }

    fn remember(&self, ns: &str, name: &str, slice: EndpointSlice) {
        let resource_version = rv(&slice);
        self.0.lock().unwrap().insert(
            (ns.to_string(), name.to_string()),
            Written {
                slice: Some(Arc::new(slice)),
                resource_version,
            },
        );
    }

    fn remember_delete(&self, ns: &str, name: &str, deleted_rv: u64) {
        self.0.lock().unwrap().insert(
            (ns.to_string(), name.to_string()),
            Written {
                slice: None,
                resource_version: deleted_rv,
            },
        );
    }
}

#[cfg(test)]
mod tests;
