//! Deterministic slice names.
//!
//! The Go library named slices `<svc>-<port name or number>[--ipv6]
//! [--p<target>][--<n>]`; portwise keeps that scheme so names stay readable
//! and an operator can tell what a slice holds without opening it. Names are
//! allocated, not derived: a slice keeps the name it was created with for as
//! long as it lives (see the planner), so the scheme only decides the names
//! of *new* slices.

use sha2::{Digest, Sha256};

use crate::membership::Family;

/// Longest valid object name (a DNS subdomain).
pub const MAX_NAME_LEN: usize = 253;

/// Hex digits of the hash that replaces the tail of an over-long name.
const HASH_LEN: usize = 10;

/// `<svc>-<port name, or the port number when unnamed>[--ipv6]`: the name of
/// the first slice of a (Service port, family) whose target is primary.
pub fn base_name(service: &str, port_name: &str, port: i32, family: Family) -> String {
    let label = if port_name.is_empty() {
        port.to_string()
    } else {
        port_name.to_string()
    };
    let mut s = format!("{service}-{label}");
    if family == Family::V6 {
        s.push_str("--ipv6");
    }
    s
}

/// `<svc>-<name>.<name>…[--ipv6]`: the base of the slices of endpoints that
/// back several ports (those ports' names, sorted). Port and Service names
/// cannot hold a dot, so no single port's name can be read this way.
pub fn shared_base_name(service: &str, port_names: &[String], family: Family) -> String {
    let mut s = format!("{service}-{}", port_names.join("."));
    if family == Family::V6 {
        s.push_str("--ipv6");
    }
    s
}

/// The base name of a port-less headless Service's slices: `<service>-noports`
/// (`--ipv6` for IPv6), so that it cannot be read as a port number.
pub fn portless_base_name(service: &str, family: Family) -> String {
    let mut s = format!("{service}-noports");
    if family == Family::V6 {
        s.push_str("--ipv6");
    }
    s
}

/// The stem of a slice set: the base, plus `--p<numbers>` unless the set
/// holds the group's primary numbers: `--p8080` when its ports share one
/// number, else the numbers in the order of the group's names, joined by
/// dots (`--p8080.8443`).
pub fn stem(base: &str, targets: Option<&[u16]>) -> String {
    match targets {
        Some([first, rest @ ..]) if rest.iter().all(|t| t == first) => format!("{base}--p{first}"),
        Some(ts) if !ts.is_empty() => {
            let ts: Vec<String> = ts.iter().map(u16::to_string).collect();
            format!("{base}--p{}", ts.join("."))
        }
        _ => base.to_string(),
    }
}

/// The `n`th name of a stem (`n` starts at 1, which carries no suffix),
/// shortened to a valid length when needed.
pub fn chunk_name(stem: &str, n: usize) -> String {
    let raw = if n <= 1 {
        stem.to_string()
    } else {
        format!("{stem}--{n}")
    };
    fit(raw)
}

/// Whether `name` is `stem` or `stem--<digits>`: a chunk of that stem.
pub fn is_chunk_of(name: &str, stem: &str) -> bool {
    if name == fit(stem.to_string()) {
        return true;
    }
    name.strip_prefix(stem)
        .and_then(|rest| rest.strip_prefix("--"))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// Shortens an over-long name deterministically: a prefix, a dash, and a
/// hash of the whole name, so distinct long names stay distinct.
fn fit(raw: String) -> String {
    if raw.len() <= MAX_NAME_LEN {
        return raw;
    }
    let digest = Sha256::digest(raw.as_bytes());
    let hash = &hex::encode(digest)[..HASH_LEN];
    let mut keep = MAX_NAME_LEN - HASH_LEN - 1;
    while !raw.is_char_boundary(keep) {
        keep -= 1;
    }
    let prefix = raw[..keep].trim_end_matches(['-', '.']);
    format!("{prefix}-{hash}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheme_matches_the_go_library() {
        assert_eq!(base_name("web", "http", 80, Family::V4), "web-http");
        assert_eq!(base_name("web", "", 8080, Family::V4), "web-8080");
        assert_eq!(base_name("web", "http", 80, Family::V6), "web-http--ipv6");
        let s = stem(&base_name("web", "http", 80, Family::V6), Some(&[8081]));
        assert_eq!(
            stem("colo-http.https", Some(&[8080, 8443])),
            "colo-http.https--p8080.8443"
        );
        assert_eq!(
            stem("colo-alt.web", Some(&[8080, 8080])),
            "colo-alt.web--p8080"
        );
        assert_eq!(s, "web-http--ipv6--p8081");
        assert_eq!(chunk_name(&s, 1), "web-http--ipv6--p8081");
        assert_eq!(chunk_name(&s, 2), "web-http--ipv6--p8081--2");
        assert_eq!(chunk_name("web-http", 12), "web-http--12");
        let shared = ["alt".to_string(), "web".to_string()];
        assert_eq!(
            shared_base_name("colo", &shared, Family::V4),
            "colo-alt.web"
        );
        assert_eq!(
            shared_base_name("colo", &shared, Family::V6),
            "colo-alt.web--ipv6"
        );
    }

    #[test]
    fn chunk_membership_of_names() {
        assert!(is_chunk_of("web-http", "web-http"));
        assert!(is_chunk_of("web-http--3", "web-http"));
        assert!(!is_chunk_of("web-http--p8080", "web-http"));
        assert!(!is_chunk_of("web-http--", "web-http"));
        assert!(!is_chunk_of("web-https", "web-http"));
    }

    #[test]
    fn long_names_are_truncated_and_hashed() {
        let svc = "s".repeat(240);
        let a = chunk_name(
            &stem(&base_name(&svc, "http", 80, Family::V6), Some(&[8080])),
            1,
        );
        let b = chunk_name(
            &stem(&base_name(&svc, "http", 80, Family::V6), Some(&[8081])),
            1,
        );
        assert_eq!(a.len(), MAX_NAME_LEN);
        assert_ne!(a, b);
        assert_eq!(
            a,
            chunk_name(
                &stem(&base_name(&svc, "http", 80, Family::V6), Some(&[8080])),
                1
            )
        );
        assert!(
            a.bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        );
        assert!(
            a.as_bytes()[0].is_ascii_alphanumeric()
                && a.as_bytes()[a.len() - 1].is_ascii_alphanumeric()
        );
        // a cut that lands on dashes does not leave a dash before the hash
        let dashy = format!("{}{}", "a".repeat(241), "-".repeat(20));
        let f = chunk_name(&dashy, 1);
        assert!(!f.contains("--"), "{f}");
        assert!(f.len() <= MAX_NAME_LEN);
    }
}
