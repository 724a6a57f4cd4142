//! Installing portwise the documented ways, on a real node: Helm and
//! kustomize each reach 2/2 Ready replicas with one leader, under the
//! chart's restricted security context and a real projected token.

use anyhow::{Result, ensure};
use portwise_tests::node::RealNode;

use crate::support::*;

/// The trap the Helm docs once contained: `--set namespace.create=true`
/// without `--create-namespace` cannot work, because Helm writes its
/// release Secret into the namespace before it applies the chart. The
/// documented command (`--create-namespace`, then label the namespace for
/// Pod Security) installs, and the pods run under the chart's restricted
/// security context, which the labelled namespace then enforces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_with_create_namespace_runs_two_replicas_and_one_leader() -> Result<()> {
    let node = RealNode::shared().await?;
    // The chart's default image, the released one, is this run's build
    // (tests/node/start tags it so).
    let image = node.released_image()?;
    let version = env!("CARGO_PKG_VERSION");
    ensure!(
        image == format!("ghcr.io/portwise/portwise:{version}"),
        "the chart's default image is ghcr.io/portwise/portwise:{version}, the node has {image}"
    );

    node.helm(&[
        "uninstall",
        "portwise",
        "-n",
        SYSTEM_NS,
        "--ignore-not-found",
        "--wait",
    ])?;
    delete_namespace(node, SYSTEM_NS)?;
    let trap = node.helm_output(&[
        "install",
        "portwise",
        "deploy/helm",
        "-n",
        SYSTEM_NS,
        "--set",
        "namespace.create=true",
    ])?;
    let stderr = String::from_utf8_lossy(&trap.stderr);
    ensure!(
        !trap.status.success() && stderr.contains(&format!("namespaces \"{SYSTEM_NS}\" not found")),
        "helm install --set namespace.create=true without --create-namespace: expected Helm's \
         'namespaces \"{SYSTEM_NS}\" not found', got {}: {stderr}",
        trap.status
    );
    let left = node.kubectl(&[
        "get",
        "namespace",
        SYSTEM_NS,
        "--ignore-not-found",
        "-o",
        "name",
    ])?;
    ensure!(left.trim().is_empty(), "the failed install left {left}");

    helm_install(node, "portwise", &[])?;
    // The documented next step: enforce Pod Security on the namespace. The
    // label is admitted only when the running pods already comply
    // (kubectl prints a warning naming each pod that would not).
    let labelled = node.kubectl_output(&[
        "label",
        "namespace",
        SYSTEM_NS,
        "pod-security.kubernetes.io/enforce=restricted",
    ])?;
    let warn = String::from_utf8_lossy(&labelled.stderr);
    ensure!(
        labelled.status.success() && !warn.contains("violate"),
        "labelling {SYSTEM_NS} restricted: {warn}"
    );
    let (ready, leader) = two_ready_one_leader(node, "portwise").await?;

    // Each replica authenticates with its own projected token: the
    // apiserver saw the ServiceAccount, not an admin.
    let sa = node.kubectl(&[
        "-n", SYSTEM_NS, "get", "pod", &ready[0], "-o",
        "jsonpath={.spec.serviceAccountName} {.spec.volumes[*].projected.sources[*].serviceAccountToken.path}",
    ])?;
    ensure!(
        sa == "portwise token",
        "pod {}: service account and projected token: {sa:?}",
        ready[0]
    );
    let ok = node.kubectl(&[
        "auth",
        "can-i",
        "patch",
        "endpointslices",
        "--as",
        "system:serviceaccount:portwise-system:portwise",
        "-n",
        "default",
    ])?;
    ensure!(
        ok.trim() == "yes",
        "the chart's ServiceAccount cannot patch endpointslices: {ok}"
    );
    let logs = node.kubectl(&["-n", SYSTEM_NS, "logs", &leader])?;
    ensure!(
        logs.contains("caches synced"),
        "the leader's log shows no cache sync:\n{logs}"
    );

    helm_uninstall(node, "portwise")?;
    Ok(())
}

/// The one-command install: `--create-namespace --set namespace.create=true`.
/// Helm creates the namespace, then takes it over from the chart and
/// labels it for Pod Security. The chart keeps it on `helm uninstall`
/// (`helm.sh/resource-policy: keep`): before that, the uninstall deleted
/// the namespace with Helm's own release records in it and failed with
/// "Failed to purge the release: release: not found".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_can_create_and_label_the_namespace_and_uninstall_cleanly() -> Result<()> {
    let node = RealNode::shared().await?;
    node.portwise_image()?;
    delete_namespace(node, SYSTEM_NS)?;
    helm_install(node, "portwise", &["--set", "namespace.create=true"])?;
    let enforce = || {
        node.kubectl(&[
            "get",
            "namespace",
            SYSTEM_NS,
            "-o",
            r#"jsonpath={.metadata.labels.pod-security\.kubernetes\.io/enforce}"#,
        ])
    };
    ensure!(
        enforce()? == "restricted",
        "the chart's namespace enforces {:?}",
        enforce()?
    );
    two_ready_one_leader(node, "portwise").await?;
    let out = node.helm_output(&[
        "uninstall",
        "portwise",
        "-n",
        SYSTEM_NS,
        "--wait",
        "--timeout",
        "2m",
    ])?;
    ensure!(
        out.status.success(),
        "helm uninstall of a release that created its namespace: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        enforce()? == "restricted",
        "helm uninstall did not keep the namespace"
    );
    delete_namespace(node, SYSTEM_NS)?;
    Ok(())
}

/// `kubectl apply --server-side -k deploy/kustomize`, as docs/operations.md
/// says (a modules ConfigMap outgrows a client-side apply): the base
/// creates and labels its namespace itself, and reaches the same 2/2 with
/// one leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kustomize_base_installs_with_kubectl_apply_k() -> Result<()> {
    let node = RealNode::shared().await?;
    node.portwise_image()?;
    delete_namespace(node, SYSTEM_NS)?;
    node.kubectl(&["apply", "--server-side", "-k", "deploy/kustomize"])?;
    node.kubectl(&[
        "-n",
        SYSTEM_NS,
        "rollout",
        "status",
        "deployment/portwise",
        "--timeout=120s",
    ])?;
    let enforce = node.kubectl(&[
        "get",
        "namespace",
        SYSTEM_NS,
        "-o",
        r#"jsonpath={.metadata.labels.pod-security\.kubernetes\.io/enforce}"#,
    ])?;
    ensure!(
        enforce == "restricted",
        "the base's namespace enforces {enforce:?}"
    );
    two_ready_one_leader(node, "portwise").await?;
    node.kubectl(&[
        "delete",
        "-k",
        "deploy/kustomize",
        "--wait=true",
        "--timeout=120s",
    ])?;
    Ok(())
}
