//! The in-cluster portwise publishes a colocated Service whose pods are
//! real containers, and kube-proxy routes each ClusterIP port only to that
//! port's members: shown by traffic from a client pod.

use std::time::Duration;

use anyhow::{Result, ensure};
use portwise_tests::node::{RealNode, SliceHistory, members, ready_members, slice_writes_by};

use crate::support::*;

/// The namespace of one scenario, and its client pod.
pub struct Shop {
    pub ns: String,
    pub ip: String,
}

/// The seed's shape on real containers: `a` serves http (8080) and https
/// (8443), `b` only http, `c` only https; `client` sends the traffic.
pub async fn shop(node: &RealNode, ns: &str) -> Result<Shop> {
    let image = node.workload_image()?;
    let mut manifest = namespace(ns);
    manifest += "---\n";
    manifest += &colocated_service(
        ns,
        "shop",
        "shop",
        &[("http", 80, 8080), ("https", 443, 8443)],
    );
    for (pod, ports) in [
        ("a", &[8080, 8443][..]),
        ("b", &[8080][..]),
        ("c", &[8443][..]),
    ] {
        manifest += "---\n";
        manifest += &member_pod(image, ns, pod, "shop", ports, 0);
    }
    manifest += "---\n";
    manifest += &client_pod(image, ns, "client");
    node.apply(&manifest)?;
    wait_ready(node, ns, &["a", "b", "c", "client"])?;
    Ok(Shop {
        ns: ns.to_string(),
        ip: cluster_ip(node, ns, "shop")?,
    })
}

impl Shop {
    /// Waits until portwise published exactly these ready members, and
    /// kube-proxy routes each port to exactly them.
    pub async fn expect(&self, node: &RealNode, http: &[&str], https: &[&str]) -> Result<()> {
        let want = members([("http", http), ("https", https)]);
        let client = node.client();
        portwise_tests::wait_for(Duration::from_secs(60), || async {
            let have = ready_members(&client, &self.ns, "shop").await?;
            ensure!(have == want, "published {have:?}, want {want:?}");
            Ok(())
        })
        .await?;
        let within = Duration::from_secs(30);
        node.expect_answers((&self.ns, "client"), (&self.ip, 80), http, within)
            .await?;
        node.expect_answers((&self.ns, "client"), (&self.ip, 443), https, within)
            .await?;
        Ok(())
    }
}

/// Where most node tests start: the chart's portwise judging every port by
/// readiness and a TCP dial (2/2 Ready, one leader), and the shop in `ns`
/// published and routed. Returns the shop, the Ready replicas and the leader.
pub async fn installed_shop(node: &RealNode, ns: &str) -> Result<(Shop, Vec<String>, String)> {
    helm_install(node, "portwise", &["--set-json", DIAL_MEMBERSHIP])?;
    let (ready, leader) = two_ready_one_leader(node, "portwise").await?;
    let shop = shop(node, ns).await?;
    shop.expect(node, &["a", "b"], &["a", "c"]).await?;
    Ok((shop, ready, leader))
}

/// Uninstalls the release and removes the shop's namespace.
pub fn uninstall_with_shop(node: &RealNode, shop: &Shop) -> Result<()> {
    helm_uninstall(node, "portwise")?;
    delete_namespace(node, &shop.ns)
}

pub const PORTWISE_SA: &str = "system:serviceaccount:portwise-system:portwise";

/// The colocated Service, published by the chart's portwise from TCP dials
/// to real containers, routed by kube-proxy; and the troubleshooting
/// command the chart's notes give, run in the pod, says why `b` is not an
/// https member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_cluster_portwise_publishes_each_ports_members_and_kube_proxy_routes_by_them()
-> Result<()> {
    let node = RealNode::shared().await?;
    let (shop, _, _) = installed_shop(node, "shop-publish").await?;

    let verdicts = node.kubectl(&[
        "-n",
        SYSTEM_NS,
        "exec",
        "deploy/portwise",
        "--",
        "/portwise",
        "check",
        "--live",
        "--config",
        "/etc/portwise/config/config.yaml",
        "--service",
        "shop-publish/shop",
    ])?;
    let line = |port: &str, pod: &str| {
        verdicts
            .lines()
            .find(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() > 4 && f[0] == port && f[2] == pod
            })
            .map(str::to_string)
    };
    for (port, pod, verdict) in [
        ("http", "a", "include"),
        ("http", "b", "include"),
        ("http", "c", "exclude"),
        ("https", "a", "include"),
        ("https", "b", "exclude"),
        ("https", "c", "include"),
    ] {
        let l = line(port, pod);
        ensure!(
            l.as_deref()
                .is_some_and(|l| l.split_whitespace().nth(4) == Some(verdict)),
            "check --live: {port} {pod} should be {verdict}: {l:?}\n{verdicts}"
        );
    }
    let why = line("https", "b").unwrap_or_default();
    ensure!(
        why.contains("connection refused"),
        "check --live does not say why b is out of https: {why}"
    );

    uninstall_with_shop(node, &shop)
}

/// A failing readiness probe and a killed container, each seen in the
/// slices and in the traffic, and their recovery too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_probe_and_a_killed_container_leave_and_rejoin() -> Result<()> {
    let node = RealNode::shared().await?;
    let (shop, _, _) = installed_shop(node, "shop-changes").await?;

    // b's readiness probe fails: b leaves http (and https had no b).
    node.kubectl(&["-n", &shop.ns, "exec", "b", "--", "/pw-workload", "unready"])?;
    shop.expect(node, &["a"], &["a", "c"]).await?;
    node.kubectl(&["-n", &shop.ns, "exec", "b", "--", "/pw-workload", "recover"])?;
    shop.expect(node, &["a", "b"], &["a", "c"]).await?;

    // c's container is killed (SIGKILL through containerd, as the OOM
    // killer would): c leaves https until the kubelet has restarted it and
    // its readiness probe passed. The kubelet restarts a first crash at
    // once, so the gap lasts about a second: a watch sees it.
    let history = SliceHistory::start(node.client(), &shop.ns, "shop");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let id = container_id(node, &shop.ns, "c")?;
    node.ctr(&["tasks", "kill", "--signal", "SIGKILL", &id])?;
    portwise_tests::wait_for(Duration::from_secs(30), || async {
        ensure!(
            history.saw("https", |m| m == ["a"]),
            "no version of the https slice without c: {:?}",
            history.versions()
        );
        Ok(())
    })
    .await?;
    shop.expect(node, &["a", "b"], &["a", "c"]).await?;
    let restarts = node.kubectl(&[
        "-n",
        &shop.ns,
        "get",
        "pod",
        "c",
        "-o",
        "jsonpath={.status.containerStatuses[0].restartCount}",
    ])?;
    ensure!(
        restarts.trim() != "0",
        "c rejoined without a restart: restartCount {restarts}"
    );

    uninstall_with_shop(node, &shop)
}

/// `helm uninstall` leaves the slices as they were: traffic keeps flowing
/// to the last published members (nothing deletes what the Service owns;
/// the garbage collector removes them with the Service). A new install
/// takes them over without a write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_uninstall_leaves_the_slices_and_a_reinstall_adopts_them_without_a_write() -> Result<()>
{
    let node = RealNode::shared().await?;
    let (shop, _, _) = installed_shop(node, "shop-uninstall").await?;
    let client = node.client();
    let before = portwise_tests::node::published(&client, &shop.ns, "shop").await?;

    helm_uninstall_release(node, "portwise")?;
    let after = portwise_tests::node::published(&client, &shop.ns, "shop").await?;
    ensure!(
        after == before,
        "helm uninstall changed the slices: {before:?} -> {after:?}"
    );
    shop.expect(node, &["a", "b"], &["a", "c"]).await?;

    let writes_before = slice_writes_by(&node.audit_log(), PORTWISE_SA)?.len();
    node.helm(&[
        "install",
        "portwise",
        "deploy/helm",
        "-n",
        SYSTEM_NS,
        "--wait",
        "--timeout",
        "3m",
        "--set-json",
        DIAL_MEMBERSHIP,
    ])?;
    two_ready_one_leader(node, "portwise").await?;
    // Long enough for the new leader's cold start and one resync of
    // probes (the chart's resyncPeriod is 30 s; the cold start judges all).
    tokio::time::sleep(Duration::from_secs(5)).await;
    shop.expect(node, &["a", "b"], &["a", "c"]).await?;
    let writes = slice_writes_by(&node.audit_log(), PORTWISE_SA)?;
    ensure!(
        writes.len() == writes_before,
        "the reinstalled portwise wrote slices it should have adopted as they were: {:?}",
        &writes[writes_before..]
    );

    uninstall_with_shop(node, &shop)
}

/// Issue 48 on the real node: the chart installs the MembershipPolicy CRD
/// and, with `config.membershipPolicies` set, a team's policy in the shop's
/// namespace decides the shop once the Service names it: b, which answers
/// the dial but whose pod does not list `http`, leaves http, and
/// kube-proxy routes http to a alone. The policy's status, written by the
/// in-cluster leader under the chart's RBAC, says Accepted and one Service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_teams_membership_policy_decides_a_service_on_the_real_node() -> Result<()> {
    let node = RealNode::shared().await?;
    helm_install(
        node,
        "portwise",
        &[
            "--set-json",
            DIAL_MEMBERSHIP,
            "--set-json",
            "config.membershipPolicies={}",
        ],
    )?;
    two_ready_one_leader(node, "portwise").await?;
    let shop = shop(node, "shop-policy").await?;
    shop.expect(node, &["a", "b"], &["a", "c"]).await?;

    let ports = "app.example.com/ports";
    for (pod, listed) in [("a", "http,https"), ("c", "https")] {
        node.kubectl(&[
            "-n",
            &shop.ns,
            "annotate",
            "pod",
            pod,
            &format!("{ports}={listed}"),
        ])?;
    }
    node.apply(&format!(
        "apiVersion: portwise.io/v1alpha1\nkind: MembershipPolicy\n\
         metadata: {{name: tagged, namespace: {}}}\n\
         spec:\n  membership: {{all: [{{tcpDial: {{timeout: 1s}}}}, {{portNames: {{annotation: {ports}}}}}]}}\n",
        shop.ns
    ))?;
    node.kubectl(&[
        "-n",
        &shop.ns,
        "annotate",
        "service",
        "shop",
        "portwise.io/membership=tagged",
    ])?;
    shop.expect(node, &["a"], &["a", "c"]).await?;
    portwise_tests::wait_for(Duration::from_secs(60), || async {
        let columns = node.kubectl(&[
            "-n",
            &shop.ns,
            "get",
            "membershippolicy",
            "tagged",
            "-o",
            r#"jsonpath={.status.conditions[?(@.type=="Accepted")].status} {.status.services}"#,
        ])?;
        ensure!(columns.trim() == "True 1", "status: {columns:?}");
        Ok(())
    })
    .await?;

    uninstall_with_shop(node, &shop)
}
