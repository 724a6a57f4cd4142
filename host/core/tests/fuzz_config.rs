//! Fuzzing the configuration parser (issue 7, item 5; docs/reliability.md):
//! `Config::from_yaml` on hostile input must never panic (nor overflow the
//! stack), and every error must say where: a field path that leads into the
//! document, and a line and column when the text is not YAML at all.
//!
//! Property-based (proptest), so it runs under `cargo test`; raise
//! `PROPTEST_CASES` for a deeper run. Three generators: arbitrary text,
//! documents built from the configuration's own vocabulary (right keys with
//! wrong, odd or deeply nested values), and valid files with random edits.

use std::collections::BTreeMap;

use portwise_core::config::{Config, ConfigError};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

fn cases(default: u32) -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default),
        ..ProptestConfig::default()
    }
}

const TOP_KEYS: &[&str] = &[
    "managedBy",
    "serviceKey",
    "podKey",
    "resyncPeriod",
    "maxEndpointsPerSlice",
    "maxConcurrentChecks",
    "nativeCleanup",
    "publishLegacyEndpoints",
    "disableNodeLookups",
    "modulesDir",
    "membership",
];

const WORDS: &[&str] = &[
    "podReady",
    "notTerminating",
    "include",
    "exclude",
    "abstain",
    "portNames",
    "tcpDial",
    "httpGet",
    "all",
    "any",
    "not",
    "perPort",
    "stable",
    "wasm",
    "ports",
    "fallback",
    "checker",
    "successThreshold",
    "failureThreshold",
    "timeout",
    "path",
    "module",
    "sha256",
    "config",
    "label",
    "annotation",
    "http",
    "admin",
];

/// The problems a parse can report, checked against the documented
/// contract (docs/configuration.md, "Loading and errors").
fn check_error(text: &str, err: &ConfigError) -> Result<(), TestCaseError> {
    let ConfigError::Invalid {
        path,
        message,
        line,
        column,
        ..
    } = err
    else {
        return Err(TestCaseError::fail(format!(
            "from_yaml returned a non-parse error: {err}"
        )));
    };
    prop_assert!(!path.is_empty(), "empty path: {err}");
    prop_assert!(!message.trim().is_empty(), "empty message: {err:?}");
    let shown = err.to_string();
    prop_assert!(
        shown.contains(path.as_str()),
        "{shown:?} does not name {path:?}"
    );
    if let Some(l) = line {
        let lines = text.split('\n').count() as u64;
        prop_assert!(*l >= 1 && *l <= lines + 1, "line {l} of {lines}: {shown}");
        prop_assert!(column.is_some(), "line without column: {shown}");
        prop_assert!(shown.contains(&format!("line {l}")), "{shown}");
    }
    // Text that is not YAML at all must point at a position.
    if serde_saphyr::from_str::<serde_json::Value>(text).is_err() && !yaml_value_ok(text) {
        prop_assert!(
            line.is_some(),
            "a syntax error without a position: {shown}\n--- text ---\n{text}"
        );
    }
    Ok(())
}

/// Some YAML parses as a document but not into a JSON value (e.g. a
/// non-string map key); such text is not a syntax error.
fn yaml_value_ok(text: &str) -> bool {
    serde_saphyr::from_str::<serde_ignored_any::Any>(text).is_ok()
}

mod serde_ignored_any {
    /// Deserializes anything and keeps nothing.
    pub struct Any;
    impl<'de> serde::Deserialize<'de> for Any {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            serde::de::IgnoredAny::deserialize(d).map(|_| Any)
        }
    }
}

/// Splits `a.b[2].c` into `["a", "b", "[2]", "c"]`.
fn segments(path: &str) -> Vec<String> {
    let mut out = Vec::new();
    for part in path.split('.') {
        let mut rest = part;
        while let Some(i) = rest.find('[') {
            if i > 0 {
                out.push(rest[..i].to_string());
            }
            let end = rest[i..].find(']').map_or(rest.len(), |e| i + e + 1);
            out.push(rest[i..end].to_string());
            rest = &rest[end..];
        }
        if !rest.is_empty() {
            out.push(rest.to_string());
        }
    }
    out
}

/// An error's path must lead into the document: every segment but the last
/// (which may name a missing or unknown field) exists.
fn check_path_in(doc: &Value, err: &ConfigError) -> Result<(), TestCaseError> {
    let Some(path) = err.field_path() else {
        return Ok(());
    };
    if path == "." {
        return Ok(());
    }
    let segs = segments(path);
    let mut here = doc;
    for (i, seg) in segs.iter().enumerate() {
        let next = match (
            seg.strip_prefix('[').and_then(|s| s.strip_suffix(']')),
            here,
        ) {
            (Some(idx), Value::Array(items)) => {
                idx.parse::<usize>().ok().and_then(|i| items.get(i))
            }
            (None, Value::Object(map)) => map.get(seg),
            // A bare word for an externally tagged enum (`podReady`).
            (None, Value::String(s)) if s == seg => Some(here),
            _ => None,
        };
        match next {
            Some(v) => here = v,
            None if i + 1 == segs.len() => return Ok(()),
            None => {
                return Err(TestCaseError::fail(format!(
                    "error path {path:?} leaves the document at {seg:?}: {err}\n{doc:#}"
                )));
            }
        }
    }
    Ok(())
}

fn parse_checked(text: &str) -> Result<Option<ConfigError>, TestCaseError> {
    match Config::from_yaml(text) {
        Ok(cfg) => {
            prop_assert!(cfg.validate().is_ok(), "accepted, then invalid: {text}");
            Ok(None)
        }
        Err(e) => {
            check_error(text, &e)?;
            Ok(Some(e))
        }
    }
}

// ---- generators -------------------------------------------------------------

fn word() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => proptest::sample::select(WORDS).prop_map(str::to_string),
        2 => proptest::sample::select(TOP_KEYS).prop_map(str::to_string),
        1 => "[a-zA-Z][a-zA-Z0-9-]{0,8}",
    ]
}

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (-1e12f64..1e12).prop_map(Value::from),
        proptest::sample::select(
            &[
                "1s",
                "0s",
                "-1s",
                "100ms",
                "99ms",
                "1m",
                "2m",
                "1x",
                "",
                "10",
                "1.5s",
                "1m30s",
                "/healthz",
                "healthz",
                "//x",
                "/a b",
                "a.wasm",
                "../x.wasm",
                "example.com/group",
                "UPPER/case",
                "a-b",
                "-bad-",
                "portwise",
                "endpointslice-controller.k8s.io",
                "~",
                "null",
                "yes",
                "0x10",
                "1e309",
                "\u{0}",
                "é",
                "🦀",
            ][..]
        )
        .prop_map(Value::from),
        "\\PC{0,24}".prop_map(Value::from),
    ]
}

fn value() -> impl Strategy<Value = Value> {
    scalar().prop_recursive(6, 48, 5, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map(word(), inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Checker expressions, mostly well-formed, with wrong leaves mixed in.
fn checker() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        proptest::sample::select(
            &[
                "podReady",
                "notTerminating",
                "include",
                "exclude",
                "abstain"
            ][..]
        )
        .prop_map(Value::from),
        scalar().prop_map(|t| json!({"tcpDial": {"timeout": t}})),
        (scalar(), scalar()).prop_map(|(p, t)| json!({"httpGet": {"path": p, "timeout": t}})),
        scalar().prop_map(|k| json!({"portNames": {"annotation": k}})),
        (scalar(), scalar(), value())
            .prop_map(|(m, s, c)| { json!({"wasm": {"module": m, "sha256": s, "config": c}}) }),
        value(),
    ];
    leaf.prop_recursive(5, 32, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(|v| json!({"all": v})),
            proptest::collection::vec(inner.clone(), 0..4).prop_map(|v| json!({"any": v})),
            inner.clone().prop_map(|e| json!({"not": e})),
            (
                proptest::collection::btree_map(word(), inner.clone(), 0..3),
                proptest::option::of(inner.clone())
            )
                .prop_map(|(ports, fallback)| {
                    let mut spec = json!({"ports": ports});
                    if let Some(f) = fallback {
                        spec["fallback"] = f;
                    }
                    json!({"perPort": spec})
                }),
            (inner, scalar(), scalar()).prop_map(|(c, s, f)| {
                json!({"stable": {"checker": c, "successThreshold": s, "failureThreshold": f}})
            }),
        ]
    })
}

/// A document shaped like a config file.
fn document() -> impl Strategy<Value = Value> {
    (
        proptest::collection::btree_map(
            proptest::sample::select(TOP_KEYS).prop_map(str::to_string),
            value(),
            0..5,
        ),
        proptest::option::of(checker()),
        proptest::sample::select(&[0u8, 1, 2][..]),
        proptest::option::of("[a-zA-Z]{1,8}"),
    )
        .prop_map(|(mut top, membership, key, unknown)| {
            match key {
                0 => {}
                1 => {
                    top.insert(
                        "serviceKey".into(),
                        json!({"annotation": "example.com/group"}),
                    );
                }
                _ => {
                    top.insert(
                        "serviceKey".into(),
                        json!({"label": "g", "annotation": "h"}),
                    );
                }
            }
            if let Some(m) = membership {
                top.insert("membership".into(), m);
            }
            if let Some(u) = unknown {
                top.insert(u, json!(1));
            }
            Value::Object(top.into_iter().collect::<Map<String, Value>>())
        })
}

/// Renders a document as block YAML (or, when the serializer refuses, as
/// JSON, which is flow YAML).
fn render(doc: &Value, block: bool) -> String {
    if block && let Ok(text) = serde_saphyr::to_string(doc) {
        return text;
    }
    serde_json::to_string(doc).expect("JSON")
}

const VALID: &[&str] = &[
    "serviceKey: {annotation: example.com/group}\n",
    "managedBy: portwise\n\
     serviceKey: {annotation: port-mapper.example.com/group}\n\
     podKey: {label: app}\n\
     resyncPeriod: 2s\n\
     maxEndpointsPerSlice: 50\n\
     membership:\n  perPort:\n    ports:\n      http: {httpGet: {path: /healthz, timeout: 1s}}\n      https: {tcpDial: {timeout: 500ms}}\n    fallback: {all: [podReady, notTerminating]}\n",
    "serviceKey:\n  label: example.com/group\nmodulesDir: /etc/portwise/modules\nmembership:\n  any:\n    - wasm: {module: admin-check.wasm, config: {roles: [primary]}}\n    - not: exclude\n    - stable: {checker: podReady, successThreshold: 2, failureThreshold: 3}\n",
];

#[derive(Clone, Debug)]
enum Edit {
    Insert(usize, char),
    Delete(usize),
    Replace(usize, char),
    Duplicate(usize, usize),
}

fn edits() -> impl Strategy<Value = Vec<Edit>> {
    let ch = prop_oneof![
        proptest::sample::select(
            &[
                ':', '-', '{', '}', '[', ']', ' ', '\n', '\t', '"', '\'', '&', '*', '!', '#', '|',
                '>', '%', '@', '`', ',', '?', '\u{feff}', '\u{0}', 'x',
            ][..]
        ),
        any::<char>(),
    ];
    proptest::collection::vec(
        prop_oneof![
            (any::<usize>(), ch.clone()).prop_map(|(i, c)| Edit::Insert(i, c)),
            any::<usize>().prop_map(Edit::Delete),
            (any::<usize>(), ch).prop_map(|(i, c)| Edit::Replace(i, c)),
            (any::<usize>(), 1usize..40).prop_map(|(i, n)| Edit::Duplicate(i, n)),
        ],
        1..6,
    )
}

fn apply(text: &str, edits: &[Edit]) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    for e in edits {
        let n = chars.len().max(1);
        match *e {
            Edit::Insert(i, c) => chars.insert(i % (chars.len() + 1), c),
            Edit::Delete(i) if !chars.is_empty() => {
                chars.remove(i % n);
            }
            Edit::Replace(i, c) if !chars.is_empty() => chars[i % n] = c,
            Edit::Duplicate(i, len) if !chars.is_empty() => {
                let start = i % n;
                let end = (start + len).min(chars.len());
                let copy: Vec<char> = chars[start..end].to_vec();
                chars.splice(end..end, copy);
            }
            _ => {}
        }
    }
    chars.into_iter().collect()
}

proptest! {
    #![proptest_config(cases(512))]

    #[test]
    fn arbitrary_text_never_panics_and_errors_say_where(text in prop_oneof![
        "\\PC{0,200}",
        any::<String>(),
        proptest::collection::vec(proptest::sample::select(&[
            "serviceKey", "membership", ":", " ", "\n", "  ", "- ", "{", "}", "[", "]", ",",
            "podReady", "all", "&a", "*a", "!!str", "---", "...", "#", "\"", "'", "|", ">",
            "annotation", "x", "1s", "?", "<<",
        ][..]), 0..60).prop_map(|v| v.concat()),
    ]) {
        parse_checked(&text)?;
    }
}

proptest! {
    #![proptest_config(cases(384))]

    #[test]
    fn config_shaped_documents_are_judged_with_paths_into_them(
        doc in document(),
        block in any::<bool>(),
    ) {
        let text = render(&doc, block);
        if let Some(err) = parse_checked(&text)? {
            check_path_in(&doc, &err)?;
        }
    }

    #[test]
    fn edited_valid_files_never_panic(
        base in proptest::sample::select(VALID),
        edits in edits(),
    ) {
        let text = apply(base, &edits);
        parse_checked(&text)?;
    }
}

/// Nesting up to `MAX_NESTING` parses; one level more is an error with a
/// path and a position, not a stack overflow (a debug build needs about
/// 32 KiB of stack per level, and test threads have 2 MiB).
#[test]
fn nesting_is_bounded() {
    let nested = |levels: usize| {
        // The root map, then one map per `not`.
        let nots = levels - 1;
        format!(
            "serviceKey: {{annotation: a/b}}\nmembership: {}podReady{}\n",
            "{not: ".repeat(nots),
            "}".repeat(nots)
        )
    };
    let max = portwise_core::config::MAX_NESTING;
    Config::from_yaml(&nested(max)).unwrap_or_else(|e| panic!("{max} levels: {e}"));
    match Config::from_yaml(&nested(max + 1)) {
        Ok(_) => panic!("{} levels accepted", max + 1),
        Err(ConfigError::Invalid { path, line, .. }) => {
            assert!(path.starts_with("membership.not"), "{path}");
            assert_eq!(line, Some(2));
        }
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn the_valid_bases_are_valid() {
    for text in VALID {
        Config::from_yaml(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    }
}

/// Inputs aimed at the parser itself: nesting far deeper than any real
/// file (a stack overflow would abort the process, not fail a test), an
/// alias bomb, a huge scalar, many documents. Each must be refused (or
/// accepted) promptly with an error that says where.
#[test]
fn parser_bombs_are_refused_with_a_position() {
    let deep_flow = format!(
        "serviceKey: {{annotation: a/b}}\nmembership: {}podReady{}\n",
        "{not: ".repeat(10_000),
        "}".repeat(10_000)
    );
    let deep_block = {
        let mut s = String::from("serviceKey: {annotation: a/b}\nmembership:\n");
        for i in 0..2_000 {
            s.push_str(&" ".repeat(2 + i));
            s.push_str("not:\n");
        }
        s.push_str(&" ".repeat(2_002));
        s.push_str("podReady\n");
        s
    };
    let deep_list = format!(
        "serviceKey: {{annotation: a/b}}\nmembership: {}podReady{}\n",
        "{all: [".repeat(5_000),
        "]}".repeat(5_000)
    );
    // Each anchor holds ten aliases of the previous one: 10^29 nodes if
    // anything expanded it naively.
    let laughs = {
        let mut s = String::from(
            "serviceKey: {annotation: a/b}\nmembership:\n  all:\n    - &a0 {all: [podReady, podReady]}\n",
        );
        for i in 1..30 {
            let prev = format!("*a{}", i - 1);
            s.push_str(&format!(
                "    - &a{i} {{all: [{}]}}\n",
                vec![prev; 10].join(", ")
            ));
        }
        s
    };
    let huge = format!(
        "serviceKey: {{annotation: a/b}}\nmanagedBy: {}\n",
        "x".repeat(20 << 20)
    );
    let documents = "---\nserviceKey: {annotation: a/b}\n".repeat(5_000);
    let mut outcomes = BTreeMap::new();
    for (name, text) in [
        ("deep flow nesting", deep_flow),
        ("deep block nesting", deep_block),
        ("deep list nesting", deep_list),
        ("alias bomb", laughs),
        ("20 MiB scalar", huge),
        ("5000 documents", documents),
    ] {
        let started = std::time::Instant::now();
        let result = Config::from_yaml(&text);
        let took = started.elapsed();
        assert!(
            took < std::time::Duration::from_secs(10),
            "{name}: took {took:?}"
        );
        match &result {
            Ok(_) => panic!("{name}: accepted"),
            Err(e) => {
                assert!(e.field_path().is_some(), "{name}: {e}");
                let shown: String = e.to_string().chars().take(200).collect();
                outcomes.insert(name, format!("{shown} ({took:?})"));
            }
        }
    }
    for (name, outcome) in outcomes {
        println!("{name}: {outcome}");
    }
}
