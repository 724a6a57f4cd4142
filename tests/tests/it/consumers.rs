//! Issue 11: what real consumers do with portwise's slices. kube-proxy
//! (both data-path modes) and CoreDNS, built from upstream, run inside the
//! test network namespace; every pod listens on every port and answers with
//! its own name, so only the slices can explain who answers.

use std::{
    net::{IpAddr, SocketAddr},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail, ensure};
use hickory_proto::{op::ResponseCode, rr::RecordType};
use k8s_openapi::api::core::v1::{Endpoints, Pod};
use portwise_tests::{consumers::*, *};

/// How long kube-proxy may take to route by a change portwise published:
/// slices settle within SETTLE, rules a second or so after.
const ROUTED: Duration = Duration::from_secs(40);

async fn pod_ips(ns: &TestNs, name: &str) -> Result<Vec<IpAddr>> {
    let pod: Pod = ns.get_pod(name).await?;
    pod.status
        .and_then(|s| s.pod_ips)
        .unwrap_or_default()
        .iter()
        .map(|ip| ip.ip.parse::<IpAddr>().context("pod IP"))
        .collect()
}

/// Name servers for `pods` on every port in `ports`, on every pod address.
async fn serve(ns: &TestNs, pods: &[&str], ports: &[u16]) -> Result<Vec<NameServer>> {
    let mut with_ips = Vec::new();
    for p in pods {
        with_ips.push((*p, pod_ips(ns, p).await?));
    }
    name_servers(&with_ips, ports).await
}

async fn service_addr(ns: &TestNs, svc: &str, port: u16, v6: bool) -> Result<SocketAddr> {
    let svc = ns.get_service(svc).await?;
    Ok(SocketAddr::new(cluster_ip(&svc, v6)?, port))
}

fn figure(what: &str, took: Duration) {
    eprintln!("figure: {what}: {} ms", took.as_millis());
}

/// The seed example, published by portwise, every pod serving both ports,
/// behind a kube-proxy: what the kube-proxy tests start from.
struct SeedBehindProxy {
    pw: Portwise,
    _servers: Vec<NameServer>,
    proxy: KubeProxy,
    http: SocketAddr,
    https: SocketAddr,
}

async fn seed_behind_proxy(
    cp: &'static ControlPlane,
    ns: &TestNs,
    mode: ProxyMode,
) -> Result<SeedBehindProxy> {
    let pw = seed_scenario(ns)
        .expect(
            "my-service",
            seed_slices(&["a", "b", "c"], &["b", "c", "d"]),
        )
        .start()
        .await?;
    let _servers = serve(ns, &["a", "b", "c", "d"], &[8080, 8443]).await?;
    let proxy = KubeProxy::start(cp, mode).await?;
    let http = service_addr(ns, "my-service", 8080, false).await?;
    let https = service_addr(ns, "my-service", 8443, false).await?;
    expect_answers(http, &["a", "b", "c"], ROUTED).await?;
    Ok(SeedBehindProxy {
        pw,
        _servers,
        proxy,
        http,
        https,
    })
}

// ---- kube-proxy ------------------------------------------------------------

/// The seed example through its ClusterIP: for each port, the pods that
/// answer are exactly that port's members, and a readiness flip, an
/// annotation change and a pod deletion each change who answers. A port
/// left without members refuses connections.
async fn routes_each_port_to_its_members(cp: &'static ControlPlane, mode: ProxyMode) -> Result<()> {
    let ns = TestNs::new(cp, &format!("kp-{}", mode.flag())).await?;
    let SeedBehindProxy {
        proxy, http, https, ..
    } = &seed_behind_proxy(cp, &ns, mode).await?;
    let (http, https) = (*http, *https);
    let routed = |addr, pods: &'static [&'static str]| async move {
        expect_answers(addr, pods, ROUTED)
            .await
            .with_context(|| format!("kube-proxy log:\n{}", proxy.log_tail()))
    };

    routed(https, &["b", "c", "d"]).await?;

    // Readiness: b leaves both ports.
    let t = Instant::now();
    ns.set_ready("b", false).await?;
    routed(http, &["a", "c"]).await?;
    figure(
        &format!(
            "{} readiness flip to routed (40 answers agree)",
            mode.flag()
        ),
        t.elapsed(),
    );
    routed(https, &["c", "d"]).await?;

    // The annotation: a joins https. Its first answer there is the moment
    // the data path reflects the change.
    let t = Instant::now();
    ns.annotate_pod("a", PORTS_KEY, Some("http,https")).await?;
    let first = first_reflecting_answer(https, t, ROUTED, |a| a.as_deref() == Some("a")).await?;
    figure(
        &format!("{} annotation change to first answer", mode.flag()),
        first,
    );
    routed(https, &["a", "c", "d"]).await?;

    // Deletion: d leaves https.
    ns.delete_pod("d").await?;
    routed(https, &["a", "c"]).await?;

    // Back to ready: b's first answer on http.
    let t = Instant::now();
    ns.set_ready("b", true).await?;
    let first = first_reflecting_answer(http, t, ROUTED, |a| a.as_deref() == Some("b")).await?;
    figure(
        &format!("{} readiness flip to first answer", mode.flag()),
        first,
    );
    routed(http, &["a", "b", "c"]).await?;
    routed(https, &["a", "b", "c"]).await?;

    // No members left on https: kube-proxy rejects, while http still routes.
    for p in ["a", "b", "c"] {
        ns.annotate_pod(p, PORTS_KEY, Some("http")).await?;
    }
    routed(https, &[]).await?;
    routed(http, &["a", "b", "c"]).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_proxy_routes_each_port_to_its_members_nftables() -> Result<()> {
    routes_each_port_to_its_members(ControlPlane::shared().await?, ProxyMode::Nftables).await
}

// The Kubernetes matrix: each minor's own kube-proxy (the minor's
// portwise-cp), nftables, routing the seed Service per port.
on_older_minors!(kube_proxy_routes_each_port_to_its_members_nftables => routes_nftables_on);

async fn routes_nftables_on(cp: &'static ControlPlane) -> Result<()> {
    routes_each_port_to_its_members(cp, ProxyMode::Nftables).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_proxy_routes_each_port_to_its_members_iptables() -> Result<()> {
    routes_each_port_to_its_members(ControlPlane::shared().await?, ProxyMode::Iptables).await
}

/// A dual-stack ClusterIP: each family's address reaches only that
/// family's members.
/// Two Service ports on one target port (issue 26): `web: 80→8080` and
/// `alt: 8090→8080`. A pod backing both is published once, in a slice
/// listing both ports; kube-proxy still routes each port to exactly its
/// members through every change of who backs which, and the slices keep
/// each (address, port number) in one slice, which Cilium needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_ports_on_one_target_port_route_to_their_own_members() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "kp-shared-target").await?;
    let svc = service("colo")
        .annotation(GROUP_KEY, "colo")
        .port_to("web", 80, serde_json::json!(8080))
        .port_to("alt", 8090, serde_json::json!(8080));
    let expected = |web: &[&str], alt: &[&str]| by_port([(("web", V4), web), (("alt", V4), alt)]);
    let _pw = Scenario::new(&ns)
        .service(svc)
        .pods(
            [("a", "web"), ("b", "web,alt"), ("c", "alt")].map(|(n, ports)| {
                seed_pod(n, ports)
                    .annotation(GROUP_KEY, "colo")
                    .ips(next_ips().v4())
            }),
        )
        .config(&config(SEED_MEMBERSHIP))
        .expect("colo", expected(&["a", "b"], &["b", "c"]))
        .start()
        .await?;
    let _servers = serve(&ns, &["a", "b", "c"], &[8080]).await?;
    let proxy = KubeProxy::start(cp, ProxyMode::Nftables).await?;
    let web = service_addr(&ns, "colo", 80, false).await?;
    let alt = service_addr(&ns, "colo", 8090, false).await?;
    let routed = |addr, pods: &'static [&'static str]| {
        let proxy = &proxy;
        async move {
            expect_answers(addr, pods, ROUTED)
                .await
                .with_context(|| format!("kube-proxy log:\n{}", proxy.log_tail()))
        }
    };
    let shared_slices = || async {
        let slices = slices_for(&ns, "colo").await?;
        Ok::<_, anyhow::Error>(
            slices
                .iter()
                .filter(|s| s.ports.as_ref().is_some_and(|p| p.len() == 2))
                .map(|s| s.metadata.name.clone().unwrap_or_default())
                .collect::<Vec<_>>(),
        )
    };
    routed(web, &["a", "b"]).await?;
    routed(alt, &["b", "c"]).await?;
    let layout: Vec<(String, Vec<String>)> = slices_for(&ns, "colo")
        .await?
        .iter()
        .map(|s| {
            (
                s.metadata.name.clone().unwrap_or_default(),
                s.ports
                    .iter()
                    .flatten()
                    .map(|p| format!("{}:{:?}", p.name.clone().unwrap_or_default(), p.port))
                    .collect(),
            )
        })
        .collect();
    ensure!(
        shared_slices().await? == vec!["colo-alt.web".to_string()],
        "b backs both ports on 8080, so one slice lists both: {layout:?}"
    );
    slice_invariants(&ns, "colo", 100).await?;

    // The sequence the Cilium test walks too; each step checked by traffic.
    let steps: [(&str, &str, &[&str], &[&str]); 5] = [
        ("b", "web", &["a", "b"], &["c"]),
        ("b", "web,alt", &["a", "b"], &["b", "c"]),
        ("b", "alt", &["a"], &["b", "c"]),
        ("c", "web,alt", &["a", "c"], &["b", "c"]),
        ("a", "alt", &["c"], &["a", "b", "c"]),
    ];
    for (pod, ports, on_web, on_alt) in steps {
        ns.annotate_pod(pod, PORTS_KEY, Some(ports)).await?;
        expect_endpoints(&ns, "colo", expected(on_web, on_alt))
            .await
            .with_context(|| format!("{pod} now backs {ports}"))?;
        routed(web, on_web).await?;
        routed(alt, on_alt).await?;
        slice_invariants(&ns, "colo", 100).await?;
        ensure!(
            slices_for(&ns, "colo").await?.iter().all(|s| s
                .metadata
                .annotations
                .as_ref()
                .is_none_or(|a| !a.contains_key("portwise.io/moving-in"))),
            "a move left its marker behind"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dual_stack_cluster_ip_reaches_each_family_members() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "kp-dual").await?;
    let (both, v4, v6) = (next_ips(), next_ips(), next_ips());
    let _pw = Scenario::new(&ns)
        .service(
            service("web")
                .annotation(GROUP_KEY, "g")
                .dual_stack()
                .port("http", 8080),
        )
        .pod(pod("both").annotation(GROUP_KEY, "g").ips(both.dual()))
        .pod(pod("four").annotation(GROUP_KEY, "g").ips(v4.v4()))
        .pod(pod("six").annotation(GROUP_KEY, "g").ips(v6.v6()))
        .expect(
            "web",
            by_port([
                (("http", V4), &["both", "four"][..]),
                (("http", V6), &["both", "six"][..]),
            ]),
        )
        .start()
        .await?;
    // Every pod listens on every address it has, and on the other family's
    // addresses of the others too would be pointless: a family's slices
    // are the only route to its addresses.
    let _servers = serve(&ns, &["both", "four", "six"], &[8080]).await?;
    let _proxy = KubeProxy::start(cp, ProxyMode::Nftables).await?;
    expect_answers(
        service_addr(&ns, "web", 8080, false).await?,
        &["both", "four"],
        ROUTED,
    )
    .await?;
    expect_answers(
        service_addr(&ns, "web", 8080, true).await?,
        &["both", "six"],
        ROUTED,
    )
    .await?;
    Ok(())
}

/// A terminating pod that the checker still includes is published serving
/// but not ready: kube-proxy sends it no new connections while ready
/// members exist, and falls back to it when none do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminating_members_get_no_new_connections_while_ready_ones_exist() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "kp-term").await?;
    let node = ns.ensure_node("n1", "z1").await?;
    let _pw = Scenario::new(&ns)
        .service(service("web").annotation(GROUP_KEY, "g").port("http", 8080))
        .pods(["a", "b", "old"].map(|p| {
            pod(p)
                .annotation(GROUP_KEY, "g")
                .node(&node)
                .held()
                .ips(next_ips().v4())
        }))
        .expect("web", by_port([(("http", V4), &["a", "b", "old"][..])]))
        .start()
        .await?;
    let _servers = serve(&ns, &["a", "b", "old"], &[8080]).await?;
    let _proxy = KubeProxy::start(cp, ProxyMode::Nftables).await?;
    let addr = service_addr(&ns, "web", 8080, false).await?;
    expect_answers(addr, &["a", "b", "old"], ROUTED).await?;

    // `old` terminates but stays Ready: podReady still includes it, as
    // ready: false, serving: true, terminating: true.
    ns.terminate_pod("old").await?;
    wait_for(SETTLE, || async {
        let views = endpoint_views(&ns, "web").await?;
        let old = views
            .iter()
            .find(|v| v.pod == "old")
            .context("old is not published")?;
        ensure!(
            old.ready == Some(false) && old.serving == Some(true) && old.terminating == Some(true),
            "old: {old:?}"
        );
        Ok(())
    })
    .await?;
    expect_answers(addr, &["a", "b"], ROUTED).await?;

    // No ready member left: kube-proxy falls back to the serving,
    // terminating one rather than refusing.
    ns.set_ready("a", false).await?;
    ns.set_ready("b", false).await?;
    expect_answers(addr, &["old"], ROUTED).await?;
    for p in ["a", "b", "old"] {
        ns.release_pod(p).await?;
    }
    Ok(())
}

/// kube-proxy's `network_programming_duration_seconds` reads the
/// `endpoints.kubernetes.io/last-change-trigger-time` annotation: it must
/// count portwise's changes, as it counts the native controller's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_proxy_counts_portwise_changes_in_programming_latency() -> Result<()> {
    const HISTOGRAM: &str = "kubeproxy_network_programming_duration_seconds_count";
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "kp-latency").await?;
    let SeedBehindProxy { proxy, http, .. } =
        &seed_behind_proxy(cp, &ns, ProxyMode::Nftables).await?;
    let http = *http;
    let before = proxy.metrics().await?.sum(HISTOGRAM, &[]);

    // b flips: it sits with c in the slice of both ports, which each flip
    // updates. (a alone has the slice of http alone: a flip would delete
    // and re-create it, and kube-proxy dates no deletion, for the native
    // controller's slices either.)
    for (i, ready) in [false, true, false, true].into_iter().enumerate() {
        ns.set_ready("b", ready).await?;
        let want: &[&str] = if ready { &["a", "b", "c"] } else { &["a", "c"] };
        expect_answers(http, want, ROUTED)
            .await
            .with_context(|| format!("flip {i}"))?;
    }
    let after = wait_for(Duration::from_secs(10), || async {
        let n = proxy.metrics().await?.sum(HISTOGRAM, &[]);
        if n >= before + 4.0 {
            Ok(n)
        } else {
            bail!("{HISTOGRAM}: {before} before four changes, {n} after")
        }
    })
    .await?;
    eprintln!("{HISTOGRAM}: {before} -> {after}");
    Ok(())
}

// ---- CoreDNS -----------------------------------------------------------------

/// A headless seed example whose pods name themselves through
/// hostname/subdomain, so SRV targets read as pod names.
fn headless_seed(ns: &TestNs, svc: ServiceBuilder) -> Scenario<'_> {
    seed_scenario_with(ns, svc, |name, pod| {
        pod.hostname(name)
            .subdomain("my-service")
            .ips(next_ips().dual())
    })
}

/// SRV targets as pod names (`a.my-service.NS.svc.cluster.local.` -> `a`),
/// deduplicated over the families.
fn srv_pods(answer: &Answer) -> Vec<String> {
    let mut pods: Vec<String> = answer
        .srv
        .iter()
        .map(|(target, _)| target.split('.').next().unwrap_or_default().to_string())
        .collect();
    pods.sort();
    pods.dedup();
    pods
}

async fn expect_srv(dns: &CoreDns, ns: &TestNs, port: &str, pods: &[&str]) -> Result<()> {
    let name = srv_name(port, "my-service", ns.name());
    wait_for(SETTLE, || async {
        let answer = dns.query(&name, RecordType::SRV).await?;
        if pods.is_empty() {
            ensure!(answer.code == ResponseCode::NXDomain, "{name}: {answer:?}");
        } else {
            ensure!(
                answer.code == ResponseCode::NoError && srv_pods(&answer) == pods,
                "{name}: wanted {pods:?}, got {answer:?}"
            );
        }
        Ok(())
    })
    .await
}

async fn addresses_of(ns: &TestNs, pods: &[&str], v6: bool) -> Result<Vec<IpAddr>> {
    let mut out = Vec::new();
    for p in pods {
        out.extend(
            pod_ips(ns, p)
                .await?
                .into_iter()
                .filter(|ip| ip.is_ipv6() == v6),
        );
    }
    out.sort();
    Ok(out)
}

async fn expect_addresses(dns: &CoreDns, ns: &TestNs, svc: &str, pods: &[&str]) -> Result<()> {
    let name = service_name(svc, ns.name());
    for (rtype, v6) in [(RecordType::A, false), (RecordType::AAAA, true)] {
        let want = addresses_of(ns, pods, v6).await?;
        wait_for(SETTLE, || async {
            let answer = dns.query(&name, rtype).await?;
            ensure!(
                answer.addresses == want,
                "{name} {rtype}: wanted {want:?}, got {answer:?}"
            );
            Ok(())
        })
        .await?;
    }
    Ok(())
}

/// A headless selector-less Service: `_port._tcp` SRV answers list exactly
/// each port's members and follow changes; A/AAAA are the union over the
/// ports; a port without members is NXDOMAIN; no legacy Endpoints exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coredns_srv_lists_each_ports_members() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "dns-srv").await?;
    let _pw = headless_seed(
        &ns,
        service("my-service")
            .annotation(GROUP_KEY, "my-group")
            .headless()
            .dual_stack()
            .port("http", 8080)
            .port("https", 8443)
            .port("admin", 9000),
    )
    .start()
    .await?;
    let dns = CoreDns::start(cp).await?;

    expect_srv(&dns, &ns, "http", &["a", "b", "c"]).await?;
    expect_srv(&dns, &ns, "https", &["b", "c", "d"]).await?;
    // Nobody lists admin: its slices are empty placeholders.
    expect_srv(&dns, &ns, "admin", &[]).await?;
    expect_addresses(&dns, &ns, "my-service", &["a", "b", "c", "d"]).await?;

    ns.annotate_pod("a", PORTS_KEY, Some("http,https")).await?;
    expect_srv(&dns, &ns, "https", &["a", "b", "c", "d"]).await?;
    ns.set_ready("c", false).await?;
    expect_srv(&dns, &ns, "http", &["a", "b"]).await?;
    expect_srv(&dns, &ns, "https", &["a", "b", "d"]).await?;
    ns.delete_pod("d").await?;
    expect_srv(&dns, &ns, "https", &["a", "b"]).await?;
    expect_addresses(&dns, &ns, "my-service", &["a", "b"]).await?;

    // Everything above came from slices alone.
    let legacy = ns.api::<Endpoints>().get_opt("my-service").await?;
    ensure!(
        legacy.is_none(),
        "a legacy Endpoints object exists: {legacy:?}"
    );
    Ok(())
}

/// `publishNotReadyAddresses`: a member published not ready (terminating,
/// still included) resolves only when the Service publishes not-ready
/// addresses, and so does a pod that is not ready yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coredns_publish_not_ready_addresses() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "dns-pnra").await?;
    let node = ns.ensure_node("n1", "z1").await?;
    let _pw = Scenario::new(&ns)
        .service(
            service("plain")
                .annotation(GROUP_KEY, "g")
                .headless()
                .port("http", 8080),
        )
        .service(
            service("pnra")
                .annotation(GROUP_KEY, "g")
                .headless()
                .publish_not_ready()
                .port("http", 8080),
        )
        .pods(["a", "old"].map(|p| {
            pod(p)
                .annotation(GROUP_KEY, "g")
                .node(&node)
                .held()
                .ips(next_ips().v4())
        }))
        // A selector-less headless Service gets both families by default.
        .expect(
            "plain",
            by_port([(("http", V4), &["a", "old"][..]), (("http", V6), &[])]),
        )
        .expect(
            "pnra",
            by_port([(("http", V4), &["a", "old"][..]), (("http", V6), &[])]),
        )
        .start()
        .await?;
    let dns = CoreDns::start(cp).await?;
    expect_addresses(&dns, &ns, "plain", &["a", "old"]).await?;
    expect_addresses(&dns, &ns, "pnra", &["a", "old"]).await?;

    ns.terminate_pod("old").await?;
    expect_addresses(&dns, &ns, "plain", &["a"]).await?;
    // Still resolvable where not-ready addresses are published.
    stays_for(Duration::from_secs(3), || async {
        let answer = dns
            .query(&service_name("pnra", ns.name()), RecordType::A)
            .await?;
        let want = addresses_of(&ns, &["a", "old"], false).await?;
        ensure!(
            answer.addresses == want,
            "pnra: wanted {want:?}, got {answer:?}"
        );
        Ok(())
    })
    .await?;

    // Issue 12: a pod that is not ready yet (a StatefulSet peer starting
    // up) resolves where not-ready addresses are published: podReady
    // yields there, as the native controller disregards readiness.
    ns.create_pod(
        pod("new")
            .annotation(GROUP_KEY, "g")
            .node(&node)
            .ips(next_ips().v4())
            .ready(false),
    )
    .await?;
    wait_for(SETTLE, || async {
        let answer = dns
            .query(&service_name("pnra", ns.name()), RecordType::A)
            .await?;
        let want = addresses_of(&ns, &["a", "new", "old"], false).await?;
        ensure!(
            answer.addresses == want,
            "pnra: wanted {want:?}, got {answer:?}"
        );
        Ok(())
    })
    .await?;
    expect_addresses(&dns, &ns, "plain", &["a"]).await?;
    for p in ["a", "old"] {
        ns.release_pod(p).await?;
    }
    Ok(())
}

/// The negative control: a slice that lists a non-member must make the
/// traffic check fail, or the checks above prove nothing. portwise is
/// stopped, `d` is written into http's slice by hand, and kube-proxy sends
/// it connections that the check then sees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_member_in_a_slice_fails_the_traffic_check() -> Result<()> {
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "kp-control").await?;
    let mut seed = seed_behind_proxy(cp, &ns, ProxyMode::Nftables).await?;
    let http = seed.http;

    seed.pw.stop().await?;
    let slices: kube::Api<EndpointSlice> = ns.api();
    let mut slice = slice_for_port(&ns, "my-service", "http").await?;
    slice.endpoints.get_or_insert_with(Vec::new).push(Endpoint {
        addresses: vec![pod_ips(&ns, "d").await?[0].to_string()],
        ..Default::default()
    });
    let name = slice.metadata.name.clone().context("unnamed slice")?;
    slices
        .replace(&name, &Default::default(), &slice)
        .await
        .context("writing d into http's slice")?;

    // Once kube-proxy has programmed the edited slice, d answers, and the
    // check the other tests rely on fails.
    let seen = wait_for(ROUTED, || async {
        let got = who_answers(http, CONNECTIONS).await;
        ensure!(
            got.by_pod.contains_key("d"),
            "d does not answer yet: {got:?}"
        );
        Ok(got)
    })
    .await?;
    let caught = expect_answers(http, &["a", "b", "c"], Duration::from_secs(3)).await;
    ensure!(
        caught.is_err(),
        "the traffic check passed with d in http's slice"
    );
    eprintln!("with d written into http's slice: {seen:?}; the check said: {caught:?}");
    Ok(())
}
