//! Manifests and steps the node tests share.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use portwise_tests::node::RealNode;

/// Where the docs install portwise.
pub const SYSTEM_NS: &str = "portwise-system";
/// The key the chart's default config aligns Services and pods by.
pub const GROUP_KEY: &str = "portwise.io/group";

/// `helm install RELEASE deploy/helm -n portwise-system --create-namespace
/// --wait`, as docs/operations.md says, with `extra` values.
pub fn helm_install(node: &RealNode, release: &str, extra: &[&str]) -> Result<String> {
    // A test that failed half-way left its release: start clean.
    node.helm(&[
        "uninstall",
        release,
        "-n",
        SYSTEM_NS,
        "--ignore-not-found",
        "--wait",
    ])?;
    let mut args = vec![
        "install",
        release,
        "deploy/helm",
        "-n",
        SYSTEM_NS,
        "--create-namespace",
        "--wait",
        "--timeout",
        "3m",
    ];
    args.extend_from_slice(extra);
    node.helm(&args)
}

/// `helm uninstall RELEASE -n portwise-system --wait`, then the namespace
/// goes too, so that the next test starts from an empty cluster.
pub fn helm_uninstall(node: &RealNode, release: &str) -> Result<()> {
    helm_uninstall_release(node, release)?;
    delete_namespace(node, SYSTEM_NS)
}

/// `helm uninstall RELEASE -n portwise-system --wait`, and the release's
/// pods gone (the ReplicaSet's pods go after it, by garbage collection).
pub fn helm_uninstall_release(node: &RealNode, release: &str) -> Result<()> {
    node.helm(&[
        "uninstall",
        release,
        "-n",
        SYSTEM_NS,
        "--wait",
        "--timeout",
        "2m",
    ])?;
    node.kubectl(&[
        "-n",
        SYSTEM_NS,
        "wait",
        "--for=delete",
        "pod",
        "-l",
        &format!("app.kubernetes.io/instance={release}"),
        "--timeout=60s",
    ])?;
    Ok(())
}

pub fn delete_namespace(node: &RealNode, ns: &str) -> Result<()> {
    node.kubectl(&[
        "delete",
        "namespace",
        ns,
        "--ignore-not-found",
        "--wait=true",
        "--timeout=120s",
    ])?;
    Ok(())
}

/// The pods of portwise's Deployment `name` that are Ready, and the
/// Lease's holder.
pub fn ready_replicas_and_leader(node: &RealNode, name: &str) -> Result<(Vec<String>, String)> {
    let pods = node.kubectl(&[
        "-n",
        SYSTEM_NS,
        "get",
        "pods",
        "-l",
        &format!("app.kubernetes.io/name={name}"),
        "-o",
        r#"jsonpath={range .items[*]}{.metadata.name} {.status.conditions[?(@.type=="Ready")].status} {.metadata.deletionTimestamp}{"\n"}{end}"#,
    ])?;
    let ready = pods
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 2 && f[1] == "True").then(|| f[0].to_string())
        })
        .collect();
    let holder = node
        .kubectl(&[
            "-n",
            SYSTEM_NS,
            "get",
            "lease",
            name,
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ])
        .unwrap_or_default();
    // portwise's identity is POD_NAME_SUFFIX (--identity=$(POD_NAME) plus
    // a per-process suffix).
    let leader = holder
        .rsplit_once('_')
        .map(|(p, _)| p)
        .unwrap_or(&holder)
        .to_string();
    Ok((ready, leader))
}

/// Waits until `name` has `n` Ready replicas and one of them holds the Lease.
pub async fn two_ready_one_leader(node: &RealNode, name: &str) -> Result<(Vec<String>, String)> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let (ready, leader) = ready_replicas_and_leader(node, name)?;
        if ready.len() == 2 && ready.contains(&leader) {
            return Ok((ready, leader));
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "{name}: wanted 2 Ready replicas, one of them the Lease holder; have {ready:?}, holder {leader:?}\n{}",
            node.kubectl(&["-n", SYSTEM_NS, "get", "pods,lease", "-o", "wide"])
                .unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A workload pod of group `group`: a real container serving `ports`
/// (answering with its name), Ready through an exec probe the test can fail
/// (`pw-workload unready`), draining `drain` seconds after SIGTERM.
pub fn member_pod(
    image: &str,
    ns: &str,
    name: &str,
    group: &str,
    ports: &[u16],
    drain: u32,
) -> String {
    let ports_args: String = ports.iter().map(|p| format!(", \"{p}\"")).collect();
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {ns}
  annotations:
    {GROUP_KEY}: {group}
spec:
  terminationGracePeriodSeconds: {grace}
  containers:
  - name: serve
    image: {image}
    imagePullPolicy: Never
    args: ["serve", "{name}", "--drain", "{drain}"{ports_args}]
    readinessProbe:
      exec: {{command: ["/pw-workload", "ready"]}}
      periodSeconds: 1
      failureThreshold: 1
      successThreshold: 1
"#,
        grace = drain + 5
    )
}

/// A client pod: `pw-workload connect` from inside the cluster.
pub fn client_pod(image: &str, ns: &str, name: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {ns}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: client
    image: {image}
    imagePullPolicy: Never
    args: ["sleep"]
"#
    )
}

/// A colocated Service: no selector, the group key, and `ports`
/// (name, port, target port).
pub fn colocated_service(ns: &str, name: &str, group: &str, ports: &[(&str, u16, u16)]) -> String {
    let ports: String = ports
        .iter()
        .map(|(n, p, t)| format!("  - {{name: {n}, port: {p}, targetPort: {t}, protocol: TCP}}\n"))
        .collect();
    format!(
        r#"apiVersion: v1
kind: Service
metadata:
  name: {name}
  namespace: {ns}
  annotations:
    {GROUP_KEY}: {group}
spec:
  ports:
{ports}"#
    )
}

pub fn namespace(ns: &str) -> String {
    format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n")
}

/// Waits for pods to be Ready (kubectl wait).
pub fn wait_ready(node: &RealNode, ns: &str, pods: &[&str]) -> Result<()> {
    let mut args = vec!["-n", ns, "wait", "--for=condition=Ready", "--timeout=90s"];
    let names: Vec<String> = pods.iter().map(|p| format!("pod/{p}")).collect();
    args.extend(names.iter().map(String::as_str));
    node.kubectl(&args).map(|_| ())
}

/// The ClusterIP of Service `ns/name`.
pub fn cluster_ip(node: &RealNode, ns: &str, name: &str) -> Result<String> {
    let ip = node.kubectl(&[
        "-n",
        ns,
        "get",
        "service",
        name,
        "-o",
        "jsonpath={.spec.clusterIP}",
    ])?;
    ensure!(!ip.is_empty(), "Service {ns}/{name} has no ClusterIP");
    Ok(ip)
}

/// Values that make the chart's portwise judge every port by the pod's
/// readiness and a TCP dial to the port: a pod backs exactly the ports it
/// really serves.
pub const DIAL_MEMBERSHIP: &str =
    r#"config.membership={"all":["podReady",{"tcpDial":{"timeout":"1s"}}]}"#;

/// A pod's container ID as containerd knows it.
pub fn container_id(node: &RealNode, ns: &str, pod: &str) -> Result<String> {
    let id = node.kubectl(&[
        "-n",
        ns,
        "get",
        "pod",
        pod,
        "-o",
        "jsonpath={.status.containerStatuses[0].containerID}",
    ])?;
    id.strip_prefix("containerd://")
        .map(str::to_string)
        .with_context(|| format!("pod {ns}/{pod} has no containerd container ID yet ({id:?})"))
}
