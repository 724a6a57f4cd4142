//! Writes a plan: server-side apply of the slices that differ, deletes of
//! the ones no longer wanted.
//!
//! The planner only hands over slices whose live state differs from the
//! desired one, so a steady state reaches this module with nothing to do.
//! Applies use `managedBy` as field manager and force ownership, which is
//! what repairs a manual edit made by another field manager; slices held by
//! other managers never get here (the planner reports them as collisions).
//!
//! Reads after our own writes: the informer cache lags a write by one watch
//! event. A reconcile that starts in between would see the old slice and
//! write again, so the writer remembers what it wrote until the cache has
//! caught up (see [`SliceWriter::overlay`]).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, Preconditions},
};
use tracing::{debug, info};

use crate::ops::metrics::{Metrics, WriteKind};

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
}

/// What we last wrote to a slice: the object the API returned, or `None`
/// for a delete; with the resourceVersion it carried.
#[derive(Clone, Debug)]
struct Written {
    slice: Option<Arc<EndpointSlice>>,
    resource_version: u64,
}

pub struct SliceWriter {
    client: Client,
    manager: String,
    recent: Mutex<HashMap<(String, String), Written>>,
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
            recent: Mutex::default(),
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
        let key = (ns.to_string(), name.to_string());
        let mut recent = self.recent.lock().unwrap();
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

    /// Names we wrote in `ns` that the cache may not show yet.
    pub fn recent_names(&self, ns: &str) -> Vec<String> {
        self.recent
            .lock()
            .unwrap()
            .iter()
            .filter(|((n, _), w)| n == ns && w.slice.is_some())
            .map(|((_, name), _)| name.clone())
            .collect()
    }

    /// Applies `applies`, then deletes `deletes` (by name, guarded by the
    /// uid we saw so a re-created object is never deleted by mistake).
    pub async fn execute(
        &self,
        ns: &str,
        applies: &[EndpointSlice],
        deletes: &[String],
        metrics: &Metrics,
    ) -> Result<(), Error> {
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), ns);
        let params = PatchParams::apply(&self.manager).force();
        for slice in applies {
            let name = slice.name_any();
            let written = api
                .patch(&name, &params, &Patch::Apply(slice))
                .await
                .map_err(|source| Error::Apply {
                    name: name.clone(),
                    source,
                })?;
            metrics.count_write(WriteKind::Apply);
            debug!(namespace = ns, slice = %name, "applied EndpointSlice");
            self.remember(ns, &name, Some(written));
        }
        for name in deletes {
            let current = api.get_opt(name).await.map_err(|source| Error::Delete {
                name: name.clone(),
                source,
            })?;
            let Some(current) = current else {
                self.remember_delete(ns, name, 0);
                continue;
            };
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: current.uid(),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match api.delete(name, &dp).await {
                Ok(_) => {
                    metrics.count_write(WriteKind::Delete);
                    info!(namespace = ns, slice = %name, "deleted EndpointSlice");
                }
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(source) => {
                    return Err(Error::Delete {
                        name: name.clone(),
                        source,
                    });
                }
            }
            self.remember_delete(ns, name, rv(&current));
        }
        Ok(())
    }

    fn remember(&self, ns: &str, name: &str, slice: Option<EndpointSlice>) {
        let Some(slice) = slice else { return };
        let resource_version = rv(&slice);
        self.recent.lock().unwrap().insert(
            (ns.to_string(), name.to_string()),
            Written {
                slice: Some(Arc::new(slice)),
                resource_version,
            },
        );
    }

    fn remember_delete(&self, ns: &str, name: &str, deleted_rv: u64) {
        self.recent.lock().unwrap().insert(
            (ns.to_string(), name.to_string()),
            Written {
                slice: None,
                resource_version: deleted_rv,
            },
        );
    }
}
