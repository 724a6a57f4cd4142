//! What the shipping tests share: kustomize output split
//! by kind, the Lease, and the apiserver's audit log read per acting user.
//! kubectl, the identities, the seed example and the `portwise` process
//! itself come from the support library (`identity`, `scenario`, `Portwise`).

use std::path::PathBuf;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use portwise_tests::*;

/// The repository root.
pub fn repo() -> PathBuf {
    repo_root()
}

/// `kubectl apply --server-side` of `yaml`, for real.
pub async fn apply(cp: &ControlPlane, yaml: &str) -> Result<()> {
    kubectl(
        cp,
        &[
            "apply",
            "--server-side",
            "--field-manager=portwise-tests",
            "-f",
            "-",
        ],
        Some(yaml),
    )
    .await?;
    Ok(())
}

/// A server-side dry-run apply of `yaml`: fails unless kubectl exits 0 and
/// reports every document as applied; returns kubectl's warnings (stderr).
pub async fn dry_run(cp: &ControlPlane, yaml: &str) -> Result<String> {
    let out = kubectl_as(
        cp,
        cp.kubeconfig(),
        &[
            "apply",
            "--server-side",
            "--dry-run=server",
            "--field-manager=portwise-tests",
            "-f",
            "-",
        ],
        Some(yaml),
    )
    .await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    ensure!(
        out.status.success(),
        "server-side dry-run apply failed ({}):\n{stderr}\n{stdout}",
        out.status
    );
    let applied = stdout
        .lines()
        .filter(|l| l.ends_with("serverside-applied (server dry run)"))
        .count();
    expect_eq(applied, documents(yaml).len())?;
    Ok(stderr)
}

/// `kubectl kustomize DIR` (a path relative to the repository, or absolute).
pub async fn kustomize(cp: &ControlPlane, dir: &str) -> Result<String> {
    kubectl(cp, &["kustomize", dir], None).await
}

/// The documents of a multi-document YAML stream with their `kind`.
pub fn documents(yaml: &str) -> Vec<(String, String)> {
    let mut docs = Vec::new();
    let mut current = String::new();
    let mut flush = |current: &mut String| {
        let kind = current
            .lines()
            .find_map(|l| l.strip_prefix("kind: "))
            .map(|k| k.trim().to_string());
        if let Some(kind) = kind {
            docs.push((kind, std::mem::take(current)));
        }
        current.clear();
    };
    for line in yaml.lines() {
        if line == "---" {
            flush(&mut current);
        } else {
            current.push_str(line);
            current.push('\n');
        }
    }
    flush(&mut current);
    docs
}

/// The documents of `yaml` whose kind is one of `kinds`, as one stream.
pub fn only_kinds(yaml: &str, kinds: &[&str]) -> String {
    documents(yaml)
        .into_iter()
        .filter(|(k, _)| kinds.contains(&k.as_str()))
        .map(|(_, d)| d)
        .collect::<Vec<_>>()
        .join("---\n")
}

// ---- the Lease ----------------------------------------------------------------

/// Whether a Lease holder is the replica started with `--identity id`
/// (portwise appends `_<random>` so two replicas never share a name).
pub fn is_identity(holder: Option<&str>, id: &str) -> bool {
    holder.is_some_and(|h| h == id || h.strip_prefix(id).is_some_and(|r| r.starts_with('_')))
}

/// The Lease's holder; `None` when absent, empty or released.
pub async fn lease_holder(api: &Api<Lease>, name: &str) -> Result<Option<String>> {
    Ok(api
        .get_opt(name)
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty()))
}

// ---- the audit log ------------------------------------------------------------

/// One audited write to an EndpointSlice.
#[derive(Clone, Debug)]
pub struct SliceWrite {
    /// The acting user: the impersonated one if any, else the authenticated one.
    pub user: String,
    pub user_agent: String,
    pub verb: String,
    pub name: String,
    pub code: Option<i64>,
}

/// Reads the control plane's audit log (`DIR/audit.log`) from a mark on.
pub struct AuditMark {
    path: PathBuf,
    offset: u64,
}

impl AuditMark {
    pub fn now(cp: &ControlPlane) -> Result<Self> {
        let path = cp.audit_log().with_context(|| {
            format!(
                "{} has no audit.log: start the control plane with tests/control-plane/start",
                cp.dir().display()
            )
        })?;
        let offset = std::fs::metadata(&path)?.len();
        Ok(Self { path, offset })
    }

    /// Completed writes to EndpointSlices in `namespace` since the mark.
    pub fn slice_writes(&self, namespace: &str) -> Result<Vec<SliceWrite>> {
        use std::io::{BufRead, BufReader, Seek, SeekFrom};
        let mut f = std::fs::File::open(&self.path)?;
        f.seek(SeekFrom::Start(self.offset))?;
        let mut out = Vec::new();
        for line in BufReader::new(f).lines() {
            let Ok(ev) = serde_json::from_str::<serde_json::Value>(&line?) else {
                continue;
            };
            let obj = &ev["objectRef"];
            if ev["stage"] != "ResponseComplete"
                || obj["resource"] != "endpointslices"
                || obj["namespace"] != namespace
            {
                continue;
            }
            let verb = ev["verb"].as_str().unwrap_or_default();
            if !["create", "update", "patch", "delete", "deletecollection"].contains(&verb) {
                continue;
            }
            let user = ev["impersonatedUser"]["username"]
                .as_str()
                .or(ev["user"]["username"].as_str())
                .unwrap_or_default();
            out.push(SliceWrite {
                user: user.to_string(),
                user_agent: ev["userAgent"].as_str().unwrap_or_default().to_string(),
                verb: verb.to_string(),
                name: obj["name"].as_str().unwrap_or_default().to_string(),
                code: ev["responseStatus"]["code"].as_i64(),
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_yaml_documents_by_kind() {
        let y = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: a\n---\napiVersion: v1\nkind: ConfigMap\ndata:\n  x: |\n    kind: Nope\n";
        let docs = documents(y);
        assert_eq!(
            docs.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
            ["Namespace", "ConfigMap"]
        );
        assert_eq!(only_kinds(y, &["Namespace"]).lines().count(), 4);
    }
}
