//! String rules with no field path attached: Kubernetes names (label
//! values, qualified keys, DNS-1123 labels and subdomains), `modulesDir`
//! file names, and HTTP request paths.
//!
//! Each returns `Err(message)`; `validate` puts the path in front. Apart
//! from validation because other crates use the same rules (the probe
//! checks request paths with [`validate_path`]), and they depend on nothing
//! else in the module.

// ---- Kubernetes name syntax (apimachinery's validation, restated) ----

fn is_alnum(b: u8) -> bool {
    b.is_ascii_alphanumeric()
}

/// `(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?`, at most 63 characters.
pub fn check_label_value(v: &str) -> Result<(), String> {
    if v.len() > 63 {
        return Err(format!("{v:?} is longer than 63 characters"));
    }
    if v.is_empty() {
        return Ok(());
    }
    let b = v.as_bytes();
    let inner_ok = b
        .iter()
        .all(|&c| is_alnum(c) || matches!(c, b'-' | b'_' | b'.'));
    if !inner_ok || !is_alnum(b[0]) || !is_alnum(b[b.len() - 1]) {
        return Err(format!(
            "{v:?} is not a valid label value: alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric"
        ));
    }
    Ok(())
}

/// A label or annotation key: `[prefix/]name`, prefix a DNS-1123 subdomain,
/// name as a non-empty label value.
pub fn check_qualified_name(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if name.is_empty() {
        return Err(format!(
            "{key:?} is not a valid key: the name part must not be empty"
        ));
    }
    check_label_value(name).map_err(|m| format!("{key:?} is not a valid key: {m}"))?;
    if let Some(p) = prefix {
        check_dns_subdomain(p).map_err(|m| format!("{key:?} is not a valid key: prefix {m}"))?;
    }
    Ok(())
}

/// RFC 1123 subdomain: dot-separated labels, lowercase, at most 253 chars.
pub fn check_dns_subdomain(v: &str) -> Result<(), String> {
    if v.is_empty() || v.len() > 253 {
        return Err(format!("{v:?} must be 1 to 253 characters"));
    }
    for part in v.split('.') {
        check_dns_label(part)
            .map_err(|_| format!("{v:?} is not a lowercase RFC 1123 subdomain"))?;
    }
    Ok(())
}

/// RFC 1123 label: `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 chars.
pub fn check_dns_label(v: &str) -> Result<(), String> {
    let b = v.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-';
    if ok {
        Ok(())
    } else {
        Err(format!("{v:?} is not a lowercase RFC 1123 label"))
    }
}

/// A module is named by a plain file name inside `modulesDir`: no
/// directories, so a configuration cannot load code from elsewhere.
pub(super) fn check_module_file_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".to_owned());
    }
    if name == "." || name == ".." || name.contains(['/', '\\', '\0']) {
        return Err(format!(
            "{name:?} must be a plain file name inside modulesDir (no '/', no '..')"
        ));
    }
    if name.starts_with("..") {
        // `..data` and friends are the kubelet's atomic-swap internals.
        return Err(format!("{name:?} must not start with '..'"));
    }
    Ok(())
}

/// Checks that `path` can be sent as the request target: absolute
/// (`/...`), optional query, no whitespace or control characters.
///
/// Here rather than in `portwise-probe` because configuration is validated
/// with it too; the probe refuses the same paths at request time (a guest can
/// ask for any path), so both get the same rule and message.
pub fn validate_path(path: &str) -> Result<(), PathError> {
    let path_error = |rule: PathRule| PathError {
        path: path.to_owned(),
        rule,
    };
    if !path.starts_with('/') {
        return Err(path_error(PathRule::Relative));
    }
    if path.starts_with("//") {
        // `//host/x` parses as an authority form in some stacks.
        return Err(path_error(PathRule::DoubleSlash));
    }
    if path.contains('#') {
        return Err(path_error(PathRule::Fragment));
    }
    match path.parse::<http::Uri>() {
        Ok(uri) if uri.scheme().is_none() && uri.authority().is_none() => Ok(()),
        Ok(_) => Err(path_error(PathRule::NotOriginForm)),
        Err(e) => Err(path_error(PathRule::Invalid(e.to_string()))),
    }
}

/// A request path refused by [`validate_path`], and the rule it breaks.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("path {path:?} {rule}")]
pub struct PathError {
    pub path: String,
    pub rule: PathRule,
}

/// Which rule of [`validate_path`] a path breaks.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PathRule {
    #[error("must start with '/'")]
    Relative,
    #[error("must not start with '//'")]
    DoubleSlash,
    #[error("must not contain a fragment ('#')")]
    Fragment,
    #[error("is not an origin-form path")]
    NotOriginForm,
    /// The URI parser's reason (its error type is not `Clone`, and probe
    /// errors are compared and copied).
    #[error("is not a valid request path: {0}")]
    Invalid(String),
}

/// Request headers a probe refuses: the hop-by-hop ones (RFC 9110 §7.6.1)
/// and the message framing, which describe the connection the probe opens
/// and closes itself, not the check. `Host`, `Authorization`, `User-Agent`
/// and any other end-to-end header may be set (the kubelet allows them too).
pub const REFUSED_HEADERS: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "te",
    "trailer",
    "content-length",
];

/// A probe request header, checked where configuration names it and where
/// a guest asks for it, with the same rule and message: a valid field name
/// that is not [`REFUSED_HEADERS`], and a value without control characters.
pub fn validate_header(name: &str, value: &str) -> Result<(), HeaderError> {
    let parsed = http::HeaderName::from_bytes(name.as_bytes())
        .map_err(|_| HeaderError::Name(name.to_owned()))?;
    if REFUSED_HEADERS.contains(&parsed.as_str()) {
        return Err(HeaderError::Refused(name.to_owned()));
    }
    http::HeaderValue::from_str(value).map_err(|_| HeaderError::Value {
        name: name.to_owned(),
        value: value.to_owned(),
    })?;
    Ok(())
}

/// A probe request header refused by [`validate_header`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("header name {0:?} is not a valid HTTP field name")]
    Name(String),
    /// One of [`REFUSED_HEADERS`].
    #[error(
        "header {0:?} is hop-by-hop or framing: the probe sets it (refused: {refused})",
        refused = REFUSED_HEADERS.join(", ")
    )]
    Refused(String),
    #[error("header {name:?}: value {value:?} must be visible ASCII, spaces or tabs")]
    Value { name: String, value: String },
}

/// A container port name (`IANA_SVC_NAME`, as the API validates
/// `containerPort.name`): 1 to 15 lowercase letters, digits and `-`, at
/// least one letter, no `-` at either end or twice in a row.
pub fn check_port_name(v: &str) -> Result<(), String> {
    let b = v.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 15
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b.iter().any(|c| c.is_ascii_lowercase())
        && !v.starts_with('-')
        && !v.ends_with('-')
        && !v.contains("--");
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{v:?} is not a container port name (1-15 lowercase letters, digits and '-', \
             with at least one letter)"
        ))
    }
}
