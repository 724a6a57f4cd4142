//! An expression's own `limits`, in place of the runtime's.

use super::*;

/// A checker for `module` (already loaded) with an expression's own limits.
async fn limited(h: &Harness, module: &str, config: Value, limits: WasmLimits) -> Arc<dyn Checker> {
    Arc::new(
        h.rt.checker_with_limits(module, &config, None, &limits)
            .await
            .unwrap_or_else(|e| panic!("{module}: {e}")),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tighter_memory_limit_contains_its_expression_only() {
    // One module, two expressions: 24 MiB fits the runtime's default of
    // 64 MiB but not the first expression's 16 MiB.
    let h = Harness::new(Limits {
        memory_bytes: 64 << 20,
        ..test_limits()
    })
    .await;
    h.checker("hostile/alloc.wasm", Value::Null).await;
    let config = json!({"bytes": 24 << 20});
    // Through the same door the configuration's checker tree uses.
    let tight = portwise_checkers::WasmCheckers::checker(
        &h.rt,
        &WasmSpec {
            module: "alloc.wasm".into(),
            config: config.clone(),
            sha256: None,
            limits: WasmLimits {
                memory_mib: Some(16),
                ..Default::default()
            },
            allow_tags: false,
        },
    )
    .await
    .unwrap();
    let default = limited(&h, "alloc.wasm", config, WasmLimits::default()).await;
    let s = subject(LOCAL, 80, &[]);
    for round in 0..3 {
        // Interleaved, so that a pooled instance of one limit would be
        // handed to the other expression if instances were not kept apart.
        let v = tight.check(&s).await;
        assert_verdict(&v, Decision::Abstain, "memory limit");
        assert_verdict(&v, Decision::Abstain, "limit 16384 KiB");
        assert_verdict(
            &default.check(&s).await,
            Decision::Include,
            &format!("allocated {} bytes", 24 << 20),
        );
        assert_eq!(
            h.failures("alloc.wasm", FailureKind::Memory),
            round + 1,
            "round {round}"
        );
    }
    still_serving(&h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expressions_deadline_and_call_timeout_replace_the_runtimes() {
    let h = Harness::new(test_limits()).await; // deadline 2 s, call timeout 5 s
    h.checker("hostile/loop.wasm", Value::Null).await;
    let s = subject(LOCAL, 80, &[]);
    let quick = limited(
        &h,
        "loop.wasm",
        Value::Null,
        WasmLimits {
            deadline: Some(Duration::from_millis(30)),
            ..Default::default()
        },
    )
    .await;
    assert_verdict(
        &quick.check(&s).await,
        Decision::Abstain,
        "compute deadline of 30ms",
    );
    // The wall clock bounds the call before the runtime's 2 s compute
    // deadline does.
    let walled = limited(
        &h,
        "loop.wasm",
        Value::Null,
        WasmLimits {
            call_timeout: Some(Duration::from_millis(40)),
            ..Default::default()
        },
    )
    .await;
    assert_verdict(
        &walled.check(&s).await,
        Decision::Abstain,
        "did not finish within 40ms",
    );
    assert_eq!(h.failures("loop.wasm", FailureKind::Deadline), 2);
    still_serving(&h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expressions_probe_cap_replaces_the_runtimes() {
    let server = http_server().await;
    let h = Harness::new(test_limits()).await;
    let config = json!({"roles": ["primary"]});
    let free = h.checker("ready-role.wasm", config.clone()).await;
    let capped = limited(
        &h,
        "ready-role.wasm",
        config,
        WasmLimits {
            probes_per_call: Some(0),
            ..Default::default()
        },
    )
    .await;
    let s = subject(server.ip(), server.port(), &[]);
    assert_verdict(&free.check(&s).await, Decision::Include, "role primary");
    assert_verdict(
        &capped.check(&s).await,
        Decision::Exclude,
        "more than 0 probes in one call",
    );
    assert_eq!(h.failures("ready-role.wasm", FailureKind::DeniedProbe), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_limit_above_the_runtimes_ceiling_is_refused_by_name() {
    let h = Harness::new(Limits {
        memory_bytes: 32 << 20,
        max_memory_bytes: 48 << 20,
        ..test_limits()
    })
    .await;
    h.checker("hostile/alloc.wasm", Value::Null).await;
    // Up to the ceiling is fine...
    limited(
        &h,
        "alloc.wasm",
        Value::Null,
        WasmLimits {
            memory_mib: Some(48),
            ..Default::default()
        },
    )
    .await;
    // ...past it the expression is refused, naming the key and the fix.
    let e =
        h.rt.checker_with_limits(
            "alloc.wasm",
            &Value::Null,
            None,
            &WasmLimits {
                memory_mib: Some(64),
                ..Default::default()
            },
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("limits.memoryMiB 64") && e.contains("ceiling of 48 MiB"),
        "{e}"
    );
}
