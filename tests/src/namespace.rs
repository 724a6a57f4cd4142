//! A fresh namespace per test, and the object operations scenarios use.
//!
//! Tests share one apiserver and run in parallel; a namespace with a random
//! suffix keeps their objects apart, and portwise is told to watch only it.
//! Nodes are cluster-scoped, so their names are prefixed with the namespace.

use std::{sync::Mutex, time::Duration};

use anyhow::{Context, Result};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::{
    core::v1::{Namespace, Node, Pod, Service},
    discovery::v1::EndpointSlice,
};
use kube::{
    Api, Client, Resource,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::{
    ControlPlane,
    objects::{HOLD_FINALIZER, PodBuilder, ServiceBuilder, status_patch},
};

/// Field manager for every write the tests make themselves.
pub const TEST_MANAGER: &str = "portwise-tests";

pub struct TestNs {
    cp: &'static ControlPlane,
    client: Client,
    name: String,
    nodes: Mutex<Vec<String>>,
}

impl std::fmt::Debug for TestNs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestNs").field("name", &self.name).finish()
    }
}

impl TestNs {
    /// Creates `<prefix>-<random>`.
    pub async fn new(cp: &'static ControlPlane, prefix: &str) -> Result<Self> {
        let client = cp.client().await?;
        let mut prefix: String = prefix
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '-'
                }
            })
            .collect();
        prefix.truncate(48);
        let suffix: String = (0..6)
            .map(|_| fastrand::alphanumeric().to_ascii_lowercase())
            .collect();
        let name = format!("{}-{suffix}", prefix.trim_matches('-'));
        Self::create(cp, client, name).await
    }

    /// Creates the namespace `name` as it is (one a control plane's audit
    /// policy names, say: [`crate::WIRE_NS`]); fails if it exists.
    pub async fn exact(cp: &'static ControlPlane, name: &str) -> Result<Self> {
        let client = cp.client().await?;
        Self::create(cp, client, name.to_string()).await
    }

    async fn create(cp: &'static ControlPlane, client: Client, name: String) -> Result<Self> {
        let ns: Namespace = serde_json::from_value(json!({
            "metadata": { "name": name, "labels": { "portwise.test/suite": "true" } }
        }))?;
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("creating namespace {name}"))?;
        Ok(Self {
            cp,
            client,
            name,
            nodes: Mutex::new(Vec::new()),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn cp(&self) -> &'static ControlPlane {
        self.cp
    }
    pub fn client(&self) -> Client {
        self.client.clone()
    }
    /// A namespaced API for any namespaced kind.
    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }

    // ---- Services -------------------------------------------------------

    pub async fn create_service(&self, svc: ServiceBuilder) -> Result<Service> {
        self.api::<Service>()
            .create(&PostParams::default(), &svc.build())
            .await
            .with_context(|| format!("creating service {}", svc.name))
    }

    /// JSON merge patch on a Service (e.g. `{"spec": {"selector": null}}`).
    pub async fn patch_service(&self, name: &str, patch: Value) -> Result<Service> {
        self.api::<Service>()
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .with_context(|| format!("patching service {name}"))
    }

    pub async fn delete_service(&self, name: &str) -> Result<()> {
        self.api::<Service>()
            .delete(name, &DeleteParams::default())
            .await
            .with_context(|| format!("deleting service {name}"))?;
        Ok(())
    }

    pub async fn get_service(&self, name: &str) -> Result<Service> {
        Ok(self.api::<Service>().get(name).await?)
    }

    // ---- Pods -----------------------------------------------------------

    /// Creates the pod, then (unless `no_status`) sets its phase, Ready
    /// condition and IPs through the status subresource, as a kubelet would.
    pub async fn create_pod(&self, pod: PodBuilder) -> Result<Pod> {
        let created = self
            .api::<Pod>()
            .create(&PostParams::default(), &pod.build())
            .await
            .with_context(|| format!("creating pod {}", pod.name))?;
        if !pod.set_status {
            return Ok(created);
        }
        self.set_pod_status(&pod.name, pod.ready, &pod.phase, &pod.ips)
            .await
    }

    /// Creates many pods, a few requests in flight at a time.
    pub async fn create_pods(&self, pods: Vec<PodBuilder>) -> Result<Vec<Pod>> {
        stream::iter(pods)
            .map(|p| self.create_pod(p))
            .buffer_unordered(16)
            .try_collect()
            .await
    }

    /// Sets phase, Ready condition and `podIP`/`podIPs` (status subresource).
    pub async fn set_pod_status<T: AsRef<str>>(
        &self,
        name: &str,
        ready: bool,
        phase: &str,
        ips: &[T],
    ) -> Result<Pod> {
        let ips: Vec<String> = ips.iter().map(|s| s.as_ref().to_string()).collect();
        self.api::<Pod>()
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(status_patch(ready, phase, &ips)),
            )
            .await
            .with_context(|| format!("setting status of pod {name}"))
    }

    /// Flips only the Ready condition, keeping phase and IPs.
    pub async fn set_ready(&self, name: &str, ready: bool) -> Result<Pod> {
        let status = if ready { "True" } else { "False" };
        let patch = json!({ "status": { "conditions": [
            { "type": "Ready", "status": status },
            { "type": "ContainersReady", "status": status },
        ]}});
        self.api::<Pod>()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .with_context(|| format!("setting readiness of pod {name}"))
    }

    /// Sets (`Some`) or removes (`None`) an annotation on a pod.
    pub async fn annotate_pod(&self, name: &str, key: &str, value: Option<&str>) -> Result<Pod> {
        let patch = json!({ "metadata": { "annotations": { key: value } } });
        self.api::<Pod>()
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .with_context(|| format!("annotating pod {name}"))
    }

    /// Sets (`Some`) or removes (`None`) a label on a pod.
    pub async fn label_pod(&self, name: &str, key: &str, value: Option<&str>) -> Result<Pod> {
        let patch = json!({ "metadata": { "labels": { key: value } } });
        self.api::<Pod>()
            .patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .with_context(|| format!("labelling pod {name}"))
    }

    pub async fn get_pod(&self, name: &str) -> Result<Pod> {
        Ok(self.api::<Pod>().get(name).await?)
    }

    /// Deletes a pod for good (grace period 0), unless it is held by a
    /// finalizer.
    pub async fn delete_pod(&self, name: &str) -> Result<()> {
        self.api::<Pod>()
            .delete(
                name,
                &DeleteParams {
                    grace_period_seconds: Some(0),
                    ..Default::default()
                },
            )
            .await
            .with_context(|| format!("deleting pod {name}"))?;
        Ok(())
    }

    /// Starts a graceful delete: a pod with a `nodeName` (and no kubelet to
    /// finish the job) or a finalizer stays terminating.
    pub async fn terminate_pod(&self, name: &str) -> Result<()> {
        self.api::<Pod>()
            .delete(
                name,
                &DeleteParams {
                    grace_period_seconds: Some(3600),
                    ..Default::default()
                },
            )
            .await
            .with_context(|| format!("terminating pod {name}"))?;
        Ok(())
    }

    /// Lets a terminating pod go: removes the test finalizer and, standing
    /// in for the kubelet, finishes the graceful delete (grace period 0).
    pub async fn release_pod(&self, name: &str) -> Result<()> {
        release(&self.api::<Pod>(), name).await?;
        match self.delete_pod(name).await {
            Err(e) if is_not_found(&e) => Ok(()),
            other => other,
        }
    }

    // ---- Nodes ----------------------------------------------------------

    /// Creates (or updates) a fake Node `<namespace>-<short>` in `zone` and
    /// returns its name. Deleted with the namespace.
    pub async fn ensure_node(&self, short: &str, zone: &str) -> Result<String> {
        let name = format!("{}-{short}", self.name);
        let node = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": { "name": name, "labels": {
                "topology.kubernetes.io/zone": zone,
                "kubernetes.io/hostname": name,
                "portwise.test/namespace": self.name,
            }},
        });
        Api::<Node>::all(self.client.clone())
            .patch(
                &name,
                &PatchParams::apply(TEST_MANAGER).force(),
                &Patch::Apply(node),
            )
            .await
            .with_context(|| format!("applying node {name}"))?;
        let mut nodes = self.nodes.lock().unwrap();
        if !nodes.contains(&name) {
            nodes.push(name.clone());
        }
        Ok(name)
    }

    // ---- EndpointSlices ---------------------------------------------------

    /// All EndpointSlices in the namespace, whoever manages them.
    pub async fn all_slices(&self) -> Result<Vec<EndpointSlice>> {
        Ok(self
            .api::<EndpointSlice>()
            .list(&ListParams::default())
            .await?
            .items)
    }
}

fn is_not_found(e: &anyhow::Error) -> bool {
    e.chain().any(
        |c| matches!(c.downcast_ref::<kube::Error>(), Some(kube::Error::Api(s)) if s.code == 404),
    )
}

async fn release<K>(api: &Api<K>, name: &str) -> Result<()>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    let Some(obj) = api.get_opt(name).await? else {
        return Ok(());
    };
    let finalizers: Vec<String> = obj
        .meta()
        .finalizers
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|f| f != HOLD_FINALIZER)
        .collect();
    let patch = json!({ "metadata": { "finalizers": finalizers } });
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .with_context(|| format!("releasing {name}"))?;
    Ok(())
}

impl Drop for TestNs {
    /// Deletes the namespace (after releasing anything held by the test
    /// finalizer) and the test's Nodes. Runs on its own thread and runtime:
    /// the test's runtime may be shutting down. `PORTWISE_TEST_KEEP=1` keeps
    /// everything for a post-mortem.
    fn drop(&mut self) {
        if std::env::var("PORTWISE_TEST_KEEP").as_deref() == Ok("1") {
            eprintln!("portwise-tests: keeping namespace {}", self.name);
            return;
        }
        let cp = self.cp;
        let name = self.name.clone();
        let nodes = std::mem::take(&mut *self.nodes.lock().unwrap());
        let worker = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .ok()?;
            rt.block_on(async move {
                let client = cp.client().await.ok()?;
                cleanup(client, &name, &nodes).await.ok()
            })
        });
        // Best effort: wait a little so most cleanups finish, never block long.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !worker.is_finished() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

async fn cleanup(client: Client, ns: &str, nodes: &[String]) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    for p in pods.list(&ListParams::default()).await?.items {
        if p.metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == HOLD_FINALIZER)
        {
            let _ = release(&pods, &p.metadata.name.unwrap_or_default()).await;
        }
    }
    // No kubelet will ever finish a graceful delete of a pod with a
    // nodeName, and the namespace would stay Terminating: delete them now.
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    let _ = pods.delete_collection(&now, &ListParams::default()).await;
    let svcs: Api<Service> = Api::namespaced(client.clone(), ns);
    for s in svcs.list(&ListParams::default()).await?.items {
        if s.metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == HOLD_FINALIZER)
        {
            let _ = release(&svcs, &s.metadata.name.unwrap_or_default()).await;
        }
    }
    let _ = Api::<Namespace>::all(client.clone())
        .delete(ns, &DeleteParams::background())
        .await;
    for n in nodes {
        let _ = Api::<Node>::all(client.clone())
            .delete(n, &DeleteParams::default())
            .await;
    }
    Ok(())
}
