//! Containment of failed writes, against a fake apiserver: which writes are
//! made, which are held back, what is remembered, what the error says.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, Mutex},
};

use k8s_openapi::{
    api::discovery::v1::{Endpoint, EndpointPort, EndpointSlice},
    apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry},
};
use kube::{ResourceExt, core::Status};

use super::{Error, OVERLAY_FOR, Recent, SliceApi, Writes, set_of, write};
use portwise_core::membership::Decision;
use portwise_core::plan::testutil::{NS, World, judge, many_pods, num, port, service};

use crate::{echo::Echoes, metrics::Metrics};

/// [`write`] into `NS` with a fresh echo book and metrics.
async fn write_fresh(fake: &Fake, recent: &Recent, writes: &Writes) -> Result<(), Error> {
    write(
        fake,
        recent,
        &Echoes::default(),
        NS,
        writes,
        &Metrics::new(),
    )
    .await
}

/// An in-memory apiserver that refuses applies of some names (422) and
/// fails deletes of others (500), and logs every call. Like the real one,
/// it refuses an apply whose uid is not the live object's (409), and an
/// apply without force onto a slice another manager wrote (409).
#[derive(Default)]
struct Fake {
    state: Mutex<State>,
    refuse: BTreeSet<String>,
    broken_deletes: BTreeSet<String>,
}

#[derive(Default)]
struct State {
    slices: BTreeMap<String, EndpointSlice>,
    /// Names whose live object another manager wrote.
    others: BTreeSet<String>,
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
        let live = st.slices.get(&name);
        s.metadata.uid = Some(
            live.and_then(|l| l.metadata.uid.clone())
                .unwrap_or_else(|| format!("{name}-{}", st.rv)),
        );
        s.metadata.generation = Some(live.and_then(|l| l.metadata.generation).unwrap_or(0) + 1);
        // Opaque, and not even ordered as strings.
        s.metadata.resource_version = Some(format!("v{}", 1000 - st.rv));
        st.others.remove(&name);
        st.slices.insert(name, s.clone());
        s
    }

    /// Stores our write of `s`, recording in `managedFields` which labels
    /// and annotations we own as the apiserver would: an apply owns exactly
    /// the keys it sent; a create or update owns the keys it added or
    /// changed, and keeps owning those it set before and left alone.
    fn store_ours(&self, mut s: EndpointSlice, operation: &str) -> EndpointSlice {
        let live = self.get_slice(&s.name_any());
        let mut fields = serde_json::Map::new();
        for (field, now, before) in [
            (
                "f:labels",
                &s.metadata.labels,
                live.as_ref().and_then(|l| l.metadata.labels.clone()),
            ),
            (
                "f:annotations",
                &s.metadata.annotations,
                live.as_ref().and_then(|l| l.metadata.annotations.clone()),
            ),
        ] {
            let was_ours = live.as_ref().map(|l| owned(l, field)).unwrap_or_default();
            let keys: serde_json::Map<String, serde_json::Value> = now
                .iter()
                .flatten()
                .filter(|(k, v)| {
                    operation == "Apply"
                        || was_ours.contains(*k)
                        || before.as_ref().and_then(|b| b.get(*k)) != Some(*v)
                })
                .map(|(k, _)| (format!("f:{k}"), serde_json::json!({})))
                .collect();
            fields.insert(field.into(), keys.into());
        }
        s.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some("portwise".into()),
            operation: Some(operation.into()),
            fields_v1: Some(FieldsV1(serde_json::json!({ "f:metadata": fields }))),
            ..Default::default()
        }]);
        self.store(s)
    }

    /// Another writer creates (or re-creates, with a new uid) `s`.
    fn written_by_another(&self, s: EndpointSlice) -> EndpointSlice {
        let name = s.name_any();
        self.state.lock().unwrap().slices.remove(&name);
        let s = self.store(s);
        self.state.lock().unwrap().others.insert(name);
        s
    }

    /// The view a cache synced now would give.
    fn view(&self) -> impl Fn(&str) -> Option<Arc<EndpointSlice>> + '_ {
        move |name| self.get_slice(name).map(Arc::new)
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

/// The keys of `metadata.<field>` our entry in `s`'s `managedFields` owns.
fn owned(s: &EndpointSlice, field: &str) -> BTreeSet<String> {
    s.metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|e| e.manager.as_deref() == Some("portwise"))
        .filter_map(|e| {
            e.fields_v1
                .as_ref()?
                .0
                .get("f:metadata")?
                .get(field)?
                .as_object()
        })
        .flat_map(|m| m.keys())
        .filter_map(|k| k.strip_prefix("f:"))
        .map(str::to_string)
        .collect()
}

fn status(code: u16, reason: &str) -> kube::Error {
    kube::Error::Api(
        Status::failure(&format!("refused by the fake ({reason})"), reason)
            .with_code(code)
            .boxed(),
    )
}

impl SliceApi for Fake {
    fn manager(&self) -> &str {
        "portwise"
    }

    async fn create(&self, slice: &EndpointSlice) -> kube::Result<EndpointSlice> {
        let name = slice.name_any();
        self.log(format!("create {name}"));
        if self.refuse.contains(&name) {
            return Err(status(422, "Invalid"));
        }
        if self.get_slice(&name).is_some() {
            return Err(status(409, "AlreadyExists"));
        }
        Ok(self.store_ours(slice.clone(), "Update"))
    }

    async fn replace(&self, slice: &EndpointSlice) -> kube::Result<EndpointSlice> {
        let name = slice.name_any();
        self.log(format!("update {name}"));
        if self.refuse.contains(&name) {
            return Err(status(422, "Invalid"));
        }
        match self.get_slice(&name) {
            None => return Err(status(404, "NotFound")),
            Some(live)
                if live.metadata.resource_version != slice.metadata.resource_version
                    || live.metadata.uid != slice.metadata.uid =>
            {
                return Err(status(409, "Conflict (the object has been modified)"));
            }
            Some(_) => {}
        }
        Ok(self.store_ours(slice.clone(), "Update"))
    }

    async fn apply(&self, slice: &EndpointSlice, force: bool) -> kube::Result<EndpointSlice> {
        let name = slice.name_any();
        self.log(if force {
            format!("apply {name}")
        } else {
            format!("apply {name} (no force)")
        });
        if self.refuse.contains(&name) {
            return Err(status(422, "Invalid"));
        }
        {
            let st = self.state.lock().unwrap();
            let live = st.slices.get(&name);
            if slice.metadata.uid.is_some()
                && live.and_then(|l| l.metadata.uid.clone()) != slice.metadata.uid
            {
                return Err(status(409, "Conflict (uid mismatch)"));
            }
            if !force && st.others.contains(&name) {
                return Err(status(409, "Conflict (fields of another manager)"));
            }
        }
        let mut s = slice.clone();
        s.metadata.uid = None;
        Ok(self.store_ours(s, "Apply"))
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

/// `s` as an informer cache holding an old version of the object `fake`
/// holds under its name would show it: same uid, an earlier generation.
fn cached(fake: &Fake, mut s: EndpointSlice) -> Arc<EndpointSlice> {
    let live = fake.get_slice(&s.name_any());
    s.metadata.uid = live.as_ref().and_then(|l| l.metadata.uid.clone());
    s.metadata.generation = Some(0);
    s.metadata.resource_version = Some("v999999".into());
    Arc::new(s)
}

fn addresses(s: &EndpointSlice) -> Vec<String> {
    s.endpoints
        .iter()
        .flatten()
        .flat_map(|e| e.addresses.clone())
        .collect()
}

/// Writes `applies` and `deletes`, with a view equal to the fake's state
/// now (a synced cache).
async fn run(
    fake: &Fake,
    recent: &Recent,
    applies: &[EndpointSlice],
    deletes: &[&str],
) -> Result<(), Error> {
    let deletes: Vec<String> = deletes.iter().map(|d| d.to_string()).collect();
    let writes = Writes::new(applies, &deletes, fake.view());
    write_fresh(fake, recent, &writes).await
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn a_slice_set_is_its_port_name_and_address_type() {
    let a = slice("web-http", "http", "IPv4", &[]);
    let mut other_target = slice("web-http--p9090", "http", "IPv4", &[]);
    other_target.ports.as_mut().unwrap()[0].port = Some(9090);
    assert_eq!(set_of(&a), ("IPv4".into(), Some("http".into())));
    // The target port does not split a set: a targetPort change rewrites
    // a (port, family)'s slices in place from one target to the other.
    assert_eq!(set_of(&a), set_of(&other_target));
    assert_ne!(set_of(&a), set_of(&slice("x", "http", "IPv6", &[])));
    assert_ne!(set_of(&a), set_of(&slice("x", "admin", "IPv4", &[])));
    // A placeholder (no target yet) is in its set too.
    let mut placeholder = slice("web-http", "http", "IPv4", &[]);
    placeholder.ports.as_mut().unwrap()[0].port = None;
    assert_eq!(set_of(&placeholder), set_of(&a));
    // A slice of several ports (or none) stands for its whole family.
    let mut none = a.clone();
    none.ports = None;
    assert_eq!(set_of(&none), ("IPv4".into(), None));
    let mut two = a.clone();
    two.ports.as_mut().unwrap().push(EndpointPort {
        name: Some("admin".into()),
        ..Default::default()
    });
    assert_eq!(set_of(&two), ("IPv4".into(), None));
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
            "update web-admin--2",
            "update web-http",
            "update web-http--ipv6",
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
    // (The cache still shows the objects as they were before.)
    let stale = cached(&fake, slice("web-http", "http", "IPv4", &[]));
    let view = recent.overlay(NS, "web-http", Some(stale)).unwrap();
    assert_eq!(addresses(&view), ["10.0.0.1", "10.0.0.2"]);
    let mut stale = slice("web-http--2", "http", "IPv4", &[]);
    stale.metadata.uid = Some("web-http--2-5".into());
    assert!(
        recent
            .overlay(NS, "web-http--2", Some(Arc::new(stale)))
            .is_none()
    );
    let cached = cached(&fake, slice("web-admin--2", "admin", "IPv4", &["10.0.0.2"]));
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
    let stale = cached(&fake, slice("web-http--2", "http", "IPv4", &[]));
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
    // Any failed set of its family holds it back: it may hold that set's
    // endpoints.
    let fake = Fake::new([odd.clone()]).refusing(&["web-admin"]);
    let applies = [slice("web-admin", "admin", "IPv4", &["10.0.0.1"])];
    let err = run(&fake, &Recent::default(), &applies, &["web-odd"])
        .await
        .unwrap_err();
    assert!(fake.get_slice("web-odd").is_some());
    assert!(err.to_string().contains("web-odd"), "{err}");
    // Another family's failure does not: endpoints never change family.
    let fake = Fake::new([odd.clone()]).refusing(&["web-admin"]);
    let applies = [slice("web-admin", "admin", "IPv6", &["fd00::1"])];
    run(&fake, &Recent::default(), &applies, &["web-odd"])
        .await
        .unwrap_err();
    assert!(fake.get_slice("web-odd").is_none());
    // And a failed apply of such a shape holds back every later write of
    // its family, and none of another.
    let fake = Fake::new([]).refusing(&["web-odd"]);
    let applies = [
        odd,
        slice("web-x", "x", "IPv4", &["10.0.0.1"]),
        slice("web-x--ipv6", "x", "IPv6", &["fd00::1"]),
    ];
    let err = run(&fake, &Recent::default(), &applies, &[])
        .await
        .unwrap_err();
    assert!(fake.get_slice("web-x").is_none());
    assert!(fake.get_slice("web-x--ipv6").is_some());
    assert!(
        matches!(&err, Error::Several { held_back, .. } if held_back == &strings(&["web-x"])),
        "{err:?}"
    );
}

#[tokio::test]
async fn planner_output_fails_per_port_and_family() {
    // Two ports, two families, 30 pods a port (none backs both), 10 per
    // slice: 12 slices. Then 11 pods of each port go: in each (port,
    // family) the first slice empties (a delete) and the second loses one
    // (an apply).
    let svc = service(
        "web",
        vec![port("http", 80, num(8080)), port("admin", 81, num(8081))],
        &["IPv4", "IPv6"],
    );
    let pods = many_pods(60, true);
    // http: p0000..p0029, admin: p0030..p0059; of those, the ones `keep`.
    let judged = |keep: &dyn Fn(usize) -> bool| {
        judge(&svc, &pods, |p, port, _| {
            let i: usize = p.name_any()[1..].parse().unwrap();
            if (i < 30) == (port == "http") && keep(i % 30) {
                Decision::Include
            } else {
                Decision::Exclude
            }
        })
    };
    let mut before = World::default();
    before.apply(&before.plan(&svc, &judged(&|_| true), 10));
    assert_eq!(before.slices.len(), 12);
    let plan = before.plan(&svc, &judged(&|i| i >= 11), 10);
    let mut after = before.clone();
    after.apply(&plan);

    let broken = ("IPv4".to_string(), Some("admin".to_string()));
    let in_broken = |s: &EndpointSlice| set_of(s) == broken;
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
    let writes = Writes::new(&plan.applies, &plan.deletes, fake.view());
    let err = write_fresh(&fake, &recent, &writes).await.unwrap_err();
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

// ---- guards against what the cache cannot see (issue 13) ----------------

mod view;
