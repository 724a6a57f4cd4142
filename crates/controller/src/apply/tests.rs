//! Containment of failed writes, against a fake apiserver: which writes are
//! made, which are held back, what is remembered, what the error says.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex},
};

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointPort, EndpointSlice};
use kube::{ResourceExt, core::Status};

use super::{Error, Recent, SliceApi, set_of, write};
use portwise_core::plan::testutil::{NS, World, include_all, many_pods, num, port, service};

use crate::metrics::Metrics;

/// An in-memory apiserver that refuses applies of some names (422) and
/// fails deletes of others (500), and logs every call.
#[derive(Default)]
struct Fake {
    state: Mutex<State>,
    refuse: BTreeSet<String>,
    broken_deletes: BTreeSet<String>,
}

#[derive(Default)]
struct State {
    slices: BTreeMap<String, EndpointSlice>,
    rv: u64,
    calls: Vec<String>,
}

impl Fake {
    fn new(live: impl IntoIterator<Item = EndpointSlice>) -> Self {
        let fake = Fake::default();
        for s in live {
            fake.store(s);
        }
        fake
    }

    fn refusing(mut self, names: &[&str]) -> Self {
        self.refuse.extend(names.iter().map(|n| n.to_string()));
        self
    }

    fn failing_deletes(mut self, names: &[&str]) -> Self {
        self.broken_deletes
            .extend(names.iter().map(|n| n.to_string()));
        self
    }

    fn store(&self, mut s: EndpointSlice) -> EndpointSlice {
        let mut st = self.state.lock().unwrap();
        st.rv += 1;
        let name = s.name_any();
        s.metadata.uid = Some(
            st.slices
                .get(&name)
                .and_then(|l| l.metadata.uid.clone())
                .unwrap_or_else(|| format!("{name}-{}", st.rv)),
        );
        s.metadata.resource_version = Some(st.rv.to_string());
        st.slices.insert(name, s.clone());
        s
    }

    fn calls(&self) -> Vec<String> {
        self.state.lock().unwrap().calls.clone()
    }

    fn get_slice(&self, name: &str) -> Option<EndpointSlice> {
        self.state.lock().unwrap().slices.get(name).cloned()
    }

    fn log(&self, call: String) {
        self.state.lock().unwrap().calls.push(call);
    }
}

fn status(code: u16, reason: &str) -> kube::Error {
    kube::Error::Api(
        Status::failure(&format!("refused by the fake ({reason})"), reason)
            .with_code(code)
            .boxed(),
    )
}

impl SliceApi for Fake {
    async fn apply(&self, slice: &EndpointSlice) -> kube::Result<EndpointSlice> {
        let name = slice.name_any();
        self.log(format!("apply {name}"));
        if self.refuse.contains(&name) {
            return Err(status(422, "Invalid"));
        }
        Ok(self.store(slice.clone()))
    }

    async fn get(&self, name: &str) -> kube::Result<Option<EndpointSlice>> {
        self.log(format!("get {name}"));
        Ok(self.get_slice(name))
    }

    async fn delete(&self, name: &str, uid: Option<String>) -> kube::Result<()> {
        self.log(format!("delete {name}"));
        if self.broken_deletes.contains(name) {
            return Err(status(500, "InternalError"));
        }
        let mut st = self.state.lock().unwrap();
        match st.slices.get(name) {
            None => Err(status(404, "NotFound")),
            Some(s) if uid.is_some() && s.metadata.uid != uid => Err(status(409, "Conflict")),
            Some(_) => {
                st.slices.remove(name);
                Ok(())
            }
        }
    }
}

/// A one-port slice of `port` and `address_type` holding `ips`.
fn slice(name: &str, port: &str, address_type: &str, ips: &[&str]) -> EndpointSlice {
    EndpointSlice {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            ..Default::default()
        },
        address_type: address_type.into(),
        ports: Some(vec![EndpointPort {
            name: Some(port.into()),
            port: Some(8080),
            protocol: Some("TCP".into()),
            app_protocol: None,
        }]),
        endpoints: Some(
            ips.iter()
                .map(|ip| Endpoint {
                    addresses: vec![ip.to_string()],
                    ..Default::default()
                })
                .collect(),
        ),
    }
}

/// `s` as an informer cache holding an old version (resourceVersion 1)
/// would show it.
fn cached(mut s: EndpointSlice) -> Arc<EndpointSlice> {
    s.metadata.resource_version = Some("1".into());
    Arc::new(s)
}

fn addresses(s: &EndpointSlice) -> Vec<String> {
    s.endpoints
        .iter()
        .flatten()
        .flat_map(|e| e.addresses.clone())
        .collect()
}

async fn run(
    fake: &Fake,
    recent: &Recent,
    applies: &[EndpointSlice],
    deletes: &[&str],
) -> Result<(), Error> {
    let deletes: Vec<String> = deletes.iter().map(|d| d.to_string()).collect();
    write(fake, recent, NS, applies, &deletes, &Metrics::new()).await
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn a_slice_set_is_its_port_name_and_address_type() {
    let a = slice("web-http", "http", "IPv4", &[]);
    let mut other_target = slice("web-http--p9090", "http", "IPv4", &[]);
    other_target.ports.as_mut().unwrap()[0].port = Some(9090);
    assert_eq!(set_of(&a), Some(("http".into(), "IPv4".into())));
    // The target port does not split a set: a targetPort change rewrites
    // a (port, family)'s slices in place from one target to the other.
    assert_eq!(set_of(&a), set_of(&other_target));
    assert_ne!(set_of(&a), set_of(&slice("x", "http", "IPv6", &[])));
    assert_ne!(set_of(&a), set_of(&slice("x", "admin", "IPv4", &[])));
    // A placeholder (no target yet) is in its set too.
    let mut placeholder = slice("web-http", "http", "IPv4", &[]);
    placeholder.ports.as_mut().unwrap()[0].port = None;
    assert_eq!(set_of(&placeholder), set_of(&a));
    // Shapes portwise does not write belong to no one set.
    let mut none = a.clone();
    none.ports = None;
    assert_eq!(set_of(&none), None);
    let mut two = a.clone();
    two.ports.as_mut().unwrap().push(EndpointPort {
        name: Some("admin".into()),
        ..Default::default()
    });
    assert_eq!(set_of(&two), None);
}

#[tokio::test]
async fn a_failed_apply_holds_back_its_own_set_and_nothing_else() {
    // web-admin's endpoint 10.0.0.3 moves to web-admin--2, which is
    // refused. Applying web-admin, or deleting web-admin--3, would lose
    // endpoints; the http sets have nothing to do with it.
    let fake = Fake::new([
        slice("web-admin", "admin", "IPv4", &["10.0.0.1", "10.0.0.3"]),
        slice("web-admin--2", "admin", "IPv4", &["10.0.0.2"]),
        slice("web-admin--3", "admin", "IPv4", &["10.0.0.4"]),
        slice("web-http", "http", "IPv4", &["10.0.0.1"]),
        slice("web-http--2", "http", "IPv4", &["10.0.0.2"]),
        slice("web-http--ipv6", "http", "IPv6", &["fd00::1"]),
    ])
    .refusing(&["web-admin--2"]);
    let recent = Recent::default();
    let applies = [
        slice(
            "web-admin--2",
            "admin",
            "IPv4",
            &["10.0.0.2", "10.0.0.3", "10.0.0.4"],
        ),
        slice("web-admin--9", "admin", "IPv4", &["10.0.0.9"]),
        slice("web-http", "http", "IPv4", &["10.0.0.1", "10.0.0.2"]),
        slice("web-http--ipv6", "http", "IPv6", &["fd00::1", "fd00::2"]),
    ];
    let err = run(&fake, &recent, &applies, &["web-admin--3", "web-http--2"])
        .await
        .unwrap_err();

    assert_eq!(
        fake.calls(),
        strings(&[
            "apply web-admin--2",
            "apply web-http",
            "apply web-http--ipv6",
            "get web-admin--3",
            "get web-http--2",
            "delete web-http--2",
        ])
    );
    // The admin set is as it was.
    assert_eq!(
        addresses(&fake.get_slice("web-admin--2").unwrap()),
        ["10.0.0.2"]
    );
    assert!(fake.get_slice("web-admin--3").is_some());
    assert!(fake.get_slice("web-admin--9").is_none());
    // The http sets are done.
    assert_eq!(
        addresses(&fake.get_slice("web-http").unwrap()),
        ["10.0.0.1", "10.0.0.2"]
    );
    assert!(fake.get_slice("web-http--2").is_none());

    match &err {
        Error::Several { failed, held_back } => {
            assert!(
                matches!(&failed[..], [Error::Apply { name, .. }] if name == "web-admin--2"),
                "{failed:?}"
            );
            assert_eq!(held_back, &strings(&["web-admin--9", "web-admin--3"]));
        }
        other => panic!("expected Several, got {other:?}"),
    }
    let msg = err.to_string();
    for name in ["web-admin--2", "web-admin--9", "web-admin--3"] {
        assert!(msg.contains(name), "{name} missing from: {msg}");
    }
    assert!(msg.contains("refused by the fake"), "{msg}");

    // Read-your-writes: what was written is remembered, nothing else.
    let mut names = recent.names(NS);
    names.sort();
    assert_eq!(names, strings(&["web-http", "web-http--ipv6"]));
    // (The cache still shows the objects as they were before: resourceVersion 1.)
    let stale = cached(slice("web-http", "http", "IPv4", &[]));
    let view = recent.overlay(NS, "web-http", Some(stale)).unwrap();
    assert_eq!(addresses(&view), ["10.0.0.1", "10.0.0.2"]);
    let stale = cached(slice("web-http--2", "http", "IPv4", &[]));
    assert!(recent.overlay(NS, "web-http--2", Some(stale)).is_none());
    let cached = cached(slice("web-admin--2", "admin", "IPv4", &["10.0.0.2"]));
    assert_eq!(
        recent
            .overlay(NS, "web-admin--2", Some(cached.clone()))
            .as_deref(),
        Some(&*cached)
    );
}

#[tokio::test]
async fn failures_in_several_sets_are_all_named() {
    let fake = Fake::new([]).refusing(&["a-http", "a-admin--ipv6"]);
    let applies = [
        slice("a-admin--ipv6", "admin", "IPv6", &["fd00::1"]),
        slice("a-admin--ipv6--2", "admin", "IPv6", &["fd00::2"]),
        slice("a-admin", "admin", "IPv4", &["10.0.0.1"]),
        slice("a-http", "http", "IPv4", &["10.0.0.1"]),
    ];
    let err = run(&fake, &Recent::default(), &applies, &[])
        .await
        .unwrap_err();
    assert!(fake.get_slice("a-admin").is_some());
    let Error::Several { failed, held_back } = &err else {
        panic!("expected Several, got {err:?}");
    };
    assert_eq!(failed.len(), 2);
    assert_eq!(held_back, &strings(&["a-admin--ipv6--2"]));
    let msg = err.to_string();
    assert!(msg.starts_with("2 EndpointSlice writes failed: "), "{msg}");
    for name in ["a-http", "a-admin--ipv6", "a-admin--ipv6--2"] {
        assert!(msg.contains(name), "{name} missing from: {msg}");
    }
}

#[tokio::test]
async fn a_failed_delete_holds_nothing_back() {
    let fake = Fake::new([
        slice("web-http--2", "http", "IPv4", &[]),
        slice("web-http--3", "http", "IPv4", &[]),
    ])
    .failing_deletes(&["web-http--2"]);
    let recent = Recent::default();
    let applies = [slice("web-http", "http", "IPv4", &["10.0.0.1"])];
    let err = run(&fake, &recent, &applies, &["web-http--2", "web-http--3"])
        .await
        .unwrap_err();
    // One failure, nothing held back: the plain error.
    assert!(
        matches!(&err, Error::Delete { name, .. } if name == "web-http--2"),
        "{err:?}"
    );
    assert!(fake.get_slice("web-http").is_some());
    assert!(fake.get_slice("web-http--2").is_some());
    assert!(fake.get_slice("web-http--3").is_none());
    // The failed delete is not remembered as done.
    let stale = cached(slice("web-http--2", "http", "IPv4", &[]));
    assert!(recent.overlay(NS, "web-http--2", Some(stale)).is_some());
}

#[tokio::test]
async fn a_slice_of_no_one_set_waits_for_every_set() {
    let mut odd = slice("web-odd", "http", "IPv4", &["10.0.0.5"]);
    odd.ports = None;
    // No failure: deleted like any other.
    let fake = Fake::new([odd.clone()]);
    run(&fake, &Recent::default(), &[], &["web-odd"])
        .await
        .unwrap();
    assert!(fake.get_slice("web-odd").is_none());
    // Any failed set holds it back: it may hold that set's endpoints.
    let fake = Fake::new([odd.clone()]).refusing(&["web-admin"]);
    let applies = [slice("web-admin", "admin", "IPv6", &["fd00::1"])];
    let err = run(&fake, &Recent::default(), &applies, &["web-odd"])
        .await
        .unwrap_err();
    assert!(fake.get_slice("web-odd").is_some());
    assert!(err.to_string().contains("web-odd"), "{err}");
    // And a failed apply of such a shape holds back every later write.
    let fake = Fake::new([]).refusing(&["web-odd"]);
    let applies = [odd, slice("web-x", "x", "IPv4", &["10.0.0.1"])];
    let err = run(&fake, &Recent::default(), &applies, &[])
        .await
        .unwrap_err();
    assert!(fake.get_slice("web-x").is_none());
    assert!(
        matches!(&err, Error::Several { held_back, .. } if held_back == &strings(&["web-x"])),
        "{err:?}"
    );
}

#[tokio::test]
async fn planner_output_fails_per_port_and_family() {
    // Two ports, two families, 30 pods, 10 per slice: 12 slices. Then 11
    // pods go: in each (port, family) the first slice empties (a delete)
    // and the second loses one (an apply).
    let svc = service(
        "web",
        vec![port("http", 80, num(8080)), port("admin", 81, num(8081))],
        &["IPv4", "IPv6"],
    );
    let pods = many_pods(30, true);
    let mut before = World::default();
    before.apply(&before.plan(&svc, &include_all(&svc, &pods), 10));
    assert_eq!(before.slices.len(), 12);
    let plan = before.plan(&svc, &include_all(&svc, &pods[11..]), 10);
    let mut after = before.clone();
    after.apply(&plan);

    let broken = ("admin".to_string(), "IPv4".to_string());
    let in_broken = |s: &EndpointSlice| set_of(s).as_ref() == Some(&broken);
    let refused = plan
        .applies
        .iter()
        .find(|s| in_broken(s))
        .expect("an apply in admin/IPv4")
        .name_any();
    let held_deletes: Vec<&String> = plan
        .deletes
        .iter()
        .filter(|d| in_broken(&before.slices[*d]))
        .collect();
    assert!(!held_deletes.is_empty(), "a delete in admin/IPv4");

    let fake = Fake::new(before.slices.values().map(|s| (**s).clone())).refusing(&[&refused]);
    let recent = Recent::default();
    let err = write(
        &fake,
        &recent,
        NS,
        &plan.applies,
        &plan.deletes,
        &Metrics::new(),
    )
    .await
    .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains(&refused), "{msg}");
    for d in &held_deletes {
        assert!(msg.contains(d.as_str()), "{d} missing from: {msg}");
    }

    // admin/IPv4 is exactly as before; every other set exactly as planned.
    let content = |s: Option<&EndpointSlice>| {
        s.map(|s| (s.address_type.clone(), s.ports.clone(), s.endpoints.clone()))
    };
    let names: BTreeSet<&String> = before.slices.keys().chain(after.slices.keys()).collect();
    for name in names {
        let was = before.slices.get(name).map(|s| &**s);
        let planned = after.slices.get(name).map(|s| &**s);
        let broken_set = was.or(planned).is_some_and(in_broken);
        let want = if broken_set { was } else { planned };
        assert_eq!(
            content(fake.get_slice(name).as_ref()),
            content(want),
            "{name} (in the failed set: {broken_set})"
        );
    }
    // Every write outside admin/IPv4 is remembered; none inside.
    for s in &plan.applies {
        let name = s.name_any();
        assert_eq!(
            recent.names(NS).contains(&name),
            !in_broken(s),
            "{name} remembered"
        );
    }
}
