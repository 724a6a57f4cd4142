//! Probe targets that misbehave (issue 7, item 3; docs/reliability.md):
//! real listeners on pod addresses that accept and never answer, send
//! headers forever, stream a gigabyte, redirect in a loop, reset in the
//! middle of a response, never accept (a full accept queue: SYNs go
//! unanswered), or do not exist. portwise runs as the real binary with
//! `httpGet` and `tcpDial` checkers.
//!
//! Claims, each measured: every probe ends within its timeout (from the
//! targets' side: how long each connection lived; and from portwise's
//! check-duration histogram); memory stays bounded (bytes the gigabyte
//! targets got to send, portwise's peak RSS); a redirect is never followed;
//! and a healthy pod of another Service is published promptly while 50 bad
//! ones keep hanging.
//!
//! The unit tests in host/probe/src/lib.rs cover the same behaviours against
//! one probe at a time; this is the end-to-end version under concurrency.
//!
//! Also here: pods whose addresses would get a slice refused (3.2), and a
//! refused slice holding back only its own (port, family) (3.3).

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use anyhow::{Result, ensure};
use portwise_tests::{faults::*, *};

const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// A probe's connection may outlive its deadline by scheduling noise on a
/// loaded machine, not by more.
const SLACK: Duration = Duration::from_millis(1500);
const MEMBERSHIP: &str = "{perPort: {ports: {\
    http: {httpGet: {path: /healthz, timeout: 1s}}, \
    tcp: {tcpDial: {timeout: 1s}}}}}";
/// The 50 bad pods are spread over this many Services, so that several
/// reconciles (each with its own checks in flight) compete for the global
/// `maxConcurrentChecks` permits at once.
const BAD_SERVICES: usize = 5;
const HTTP_KINDS: [Misbehaviour; 5] = [
    Misbehaviour::Silent,
    Misbehaviour::EndlessHeaders,
    Misbehaviour::GigabyteBody,
    Misbehaviour::RedirectLoop,
    Misbehaviour::ResetMidResponse,
];

fn members(by: &ByPort, port: &str) -> BTreeSet<String> {
    by.get(&(port.to_string(), V4.to_string()))
        .cloned()
        .unwrap_or_default()
}

/// Observations above `le` in portwise's check-duration histogram.
fn checks_slower_than(metrics: &str, le: &str) -> (u64, u64) {
    let (mut total, mut within) = (0u64, 0u64);
    for line in metrics.lines() {
        if !line.starts_with("portwise_check_duration_seconds_bucket{") {
            continue;
        }
        let value: u64 = line
            .rsplit_once(' ')
            .and_then(|(_, v)| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0) as u64;
        if line.contains("le=\"+Inf\"") {
            total += value;
        } else if line.contains(&format!("le=\"{le}\"")) {
            within += value;
        }
    }
    (total - within.min(total), total)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_targets_end_on_time_and_do_not_hold_up_others() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "bad-targets").await?;
    ns.create_service(
        service("good")
            .annotation(GROUP_KEY, "good")
            .port("http", 8080),
    )
    .await?;
    for k in 0..BAD_SERVICES {
        ns.create_service(
            service(&format!("bad-{k}"))
                .annotation(GROUP_KEY, &format!("bad-{k}"))
                .port("http", 8080)
                .port("tcp", 9000),
        )
        .await?;
    }

    let good0 = next_ips();
    ns.create_pod(pod("good-0").annotation(GROUP_KEY, "good").ips(good0.v4()))
        .await?;
    let _good0_http = HttpListener::start(good0.v4, 8080).await?;
    let mut pw = Portwise::spawn_binary(&ns, &config(MEMBERSHIP)).await?;
    wait_for(SETTLE, || async {
        expect_eq(
            members(&endpoints_by_port(&ns, "good").await?, "http"),
            ["good-0".to_string()].into(),
        )
    })
    .await?;
    let (rss_before, _) = pw.memory_kib()?;

    // 50 bad pods. http: ten of each kind. tcp: 0-9 never accept, 10-19
    // have nothing listening, the rest accept.
    let mut targets = Vec::new();
    let mut tcp_ok = Vec::new();
    let mut pods = Vec::new();
    let mut expect_http = vec![BTreeSet::new(); BAD_SERVICES];
    let mut expect_tcp = vec![BTreeSet::new(); BAD_SERVICES];
    for i in 0..50 {
        let ip = next_ips();
        let name = format!("bad-{i:02}");
        let kind = HTTP_KINDS[i % HTTP_KINDS.len()];
        let svc = (i / HTTP_KINDS.len()) % BAD_SERVICES;
        targets.push(BadTarget::start(ip.v4, 8080, kind).await?);
        if kind == Misbehaviour::GigabyteBody {
            // A 200 whose body is cut at 64 KiB is a success.
            expect_http[svc].insert(name.clone());
        }
        match i {
            0..10 => targets.push(BadTarget::start(ip.v4, 9000, Misbehaviour::Blackhole).await?),
            10..20 => {}
            _ => {
                tcp_ok.push(TcpListener::start(ip.v4, 9000).await?);
                expect_tcp[svc].insert(name.clone());
            }
        }
        pods.push(
            pod(&name)
                .annotation(GROUP_KEY, &format!("bad-{svc}"))
                .ips(ip.v4()),
        );
    }
    ns.create_pods(pods).await?;
    wait_for(SETTLE, || async {
        for k in 0..BAD_SERVICES {
            let by = endpoints_by_port(&ns, &format!("bad-{k}")).await?;
            expect_eq(members(&by, "http"), expect_http[k].clone())?;
            expect_eq(members(&by, "tcp"), expect_tcp[k].clone())?;
        }
        Ok(())
    })
    .await?;

    // While the bad pods keep hanging (resync every 2s), healthy pods of
    // another Service join, one after another.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut lags = Vec::new();
    let mut good_listeners = Vec::new();
    let mut good = vec!["good-0".to_string()];
    for j in 1..=5 {
        let ip = next_ips();
        good_listeners.push(HttpListener::start(ip.v4, 8080).await?);
        let name = format!("good-{j}");
        let joined = Instant::now();
        ns.create_pod(pod(&name).annotation(GROUP_KEY, "good").ips(ip.v4()))
            .await?;
        good.push(name);
        let want: BTreeSet<String> = good.iter().cloned().collect();
        wait_for(SETTLE, || async {
            expect_eq(
                members(&endpoints_by_port(&ns, "good").await?, "http"),
                want.clone(),
            )
        })
        .await?;
        lags.push(joined.elapsed());
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    let lag = lags.iter().max().copied().unwrap_or_default();

    // A few more rounds of hanging probes, then look at every connection.
    tokio::time::sleep(Duration::from_secs(4)).await;
    pw.check_running()?;
    let (rss_after, rss_peak) = pw.memory_kib()?;
    let metrics = pw.metrics_text().await?;

    let mut report = Vec::new();
    for kind in HTTP_KINDS.iter().chain([&Misbehaviour::Blackhole]) {
        let conns: Vec<Conn> = targets
            .iter()
            .filter(|t| t.how == *kind)
            .flat_map(|t| t.conns())
            .collect();
        let finished: Vec<&Conn> = conns.iter().filter(|c| c.closed.is_some()).collect();
        let longest = finished
            .iter()
            .map(|c| c.lifetime())
            .max()
            .unwrap_or_default();
        let most_bytes = conns.iter().map(|c| c.bytes_sent).max().unwrap_or_default();
        report.push(format!(
            "{kind:?}: {} connections, longest {longest:?}, most bytes sent {most_bytes}",
            conns.len()
        ));
        if *kind == Misbehaviour::Blackhole {
            continue; // never accepted: nothing to see from this side
        }
        ensure!(
            conns.len() >= 10,
            "{kind:?} targets were probed {} times: not every resync reached them",
            conns.len()
        );
        ensure!(
            longest <= PROBE_TIMEOUT + SLACK,
            "a probe of a {kind:?} target lasted {longest:?} (timeout {PROBE_TIMEOUT:?})"
        );
        // Connections still open now must be young ones.
        for c in conns.iter().filter(|c| c.closed.is_none()) {
            ensure!(
                c.lifetime() <= PROBE_TIMEOUT + SLACK,
                "a {kind:?} connection is still open after {:?}",
                c.lifetime()
            );
        }
        if *kind == Misbehaviour::GigabyteBody {
            ensure!(
                most_bytes < 32 << 20,
                "a gigabyte target got {most_bytes} bytes out before the probe hung up"
            );
        }
        if *kind == Misbehaviour::RedirectLoop {
            let followed: Vec<&String> = conns
                .iter()
                .filter_map(|c| c.path.as_ref())
                .filter(|p| p.contains("hop="))
                .collect();
            ensure!(followed.is_empty(), "redirects were followed: {followed:?}");
        }
    }
    let (slow, total) = checks_slower_than(&metrics, "2.048");
    ensure!(total > 0, "no check durations in portwise's metrics");
    ensure!(
        slow == 0,
        "{slow} of {total} checks took longer than 2.048s with 1s probe timeouts"
    );
    ensure!(
        rss_peak < 200 * 1024,
        "portwise's peak RSS is {rss_peak} KiB with gigabyte bodies around"
    );
    ensure!(
        lag < Duration::from_secs(10),
        "a healthy pod of another Service took {lag:?} to be published while 50 pods hang"
    );
    println!(
        "healthy pods published {lags:?} after creation while 50 bad pods hang; \
         {total} checks, none above 2.048s; RSS {rss_before} KiB before, {rss_after} KiB \
         after, peak {rss_peak} KiB\n  {}",
        report.join("\n  ")
    );
    Ok(())
}

/// Hostile addresses: the apiserver lets a pod's status claim 127.0.0.1 or
/// 169.254.169.254, which EndpointSlice validation refuses. Such a pod must
/// neither be probed (127.0.0.1 is portwise's own pod, 169.254.169.254 a
/// cloud's metadata service) nor published (one refused address fails the
/// whole slice's write: before the fix in align.rs the good pods of the
/// Service were never published, and portwise retried every 5s forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_claiming_loopback_or_link_local_addresses_are_left_out() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "hostile-ips").await?;
    // A port nothing else in the namespace uses, so that any request the
    // loopback listener sees is a probe of the "loop" pod.
    let port = free_port()?;
    ns.create_service(service("web").annotation(GROUP_KEY, "g").port_to(
        "http",
        80,
        serde_json::json!(port),
    ))
    .await?;
    let good = next_ips();
    let good_http = HttpListener::start(good.v4, port).await?;
    let own = HttpListener::start(std::net::Ipv4Addr::LOCALHOST, port).await?;
    let _pw = Scenario::new(&ns)
        .pod(pod("good").annotation(GROUP_KEY, "g").ips(good.v4()))
        .pod(pod("loop").annotation(GROUP_KEY, "g").ips(["127.0.0.1"]))
        .pod(
            pod("metadata")
                .annotation(GROUP_KEY, "g")
                .ips(["169.254.169.254"]),
        )
        .config(&config("{httpGet: {path: /healthz, timeout: 1s}}"))
        .start()
        .await?;
    expect_endpoints(&ns, "web", by_port([(("http", V4), &["good"][..])])).await?;
    // Several resyncs later, still only the good pod was probed.
    tokio::time::sleep(Duration::from_secs(5)).await;
    ensure!(good_http.request_count() > 1, "the good pod was not probed");
    ensure!(
        own.request_count() == 0,
        "portwise probed 127.0.0.1 for pod \"loop\" ({} requests)",
        own.request_count()
    );
    Ok(())
}

/// `podAddresses` (docs/reliability.md 3.2): a pod whose status claims an
/// address outside `cidrs` (here: the apiserver's, a ClusterIP, a Node's;
/// in the test, another address of the network namespace, where a listener
/// counts every probe) is neither probed nor published, and a `hostNetwork`
/// pod (whose address is its Node's) is judged only once `hostNetwork`
/// opts in. Before `podAddresses`, both were probed and published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_addresses_keep_out_strays_and_host_network_pods_until_opted_in() -> Result<()> {
    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "pod-cidrs").await?;
    let port = free_port()?;
    ns.create_service(service("web").annotation(GROUP_KEY, "g").port_to(
        "http",
        80,
        serde_json::json!(port),
    ))
    .await?;
    let (good, stray, host) = (next_ips(), next_ips(), next_ips());
    let listen = |ip| HttpListener::start(ip, port);
    let (good_http, stray_http, host_http) = (
        listen(good.v4).await?,
        listen(stray.v4).await?,
        listen(host.v4).await?,
    );
    // The pod network is the good pod's address alone: the other two sit
    // outside it, as a Node's or a ClusterIP would.
    let cidrs = format!("podAddresses: {{cidrs: [{}/32]}}\n", good.v4);
    let membership = "{httpGet: {path: /healthz, timeout: 1s}}";
    let pw = Scenario::new(&ns)
        .pod(pod("good").annotation(GROUP_KEY, "g").ips(good.v4()))
        .pod(pod("stray").annotation(GROUP_KEY, "g").ips(stray.v4()))
        .pod(
            pod("host")
                .annotation(GROUP_KEY, "g")
                .host_network()
                .ips(host.v4()),
        )
        .config(&config_with(membership, &cidrs))
        .start()
        .await?;
    expect_endpoints(&ns, "web", by_port([(("http", V4), &["good"][..])])).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    expect_endpoints(&ns, "web", by_port([(("http", V4), &["good"][..])])).await?;
    ensure!(good_http.request_count() > 1, "the good pod was not probed");
    for (name, seen) in [("stray", &stray_http), ("host", &host_http)] {
        ensure!(
            seen.request_count() == 0,
            "portwise probed pod {name:?} outside podAddresses ({} requests)",
            seen.request_count()
        );
    }
    drop(pw);

    // Opted in: the hostNetwork pod is judged at its Node's address, which
    // no pod CIDR holds; the stray stays out.
    let opted = format!(
        "podAddresses: {{cidrs: [{}/32], hostNetwork: true}}\n",
        good.v4
    );
    let _pw = Portwise::builder(cp)
        .namespace(ns.name())
        .config(&config_with(membership, &opted))
        .start()
        .await?;
    expect_endpoints(&ns, "web", by_port([(("http", V4), &["good", "host"][..])])).await?;
    ensure!(
        host_http.request_count() > 0,
        "the opted-in hostNetwork pod was not probed"
    );
    ensure!(
        stray_http.request_count() == 0,
        "portwise probed pod \"stray\" outside podAddresses.cidrs"
    );
    Ok(())
}

/// A slice the apiserver refuses (docs/reliability.md 3.3). A
/// ValidatingAdmissionPolicy, scoped to the test namespace, refuses any
/// IPv4 slice of port `admin` that lists pod "b". b backs both ports, so
/// its one IPv4 slice (`web-admin.http`, listing both) is refused: IPv4
/// must stay as it was (it cannot be written) while the IPv6 slices of the
/// Service still get b. Before the fix the first failed apply ended the
/// Service's writes, and the IPv4 slice sorts first, so no family got b.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_slice_leaves_the_other_ports_and_families_current() -> Result<()> {
    use k8s_openapi::api::{
        admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding},
        discovery::v1::EndpointSlice,
    };
    use kube::{
        Api,
        api::{DeleteParams, PostParams},
    };

    let cp = ControlPlane::shared().await?;
    let ns = TestNs::new(cp, "refused-slice").await?;
    ns.create_service(
        service("web")
            .annotation(GROUP_KEY, "g")
            .dual_stack()
            .port("http", 8080)
            .port("admin", 9090),
    )
    .await?;
    let (a, b) = (next_ips(), next_ips());
    let _pw = Scenario::new(&ns)
        .pod(pod("a").annotation(GROUP_KEY, "g").ips(a.dual()))
        .start()
        .await?;
    let all = |v4: &'static [&'static str], v6: &'static [&'static str]| {
        by_port([
            (("http", V4), v4),
            (("http", V6), v6),
            (("admin", V4), v4),
            (("admin", V6), v6),
        ])
    };
    wait_for(SETTLE, || async {
        expect_eq(endpoints_by_port(&ns, "web").await?, all(&["a"], &["a"]))
    })
    .await?;

    let name = format!("portwise-test-{}", ns.name());
    let policies = Api::<ValidatingAdmissionPolicy>::all(ns.client());
    let bindings = Api::<ValidatingAdmissionPolicyBinding>::all(ns.client());
    policies
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "spec": {
                    "failurePolicy": "Fail",
                    "matchConstraints": {"resourceRules": [{
                        "apiGroups": ["discovery.k8s.io"],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["endpointslices"],
                    }]},
                    "validations": [{
                        "expression": "!(object.addressType == 'IPv4' \
                            && has(object.ports) && object.ports.exists(p, has(p.name) && p.name == 'admin') \
                            && has(object.endpoints) && object.endpoints.exists(e, \
                                has(e.targetRef) && has(e.targetRef.name) && e.targetRef.name == 'b'))",
                        "message": "portwise-tests refuses pod b in an IPv4 slice of port admin",
                    }],
                },
            }))?,
        )
        .await?;
    bindings
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "spec": {
                    "policyName": name,
                    "validationActions": ["Deny"],
                    "matchResources": {"namespaceSelector": {"matchLabels": {
                        "kubernetes.io/metadata.name": ns.name(),
                    }}},
                },
            }))?,
        )
        .await?;
    // Policies take effect asynchronously: wait until a dry run is refused.
    let probe: EndpointSlice = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "policy-probe"},
        "addressType": "IPv4",
        "ports": [{"name": "admin", "port": 9090}],
        "endpoints": [{"addresses": [b.v4.to_string()], "targetRef": {"kind": "Pod", "name": "b"}}],
    }))?;
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let refusal = wait_for(SETTLE, || async {
        match ns.api::<EndpointSlice>().create(&dry_run, &probe).await {
            Err(kube::Error::Api(s)) => Ok(s),
            other => anyhow::bail!("the policy is not in force yet: {other:?}"),
        }
    })
    .await?;

    let outcome = async {
        ns.create_pod(pod("b").annotation(GROUP_KEY, "g").ips(b.dual()))
            .await?;
        expect_endpoints(&ns, "web", all(&["a"], &["a", "b"])).await?;
        // Once the policy goes, the held set catches up.
        bindings.delete(&name, &DeleteParams::default()).await?;
        expect_endpoints(&ns, "web", all(&["a", "b"], &["a", "b"])).await?;
        slice_invariants(&ns, "web", 100).await
    }
    .await;
    let _ = bindings.delete(&name, &DeleteParams::default()).await;
    let _ = policies.delete(&name, &DeleteParams::default()).await;
    println!(
        "the apiserver refused with {} {}: {}",
        refusal.code, refusal.reason, refusal.message
    );
    outcome
}
