//! Guests of both WIT versions side by side.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_0_1_guest_serves_next_to_0_2_guests_in_one_modules_dir() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(FIXTURE_0_1);
    let bytes = fs::read(&fixture).unwrap();
    assert_eq!(
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes)),
        FIXTURE_0_1_SHA256,
        "the 0.1 fixture changed: it must stay the component built in 0.1 days"
    );
    let fixture_0_2_0 = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(FIXTURE_0_2_0);
    let bytes_0_2_0 = fs::read(&fixture_0_2_0).unwrap();
    assert_eq!(
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes_0_2_0)),
        FIXTURE_0_2_0_SHA256,
        "the 0.2.0 fixture changed: it must stay the component built against 0.2.0"
    );
    let dir = TempDir::new("mixed");
    fs::write(dir.path().join(FIXTURE_0_1), &bytes).unwrap();
    fs::write(dir.path().join(FIXTURE_0_2_0), &bytes_0_2_0).unwrap();
    for name in ["admin-check.wasm", "ready-role.wasm"] {
        fs::copy(guest(name), dir.path().join(name)).unwrap();
    }
    let cache = TempDir::new("cache");
    let rt = dir_runtime(dir.path(), &cache).await;
    rt.rescan().await;
    let mut served: Vec<(String, &str)> = rt
        .modules()
        .into_iter()
        .map(|m| (m.module, m.interface))
        .collect();
    served.sort();
    assert_eq!(
        served,
        [
            (FIXTURE_0_1.to_string(), "0.1"),
            (FIXTURE_0_2_0.to_string(), "0.2"),
            ("admin-check.wasm".to_string(), "0.2"),
            ("ready-role.wasm".to_string(), "0.2"),
        ]
    );

    // The same checker built against both versions answers alike: the mark
    // (a label the 0.2 guest reads by key, the 0.1 guest from the whole
    // list), a dial that connects, a dial that is refused.
    let config = json!({"key": "example.com/admin", "timeoutMs": 500});
    let old = rt.checker(FIXTURE_0_1, &config, None).await.unwrap();
    let new = rt.checker("admin-check.wasm", &config, None).await.unwrap();
    let kept = rt.checker(FIXTURE_0_2_0, &config, None).await.unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let open = listener.local_addr().unwrap().port();
    let cases = [
        (
            subject(LOCAL, closed_port(), &[("example.com/admin", "yes")]),
            Decision::Include,
        ),
        (subject(LOCAL, open, &[]), Decision::Include),
        (subject(LOCAL, closed_port(), &[]), Decision::Exclude),
    ];
    for (s, want) in &cases {
        let (a, b, c) = (old.check(s).await, new.check(s).await, kept.check(s).await);
        assert_eq!(a.decision, *want, "0.1: {a:?}");
        assert_eq!(b.decision, *want, "0.2: {b:?}");
        assert_eq!(c.decision, *want, "0.2.0 as built then: {c:?}");
    }
    // A 0.2 guest with a probe, in the same runtime.
    let server = http_server().await;
    let role = rt
        .checker("ready-role.wasm", &json!({"roles": ["primary"]}), None)
        .await
        .unwrap();
    assert_verdict(
        &role.check(&subject(server.ip(), server.port(), &[])).await,
        Decision::Include,
        "role primary",
    );
    assert!(
        rt.failures().iter().all(|f| f.count == 0),
        "{:?}",
        rt.failures()
    );
}
