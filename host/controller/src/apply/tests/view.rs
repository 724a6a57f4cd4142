//! The writer's view of its own slices: names it holds are forced only onto
//! the object it holds, deletes carry its uid, the overlay of recent writes
//! never orders resource versions and expires, and a move is finished after
//! the delete of the slice it left.

use super::*;

#[tokio::test]
async fn a_name_the_view_does_not_hold_is_only_created() {
    // Another writer created web-http after our snapshot: our view has no
    // such name, so portwise creates it, and the apiserver refuses rather
    // than hand the other writer's object to us.
    let fake = Fake::new([]);
    let theirs = fake.written_by_another(slice("web-http", "http", "IPv4", &["10.9.9.9"]));
    let recent = Recent::default();
    let writes = Writes::new(
        &[slice("web-http", "http", "IPv4", &["10.0.0.1"])],
        &[],
        |_| None,
    );
    let err = write_fresh(&fake, &recent, &writes).await.unwrap_err();
    assert!(
        matches!(&err, Error::Apply { name, .. } if name == "web-http"),
        "{err:?}"
    );
    assert_eq!(fake.calls(), strings(&["create web-http"]));
    assert_eq!(fake.get_slice("web-http"), Some(theirs));
    assert!(recent.names(NS).is_empty());
    // A name nobody holds is simply created.
    let writes = Writes::new(
        &[slice("web-admin", "admin", "IPv4", &["10.0.0.1"])],
        &[],
        |_| None,
    );
    write_fresh(&fake, &recent, &writes).await.unwrap();
    assert_eq!(
        addresses(&fake.get_slice("web-admin").unwrap()),
        ["10.0.0.1"]
    );
}

/// Writes web-http holding `ip`, our view holding `seen`.
async fn write_web_http(
    fake: &Fake,
    seen: Option<Arc<EndpointSlice>>,
    ip: &str,
) -> Result<(), Error> {
    let writes = Writes::new(&[slice("web-http", "http", "IPv4", &[ip])], &[], |_| {
        seen.clone()
    });
    write_fresh(fake, &Recent::default(), &writes).await
}

#[tokio::test]
async fn a_known_name_is_forced_only_onto_the_object_the_view_holds() {
    let fake = Fake::new([slice("web-http", "http", "IPv4", &["10.0.0.1"])]);
    // Our view is the live object: an update, checked by resourceVersion.
    let seen = fake.get_slice("web-http").map(Arc::new);
    write_web_http(&fake, seen, "10.0.0.2").await.unwrap();
    assert_eq!(
        addresses(&fake.get_slice("web-http").unwrap()),
        ["10.0.0.2"]
    );
    assert_eq!(fake.calls(), strings(&["update web-http"]));
    // Edited by another writer since our view (same object, another
    // resourceVersion): the update is refused, the apply forces it back.
    let seen = fake.get_slice("web-http").map(Arc::new);
    fake.store(slice("web-http", "http", "IPv4", &["10.6.6.6"]));
    write_web_http(&fake, seen.clone(), "10.0.0.3")
        .await
        .unwrap();
    assert_eq!(
        addresses(&fake.get_slice("web-http").unwrap()),
        ["10.0.0.3"]
    );
    assert_eq!(
        fake.calls()[1..],
        strings(&["update web-http", "apply web-http"])
    );
    // Deleted and re-created by another writer since our view: refused.
    let theirs = fake.written_by_another(slice("web-http", "http", "IPv4", &["10.9.9.9"]));
    let err = write_web_http(&fake, seen, "10.0.0.4").await.unwrap_err();
    assert!(err.to_string().contains("uid mismatch"), "{err}");
    assert_eq!(fake.get_slice("web-http"), Some(theirs));
}

#[tokio::test]
async fn deletes_use_the_uid_the_view_holds_and_need_no_get() {
    let fake = Fake::new([
        slice("web-http--2", "http", "IPv4", &["10.0.0.1"]),
        slice("web-http--3", "http", "IPv4", &["10.0.0.2"]),
    ]);
    let seen: Vec<_> = ["web-http--2", "web-http--3"]
        .map(|n| fake.get_slice(n).map(Arc::new))
        .into();
    // web-http--3 was re-created by another writer since our view.
    fake.written_by_another(slice("web-http--3", "http", "IPv4", &["10.9.9.9"]));
    let view = |n: &str| seen.iter().flatten().find(|s| s.name_any() == n).cloned();
    let writes = Writes::new(&[], &strings(&["web-http--2", "web-http--3", "gone"]), view);
    write_fresh(&fake, &Recent::default(), &writes)
        .await
        .unwrap();
    // No GETs; nothing is sent for a name the view no longer holds.
    assert_eq!(
        fake.calls(),
        strings(&["delete web-http--2", "delete web-http--3"])
    );
    assert!(fake.get_slice("web-http--2").is_none());
    assert_eq!(
        addresses(&fake.get_slice("web-http--3").unwrap()),
        ["10.9.9.9"]
    );
}

#[tokio::test]
async fn the_overlay_never_orders_resource_versions() {
    // The fake's resourceVersions are opaque and decrease as strings and
    // as numbers ("v999", "v998", ...): only uid and generation may decide.
    let fake = Fake::new([slice("web-http", "http", "IPv4", &["10.0.0.1"])]);
    let before = Arc::new(fake.get_slice("web-http").unwrap());
    let recent = Recent::default();
    let writes = Writes::new(
        &[slice("web-http", "http", "IPv4", &["10.0.0.2"])],
        &[],
        |_| Some(before.clone()),
    );
    write_fresh(&fake, &recent, &writes).await.unwrap();
    let mine = fake.get_slice("web-http").unwrap();
    // The cache still shows the generation before ours: our write wins.
    let view = recent
        .overlay(NS, "web-http", Some(before.clone()))
        .unwrap();
    assert_eq!(addresses(&view), ["10.0.0.2"]);
    // The cache caught up (our generation): it is trusted, and we forget.
    let view = recent
        .overlay(NS, "web-http", Some(Arc::new(mine.clone())))
        .unwrap();
    assert_eq!(*view, mine);
    assert!(recent.names(NS).is_empty());
    assert_eq!(
        recent
            .overlay(NS, "web-http", Some(before.clone()))
            .as_deref(),
        Some(&*before),
        "forgotten: the cache is the truth again"
    );

    // A delete: overlaid while the cache shows the deleted uid; a
    // re-creation (another uid) or absence ends it.
    let seen = Arc::new(mine.clone());
    let writes = Writes::new(&[], &strings(&["web-http"]), |_| Some(seen.clone()));
    write_fresh(&fake, &recent, &writes).await.unwrap();
    assert!(recent.overlay(NS, "web-http", Some(seen.clone())).is_none());
    let mut again = slice("web-http", "http", "IPv4", &["10.0.0.7"]);
    again.metadata.uid = Some("someone-else".into());
    let again = Arc::new(again);
    assert_eq!(
        recent
            .overlay(NS, "web-http", Some(again.clone()))
            .as_deref(),
        Some(&*again)
    );
}

#[test]
fn an_overlay_expires() {
    // A write the cache never shows (created, then deleted by someone else
    // during a watch gap) is trusted only for OVERLAY_FOR.
    let recent = Recent::default();
    let mut mine = slice("web-http", "http", "IPv4", &["10.0.0.1"]);
    mine.metadata.uid = Some("u1".into());
    recent.remember(NS, "web-http", mine.clone());
    assert!(recent.overlay(NS, "web-http", None).is_some());
    recent
        .0
        .lock()
        .unwrap()
        .values_mut()
        .for_each(|w| w.at -= OVERLAY_FOR + std::time::Duration::from_secs(1));
    assert!(recent.overlay(NS, "web-http", None).is_none());
    assert!(recent.names(NS).is_empty());
}

/// Once the watch has shown our write, a cache without it means the slice
/// was deleted (or unlabelled) by someone else since: the view says so at
/// once, and the next plan recreates it. (The echo reconcile used to teach
/// the overlay this; with echoes skipped, `Echoes::shown` does.)
#[test]
fn a_shown_write_missing_from_the_cache_is_gone() {
    let recent = Recent::default();
    let echoes = Echoes::default();
    let mut mine = slice("web-http", "http", "IPv4", &["10.0.0.1"]);
    mine.metadata.uid = Some("u1".into());
    mine.metadata.resource_version = Some("7".into());
    echoes.applied(&mine);
    recent.remember(NS, "web-http", mine.clone());
    // Not shown yet: on its way, the view holds it.
    assert!(recent.overlay_with(NS, "web-http", None, &echoes).is_some());
    assert!(echoes.is_our_apply(&mine), "its event is our echo");
    // Shown, then gone from the cache.
    assert!(recent.overlay_with(NS, "web-http", None, &echoes).is_none());
    assert!(recent.names(NS).is_empty());
}

// ---- moves between slices finish last (issue 26) ------------------------

/// `web: 80→8080` {a, b} and `alt: 8080→8080` {b}: b sits in the shared
/// slice; then b leaves alt, so it moves into web's slice.
#[tokio::test]
async fn a_move_is_finished_after_the_delete_of_the_slice_it_left() {
    use portwise_core::{
        membership::Decision,
        plan::{MOVING_IN_ANNOTATION, testutil::judge},
    };
    let svc = service(
        "colo",
        vec![port("web", 80, num(8080)), port("alt", 8080, num(8080))],
        &["IPv4"],
    );
    let pods = many_pods(2, false);
    let members = |alt_has_b: bool| {
        judge(&svc, &pods, move |p, port, _| {
            let b = p.metadata.name.as_deref() == Some("p0001");
            if port == "web" || (alt_has_b && b) {
                Decision::Include
            } else {
                Decision::Exclude
            }
        })
    };
    let mut before = World::default();
    before.apply(&before.plan(&svc, &members(true), 100));
    assert!(before.slices.contains_key("colo-alt.web"));
    let plan = before.plan(&svc, &members(false), 100);
    assert_eq!(plan.finishes.len(), 1);

    let fake = Fake::new(before.slices.values().map(|s| (**s).clone()));
    let recent = Recent::default();
    let writes = Writes::new(&plan.applies, &plan.deletes, fake.view()).finishing(&plan.finishes);
    write_fresh(&fake, &recent, &writes).await.unwrap();
    assert_eq!(
        fake.calls(),
        vec![
            "update colo-web",
            // alt is left without endpoints: its placeholder
            "create colo-alt",
            "delete colo-alt.web",
            "update colo-web"
        ],
        "the slice taking b in is written again after the one it left"
    );
    let web = fake.get_slice("colo-web").unwrap();
    assert!(
        web.annotations().get(MOVING_IN_ANNOTATION).is_none(),
        "the finish removes the marker: {:?}",
        web.annotations()
    );
    assert_eq!(web.endpoints.as_ref().map(Vec::len), Some(2));

    // A refused first write leaves nothing to finish, and nothing is lost:
    // the slice b left is held back too.
    let fake = Fake::new(before.slices.values().map(|s| (**s).clone())).refusing(&["colo-web"]);
    let writes = Writes::new(&plan.applies, &plan.deletes, fake.view()).finishing(&plan.finishes);
    write_fresh(&fake, &Recent::default(), &writes)
        .await
        .unwrap_err();
    assert_eq!(
        fake.calls(),
        vec!["update colo-web", "create colo-alt"],
        "the shared slice's delete is held back, and nothing is finished"
    );
    assert!(fake.get_slice("colo-alt.web").is_some());
}
