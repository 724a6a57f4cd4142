//! deploy/kustomize as `kubectl apply -k` takes it: rendered by the control
//! plane's own kubectl, then a server-side dry-run apply on the real
//! apiserver (schemas, defaulting, admission including Pod Security
//! `restricted` on the namespace). Also the WebAssembly example overlay and
//! the legacy-endpoints component.

use anyhow::{Result, ensure};
use portwise_tests::*;

use super::support::*;

/// Every kind the base must hold (issue 5, "Manifests"), with how many.
const BASE_KINDS: &[(&str, usize)] = &[
    ("Namespace", 1),
    ("CustomResourceDefinition", 1),
    ("ServiceAccount", 1),
    ("ClusterRole", 1),
    ("ClusterRoleBinding", 1),
    ("Role", 1),
    ("RoleBinding", 1),
    ("ConfigMap", 2),
    ("Deployment", 1),
    ("Service", 1),
    ("PodDisruptionBudget", 1),
    ("ValidatingAdmissionPolicy", 1),
    ("ValidatingAdmissionPolicyBinding", 1),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kustomize_base_passes_a_server_side_dry_run() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let base = kustomize(cp, "deploy/kustomize").await?;
    let docs = documents(&base);
    for (kind, n) in BASE_KINDS {
        let found = docs.iter().filter(|(k, _)| k == kind).count();
        expect_eq((*kind, found), (*kind, *n))?;
    }
    expect_eq(docs.len(), BASE_KINDS.iter().map(|(_, n)| n).sum::<usize>())?;

    // A dry run cannot create the namespace its objects go into.
    apply(cp, &only_kinds(&base, &["Namespace"])).await?;

    // Control: in this namespace a pod template that breaks Pod Security
    // `restricted` draws a warning on a dry run, so the absence of one for
    // the real Deployment means something.
    let careless = r#"apiVersion: apps/v1
kind: Deployment
metadata: {name: portwise-psa-control, namespace: portwise-system}
spec:
  selector: {matchLabels: {app: psa-control}}
  template:
    metadata: {labels: {app: psa-control}}
    spec:
      containers: [{name: c, image: localhost/portwise:dev}]
"#;
    let warnings = dry_run(cp, careless).await?;
    ensure!(
        warnings.contains("would violate PodSecurity \"restricted:latest\""),
        "no Pod Security warning for a careless Deployment in portwise-system; is the namespace \
         labelled pod-security.kubernetes.io/enforce=restricted? kubectl said: {warnings}"
    );

    let warnings = dry_run(cp, &base).await?;
    ensure!(
        !warnings.contains("PodSecurity"),
        "the base violates Pod Security restricted:\n{warnings}"
    );
    ensure!(
        !warnings.to_lowercase().contains("warning"),
        "the apiserver warned about the base:\n{warnings}"
    );

    // The example overlay: the module lands in binaryData (a .wasm is not
    // UTF-8), and the merged objects still apply. The module is a build
    // product (gitignored in the overlay), so the overlay is copied next to
    // the freshly built guest, as a user would after `guests/build rust`.
    let example = tempfile::Builder::new()
        .prefix("portwise-wasm-overlay-")
        .tempdir()?;
    let source = repo().join("deploy/examples/wasm-overlay");
    let kustomization = std::fs::read_to_string(source.join("kustomization.yaml"))?;
    ensure!(
        kustomization.contains("- ../../kustomize"),
        "the example overlay no longer refers to ../../kustomize:\n{kustomization}"
    );
    std::fs::write(
        example.path().join("kustomization.yaml"),
        kustomization.replace(
            "- ../../kustomize",
            &format!("- {}", root_from(example.path())),
        ),
    )?;
    std::fs::copy(
        source.join("config.yaml"),
        example.path().join("config.yaml"),
    )?;
    let guest = guests_dir().join("admin-check.wasm");
    std::fs::copy(&guest, example.path().join("admin-check.wasm"))
        .map_err(|e| anyhow::anyhow!("{}: {e} (run guests/build rust first)", guest.display()))?;
    let overlay = kustomize(cp, &example.path().to_string_lossy()).await?;
    let modules = documents(&overlay)
        .into_iter()
        .find(|(k, d)| k == "ConfigMap" && d.contains("name: portwise-modules"))
        .map(|(_, d)| d)
        .unwrap_or_default();
    ensure!(
        modules.contains("binaryData:") && modules.contains("admin-check.wasm:"),
        "portwise-modules does not carry admin-check.wasm in binaryData:\n{}",
        modules.chars().take(600).collect::<String>()
    );
    dry_run(cp, &overlay).await?;

    // The legacy-endpoints component on top of the base, from an overlay
    // outside the repository.
    let dir = tempfile::Builder::new()
        .prefix("portwise-legacy-overlay-")
        .tempdir()?;
    let root = root_from(dir.path());
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             resources: [{root}]\ncomponents: [{root}/components/legacy-endpoints]\n"
        ),
    )?;
    let legacy = kustomize(cp, &dir.path().to_string_lossy()).await?;
    let extra = documents(&legacy)
        .into_iter()
        .filter(|(_, d)| d.contains("name: portwise-legacy-endpoints"))
        .count();
    expect_eq(extra, 2)?;
    dry_run(cp, &legacy).await?;
    Ok(())
}

/// The kustomize base as a path relative to `overlay`: kustomize takes only
/// relative paths (from the overlay) to other roots.
fn root_from(overlay: &std::path::Path) -> String {
    let up = "../".repeat(overlay.components().count() - 1);
    format!(
        "{up}{}",
        repo()
            .join("deploy/kustomize")
            .display()
            .to_string()
            .trim_start_matches('/')
    )
}
