//! Tests of the built-in checkers, and the fixtures the checker tree's
//! tests share (`pod`, `subject`, `Counting`).

use std::{
    collections::BTreeMap,
    net::IpAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::core::v1::{Pod, PodCondition, PodStatus, Service},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
};
use portwise_core::{
    config::KeySource,
    membership::{Decision, Family, ResolvedPort, Subject, Verdict, algebra},
};
use portwise_probe::{self as probe, ProbeError};
use tokio::{io::AsyncWriteExt, net::TcpListener};

use super::*;
use crate::{BoxFuture, Checker};

pub(crate) fn service() -> Arc<Service> {
    Arc::new(Service {
        metadata: ObjectMeta {
            name: Some("my-service".into()),
            namespace: Some("default".into()),
            uid: Some("svc-uid".into()),
            ..Default::default()
        },
        ..Default::default()
    })
}

/// A pod with a Ready condition (`None`: no condition) and annotations.
pub(crate) fn pod(name: &str, ready: Option<&str>, annotations: &[(&str, &str)]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some(format!("uid-{name}")),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..Default::default()
        },
        status: Some(PodStatus {
            phase: Some("Running".into()),
            conditions: ready.map(|s| {
                vec![
                    PodCondition {
                        type_: "PodScheduled".into(),
                        status: "True".into(),
                        ..Default::default()
                    },
                    PodCondition {
                        type_: "Ready".into(),
                        status: s.into(),
                        ..Default::default()
                    },
                ]
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub(crate) fn subject(pod: Pod, port_name: &str, address: IpAddr, target: u16) -> Subject {
    Subject {
        service: service(),
        pod: Arc::new(pod),
        port: ResolvedPort {
            name: port_name.into(),
            port: 80,
            protocol: "TCP".into(),
            target,
        },
        family: if address.is_ipv4() {
            Family::V4
        } else {
            Family::V6
        },
        address,
    }
}

pub(crate) fn local() -> IpAddr {
    "127.0.0.1".parse().unwrap()
}

fn subj(pod: Pod, port: &str) -> Subject {
    subject(pod, port, local(), 9)
}

/// A checker that answers a fixed decision and counts its calls.
#[derive(Debug)]
pub(crate) struct Counting(pub Decision, pub AtomicUsize);
impl Counting {
    pub(crate) fn new(d: Decision) -> Arc<Self> {
        Arc::new(Counting(d, AtomicUsize::new(0)))
    }
    pub(crate) fn calls(&self) -> usize {
        self.1.load(Ordering::SeqCst)
    }
}
impl Checker for Counting {
    fn check<'a>(&'a self, _: &'a Subject) -> BoxFuture<'a, Verdict> {
        self.1.fetch_add(1, Ordering::SeqCst);
        Box::pin(std::future::ready(Verdict {
            decision: self.0,
            reason: Some(format!("fixed {:?}", self.0)),
        }))
    }
}

/// Replays a script of decisions, one per call.
#[derive(Debug)]
struct Script(Mutex<Vec<Decision>>);
impl Checker for Script {
    fn check<'a>(&'a self, _: &'a Subject) -> BoxFuture<'a, Verdict> {
        let d = self.0.lock().unwrap().remove(0);
        Box::pin(std::future::ready(Verdict {
            decision: d,
            reason: None,
        }))
    }
}

#[tokio::test]
async fn pod_ready() {
    let s = subj(pod("a", Some("True"), &[]), "http");
    assert_eq!(PodReady.check(&s).await, Verdict::include());
    let v = PodReady
        .check(&subj(pod("a", Some("False"), &[]), "http"))
        .await;
    assert_eq!(v.decision, Decision::Exclude);
    assert!(v.reason.unwrap().contains("False"));
    let v = PodReady
        .check(&subj(pod("a", Some("Unknown"), &[]), "http"))
        .await;
    assert_eq!(v.decision, Decision::Exclude);
    let v = PodReady.check(&subj(pod("a", None, &[]), "http")).await;
    assert_eq!(v.decision, Decision::Exclude);
    let mut no_status = pod("a", None, &[]);
    no_status.status = None;
    assert_eq!(
        PodReady.check(&subj(no_status, "http")).await.decision,
        Decision::Exclude
    );
}

/// `subject` for a Service with `publishNotReadyAddresses: true`.
fn under_pnra(mut s: Subject) -> Subject {
    let mut svc = (*s.service).clone();
    svc.spec
        .get_or_insert_with(Default::default)
        .publish_not_ready_addresses = Some(true);
    s.service = Arc::new(svc);
    s
}

/// Issue 12: under publishNotReadyAddresses the readiness signals
/// (podReady and the probes) include without looking; the membership
/// signals still decide.
#[tokio::test]
async fn readiness_signals_yield_to_publish_not_ready_addresses() {
    let unready = under_pnra(subj(pod("a", Some("False"), &[]), "http"));
    assert_eq!(PodReady.check(&unready).await.decision, Decision::Include);
    // Port 9 on loopback: nothing listens, and it is not even dialled.
    let dial = TcpDial {
        port: None,
        timeout: Duration::from_millis(200),
    };
    assert_eq!(
        dial.check(&subj(pod("a", Some("True"), &[]), "http"))
            .await
            .decision,
        Decision::Exclude
    );
    assert_eq!(dial.check(&unready).await.decision, Decision::Include);
    let get = HttpGet {
        request: portwise_probe::HttpRequest::get("/").unwrap(),
        port: None,
        timeout: Duration::from_millis(200),
    };
    assert_eq!(get.check(&unready).await.decision, Decision::Include);
    // Membership signals do not yield.
    let key = "port-mapper.example.com/ports";
    let names = PortNames(KeySource::Annotation(key.into()));
    let elsewhere = under_pnra(subj(pod("a", Some("False"), &[(key, "https")]), "http"));
    assert_eq!(names.check(&elsewhere).await.decision, Decision::Exclude);
    let mut dying = pod("a", Some("False"), &[]);
    dying.metadata.deletion_timestamp =
        Some(Time(jiff::Timestamp::from_second(1_700_000_000).unwrap()));
    assert_eq!(
        NotTerminating
            .check(&under_pnra(subj(dying, "x")))
            .await
            .decision,
        Decision::Exclude
    );
}

#[tokio::test]
async fn not_terminating() {
    let live = pod("a", Some("True"), &[]);
    assert_eq!(
        NotTerminating.check(&subj(live.clone(), "x")).await,
        Verdict::include()
    );
    let mut dying = live;
    dying.metadata.deletion_timestamp =
        Some(Time(jiff::Timestamp::from_second(1_700_000_000).unwrap()));
    let v = NotTerminating.check(&subj(dying, "x")).await;
    assert_eq!(v.decision, Decision::Exclude);
}

#[tokio::test]
async fn constants() {
    for d in [Decision::Include, Decision::Exclude, Decision::Abstain] {
        assert_eq!(
            Constant(d)
                .check(&subj(pod("a", None, &[]), "x"))
                .await
                .decision,
            d
        );
    }
}

#[tokio::test]
async fn port_names_annotation_and_label() {
    let key = "port-mapper.example.com/ports";
    let c = PortNames(KeySource::Annotation(key.into()));
    let p = pod("b", Some("True"), &[(key, " http , https,metrics ")]);
    for (port, want) in [
        ("http", Decision::Include),
        ("https", Decision::Include),
        ("metrics", Decision::Include),
        ("admin", Decision::Exclude),
        ("htt", Decision::Exclude),
        ("", Decision::Exclude),
    ] {
        assert_eq!(
            c.check(&subj(p.clone(), port)).await.decision,
            want,
            "{port:?}"
        );
    }
    // Missing annotation.
    assert_eq!(
        c.check(&subj(pod("c", None, &[]), "http")).await.decision,
        Decision::Exclude
    );
    // An empty list, and empty entries, match nothing (not even the unnamed port).
    let p = pod("d", None, &[(key, ", ,")]);
    assert_eq!(
        c.check(&subj(p.clone(), "")).await.decision,
        Decision::Exclude
    );
    assert_eq!(c.check(&subj(p, "http")).await.decision, Decision::Exclude);
    // Labels are looked up in labels, not annotations.
    let mut labelled = pod("e", None, &[(key, "http")]);
    labelled.metadata.labels = Some([("ports".to_owned(), "https".to_owned())].into());
    let by_label = PortNames(KeySource::Label("ports".into()));
    assert_eq!(
        by_label
            .check(&subj(labelled.clone(), "https"))
            .await
            .decision,
        Decision::Include
    );
    assert_eq!(
        by_label.check(&subj(labelled, "http")).await.decision,
        Decision::Exclude
    );
}

#[tokio::test]
async fn tcp_dial_checker() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let c = TcpDial {
        port: None,
        timeout: Duration::from_secs(1),
    };
    let s = subject(pod("a", None, &[]), "tcp", local(), port);
    assert_eq!(c.check(&s).await, Verdict::include());
    drop(listener);
    let v = c.check(&s).await;
    assert_eq!(v.decision, Decision::Exclude);
    assert!(v.reason.unwrap().contains("refused"));
}

async fn http_server(
    status_line: &'static str,
    body: &'static str,
) -> (u16, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = tokio::io::AsyncReadExt::read(&mut sock, &mut buf).await;
                let resp = format!(
                    "HTTP/1.1 {status_line}\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = sock.write_all(resp.as_bytes()).await;
            });
        }
    });
    (port, task)
}

#[tokio::test]
async fn http_get_checker() {
    let c = HttpGet {
        request: portwise_probe::HttpRequest::get("/healthz").unwrap(),
        port: None,
        timeout: Duration::from_secs(1),
    };
    let (port, t1) = http_server("200 OK", "ok").await;
    assert_eq!(
        c.check(&subject(pod("a", None, &[]), "http", local(), port))
            .await,
        Verdict::include()
    );
    let (port, t2) = http_server("204 No Content", "").await;
    assert_eq!(
        c.check(&subject(pod("a", None, &[]), "http", local(), port))
            .await
            .decision,
        Decision::Include
    );
    let (port, t3) = http_server("503 Service Unavailable", "  warming up\n").await;
    let v = c
        .check(&subject(pod("a", None, &[]), "http", local(), port))
        .await;
    assert_eq!(v.decision, Decision::Exclude);
    assert!(
        v.reason
            .as_deref()
            .unwrap()
            .ends_with("status 503: warming up"),
        "{v:?}"
    );
    let (port, t4) = http_server("302 Found", "").await;
    let v = c
        .check(&subject(pod("a", None, &[]), "http", local(), port))
        .await;
    assert_eq!(v.decision, Decision::Exclude, "redirects are not success");
    for t in [t1, t2, t3, t4] {
        t.abort();
    }
}

#[tokio::test]
async fn http_get_times_out_to_exclude() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let c = HttpGet {
        request: portwise_probe::HttpRequest::get("/").unwrap(),
        port: None,
        timeout: Duration::from_millis(100),
    };
    let v = c
        .check(&subject(pod("a", None, &[]), "http", local(), port))
        .await;
    assert_eq!(v.decision, Decision::Exclude);
    assert!(v.reason.unwrap().contains("timed out"));
}

#[test]
fn probe_error_mapping() {
    assert_eq!(
        verdict_for_probe_error("x", &ProbeError::Timeout).decision,
        Decision::Exclude
    );
    assert_eq!(
        verdict_for_probe_error("x", &ProbeError::Refused).decision,
        Decision::Exclude
    );
    assert_eq!(
        verdict_for_probe_error("x", &ProbeError::Io("reset".into())).decision,
        Decision::Exclude
    );
    let unreachable = ProbeError::from_io(&std::io::Error::from(
        std::io::ErrorKind::NetworkUnreachable,
    ));
    assert_eq!(
        verdict_for_probe_error("x", &unreachable).decision,
        Decision::Abstain
    );
    let no_route = ProbeError::from_io(&std::io::Error::from(std::io::ErrorKind::HostUnreachable));
    assert_eq!(
        HttpGet::verdict("x", Err(no_route)).decision,
        Decision::Abstain
    );
    let ok = probe::HttpResponse {
        status: 299,
        body: vec![],
        truncated: false,
    };
    assert_eq!(HttpGet::verdict("x", Ok(ok)).decision, Decision::Include);
    let moved = probe::HttpResponse {
        status: 301,
        body: vec![],
        truncated: false,
    };
    assert_eq!(HttpGet::verdict("x", Ok(moved)).decision, Decision::Exclude);
}

#[tokio::test]
async fn all_short_circuits_on_first_exclude() {
    let (a, b, c) = (
        Counting::new(Decision::Include),
        Counting::new(Decision::Exclude),
        Counting::new(Decision::Include),
    );
    let all = All(vec![a.clone(), b.clone(), c.clone()]);
    let v = all.check(&subj(pod("p", None, &[]), "x")).await;
    assert_eq!(v, Verdict::exclude().because("fixed Exclude"));
    assert_eq!((a.calls(), b.calls(), c.calls()), (1, 1, 0));
}

#[tokio::test]
async fn all_abstain_does_not_short_circuit() {
    let (a, b) = (
        Counting::new(Decision::Abstain),
        Counting::new(Decision::Exclude),
    );
    let v = All(vec![a.clone(), b.clone()])
        .check(&subj(pod("p", None, &[]), "x"))
        .await;
    assert_eq!(v.decision, Decision::Exclude);
    assert_eq!((a.calls(), b.calls()), (1, 1));
    let (a, b) = (
        Counting::new(Decision::Include),
        Counting::new(Decision::Abstain),
    );
    let v = All(vec![a, b]).check(&subj(pod("p", None, &[]), "x")).await;
    assert_eq!(v, Verdict::abstain().because("fixed Abstain"));
    assert_eq!(
        All(vec![])
            .check(&subj(pod("p", None, &[]), "x"))
            .await
            .decision,
        Decision::Include
    );
}

#[tokio::test]
async fn any_short_circuits_on_first_include() {
    let (a, b, c) = (
        Counting::new(Decision::Abstain),
        Counting::new(Decision::Include),
        Counting::new(Decision::Exclude),
    );
    let v = Any(vec![a.clone(), b.clone(), c.clone()])
        .check(&subj(pod("p", None, &[]), "x"))
        .await;
    assert_eq!(v.decision, Decision::Include);
    assert_eq!((a.calls(), b.calls(), c.calls()), (1, 1, 0));
    let v = Any(vec![
        Counting::new(Decision::Exclude),
        Counting::new(Decision::Abstain),
    ])
    .check(&subj(pod("p", None, &[]), "x"))
    .await;
    assert_eq!(v.decision, Decision::Abstain);
    let v = Any(vec![Counting::new(Decision::Exclude)])
        .check(&subj(pod("p", None, &[]), "x"))
        .await;
    assert_eq!(v.decision, Decision::Exclude);
    assert_eq!(
        Any(vec![])
            .check(&subj(pod("p", None, &[]), "x"))
            .await
            .decision,
        Decision::Exclude
    );
}

#[tokio::test]
async fn combinators_match_the_algebra_exhaustively() {
    use Decision::*;
    let ds = [Include, Exclude, Abstain];
    let s = subj(pod("p", None, &[]), "x");
    for a in ds {
        assert_eq!(
            Not(Counting::new(a)).check(&s).await.decision,
            algebra::not(a)
        );
        for b in ds {
            for c in ds {
                let kids = || -> Vec<Arc<dyn Checker>> {
                    vec![Counting::new(a), Counting::new(b), Counting::new(c)]
                };
                assert_eq!(
                    All(kids()).check(&s).await.decision,
                    algebra::all(&[a, b, c]),
                    "{a:?}{b:?}{c:?}"
                );
                assert_eq!(
                    Any(kids()).check(&s).await.decision,
                    algebra::any(&[a, b, c]),
                    "{a:?}{b:?}{c:?}"
                );
            }
        }
    }
}

#[tokio::test]
async fn per_port_routes_by_name_with_fallback() {
    let http = Counting::new(Decision::Include);
    let admin = Counting::new(Decision::Abstain);
    let fallback = Counting::new(Decision::Exclude);
    let pp = PerPort {
        ports: [
            ("http".to_owned(), http.clone() as Arc<dyn Checker>),
            ("admin".to_owned(), admin.clone() as _),
        ]
        .into(),
        fallback: fallback.clone(),
    };
    let p = pod("p", None, &[]);
    assert_eq!(
        pp.check(&subj(p.clone(), "http")).await.decision,
        Decision::Include
    );
    assert_eq!(
        pp.check(&subj(p.clone(), "admin")).await.decision,
        Decision::Abstain
    );
    assert_eq!(
        pp.check(&subj(p.clone(), "metrics")).await.decision,
        Decision::Exclude
    );
    assert_eq!(pp.check(&subj(p, "")).await.decision, Decision::Exclude);
    assert_eq!((http.calls(), admin.calls(), fallback.calls()), (1, 1, 2));
}

#[tokio::test]
async fn stable_damps_per_key() {
    use Decision::*;
    let script = Arc::new(Script(Mutex::new(vec![
        Include, Exclude, Exclude, Include, Exclude, Exclude, Exclude,
    ])));
    let st = Stable::new(script, 2, 3, Duration::from_secs(600));
    let s = subj(pod("p", None, &[]), "http");
    let mut got = vec![];
    for _ in 0..7 {
        got.push(st.check(&s).await.decision);
    }
    assert_eq!(
        got,
        [
            Include, Include, Include, Include, Include, Include, Exclude
        ]
    );
    assert_eq!(st.store.len(), 1);
}

#[tokio::test]
async fn stable_reason_explains_holding() {
    let st = Stable::new(
        Arc::new(Script(Mutex::new(vec![
            Decision::Include,
            Decision::Exclude,
            Decision::Abstain,
        ]))),
        1,
        3,
        Duration::from_secs(60),
    );
    let s = subj(pod("p", None, &[]), "http");
    assert_eq!(st.check(&s).await, Verdict::include());
    let v = st.check(&s).await;
    assert_eq!(v.decision, Decision::Include);
    assert!(
        v.reason
            .as_deref()
            .unwrap()
            .contains("1 of 3 consecutive Exclude"),
        "{v:?}"
    );
    let v = st.check(&s).await;
    assert_eq!(v.decision, Decision::Include);
    assert!(v.reason.as_deref().unwrap().contains("abstained"), "{v:?}");
}

/// Issue 12: re-checks closer together than the spacing (a pod updated
/// every 100 ms) are one observation; a failure threshold of 3 needs
/// three observations a period apart.
#[test]
fn stable_counts_observations_a_period_apart_not_rechecks() {
    use Decision::*;
    let period = Duration::from_secs(1);
    let store = StableStore::new(1, 3, Duration::from_secs(600)).counting_every(period);
    let key = StableKey::of(&subj(pod("p", None, &[]), "http"));
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    assert_eq!(store.observe(key.clone(), Include, at(0)).0, Include);
    // Failing re-checks every 100 ms for 2.9 s: counted at 1 s and 2 s.
    for ms in (100..3000).step_by(100) {
        assert_eq!(
            store.observe(key.clone(), Exclude, at(ms)).0,
            Include,
            "left at {ms} ms"
        );
    }
    // The third observation a period apart.
    assert_eq!(store.observe(key.clone(), Exclude, at(3000)).0, Exclude);
    // Without spacing, every re-check counts: out at the third.
    let eager = StableStore::new(1, 3, Duration::from_secs(600));
    eager.observe(key.clone(), Include, at(0));
    eager.observe(key.clone(), Exclude, at(100));
    eager.observe(key.clone(), Exclude, at(200));
    assert_eq!(eager.observe(key, Exclude, at(300)).0, Exclude);
}

#[test]
fn stable_store_keys_are_independent() {
    use Decision::*;
    let store = StableStore::new(1, 2, Duration::from_secs(60));
    let now = Instant::now();
    let s = subj(pod("p", None, &[]), "http");
    let k1 = StableKey::of(&s);
    let mut k2 = k1.clone();
    k2.pod_uid = "other".into();
    let mut k3 = k1.clone();
    k3.address = "10.244.0.7".parse().unwrap();
    let mut k4 = k1.clone();
    k4.target = 8081;
    assert_eq!(store.observe(k1.clone(), Include, now).0, Include);
    assert_eq!(store.observe(k1.clone(), Exclude, now).0, Include);
    // Other keys take their first observation as is.
    for k in [&k2, &k3, &k4] {
        assert_eq!(store.observe(k.clone(), Exclude, now).0, Exclude);
    }
    assert_eq!(store.observe(k1, Exclude, now).0, Exclude);
    assert_eq!(store.len(), 4);
}

#[test]
fn stable_store_expires_unused_entries() {
    use Decision::*;
    let ttl = Duration::from_secs(60);
    let store = StableStore::new(3, 3, ttl);
    let t0 = Instant::now();
    let s = subj(pod("p", None, &[]), "http");
    let k = StableKey::of(&s);
    let mut other = k.clone();
    other.pod_uid = "gone".into();
    store.observe(k.clone(), Include, t0);
    store.observe(other.clone(), Include, t0);
    // Within the TTL the state holds: one exclude does not flip.
    assert_eq!(store.observe(k.clone(), Exclude, t0 + ttl / 2).0, Include);
    // `other` is unused for > ttl: swept on the next observation after a ttl.
    assert_eq!(store.len(), 2);
    store.observe(k.clone(), Exclude, t0 + ttl + Duration::from_secs(1));
    assert_eq!(store.len(), 1, "unused entry swept");
    // An entry unused for a whole TTL starts afresh: first observation as is.
    let later = t0 + 3 * ttl;
    assert_eq!(store.observe(k, Exclude, later).0, Exclude);
}

#[tokio::test]
async fn seed_example_all_pod_ready_and_port_names() {
    // Service my-service: http -> pods A, B, C; https -> B, C, D (D not ready).
    let key = "port-mapper.example.com/ports";
    let pods = [
        pod("a", Some("True"), &[(key, "http")]),
        pod("b", Some("True"), &[(key, "http,https")]),
        pod("c", Some("True"), &[(key, "https, http")]),
        pod("d", Some("False"), &[(key, "https")]),
        pod("e", Some("True"), &[]),
    ];
    let checker = All(vec![
        Arc::new(PodReady),
        Arc::new(PortNames(KeySource::Annotation(key.into()))),
    ]);
    let mut members: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for port in ["http", "https"] {
        for p in &pods {
            let v = checker.check(&subj(p.clone(), port)).await;
            if v.decision == Decision::Include {
                members
                    .entry(port)
                    .or_default()
                    .push(p.metadata.name.clone().unwrap());
            }
        }
    }
    assert_eq!(members["http"], ["a", "b", "c"]);
    assert_eq!(members["https"], ["b", "c"]);
}
