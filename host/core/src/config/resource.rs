//! Checker expressions from a Kubernetes object. A `MembershipPolicy`'s
//! `spec.membership` and `spec.shadow` (issue 48) arrive from the apiserver
//! as JSON, not as the config file's YAML text: the same language, the
//! same checks and the same error paths, rooted at the object's field
//! (`spec.membership.perPort.ports.http.httpGet.timeout: ...`), so that a
//! team reads in its policy's status the message an operator reads at
//! start.
//!
//! The apiserver keeps such a field as it was sent (its schema cannot type
//! "a word or a one-key map"), so nothing about its shape is known here:
//! depth is checked before deserializing, as the config file's parser
//! does, so a deep value cannot overflow the stack.

use serde_json::Value;

use super::{CheckerExpr, ConfigError, parse::MAX_NESTING};

impl CheckerExpr {
    /// Parses and validates the expression `value` found at `path` of an
    /// object (`spec.membership`). `has_modules_dir` as for
    /// [`CheckerExpr::validate_at`].
    pub fn from_json(
        value: &Value,
        path: &str,
        has_modules_dir: bool,
    ) -> Result<CheckerExpr, ConfigError> {
        if let Some(at) = deeper_than(value, MAX_NESTING) {
            return Err(invalid(
                join(path, &at),
                format!("nested more than {MAX_NESTING} levels deep"),
            ));
        }
        let expr: CheckerExpr = serde_path_to_error::deserialize(value).map_err(|e| {
            let inner = super::parse::tidy_path(&e.path().to_string());
            invalid(join(path, &inner), message(e.inner()))
        })?;
        expr.validate_at(path, has_modules_dir)?;
        Ok(expr)
    }
}

fn invalid(path: String, message: String) -> ConfigError {
    ConfigError::Invalid {
        file: None,
        path,
        message,
        line: None,
        column: None,
    }
}

/// `spec.membership` and `all[0].httpGet` → `spec.membership.all[0].httpGet`.
fn join(root: &str, inner: &str) -> String {
    match inner {
        "." | "" => root.to_owned(),
        _ if inner.starts_with('[') => format!("{root}{inner}"),
        _ => format!("{root}.{inner}"),
    }
}

/// The path below `value` of the first node nested deeper than `max`
/// levels, if any. Iterative: the point is not to recurse on such a value.
fn deeper_than(value: &Value, max: usize) -> Option<String> {
    let mut stack = vec![(value, 0usize, String::new())];
    while let Some((v, depth, at)) = stack.pop() {
        if depth > max {
            return Some(at);
        }
        match v {
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    stack.push((item, depth + 1, format!("{at}[{i}]")));
                }
            }
            Value::Object(map) => {
                for (k, item) in map {
                    let at = if at.is_empty() {
                        k.clone()
                    } else {
                        format!("{at}.{k}")
                    };
                    stack.push((item, depth + 1, at));
                }
            }
            _ => {}
        }
    }
    None
}

/// serde_json's words where they are about its internals, in the config
/// file's (see `parse::saphyr_message`).
fn message(e: &serde_json::Error) -> String {
    let text = e.to_string();
    if text.contains("map with a single key") {
        return "this map must have exactly one key".to_owned();
    }
    if text.starts_with("invalid type") && text.contains("expected string or map") {
        return "expected a word (e.g. podReady) or a map with exactly one key".to_owned();
    }
    text
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::config::Config;

    fn path_of(value: Value) -> (String, String) {
        match CheckerExpr::from_json(&value, "spec.membership", true).unwrap_err() {
            ConfigError::Invalid { path, message, .. } => (path, message),
            other => panic!("{other}"),
        }
    }

    #[test]
    fn the_same_expression_in_json_and_in_the_config_file_is_the_same_checker() {
        let yaml = "managedBy: portwise\n\
                    serviceKey: {annotation: example.com/group}\n\
                    modulesDir: /m\n\
                    membership:\n  perPort:\n    ports:\n      \
                    http: {all: [podReady, {httpGet: {path: /healthz, timeout: 1s}}]}\n      \
                    https: {tcpDial: {timeout: 1s}}\n      \
                    admin: {wasm: {module: admin-check.wasm, config: {minReplicas: 2}}}\n    \
                    fallback: {all: [podReady, {portNames: {annotation: example.com/ports}}]}\n";
        let from_file = Config::from_yaml(yaml).unwrap().membership;
        let from_object = CheckerExpr::from_json(
            &json!({"perPort": {
                "ports": {
                    "http": {"all": ["podReady", {"httpGet": {"path": "/healthz", "timeout": "1s"}}]},
                    "https": {"tcpDial": {"timeout": "1s"}},
                    "admin": {"wasm": {"module": "admin-check.wasm", "config": {"minReplicas": 2}}},
                },
                "fallback": {"all": ["podReady", {"portNames": {"annotation": "example.com/ports"}}]},
            }}),
            "spec.membership",
            true,
        )
        .unwrap();
        assert_eq!(from_object, from_file);
        assert_eq!(
            CheckerExpr::from_json(&json!("notTerminating"), "spec.shadow", false).unwrap(),
            CheckerExpr::NotTerminating
        );
    }

    #[test]
    fn errors_name_the_field_of_the_object() {
        // A value the validation refuses, below a list.
        let (path, message) = path_of(json!({"all": ["podReady", {"tcpDial": {"timeout": "0s"}}]}));
        assert_eq!(path, "spec.membership.all[1].tcpDial.timeout", "{message}");
        // A key the language does not have.
        let (path, message) = path_of(json!({"httpGet": {"path": "/", "timout": "1s"}}));
        assert_eq!(path, "spec.membership.httpGet.timout", "{message}");
        assert!(message.contains("unknown field"), "{message}");
        // A misspelt word inside a list, as the config file names it.
        let (path, _) = path_of(json!({"all": ["podReady", {"tcpdial": {}}]}));
        assert_eq!(path, "spec.membership.all[1]");
        // An unknown word, and a map of two keys.
        let (path, message) = path_of(json!("podready"));
        assert_eq!(path, "spec.membership");
        assert!(message.contains("podready"), "{message}");
        let (path, message) = path_of(json!({"tcpDial": {}, "httpGet": {}}));
        assert_eq!(
            (path.as_str(), message.as_str()),
            ("spec.membership", "this map must have exactly one key")
        );
        // A list where an expression belongs.
        let (path, message) = path_of(json!(["podReady"]));
        assert_eq!(path, "spec.membership");
        assert!(
            message.contains("a word (e.g. podReady) or a map"),
            "{message}"
        );
    }

    #[test]
    fn a_value_nested_too_deep_is_refused_before_it_is_read() {
        let mut v = json!("podReady");
        // serde_json stops reading at 128 levels, so that is what a watch
        // can deliver at most.
        for _ in 0..127 {
            v = json!({ "not": v });
        }
        let (path, message) = path_of(v);
        assert!(path.starts_with("spec.membership.not.not."), "{path}");
        assert!(message.contains("nested more than"), "{message}");
        // Within the limit it parses.
        let mut v = json!("podReady");
        for _ in 0..MAX_NESTING - 1 {
            v = json!({ "not": v });
        }
        CheckerExpr::from_json(&v, "spec.membership", false).unwrap();
    }
}
