//! Which tokio runtime builds checkers and runs their instances.

use super::*;

/// The provider the checker tree is built through is async: it builds on
/// whichever runtime the caller is on, a multi-threaded one (the
/// controller's) or a current-thread one (`portwise check`'s), and says
/// why a configuration is refused.
#[test]
fn the_provider_builds_checkers_on_any_runtime() {
    use portwise_checkers::WasmCheckers;
    let multi = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let h = multi.block_on(Harness::new(test_limits()));
    multi
        .block_on(h.rt.load_file(&guest("admin-check.wasm")))
        .unwrap();
    let spec = |config: Value| WasmSpec {
        module: "admin-check.wasm".into(),
        config,
        sha256: None,
        limits: WasmLimits::default(),
        allow_tags: false,
    };
    let current = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let built = current.block_on(WasmCheckers::checker(&h.rt, &spec(Value::Null)));
    assert!(built.is_ok());
    let rejected = spec(json!({"key": ""}));
    let e = multi
        .block_on(WasmCheckers::checker(&h.rt, &rejected))
        .map(drop);
    assert!(
        e.unwrap_err()
            .to_string()
            .contains("key: must not be empty")
    );
}

/// Instances are made where they run. The instance that ran
/// `validate-config` while the checker was built does not serve checks; a check makes its own instance on the
/// runtime that polls it and reuses it there; another runtime, even once
/// the first is gone, gets an instance of its own. (Today's host keeps
/// nothing bound to a runtime in an instance between calls, so reusing one
/// elsewhere does not crash: see `modules/pool.rs`. What is pinned here is
/// the rule that keeps it so.) Each check probes over HTTP through the
/// reactor of the runtime it runs on.
#[test]
fn instances_run_on_the_runtime_that_created_them() {
    let current_thread = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    // The HTTP server lives on a runtime of its own, outliving the others.
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let server = server_rt.block_on(http_server());
    let h = server_rt.block_on(Harness::new(test_limits()));
    let instances = || {
        h.rt.instantiations()
            .into_iter()
            .find(|(m, _)| m == "ready-role.wasm")
            .map_or(0, |(_, n)| n)
    };
    let s = subject(LOCAL, server.port(), &[]);
    let include = |v: Verdict| assert_verdict(&v, Decision::Include, "role primary");

    let first = current_thread();
    first
        .block_on(h.rt.load_file(&guest("ready-role.wasm")))
        .unwrap();
    let checker = first
        .block_on(h.rt.checker("ready-role.wasm", &json!({"roles": ["primary"]}), None))
        .unwrap();
    assert_eq!(instances(), 1, "validate-config's");

    include(first.block_on(checker.check(&s)));
    assert_eq!(instances(), 2, "the check made its own");
    include(first.block_on(checker.check(&s)));
    assert_eq!(instances(), 2, "and reused it");

    let second = current_thread();
    include(second.block_on(checker.check(&s)));
    assert_eq!(instances(), 3, "another runtime made its own");
    drop(first);
    include(second.block_on(checker.check(&s)));
    include(second.block_on(checker.check(&s)));
    assert_eq!(instances(), 3, "and reused it");

    // After `first` is gone, a third runtime still starts afresh.
    drop(second);
    let third = current_thread();
    include(third.block_on(checker.check(&s)));
    assert_eq!(instances(), 4);
}
