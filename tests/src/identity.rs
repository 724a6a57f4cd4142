//! Who portwise (or a test) acts as: kubectl of the control plane, and the
//! kubeconfigs for identities other than the admin one.
//!
//! Every kubeconfig a test writes comes from [`kubeconfig_variant`] (a copy
//! of the admin kubeconfig, changed) or, where no control plane exists, from
//! [`unreachable_kubeconfig`]; both go through [`write_kubeconfig`].

use std::{
    path::{Path, PathBuf},
    process::{Output, Stdio},
    time::Duration,
};

use anyhow::{Context, Result, ensure};
use kube::config::{
    AuthInfo, Cluster, Context as KubeContext, Kubeconfig, NamedAuthInfo, NamedCluster,
    NamedContext,
};
use tokio::io::AsyncWriteExt;

use crate::{ControlPlane, control_plane::repo_root};

/// The user portwise runs as with deploy/'s RBAC (deploy/kustomize/rbac.yaml).
pub const PORTWISE_USER: &str = "system:serviceaccount:portwise-system:portwise";

// ---- kubectl ----------------------------------------------------------------

/// `DIR/bin/kubectl` of the control plane: `kubeconfig` as the identity,
/// the repository as working directory, `stdin` fed if given. Returns the
/// output whatever the exit status.
pub async fn kubectl_as(
    cp: &ControlPlane,
    kubeconfig: &Path,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<Output> {
    let bin = cp.dir().join("bin/kubectl");
    ensure!(
        bin.exists(),
        "{} does not exist: is PORTWISE_TEST_CP_DIR a control plane started by tests/control-plane/start?",
        bin.display()
    );
    let mut child = tokio::process::Command::new(&bin)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .current_dir(repo_root())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("running {}", bin.display()))?;
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().expect("piped");
        pipe.write_all(input.as_bytes()).await?;
        drop(pipe);
    }
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .with_context(|| format!("kubectl {args:?} did not finish within 60s"))??;
    Ok(out)
}

/// Applies the CustomResourceDefinitions in `crds` (a file or folder)
/// and waits until the apiserver serves them; `what` names them in errors.
pub async fn install_crds(cp: &ControlPlane, crds: &std::path::Path, what: &str) -> Result<()> {
    let crds = crds.to_string_lossy();
    kubectl(
        cp,
        &["apply", "--server-side", "--force-conflicts", "-f", &crds],
        None,
    )
    .await
    .with_context(|| format!("applying {what}"))?;
    kubectl(
        cp,
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "-f",
            &crds,
        ],
        None,
    )
    .await
    .with_context(|| format!("waiting for {what}"))?;
    Ok(())
}

/// kubectl as admin; fails unless it exits 0. Returns stdout.
pub async fn kubectl(cp: &ControlPlane, args: &[&str], stdin: Option<&str>) -> Result<String> {
    let out = kubectl_as(cp, cp.kubeconfig(), args, stdin).await?;
    ensure!(
        out.status.success(),
        "kubectl {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

// ---- kubeconfigs --------------------------------------------------------------

/// Writes `kc` to `path` as JSON (which every kubeconfig reader takes as
/// YAML). The one place a test writes a kubeconfig.
pub fn write_kubeconfig(kc: &Kubeconfig, path: &Path) -> Result<PathBuf> {
    std::fs::write(path, serde_json::to_vec_pretty(kc)?)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(path.to_path_buf())
}

/// Writes a copy of the admin kubeconfig, changed by `edit`, to `path`.
pub fn kubeconfig_variant(
    cp: &ControlPlane,
    path: &Path,
    edit: impl FnOnce(&mut Kubeconfig),
) -> Result<PathBuf> {
    let mut kc = Kubeconfig::read_from(cp.kubeconfig())?;
    edit(&mut kc);
    write_kubeconfig(&kc, path)
}

/// A kubeconfig that acts as `user` in `groups` (impersonation by the admin
/// identity): the audit log then records `user` as the acting user.
pub fn impersonating(
    cp: &ControlPlane,
    path: &Path,
    user: &str,
    groups: &[&str],
) -> Result<PathBuf> {
    kubeconfig_variant(cp, path, |kc| {
        for a in &mut kc.auth_infos {
            if let Some(info) = a.auth_info.as_mut() {
                info.impersonate = Some(user.to_string());
                info.impersonate_groups = Some(groups.iter().map(|g| g.to_string()).collect());
            }
        }
    })
}

/// A kubeconfig that authenticates with `token` only (no client
/// certificate), trusting the control plane's CA.
pub fn token_kubeconfig(cp: &ControlPlane, path: &Path, token: &str) -> Result<PathBuf> {
    kubeconfig_variant(cp, path, |kc| {
        for a in &mut kc.auth_infos {
            a.auth_info = Some(token_auth(token));
        }
    })
}

/// A kubeconfig for an apiserver that is not there (`127.0.0.1:1`), so
/// that whatever needs the cluster fails at once.
pub fn unreachable_kubeconfig(path: &Path) -> Result<PathBuf> {
    let kc = Kubeconfig {
        clusters: vec![NamedCluster {
            name: "none".into(),
            cluster: Some(Cluster {
                server: Some("https://127.0.0.1:1".into()),
                insecure_skip_tls_verify: Some(true),
                ..Default::default()
            }),
            other: Default::default(),
        }],
        auth_infos: vec![NamedAuthInfo {
            name: "none".into(),
            auth_info: Some(token_auth("none")),
            other: Default::default(),
        }],
        contexts: vec![NamedContext {
            name: "none".into(),
            context: Some(KubeContext {
                cluster: "none".into(),
                user: Some("none".into()),
                ..Default::default()
            }),
            other: Default::default(),
        }],
        current_context: Some("none".into()),
        kind: Some("Config".into()),
        api_version: Some("v1".into()),
        ..Default::default()
    };
    write_kubeconfig(&kc, path)
}

fn token_auth(token: &str) -> AuthInfo {
    AuthInfo {
        token: Some(token.trim().to_string().into()),
        ..Default::default()
    }
}

/// `kubectl create token` for ServiceAccount `namespace/name`.
pub async fn service_account_token(
    cp: &ControlPlane,
    namespace: &str,
    name: &str,
    duration: &str,
) -> Result<String> {
    let duration = format!("--duration={duration}");
    let token = kubectl(
        cp,
        &["-n", namespace, "create", "token", name, &duration],
        None,
    )
    .await?;
    Ok(token.trim().to_string())
}

/// Installs deploy/'s namespace, least-privilege RBAC and admission policy
/// (what that token may write), and writes a kubeconfig for the `portwise`
/// ServiceAccount (a 2h token) in the control plane's directory.
/// Idempotent.
///
/// Faults must hit portwise as a non-admin: `system:masters` is exempt from
/// the apiserver's inflight limits, and its requests are the only ones the
/// audit policy of an isolated control plane records in full.
pub async fn portwise_identity(cp: &ControlPlane) -> Result<PathBuf> {
    kubectl(
        cp,
        // Server-side, as the manifests' dry runs (tests/it/ship) apply
        // them: one field manager, so those never conflict with these.
        &[
            "apply",
            "--server-side",
            "--field-manager=portwise-tests",
            "-f",
            "deploy/kustomize/namespace.yaml",
            "-f",
            "deploy/kustomize/rbac.yaml",
            "-f",
            "deploy/kustomize/admission-policy.yaml",
        ],
        None,
    )
    .await?;
    let token = service_account_token(cp, "portwise-system", "portwise", "2h").await?;
    token_kubeconfig(cp, &cp.dir().join("portwise-sa.kubeconfig"), &token)
}
