//! A real Cilium (cilium-agent v1.20.2, kube-proxy replacement with socket
//! load balancing; tests/src/cilium.rs) consuming portwise's slices: every
//! pod listens on every port and answers with its own name, and a client
//! inside Cilium's cgroup connects through the ClusterIP, so only the
//! slices, as Cilium reads them, can explain who answers.

use std::{
    net::{IpAddr, SocketAddr},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use portwise_tests::{
    cilium::{self, CiliumAgent, who_answers_outside},
    consumers::{NameServer, cluster_ip, name_servers},
    *,
};
use serde_json::json;

/// How long Cilium may take to route by a change portwise published:
/// slices settle within SETTLE, Cilium's maps follow within a second or so.
const ROUTED: Duration = Duration::from_secs(40);

/// The test is to return at once: ./test deferred the agent's build.
fn skipped(test: &str) -> bool {
    deferred::skip(&["cilium"], &format!("cilium::{test}"))
}

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

async fn service_addr(ns: &TestNs, svc: &str, port: u16) -> Result<SocketAddr> {
    service_addr_of(ns, svc, port, false).await
}

async fn service_addr_of(ns: &TestNs, svc: &str, port: u16, v6: bool) -> Result<SocketAddr> {
    let svc = ns.get_service(svc).await?;
    Ok(SocketAddr::new(cluster_ip(&svc, v6)?, port))
}

fn figure(what: &str, took: Duration) {
    eprintln!("figure: {what}: {} ms", took.as_millis());
}

/// The seed example (http {a,b,c}, https {b,c,d}), every pod serving both
/// ports, behind Cilium.
struct SeedBehindCilium {
    _pw: Portwise,
    _servers: Vec<NameServer>,
    cilium: CiliumAgent,
    http: SocketAddr,
    https: SocketAddr,
}

async fn seed_behind_cilium(cp: &'static ControlPlane, ns: &TestNs) -> Result<SeedBehindCilium> {
    let _pw = seed_scenario(ns)
        .expect(
            "my-service",
            seed_slices(&["a", "b", "c"], &["b", "c", "d"]),
        )
        .start()
        .await?;
    let _servers = serve(ns, &["a", "b", "c", "d"], &[8080, 8443]).await?;
    let cilium = CiliumAgent::start(cp).await?;
    let http = service_addr(ns, "my-service", 8080).await?;
    let https = service_addr(ns, "my-service", 8443).await?;
    Ok(SeedBehindCilium {
        _pw,
        _servers,
        cilium,
        http,
        https,
    })
}

/// The seed example through its ClusterIP: each port reaches exactly its
/// members (30 connections per port, every member answers, no non-member
/// ever), and an annotation change and a pod deletion change who answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_each_port_to_its_members() -> Result<()> {
    if skipped("routes_each_port_to_its_members") {
        return Ok(());
    }
    let t0 = Instant::now();
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "cilium-seed").await?;
    let SeedBehindCilium {
        cilium,
        http,
        https,
        ..
    } = &seed_behind_cilium(cp, &ns).await?;
    let (http, https) = (*http, *https);

    cilium
        .expect_answers(http, &["a", "b", "c"], ROUTED)
        .await?;
    cilium
        .expect_answers(https, &["b", "c", "d"], ROUTED)
        .await?;

    // The annotation: a joins https; its first answer there is the moment
    // Cilium reflects the change.
    let t = Instant::now();
    ns.annotate_pod("a", PORTS_KEY, Some("http,https")).await?;
    loop {
        if cilium.ask(https).await.ok().flatten().as_deref() == Some("a") {
            break;
        }
        ensure!(t.elapsed() < ROUTED, "a never answered on https");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    figure("cilium annotation change to first answer", t.elapsed());
    cilium
        .expect_answers(https, &["a", "b", "c", "d"], ROUTED)
        .await?;
    cilium
        .expect_answers(http, &["a", "b", "c"], ROUTED)
        .await?;

    // Deletion: d leaves https.
    ns.delete_pod("d").await?;
    cilium
        .expect_answers(https, &["a", "b", "c"], ROUTED)
        .await?;
    figure("cilium::routes_each_port_to_its_members", t0.elapsed());
    Ok(())
}

/// A readiness flip: b leaves both ports while not ready, and answers on
/// both again once ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readiness_flip_changes_who_answers() -> Result<()> {
    if skipped("a_readiness_flip_changes_who_answers") {
        return Ok(());
    }
    let t0 = Instant::now();
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "cilium-ready").await?;
    let SeedBehindCilium {
        cilium,
        http,
        https,
        ..
    } = &seed_behind_cilium(cp, &ns).await?;
    let (http, https) = (*http, *https);
    cilium
        .expect_answers(http, &["a", "b", "c"], ROUTED)
        .await?;

    let t = Instant::now();
    ns.set_ready("b", false).await?;
    cilium.expect_answers(http, &["a", "c"], ROUTED).await?;
    figure(
        "cilium readiness flip to routed (30 answers agree)",
        t.elapsed(),
    );
    cilium.expect_answers(https, &["c", "d"], ROUTED).await?;

    ns.set_ready("b", true).await?;
    cilium
        .expect_answers(http, &["a", "b", "c"], ROUTED)
        .await?;
    cilium
        .expect_answers(https, &["b", "c", "d"], ROUTED)
        .await?;
    figure("cilium::a_readiness_flip_changes_who_answers", t0.elapsed());
    Ok(())
}

/// A terminating pod that the checker still includes is published serving
/// but not ready: Cilium keeps it as a fallback only, used when no ready
/// member is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminating_members_are_only_a_fallback() -> Result<()> {
    if skipped("terminating_members_are_only_a_fallback") {
        return Ok(());
    }
    let t0 = Instant::now();
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "cilium-term").await?;
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
    let cilium = CiliumAgent::start(cp).await?;
    let addr = service_addr(&ns, "web", 8080).await?;
    cilium
        .expect_answers(addr, &["a", "b", "old"], ROUTED)
        .await?;

    // `old` terminates but stays Ready: published ready: false,
    // serving: true, terminating: true.
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
    cilium.expect_answers(addr, &["a", "b"], ROUTED).await?;

    // No ready member left: the serving, terminating one is used.
    ns.set_ready("a", false).await?;
    ns.set_ready("b", false).await?;
    cilium.expect_answers(addr, &["old"], ROUTED).await?;
    // A ready member back: the fallback is dropped again.
    ns.set_ready("a", true).await?;
    cilium.expect_answers(addr, &["a"], ROUTED).await?;
    for p in ["a", "b", "old"] {
        ns.release_pod(p).await?;
    }
    figure(
        "cilium::terminating_members_are_only_a_fallback",
        t0.elapsed(),
    );
    Ok(())
}

/// A dual-stack ClusterIP: each family's address reaches only that
/// family's members (the agent runs dual-stack).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dual_stack_cluster_ip_reaches_each_family_members() -> Result<()> {
    if skipped("dual_stack_cluster_ip_reaches_each_family_members") {
        return Ok(());
    }
    let t0 = Instant::now();
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "cilium-dual").await?;
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
    let _servers = serve(&ns, &["both", "four", "six"], &[8080]).await?;
    let cilium = CiliumAgent::start(cp).await?;
    let addr4 = service_addr_of(&ns, "web", 8080, false).await?;
    let addr6 = service_addr_of(&ns, "web", 8080, true).await?;
    cilium
        .expect_answers(addr4, &["both", "four"], ROUTED)
        .await?;
    cilium
        .expect_answers(addr6, &["both", "six"], ROUTED)
        .await?;

    // A family's change shows in that family only: four leaves.
    ns.set_ready("four", false).await?;
    cilium.expect_answers(addr4, &["both"], ROUTED).await?;
    cilium
        .expect_answers(addr6, &["both", "six"], ROUTED)
        .await?;
    figure(
        "cilium::dual_stack_cluster_ip_reaches_each_family_members",
        t0.elapsed(),
    );
    Ok(())
}

/// One step of [`two_ports_on_one_target_port_reach_their_own_members`]:
/// what it does, (pod, its new ports annotation), then web's and alt's
/// members.
type Step<'a> = (
    &'a str,
    Option<(&'a str, &'a str)>,
    &'a [&'a str],
    &'a [&'a str],
);

/// Two Service ports on one target port: `web` 80→8080 served by a, b and
/// `alt` 8080→8080 served by b, c (by the ports annotation), then a series
/// of membership changes, each checked by traffic on both ports. Cilium
/// keys a backend by (Service, IP:port) with the port names it was listed
/// under, so b:8080 must be listed under both names wherever it serves
/// both (/work/shared/notes/cilium.md, "two Service ports on the same
/// target port").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_ports_on_one_target_port_reach_their_own_members() -> Result<()> {
    if skipped("two_ports_on_one_target_port_reach_their_own_members") {
        return Ok(());
    }
    let t0 = Instant::now();
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "cilium-shared-target").await?;
    let pods = [("a", "web"), ("b", "web,alt"), ("c", "alt")];
    let _pw = Scenario::new(&ns)
        .service(
            service("app")
                .annotation(GROUP_KEY, "g")
                .port_to("web", 80, json!(8080))
                .port_to("alt", 8080, json!(8080)),
        )
        .pods(pods.map(|(p, ports)| {
            pod(p)
                .annotation(GROUP_KEY, "g")
                .annotation(PORTS_KEY, ports)
                .container_port("http", 8080, "TCP")
                .ips(next_ips().v4())
        }))
        .config(&config(SEED_MEMBERSHIP))
        .expect(
            "app",
            by_port([
                (("web", V4), &["a", "b"][..]),
                (("alt", V4), &["b", "c"][..]),
            ]),
        )
        .start()
        .await?;
    let _servers = serve(&ns, &["a", "b", "c"], &[8080]).await?;
    let cilium = CiliumAgent::start(cp).await?;
    let web = service_addr(&ns, "app", 80).await?;
    let alt = service_addr(&ns, "app", 8080).await?;

    // Each step: (pod, its new ports annotation), then who serves web and
    // alt. The first has no change: the starting point.
    let steps: &[Step] = &[
        ("start", None, &["a", "b"], &["b", "c"]),
        ("b leaves alt", Some(("b", "web")), &["a", "b"], &["c"]),
        (
            "b rejoins alt",
            Some(("b", "web,alt")),
            &["a", "b"],
            &["b", "c"],
        ),
        ("b leaves web", Some(("b", "alt")), &["a"], &["b", "c"]),
        (
            "c joins web",
            Some(("c", "web,alt")),
            &["a", "c"],
            &["b", "c"],
        ),
        (
            "b rejoins web",
            Some(("b", "web,alt")),
            &["a", "b", "c"],
            &["b", "c"],
        ),
        ("c leaves alt", Some(("c", "web")), &["a", "b", "c"], &["b"]),
    ];
    // Every step is checked, and what went wrong reported at the end, so
    // one run shows every step Cilium gets wrong. Cilium follows a change
    // within a second here, so a shorter wait than ROUTED does.
    let mut wrong = Vec::new();
    for (what, change, want_web, want_alt) in steps {
        if let Some((p, ports)) = change {
            ns.annotate_pod(p, PORTS_KEY, Some(ports)).await?;
        }
        // portwise's slices first: a traffic failure below is Cilium's
        // reading of correct slices.
        expect_endpoints(
            &ns,
            "app",
            by_port([(("web", V4), *want_web), (("alt", V4), *want_alt)]),
        )
        .await
        .with_context(|| format!("step {what:?}: the slices"))?;
        for (port, addr, want) in [
            ("web (80 -> 8080)", web, want_web),
            ("alt (8080 -> 8080)", alt, want_alt),
        ] {
            let within = Duration::from_secs(15);
            if let Err(e) = cilium.expect_answers(addr, want, within).await {
                let e = format!("{e:#}");
                let reason = e.lines().next().unwrap_or_default().to_string();
                wrong.push(format!("step {what:?}, port {port}: {reason}"));
            }
        }
    }
    ensure!(
        wrong.is_empty(),
        "Cilium routed {} of {} checks wrong:\n{}\n(cilium-agent log, last lines:\n{})",
        wrong.len(),
        steps.len() * 2,
        wrong.join("\n"),
        cilium.log_tail()
    );
    figure(
        "cilium::two_ports_on_one_target_port_reach_their_own_members",
        t0.elapsed(),
    );
    Ok(())
}

/// The negative control: the same client, left outside Cilium's cgroup,
/// is not translated. The ClusterIP is a local address in the test
/// namespace (tests/netns) with nothing listening, so every connection is
/// refused at once, while from inside the cgroup the members answer. And
/// the agent's cleanup leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_outside_the_cgroup_is_not_translated() -> Result<()> {
    if skipped("a_client_outside_the_cgroup_is_not_translated") {
        return Ok(());
    }
    let t0 = Instant::now();
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "cilium-outside").await?;
    let seed = seed_behind_cilium(cp, &ns).await?;
    let (cilium, http) = (&seed.cilium, seed.http);
    cilium
        .expect_answers(http, &["a", "b", "c"], ROUTED)
        .await?;

    let t = Instant::now();
    let outside = who_answers_outside(http, 10).await?;
    let took = t.elapsed();
    ensure!(
        outside.by_pod.is_empty() && outside.refused == 10,
        "outside the cgroup, {http} was translated or did not fail at once: {outside:?}"
    );
    ensure!(
        took < Duration::from_secs(5),
        "10 connections from outside took {took:?}: not refused quickly"
    );
    // The test process itself is outside the cgroup too.
    let in_process = consumers::who_answers(http, 10).await;
    ensure!(
        in_process.by_pod.is_empty() && in_process.refused == 10,
        "the test process was translated: {in_process:?}"
    );
    // And inside, still translated.
    cilium
        .expect_answers(http, &["a", "b", "c"], ROUTED)
        .await?;

    // Dropped, the agent leaves nothing behind in the namespace, and its
    // cgroup is gone.
    let cgroup = cilium.cgroup().to_path_buf();
    drop(seed);
    let left = cilium::leftovers()?;
    ensure!(left.is_empty(), "left behind by the agent: {left:#?}");
    ensure!(!cgroup.exists(), "{} is left behind", cgroup.display());
    figure(
        "cilium::a_client_outside_the_cgroup_is_not_translated",
        t0.elapsed(),
    );
    Ok(())
}
