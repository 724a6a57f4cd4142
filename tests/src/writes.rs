//! Counting EndpointSlice writes as the apiserver saw them.
//!
//! "A steady state costs zero writes" is a claim about the apiserver, so it
//! is measured there, not in the client. Two sources, best first:
//!
//! * **Audit log** (`<control-plane dir>/audit.log`, one JSON event per
//!   line): filtered by namespace, so parallel tests do not disturb each
//!   other. Used whenever the control plane writes one.
//! * **`apiserver_request_total`** from `/metrics`: global to the apiserver,
//!   so a counter holds a process-wide lock (write-count tests in one binary
//!   run one at a time) and first waits until no namespace is terminating
//!   (namespace cleanup deletes slices). Other test binaries never run at
//!   the same time under `cargo test`. Put write-count tests in their own
//!   file and do not run other suites against the same apiserver meanwhile.

use std::{
    io::{BufRead, BufReader, Seek, SeekFrom},
    path::PathBuf,
    time::Duration,
};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, Client, api::ListParams};
use tokio::sync::{Mutex, MutexGuard};

use crate::TestNs;

/// Audit verbs that change an object.
const AUDIT_WRITE_VERBS: &[&str] = &["create", "update", "patch", "delete", "deletecollection"];
/// `apiserver_request_total` verbs that change an object (APPLY is a
/// server-side-apply PATCH).
const METRIC_WRITE_VERBS: &[&str] = &[
    "APPLY",
    "PATCH",
    "POST",
    "PUT",
    "DELETE",
    "DELETECOLLECTION",
];

static METRICS_LOCK: Mutex<()> = Mutex::const_new(());

/// Counts writes to `endpointslices` from the moment it is created.
pub struct WriteCounter {
    source: Source,
}

enum Source {
    Audit {
        path: PathBuf,
        offset: u64,
        namespace: String,
    },
    Metrics {
        client: Client,
        baseline: u64,
        _serial: MutexGuard<'static, ()>,
    },
}

/// One audited write, for failure messages.
#[derive(Clone, Debug)]
pub struct Write {
    pub verb: String,
    pub name: String,
    pub user_agent: String,
    pub code: Option<i64>,
}

impl WriteCounter {
    /// Fails unless exactly `expected` EndpointSlice writes were counted,
    /// listing them; `what` names the step.
    pub async fn expect(&self, expected: u64, what: &str) -> Result<()> {
        let n = self.count().await?;
        if n != expected {
            bail!(
                "{what}: {n} EndpointSlice writes, expected {expected} (counted from {}): {:#?}",
                self.source(),
                self.writes()?
            );
        }
        Ok(())
    }

    pub async fn start(ns: &TestNs) -> Result<Self> {
        if let Some(path) = ns.cp().audit_log() {
            let offset = std::fs::metadata(&path)?.len();
            return Ok(Self {
                source: Source::Audit {
                    path,
                    offset,
                    namespace: ns.name().to_string(),
                },
            });
        }
        let serial = METRICS_LOCK.lock().await;
        let client = ns.client();
        wait_no_terminating_namespaces(&client).await?;
        let baseline = metrics_writes(&client).await?;
        Ok(Self {
            source: Source::Metrics {
                client,
                baseline,
                _serial: serial,
            },
        })
    }

    /// Where the count comes from, for test output.
    pub fn source(&self) -> &'static str {
        match self.source {
            Source::Audit { .. } => "audit log (this namespace)",
            Source::Metrics { .. } => "apiserver_request_total (whole apiserver)",
        }
    }

    /// Writes since `start`.
    pub async fn count(&self) -> Result<u64> {
        match &self.source {
            Source::Audit { .. } => Ok(self.writes()?.len() as u64),
            Source::Metrics {
                client, baseline, ..
            } => Ok(metrics_writes(client).await?.saturating_sub(*baseline)),
        }
    }

    /// The writes themselves (audit log only; empty with metrics).
    pub fn writes(&self) -> Result<Vec<Write>> {
        let Source::Audit {
            path,
            offset,
            namespace,
        } = &self.source
        else {
            return Ok(Vec::new());
        };
        let mut f = std::fs::File::open(path)?;
        f.seek(SeekFrom::Start(*offset))?;
        let mut out = Vec::new();
        for line in BufReader::new(f).lines() {
            let line = line?;
            let Ok(ev) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            let obj = &ev["objectRef"];
            if obj["resource"] != "endpointslices" || obj["namespace"] != namespace.as_str() {
                continue;
            }
            // One event per request: the completed stage (policies may omit
            // RequestReceived, but never both).
            if ev["stage"] != "ResponseComplete" {
                continue;
            }
            let verb = ev["verb"].as_str().unwrap_or_default();
            if !AUDIT_WRITE_VERBS.contains(&verb) {
                continue;
            }
            out.push(Write {
                verb: verb.to_string(),
                name: obj["name"].as_str().unwrap_or_default().to_string(),
                user_agent: ev["userAgent"].as_str().unwrap_or_default().to_string(),
                code: ev["responseStatus"]["code"].as_i64(),
            });
        }
        Ok(out)
    }
}

async fn metrics_writes(client: &Client) -> Result<u64> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    let text = client
        .request_text(req)
        .await
        .context("reading apiserver /metrics")?;
    Ok(sum_endpointslice_writes(&text))
}

/// Sums `apiserver_request_total` samples for writes to endpointslices.
fn sum_endpointslice_writes(metrics: &str) -> u64 {
    let mut total = 0.0;
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |k: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{k}=\"")))
                .map(|v| v.trim_end_matches('"'))
        };
        if label("resource") != Some("endpointslices") {
            continue;
        }
        if !label("verb").is_some_and(|v| METRIC_WRITE_VERBS.contains(&v)) {
            continue;
        }
        total += value.trim().parse::<f64>().unwrap_or(0.0);
    }
    total as u64
}

async fn wait_no_terminating_namespaces(client: &Client) -> Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    for _ in 0..240 {
        let terminating = api
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|n| n.metadata.deletion_timestamp.is_some())
            .count();
        if terminating == 0 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    bail!("namespaces still terminating after 60s; their cleanup would be counted as writes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_only_endpointslice_writes() {
        let text = r#"# HELP apiserver_request_total x
apiserver_request_total{code="201",component="apiserver",dry_run="",group="discovery.k8s.io",resource="endpointslices",scope="resource",subresource="",verb="POST",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="discovery.k8s.io",resource="endpointslices",scope="resource",subresource="",verb="APPLY",version="v1"} 4
apiserver_request_total{code="200",component="apiserver",dry_run="",group="discovery.k8s.io",resource="endpointslices",scope="namespace",subresource="",verb="LIST",version="v1"} 40
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="PATCH",version="v1"} 9
"#;
        assert_eq!(sum_endpointslice_writes(text), 7);
    }
}
