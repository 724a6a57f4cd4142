//! What portwise sends against what the apiserver stores.
//!
//! portwise is compiled against one Kubernetes API (k8s-openapi's newest
//! feature) and runs against older apiservers too. A field an older server
//! does not know is dropped from a create or update (a warning the client
//! never shows), a field it knows but keeps behind a feature gate that is
//! off is cleared, and a value it does not accept is refused. So the check
//! is made where it shows: the control plane's audit policy
//! (tests/control-plane/start) records the request and the response body of
//! every EndpointSlice, Endpoints, Event and Lease write in the namespace
//! [`WIRE_NS`], and [`wire_differences`] compares them field by field. It
//! knows no field names: whatever portwise puts in a body must come back
//! with the same value, on every minor the matrix runs.

use std::{
    io::{BufRead, BufReader},
    sync::Mutex,
    time::Duration,
};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams};
use serde_json::Value;

use crate::{ControlPlane, TestNs};

/// The one namespace whose writes the audit log records with their bodies.
pub const WIRE_NS: &str = "portwise-wire";

/// Metadata the apiserver sets or rewrites on every write: not a field
/// portwise asks to be stored.
const SERVER_SET: &[&str] = &[
    "resourceVersion",
    "managedFields",
    "generation",
    "creationTimestamp",
    "uid",
];

/// The `Warning` headers the apiserver sent to this process's clients, by
/// user agent. The audit log shows a create or update as decoded, so a
/// field the server does not know is already gone from its request body
/// there; the warning (`unknown field "…"`) is where that drop shows.
static WARNINGS: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

pub(crate) fn keep_warnings(agent: &str, headers: &http::HeaderMap) {
    let found: Vec<(String, String)> = headers
        .get_all(http::header::WARNING)
        .iter()
        .map(|w| {
            (
                agent.to_string(),
                String::from_utf8_lossy(w.as_bytes()).into_owned(),
            )
        })
        .collect();
    if !found.is_empty() {
        WARNINGS.lock().unwrap().extend(found);
    }
}

/// The warnings the apiserver sent to clients whose user agent is `agent`.
pub fn warnings_to(agent: &str) -> Vec<String> {
    WARNINGS
        .lock()
        .unwrap()
        .iter()
        .filter(|(a, _)| a == agent)
        .map(|(_, w)| w.clone())
        .collect()
}

/// Warnings about a field of a body: a field the server does not know, or
/// one it read twice (the apiserver's strict-decoding warnings, which it
/// sends whatever `fieldValidation` asks; any other warning, a deprecated
/// API's say, is not about what portwise sends).
pub fn field_warnings(warnings: &[String]) -> Vec<String> {
    warnings
        .iter()
        .filter(|w| w.contains("unknown field") || w.contains("duplicate field"))
        .cloned()
        .collect()
}

/// One write portwise made in [`WIRE_NS`], as the audit log holds it.
#[derive(Debug)]
pub struct WireWrite {
    pub verb: String,
    pub resource: String,
    pub name: String,
    pub code: i64,
    /// Fields sent and not stored as sent: `path: sent V, stored W`.
    pub differences: Vec<String>,
}

/// The namespace [`WIRE_NS`] on `cp`, new: one left by an earlier test on
/// the same control plane is deleted first.
pub async fn wire_namespace(cp: &'static ControlPlane) -> Result<TestNs> {
    let namespaces: Api<Namespace> = Api::all(cp.client().await?);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while namespaces.get_opt(WIRE_NS).await?.is_some() {
        let _ = namespaces.delete(WIRE_NS, &DeleteParams::default()).await;
        if tokio::time::Instant::now() > deadline {
            bail!("namespace {WIRE_NS} from an earlier run is still there after 90 s");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    TestNs::exact(cp, WIRE_NS).await
}

/// Every write by a user agent starting with `agent` in [`WIRE_NS`], with
/// what of its request body the response did not hold.
pub fn wire_writes(cp: &ControlPlane, agent: &str) -> Result<Vec<WireWrite>> {
    let Some(path) = cp.audit_log() else {
        bail!(
            "the control plane in {} writes no audit log",
            cp.dir().display()
        );
    };
    let file = std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let mut writes = Vec::new();
    for line in BufReader::new(file).lines() {
        let line = line?;
        let Ok(ev) = serde_json::from_str::<Value>(&line) else {
            continue; // a line being written
        };
        let obj = &ev["objectRef"];
        if obj["namespace"] != WIRE_NS
            || ev["stage"] != "ResponseComplete"
            || !ev["userAgent"]
                .as_str()
                .is_some_and(|a| a.starts_with(agent))
        {
            continue;
        }
        let mut differences = Vec::new();
        let code = ev["responseStatus"]["code"].as_i64().unwrap_or_default();
        if (200..300).contains(&code) {
            compare(
                "",
                &ev["requestObject"],
                &ev["responseObject"],
                &mut differences,
            );
        }
        writes.push(WireWrite {
            verb: ev["verb"].as_str().unwrap_or_default().into(),
            resource: obj["resource"].as_str().unwrap_or_default().into(),
            name: obj["name"].as_str().unwrap_or_default().into(),
            code,
            differences,
        });
    }
    Ok(writes)
}

/// Every write of `writes` that was refused or not stored as sent, one line
/// each; conflicts (409) are portwise's to retry, not a field's fault.
pub fn wire_differences(writes: &[WireWrite]) -> Vec<String> {
    writes
        .iter()
        .filter(|w| !w.differences.is_empty() || (w.code >= 300 && w.code != 409))
        .map(|w| {
            format!(
                "{} {} {} ({}): {}",
                w.verb,
                w.resource,
                w.name,
                w.code,
                if w.differences.is_empty() {
                    "refused".to_string()
                } else {
                    w.differences.join("; ")
                }
            )
        })
        .collect()
}

/// Adds to `out` each leaf of `sent` that `stored` does not hold with the
/// same value. Lists are compared item by item (the apiserver keeps their
/// order); what the server adds (defaults, its own metadata) is not a
/// difference.
fn compare(path: &str, sent: &Value, stored: &Value, out: &mut Vec<String>) {
    match (sent, stored) {
        (Value::Object(s), Value::Object(t)) => {
            for (k, v) in s {
                if path == ".metadata" && SERVER_SET.contains(&k.as_str()) {
                    continue;
                }
                let p = format!("{path}.{k}");
                match t.get(k) {
                    Some(w) => compare(&p, v, w, out),
                    None if v.is_null() => {}
                    None => out.push(format!("{p}: sent {v}, not stored")),
                }
            }
        }
        (Value::Array(s), Value::Array(t)) if s.len() == t.len() => {
            for (i, (v, w)) in s.iter().zip(t).enumerate() {
                compare(&format!("{path}[{i}]"), v, w, out);
            }
        }
        _ if sent == stored => {}
        _ => out.push(format!("{path}: sent {sent}, stored {stored}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_field_dropped_or_changed_is_a_difference_and_a_default_is_not() {
        let sent = json!({
            "metadata": {"name": "s", "resourceVersion": "1"},
            "endpoints": [{"addresses": ["10.0.0.1"], "hints": {"forZones": [{"name": "a"}], "forNodes": [{"name": "n"}]}}],
            "ports": [{"name": "http", "port": 80}],
        });
        let stored = json!({
            "metadata": {"name": "s", "resourceVersion": "7", "uid": "u"},
            "endpoints": [{"addresses": ["10.0.0.1"], "hints": {"forZones": [{"name": "a"}]}}],
            "ports": [{"name": "http", "port": 81, "protocol": "TCP"}],
        });
        let mut out = Vec::new();
        compare("", &sent, &stored, &mut out);
        assert_eq!(
            out,
            [
                ".endpoints[0].hints.forNodes: sent [{\"name\":\"n\"}], not stored",
                ".ports[0].port: sent 80, stored 81",
            ]
        );
        let mut none = Vec::new();
        compare("", &sent, &sent, &mut none);
        assert!(none.is_empty(), "{none:?}");
    }
}
