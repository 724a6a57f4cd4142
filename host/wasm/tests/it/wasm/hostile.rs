//! Hostile guests: each contained, with the host still answering afterwards.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_infinite_loop_hits_the_deadline() {
    let h = Harness::new(Limits {
        deadline: Duration::from_millis(100),
        ..test_limits()
    })
    .await;
    let looping = h.checker("hostile/loop.wasm", Value::Null).await;
    let s = subject(LOCAL, 80, &[]);

    // While the loop spins, other checks keep being answered: the guest
    // yields to the async runtime between epoch ticks.
    let spinning = {
        let (c, s) = (looping.clone(), s.clone());
        tokio::spawn(async move { (Instant::now(), c.check(&s).await) })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    still_serving(&h).await;

    let (started, v) = spinning.await.unwrap();
    let took = started.elapsed();
    assert_verdict(&v, Decision::Abstain, "deadline");
    assert!(
        took >= Duration::from_millis(100) && took < Duration::from_secs(1),
        "{took:?}"
    );
    assert_eq!(h.failures("loop.wasm", FailureKind::Deadline), 1);

    // The interrupted instance is gone; the next call gets a fresh one (and
    // is interrupted again).
    assert_verdict(&looping.check(&s).await, Decision::Abstain, "deadline");
    assert_eq!(h.failures("loop.wasm", FailureKind::Deadline), 2);
    still_serving(&h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gigabyte_allocation_hits_the_memory_limit() {
    let h = Harness::new(Limits {
        memory_bytes: 64 << 20,
        ..test_limits()
    })
    .await;
    let hog = h.checker("hostile/alloc.wasm", Value::Null).await;
    let v = hog.check(&subject(LOCAL, 80, &[])).await;
    assert_verdict(&v, Decision::Abstain, "memory limit");
    assert_verdict(&v, Decision::Abstain, "limit 65536 KiB");
    assert_eq!(h.failures("alloc.wasm", FailureKind::Memory), 1);

    // Below the limit the same guest is fine.
    let modest =
        h.rt.checker("alloc.wasm", &json!({"bytes": 1 << 20}), None)
            .await
            .unwrap();
    assert_verdict(
        &modest.check(&subject(LOCAL, 80, &[])).await,
        Decision::Include,
        "allocated 1048576 bytes",
    );
    still_serving(&h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trap_abstains_quotes_stderr_and_the_next_call_gets_a_fresh_instance() {
    let h = Harness::new(test_limits()).await;
    let boom = h.checker("hostile/trap.wasm", Value::Null).await;
    let s = subject(LOCAL, 80, &[]);
    let v = boom.check(&s).await;
    assert_verdict(&v, Decision::Abstain, "trap");
    // The panic message reached stderr, which the host captured.
    assert_verdict(&v, Decision::Abstain, "hostile-trap: deliberate panic");
    let v = boom.check(&s).await;
    assert_verdict(
        &v,
        Decision::Abstain,
        "trap: wasm `unreachable` instruction executed",
    );
    assert_eq!(h.failures("trap.wasm", FailureKind::Trap), 2);
    still_serving(&h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_reason_is_truncated_and_the_decision_kept() {
    let h = Harness::new(test_limits()).await;
    let chatty = h.checker("hostile/huge-reason.wasm", Value::Null).await;
    let v = chatty.check(&subject(LOCAL, 80, &[])).await;
    assert_eq!(v.decision, Decision::Include);
    let reason = v.reason.unwrap();
    assert!(reason.starts_with(&"x".repeat(1024)), "{}", &reason[..64]);
    assert!(reason.len() < 1100, "{}", reason.len());
    assert!(
        reason.ends_with(&format!("({} bytes truncated)", (8 << 20) - 1024)),
        "{}",
        &reason[1000..]
    );
    still_serving(&h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_of_other_addresses_are_denied() {
    let h = Harness::new(test_limits()).await;
    h.rt.load_file(&guest("hostile/probe-other.wasm"))
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let s = subject(LOCAL, port, &[]);

    let mut denied = 0;
    for host in [
        "10.244.0.99",
        "169.254.169.254",
        "metadata.google.internal",
        "localhost",
        "::1",
        "127.0.0.2",
    ] {
        for kind in ["http", "tcp"] {
            let c =
                h.rt.checker(
                    "probe-other.wasm",
                    &json!({"host": host, "kind": kind}),
                    None,
                )
                .await
                .unwrap();
            let v = c.check(&s).await;
            assert_verdict(&v, Decision::Exclude, "denied: ");
            denied += 1;
        }
    }
    assert_eq!(
        h.failures("probe-other.wasm", FailureKind::DeniedProbe),
        denied
    );

    // Malformed paths are denied before anything is sent.
    for path in ["no-slash", "/a\r\nHost: evil", "//evil/x"] {
        let c =
            h.rt.checker("probe-other.wasm", &json!({"host": "", "path": path}), None)
                .await
                .unwrap();
        assert_verdict(&c.check(&s).await, Decision::Exclude, "denied: ");
    }

    // The address under judgement itself, spelled out, is allowed.
    let c =
        h.rt.checker(
            "probe-other.wasm",
            &json!({"host": "127.0.0.1", "kind": "tcp"}),
            None,
        )
        .await
        .unwrap();
    assert_verdict(&c.check(&s).await, Decision::Include, "reached 127.0.0.1");
    // A checker is not a proxy: no failure is recorded as a trap or load.
    assert_eq!(h.failures("probe-other.wasm", FailureKind::Trap), 0);
}

/// A `hostNetwork` pod's address is its Node's: a guest may probe there
/// only the ports the Service resolves for the pod, not the kubelet or
/// whatever else listens on the Node. The same probe of a pod with an
/// address of its own is allowed, so the rule is what denies it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_network_pod_is_probed_only_on_its_service_ports() {
    let h = Harness::new(test_limits()).await;
    h.rt.load_file(&guest("hostile/probe-other.wasm"))
        .await
        .unwrap();
    let served = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let node_port = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (served, other) = (
        served.local_addr().unwrap().port(),
        node_port.local_addr().unwrap().port(),
    );
    let mut s = subject(LOCAL, served, &[]);
    Arc::make_mut(&mut s.service)
        .spec
        .as_mut()
        .unwrap()
        .ports
        .as_mut()
        .unwrap()[0]
        .target_port = Some(IntOrString::Int(i32::from(served)));
    let probe = |port: u16| {
        let h = &h;
        async move {
            h.rt.checker(
                "probe-other.wasm",
                &json!({"host": "", "kind": "tcp", "port": port}),
                None,
            )
            .await
            .unwrap()
        }
    };
    // An address of its own: any port of it.
    assert_verdict(
        &probe(other).await.check(&s).await,
        Decision::Include,
        "reached",
    );
    Arc::make_mut(&mut s.pod)
        .spec
        .as_mut()
        .unwrap()
        .host_network = Some(true);
    let v = probe(other).await.check(&s).await;
    assert_verdict(&v, Decision::Exclude, "denied: ");
    assert!(
        v.reason
            .as_deref()
            .unwrap_or_default()
            .contains("hostNetwork"),
        "{v:?}"
    );
    assert_verdict(
        &probe(served).await.check(&s).await,
        Decision::Include,
        "reached",
    );
    drop(node_port);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_answer_abstains() {
    let h = Harness::new(test_limits()).await;
    let garbage = h.checker("hostile/garbage.wasm", Value::Null).await;
    let v = garbage.check(&subject(LOCAL, 80, &[])).await;
    assert_verdict(&v, Decision::Abstain, "invalid_answer");
    assert_eq!(h.failures("garbage.wasm", FailureKind::InvalidAnswer), 1);
    still_serving(&h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_for_another_world_is_refused() {
    let h = Harness::new(test_limits()).await;
    let e =
        h.rt.load_file(&guest("hostile/wrong-world.wasm"))
            .await
            .unwrap_err();
    let message = e.to_string();
    assert!(
        message.contains("not a portwise membership checker"),
        "{message}"
    );
    // Both versions the host serves are named, so the author knows what
    // to build against.
    assert!(
        message.contains("portwise:membership/checker@0.2.0")
            && message.contains("portwise:membership/checker@0.1.0"),
        "{message}"
    );
    match h.rt.checker("wrong-world.wasm", &Value::Null, None).await {
        Err(WasmError::NotLoaded { why, .. }) => {
            assert!(
                why.to_string()
                    .contains("not a portwise membership checker"),
                "{why}"
            )
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(h.failures("wrong-world.wasm", FailureKind::Load), 1);
    still_serving(&h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_that_are_not_components_are_refused_with_a_clear_error() {
    let h = Harness::new(test_limits()).await;
    let dir = TempDir::new("notwasm");
    for (name, bytes, part) in [
        (
            "text.wasm",
            b"#!/bin/sh\necho hi\n".to_vec(),
            "not a WebAssembly file",
        ),
        ("empty.wasm", Vec::new(), "not a WebAssembly file"),
        (
            "core.wasm",
            b"\0asm\x01\0\0\0".to_vec(),
            "core WebAssembly module, not a component",
        ),
        (
            "broken.wasm",
            b"\0asm\x0d\0\x01\0\xff\xff\xff".to_vec(),
            "not a valid component",
        ),
    ] {
        let path = dir.path().join(name);
        fs::write(&path, bytes).unwrap();
        let message = h.rt.load_file(&path).await.unwrap_err().to_string();
        assert!(message.contains(part), "{name}: {message}");
        assert!(message.starts_with(&format!("module {name}")), "{message}");
    }
    still_serving(&h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_module_logging_past_its_rate_is_dropped_and_counted_and_reasons_still_quote_stderr() {
    use portwise_wasm::log_rate::{BURST, RATE};
    let h = Harness::new(test_limits()).await;
    let boom = h.checker("hostile/trap.wasm", Value::Null).await;
    let s = subject(LOCAL, 80, &[]);
    // Each call prints a stdout line and a panic message on stderr, so
    // BURST calls write at least twice the burst.
    let started = Instant::now();
    for _ in 0..BURST {
        let v = boom.check(&s).await;
        // What reaches the reason does not depend on what reached the log.
        assert_verdict(&v, Decision::Abstain, "hostile-trap: deliberate panic");
    }
    let refilled = (started.elapsed().as_secs_f64() * f64::from(RATE)).ceil() as u64;
    let dropped: u64 =
        h.rt.log_lines_dropped()
            .into_iter()
            .filter(|(m, _)| m == "trap.wasm")
            .map(|(_, n)| n)
            .sum();
    let written_at_most = u64::from(BURST) + refilled;
    assert!(
        dropped >= 2 * u64::from(BURST) - written_at_most,
        "{dropped} lines dropped; at most {written_at_most} of the {} lines or more may reach the log",
        2 * BURST
    );
    still_serving(&h).await;
}
