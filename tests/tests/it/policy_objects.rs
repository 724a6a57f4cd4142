//! Teams' MembershipPolicy objects deciding their Services (issue 48), on
//! the real apiserver with the checked-in CRD: a Service names a policy of
//! its own namespace (or a policy's selector picks it), the same name in
//! another namespace decides nothing there, an edit judges afresh without
//! a restart, and a spec that is invalid or past the operator's limits is
//! refused in status, naming the field, while what is published stays.

use std::{path::Path, time::Duration};

use anyhow::{Context, Result, ensure};
use kube::{Api, api::PostParams};
use portwise_api::{CONDITION_ACCEPTED, MembershipPolicy};
use portwise_tests::*;
use serde_json::{Value, json};

use crate::policies::{POLICY, group_of_three};

const CRD: &str = "deploy/kustomize/membershippolicies.portwise.io.yaml";

async fn installed() -> Result<&'static ControlPlane> {
    let cp = ControlPlane::shared().await?;
    install_crds(cp, Path::new(CRD), "the MembershipPolicy CRD").await?;
    Ok(cp)
}

/// Creates (or replaces the spec of) policy `name` in `ns`.
async fn put_policy(ns: &TestNs, name: &str, spec: Value) -> Result<()> {
    let api: Api<MembershipPolicy> = ns.api();
    let obj: MembershipPolicy = serde_json::from_value(json!({
        "apiVersion": "portwise.io/v1alpha1",
        "kind": "MembershipPolicy",
        "metadata": {"name": name, "namespace": ns.name()},
        "spec": spec,
    }))?;
    if let Some(mut current) = api.get_opt(name).await? {
        // Replaced whole: a merge patch would merge an expression's map
        // with the one it replaces.
        current.spec = obj.spec;
        api.replace(name, &PostParams::default(), &current).await?;
    } else {
        api.create(&PostParams::default(), &obj).await?;
    }
    Ok(())
}

/// Waits until policy `name`'s status describes its current generation
/// and `Accepted` is `accepted`; returns the status.
async fn status_of(
    ns: &TestNs,
    name: &str,
    accepted: &str,
) -> Result<portwise_api::MembershipPolicyStatus> {
    let api: Api<MembershipPolicy> = ns.api();
    wait_for(SETTLE, || async {
        let p = api.get(name).await?;
        let status = p.status.clone().context("no status yet")?;
        ensure!(
            status.observed_generation == p.metadata.generation,
            "status of generation {:?}, object at {:?}",
            status.observed_generation,
            p.metadata.generation
        );
        let cond = status
            .conditions
            .iter()
            .find(|c| c.type_ == CONDITION_ACCEPTED)
            .context("no Accepted condition")?;
        ensure!(
            cond.status == accepted,
            "Accepted={}: {}",
            cond.status,
            cond.message
        );
        Ok(status)
    })
    .await
}

fn condition<'a>(
    status: &'a portwise_api::MembershipPolicyStatus,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    status.conditions.iter().find(|c| c.type_ == type_)
}

/// Service `web` of `ns` (port `http`, 8080) naming policy `team`, over
/// pods a and b (ready) and c (not); only a listens on 8080, for as long
/// as the listener returned lives.
async fn team_web(ns: &TestNs) -> Result<TcpListener> {
    let ips: Vec<_> = (0..3).map(|_| next_ips()).collect();
    let listener = TcpListener::start(ips[0].v4, 8080).await?;
    ns.create_service(
        service("web")
            .annotation(GROUP_KEY, "g")
            .annotation(POLICY, "team")
            .port("http", 8080),
    )
    .await?;
    group_of_three(ns, &ips).await?;
    Ok(listener)
}

/// A team's policy decides the Services that name it or that its selector
/// picks, in its namespace; the same name in another namespace decides
/// nothing there (held, and said so), and the file's `membership` still
/// decides the rest. Fails when objects are not read, when a name resolves
/// across namespaces, or when the status is not written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_object_decides_services_of_its_own_namespace_only() -> Result<()> {
    let cp = installed().await?;
    let team = TestNs::new(cp, "mpol-team").await?;
    let other = TestNs::new(cp, "mpol-other").await?;
    // a, b ready, c not; only a listens on 8080.
    let ips: Vec<_> = (0..4).map(|_| next_ips()).collect();
    let _listener = TcpListener::start(ips[0].v4, 8080).await?;
    team.create_service(
        service("named")
            .annotation(GROUP_KEY, "g")
            .annotation(POLICY, "strict")
            .port("http", 8080),
    )
    .await?;
    team.create_service(
        service("labelled")
            .annotation(GROUP_KEY, "g")
            .label("tier", "web")
            .port("http", 8080),
    )
    .await?;
    team.create_service(
        service("plain")
            .annotation(GROUP_KEY, "g")
            .port("http", 8080),
    )
    .await?;
    group_of_three(&team, &ips).await?;
    other
        .create_service(
            service("named")
                .annotation(GROUP_KEY, "g")
                .annotation(POLICY, "strict")
                .port("http", 8080),
        )
        .await?;
    other
        .create_pod(pod("d").annotation(GROUP_KEY, "g").ips(ips[3].v4()))
        .await?;
    put_policy(
        &team,
        "strict",
        json!({"membership": {"tcpDial": {"timeout": "1s"}}}),
    )
    .await?;
    put_policy(
        &team,
        "everyone",
        json!({"membership": "notTerminating",
               "services": {"selector": {"matchLabels": {"tier": "web"}}}}),
    )
    .await?;

    let cfg = config_with("podReady", "membershipPolicies: {}\n");
    let mut pw = Portwise::builder(cp)
        .namespace(team.name())
        .namespace(other.name())
        .config(&cfg)
        .binary()
        .start()
        .await?;
    // `strict` dials: a alone. `everyone` (by its selector) takes c, not
    // ready but not terminating. `plain`: the file's podReady.
    expect_endpoints(&team, "named", by_port([(("http", V4), &["a"][..])])).await?;
    expect_endpoints(
        &team,
        "labelled",
        by_port([(("http", V4), &["a", "b", "c"][..])]),
    )
    .await?;
    expect_endpoints(&team, "plain", by_port([(("http", V4), &["a", "b"][..])])).await?;
    let chosen = newest_event_message(&team, "named", "PolicyChosen").await?;
    ensure!(chosen.contains("membershippolicy/strict"), "{chosen}");

    // The other namespace has no `strict`: held, said, nothing published.
    let held = newest_event_message(&other, "named", "PolicyUnknown").await?;
    ensure!(
        held.contains("\"strict\"") && held.contains("MembershipPolicy of this namespace"),
        "{held}"
    );
    stays_for(Duration::from_secs(3), || async {
        let published = endpoints_by_port(&other, "named").await?;
        ensure!(published.is_empty(), "{published:?}");
        Ok(())
    })
    .await?;

    for (name, services) in [("strict", 1), ("everyone", 1)] {
        let status = status_of(&team, name, "True").await?;
        ensure!(
            status.services == Some(services),
            "{name}: {:?} Services",
            status.services
        );
        let modules = condition(&status, "ModulesReady").context("no ModulesReady")?;
        ensure!(modules.status == "True", "{name}: {modules:?}");
    }
    // `check --live` reads the namespace's policies as the controller
    // does and names the object that decides, with its verdicts; for the
    // other namespace, why none can.
    let live = |target: String| {
        let cfg = cfg.clone();
        async move { check_live_on(cp, &cfg, &target).await }
    };
    let out = live(format!("{}/named", team.name())).await?;
    ensure!(
        out.code == Some(0)
            && out.stdout.contains(&format!(
                "is decided by membershippolicy/strict (MembershipPolicy {}/strict)",
                team.name()
            )),
        "exit {:?}: {}{}",
        out.code,
        out.stdout,
        out.stderr
    );
    let out = live(format!("{}/named", other.name())).await?;
    ensure!(
        out.code == Some(1)
            && out
                .stdout
                .contains("neither a MembershipPolicy of this namespace"),
        "exit {:?}: {}{}",
        out.code,
        out.stdout,
        out.stderr
    );

    // kubectl shows the columns from the status.
    let out = kubectl(
        cp,
        &["get", "membershippolicies", "-n", team.name(), "strict"],
        None,
    )
    .await?;
    ensure!(
        out.lines().nth(1).is_some_and(
            |l| l.split_whitespace().take(3).collect::<Vec<_>>() == ["strict", "True", "1"]
        ),
        "{out}"
    );
    pw.check_running()?;
    Ok(())
}

/// An edit judges afresh without a restart; a spec that is invalid, or
/// valid but past the operator's limits, is refused in status naming the
/// field, and what is published stays as it was (held, not judged by
/// `membership`), even when a pod changes. Fails when an edit needs a
/// restart, when a refused policy falls back to `membership`, or when the
/// message does not name the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_judges_afresh_and_a_refused_spec_changes_nothing_published() -> Result<()> {
    let cp = installed().await?;
    let ns = TestNs::new(cp, "mpol-edit").await?;
    let _listener = team_web(&ns).await?;
    put_policy(&ns, "team", json!({"membership": "podReady"})).await?;
    // The operator allows podReady, tcpDial (up to 2s) and one module per
    // namespace, from registry.invalid/team.
    let cfg = config_with(
        "notTerminating",
        "membershipPolicies: {checkers: [podReady, tcpDial, wasm], maxProbeTimeout: 2s, \
         moduleRepositories: [registry.invalid/team], maxModulesPerNamespace: 1}\n",
    );
    let mut pw = Portwise::spawn_binary(&ns, &cfg).await?;
    expect_endpoints(&ns, "web", by_port([(("http", V4), &["a", "b"][..])])).await?;

    // An edit: judged afresh with the new spec, no restart.
    put_policy(
        &ns,
        "team",
        json!({"membership": {"tcpDial": {"timeout": "1s"}}}),
    )
    .await?;
    expect_endpoints(&ns, "web", by_port([(("http", V4), &["a"][..])])).await?;
    status_of(&ns, "team", "True").await?;

    // Invalid: refused naming the field; nothing published changes, even
    // when a pod changes (`membership` here would publish a, b and c).
    put_policy(
        &ns,
        "team",
        json!({"membership": {"tcpDial": {"timeout": "0s"}}}),
    )
    .await?;
    let status = status_of(&ns, "team", "False").await?;
    let accepted = condition(&status, CONDITION_ACCEPTED).unwrap();
    ensure!(
        accepted.reason == "Invalid"
            && accepted
                .message
                .starts_with("spec.membership.tcpDial.timeout: must be greater than 0"),
        "{accepted:?}"
    );
    let held = newest_event_message(&ns, "web", "PolicyNotReady").await?;
    ensure!(held.contains("spec.membership.tcpDial.timeout"), "{held}");
    let writes = WriteCounter::start(&ns).await?;
    ns.set_ready("b", false).await?;
    stays_for(Duration::from_secs(4), || async {
        expect_eq(
            endpoints_by_port(&ns, "web").await?,
            by_port([(("http", V4), &["a"][..])]),
        )
    })
    .await?;
    writes
        .expect(0, "a Service held by a refused policy")
        .await?;

    // Valid, but past the operator's limits: refused, naming the field.
    put_policy(
        &ns,
        "team",
        json!({"membership": {"all": ["podReady", {"httpGet": {"path": "/"}}]}}),
    )
    .await?;
    let status = status_of(&ns, "team", "False").await?;
    let accepted = condition(&status, CONDITION_ACCEPTED).unwrap();
    ensure!(
        accepted.reason == "NotAllowed"
            && accepted
                .message
                .starts_with("spec.membership.all[1].httpGet: httpGet is not allowed"),
        "{accepted:?}"
    );
    put_policy(
        &ns,
        "team",
        json!({"membership": {"tcpDial": {"timeout": "3s"}}}),
    )
    .await?;
    let status = status_of(&ns, "team", "False").await?;
    let accepted = condition(&status, CONDITION_ACCEPTED).unwrap();
    ensure!(
        accepted.message.starts_with(
            "spec.membership.tcpDial.timeout: 3s is above the operator's maximum of 2s"
        ),
        "{accepted:?}"
    );
    stays_for(Duration::from_secs(2), || async {
        expect_eq(
            endpoints_by_port(&ns, "web").await?,
            by_port([(("http", V4), &["a"][..])]),
        )
    })
    .await?;

    // Fixed: judged again by the policy (b is not ready any more).
    put_policy(
        &ns,
        "team",
        json!({"membership": {"any": ["podReady", {"tcpDial": {"timeout": "2s"}}]}}),
    )
    .await?;
    status_of(&ns, "team", "True").await?;
    expect_endpoints(&ns, "web", by_port([(("http", V4), &["a"][..])])).await?;
    ns.set_ready("c", true).await?;
    expect_endpoints(&ns, "web", by_port([(("http", V4), &["a", "c"][..])])).await?;

    // The namespace's module budget: a first module is accepted (its pull
    // fails: no such registry), a second one takes the namespace past
    // the operator's one and is refused; the first one gone, it is read
    // again and accepted.
    let module = |hex: char| {
        json!({"membership": {"wasm": {"module":
            format!("oci://registry.invalid/team/check@sha256:{}", hex.to_string().repeat(64))}}})
    };
    put_policy(&ns, "first-module", module('1')).await?;
    let status = status_of(&ns, "first-module", "True").await?;
    let modules = condition(&status, "ModulesReady").context("no ModulesReady")?;
    ensure!(
        modules.status == "False" && modules.reason == "PullFailed",
        "{modules:?}"
    );
    put_policy(&ns, "second-module", module('2')).await?;
    let status = status_of(&ns, "second-module", "False").await?;
    let accepted = condition(&status, CONDITION_ACCEPTED).unwrap();
    ensure!(
        accepted.reason == "NotAllowed" && accepted.message.contains("maxModulesPerNamespace"),
        "{accepted:?}"
    );
    let api: Api<MembershipPolicy> = ns.api();
    api.delete("first-module", &Default::default()).await?;
    status_of(&ns, "second-module", "True").await?;
    pw.check_running()?;
    Ok(())
}

/// `portwise_shadow_differences` of Service `web` on port `http` under
/// shadow `shadow`, awaited until it is `want`.
async fn await_shadow(pw: &Portwise, ns: &TestNs, shadow: &str, want: Option<f64>) -> Result<()> {
    wait_for(Duration::from_secs(20), || async {
        let got = pw.scrape().await?.value(
            "portwise_shadow_differences",
            &[
                ("namespace", ns.name()),
                ("service", "web"),
                ("shadow", shadow),
                ("port", "http"),
            ],
        )?;
        ensure!(got == want, "{shadow}: {got:?}, want {want:?}");
        Ok(())
    })
    .await
}

/// A policy's `spec.shadow` is judged beside its `spec.membership` for the
/// Services it decides, ahead of the operator's default shadow; its
/// differences show as the metric, an Event and in `check --live`, and it
/// publishes nothing. Dropped from the spec, it stops, and the operator's
/// default applies again. Fails when an object's shadow is not judged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policys_shadow_reports_its_differences_and_publishes_nothing() -> Result<()> {
    const OBJECT_SHADOW: &str = "membershippolicy/team/spec.shadow";
    let cp = installed().await?;
    let ns = TestNs::new(cp, "mpol-shadow").await?;
    let _listener = team_web(&ns).await?;
    // Live: ready pods (a, b). The team's shadow: who answers on the port
    // (a): b differs.
    put_policy(
        &ns,
        "team",
        json!({"membership": "podReady", "shadow": {"tcpDial": {"timeout": "1s"}}}),
    )
    .await?;
    // The operator's default shadow agrees with podReady everywhere.
    let cfg = config_with(
        "podReady",
        "membershipPolicies: {checkers: [podReady, tcpDial]}\nshadow: {membership: podReady}\n",
    );
    let pw = Portwise::spawn_binary(&ns, &cfg).await?;
    expect_endpoints(&ns, "web", by_port([(("http", V4), &["a", "b"][..])])).await?;
    status_of(&ns, "team", "True").await?;

    let writes = WriteCounter::start(&ns).await?;
    await_shadow(&pw, &ns, OBJECT_SHADOW, Some(1.0)).await?;
    let event = newest_event_message(&ns, "web", "ShadowDiffers").await?;
    ensure!(
        event.contains(&format!(
            "{OBJECT_SHADOW} differs from the live membership on 1 of 3 verdicts"
        )) && event.contains("http b (IPv4): live include, shadow exclude"),
        "{event}"
    );
    let out = check_live_on(cp, &cfg, &format!("{}/web", ns.name())).await?;
    ensure!(
        out.code == Some(0)
            && out
                .stdout
                .contains(&format!("live membership against {OBJECT_SHADOW}")),
        "exit {:?}: {}{}",
        out.code,
        out.stdout,
        out.stderr
    );

    // The shadow gone from the spec: the operator's default applies.
    put_policy(&ns, "team", json!({"membership": "podReady"})).await?;
    await_shadow(&pw, &ns, "shadow.membership", Some(0.0)).await?;
    await_shadow(&pw, &ns, OBJECT_SHADOW, None).await?;

    // Through all of it the live membership held and nothing was written.
    expect_endpoints(&ns, "web", by_port([(("http", V4), &["a", "b"][..])])).await?;
    writes.expect(0, "shadow changes").await?;
    Ok(())
}

/// With `membershipPolicies` set, a portwise that may not list the
/// policies judges nothing (a Service a policy selects is never judged by
/// `membership` first), is not ready, and says what to fix; granted the
/// list, it goes on by itself. Run as a ServiceAccount with the base's
/// ClusterRole less its MembershipPolicy rules. Fails when reconciles do
/// not wait for the policies' first list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_portwise_that_cannot_list_policies_judges_nothing_and_says_why() -> Result<()> {
    use k8s_openapi::api::{
        core::v1::ServiceAccount,
        rbac::v1::{ClusterRole, ClusterRoleBinding},
    };
    let cp = installed().await?;
    let ns = TestNs::new(cp, "mpol-denied").await?;
    let n = ns.name();
    // The base's ClusterRole, as kubectl reads it, without portwise.io.
    // kubectl prints one JSON object per document.
    let printed = kubectl(
        cp,
        &[
            "create",
            "--dry-run=client",
            "-o",
            "json",
            "-f",
            "deploy/kustomize/rbac.yaml",
        ],
        None,
    )
    .await?;
    let documents = serde_json::Deserializer::from_str(&printed)
        .into_iter::<Value>()
        .collect::<Result<Vec<_>, _>>()?;
    let mut role: ClusterRole = serde_json::from_value(
        documents
            .into_iter()
            .find(|o| o["kind"] == "ClusterRole")
            .context("no ClusterRole in deploy/kustomize/rbac.yaml")?,
    )?;
    let before = role.rules.as_ref().map_or(0, Vec::len);
    role.rules
        .get_or_insert_default()
        .retain(|r| !r.api_groups.iter().flatten().any(|g| g == "portwise.io"));
    ensure!(
        role.rules.as_ref().map_or(0, Vec::len) < before,
        "the base's ClusterRole has no portwise.io rule to take away"
    );
    let name = format!("{n}-portwise");
    role.metadata = kube::api::ObjectMeta {
        name: Some(name.clone()),
        ..Default::default()
    };
    let roles: Api<ClusterRole> = Api::all(ns.client());
    roles.create(&PostParams::default(), &role).await?;
    let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "pw"}}))?;
    ns.api::<ServiceAccount>()
        .create(&PostParams::default(), &sa)
        .await?;
    let bind = |role: &str, binding: &str| -> Result<ClusterRoleBinding> {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": binding},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": "pw", "namespace": n}],
        }))?)
    };
    let bindings: Api<ClusterRoleBinding> = Api::all(ns.client());
    bindings
        .create(&PostParams::default(), &bind(&name, &name)?)
        .await?;
    let token = service_account_token(cp, n, "pw", "1h").await?;
    let dir = tempfile::Builder::new()
        .prefix("portwise-denied-")
        .tempdir()?;
    let kubeconfig = token_kubeconfig(cp, &dir.path().join("kubeconfig"), &token)?;

    ns.create_service(service("web").annotation(GROUP_KEY, "g").port("http", 8080))
        .await?;
    ns.create_pod(pod("a").annotation(GROUP_KEY, "g").ips(next_ips().v4()))
        .await?;
    let pw = Portwise::builder(cp)
        .binary()
        .namespace(n)
        .config(&config_with(
            "podReady",
            "membershipPolicies: {checkers: [podReady]}\n",
        ))
        .identity(&kubeconfig)
        .start()
        .await?;
    pw.wait_for_log(
        "cannot watch MembershipPolicies (is the CRD installed, and may portwise list them?)",
        SETTLE,
    )
    .await?;
    stays_for(Duration::from_secs(4), || async {
        let slices = slices_managed_by(&ns, "web", None).await?;
        ensure!(
            slices.is_empty(),
            "published before the policies were listed: {slices:?}"
        );
        Ok(())
    })
    .await?;
    let (status, _) = pw.get("/readyz").await?;
    ensure!(
        status != 200,
        "/readyz answered {status} before the policies were listed"
    );

    // Granted: the watch's next try lists them, and the Service is judged.
    let reader = format!("{n}-policy-reader");
    let reader_role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": reader},
        "rules": [{"apiGroups": ["portwise.io"], "resources": ["membershippolicies"],
                   "verbs": ["get", "list", "watch"]}],
    }))?;
    roles.create(&PostParams::default(), &reader_role).await?;
    bindings
        .create(&PostParams::default(), &bind(&reader, &reader)?)
        .await?;
    wait_for(Duration::from_secs(60), || async {
        expect_eq(
            endpoints_by_port(&ns, "web").await?,
            by_port([(("http", V4), &["a"][..])]),
        )
    })
    .await?;
    let (status, _) = pw.get("/readyz").await?;
    ensure!(status == 200, "/readyz answered {status} once listed");
    // Cluster-scoped: not removed with the test's namespace.
    for name in [&name, &reader] {
        bindings.delete(name, &Default::default()).await?;
        roles.delete(name, &Default::default()).await?;
    }
    Ok(())
}
