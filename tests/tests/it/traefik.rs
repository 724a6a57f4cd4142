//! A real Traefik v3 (tests/src/traefik.rs) in front of portwise's slices,
//! through both of its Kubernetes providers: an Ingress (provider
//! `kubernetesingress`) and a Gateway with HTTPRoutes (provider
//! `kubernetesgateway`) route one host to each Service port, and HTTP sent
//! through Traefik is answered by listeners on the pods' addresses that
//! reply with the pod's name. Every pod listens on every port, so only the
//! slices explain who answers.
//!
//! What Traefik does with slice conditions (read in v3.7.13's source):
//! - Ingress (`pkg/provider/kubernetes/ingress`, `loadService`): an endpoint
//!   with `serving` false is left out; one with `terminating` true is kept
//!   as a *fenced* server, which the balancer never picks for a new request
//!   (only a sticky cookie may still reach it), and a service whose servers
//!   are all fenced answers 503 "no available server".
//! - Gateway API (`pkg/provider/kubernetes/gateway`,
//!   `getBackendAddresses`): only endpoints with `ready` true; a terminating
//!   member (`ready: false`) is dropped.
//!
//! Both match a slice's port by the Service port's name and de-duplicate by
//! address, so the tests hold whichever way portwise lays the slices out.
//! A Service port named `https…` (or numbered 443) makes Traefik speak TLS
//! to the pods; the seed's Service says `http` instead (an annotation for
//! the Ingress provider, `appProtocol` for the Gateway API provider).

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use portwise_tests::{
    traefik::{Traefik, gateway, ingress},
    *,
};
use serde_json::json;

/// How long Traefik may take to route by a change portwise published:
/// slices settle within SETTLE, Traefik's watch and its 100 ms provider
/// throttle add little.
const ROUTED: Duration = Duration::from_secs(40);

/// The Ingress provider's annotation for the scheme it speaks to the pods.
const SERVERS_SCHEME: &str = "traefik.ingress.kubernetes.io/service.serversscheme";

/// The test is to return at once: ./test deferred Traefik's build.
fn skipped(test: &str) -> bool {
    deferred::skip(&["traefik"], &format!("traefik::{test}"))
}

fn figure(what: &str, took: Duration) {
    eprintln!("figure: {what}: {} ms", took.as_millis());
}

/// The seed's Service as Traefik needs it: both ports spoken as plain HTTP.
fn seed_service() -> ServiceBuilder {
    service("my-service")
        .annotation(GROUP_KEY, "my-group")
        .annotation(SERVERS_SCHEME, "http")
        .port_app("http", 8080, "http")
        .port_app("https", 8443, "http")
}

/// Listeners for `pods` on 8080 and 8443 of each pod's IPv4 address,
/// answering with the pod's name.
async fn serve(ns: &TestNs, pods: &[&str]) -> Result<Vec<HttpListener>> {
    let mut out = Vec::new();
    for p in pods {
        let pod = ns.get_pod(p).await?;
        let ip: std::net::IpAddr = pod
            .status
            .and_then(|s| s.pod_ip)
            .with_context(|| format!("pod {p} has no IP"))?
            .parse()?;
        for port in [8080, 8443] {
            let l = HttpListener::start(ip, port).await?;
            l.set_body(&format!("{p}\n"));
            out.push(l);
        }
    }
    Ok(out)
}

/// The hosts routed to my-service's two ports, per provider.
const INGRESS_HTTP: &str = "http.ingress.test";
const INGRESS_HTTPS: &str = "https.ingress.test";
const GATEWAY_HTTP: &str = "http.gateway.test";
const GATEWAY_HTTPS: &str = "https.gateway.test";

/// Routes for my-service's two ports (and `extra`: `(host, service, port
/// name, port number)`) through both providers.
async fn route(ns: &TestNs, traefik: &Traefik, extra: &[(&str, &str, &str, u16)]) -> Result<()> {
    let mut by_name = vec![
        (INGRESS_HTTP, "my-service", "http"),
        (INGRESS_HTTPS, "my-service", "https"),
    ];
    let mut by_number = vec![
        (GATEWAY_HTTP, "my-service", 8080),
        (GATEWAY_HTTPS, "my-service", 8443),
    ];
    for (host, svc, name, number) in extra {
        by_name.push((host, svc, name));
        by_number.push((host, svc, *number));
    }
    // The Gateway API hosts are the Ingress ones with "gateway" for
    // "ingress"; Traefik tells routers apart by host only.
    let by_number: Vec<(String, &str, u16)> = by_number
        .into_iter()
        .map(|(h, s, p)| (h.replace(".ingress.", ".gateway."), s, p))
        .collect();
    let by_number: Vec<(&str, &str, u16)> = by_number
        .iter()
        .map(|(h, s, p)| (h.as_str(), *s, *p))
        .collect();
    let objects = json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": [ingress("routes", &by_name)],
    });
    kubectl(
        ns.cp(),
        &["apply", "-n", ns.name(), "-f", "-"],
        Some(&objects.to_string()),
    )
    .await
    .context("creating the Ingress")?;
    let gw = gateway(ns.name(), traefik.web_port(), &by_number);
    // Tests running at once share the (cluster-scoped) GatewayClass: one
    // apply's create can lose to another's, and then the next attempt
    // finds it.
    let mut attempt = 0;
    while let Err(e) = kubectl(
        ns.cp(),
        &["apply", "-n", ns.name(), "-f", "-"],
        Some(&gw.to_string()),
    )
    .await
    {
        attempt += 1;
        if attempt == 3 || !format!("{e:#}").contains("AlreadyExists") {
            return Err(e).context("creating the Gateway and its HTTPRoutes");
        }
    }
    Ok(())
}

/// The seed example published by portwise (run as its binary), every pod
/// serving both ports, with Traefik routing one host per port and
/// provider; returns once both providers route every port to its members.
struct SeedBehindTraefik {
    pw: Portwise,
    _listeners: Vec<HttpListener>,
    traefik: Traefik,
}

async fn seed_behind_traefik(
    cp: &'static ControlPlane,
    ns: &TestNs,
    extra_services: Vec<ServiceBuilder>,
    extra_routes: &[(&str, &str, &str, u16)],
) -> Result<SeedBehindTraefik> {
    let mut scenario =
        seed_scenario_with(ns, seed_service(), |_, pod| pod.ips(next_ips().v4()).held()).binary();
    for svc in extra_services {
        scenario = scenario.service(svc);
    }
    let pw = scenario
        .expect(
            "my-service",
            seed_slices(&["a", "b", "c"], &["b", "c", "d"]),
        )
        .start()
        .await?;
    let _listeners = serve(ns, &["a", "b", "c", "d"]).await?;
    let mut traefik = Traefik::start(cp, ns.name()).await?;
    figure("traefik answering /ping after start", traefik.ready_after);
    route(ns, &traefik, extra_routes).await?;
    for host in [INGRESS_HTTP, GATEWAY_HTTP] {
        traefik
            .expect_members(host, &["a", "b", "c"], ROUTED)
            .await?;
    }
    for host in [INGRESS_HTTPS, GATEWAY_HTTPS] {
        traefik
            .expect_members(host, &["b", "c", "d"], ROUTED)
            .await?;
    }
    Ok(SeedBehindTraefik {
        pw,
        _listeners,
        traefik,
    })
}

/// Both providers' routes for http and https reach exactly these pods.
async fn seed_routes(traefik: &mut Traefik, http: &[&str], https: &[&str]) -> Result<()> {
    for host in [INGRESS_HTTP, GATEWAY_HTTP] {
        traefik.expect_members(host, http, ROUTED).await?;
    }
    for host in [INGRESS_HTTPS, GATEWAY_HTTPS] {
        traefik.expect_members(host, https, ROUTED).await?;
    }
    Ok(())
}

async fn release_all(ns: &TestNs, pods: &[&str]) -> Result<()> {
    for p in pods {
        ns.release_pod(p).await?;
    }
    Ok(())
}

/// The seed example through Traefik: each port's route, by Ingress and by
/// HTTPRoute, is answered by exactly that port's members (30 requests
/// each: every member answers, no other pod does); a pod turning unready
/// stops being chosen on both ports, and is chosen again once ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traefik_routes_each_port_to_its_members() -> Result<()> {
    const TEST: &str = "traefik_routes_each_port_to_its_members";
    if skipped(TEST) {
        return Ok(());
    }
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "traefik-seed").await?;
    let mut seed = seed_behind_traefik(cp, &ns, vec![], &[]).await?;
    let traefik = &mut seed.traefik;

    // Readiness: b leaves both ports, on both providers.
    let t = std::time::Instant::now();
    ns.set_ready("b", false).await?;
    seed_routes(traefik, &["a", "c"], &["c", "d"]).await?;
    figure(
        "readiness flip to routed by traefik (both providers)",
        t.elapsed(),
    );
    ns.set_ready("b", true).await?;
    seed_routes(traefik, &["a", "b", "c"], &["b", "c", "d"]).await?;
    traefik.running()?;
    release_all(&ns, &["a", "b", "c", "d"]).await
}

/// A terminating member that still serves (c: deleted, Ready, so still a
/// member of both ports, published `ready: false, serving: true,
/// terminating: true`): the Ingress provider keeps it as a fenced server
/// and never picks it, the Gateway API provider drops it; so neither
/// sends it requests. When every remaining member of a port is terminating,
/// Traefik does not fall back to them as kube-proxy does: the port answers
/// 503 on both providers, and Traefik keeps running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traefik_fences_terminating_members() -> Result<()> {
    const TEST: &str = "traefik_fences_terminating_members";
    if skipped(TEST) {
        return Ok(());
    }
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "traefik-term").await?;
    let mut seed = seed_behind_traefik(cp, &ns, vec![], &[]).await?;
    let traefik = &mut seed.traefik;
    let c = ns
        .get_pod("c")
        .await?
        .status
        .and_then(|s| s.pod_ip)
        .context("c has no IP")?;

    ns.terminate_pod("c").await?;
    seed_routes(traefik, &["a", "b"], &["b", "d"]).await?;
    // c is still in the Ingress provider's servers, fenced, on both ports.
    for (port, number) in [("http", 8080), ("https", 8443)] {
        let servers = traefik
            .servers_of(&format!("{}-my-service-{port}@kubernetes", ns.name()))
            .await?;
        let url = format!("http://{c}:{number}");
        ensure!(
            servers.contains(&(url.clone(), true)),
            "{port}: the Ingress provider should hold {url} as fenced: {servers:?}"
        );
    }

    // https left with terminating members only: d terminates and b turns
    // unready. Nothing is chosen: 503, on both providers; http still has a.
    ns.terminate_pod("d").await?;
    ns.set_ready("b", false).await?;
    for host in [INGRESS_HTTPS, GATEWAY_HTTPS] {
        let got = traefik.expect_status(host, 503, ROUTED).await?;
        eprintln!("{host} with c and d terminating and b unready: {got:?}");
    }
    for host in [INGRESS_HTTP, GATEWAY_HTTP] {
        traefik.expect_members(host, &["a"], ROUTED).await?;
    }
    let (_, body) = traefik.get(INGRESS_HTTPS).await?;
    eprintln!("{INGRESS_HTTPS} answers: {body:?}");
    traefik.running()?;
    release_all(&ns, &["a", "b", "c", "d"]).await
}

/// A Service port that no pod backs (a third port, `admin`, in no pod's
/// ports annotation): portwise publishes it without endpoints, and its
/// routes answer 503 through both providers while the other ports' routes
/// keep answering, and Traefik keeps running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traefik_answers_503_for_a_port_without_members() -> Result<()> {
    const TEST: &str = "traefik_answers_503_for_a_port_without_members";
    if skipped(TEST) {
        return Ok(());
    }
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "traefik-empty").await?;
    let admin = service("admin")
        .annotation(GROUP_KEY, "my-group")
        .port("admin", 9090);
    let mut seed = seed_behind_traefik(
        cp,
        &ns,
        vec![admin],
        &[("admin.ingress.test", "admin", "admin", 9090)],
    )
    .await?;
    let traefik = &mut seed.traefik;
    for host in ["admin.ingress.test", "admin.gateway.test"] {
        let got = traefik.expect_status(host, 503, ROUTED).await?;
        eprintln!("{host}: {got:?}");
    }
    seed_routes(traefik, &["a", "b", "c"], &["b", "c", "d"]).await?;
    release_all(&ns, &["a", "b", "c", "d"]).await
}

/// A Service whose only port has a named targetPort and no member: its
/// number cannot be known, so portwise publishes the native controller's
/// placeholder (`ports: []`, never a port without a number, which crashed
/// Traefik before v3.6.23). Traefik keeps running, the route to it does
/// not answer from any pod, and the seed's routes keep answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traefik_survives_a_named_target_port_without_members() -> Result<()> {
    const TEST: &str = "traefik_survives_a_named_target_port_without_members";
    if skipped(TEST) {
        return Ok(());
    }
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "traefik-named").await?;
    let named = service("named")
        .annotation(GROUP_KEY, "named-group")
        .annotation(SERVERS_SCHEME, "http")
        .port_to("web", 80, json!("web"));
    let mut seed = seed_behind_traefik(
        cp,
        &ns,
        vec![named],
        &[("named.ingress.test", "named", "web", 80)],
    )
    .await?;
    let traefik = &mut seed.traefik;
    // portwise's placeholder for `named`: no port without a number.
    let placeholder = wait_for(SETTLE, || async {
        let slices = slices_for(&ns, "named").await?;
        ensure!(!slices.is_empty(), "no slice for `named` yet");
        Ok(slices)
    })
    .await?;
    for s in &placeholder {
        for p in s.ports.iter().flatten() {
            ensure!(p.port.is_some(), "a slice port without a number: {s:?}");
        }
        ensure!(
            s.endpoints.iter().flatten().next().is_none(),
            "`named` has no pods, yet its slice lists endpoints: {s:?}"
        );
    }
    for host in ["named.ingress.test", "named.gateway.test"] {
        let got = wait_for(ROUTED, || async {
            let got = traefik.routed(host, 5).await;
            ensure!(
                got.by_pod.is_empty() && got.failed == 0 && !got.statuses.is_empty(),
                "{host}: wanted an error status from traefik itself, got {got:?}"
            );
            Ok(got)
        })
        .await?;
        eprintln!("{host}: {got:?}");
    }
    traefik.running()?;
    seed_routes(traefik, &["a", "b", "c"], &["b", "c", "d"]).await?;
    // Still running a while after reading the placeholder.
    tokio::time::sleep(Duration::from_secs(2)).await;
    traefik.running()?;
    release_all(&ns, &["a", "b", "c", "d"]).await
}

/// The negative control: a slice that lists a non-member must make the
/// route check fail, or the checks above prove nothing. portwise is
/// stopped, a slice of my-service's http port listing d (a member of https
/// only) is written by hand, and Traefik then sends d requests for http.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traefik_a_non_member_in_a_slice_fails_the_route_check() -> Result<()> {
    const TEST: &str = "traefik_a_non_member_in_a_slice_fails_the_route_check";
    if skipped(TEST) {
        return Ok(());
    }
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "traefik-control").await?;
    let mut seed = seed_behind_traefik(cp, &ns, vec![], &[]).await?;
    seed.pw.stop().await?;
    let d = ns
        .get_pod("d")
        .await?
        .status
        .and_then(|s| s.pod_ip)
        .context("d has no IP")?;
    let intruder = EndpointSlice {
        metadata: kube::api::ObjectMeta {
            name: Some("my-service-intruder".into()),
            labels: Some([(SERVICE_NAME_LABEL.to_string(), "my-service".to_string())].into()),
            ..Default::default()
        },
        address_type: V4.into(),
        ports: Some(vec![EndpointPort {
            name: Some("http".into()),
            port: Some(8080),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        // Ready said outright: the Gateway API provider takes an unset
        // `ready` as not ready.
        endpoints: Some(vec![Endpoint {
            addresses: vec![d],
            conditions: Some(EndpointConditions {
                ready: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        }]),
    };
    ns.api::<EndpointSlice>()
        .create(&Default::default(), &intruder)
        .await
        .context("writing d into a slice of http")?;
    let traefik = &mut seed.traefik;
    for host in [INGRESS_HTTP, GATEWAY_HTTP] {
        let seen = wait_for(ROUTED, || async {
            let got = traefik.routed(host, traefik::REQUESTS).await;
            ensure!(
                got.by_pod.contains_key("d"),
                "d does not answer yet: {got:?}"
            );
            Ok(got)
        })
        .await?;
        let caught = traefik
            .expect_members(host, &["a", "b", "c"], Duration::from_secs(3))
            .await;
        ensure!(
            caught.is_err(),
            "{host}: the route check passed with d in a slice of http"
        );
        eprintln!(
            "{host} with d written into a slice of http: {seen:?}; the check said: {:#}",
            caught.unwrap_err().root_cause()
        );
    }
    release_all(&ns, &["a", "b", "c", "d"]).await
}
