use super::*;

fn state(address: Option<&str>) -> HostState {
    let limits = Arc::new(Limits {
        max_probes_per_call: 3,
        ..Limits::default()
    });
    let call = limits.for_expression(&Default::default()).unwrap();
    let mut s = HostState::new(limits, Arc::new(ModuleCounters::default()), 64 << 20);
    s.begin_call(
        address.map(|a| a.parse().unwrap()),
        CallLabels::default(),
        &call,
    );
    s
}

#[test]
fn empty_host_or_the_same_address_is_allowed() {
    let mut s = state(Some("10.244.0.5"));
    assert_eq!(s.authorize("", 80), Ok("10.244.0.5:80".parse().unwrap()));
    assert_eq!(
        s.authorize("10.244.0.5", 81),
        Ok("10.244.0.5:81".parse().unwrap())
    );
    // The mapped form names the same address.
    assert_eq!(
        s.authorize("::ffff:10.244.0.5", 82),
        Ok("10.244.0.5:82".parse().unwrap())
    );
}

#[test]
fn a_host_network_pod_is_reachable_only_on_its_service_ports() {
    let mut s = state(Some("10.244.0.5"));
    s.call.ports = Some(BTreeSet::from([8080, 9001]));
    assert_eq!(
        s.authorize("", 8080),
        Ok("10.244.0.5:8080".parse().unwrap())
    );
    let denied = s.authorize("10.244.0.5", 10250).unwrap_err();
    assert!(
        denied.contains("hostNetwork") && denied.contains("8080, 9001") && denied.contains("10250"),
        "{denied}"
    );
    assert_eq!(
        s.authorize("10.244.0.5", 9001),
        Ok("10.244.0.5:9001".parse().unwrap())
    );
}

#[test]
fn ipv6_is_compared_as_an_address_not_a_string() {
    let mut s = state(Some("fd00:10:244::5"));
    assert_eq!(
        s.authorize("fd00:10:244:0:0:0:0:5", 80),
        Ok("[fd00:10:244::5]:80".parse().unwrap())
    );
    assert_eq!(
        s.authorize("[fd00:10:244::5]", 80),
        Ok("[fd00:10:244::5]:80".parse().unwrap())
    );
}

#[test]
fn other_addresses_names_and_port_zero_are_denied() {
    let mut s = state(Some("10.244.0.5"));
    for host in [
        "10.244.0.6",
        "169.254.169.254",
        "127.0.0.1",
        "localhost",
        "pod.ns.svc",
        "10.244.0.5:80",
    ] {
        assert!(s.authorize(host, 80).is_err(), "{host}");
        s.call.probes = 0;
    }
    assert!(s.authorize("", 0).is_err());
}

#[test]
fn probes_per_call_are_capped() {
    let mut s = state(Some("10.244.0.5"));
    for _ in 0..3 {
        assert!(s.authorize("", 80).is_ok());
    }
    assert!(
        s.authorize("", 80)
            .unwrap_err()
            .contains("more than 3 probes")
    );
    let call = s.limits.for_expression(&Default::default()).unwrap();
    s.begin_call(
        Some("10.244.0.5".parse().unwrap()),
        CallLabels::default(),
        &call,
    );
    assert!(s.authorize("", 80).is_ok());
    // An expression's own cap replaces the runtime's.
    let tighter = s
        .limits
        .for_expression(&portwise_core::config::WasmLimits {
            probes_per_call: Some(1),
            ..Default::default()
        })
        .unwrap();
    s.begin_call(
        Some("10.244.0.5".parse().unwrap()),
        CallLabels::default(),
        &tighter,
    );
    assert!(s.authorize("", 80).is_ok());
    assert!(
        s.authorize("", 80)
            .unwrap_err()
            .contains("more than 1 probes")
    );
}

#[test]
fn no_probes_during_validate_config() {
    let mut s = state(None);
    assert!(s.authorize("", 80).unwrap_err().contains("validate-config"));
}

#[test]
fn timeouts_are_capped_and_zero_means_the_cap() {
    let s = state(Some("10.244.0.5"));
    let cap = s.limits.probe_timeout_cap;
    assert_eq!(s.timeout(0), cap);
    assert_eq!(s.timeout(u32::MAX), cap);
    assert_eq!(s.timeout(10), Duration::from_millis(10));
}

#[test]
fn capture_is_bounded_and_counts_what_it_drops() {
    let c = Capture::new(4);
    c.write(b"abc");
    c.write(b"def");
    assert_eq!(c.take(), (b"abcd".to_vec(), 2));
    assert_eq!(c.take(), (Vec::new(), 0));
}

#[test]
fn limiter_refuses_growth_past_the_limit_and_remembers_it() {
    let mut l = MemoryLimiter::new(1 << 20);
    assert!(l.memory_growing(0, 1 << 20, None).unwrap());
    assert!(l.denied.is_none());
    assert!(!l.memory_growing(1 << 20, 2 << 20, None).unwrap());
    assert_eq!(l.denied, Some((1 << 20, 2 << 20)));
}
