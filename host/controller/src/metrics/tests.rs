//! Tests of the metrics: names, series and their lifetimes, escaping.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use portwise_core::membership::Decision;

use super::*;

/// The value of the sample line `name{labels} value` (labels exactly as
/// encoded, in declaration order), or None when the series is absent.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?;
        rest.strip_prefix(' ')?.parse().ok()
    })
}

/// `(port, family, endpoints)` rows as `Metrics::set_service` takes them.
fn figures(pairs: &[(&str, &str, usize)]) -> BTreeMap<(String, String), usize> {
    pairs
        .iter()
        .map(|(p, f, n)| ((p.to_string(), f.to_string()), *n))
        .collect()
}

#[test]
fn every_family_is_declared_with_its_final_name() {
    let text = Metrics::new().encode();
    for (name, kind) in [
        ("portwise_endpoints_published", "gauge"),
        ("portwise_slices_managed", "gauge"),
        ("portwise_service_series_omitted", "gauge"),
        ("portwise_checks", "counter"),
        ("portwise_check_duration_seconds", "histogram"),
        ("portwise_native_cleanup_deletions", "counter"),
        ("portwise_name_collisions", "counter"),
        ("portwise_guest_failures", "counter"),
        ("portwise_module_loads", "counter"),
        ("portwise_reconcile_errors", "counter"),
        ("portwise_reconcile_duration_seconds", "histogram"),
        ("portwise_reconcile_phase_duration_seconds", "histogram"),
        ("portwise_cold_start_seconds", "gauge"),
        ("portwise_writes", "counter"),
        ("portwise_leader", "gauge"),
        ("portwise_config_last_reload_successful", "gauge"),
        (
            "portwise_config_last_reload_success_timestamp_seconds",
            "gauge",
        ),
        ("portwise_endpoints_added_per_sync", "histogram"),
        ("portwise_endpoints_removed_per_sync", "histogram"),
        ("portwise_endpoints_desired", "gauge"),
        ("portwise_num_endpoint_slices", "gauge"),
        ("portwise_desired_endpoint_slices", "gauge"),
        ("portwise_changes", "counter"),
        ("portwise_syncs", "counter"),
        ("portwise_build_info", "gauge"),
    ] {
        assert!(
            text.contains(&format!("# TYPE {name} {kind}\n")),
            "{name} {kind} missing in\n{text}"
        );
    }
    assert!(text.ends_with("# EOF\n"));
    // Unlabelled series exist from the start, so a scrape can tell 0 from absent.
    assert_eq!(sample(&text, "portwise_name_collisions_total"), Some(0.0));
    assert_eq!(sample(&text, "portwise_leader"), Some(0.0));
    for series in [
        r#"portwise_changes_total{operation="create"}"#,
        r#"portwise_changes_total{operation="update"}"#,
        r#"portwise_changes_total{operation="delete"}"#,
        r#"portwise_syncs_total{result="success"}"#,
        r#"portwise_syncs_total{result="error"}"#,
        "portwise_endpoints_desired",
        "portwise_endpoints_added_per_sync_count",
        r#"portwise_reconcile_phase_duration_seconds_count{phase="queue"}"#,
        r#"portwise_reconcile_phase_duration_seconds_count{phase="write"}"#,
    ] {
        assert_eq!(sample(&text, series), Some(0.0), "{series} in\n{text}");
    }
    assert_eq!(
        sample(
            &text,
            &format!(
                r#"portwise_build_info{{version="{}",revision="unknown",build_date="unknown"}}"#,
                env!("CARGO_PKG_VERSION")
            )
        ),
        Some(1.0)
    );
    // The binary names its commit (host/portwise/src/build.rs tests it).
    let built = Metrics::with_build(BuildInfo {
        version: "9.8.7",
        revision: "0123456789abcdef0123456789abcdef01234567",
        build_date: "2026-12-06T01:02:03+00:00",
    })
    .encode();
    assert_eq!(
        sample(
            &built,
            r#"portwise_build_info{version="9.8.7",revision="0123456789abcdef0123456789abcdef01234567",build_date="2026-12-06T01:02:03+00:00"}"#
        ),
        Some(1.0),
        "{built}"
    );
    assert_eq!(
        sample(&text, "portwise_reconcile_duration_seconds_count"),
        Some(0.0)
    );
}

#[test]
fn published_endpoints_and_slices_are_gauges_per_service_port_family() {
    let m = Metrics::new();
    m.services.set(
        "shop",
        "web",
        &figures(&[("http", "IPv4", 3), ("http", "IPv6", 2)]),
        1,
        1,
    );
    m.services.set(
        "shop",
        "web",
        &figures(&[("http", "IPv4", 4), ("http", "IPv6", 2)]),
        2,
        2,
    );
    let text = m.encode();
    assert_eq!(
        sample(
            &text,
            r#"portwise_endpoints_published{namespace="shop",service="web",port="http",family="IPv4"}"#
        ),
        Some(4.0)
    );
    assert_eq!(
        sample(
            &text,
            r#"portwise_endpoints_published{namespace="shop",service="web",port="http",family="IPv6"}"#
        ),
        Some(2.0)
    );
    assert_eq!(
        sample(
            &text,
            r#"portwise_slices_managed{namespace="shop",service="web"}"#
        ),
        Some(2.0)
    );
}

#[test]
fn set_service_replaces_ports_and_forget_service_drops_everything() {
    let m = Metrics::new();
    m.services.set(
        "shop",
        "web",
        &figures(&[("http", "IPv4", 3), ("admin", "IPv4", 1)]),
        2,
        2,
    );
    m.services
        .set("shop", "api", &figures(&[("grpc", "IPv6", 5)]), 1, 1);
    m.services
        .set("shop", "web", &figures(&[("http", "IPv4", 2)]), 1, 1);
    let text = m.encode();
    let web_http =
        r#"portwise_endpoints_published{namespace="shop",service="web",port="http",family="IPv4"}"#;
    let web_admin = r#"portwise_endpoints_published{namespace="shop",service="web",port="admin",family="IPv4"}"#;
    let api_grpc =
        r#"portwise_endpoints_published{namespace="shop",service="api",port="grpc",family="IPv6"}"#;
    assert_eq!(sample(&text, web_http), Some(2.0));
    assert_eq!(
        sample(&text, web_admin),
        None,
        "removed port lingers:\n{text}"
    );
    assert_eq!(
        sample(
            &text,
            r#"portwise_slices_managed{namespace="shop",service="web"}"#
        ),
        Some(1.0)
    );

    m.forget_service("shop", "web");
    let text = m.encode();
    assert_eq!(sample(&text, web_http), None);
    assert_eq!(
        sample(
            &text,
            r#"portwise_slices_managed{namespace="shop",service="web"}"#
        ),
        None
    );
    assert_eq!(
        sample(&text, api_grpc),
        Some(5.0),
        "another Service was dropped"
    );
    assert_eq!(
        sample(
            &text,
            r#"portwise_slices_managed{namespace="shop",service="api"}"#
        ),
        Some(1.0)
    );

    // Forgetting twice, or an unknown Service, is harmless.
    m.forget_service("shop", "web");
    m.forget_service("nowhere", "nothing");
    // And a forgotten Service comes back cleanly.
    m.services
        .set("shop", "web", &figures(&[("http", "IPv4", 1)]), 1, 1);
    assert_eq!(sample(&m.encode(), web_http), Some(1.0));
}

#[test]
fn checks_are_counted_by_policy_and_decision_with_latency() {
    let m = Metrics::new();
    m.checks
        .observe("membership", Decision::Include, Duration::from_millis(2));
    m.checks
        .observe("membership", Decision::Include, Duration::from_millis(3));
    m.checks
        .observe("membership", Decision::Abstain, Duration::from_secs(2));
    m.checks.observe(
        "policies.strict",
        Decision::Exclude,
        Duration::from_millis(1),
    );
    let text = m.encode();
    assert_eq!(
        sample(
            &text,
            r#"portwise_checks_total{decision="include",policy="membership"}"#
        ),
        Some(2.0)
    );
    assert_eq!(
        sample(
            &text,
            r#"portwise_checks_total{decision="abstain",policy="membership"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &text,
            r#"portwise_checks_total{decision="exclude",policy="membership"}"#
        ),
        None
    );
    assert_eq!(
        sample(
            &text,
            r#"portwise_checks_total{decision="exclude",policy="policies.strict"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &text,
            r#"portwise_check_duration_seconds_count{decision="include",policy="membership"}"#
        ),
        Some(2.0)
    );
    let sum = sample(
        &text,
        r#"portwise_check_duration_seconds_sum{decision="include",policy="membership"}"#,
    )
    .unwrap();
    assert!((sum - 0.005).abs() < 1e-9, "sum {sum}");
    // 2 s lands above the 1.024 s bucket and within the 2.048 s one.
    assert_eq!(
        sample(
            &text,
            r#"portwise_check_duration_seconds_bucket{le="1.024",decision="abstain",policy="membership"}"#
        ),
        Some(0.0)
    );
    assert_eq!(
        sample(
            &text,
            r#"portwise_check_duration_seconds_bucket{le="2.048",decision="abstain",policy="membership"}"#
        ),
        Some(1.0)
    );
}

#[test]
fn event_counters_carry_their_labels() {
    let m = Metrics::new();
    m.writes.count_native_cleanup(CleanupKind::Endpoints);
    m.writes.count_native_cleanup(CleanupKind::EndpointSlice);
    m.writes.count_native_cleanup(CleanupKind::EndpointSlice);
    m.writes.count_name_collision();
    m.guests.read_failures(|| {
        vec![
            ("admin-check.wasm".into(), GuestFailure::Deadline, 1),
            ("admin-check.wasm".into(), GuestFailure::Denied, 1),
        ]
    });
    m.guests.count_load("admin-check.wasm", ModuleLoad::Cached);
    m.guests
        .read_log_drops(|| vec![("chatty.wasm".into(), 7), ("quiet.wasm".into(), 0)]);
    m.reconciles.count_error("apply");
    m.writes.count(WriteKind::Apply);
    m.writes.count(WriteKind::Apply);
    m.writes.count(WriteKind::Delete);
    m.reconciles.observe(Duration::from_millis(20));
    m.reconciles
        .observe_phase(ReconcilePhase::Write, Duration::from_millis(250));
    m.reconciles
        .observe_phase(ReconcilePhase::Write, Duration::from_millis(500));
    m.process.set_leader(true);
    let text = m.encode();
    for (series, value) in [
        (
            r#"portwise_guest_log_lines_dropped_total{module="chatty.wasm"}"#,
            7.0,
        ),
        (
            r#"portwise_guest_log_lines_dropped_total{module="quiet.wasm"}"#,
            0.0,
        ),
        (
            r#"portwise_native_cleanup_deletions_total{kind="endpoints"}"#,
            1.0,
        ),
        (
            r#"portwise_native_cleanup_deletions_total{kind="endpointslice"}"#,
            2.0,
        ),
        ("portwise_name_collisions_total", 1.0),
        (
            r#"portwise_guest_failures_total{module="admin-check.wasm",kind="deadline"}"#,
            1.0,
        ),
        (
            r#"portwise_guest_failures_total{module="admin-check.wasm",kind="denied"}"#,
            1.0,
        ),
        (
            r#"portwise_module_loads_total{module="admin-check.wasm",result="cached"}"#,
            1.0,
        ),
        (r#"portwise_reconcile_errors_total{kind="apply"}"#, 1.0),
        (r#"portwise_writes_total{kind="apply"}"#, 2.0),
        (r#"portwise_writes_total{kind="delete"}"#, 1.0),
        ("portwise_reconcile_duration_seconds_count", 1.0),
        (
            r#"portwise_reconcile_phase_duration_seconds_count{phase="write"}"#,
            2.0,
        ),
        (
            r#"portwise_reconcile_phase_duration_seconds_sum{phase="write"}"#,
            0.75,
        ),
        (
            r#"portwise_reconcile_phase_duration_seconds_count{phase="plan"}"#,
            0.0,
        ),
        ("portwise_leader", 1.0),
    ] {
        assert_eq!(sample(&text, series), Some(value), "{series} in\n{text}");
    }
}

#[test]
fn cold_start_stages_appear_once_reached() {
    let m = Metrics::new();
    // Absent, not 0, until reached: 0 s would be a start that took no time.
    assert!(!m.encode().contains("portwise_cold_start_seconds{"));
    m.process
        .set_cold_start(ColdStartStage::Synced, Duration::from_millis(1250));
    let text = m.encode();
    assert_eq!(
        sample(&text, r#"portwise_cold_start_seconds{stage="synced"}"#),
        Some(1.25),
        "{text}"
    );
    assert!(!text.contains(r#"stage="reconciled""#), "{text}");
    m.process
        .set_cold_start(ColdStartStage::Reconciled, Duration::from_secs(4));
    assert_eq!(
        sample(
            &m.encode(),
            r#"portwise_cold_start_seconds{stage="reconciled"}"#
        ),
        Some(4.0)
    );
}

#[test]
fn guest_failures_are_read_at_scrape_time_and_summed_per_label() {
    let m = Metrics::new();
    let counted = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let source = counted.clone();
    m.guests.read_failures(move || {
        let n = source.load(std::sync::atomic::Ordering::Relaxed);
        // Two runtime kinds that share the `load` label.
        vec![
            ("a\"b.wasm".into(), GuestFailure::Load, n),
            ("a\"b.wasm".into(), GuestFailure::Load, 1),
        ]
    });
    let series = r#"portwise_guest_failures_total{module="a\"b.wasm",kind="load"}"#;
    assert_eq!(sample(&m.encode(), series), Some(1.0));
    counted.store(2, std::sync::atomic::Ordering::Relaxed);
    let text = m.encode();
    assert_eq!(sample(&text, series), Some(3.0), "{text}");
    assert!(
        text.contains(
            "# HELP portwise_guest_failures WebAssembly guest answers replaced by abstain, \
             by module and kind (load|trap|deadline|memory|invalid|denied).\n"
        ),
        "{text}"
    );
}

/// The caches' sizes are read from the stores when scraped, not sampled
/// by a task (issue 43): a store that grows shows at the next scrape.
#[test]
fn cache_sizes_are_read_at_scrape_time() {
    let m = Metrics::new();
    assert!(m.encode().contains("# TYPE portwise_cache_objects gauge\n"));
    assert_eq!(
        sample(&m.encode(), r#"portwise_cache_objects{kind="pods"}"#),
        None
    );
    let pods = Arc::new(std::sync::atomic::AtomicUsize::new(3));
    let source = pods.clone();
    m.caches.read_from(move || {
        vec![
            ("services", 1),
            ("pods", source.load(std::sync::atomic::Ordering::Relaxed)),
        ]
    });
    let series = r#"portwise_cache_objects{kind="pods"}"#;
    assert_eq!(sample(&m.encode(), series), Some(3.0));
    pods.store(30, std::sync::atomic::Ordering::Relaxed);
    let text = m.encode();
    assert_eq!(sample(&text, series), Some(30.0), "{text}");
    assert_eq!(
        sample(&text, r#"portwise_cache_objects{kind="services"}"#),
        Some(1.0)
    );
    assert!(text.contains("# HELP portwise_cache_objects Objects held in the informer caches"));
}

#[test]
fn label_values_are_escaped() {
    let m = Metrics::new();
    m.reconciles.count_error("a\"b\\c\nd");
    let text = m.encode();
    assert!(
        text.contains(r#"portwise_reconcile_errors_total{kind="a\"b\\c\nd"} 1"#),
        "{text}"
    );
}

/// The native controller's figures: totals over the Services served,
/// replaced per Service and dropped with it; per-sync histograms; writes
/// and syncs by outcome.
/// One tenant's many Services (or ports) do not grow the scrape without
/// bound: past the per-namespace limit a Service's series are left out and
/// counted, other namespaces keep theirs, and the native totals still count
/// every Service.
#[test]
fn per_service_series_are_bounded_per_namespace_and_the_rest_counted() {
    let m = Metrics::new();
    m.services.limit(2);
    let many_ports: Vec<(String, String, usize)> = (0..MAX_PORT_SERIES + 10)
        .map(|i| (format!("p{i:03}"), "IPv4".to_string(), 1))
        .collect();
    let many_ports: BTreeMap<(String, String), usize> = many_ports
        .into_iter()
        .map(|(p, f, n)| ((p, f), n))
        .collect();
    for svc in ["a", "b", "c", "d"] {
        m.services
            .set("noisy", svc, &figures(&[("http", "IPv4", 1)]), 1, 1);
    }
    m.services.set("quiet", "web", &many_ports, 1, 1);
    let text = m.encode();
    let series = |ns: &str, svc: &str| {
        sample(
            &text,
            &format!("portwise_slices_managed{{namespace=\"{ns}\",service=\"{svc}\"}}"),
        )
    };
    assert_eq!(series("noisy", "a"), Some(1.0));
    assert_eq!(series("noisy", "b"), Some(1.0));
    assert_eq!(series("noisy", "c"), None, "past the limit: left out");
    assert_eq!(series("noisy", "d"), None);
    assert_eq!(
        series("quiet", "web"),
        Some(1.0),
        "another namespace keeps its own"
    );
    assert_eq!(
        sample(
            &text,
            "portwise_service_series_omitted{namespace=\"noisy\"}"
        ),
        Some(2.0)
    );
    assert_eq!(
        sample(
            &text,
            "portwise_service_series_omitted{namespace=\"quiet\"}"
        ),
        None
    );
    let ports = text
        .lines()
        .filter(|l| l.starts_with("portwise_endpoints_published{namespace=\"quiet\""))
        .count();
    assert_eq!(ports, MAX_PORT_SERIES);
    // Every Service still counts in the native totals.
    assert_eq!(
        sample(&text, "portwise_endpoints_desired"),
        Some((4 + MAX_PORT_SERIES + 10) as f64)
    );
    // A Service forgotten makes room for the next.
    m.forget_service("noisy", "a");
    let text = m.encode();
    assert!(text.contains("portwise_slices_managed{namespace=\"noisy\",service=\"c\"}"));
    assert_eq!(
        sample(
            &text,
            "portwise_service_series_omitted{namespace=\"noisy\"}"
        ),
        Some(1.0)
    );
}

#[test]
fn native_figures_total_over_services_and_count_by_outcome() {
    let m = Metrics::new();
    m.services.set(
        "shop",
        "web",
        &figures(&[("http", "IPv4", 150), ("admin", "IPv4", 0)]),
        3,
        3,
    );
    m.services
        .set("shop", "api", &figures(&[("grpc", "IPv6", 5)]), 1, 1);
    let totals = |m: &Metrics| {
        let text = m.encode();
        (
            sample(&text, "portwise_endpoints_desired"),
            sample(&text, "portwise_num_endpoint_slices"),
            sample(&text, "portwise_desired_endpoint_slices"),
        )
    };
    assert_eq!(totals(&m), (Some(155.0), Some(4.0), Some(4.0)));
    // A Service's figures are replaced, not added again.
    m.services
        .set("shop", "web", &figures(&[("http", "IPv4", 90)]), 2, 1);
    assert_eq!(totals(&m), (Some(95.0), Some(3.0), Some(2.0)));
    m.forget_service("shop", "web");
    assert_eq!(totals(&m), (Some(5.0), Some(1.0), Some(1.0)));

    m.native.observe_sync_plan(3, 0);
    m.native.observe_sync_plan(0, 40);
    m.native.count_slice_change(SliceChange::Create);
    m.native.count_slice_change(SliceChange::Update);
    m.native.count_slice_change(SliceChange::Update);
    m.native.count_sync(SyncResult::Success);
    m.native.count_sync(SyncResult::Error);
    let text = m.encode();
    assert_eq!(
        sample(&text, "portwise_endpoints_added_per_sync_sum"),
        Some(3.0)
    );
    assert_eq!(
        sample(&text, "portwise_endpoints_added_per_sync_count"),
        Some(2.0)
    );
    assert_eq!(
        sample(&text, "portwise_endpoints_removed_per_sync_sum"),
        Some(40.0)
    );
    // Upstream's buckets: 40 is above 32, within 64.
    assert_eq!(
        sample(
            &text,
            r#"portwise_endpoints_removed_per_sync_bucket{le="32.0"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(&text, r#"portwise_changes_total{operation="update"}"#),
        Some(2.0)
    );
    assert_eq!(
        sample(&text, r#"portwise_changes_total{operation="delete"}"#),
        Some(0.0)
    );
    assert_eq!(
        sample(&text, r#"portwise_syncs_total{result="error"}"#),
        Some(1.0)
    );
}

#[test]
fn a_services_last_sync_is_a_timestamp_dropped_with_it() {
    let m = Metrics::new();
    let at = std::time::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    m.services.set_synced("shop", "web", at);
    let series = r#"portwise_service_synced_timestamp_seconds{namespace="shop",service="web"}"#;
    assert_eq!(sample(&m.encode(), series), Some(1_800_000_000.0));
    m.forget_service("shop", "web");
    assert_eq!(sample(&m.encode(), series), None);
}

/// The docs' metric tables (docs/operations.md#metrics) against the
/// registry: every family the code registers is documented under its
/// exposed name with its type and label names, and nothing documented is
/// missing from the code.
#[test]
fn the_docs_metrics_tables_are_the_registry_s() {
    let docs = include_str!("../../../../docs/operations.md");
    let section = docs
        .split("\n## Metrics\n")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("docs/operations.md has a Metrics section");
    // name -> (type, label names), from the docs' rows.
    let mut documented = BTreeMap::new();
    for line in section.lines().filter(|l| l.starts_with("| `portwise_")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let name = cells[1].trim_matches('`').to_string();
        // Label cells list names, each perhaps followed by its values in
        // parentheses: "`kind` (`apply`/`delete`), `policy`".
        let mut labels = std::collections::BTreeSet::new();
        let mut depth = 0;
        let mut bare = String::new();
        for c in cells[3].chars() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ if depth == 0 => bare.push(c),
                _ => {}
            }
        }
        for l in bare.split(',').map(|l| l.trim().trim_matches('`')) {
            if !l.is_empty() && l != "none" {
                labels.insert(l.to_string());
            }
        }
        assert!(
            documented
                .insert(name.clone(), (cells[2].to_string(), labels))
                .is_none(),
            "{name} is documented twice"
        );
    }

    // Every family with a series, so its label names show.
    let m = Metrics::new();
    m.services.limit(1);
    m.services
        .set("ns", "zz-omitted", &figures(&[("http", "IPv4", 1)]), 1, 1);
    m.services
        .set("ns", "svc", &figures(&[("http", "IPv4", 1)]), 1, 1);
    m.services.set_not_judged("ns", "svc", &BTreeMap::new());
    m.services
        .set_abstain_longest("ns", "svc", Duration::from_secs(1));
    m.services
        .set_synced("ns", "svc", std::time::SystemTime::now());
    m.services.set_shadow(
        "ns",
        "svc",
        "shadow.membership",
        &BTreeMap::from([("http".to_string(), 0)]),
        1,
    );
    m.checks
        .observe("membership", Decision::Include, Duration::from_millis(1));
    m.writes.count(WriteKind::Apply);
    m.writes.count_native_cleanup(CleanupKind::Endpoints);
    m.reconciles.count_error("apply");
    m.guests
        .read_failures(|| vec![("a.wasm".into(), GuestFailure::Trap, 1)]);
    m.guests.read_log_drops(|| vec![("a.wasm".into(), 1)]);
    m.guests.count_load("a.wasm", ModuleLoad::Compiled);
    m.caches.read_from(|| vec![("pods", 1)]);
    m.process
        .set_cold_start(ColdStartStage::Synced, Duration::from_secs(1));
    m.process
        .set_buckets_held(2, &std::collections::BTreeSet::from([1]));
    let text = m.encode();

    let mut registered = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (family, kind) = rest.split_once(' ').expect("# TYPE name type");
        // The name users query: counters' samples carry `_total`.
        let exposed = match kind {
            "counter" => format!("{family}_total"),
            _ => family.to_string(),
        };
        let sample = match kind {
            "histogram" => format!("{family}_count"),
            _ => exposed.clone(),
        };
        let labels: std::collections::BTreeSet<String> = text
            .lines()
            .filter_map(|l| l.strip_prefix(&sample))
            .filter_map(|l| l.strip_prefix('{'))
            .flat_map(|l| {
                let set = &l[..l.find('}').unwrap_or(0)];
                set.split(',')
                    .filter_map(|kv| kv.split_once('=').map(|(k, _)| k.to_string()))
                    .collect::<Vec<_>>()
            })
            .collect();
        registered.insert(exposed, (kind.to_string(), labels));
    }
    let only_in = |a: &BTreeMap<String, _>, b: &BTreeMap<String, _>| -> Vec<String> {
        a.keys().filter(|k| !b.contains_key(*k)).cloned().collect()
    };
    assert_eq!(
        (
            only_in(&registered, &documented),
            only_in(&documented, &registered)
        ),
        (vec![], vec![]),
        "(registered but not in docs/operations.md#metrics, documented but not registered)"
    );
    for (name, (kind, labels)) in &registered {
        assert_eq!(
            (kind, labels),
            (&documented[name].0, &documented[name].1),
            "{name}: the docs' type and labels are not the registry's"
        );
    }
}
