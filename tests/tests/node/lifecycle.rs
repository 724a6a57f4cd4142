//! What happens to a running installation: its modules and config updated
//! in place (`helm upgrade` and `helm rollback`), the leader lost, and the workload's
//! own rollout. Each is watched in the slices, in the apiserver's audit log
//! (portwise's writes) and in traffic from a client pod.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use portwise_tests::{
    guests_dir,
    node::{RealNode, SliceHistory, ready_members, slice_writes_by},
};

use crate::{
    publish::{PORTWISE_SA, installed_shop, shop, uninstall_with_shop},
    support::*,
};

/// Writes `module`'s base64 to a file, for `--set-file` (as the chart's
/// README says: `base64 -w0 NAME.wasm >NAME.b64`).
fn module_b64(module: &str) -> Result<String> {
    module_b64_cut(module, usize::MAX, "")
}

/// `module`'s first `len` bytes, base64, for `--set-file`: a module that
/// does not compile.
fn truncated_module_b64(module: &str, len: usize) -> Result<String> {
    module_b64_cut(module, len, "-truncated")
}

fn module_b64_cut(module: &str, len: usize, tag: &str) -> Result<String> {
    use base64::Engine as _;
    let path = guests_dir().join(module);
    let mut bytes = std::fs::read(&path)
        .with_context(|| format!("reading {} (guests/build)", path.display()))?;
    bytes.truncate(len);
    let out = std::env::temp_dir().join(format!(
        "portwise-node-{}{tag}.b64",
        module.replace('/', "-")
    ));
    std::fs::write(
        &out,
        base64::engine::general_purpose::STANDARD.encode(bytes),
    )?;
    Ok(out.display().to_string())
}

/// The pods of the release, by name.
fn portwise_pods(node: &RealNode) -> Result<Vec<String>> {
    let mut pods: Vec<String> = node
        .kubectl(&[
            "-n",
            SYSTEM_NS,
            "get",
            "pods",
            "-l",
            "app.kubernetes.io/name=portwise",
            "-o",
            "name",
        ])?
        .lines()
        .map(str::to_string)
        .collect();
    pods.sort();
    Ok(pods)
}

const MODULE_MEMBERSHIP: &str = r#"config.membership={"perPort":{"ports":{
  "http":{"all":["podReady",{"tcpDial":{"timeout":"1s"}}]},
  "https":{"all":["podReady",{"wasm":{"module":"check.wasm","config":{"label":"shop.example/tls"}}}]}}}}"#;

/// A WebAssembly checker from the chart's modules ConfigMap decides the
/// https port; a new module in the same ConfigMap reaches the running pods
/// through the kubelet's atomic `..data` swap, without a restart; a broken
/// one leaves the previous module deciding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modules_from_the_chart_decide_a_port_and_reload_in_place() -> Result<()> {
    let node = RealNode::shared().await?;
    // check.wasm v1: the C port-names guest, which includes a pod whose
    // label lists the port's name. v2: the Rust template, which includes a
    // labelled pod (any value) whose port answers a dial. a lists https, c
    // lists "none", b has no label; a and c serve 8443.
    let v1 = module_b64("c-port-names.wasm")?;
    let v2 = module_b64("templates/rust-template.wasm")?;
    // A broken update: the v2 file cut short, as a failed copy leaves it
    // (hostile/garbage.wasm would not do: it compiles, and only answers
    // garbage).
    let broken = truncated_module_b64("templates/rust-template.wasm", 4096)?;
    let compact: String = MODULE_MEMBERSHIP.split_whitespace().collect();
    helm_install(
        node,
        "portwise",
        &[
            "--set-json",
            &compact,
            "--set-file",
            &format!("modules.binaryData.check\\.wasm={v1}"),
        ],
    )?;
    two_ready_one_leader(node, "portwise").await?;
    let shop = shop(node, "shop-modules").await?;
    for (pod, value) in [("a", "https"), ("c", "none")] {
        node.kubectl(&[
            "-n",
            &shop.ns,
            "label",
            "pod",
            pod,
            &format!("shop.example/tls={value}"),
        ])?;
    }
    shop.expect(node, &["a", "b"], &["a"]).await?;
    let pods = portwise_pods(node)?;

    let upgrade = |file: &str| {
        node.helm(&[
            "upgrade",
            "portwise",
            "deploy/helm",
            "-n",
            SYSTEM_NS,
            "--reuse-values",
            "--wait",
            "--set-file",
            &format!("modules.binaryData.check\\.wasm={file}"),
        ])
    };
    upgrade(&v2)?;
    // The kubelet swaps the ConfigMap's files within its sync period (10 s
    // on this node); portwise reloads and re-judges.
    shop.expect(node, &["a", "b"], &["a", "c"]).await?;
    ensure!(
        portwise_pods(node)? == pods,
        "a module update restarted the pods: {pods:?} -> {:?}",
        portwise_pods(node)?
    );

    let writes = slice_writes_by(&node.audit_log(), PORTWISE_SA)?.len();
    upgrade(&broken)?;
    let client = node.client();
    let (_, leader) = ready_replicas_and_leader(node, "portwise")?;
    portwise_tests::wait_for(Duration::from_secs(60), || async {
        let logs = node.kubectl(&["-n", SYSTEM_NS, "logs", &leader])?;
        ensure!(
            logs.lines()
                .any(|l| l.contains("check.wasm") && (l.contains("ERROR") || l.contains("WARN"))),
            "the leader's log does not report the broken check.wasm yet"
        );
        Ok(())
    })
    .await?;
    // The Event the docs promise, on portwise's own Pod.
    portwise_tests::wait_for(Duration::from_secs(30), || async {
        let events = node.kubectl(&[
            "-n",
            SYSTEM_NS,
            "get",
            "events",
            "--field-selector",
            "reason=ModuleLoadFailed",
            "-o",
            "name",
        ])?;
        ensure!(
            !events.trim().is_empty(),
            "no ModuleLoadFailed Event in {SYSTEM_NS}"
        );
        Ok(())
    })
    .await?;
    // Past a resync of every verdict (the chart's resyncPeriod is 30 s).
    tokio::time::sleep(Duration::from_secs(35)).await;
    let have = ready_members(&client, &shop.ns, "shop").await?;
    ensure!(
        have == portwise_tests::node::members([
            ("http", &["a", "b"][..]),
            ("https", &["a", "c"][..])
        ]),
        "a broken module update changed what was published: {have:?}"
    );
    let after = slice_writes_by(&node.audit_log(), PORTWISE_SA)?;
    ensure!(
        after.len() == writes,
        "a broken module update wrote slices: {:?}",
        &after[writes..]
    );
    shop.expect(node, &["a", "b"], &["a", "c"]).await?;

    uninstall_with_shop(node, &shop)
}

/// How many times each of `pods` has logged applying a changed config file.
fn reloads(node: &RealNode, pods: &[String]) -> Result<Vec<usize>> {
    pods.iter()
        .map(|pod| {
            let logs = node.kubectl(&["-n", SYSTEM_NS, "logs", pod])?;
            Ok(logs
                .lines()
                .filter(|l| l.contains("the config file changed: applying it"))
                .count())
        })
        .collect()
}

/// `helm upgrade` with a changed config reloads it in both running pods
/// (the kubelet updates the directory mount, portwise applies it): no pod
/// restarts, traffic keeps flowing and the unchanged slices get no write.
/// An invalid config is refused in place (a Warning Event on the pods) and
/// the running one keeps publishing; `helm rollback` restores the first
/// config the same way; `reloadConfig=false` rolls the pods instead.
/// Fails when the chart mounts the file with `subPath` (the kubelet never
/// updates it) or rolls the pods on a config change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_upgrade_and_rollback_reload_the_config_in_place_without_a_write_or_a_failed_connection()
-> Result<()> {
    let node = RealNode::shared().await?;
    let (shop, _, _) = installed_shop(node, "shop-upgrade").await?;
    let config = || {
        node.kubectl(&[
            "-n",
            SYSTEM_NS,
            "get",
            "configmap",
            "portwise-config",
            "-o",
            "jsonpath={.data.config\\.yaml}",
        ])
    };
    ensure!(
        config()?.contains("resyncPeriod: 30s"),
        "revision 1's config: {}",
        config()?
    );
    let upgrade = |set: &'static str| {
        vec![
            "upgrade",
            "portwise",
            "deploy/helm",
            "-n",
            SYSTEM_NS,
            "--reuse-values",
            "--set",
            set,
            "--wait",
        ]
    };
    let refused_events = || {
        node.kubectl(&[
            "-n",
            SYSTEM_NS,
            "get",
            "events",
            "--field-selector",
            "reason=ConfigReloadFailed",
            "-o",
            "jsonpath={range .items[*]}{.involvedObject.name}{\"\\n\"}{end}",
        ])
    };

    // (what, helm's arguments, what the pods do: reload, refuse or roll)
    #[derive(PartialEq, Debug)]
    enum Then {
        Reload,
        Refuse,
        Roll,
    }
    for (what, args, then) in [
        ("upgrade", upgrade("config.resyncPeriod=20s"), Then::Reload),
        (
            "an invalid config",
            upgrade("config.maxEndpointsPerSlice=5000"),
            Then::Refuse,
        ),
        (
            "rollback",
            vec!["rollback", "portwise", "1", "-n", SYSTEM_NS, "--wait"],
            Then::Reload,
        ),
        (
            "reloadConfig=false",
            upgrade("reloadConfig=false"),
            Then::Roll,
        ),
    ] {
        let pods = portwise_pods(node)?;
        let names: Vec<String> = pods
            .iter()
            .map(|p| p.trim_start_matches("pod/").to_string())
            .collect();
        let before = reloads(node, &names)?;
        let writes = slice_writes_by(&node.audit_log(), PORTWISE_SA)?.len();
        // About 20 s of traffic, one connection every 50 ms, across it.
        let traffic = node.traffic(
            (&shop.ns, "client"),
            (&shop.ip, 80),
            400,
            Duration::from_millis(50),
        )?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        node.helm(&args)?;
        match then {
            // The kubelet updates the mounted file within its sync period
            // (10 s on this node); both replicas apply it.
            Then::Reload => {
                portwise_tests::wait_for(Duration::from_secs(90), || async {
                    let now = reloads(node, &names)?;
                    ensure!(
                        now.iter().zip(&before).all(|(n, b)| *n == b + 1),
                        "reloads logged by {names:?}: {before:?} -> {now:?}"
                    );
                    Ok(())
                })
                .await?
            }
            Then::Refuse => {
                portwise_tests::wait_for(Duration::from_secs(90), || async {
                    let events = refused_events()?;
                    ensure!(
                        names.iter().all(|n| events.lines().any(|l| l == n)),
                        "ConfigReloadFailed on {events:?}, want every one of {names:?}"
                    );
                    Ok(())
                })
                .await?
            }
            Then::Roll => {
                node.kubectl(&[
                    "-n",
                    SYSTEM_NS,
                    "rollout",
                    "status",
                    "deployment/portwise",
                    "--timeout=120s",
                ])?;
            }
        }
        two_ready_one_leader(node, "portwise").await?;
        let answers = traffic.finish()?;
        ensure!(
            answers.refused == 0 && answers.failed == 0 && answers.pods() == ["a", "b"],
            "traffic across {what}: {answers:?}"
        );
        let now = portwise_pods(node)?;
        if then == Then::Roll {
            ensure!(
                now.iter().all(|p| !pods.contains(p)),
                "{what} did not roll the pods: {pods:?} -> {now:?}"
            );
        } else {
            ensure!(
                now == pods,
                "{what} restarted the pods: {pods:?} -> {now:?}"
            );
        }
        let after = slice_writes_by(&node.audit_log(), PORTWISE_SA)?;
        ensure!(
            after.len() == writes,
            "{what} wrote unchanged slices: {:?}",
            &after[writes..]
        );
        if what == "rollback" {
            ensure!(
                config()?.contains("resyncPeriod: 30s"),
                "helm rollback did not restore the config: {}",
                config()?
            );
        }
    }
    let history = node.helm(&["history", "portwise", "-n", SYSTEM_NS])?;
    ensure!(history.contains("Rollback to 1"), "helm history: {history}");

    uninstall_with_shop(node, &shop)
}

/// Deleting the leader pod hands the Lease to another replica within the
/// lease duration (the chart's default, 15 s), with no slice write and no
/// failed connection; the new leader then follows a change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_leader_hands_over_without_a_write_or_a_failed_connection() -> Result<()> {
    let node = RealNode::shared().await?;
    let (shop, ready, leader) = installed_shop(node, "shop-failover").await?;
    ensure!(
        ready.len() == 2,
        "two replicas before the failover: {ready:?}"
    );
    let writes = slice_writes_by(&node.audit_log(), PORTWISE_SA)?.len();

    let traffic = node.traffic(
        (&shop.ns, "client"),
        (&shop.ip, 443),
        200,
        Duration::from_millis(50),
    )?;
    let t0 = tokio::time::Instant::now();
    node.kubectl(&["-n", SYSTEM_NS, "delete", "pod", &leader, "--wait=false"])?;
    // The standby, or the Deployment's replacement pod if it started and
    // won the race (it competes from its first second): any replica but
    // the deleted one.
    let took = portwise_tests::wait_for(Duration::from_secs(15), || async {
        let (_, now) = ready_replicas_and_leader(node, "portwise")?;
        ensure!(
            !now.is_empty() && now != leader,
            "the Lease is held by {now:?} (the deleted leader was {leader})"
        );
        Ok(t0.elapsed())
    })
    .await
    .context("the Lease did not move to another replica within the lease duration")?;
    let (_, new_leader) = ready_replicas_and_leader(node, "portwise")?;
    eprintln!("failover: {new_leader} holds the Lease {took:?} after the leader's deletion");
    let answers = traffic.finish()?;
    ensure!(
        answers.refused == 0 && answers.failed == 0 && answers.pods() == ["a", "c"],
        "traffic across the failover: {answers:?}"
    );
    let after = slice_writes_by(&node.audit_log(), PORTWISE_SA)?;
    ensure!(
        after.len() == writes,
        "the failover wrote unchanged slices: {:?}",
        &after[writes..]
    );

    // The new leader decides: b's probe fails, b leaves http.
    node.kubectl(&["-n", &shop.ns, "exec", "b", "--", "/pw-workload", "unready"])?;
    shop.expect(node, &["a"], &["a", "c"]).await?;

    uninstall_with_shop(node, &shop)
}

/// A Deployment rollout of a colocated workload: each old pod is published
/// as terminating (ready false, serving true) while it drains, clients meet
/// no failed connection, and the slices end with exactly the new pods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workload_rollout_keeps_terminating_pods_serving_until_they_go() -> Result<()> {
    let node = RealNode::shared().await?;
    helm_install(node, "portwise", &["--set-json", DIAL_MEMBERSHIP])?;
    two_ready_one_leader(node, "portwise").await?;
    let ns = "shop-rollout";
    let image = node.workload_image()?;
    node.apply(&format!(
        "{}---\n{}---\n{}",
        namespace(ns),
        colocated_service(
            ns,
            "shop",
            "web",
            &[("http", 80, 8080), ("https", 443, 8443)]
        ),
        client_pod(image, ns, "client"),
    ))?;
    node.apply(&format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, namespace: {ns}}}
spec:
  replicas: 2
  selector: {{matchLabels: {{app: web}}}}
  strategy: {{rollingUpdate: {{maxSurge: 1, maxUnavailable: 0}}}}
  template:
    metadata:
      labels: {{app: web}}
      annotations: {{{GROUP_KEY}: web}}
    spec:
      terminationGracePeriodSeconds: 10
      containers:
      - name: serve
        image: {image}
        imagePullPolicy: Never
        env:
        - name: POD_NAME
          valueFrom: {{fieldRef: {{fieldPath: metadata.name}}}}
        args: ["serve", "$(POD_NAME)", "--drain", "4", "8080", "8443"]
        readinessProbe:
          exec: {{command: ["/pw-workload", "ready"]}}
          periodSeconds: 1
"#
    ))?;
    node.kubectl(&[
        "-n",
        ns,
        "rollout",
        "status",
        "deployment/web",
        "--timeout=120s",
    ])?;
    wait_ready(node, ns, &["client"])?;
    let web_pods = || -> Result<Vec<String>> {
        // Pods not being deleted: "NAME" alone on the line.
        let out = node.kubectl(&["-n", ns, "get", "pods", "-l", "app=web", "-o", r#"jsonpath={range .items[*]}{.metadata.name} {.metadata.deletionTimestamp}{"\n"}{end}"#])?;
        let mut v: Vec<String> = out
            .lines()
            .filter(|l| l.split_whitespace().count() == 1)
            .map(|l| l.trim().to_string())
            .collect();
        v.sort();
        Ok(v)
    };
    let old = web_pods()?;
    let ip = cluster_ip(node, ns, "shop")?;
    let old_refs: Vec<&str> = old.iter().map(String::as_str).collect();
    node.expect_answers(
        (ns, "client"),
        (&ip, 80),
        &old_refs,
        Duration::from_secs(60),
    )
    .await?;

    let history = SliceHistory::start(node.client(), ns, "shop");
    let traffic = node.traffic((ns, "client"), (&ip, 80), 500, Duration::from_millis(50))?;
    node.kubectl(&["-n", ns, "rollout", "restart", "deployment/web"])?;
    node.kubectl(&[
        "-n",
        ns,
        "rollout",
        "status",
        "deployment/web",
        "--timeout=120s",
    ])?;
    // The old pods drain (4 s) and go.
    node.kubectl(&[
        "-n",
        ns,
        "wait",
        "--for=delete",
        "--timeout=60s",
        &format!("pod/{}", old[0]),
        &format!("pod/{}", old[1]),
    ])?;
    let new = web_pods()?;
    ensure!(
        new.iter().all(|p| !old.contains(p)) && new.len() == 2,
        "after the rollout: {old:?} -> {new:?}"
    );
    let new_refs: Vec<&str> = new.iter().map(String::as_str).collect();
    let client = node.client();
    portwise_tests::wait_for(Duration::from_secs(30), || async {
        let have = ready_members(&client, ns, "shop").await?;
        let want =
            portwise_tests::node::members([("http", &new_refs[..]), ("https", &new_refs[..])]);
        ensure!(have == want, "published {have:?}, want {want:?}");
        Ok(())
    })
    .await?;
    let answers = traffic.finish()?;
    ensure!(
        answers.refused == 0 && answers.failed == 0,
        "traffic across the rollout: {answers:?}"
    );
    for pod in &old {
        ensure!(
            history.saw_endpoints("http", |eps| eps.iter().any(
                |(p, ready, serving, terminating)| p == pod && !ready && *serving && *terminating
            )),
            "{pod} was never published as terminating and serving: {:?}",
            history.versions()
        );
    }

    helm_uninstall(node, "portwise")?;
    delete_namespace(node, ns)?;
    Ok(())
}
