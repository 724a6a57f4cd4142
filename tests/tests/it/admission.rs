//! deploy/'s ValidatingAdmissionPolicy (issue 45 item 7; docs/reliability.md
//! 7.18): portwise's token may write only the slices and Endpoints it owns.
//!
//! RBAC alone lets the `portwise` ServiceAccount create, update and delete
//! every EndpointSlice in the cluster, `default/kubernetes`'s included: a
//! guest that escaped its sandbox would inherit that. Under the policy the
//! apiserver refuses each such write, while portwise itself (the real
//! binary, as that ServiceAccount) publishes and cleans up the native
//! controller's leftovers as before.
//!
//! The refused writes are sent with `--dry-run=server`: admission runs, and
//! without the policy they would succeed without changing anything.

use std::path::Path;

use anyhow::{Context, Result, ensure};
use portwise_tests::*;

/// The policy's name, which the apiserver quotes in every refusal.
const POLICY: &str = "portwise-writes-only-its-own";

/// `kubectl` as `kc`, expecting the policy to refuse: returns its message.
async fn refused(
    cp: &ControlPlane,
    kc: &Path,
    args: Vec<String>,
    stdin: Option<&str>,
) -> Result<String> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = kubectl_as(cp, kc, &args, stdin).await?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(
        !out.status.success() && said.contains(POLICY),
        "kubectl {args:?} as portwise was not refused by {POLICY}: {said}"
    );
    Ok(said)
}

/// A slice of Service `web`, or (with no owner) of a Service `apiserver`
/// that no one here manages, as `default/kubernetes`'s is the API
/// server's own.
fn slice_yaml(ns: &str, name: &str, manager: &str, owner: Option<(&str, &str)>) -> String {
    let service = if owner.is_some() { "web" } else { "apiserver" };
    let owner = owner.map_or(String::new(), |(svc, uid)| {
        format!(
            "  ownerReferences:\n  - {{apiVersion: v1, kind: Service, name: {svc}, uid: {uid}, controller: true}}\n"
        )
    });
    format!(
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}\n  namespace: {ns}\n  labels:\n    kubernetes.io/service-name: {service}\n    endpointslice.kubernetes.io/managed-by: {manager}\n{owner}addressType: IPv4\nendpoints: []\nports: []\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portwise_s_token_writes_only_the_slices_it_owns() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "admission").await?;
    // deploy/kustomize's namespace, RBAC and admission policy.
    let kc = portwise_identity(cp).await?;

    // A Service of a test namespace, and slices for it.
    ns.create_service(service("web").annotation(GROUP_KEY, "g").port("http", 8080))
        .await?;
    let uid = kubectl(
        cp,
        &[
            "-n",
            ns.name(),
            "get",
            "service",
            "web",
            "-o",
            "jsonpath={.metadata.uid}",
        ],
        None,
    )
    .await?;
    let apply = ["apply", "--dry-run=server", "-f", "-"];
    let ns_args = |verb: &'static str, kind: &'static str, name: &'static str| {
        vec![
            "-n".to_string(),
            ns.name().to_string(),
            verb.into(),
            kind.into(),
            name.into(),
            "--dry-run=server".into(),
        ]
    };

    // Slices that are not portwise's, as `default/kubernetes`'s is (the
    // API server's, with no owner): made by the admin. A new policy takes
    // a moment to be enforced.
    kubectl(
        cp,
        &["apply", "-f", "-"],
        Some(&slice_yaml(
            ns.name(),
            "unowned",
            "endpointslice-controller.k8s.io",
            None,
        )),
    )
    .await?;
    kubectl(
        cp,
        &["apply", "-f", "-"],
        Some(&slice_yaml(
            ns.name(),
            "others",
            "someone-else",
            Some(("web", &uid)),
        )),
    )
    .await?;
    let legacy = format!(
        "apiVersion: v1\nkind: Endpoints\nmetadata: {{name: legacy, namespace: {}}}\nsubsets: []\n",
        ns.name()
    );
    kubectl(cp, &["apply", "-f", "-"], Some(&legacy)).await?;
    let delete_unowned = ns_args("delete", "endpointslice", "unowned");
    let said = wait_for(SETTLE, || refused(cp, &kc, delete_unowned.clone(), None))
        .await
        .context("deleting a native slice no Service owns")?;
    ensure!(said.contains("endpointslice-controller.k8s.io"), "{said}");
    let said = refused(cp, &kc, ns_args("delete", "endpointslice", "others"), None).await?;
    ensure!(said.contains("managed by someone-else"), "{said}");
    let said = refused(cp, &kc, ns_args("delete", "endpoints", "legacy"), None).await?;
    ensure!(said.contains("managed by nobody it knows"), "{said}");
    let mut relabel = ns_args("label", "endpointslice", "unowned");
    relabel.extend([
        "endpointslice.kubernetes.io/managed-by=portwise".into(),
        "--overwrite".into(),
    ]);
    refused(cp, &kc, relabel, None).await?;
    // portwise's label, but no owning Service: refused.
    let said = refused(
        cp,
        &kc,
        apply.map(String::from).to_vec(),
        Some(&slice_yaml(ns.name(), "web-x", MANAGED_BY, None)),
    )
    .await?;
    ensure!(said.contains("controlled by the Service"), "{said}");
    // Owned, but another manager's label: refused.
    refused(
        cp,
        &kc,
        apply.map(String::from).to_vec(),
        Some(&slice_yaml(
            ns.name(),
            "web-y",
            "someone-else",
            Some(("web", &uid)),
        )),
    )
    .await?;
    // Its own shape is allowed: the policy refuses by what a slice is.
    let out = kubectl_as(
        cp,
        &kc,
        &apply,
        Some(&slice_yaml(
            ns.name(),
            "web-z",
            MANAGED_BY,
            Some(("web", &uid)),
        )),
    )
    .await?;
    ensure!(
        out.status.success(),
        "portwise's own slice was refused: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The native controller's leftover of this Service (as if it had a
    // selector before), owned by it: portwise may delete it.
    let native = slice_yaml(
        ns.name(),
        "web-native",
        "endpointslice-controller.k8s.io",
        Some(("web", &uid)),
    );
    kubectl(cp, &["apply", "-f", "-"], Some(&native)).await?;

    // portwise, the real binary as the ServiceAccount, under the policy.
    let ips = next_ips();
    ns.create_pod(pod("a").annotation(GROUP_KEY, "g").ips(ips.v4()))
        .await?;
    let pw = Portwise::builder(cp)
        .namespace(ns.name())
        .identity(&kc)
        .config(&config("podReady"))
        .start()
        .await?;
    expect_endpoints(&ns, "web", by_port([(("http", V4), &["a"][..])])).await?;
    ns.create_pod(pod("b").annotation(GROUP_KEY, "g").ips(next_ips().v4()))
        .await?;
    expect_endpoints(&ns, "web", by_port([(("http", V4), &["a", "b"][..])])).await?;
    wait_for(SETTLE, || async {
        let left = kubectl(
            cp,
            &[
                "-n",
                ns.name(),
                "get",
                "endpointslice",
                "web-native",
                "--ignore-not-found",
                "-o",
                "name",
            ],
            None,
        )
        .await?;
        ensure!(
            left.trim().is_empty(),
            "the native leftover is still there: {left}"
        );
        Ok(())
    })
    .await
    .context("nativeCleanup under the policy")?;
    let log = pw.current_logs();
    ensure!(
        !log.contains(POLICY),
        "portwise's own writes met the policy:\n{log}"
    );
    Ok(())
}
