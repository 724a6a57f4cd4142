//! The MembershipPolicy custom resource (issue 48, first part) on the real
//! apiserver: the checked-in CRD, applied as the kustomize base ships it,
//! is established, explains itself, prints its columns, refuses what its
//! schema rules out (naming the field) and keeps a status written through
//! the status subresource. Nothing here runs portwise: what portwise does
//! with the objects is `policy_objects`'.

use std::{path::Path, time::Duration};

use anyhow::{Context, Result, ensure};
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use portwise_api::{CONDITION_ACCEPTED, MembershipPolicy};
use portwise_tests::*;
use serde_json::json;

/// The base's copy (the chart's is the same file: host/portwise/tests/crd.rs).
const CRD: &str = "deploy/kustomize/membershippolicies.portwise.io.yaml";

/// Applies the CRD server-side and waits for Established. Every test calls
/// it: they share one control plane and may run in any order.
async fn installed() -> Result<&'static ControlPlane> {
    let cp = ControlPlane::shared().await?;
    install_crds(cp, Path::new(CRD), "the MembershipPolicy CRD").await?;
    // kubectl maps kinds through its discovery cache, which may predate the
    // CRD for a moment after Established.
    wait_for(Duration::from_secs(30), || async {
        kubectl(cp, &["get", "membershippolicies", "-A"], None).await
    })
    .await?;
    Ok(cp)
}

/// kubectl as admin, whatever its exit status: (success, stdout, stderr).
async fn kubectl_out(
    cp: &ControlPlane,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<(bool, String, String)> {
    let out = kubectl_as(cp, cp.kubeconfig(), args, stdin).await?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

fn policy_yaml(ns: &str, name: &str, spec: &str) -> String {
    format!(
        "apiVersion: portwise.io/v1alpha1\nkind: MembershipPolicy\n\
         metadata: {{name: {name}, namespace: {ns}}}\nspec: {spec}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_explain_prints_the_field_docs() -> Result<()> {
    let cp = installed().await?;
    // The apiserver publishes a new CRD's OpenAPI a moment after it is
    // Established. kubectl's disk cache (shared by every test and run, with
    // hours of lifetime) may hold an OpenAPI from before the CRD: each try
    // starts from an empty one.
    let out = wait_for(Duration::from_secs(60), || async {
        let cache = tempfile::Builder::new()
            .prefix("portwise-kubectl-cache-")
            .tempdir()?;
        let cache = cache
            .path()
            .to_str()
            .context("a temporary path that is not UTF-8")?;
        let (ok, out, err) = kubectl_out(
            cp,
            &["explain", "membershippolicy.spec", "--cache-dir", cache],
            None,
        )
        .await?;
        ensure!(ok, "kubectl explain: {err}");
        Ok(out)
    })
    .await?;
    // kubectl wraps descriptions itself: compare words, not lines.
    let words = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let flat = words(&out);
    for wanted in [
        "GROUP: portwise.io",
        "KIND: MembershipPolicy",
        // The doc comment of `membership` in host/api.
        "The checker expression that decides, per pod, per port and per address family, \
         whether the pod backs the port",
        // ... and of `shadow`.
        "An optional second expression, in the same language, judged next to `membership`",
    ] {
        ensure!(
            flat.contains(wanted),
            "kubectl explain membershippolicy.spec lacks {wanted:?}:\n{out}"
        );
    }
    // The fields, `membership` required.
    for (field, required) in [("membership", true), ("shadow", false), ("services", false)] {
        let line = out
            .lines()
            .find(|l| l.split_whitespace().next() == Some(field))
            .with_context(|| format!("no field {field} in:\n{out}"))?;
        expect_eq((field, line.contains("-required-")), (field, required))?;
    }
    let (ok, out, err) = kubectl_out(
        cp,
        &["explain", "membershippolicy.spec.services.selector"],
        None,
    )
    .await?;
    ensure!(ok, "{err}");
    ensure!(
        words(&out).contains("A label selector over the Services of the policy's namespace"),
        "kubectl explain membershippolicy.spec.services.selector:\n{out}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_shows_the_printer_columns() -> Result<()> {
    let cp = installed().await?;
    let ns = TestNs::new(cp, "mpol-get").await?;
    let n = ns.name();
    kubectl(
        cp,
        &["apply", "--server-side", "-f", "-"],
        Some(&policy_yaml(n, "strict", "{membership: podReady}")),
    )
    .await?;
    // The plural and the short name.
    for resource in ["membershippolicies", "mpol"] {
        let out = kubectl(cp, &["get", resource, "-n", n], None).await?;
        let header: Vec<&str> = out
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        expect_eq(
            (resource, header),
            (resource, vec!["NAME", "ACCEPTED", "SERVICES", "AGE"]),
        )?;
        ensure!(out.contains("\nstrict "), "no row for the policy:\n{out}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_apiserver_refuses_what_the_schema_rules_out() -> Result<()> {
    let cp = installed().await?;
    let ns = TestNs::new(cp, "mpol-refused").await?;
    let n = ns.name();
    // Control: each shape the language allows is taken (as a dry run), so a
    // refusal below is about the one thing that case breaks.
    for spec in [
        "{membership: podReady}",
        "{membership: {all: [podReady, {tcpDial: {timeout: 1s}}]}, shadow: notTerminating}",
        "{membership: {wasm: {module: 'oci://registry.example/checks/admin@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef', config: {minReplicas: 2}}}}",
        "{membership: podReady, services: {selector: {matchExpressions: [{key: tier, operator: In, values: [web]}, {key: canary, operator: DoesNotExist}]}}}",
    ] {
        let (ok, _, err) = kubectl_out(
            cp,
            &["apply", "--server-side", "--dry-run=server", "-f", "-"],
            Some(&policy_yaml(n, "fine", spec)),
        )
        .await?;
        ensure!(ok, "a valid policy was refused: {spec}\n{err}");
    }
    // (name, spec, what the refusal must say: the field, and why)
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "no-membership",
            "{shadow: podReady}",
            &["spec.membership: Required value"],
        ),
        (
            "two-keys",
            "{membership: {podReady: {}, notTerminating: {}}}",
            &["spec.membership: Too many: 2: must have at most 1 item"],
        ),
        (
            "a-list",
            "{membership: [podReady]}",
            &["spec.membership: Too many"],
        ),
        ("empty-word", "{membership: ''}", &["spec.membership"]),
        ("empty-map", "{membership: {}}", &["spec.membership"]),
        (
            "empty-shadow",
            "{membership: podReady, shadow: {}}",
            &["spec.shadow"],
        ),
        (
            "in-without-values",
            "{membership: podReady, services: {selector: {matchExpressions: [{key: tier, operator: In}]}}}",
            &[
                "spec.services.selector.matchExpressions[0]",
                "operator must be In or NotIn with values, or Exists or DoesNotExist without",
            ],
        ),
        (
            "no-selector",
            "{membership: podReady, services: {}}",
            &["spec.services.selector: Required value"],
        ),
        (
            "dotted.name",
            "{membership: podReady}",
            &["a MembershipPolicy's name must be a DNS label"],
        ),
    ];
    let mut wrong = Vec::new();
    for (name, spec, wanted) in cases {
        let (ok, _, err) = kubectl_out(
            cp,
            &["create", "-f", "-"],
            Some(&policy_yaml(n, name, spec)),
        )
        .await?;
        if ok {
            wrong.push(format!("{name}: {spec} was accepted"));
        } else if let Some(w) = wanted.iter().find(|w| !err.contains(**w)) {
            wrong.push(format!(
                "{name}: {spec}: the refusal does not say {w:?}: {err}"
            ));
        }
    }
    ensure!(wrong.is_empty(), "{}", wrong.join("\n"));
    let left = kubectl(cp, &["get", "mpol", "-n", n, "-o", "name"], None).await?;
    expect_eq(left.trim(), "")?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_round_trips_through_its_subresource() -> Result<()> {
    let cp = installed().await?;
    let ns = TestNs::new(cp, "mpol-status").await?;
    let n = ns.name();
    let api: Api<MembershipPolicy> = Api::namespaced(ns.client(), n);
    // Created from the Rust type: what the controller will read.
    let policy: MembershipPolicy = serde_json::from_value(json!({
        "apiVersion": "portwise.io/v1alpha1",
        "kind": "MembershipPolicy",
        "metadata": {"name": "strict"},
        "spec": {"membership": {"all": ["podReady", {"httpGet": {"path": "/ready", "timeout": "1s"}}]}},
    }))?;
    let created = api.create(&PostParams::default(), &policy).await?;
    let generation = created.metadata.generation.context("no generation")?;
    ensure!(
        created.status.is_none(),
        "a new policy has a status: {created:?}"
    );

    // What the controller will write: server-side apply on the status
    // subresource (RBAC: patch on membershippolicies/status). The spec in
    // the same patch must be ignored there.
    let status = json!({
        "apiVersion": "portwise.io/v1alpha1",
        "kind": "MembershipPolicy",
        "metadata": {"name": "strict"},
        "spec": {"membership": "exclude"},
        "status": {
            "observedGeneration": generation,
            "conditions": [{
                "type": CONDITION_ACCEPTED,
                "status": "True",
                "reason": "Valid",
                "message": "membership: valid",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
                "observedGeneration": generation,
            }],
            "services": 3,
        },
    });
    api.patch_status(
        "strict",
        &PatchParams::apply("portwise").force(),
        &Patch::Apply(&status),
    )
    .await?;
    let got = api.get("strict").await?;
    expect_eq(got.spec.membership.clone(), policy.spec.membership.clone())?;
    let st = got.status.clone().context("the status was not kept")?;
    expect_eq(st.observed_generation, Some(generation))?;
    expect_eq(st.services, Some(3))?;
    let accepted = st
        .conditions
        .iter()
        .find(|c| c.type_ == CONDITION_ACCEPTED)
        .with_context(|| format!("no Accepted condition: {:?}", st.conditions))?;
    expect_eq(
        (
            accepted.status.as_str(),
            accepted.reason.as_str(),
            accepted.message.as_str(),
        ),
        ("True", "Valid", "membership: valid"),
    )?;
    expect_eq(accepted.observed_generation, Some(generation))?;

    // A write of the object itself leaves the status alone.
    let mut edited = got.clone();
    edited.spec.shadow = Some(json!("podReady"));
    edited.status = None;
    let replaced = api
        .replace("strict", &PostParams::default(), &edited)
        .await?;
    ensure!(
        replaced.metadata.generation > Some(generation),
        "a spec edit did not bump the generation"
    );
    expect_eq(
        replaced.status.and_then(|s| s.observed_generation),
        Some(generation),
    )?;

    // The printer columns read the status.
    let out = kubectl(cp, &["get", "mpol", "strict", "-n", n], None).await?;
    let row: Vec<&str> = out
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    expect_eq(row.get(..3), Some(&["strict", "True", "3"][..]))?;
    Ok(())
}
