//! Well-behaved guests: verdicts against real listeners on 127.0.0.1, and
//! many checks sharing a small pool of instances.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_role_judges_by_the_role_in_the_ready_answer() {
    let h = Harness::new(test_limits()).await;
    let server = http_server().await;
    let s = subject(LOCAL, server.port(), &[]);

    let cases: &[(Value, Decision, &str)] = &[
        (
            json!({"roles": ["primary"]}),
            Decision::Include,
            "role primary",
        ),
        (
            json!({"roles": ["replica", "primary"], "path": "/replica"}),
            Decision::Include,
            "role replica",
        ),
        (
            json!({"roles": ["primary"], "path": "/replica"}),
            Decision::Exclude,
            "role replica is not one of",
        ),
        (
            json!({"roles": ["primary"], "path": "/fail"}),
            Decision::Exclude,
            "answered 503",
        ),
        (
            json!({"roles": ["primary"], "path": "/norole"}),
            Decision::Exclude,
            "no role",
        ),
        (
            json!({"roles": ["primary"], "path": "/notjson"}),
            Decision::Exclude,
            "not the expected JSON",
        ),
        (
            json!({"roles": ["primary"], "path": "/slow", "timeoutMs": 200}),
            Decision::Abstain,
            "timed out",
        ),
    ];
    for (config, decision, reason) in cases {
        let checker = h.checker("ready-role.wasm", config.clone()).await;
        assert_verdict(&checker.check(&s).await, *decision, reason);
    }

    let checker = h
        .checker("ready-role.wasm", json!({"roles": ["primary"]}))
        .await;
    let nothing = subject(LOCAL, closed_port(), &[]);
    assert_verdict(
        &checker.check(&nothing).await,
        Decision::Exclude,
        "connection refused",
    );
    for kind in FailureKind::ALL {
        assert_eq!(h.failures("ready-role.wasm", kind), 0, "{kind}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_probe_does_not_count_against_the_compute_deadline() {
    // The probe takes 600 ms, six times the compute deadline; the guest still
    // answers (abstain from its own probe timeout), it is not interrupted.
    let h = Harness::new(Limits {
        deadline: Duration::from_millis(100),
        ..test_limits()
    })
    .await;
    let server = http_server().await;
    let checker = h
        .checker(
            "ready-role.wasm",
            json!({"roles": ["primary"], "path": "/slow", "timeoutMs": 600}),
        )
        .await;
    let started = Instant::now();
    let v = checker.check(&subject(LOCAL, server.port(), &[])).await;
    assert_verdict(&v, Decision::Abstain, "GET /slow timed out");
    assert!(started.elapsed() >= Duration::from_millis(600));
    assert_eq!(h.failures("ready-role.wasm", FailureKind::Deadline), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_timeouts_are_capped_by_the_host() {
    let h = Harness::new(Limits {
        probe_timeout_cap: Duration::from_millis(300),
        ..test_limits()
    })
    .await;
    let server = http_server().await;
    let checker = h
        .checker(
            "ready-role.wasm",
            json!({"roles": ["primary"], "path": "/slow", "timeoutMs": 60000}),
        )
        .await;
    let started = Instant::now();
    assert_verdict(
        &checker.check(&subject(LOCAL, server.port(), &[])).await,
        Decision::Abstain,
        "timed out",
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_role_rejects_a_configuration_without_roles() {
    let h = Harness::new(test_limits()).await;
    h.rt.load_file(&guest("ready-role.wasm")).await.unwrap();
    for (config, part) in [
        (json!({}), "roles"),
        (Value::Null, "invalid config"),
        (json!({"roles": []}), "at least one role"),
        (
            json!({"roles": ["a"], "path": "ready"}),
            "must start with '/'",
        ),
        (json!({"roles": ["a"], "colour": "blue"}), "unknown field"),
    ] {
        match h.rt.checker("ready-role.wasm", &config, None).await {
            Err(WasmError::ConfigRejected { module, rejection }) => {
                assert_eq!(module, "ready-role.wasm");
                let message = rejection.to_string();
                assert!(message.contains(part), "{config}: {message}");
            }
            other => panic!("{config}: expected a rejection, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_check_trusts_the_mark_then_dials() {
    let h = Harness::new(test_limits()).await;
    let checker = h
        .checker(
            "admin-check.wasm",
            json!({"key": "example.com/admin", "timeoutMs": 500}),
        )
        .await;
    let closed = closed_port();

    let marked = subject(LOCAL, closed, &[("example.com/admin", "true")]);
    assert_verdict(
        &checker.check(&marked).await,
        Decision::Include,
        "marked example.com/admin=true",
    );

    let unmarked = subject(LOCAL, closed, &[("example.com/admin", "false")]);
    assert_verdict(
        &checker.check(&unmarked).await,
        Decision::Exclude,
        "connection refused",
    );

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let open = subject(LOCAL, listener.local_addr().unwrap().port(), &[]);
    assert_verdict(
        &checker.check(&open).await,
        Decision::Include,
        "accepts connections",
    );

    // `null` means defaults; unknown keys are typos.
    h.rt.checker("admin-check.wasm", &Value::Null, None)
        .await
        .unwrap();
    match h
        .rt
        .checker("admin-check.wasm", &json!({"minReplicas": 2}), None)
        .await
    {
        Err(WasmError::ConfigRejected { rejection, .. }) => {
            assert!(
                matches!(&rejection, portwise_wasm::Rejection::Guest(m) if m.contains("unknown field")),
                "{rejection:?}"
            )
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_checks_share_a_small_pool() {
    let h = Harness::new(Limits {
        idle_instances: 2,
        ..test_limits()
    })
    .await;
    let checker = h.checker("admin-check.wasm", Value::Null).await;
    let s = Arc::new(subject(
        LOCAL,
        closed_port(),
        &[("port-mapper.example.com/admin", "yes")],
    ));
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (c, s) = (checker.clone(), s.clone());
            tokio::spawn(async move { c.check(&s).await })
        })
        .collect();
    for t in tasks {
        assert_verdict(&t.await.unwrap(), Decision::Include, "marked");
    }
    let calls =
        h.rt.calls()
            .into_iter()
            .find(|(m, _)| m == "admin-check.wasm")
            .unwrap()
            .1;
    assert_eq!(calls, 64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_wait_for_an_instance_slot_instead_of_failing() {
    // Two slots, eight calls that each hold an instance for 200 ms while
    // their probe times out: they queue, none fails to instantiate.
    let h = Harness::new(Limits {
        max_instances: 2,
        ..test_limits()
    })
    .await;
    let server = http_server().await;
    let checker = h
        .checker(
            "ready-role.wasm",
            json!({"roles": ["primary"], "path": "/slow", "timeoutMs": 200}),
        )
        .await;
    let s = Arc::new(subject(LOCAL, server.port(), &[]));
    let started = Instant::now();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (c, s) = (checker.clone(), s.clone());
            tokio::spawn(async move { c.check(&s).await })
        })
        .collect();
    for t in tasks {
        assert_verdict(&t.await.unwrap(), Decision::Abstain, "GET /slow timed out");
    }
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(800),
        "8 calls through 2 slots took only {took:?}"
    );
    for kind in FailureKind::ALL {
        assert_eq!(h.failures("ready-role.wasm", kind), 0, "{kind}");
    }
    // Another module still gets a slot afterwards (idle ones are evicted).
    still_serving(&h).await;
}
