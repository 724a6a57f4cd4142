//! portwise as the ServiceAccount deploy/kustomize creates, with exactly the
//! RBAC the base grants (applied for real) and a token from the
//! TokenRequest API: it does its whole job (slices, native cleanup, Events,
//! the Lease), every write the apiserver records is the ServiceAccount's,
//! and what it does not need it cannot do.

use std::time::Instant;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::{coordination::v1::Lease, discovery::v1::EndpointSlice};
use kube::{Api, api::PostParams};
use portwise_tests::*;
use serde_json::json;

use super::support::*;

const RBAC_KINDS: &[&str] = &[
    "Namespace",
    // So that `auth can-i` knows the resource it is asked about.
    "CustomResourceDefinition",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
];

/// `kubectl auth can-i ARGS --as=SA`: "yes" or "no".
async fn can_i(cp: &ControlPlane, args: &[&str]) -> Result<String> {
    let mut full = vec!["auth", "can-i"];
    full.extend_from_slice(args);
    let as_sa = format!("--as={PORTWISE_USER}");
    full.push(&as_sa);
    let out = kubectl_as(cp, cp.kubeconfig(), &full, None).await?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_as_its_service_account_and_can_do_nothing_more() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "ship-sa").await?;
    let n = ns.name();

    // The base's RBAC (and namespace), as rendered, applied for real.
    let base = kustomize(cp, "deploy/kustomize").await?;
    apply(cp, &only_kinds(&base, RBAC_KINDS)).await?;
    // The legacy-endpoints component is not part of the base.
    kubectl(
        cp,
        &[
            "delete",
            "clusterrolebinding",
            "portwise-legacy-endpoints",
            "--ignore-not-found",
        ],
        None,
    )
    .await?;

    // What it needs: yes. What it does not: no (asked of the authorizer).
    for args in [
        vec!["list", "pods"],
        vec!["watch", "services"],
        vec!["get", "nodes"],
        vec!["create", "endpointslices.discovery.k8s.io", "-n", n],
        vec!["update", "endpointslices.discovery.k8s.io", "-n", n],
        vec!["patch", "endpointslices.discovery.k8s.io", "-n", n],
        vec!["delete", "endpointslices.discovery.k8s.io", "-n", n],
        vec!["delete", "endpoints", "-n", n],
        vec!["create", "events.events.k8s.io", "-n", n],
        vec![
            "create",
            "leases.coordination.k8s.io",
            "-n",
            "portwise-system",
        ],
        vec![
            "update",
            "leases.coordination.k8s.io/portwise",
            "-n",
            "portwise-system",
        ],
        // For the MembershipPolicy controller to come (issue 48).
        vec!["watch", "membershippolicies.portwise.io"],
        vec![
            "patch",
            "membershippolicies.portwise.io",
            "--subresource=status",
            "-n",
            n,
        ],
    ] {
        expect_eq(
            (args.join(" "), can_i(cp, &args).await?),
            (args.join(" "), "yes".into()),
        )?;
    }
    for args in [
        vec!["update", "services", "-n", n],
        vec!["patch", "services", "-n", n],
        vec!["patch", "pods", "-n", n],
        vec!["delete", "pods", "-n", n],
        vec!["get", "secrets", "-n", n],
        vec!["list", "secrets", "-n", "portwise-system"],
        vec!["create", "endpoints", "-n", n],
        vec!["update", "endpoints", "-n", n],
        vec!["create", "events", "-n", n],
        vec![
            "update",
            "leases.coordination.k8s.io/other",
            "-n",
            "portwise-system",
        ],
        vec!["create", "leases.coordination.k8s.io", "-n", n],
        vec!["create", "configmaps", "-n", "portwise-system"],
        vec!["update", "nodes"],
        // Policies are the teams': portwise writes only their status.
        vec!["create", "membershippolicies.portwise.io", "-n", n],
        vec!["patch", "membershippolicies.portwise.io", "-n", n],
        vec!["delete", "membershippolicies.portwise.io", "-n", n],
        vec![
            "update",
            "membershippolicies.portwise.io",
            "--subresource=status",
            "-n",
            n,
        ],
        vec![
            "create",
            "serviceaccounts",
            "--subresource=token",
            "-n",
            "portwise-system",
        ],
    ] {
        expect_eq(
            (args.join(" "), can_i(cp, &args).await?),
            (args.join(" "), "no".into()),
        )?;
    }

    // Its own credentials: a token for the ServiceAccount.
    let token = service_account_token(cp, "portwise-system", "portwise", "1h").await?;
    let dir = tempfile::Builder::new().prefix("portwise-sa-").tempdir()?;
    let sa_kubeconfig = token_kubeconfig(cp, &dir.path().join("kubeconfig"), &token)?;
    let whoami = kubectl_as(
        cp,
        &sa_kubeconfig,
        &[
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ],
        None,
    )
    .await?;
    expect_eq(
        String::from_utf8_lossy(&whoami.stdout).trim(),
        PORTWISE_USER,
    )?;

    seed_scenario(&ns).create().await?;
    // Denied for real with its token, not only per can-i.
    for args in [
        vec!["get", "secrets", "-n", n],
        vec!["annotate", "service", "my-service", "-n", n, "x=y"],
        vec!["label", "pod", "a", "-n", n, "x=y"],
        vec!["create", "configmap", "x", "-n", n],
    ] {
        let out = kubectl_as(cp, &sa_kubeconfig, &args, None).await?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success() && stderr.to_lowercase().contains("forbidden"),
            "kubectl {args:?} as the ServiceAccount was not forbidden: {} {stderr}",
            out.status
        );
    }

    // A leftover of the native controller for the (selector-less) Service,
    // owned by it as the native controller's slices are: native cleanup
    // must delete it once portwise publishes (deploy/'s admission policy
    // lets portwise delete no native slice without its Service as owner).
    let uid = ns
        .api::<k8s_openapi::api::core::v1::Service>()
        .get("my-service")
        .await?
        .metadata
        .uid
        .context("the Service's uid")?;
    let native: EndpointSlice = serde_json::from_value(json!({
        "metadata": { "name": "my-service-native", "labels": {
            SERVICE_NAME_LABEL: "my-service", MANAGED_BY_LABEL: NATIVE_MANAGER },
            "ownerReferences": [{ "apiVersion": "v1", "kind": "Service", "name": "my-service",
                "uid": uid, "controller": true, "blockOwnerDeletion": true }] },
        "addressType": "IPv4",
        "ports": [{ "name": "http", "port": 8080, "protocol": "TCP" }],
        "endpoints": [{ "addresses": [next_ips().v4.to_string()] }],
    }))?;
    ns.api::<EndpointSlice>()
        .create(&PostParams::default(), &native)
        .await?;

    // Production timings (15 s): start from no holder so it leads at once.
    let leases: Api<Lease> = Api::namespaced(ns.client(), "portwise-system");
    let _ = leases.delete("portwise", &Default::default()).await;

    let audit = AuditMark::now(cp)?;
    let started = Instant::now();
    let mut pw = Portwise::builder(cp)
        .name("portwise-sa")
        .namespace(n)
        .config(&config(SEED_MEMBERSHIP))
        .identity(&sa_kubeconfig)
        .args(&[
            "--leader-elect",
            "--lease-namespace",
            "portwise-system",
            "--identity",
            "ship-sa",
        ])
        .start()
        .await?;
    expect_seed(&ns, &["a", "b", "c"], &["b", "c", "d"]).await?;
    println!(
        "as the ServiceAccount: seed published {:.2}s after start",
        started.elapsed().as_secs_f64()
    );
    wait_for(SETTLE, || async {
        let left = slices_managed_by(&ns, "my-service", Some(NATIVE_MANAGER)).await?;
        ensure!(left.is_empty(), "native slices left: {}", left.len());
        let events = events_for(&ns, "my-service", Some("NativeEndpointsCleanedUp")).await?;
        ensure!(
            !events.is_empty(),
            "no NativeEndpointsCleanedUp Event on my-service"
        );
        Ok(())
    })
    .await?;
    let event = events_for(&ns, "my-service", Some("NativeEndpointsCleanedUp"))
        .await?
        .remove(0);
    let note = event.message.unwrap_or_default();
    ensure!(note.contains("my-service-native"), "Event note: {note}");
    let holder = lease_holder(&leases, "portwise").await?;
    ensure!(
        is_identity(holder.as_deref(), "ship-sa"),
        "Lease holder {holder:?}"
    );

    // A change after the start is followed too.
    ns.set_ready("b", false).await?;
    expect_seed(&ns, &["a", "c"], &["c", "d"]).await?;
    pw.wait_ready().await?;
    pw.check_running()?;

    // Every slice write in the namespace since the start was the
    // ServiceAccount's, and none was refused.
    let writes = audit.slice_writes(n)?;
    let creates = writes.iter().filter(|w| w.verb != "delete").count();
    ensure!(
        creates >= 2,
        "expected the ServiceAccount's slice writes, audit shows {writes:?}"
    );
    ensure!(
        writes
            .iter()
            .any(|w| w.verb == "delete" && w.name == "my-service-native"),
        "the native slice's delete is not in the audit log: {writes:?}"
    );
    for w in &writes {
        ensure!(
            w.user == PORTWISE_USER,
            "a slice write not made by the ServiceAccount: {w:?}"
        );
        ensure!(
            matches!(w.code, Some(200..=299)),
            "a refused slice write: {w:?}"
        );
        ensure!(w.user_agent.starts_with("portwise/"), "User-Agent: {w:?}");
    }
    let logs = pw.logs();
    ensure!(
        !logs.contains("forbidden") && !logs.contains("Forbidden"),
        "portwise ran into RBAC denials:\n{logs}"
    );

    // SIGTERM: exit 0, the Lease released.
    let took = pw.stop().await?;
    println!(
        "as the ServiceAccount: SIGTERM → exit 0 in {:.2}s",
        took.as_secs_f64()
    );
    expect_eq(lease_holder(&leases, "portwise").await?, None)?;
    let m = leases
        .get("portwise")
        .await
        .context("the Lease is gone; it should stay, released")?;
    expect_eq(
        m.spec.and_then(|s| s.holder_identity).unwrap_or_default(),
        String::new(),
    )?;
    Ok(())
}
