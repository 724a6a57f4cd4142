//! Living beside the native controllers: cleaning up what they left behind
//! when a Service moves to portwise, and publishing legacy `Endpoints` for
//! consumers that still read them.
//!
//! A Service that loses its selector keeps the native controller's
//! EndpointSlices and the old Endpoints object forever (the native
//! controllers ignore selector-less Services), so clients would keep being
//! sent to pods portwise no longer publishes. Once portwise publishes at
//! least one endpoint, we delete the Endpoints object first (so the
//! mirroring controller cannot copy it back into slices), then the native
//! slices. Every step is idempotent, so a failure part-way, or a restart,
//! simply resumes on the next reconcile.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::api::{
    core::v1::{Endpoints, Service},
    discovery::v1::EndpointSlice,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, Preconditions},
};
use portwise_core::plan::{MANAGED_BY_LABEL, SERVICE_NAME_LABEL};
use tracing::{debug, info, warn};

use crate::{
    metrics::{CleanupKind, Metrics},
    table::ServiceTable,
};

/// The native EndpointSlice controller's managed-by value.
pub const NATIVE_MANAGER: &str = "endpointslice-controller.k8s.io";
/// Label marking the Endpoints objects portwise publishes.
pub const ENDPOINTS_MANAGED_BY_LABEL: &str = "endpoints.kubernetes.io/managed-by";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The Endpoints object exists and belongs to someone else.
    #[error("Endpoints object is managed by {0}")]
    NotOurs(String),
}

/// What one cleanup pass deleted.
#[derive(Debug, Default)]
pub struct Cleaned {
    pub endpoints: bool,
    pub slices: Vec<String>,
}

impl Cleaned {
    pub fn deleted_anything(&self) -> bool {
        self.endpoints || !self.slices.is_empty()
    }
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.endpoints {
            parts.push("the legacy Endpoints object".to_string());
        }
        if !self.slices.is_empty() {
            parts.push(format!(
                "{} native EndpointSlice(s): {}",
                self.slices.len(),
                self.slices.join(", ")
            ));
        }
        format!(
            "portwise publishes this Service now; deleted {}",
            parts.join(" and ")
        )
    }
}

pub struct Migrator {
    client: Client,
    managed_by: String,
    /// What each Service's cleanup learnt (its row's `endpoints_gone` and
    /// `native_slices_gone`), so a steady state neither GETs its Endpoints
    /// nor LISTs its slices on every reconcile.
    table: Arc<ServiceTable>,
    /// The native Endpoints objects (namespace, name) -> uid that one
    /// label-selected LIST found at start ([`Migrator::prime`]), so that the
    /// cold start's cleanup costs one request, not one GET per Service.
    /// Each entry answers once; `None` (not primed, or the LIST failed)
    /// means every first cleanup GETs. Dropped after [`PRIMED_FOR`]: the
    /// entries left then belong to Services with selectors, which portwise
    /// does not manage, and keeping them would cost memory in proportion to
    /// the cluster rather than to what portwise manages.
    native_at_start: Mutex<Option<(Instant, NativeAtStart)>>,
    /// The native EndpointSlices the start-up LIST found, by (namespace,
    /// Service name): portwise's slice watch selects only its own slices,
    /// so this (and, later, one label-selected LIST per hand-over) is how
    /// cleanup finds the native ones. Dropped after [`PRIMED_FOR`], like
    /// `native_at_start`.
    slices_at_start: Mutex<Option<(Instant, SlicesAtStart)>>,
}

/// (namespace, Service name) -> the native slices (name, uid) the
/// start-up LIST found for it; `None`: the Service changed since, LIST.
/// Drops a start-up LIST once it is older than [`PRIMED_FOR`].
fn expire<T>(primed: &mut Option<(Instant, T)>) {
    if primed
        .as_ref()
        .is_some_and(|(at, _)| at.elapsed() > PRIMED_FOR)
    {
        *primed = None;
    }
}

type SlicesAtStart = HashMap<(String, String), Option<Vec<(String, Option<String>)>>>;

/// What the start-up LIST says about a Service's native slices.
enum PrimedSlices {
    Unknown,
    Found(Vec<(String, Option<String>)>),
}

/// (namespace, name) of each native Endpoints object the start-up LIST found.
type NativeAtStart = HashMap<(String, String), AtStart>;

/// One entry of [`Migrator::native_at_start`].
enum AtStart {
    /// A native Endpoints object with this uid.
    Native(Option<String>),
    /// The Service changed since (see [`Migrator::forget`]): GET.
    Ask,
}

/// How long the start-up LIST answers: the cold start's first reconciles
/// are done well within it.
const PRIMED_FOR: Duration = Duration::from_secs(600);

/// What the start-up LIST says about a Service's native Endpoints.
enum Primed {
    /// Not primed, or the Service's state may have changed since: GET.
    Unknown,
    Absent,
    Present(Option<String>),
}

/// The value the native endpoints controller labels its Endpoints with.
pub const NATIVE_ENDPOINTS_MANAGER: &str = "endpoint-controller";

fn endpoints_manager(ep: &Endpoints) -> Option<&str> {
    ep.labels()
        .get(ENDPOINTS_MANAGED_BY_LABEL)
        .map(String::as_str)
}

fn is_our_endpoints(ep: &Endpoints, managed_by: &str) -> bool {
    endpoints_manager(ep) == Some(managed_by)
}

/// Only the native controller's Endpoints is a leftover: a hand-maintained
/// one (the classic way to feed a selector-less Service) is someone's data.
fn is_native_endpoints(ep: &Endpoints) -> bool {
    endpoints_manager(ep) == Some(NATIVE_ENDPOINTS_MANAGER)
}

impl Migrator {
    pub(crate) fn new(client: Client, managed_by: String, table: Arc<ServiceTable>) -> Self {
        Self {
            client,
            managed_by,
            table,
            native_at_start: Mutex::default(),
            slices_at_start: Mutex::default(),
        }
    }

    /// Lists the native Endpoints in `namespaces` (all when empty) once,
    /// selected by the native controller's managed-by label. A failure is
    /// logged and leaves cleanup to GET per Service, as before.
    pub async fn prime(&self, namespaces: &[String]) {
        let selector = format!("{ENDPOINTS_MANAGED_BY_LABEL}={NATIVE_ENDPOINTS_MANAGER}");
        let endpoints = match list_metadata::<Endpoints>(&self.client, namespaces, &selector).await
        {
            Ok(items) => items,
            Err(e) => {
                warn!(error = %e, "listing native Endpoints failed; cleanup will GET per Service");
                return;
            }
        };
        let found: NativeAtStart = endpoints
            .iter()
            .map(|ep| {
                (
                    (ep.namespace().unwrap_or_default(), ep.name_any()),
                    AtStart::Native(ep.uid()),
                )
            })
            .collect();
        debug!(native_endpoints = found.len(), "primed native Endpoints");
        *self.native_at_start.lock().unwrap() = Some((Instant::now(), found));

        let selector = format!("{MANAGED_BY_LABEL}={NATIVE_MANAGER}");
        let native = match list_metadata::<EndpointSlice>(&self.client, namespaces, &selector).await
        {
            Ok(items) => items,
            Err(e) => {
                warn!(error = %e, "listing native EndpointSlices failed; cleanup will LIST per Service");
                return;
            }
        };
        let mut slices: SlicesAtStart = HashMap::new();
        for s in &native {
            let Some(svc) = s.labels().get(SERVICE_NAME_LABEL) else {
                continue;
            };
            slices
                .entry((s.namespace().unwrap_or_default(), svc.clone()))
                .or_insert_with(|| Some(Vec::new()))
                .get_or_insert_with(Vec::new)
                .push((s.name_any(), s.uid()));
        }
        debug!(services = slices.len(), "primed native EndpointSlices");
        *self.slices_at_start.lock().unwrap() = Some((Instant::now(), slices));
    }

    /// What the start-up LIST found of `ns/name`'s native slices, consumed.
    fn primed_slices(&self, ns: &str, name: &str) -> PrimedSlices {
        let mut primed = self.slices_at_start.lock().unwrap();
        expire(&mut primed);
        match primed.as_mut() {
            None => PrimedSlices::Unknown,
            Some((_, found)) => match found.remove(&(ns.to_string(), name.to_string())) {
                Some(Some(slices)) => PrimedSlices::Found(slices),
                Some(None) => PrimedSlices::Unknown,
                None => PrimedSlices::Found(Vec::new()),
            },
        }
    }

    /// The native slices of `ns/name` (name, uid): from the start-up LIST
    /// while it answers, else one LIST selected by the Service's name and
    /// the native manager.
    async fn native_slices(
        &self,
        api: &Api<EndpointSlice>,
        ns: &str,
        name: &str,
    ) -> Result<Vec<(String, Option<String>)>, Error> {
        if let PrimedSlices::Found(found) = self.primed_slices(ns, name) {
            return Ok(found);
        }
        let selector = format!("{SERVICE_NAME_LABEL}={name},{MANAGED_BY_LABEL}={NATIVE_MANAGER}");
        let list = api
            .list_metadata(&ListParams::default().labels(&selector))
            .await?;
        Ok(list.items.iter().map(|s| (s.name_any(), s.uid())).collect())
    }

    /// What the start-up LIST found for `ns/name`, consumed.
    fn primed(&self, ns: &str, name: &str) -> Primed {
        let mut primed = self.native_at_start.lock().unwrap();
        expire(&mut primed);
        match primed.as_mut() {
            None => Primed::Unknown,
            Some((_, found)) => match found.remove(&(ns.to_string(), name.to_string())) {
                Some(AtStart::Native(uid)) => Primed::Present(uid),
                Some(AtStart::Ask) => Primed::Unknown,
                None => Primed::Absent,
            },
        }
    }

    /// Deletes the native leftovers of `svc`: its Endpoints object (unless it
    /// is ours), then its native slices. Call only when the Service has no
    /// selector and portwise publishes at least one endpoint for it.
    pub async fn cleanup(&self, svc: &Service, metrics: &Metrics) -> Result<Cleaned, Error> {
        let ns = svc.namespace().unwrap_or_default();
        let name = svc.name_any();
        let mut cleaned = Cleaned::default();
        let (endpoints_gone, slices_gone) = self.table.read(svc, |row| {
            row.map_or((false, false), |r| (r.endpoints_gone, r.native_slices_gone))
        });

        if !endpoints_gone {
            let api: Api<Endpoints> = Api::namespaced(self.client.clone(), &ns);
            let native = match self.primed(&ns, &name) {
                Primed::Present(uid) => Some(uid),
                Primed::Absent => None,
                Primed::Unknown => match api.get_opt(&name).await? {
                    Some(ep) if is_native_endpoints(&ep) => Some(ep.uid()),
                    _ => None,
                },
            };
            if let Some(ep_uid) = native {
                delete_guarded(&api, &name, ep_uid).await?;
                metrics.writes.count_native_cleanup(CleanupKind::Endpoints);
                info!(namespace = %ns, service = %name, "deleted native Endpoints");
                cleaned.endpoints = true;
            }
            // Not for a Service forgotten meanwhile: it would never go.
            self.table
                .update_existing(svc, |row| row.endpoints_gone = true);
        }

        if slices_gone {
            return Ok(cleaned);
        }
        let api: Api<EndpointSlice> = Api::namespaced(self.client.clone(), &ns);
        let native = self.native_slices(&api, &ns, &name).await?;
        if native.is_empty() {
            // Only a pass that finds none settles it: one that deleted
            // some looks again next time, in case the native controller
            // wrote late. The native controller does not publish for a
            // selector-less Service, so none come back unless a selector
            // does ([`Migrator::forget`]).
            self.table
                .update_existing(svc, |row| row.native_slices_gone = true);
        }
        for (slice_name, slice_uid) in native {
            delete_guarded(&api, &slice_name, slice_uid).await?;
            metrics
                .writes
                .count_native_cleanup(CleanupKind::EndpointSlice);
            info!(namespace = %ns, service = %name, slice = %slice_name, "deleted native EndpointSlice");
            cleaned.slices.push(slice_name);
        }
        Ok(cleaned)
    }

    /// Deletes the Endpoints object we published for `svc`, if any (the
    /// Service left our management or legacy publishing was turned off).
    pub async fn remove_our_endpoints(&self, svc: &Service) -> Result<bool, Error> {
        let ns = svc.namespace().unwrap_or_default();
        let api: Api<Endpoints> = Api::namespaced(self.client.clone(), &ns);
        match api.get_opt(&svc.name_any()).await? {
            Some(ep) if is_our_endpoints(&ep, &self.managed_by) => {
                delete_guarded(&api, &svc.name_any(), ep.uid()).await?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Forgets what we know about `svc`'s Endpoints (it regained a selector,
    /// so the native controller may publish one again; or it was deleted),
    /// including what the start-up LIST said: from now on only a GET tells.
    pub fn forget(&self, svc: &Service) {
        self.table.update_existing(svc, |row| {
            row.endpoints_gone = false;
            row.native_slices_gone = false;
        });
        // The start-up LISTs are consulted for PRIMED_FOR only; past it
        // they go, so a deletion never grows them.
        let key = (svc.namespace().unwrap_or_default(), svc.name_any());
        let mut native = self.native_at_start.lock().unwrap();
        expire(&mut native);
        if let Some((_, found)) = native.as_mut() {
            found.insert(key.clone(), AtStart::Ask);
        }
        let mut slices = self.slices_at_start.lock().unwrap();
        expire(&mut slices);
        if let Some((_, found)) = slices.as_mut() {
            found.insert(key, None);
        }
    }

    /// Publishes `desired` as the Service's Endpoints object, unless an
    /// Endpoints object owned by someone else exists. Writes only when the
    /// live object differs.
    pub async fn publish_endpoints(
        &self,
        svc: &Service,
        desired: Endpoints,
    ) -> Result<bool, Error> {
        let ns = svc.namespace().unwrap_or_default();
        let name = svc.name_any();
        let api: Api<Endpoints> = Api::namespaced(self.client.clone(), &ns);
        let live = api.get_opt(&name).await?;
        if let Some(live) = &live {
            if !is_our_endpoints(live, &self.managed_by) {
                let holder = live
                    .labels()
                    .get(ENDPOINTS_MANAGED_BY_LABEL)
                    .cloned()
                    .unwrap_or_else(|| "another writer".into());
                return Err(Error::NotOurs(holder));
            }
            if !portwise_core::plan::endpoints_differ(&desired, live) {
                return Ok(false);
            }
        }
        api.patch(
            &name,
            &PatchParams::apply(&self.managed_by).force(),
            &Patch::Apply(&desired),
        )
        .await?;
        Ok(true)
    }
}

/// Every object's metadata in `namespaces` (all when empty) that
/// `selector` selects, in pages of 500.
async fn list_metadata<K>(
    client: &Client,
    namespaces: &[String],
    selector: &str,
) -> Result<Vec<kube::core::PartialObjectMeta<K>>, kube::Error>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let apis: Vec<Api<K>> = if namespaces.is_empty() {
        vec![Api::all(client.clone())]
    } else {
        namespaces
            .iter()
            .map(|ns| Api::namespaced(client.clone(), ns))
            .collect()
    };
    let mut items = Vec::new();
    for api in apis {
        let mut params = ListParams::default().labels(selector).limit(500);
        loop {
            let page = api.list_metadata(&params).await?;
            items.extend(page.items);
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => break,
            }
        }
    }
    Ok(items)
}

async fn delete_guarded<K>(api: &Api<K>, name: &str, uid: Option<String>) -> Result<(), Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid,
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &dp).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
