use super::*;

const SEED_EXAMPLE: &str = r#"
managedBy: portwise
serviceKey: {annotation: port-mapper.example.com/group}
modulesDir: /etc/portwise/modules
membership:
  perPort:
    ports:
      http:  {all: [podReady, {httpGet: {path: /healthz, timeout: 1s}}]}
      https: {tcpDial: {timeout: 1s}}
      admin: {wasm: {module: admin-check.wasm, config: {minReplicas: 2}}}
      kafka: {httpGet: {path: /v1/broker/ready, port: kafka-admin, scheme: HTTPS, timeout: 1s}}
    fallback: {all: [podReady, {portNames: {annotation: port-mapper.example.com/ports}}]}
"#;

const FULL_HEADER: &str = r#"
managedBy: portwise             # managed-by label value and field owner
serviceKey:
  annotation: example.com/group
podKey:
  annotation: example.com/group
resyncPeriod: 30s
maxEndpointsPerSlice: 100
maxConcurrentChecks: 16
nativeCleanup: true
publishLegacyEndpoints: false
disableNodeLookups: false
modulesDir: /etc/portwise/modules
membership: podReady
"#;

pub(super) fn err(yaml: &str) -> ConfigError {
    match Config::from_yaml(yaml) {
        Ok(c) => panic!("expected an error, parsed {c:#?}"),
        Err(e) => e,
    }
}

/// Asserts the error names `path` (and the message contains `needle`).
pub(super) fn assert_err(yaml: &str, path: &str, needle: &str) {
    let e = err(yaml);
    let shown = e.to_string();
    assert_eq!(e.field_path(), Some(path), "{shown}");
    assert!(shown.starts_with(&format!("{path}: ")), "{shown}");
    assert!(shown.contains(needle), "{shown:?} lacks {needle:?}");
}

pub(super) fn with_membership(m: &str) -> String {
    format!("serviceKey: {{label: group}}\nmodulesDir: /m\nmembership: {m}\n")
}

#[test]
fn seed_example_parses() {
    let c = Config::from_yaml(SEED_EXAMPLE).unwrap();
    assert_eq!(c.managed_by, "portwise");
    assert_eq!(
        c.service_key,
        KeySource::Annotation("port-mapper.example.com/group".into())
    );
    assert_eq!(c.pod_key(), &c.service_key);
    let CheckerExpr::PerPort(pp) = &c.membership else {
        panic!("{:?}", c.membership)
    };
    assert_eq!(
        pp.ports.keys().collect::<Vec<_>>(),
        ["admin", "http", "https", "kafka"]
    );
    assert_eq!(
        pp.ports["kafka"],
        CheckerExpr::HttpGet(HttpGetSpec {
            path: "/v1/broker/ready".into(),
            port: Some(ProbePort::Name("kafka-admin".into())),
            scheme: Scheme::Https,
            ..Default::default()
        })
    );
    assert_eq!(
        pp.ports["http"],
        CheckerExpr::All(vec![
            CheckerExpr::PodReady,
            CheckerExpr::HttpGet(HttpGetSpec {
                path: "/healthz".into(),
                timeout: Duration::from_secs(1),
                ..Default::default()
            }),
        ])
    );
    assert_eq!(
        pp.ports["https"],
        CheckerExpr::TcpDial(TcpDialSpec {
            timeout: Duration::from_secs(1),
            ..Default::default()
        })
    );
    assert_eq!(
        pp.ports["admin"],
        CheckerExpr::Wasm(WasmSpec {
            module: "admin-check.wasm".into(),
            config: serde_json::json!({"minReplicas": 2}),
            sha256: None,
            limits: WasmLimits::default(),
            allow_tags: false,
        })
    );
    assert_eq!(
        pp.fallback.as_deref(),
        Some(&CheckerExpr::All(vec![
            CheckerExpr::PodReady,
            CheckerExpr::PortNames(KeySource::Annotation(
                "port-mapper.example.com/ports".into()
            )),
        ]))
    );
}

#[test]
fn full_header_parses_with_every_field() {
    let c = Config::from_yaml(FULL_HEADER).unwrap();
    assert_eq!(
        c,
        Config {
            pod_key: Some(KeySource::Annotation("example.com/group".into())),
            modules_dir: Some("/etc/portwise/modules".into()),
            ..Config::with_service_key(KeySource::Annotation("example.com/group".into()))
        }
    );
}

#[test]
fn defaults() {
    let c = Config::from_yaml("serviceKey: {label: app.example.com/group}").unwrap();
    assert_eq!(
        c,
        Config::with_service_key(KeySource::Label("app.example.com/group".into()))
    );
    assert_eq!(c.managed_by, "portwise");
    assert_eq!(c.resync_period, Duration::from_secs(30));
    assert_eq!(c.abstain_limit(), Duration::from_secs(300));
    assert_eq!(
        (c.max_endpoints_per_slice, c.max_concurrent_checks),
        (100, 16)
    );
    assert!(c.native_cleanup && !c.publish_legacy_endpoints && !c.disable_node_lookups);
    assert_eq!(c.membership, CheckerExpr::PodReady);
    assert_eq!(
        c.pod_key(),
        &KeySource::Label("app.example.com/group".into())
    );
}

#[test]
fn every_checker_row_parses() {
    let wasm = format!("{{wasm: {{module: a.wasm, sha256: {}}}}}", "aB".repeat(32));
    let cases: Vec<(&str, CheckerExpr)> = vec![
        ("podReady", CheckerExpr::PodReady),
        ("notTerminating", CheckerExpr::NotTerminating),
        ("include", CheckerExpr::Include),
        ("exclude", CheckerExpr::Exclude),
        ("abstain", CheckerExpr::Abstain),
        (
            "{portNames: {label: ports}}",
            CheckerExpr::PortNames(KeySource::Label("ports".into())),
        ),
        (
            "{tcpDial: {timeout: 500ms}}",
            CheckerExpr::TcpDial(TcpDialSpec {
                timeout: Duration::from_millis(500),
                ..Default::default()
            }),
        ),
        (
            "{tcpDial: {}}",
            CheckerExpr::TcpDial(TcpDialSpec {
                timeout: Duration::from_secs(1),
                ..Default::default()
            }),
        ),
        (
            "{httpGet: {path: '/ready?x=1', timeout: 2s}}",
            CheckerExpr::HttpGet(HttpGetSpec {
                path: "/ready?x=1".into(),
                timeout: Duration::from_secs(2),
                ..Default::default()
            }),
        ),
        ("{all: []}", CheckerExpr::All(vec![])),
        (
            "{any: [include, exclude]}",
            CheckerExpr::Any(vec![CheckerExpr::Include, CheckerExpr::Exclude]),
        ),
        (
            "{not: abstain}",
            CheckerExpr::Not(Box::new(CheckerExpr::Abstain)),
        ),
        (
            "{not: {not: podReady}}",
            CheckerExpr::Not(Box::new(CheckerExpr::Not(Box::new(CheckerExpr::PodReady)))),
        ),
        (
            "{perPort: {ports: {web: include}}}",
            CheckerExpr::PerPort(PerPortSpec {
                ports: [("web".to_owned(), CheckerExpr::Include)].into(),
                fallback: None,
            }),
        ),
        (
            "{stable: {checker: podReady, successThreshold: 2, failureThreshold: 3}}",
            CheckerExpr::Stable(StableSpec {
                checker: Box::new(CheckerExpr::PodReady),
                success_threshold: 2,
                failure_threshold: 3,
            }),
        ),
        (
            "{stable: {checker: podReady}}",
            CheckerExpr::Stable(StableSpec {
                checker: Box::new(CheckerExpr::PodReady),
                success_threshold: 1,
                failure_threshold: 3,
            }),
        ),
        (
            &wasm,
            CheckerExpr::Wasm(WasmSpec {
                module: "a.wasm".into(),
                config: serde_json::Value::Null,
                sha256: Some("aB".repeat(32)),
                limits: WasmLimits::default(),
                allow_tags: false,
            }),
        ),
    ];
    for (yaml, want) in cases {
        let c = Config::from_yaml(&with_membership(yaml)).unwrap_or_else(|e| panic!("{yaml}: {e}"));
        assert_eq!(c.membership, want, "{yaml}");
    }
}

#[test]
fn block_style_yaml_parses() {
    let yaml = r#"
serviceKey:
  label: group
membership:
  any:
    - not: podReady
    - httpGet:
        path: /healthz
        timeout: 250ms
"#;
    let c = Config::from_yaml(yaml).unwrap();
    assert_eq!(
        c.membership,
        CheckerExpr::Any(vec![
            CheckerExpr::Not(Box::new(CheckerExpr::PodReady)),
            CheckerExpr::HttpGet(HttpGetSpec {
                path: "/healthz".into(),
                timeout: Duration::from_millis(250),
                ..Default::default()
            }),
        ])
    );
}

// ---- one test per kind of bad input ----

#[test]
fn bad_duration_names_its_path() {
    let yaml = r#"
serviceKey: {annotation: g}
membership:
  perPort:
    ports:
      http: {httpGet: {path: /x, timeout: 1x}}
"#;
    assert_err(
        yaml,
        "membership.perPort.ports.http.httpGet.timeout",
        r#"invalid duration "1x""#,
    );
    assert_err(
        "serviceKey: {label: g}\nresyncPeriod: soon",
        "resyncPeriod",
        "invalid duration \"soon\"",
    );
    assert_err(
        "serviceKey: {label: g}\nresyncPeriod: 10",
        "resyncPeriod",
        "invalid duration",
    );
}

#[test]
fn bad_duration_reports_line() {
    let e = err("serviceKey: {label: g}\nresyncPeriod: soon\n");
    assert!(e.to_string().contains("(line 2"), "{e}");
}

#[test]
fn unknown_top_level_key() {
    assert_err(
        "serviceKey: {label: g}\nresyncPeriodd: 1s",
        "resyncPeriodd",
        "unknown field",
    );
}

#[test]
fn unknown_key_inside_checker() {
    assert_err(
        &with_membership("{httpGet: {path: /, timout: 1s}}"),
        "membership.httpGet.timout",
        "unknown field",
    );
    assert_err(
        &with_membership("{stable: {checker: podReady, successTreshold: 2}}"),
        "membership.stable.successTreshold",
        "unknown field",
    );
}

#[test]
fn unknown_checker_name() {
    assert_err(&with_membership("podready"), "membership", "podready");
    assert_err(
        &with_membership("{all: [podReady, {tcpdial: {}}]}"),
        "membership.all[1]",
        "tcpdial",
    );
}

#[test]
fn checker_map_with_two_keys() {
    assert_err(
        &with_membership("{not: podReady, all: []}"),
        "membership.not",
        "exactly one key",
    );
    assert_err(
        &with_membership("{tcpDial: {timeout: 1s}, httpGet: {path: /}}"),
        "membership.tcpDial",
        "exactly one key",
    );
}

#[test]
fn checker_of_wrong_shape() {
    // A list where an expression is expected.
    assert_err(
        &with_membership("[podReady]"),
        "membership",
        "a word (e.g. podReady) or a map",
    );
    // A scalar where a list is expected.
    let e = err(&with_membership("{all: podReady}"));
    assert_eq!(e.field_path(), Some("membership.all"), "{e}");
}

#[test]
fn missing_required_fields() {
    assert_err("managedBy: portwise", ".", "serviceKey");
    assert_err(
        &with_membership("{stable: {successThreshold: 2}}"),
        "membership.stable",
        "checker",
    );
    assert_err(
        &with_membership("{perPort: {fallback: include}}"),
        "membership.perPort",
        "ports",
    );
    assert_err(
        &with_membership("{wasm: {config: 1}}"),
        "membership.wasm",
        "module",
    );
}

#[test]
fn key_source_needs_exactly_one_of_label_or_annotation() {
    assert_err(
        "serviceKey: {label: a, annotation: b}",
        "serviceKey.label",
        "exactly one key",
    );
    assert_err("serviceKey: {name: a}", "serviceKey", "name");
    assert_err("serviceKey: a", "serviceKey", "");
}

#[test]
fn key_syntax_is_validated() {
    assert_err(
        "serviceKey: {label: 'bad key'}",
        "serviceKey.label",
        "not a valid key",
    );
    assert_err(
        "serviceKey: {label: g}\npodKey: {annotation: 'UPPER.example.com/x'}",
        "podKey.annotation",
        "prefix",
    );
    assert_err(
        "serviceKey: {annotation: 'example.com/'}",
        "serviceKey.annotation",
        "name part",
    );
    assert_err(
        &with_membership("{portNames: {annotation: '-x'}}"),
        "membership.portNames.annotation",
        "not a valid key",
    );
    for good in [
        "g",
        "example.com/group",
        "a.b-c/d_e.f",
        "port-mapper.example.com/ports",
    ] {
        assert_eq!(check_qualified_name(good), Ok(()), "{good}");
    }
}

#[test]
fn managed_by_must_not_be_native_and_must_be_a_label_value() {
    for native in NATIVE_MANAGERS {
        assert_err(
            &format!("managedBy: {native}\nserviceKey: {{label: g}}"),
            "managedBy",
            "native Kubernetes controller",
        );
    }
    assert_err(
        "managedBy: 'has space'\nserviceKey: {label: g}",
        "managedBy",
        "label value",
    );
    assert_err(
        &format!("managedBy: {}\nserviceKey: {{label: g}}", "a".repeat(64)),
        "managedBy",
        "63",
    );
    assert_err(
        "managedBy: ''\nserviceKey: {label: g}",
        "managedBy",
        "empty",
    );
}

#[test]
fn numeric_ranges() {
    assert_err(
        "serviceKey: {label: g}\nmaxEndpointsPerSlice: 0",
        "maxEndpointsPerSlice",
        "between 1 and 1000",
    );
    assert_err(
        "serviceKey: {label: g}\nmaxEndpointsPerSlice: 1001",
        "maxEndpointsPerSlice",
        "1001",
    );
    assert_err(
        "serviceKey: {label: g}\nmaxEndpointsPerSlice: -1",
        "maxEndpointsPerSlice",
        "",
    );
    assert_err(
        "serviceKey: {label: g}\nmaxConcurrentChecks: 0",
        "maxConcurrentChecks",
        "at least 1",
    );
    assert_err(
        "serviceKey: {label: g}\nresyncPeriod: 1ms",
        "resyncPeriod",
        "at least",
    );
    assert_err(
        "serviceKey: {label: g}\nnativeCleanup: maybe",
        "nativeCleanup",
        "",
    );
    Config::from_yaml("serviceKey: {label: g}\nmaxEndpointsPerSlice: 1000").unwrap();
    Config::from_yaml("serviceKey: {label: g}\nmaxEndpointsPerSlice: 1").unwrap();
}

#[test]
fn thresholds_at_least_one() {
    assert_err(
        &with_membership("{stable: {checker: podReady, successThreshold: 0}}"),
        "membership.stable.successThreshold",
        "at least 1",
    );
    assert_err(
        &with_membership("{any: [{stable: {checker: podReady, failureThreshold: 0}}]}"),
        "membership.any[0].stable.failureThreshold",
        "at least 1",
    );
}

#[test]
fn http_path_must_be_absolute() {
    assert_err(
        &with_membership("{httpGet: {path: healthz}}"),
        "membership.httpGet.path",
        "start with '/'",
    );
    assert_err(
        &with_membership("{httpGet: {path: '/a b'}}"),
        "membership.httpGet.path",
        "",
    );
}

#[test]
fn timeouts_positive_and_capped() {
    assert_err(
        &with_membership("{tcpDial: {timeout: 0s}}"),
        "membership.tcpDial.timeout",
        "greater than 0",
    );
    assert_err(
        &with_membership("{httpGet: {path: /, timeout: 2h}}"),
        "membership.httpGet.timeout",
        "maximum",
    );
}

#[test]
fn sha256_must_be_64_hex() {
    assert_err(
        &with_membership("{wasm: {module: a.wasm, sha256: abc}}"),
        "membership.wasm.sha256",
        "64 hexadecimal",
    );
    assert_err(
        &with_membership(&format!(
            "{{wasm: {{module: a.wasm, sha256: {}}}}}",
            "g".repeat(64)
        )),
        "membership.wasm.sha256",
        "64 hexadecimal",
    );
}

#[test]
fn wasm_module_is_a_plain_file_name() {
    for bad in ["../x.wasm", "dir/x.wasm", "/abs.wasm", "..", "..data", "''"] {
        let m = if bad == "''" {
            bad.to_owned()
        } else {
            format!("'{bad}'")
        };
        assert_err(
            &with_membership(&format!("{{wasm: {{module: {m}}}}}")),
            "membership.wasm.module",
            "",
        );
    }
}

#[test]
fn wasm_requires_modules_dir() {
    assert_err(
        "serviceKey: {label: g}\nmembership: {perPort: {ports: {admin: {wasm: {module: a.wasm}}}}}",
        "membership.perPort.ports.admin.wasm",
        "modulesDir",
    );
}

#[test]
fn per_port_names_are_port_names() {
    assert_err(
        &with_membership("{perPort: {ports: {HTTP: include}}}"),
        "membership.perPort.ports.HTTP",
        "port name",
    );
    // The empty name addresses the unnamed port.
    Config::from_yaml(&with_membership("{perPort: {ports: {'': include}}}")).unwrap();
}

#[test]
fn nested_error_inside_fallback() {
    assert_err(
        &with_membership(
            "{perPort: {ports: {}, fallback: {all: [podReady, {tcpDial: {timeout: nope}}]}}}",
        ),
        "membership.perPort.fallback.all[1].tcpDial.timeout",
        "invalid duration \"nope\"",
    );
}

#[test]
fn duplicate_keys_are_rejected() {
    assert_err(
        "serviceKey: {label: g}\nserviceKey: {label: h}",
        ".",
        "duplicate mapping key: serviceKey",
    );
    assert_err(
        &with_membership("{perPort: {ports: {http: include, http: exclude}}}"),
        "membership.perPort.ports",
        "duplicate mapping key: http",
    );
}

#[test]
fn yaml_syntax_error_is_reported() {
    let e = err("serviceKey: {label: g\n");
    assert!(e.field_path().is_some(), "{e}");
}

#[test]
fn empty_document_is_an_error() {
    let e = err("");
    assert!(e.field_path().is_some(), "{e}");
}

#[test]
fn load_names_the_file() {
    let dir = std::env::temp_dir().join(format!("portwise-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.yaml");
    std::fs::write(&good, SEED_EXAMPLE).unwrap();
    assert!(Config::load(&good).is_ok());
    let bad = dir.join("bad.yaml");
    std::fs::write(&bad, "serviceKey: {label: g}\nmaxConcurrentChecks: 0\n").unwrap();
    let e = Config::load(&bad).unwrap_err().to_string();
    assert!(
        e.starts_with(&format!("{}: maxConcurrentChecks: ", bad.display())),
        "{e}"
    );
    let missing = dir.join("missing.yaml");
    let e = Config::load(&missing).unwrap_err();
    assert!(matches!(e, ConfigError::Read { .. }), "{e}");
    assert!(e.to_string().contains("missing.yaml"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn wasm_limits_parse_and_default_to_none() {
    let c = Config::from_yaml(&with_membership(
        "{wasm: {module: a.wasm, limits: {deadline: 20ms, callTimeout: 2s, memoryMiB: 16, probesPerCall: 2}}}",
    ))
    .unwrap();
    let CheckerExpr::Wasm(spec) = &c.membership else {
        panic!("{:?}", c.membership)
    };
    assert_eq!(
        spec.limits,
        WasmLimits {
            deadline: Some(Duration::from_millis(20)),
            call_timeout: Some(Duration::from_secs(2)),
            memory_mib: Some(16),
            probes_per_call: Some(2),
        }
    );
    let c = Config::from_yaml(&with_membership("{wasm: {module: a.wasm}}")).unwrap();
    let CheckerExpr::Wasm(spec) = &c.membership else {
        panic!()
    };
    assert_eq!(spec.limits, WasmLimits::default());
}

#[test]
fn bad_wasm_limits_name_the_key() {
    for (limits, field, words) in [
        ("{deadline: 0s}", "deadline", "between 1ms and 60s"),
        ("{callTimeout: 2m}", "callTimeout", "between 1ms and 60s"),
        (
            "{deadline: 3s, callTimeout: 1s}",
            "deadline",
            "longer than callTimeout",
        ),
        ("{memoryMiB: 0}", "memoryMiB", "between 1 and 4096"),
        ("{memoryMiB: 5000}", "memoryMiB", "between 1 and 4096"),
        ("{probesPerCall: 1000}", "probesPerCall", "at most 256"),
    ] {
        let yaml = with_membership(&format!("{{wasm: {{module: a.wasm, limits: {limits}}}}}"));
        let e = Config::from_yaml(&yaml).unwrap_err();
        assert_eq!(
            e.field_path(),
            Some(format!("membership.wasm.limits.{field}").as_str()),
            "{limits}: {e}"
        );
        assert!(e.to_string().contains(words), "{limits}: {e}");
    }
    let e = Config::from_yaml(&with_membership(
        "{wasm: {module: a.wasm, limits: {memory: 16}}}",
    ))
    .unwrap_err();
    assert!(e.to_string().contains("memory"), "{e}");
}

#[test]
fn shadow_parses_and_bad_shadows_name_the_key() {
    let c = Config::from_yaml(&with_membership(
        "podReady\nshadow: {membership: notTerminating, expressions: {next: {tcpDial: {timeout: 1s}}}}",
    ))
    .unwrap();
    let shadow = c.shadow.unwrap();
    assert_eq!(shadow.membership, Some(CheckerExpr::NotTerminating));
    assert!(shadow.expressions.contains_key("next"));
    assert_eq!(shadow.annotation, DEFAULT_SHADOW_ANNOTATION);
    for (yaml, field) in [
        ("{expressions: {Next: podReady}}", "shadow.expressions.Next"),
        ("{expressions: {none: podReady}}", "shadow.expressions.none"),
        (
            "{expressions: {next: {tcpDial: {timeout: 0s}}}}",
            "shadow.expressions.next.tcpDial.timeout",
        ),
        (
            "{membership: {httpGet: {path: x}}}",
            "shadow.membership.httpGet.path",
        ),
        ("{annotation: 'not a key!'}", "shadow.annotation"),
    ] {
        let e =
            Config::from_yaml(&with_membership(&format!("podReady\nshadow: {yaml}"))).unwrap_err();
        assert_eq!(e.field_path(), Some(field), "{yaml}: {e}");
    }
}

#[test]
fn programmatic_configs_are_validated_too() {
    let mut c = Config::with_service_key(KeySource::Label("g".into()));
    c.membership = CheckerExpr::All(vec![CheckerExpr::Wasm(WasmSpec {
        module: "x.wasm".into(),
        config: serde_json::Value::Null,
        sha256: None,
        limits: WasmLimits::default(),
        allow_tags: false,
    })]);
    let e = c.validate().unwrap_err();
    assert_eq!(e.field_path(), Some("membership.all[0].wasm"));
    let e = CheckerExpr::Not(Box::new(CheckerExpr::TcpDial(TcpDialSpec {
        timeout: Duration::ZERO,
        ..Default::default()
    })))
    .validate_at("check", false)
    .unwrap_err();
    assert_eq!(e.field_path(), Some("check.not.tcpDial.timeout"));
}

#[test]
fn pod_addresses_parse_and_bad_cidrs_name_their_index() {
    let c = Config::from_yaml(
        "serviceKey: {label: g}\npodAddresses: {cidrs: [10.244.0.0/16, 'fd00:10:244::/64'], hostNetwork: true}",
    )
    .unwrap();
    assert_eq!(c.pod_addresses.cidrs.len(), 2);
    assert!(c.pod_addresses.host_network);
    assert!(c.pod_addresses.admits("10.244.3.4".parse().unwrap()));
    assert!(c.pod_addresses.admits("fd00:10:244::9".parse().unwrap()));
    assert!(!c.pod_addresses.admits("10.96.0.1".parse().unwrap()));

    let d = Config::from_yaml("serviceKey: {label: g}").unwrap();
    assert_eq!(d.pod_addresses, PodAddresses::default());
    assert!(!d.pod_addresses.host_network, "hostNetwork pods: opt in");

    assert_err(
        "serviceKey: {label: g}\npodAddresses: {cidrs: [10.244.0.0/16, 10.244.0.1/16]}",
        "podAddresses.cidrs[1]",
        "did you mean 10.244.0.0/16",
    );
    assert_err(
        "serviceKey: {label: g}\npodAddresses: {cidrs: [10.244.0.0]}",
        "podAddresses.cidrs[0]",
        "is not a CIDR",
    );
    assert_err(
        "serviceKey: {label: g}\npodAddresses: {cidr: [10.244.0.0/16]}",
        "podAddresses.cidr",
        "unknown field `cidr`",
    );
}

/// `membershipPolicies` (issue 48): its defaults, and every limit checked
/// where it is written. Fails when a key is not validated (a misspelt
/// checker would silently allow nothing, an empty repository list with
/// `wasm` would accept no module).
#[test]
fn membership_policies_defaults_and_errors_name_their_field() {
    let base = "serviceKey: {label: app.example.com/group}\n";
    let cfg = Config::from_yaml(&format!("{base}membershipPolicies: {{}}\n")).unwrap();
    let limits = cfg.membership_policies.expect("read");
    assert_eq!(limits, PolicyLimits::default());
    assert!(!limits.checkers.iter().any(|c| c == "wasm"));
    assert_eq!(limits.max_probe_timeout, Duration::from_secs(5));
    assert!(
        Config::from_yaml(base)
            .unwrap()
            .membership_policies
            .is_none()
    );
    for (yaml, at) in [
        ("{checkers: [podready]}", "membershipPolicies.checkers[0]"),
        ("{checkers: [all]}", "membershipPolicies.checkers[0]"),
        (
            "{maxProbeTimeout: 2m}",
            "membershipPolicies.maxProbeTimeout",
        ),
        (
            "{checkers: [wasm]}",
            "membershipPolicies.moduleRepositories",
        ),
        (
            "{checkers: [wasm], moduleRepositories: [oci://r.example/a]}",
            "membershipPolicies.moduleRepositories[0]",
        ),
        (
            "{moduleRepositories: ['r.example/a@sha256:00']}",
            "membershipPolicies.moduleRepositories[0]",
        ),
        ("{maxPerNamespace: 0}", "membershipPolicies.maxPerNamespace"),
        (
            "{maxModulesPerNamespace: 0}",
            "membershipPolicies.maxModulesPerNamespace",
        ),
        ("{budget: 3}", "membershipPolicies"),
    ] {
        let err = Config::from_yaml(&format!("{base}membershipPolicies: {yaml}\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains(at), "{yaml}: {err}");
    }
    let ok = Config::from_yaml(&format!(
        "{base}membershipPolicies: {{checkers: [podReady, wasm], moduleRepositories: [registry.example:5000/team-a]}}\n"
    ))
    .unwrap();
    assert_eq!(
        ok.membership_policies.unwrap().module_repositories,
        ["registry.example:5000/team-a"]
    );
}

/// `maxConcurrentChecksPerNamespace`: a share of `maxConcurrentChecks`.
#[test]
fn checks_per_namespace_are_a_share_of_the_pool() {
    let base = "serviceKey: {label: app.example.com/group}\nmaxConcurrentChecks: 8\n";
    let cfg = Config::from_yaml(&format!("{base}maxConcurrentChecksPerNamespace: 2\n")).unwrap();
    assert_eq!(cfg.max_concurrent_checks_per_namespace, Some(2));
    for bad in ["0", "9"] {
        let err = Config::from_yaml(&format!("{base}maxConcurrentChecksPerNamespace: {bad}\n"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(
                "maxConcurrentChecksPerNamespace: must be between 1 and maxConcurrentChecks (8)"
            ),
            "{bad}: {err}"
        );
    }
}
