//! Prometheus' Kubernetes service discovery (`kubernetes_sd_configs`, roles
//! `endpointslice` and `endpoints`) run for real against the suite's
//! control plane, without a Prometheus server:
//! `promtool check service-discovery CONFIG JOB` (promtool built by
//! tests/promtool/build from the `github.com/prometheus/prometheus` module,
//! the one the alert tests use) runs the server's own discovery code for
//! one scrape job, for a fixed time, and prints every target it discovered
//! as JSON, with its labels before relabeling (`discoveredLabels`: the
//! `__address__` and every `__meta_kubernetes_*` label) and after.
//!
//! A run is a snapshot only while the objects hold still: promtool keeps
//! every version of a target group it received during its run (one group
//! per EndpointSlice or Endpoints object), not just the last. The tests therefore call it once
//! portwise has settled, and each call is a fresh discovery.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, ensure};
use serde::Deserialize;

use crate::{ControlPlane, built_tool};

/// How long one discovery runs: promtool waits this long whatever it
/// finds. The informers sync from the local apiserver in well under a
/// second; the margin is for two busy cores.
pub const SD_TIMEOUT: Duration = Duration::from_secs(5);

/// The scrape job's name in the generated config.
const JOB: &str = "portwise";

/// Labels every role that reads a Service's endpoints sets.
pub const ADDRESS: &str = "__address__";
pub const SERVICE_NAME: &str = "__meta_kubernetes_service_name";
pub const POD_NAME: &str = "__meta_kubernetes_pod_name";
pub const CONTAINER_PORT_NUMBER: &str = "__meta_kubernetes_pod_container_port_number";

/// A role of `kubernetes_sd_configs` that reads a Service's endpoints, and
/// the labels it puts on a target made from an endpoint and a port.
#[derive(Clone, Copy, Debug)]
pub struct Role {
    /// `role:` in the config.
    pub name: &'static str,
    /// The port's name: the Service port's.
    pub port_name: &'static str,
    /// `"true"` for a ready endpoint.
    pub ready: &'static str,
    /// The port's number, where the role has a label for it.
    pub port_number: Option<&'static str>,
    /// The slice's address type, where the role has one.
    pub address_type: Option<&'static str>,
}

/// `role: endpointslice` (`discovery/kubernetes/endpointslice.go`).
pub const ENDPOINTSLICE: Role = Role {
    name: "endpointslice",
    port_name: "__meta_kubernetes_endpointslice_port_name",
    ready: "__meta_kubernetes_endpointslice_endpoint_conditions_ready",
    port_number: Some("__meta_kubernetes_endpointslice_port"),
    address_type: Some("__meta_kubernetes_endpointslice_address_type"),
};

/// `role: endpoints` (`discovery/kubernetes/endpoints.go`): v1 Endpoints,
/// which portwise writes only with `publishLegacyEndpoints: true`.
pub const ENDPOINTS: Role = Role {
    name: "endpoints",
    port_name: "__meta_kubernetes_endpoint_port_name",
    ready: "__meta_kubernetes_endpoint_ready",
    port_number: None,
    address_type: None,
};

/// tests/promtool/build: the cached promtool, built if need be.
pub fn promtool_binary() -> Result<PathBuf> {
    built_tool("tests/promtool/build")
}

/// One discovered target.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
pub struct Target {
    /// Its labels before relabeling.
    #[serde(rename = "discoveredLabels")]
    pub discovered: BTreeMap<String, String>,
    /// After the job's `relabel_configs`: empty when they drop it.
    #[serde(rename = "labels")]
    pub relabeled: BTreeMap<String, String>,
}

impl Target {
    /// A label before relabeling.
    pub fn get(&self, label: &str) -> Option<&str> {
        self.discovered.get(label).map(String::as_str)
    }

    /// `__address__` (`ip:port`, `[ip6]:port`) before relabeling.
    pub fn address(&self) -> &str {
        self.get(ADDRESS).unwrap_or_default()
    }

    /// The address Prometheus would scrape, unless relabeling dropped it.
    pub fn scraped(&self) -> Option<&str> {
        self.relabeled.get(ADDRESS).map(String::as_str)
    }
}

/// Runs `kubernetes_sd_configs` with `role` on `namespace` of `cp` for
/// [`SD_TIMEOUT`], in a job with these `relabel_configs` (a JSON list, as
/// Prometheus' YAML spells them; `[]` for none), and returns what it
/// discovered, sorted.
pub async fn discover(
    cp: &ControlPlane,
    namespace: &str,
    role: Role,
    relabel_configs: &serde_json::Value,
) -> Result<Vec<Target>> {
    let bin = tokio::task::spawn_blocking(promtool_binary).await??;
    let dir = tempfile::Builder::new().prefix("promtool-sd-").tempdir()?;
    let config = dir.path().join("prometheus.yml");
    // JSON strings are YAML strings: the paths and names need no escaping.
    std::fs::write(
        &config,
        format!(
            "scrape_configs:\n\
             \x20 - job_name: {JOB}\n\
             \x20   kubernetes_sd_configs:\n\
             \x20     - role: {role}\n\
             \x20       kubeconfig_file: {kubeconfig}\n\
             \x20       namespaces:\n\
             \x20         names: [{namespace}]\n\
             \x20   relabel_configs: {relabel_configs}\n",
            kubeconfig = serde_json::to_string(&cp.kubeconfig())?,
            namespace = serde_json::to_string(namespace)?,
            role = role.name,
        ),
    )?;
    let started = Instant::now();
    let out = tokio::process::Command::new(&bin)
        .arg("check")
        .arg("service-discovery")
        .arg(format!("--timeout={}s", SD_TIMEOUT.as_secs()))
        .arg(&config)
        .arg(JOB)
        .current_dir(dir.path())
        .kill_on_drop(true)
        .output()
        .await
        .with_context(|| format!("running {}", bin.display()))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.success(),
        "promtool check service-discovery failed ({}):\n{stderr}",
        out.status
    );
    let mut targets: Vec<Target> = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "promtool's output is not the JSON expected:\n{}\nstderr:\n{stderr}",
            String::from_utf8_lossy(&out.stdout)
        )
    })?;
    targets.sort();
    tracing::debug!(
        role = role.name,
        took_ms = started.elapsed().as_millis() as u64,
        targets = targets.len(),
        "promtool check service-discovery"
    );
    Ok(targets)
}
