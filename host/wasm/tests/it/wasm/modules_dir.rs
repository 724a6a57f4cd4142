//! A module directory in the kubelet's ConfigMap layout: hot swaps, failed
//! reloads, sha256 pins, modules coming and going.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_swap_through_the_kubelet_layout_changes_the_verdict() {
    let cache = TempDir::new("cache");
    let mut cm = ConfigMapDir::new(&[("check.wasm", &guest("hostile/huge-reason.wasm"))]);
    let rt = dir_runtime(cm.dir.path(), &cache).await;
    assert_eq!(rt.modules().len(), 1);
    let mut events = rt.subscribe();

    // Valid for both versions: huge-reason ignores its config, ready-role
    // needs `roles`.
    let checker = rt
        .checker("check.wasm", &json!({"roles": ["replica"]}), None)
        .await
        .unwrap();
    let server = http_server().await;
    let s = subject(LOCAL, server.port(), &[]);
    assert_verdict(&checker.check(&s).await, Decision::Include, "xxxx");

    // New content: ready-role. The pod answers role primary, the config
    // wants replicas: the same checker object now excludes.
    cm.publish(&[("check.wasm", &guest("ready-role.wasm"))]);
    let e = next_event(&mut events, "check.wasm").await;
    assert!(e.ok, "{e:?}");
    assert_eq!(e.compiled, Some(CompileSource::Compiled));
    assert_eq!(
        e.sha256.as_deref(),
        Some(sha256_of(&guest("ready-role.wasm")).as_str())
    );
    assert_verdict(
        &checker.check(&s).await,
        Decision::Exclude,
        "role primary is not one of",
    );

    // Once more, to a guest that traps: abstain.
    cm.publish(&[("check.wasm", &guest("hostile/trap.wasm"))]);
    assert!(next_event(&mut events, "check.wasm").await.ok);
    assert_verdict(&checker.check(&s).await, Decision::Abstain, "trap: ");
    assert_eq!(
        rt.modules()[0].sha256,
        sha256_of(&guest("hostile/trap.wasm"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_new_version_leaves_the_old_one_serving() {
    let cache = TempDir::new("cache");
    let mut cm = ConfigMapDir::new(&[("check.wasm", &guest("admin-check.wasm"))]);
    let rt = dir_runtime(cm.dir.path(), &cache).await;
    let mut events = rt.subscribe();
    let original = rt.modules()[0].sha256.clone();
    // `{}` suits admin-check; ready-role rejects it (no roles).
    let checker = rt.checker("check.wasm", &json!({}), None).await.unwrap();
    let s = subject(
        LOCAL,
        closed_port(),
        &[("port-mapper.example.com/admin", "yes")],
    );

    let bad_versions: [(&str, Vec<u8>, &str); 3] = [
        (
            "garbage",
            b"not wasm at all".to_vec(),
            "not a WebAssembly file",
        ),
        (
            "wrong world",
            fs::read(guest("hostile/wrong-world.wasm")).unwrap(),
            "not a portwise membership checker",
        ),
        (
            "config rejected",
            fs::read(guest("ready-role.wasm")).unwrap(),
            "rejects configuration {}",
        ),
    ];
    for (what, bytes, part) in bad_versions {
        cm.publish_bytes("check.wasm", &bytes);
        let e = next_event(&mut events, "check.wasm").await;
        assert!(!e.ok, "{what}: {e:?}");
        assert!(e.message.contains(part), "{what}: {}", e.message);
        assert!(
            e.message
                .contains(&format!("still serving sha256 {}", &original[..12])),
            "{}",
            e.message
        );
        assert_verdict(&checker.check(&s).await, Decision::Include, "marked");
        assert_eq!(rt.modules()[0].sha256, original);
        assert!(
            rt.load_errors()
                .await
                .iter()
                .any(|(m, why)| m == "check.wasm" && why.contains(part))
        );
    }
    assert_eq!(
        rt.failures()
            .iter()
            .find(|f| f.module == "check.wasm" && f.kind == FailureKind::Load)
            .unwrap()
            .count,
        3
    );

    // A good version afterwards is taken and clears the error.
    cm.publish(&[("check.wasm", &guest("hostile/huge-reason.wasm"))]);
    assert!(next_event(&mut events, "check.wasm").await.ok);
    assert_eq!(checker.check(&s).await.decision, Decision::Include);
    assert!(rt.load_errors().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sha256_pins_are_enforced_at_build_and_on_reload() {
    let cache = TempDir::new("cache");
    let mut cm = ConfigMapDir::new(&[("check.wasm", &guest("admin-check.wasm"))]);
    let rt = dir_runtime(cm.dir.path(), &cache).await;
    let mut events = rt.subscribe();
    let good = sha256_of(&guest("admin-check.wasm"));
    let wrong = "0".repeat(64);

    match rt.checker("check.wasm", &Value::Null, Some(&wrong)).await {
        Err(WasmError::PinMismatch {
            expected, actual, ..
        }) => assert_eq!((expected, actual), (wrong, good.clone())),
        other => panic!("{other:?}"),
    }
    // Case-insensitive.
    let pinned = rt
        .checker("check.wasm", &Value::Null, Some(&good.to_uppercase()))
        .await
        .unwrap();
    let s = subject(
        LOCAL,
        closed_port(),
        &[("port-mapper.example.com/admin", "yes")],
    );
    assert_verdict(&pinned.check(&s).await, Decision::Include, "marked");

    // New content that does not match a pin in use is refused.
    cm.publish(&[("check.wasm", &guest("hostile/trap.wasm"))]);
    let e = next_event(&mut events, "check.wasm").await;
    assert!(!e.ok && e.message.contains("pinned"), "{e:?}");
    assert_verdict(&pinned.check(&s).await, Decision::Include, "marked");

    // Once no checker pins it any more, the next change goes through.
    drop(pinned);
    cm.publish(&[("check.wasm", &guest("hostile/huge-reason.wasm"))]);
    assert!(next_event(&mut events, "check.wasm").await.ok);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modules_appear_and_disappear_with_the_directory() {
    let cache = TempDir::new("cache");
    let dir = TempDir::new("plain");
    let rt = dir_runtime(dir.path(), &cache).await;
    let mut events = rt.subscribe();
    assert!(rt.modules().is_empty());
    match rt.checker("admin-check.wasm", &Value::Null, None).await {
        Err(WasmError::NotLoaded { why, .. }) => {
            assert!(why.to_string().contains("no such file"), "{why}")
        }
        other => panic!("{other:?}"),
    }

    // A plain directory: copy a file in (via a temporary name, as `kubectl
    // cp` or an installer would), then remove it.
    fs::copy(guest("admin-check.wasm"), dir.path().join(".tmp-upload")).unwrap();
    fs::rename(
        dir.path().join(".tmp-upload"),
        dir.path().join("admin-check.wasm"),
    )
    .unwrap();
    assert!(next_event(&mut events, "admin-check.wasm").await.ok);
    let checker = rt.checker("admin-check", &Value::Null, None).await.unwrap();
    assert_eq!(checker.module(), "admin-check.wasm");

    fs::remove_file(dir.path().join("admin-check.wasm")).unwrap();
    let e = next_event(&mut events, "admin-check.wasm").await;
    assert!(!e.ok && e.message.contains("still serving"), "{e:?}");
    let s = subject(
        LOCAL,
        closed_port(),
        &[("port-mapper.example.com/admin", "yes")],
    );
    assert_verdict(&checker.check(&s).await, Decision::Include, "marked");
}
