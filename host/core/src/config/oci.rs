//! `oci://` module references: the syntax of a `wasm.module` that names an
//! artifact in an OCI registry instead of a file in `modulesDir`.
//!
//! Apart from the schema because the parser is a small grammar of its own
//! (registry, repository, tag, digest) that the puller uses as well.

/// The scheme of a module pulled from an OCI registry.
pub const OCI_SCHEME: &str = "oci://";

/// Why a string is not an `oci://` reference ([`OciRef::parse`]); each
/// variant carries the part that is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OciRefError {
    #[error("{0:?} does not start with {OCI_SCHEME}")]
    Scheme(String),
    #[error("digest {0:?} must be sha256:<64 hex digits> (the manifest's digest)")]
    Digest(String),
    #[error("{0:?} must name a registry and a repository: oci://REGISTRY/REPOSITORY@sha256:DIGEST")]
    NoRepository(String),
    #[error("{0:?} is not a registry host[:port]")]
    Registry(String),
    #[error("repository {0:?} must be lowercase path components ([a-z0-9._-], separated by '/')")]
    Repository(String),
    #[error("tag {0:?} is not a valid OCI tag")]
    Tag(String),
    #[error("{0:?} names neither a digest nor a tag: add @sha256:<manifest digest>")]
    Unpinned(String),
}

/// `oci://REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST]`, parsed.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct OciRef {
    /// Host, with its port if any (`registry.example:5000`).
    pub registry: String,
    /// `team/checkers/tier-check`: lowercase path components.
    pub repository: String,
    pub tag: Option<String>,
    /// 64 lowercase hex digits: the manifest's sha256.
    pub digest: Option<String>,
}

impl OciRef {
    /// Parses an `oci://` reference. A tag alone is accepted here;
    /// configuration validation refuses it without `allowTags`.
    pub fn parse(s: &str) -> Result<OciRef, OciRefError> {
        let rest = s
            .strip_prefix(OCI_SCHEME)
            .ok_or_else(|| OciRefError::Scheme(s.to_string()))?;
        let (name, digest) = match rest.split_once('@') {
            Some((name, d)) => {
                let hex = d
                    .strip_prefix("sha256:")
                    .ok_or_else(|| OciRefError::Digest(d.to_string()))?;
                if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(OciRefError::Digest(d.to_string()));
                }
                (name, Some(hex.to_ascii_lowercase()))
            }
            None => (rest, None),
        };
        let (registry, path) = name
            .split_once('/')
            .ok_or_else(|| OciRefError::NoRepository(s.to_string()))?;
        if registry.is_empty()
            || !registry
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
        {
            return Err(OciRefError::Registry(registry.to_string()));
        }
        // A ':' after the last '/' starts the tag.
        let (repository, tag) = match path.rsplit_once(':') {
            Some((repo, tag)) if !tag.contains('/') => (repo, Some(tag.to_string())),
            _ => (path, None),
        };
        let component_ok = |c: &str| {
            !c.is_empty()
                && c.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
                && c.as_bytes()[0].is_ascii_alphanumeric()
        };
        if !repository.split('/').all(component_ok) {
            return Err(OciRefError::Repository(repository.to_string()));
        }
        if let Some(tag) = &tag
            && (tag.is_empty()
                || tag.len() > 128
                || !tag
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
                || tag.starts_with(['.', '-']))
        {
            return Err(OciRefError::Tag(tag.clone()));
        }
        if tag.is_none() && digest.is_none() {
            return Err(OciRefError::Unpinned(s.to_string()));
        }
        Ok(OciRef {
            registry: registry.to_string(),
            repository: repository.to_string(),
            tag,
            digest,
        })
    }

    /// `REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST]`, as registries' clients
    /// write references.
    pub fn reference(&self) -> String {
        let mut s = format!("{}/{}", self.registry, self.repository);
        if let Some(t) = &self.tag {
            s.push(':');
            s.push_str(t);
        }
        if let Some(d) = &self.digest {
            s.push_str("@sha256:");
            s.push_str(d);
        }
        s
    }
}

impl std::fmt::Display for OciRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{OCI_SCHEME}{}", self.reference())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oci_references_parse() {
        let d = "AB".repeat(32);
        let r = OciRef::parse(&format!(
            "oci://reg.example:5000/team/tier-check:v1@sha256:{d}"
        ))
        .unwrap();
        assert_eq!(r.registry, "reg.example:5000");
        assert_eq!(r.repository, "team/tier-check");
        assert_eq!(r.tag.as_deref(), Some("v1"));
        assert_eq!(r.digest, Some("ab".repeat(32)));
        assert_eq!(
            r.to_string(),
            format!(
                "oci://reg.example:5000/team/tier-check:v1@sha256:{}",
                "ab".repeat(32)
            )
        );
        let r = OciRef::parse("oci://10.244.255.1:5000/x:latest").unwrap();
        assert_eq!((r.tag.as_deref(), r.digest), (Some("latest"), None));
        for (bad, why) in [
            ("oci://reg/x", "neither a digest nor a tag"),
            ("oci://reg/x@sha256:abc", "64 hex digits"),
            ("oci://reg/x@md5:abc", "sha256:"),
            ("oci://reg", "registry and a repository"),
            ("oci://reg/Upper", "lowercase"),
            ("oci://reg/x:-bad", "not a valid OCI tag"),
        ] {
            let e = OciRef::parse(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    /// Each refusal carries the part that is wrong, and a configuration
    /// refusing it keeps the field's path in front of the same text.
    #[test]
    fn parse_errors_carry_the_offending_part() {
        let d = "ab".repeat(32);
        assert_eq!(
            OciRef::parse("oci://reg/x@md5:abc"),
            Err(OciRefError::Digest("md5:abc".into()))
        );
        assert_eq!(
            OciRef::parse(&format!("oci://reg/Team/x@sha256:{d}")),
            Err(OciRefError::Repository("Team/x".into()))
        );
        assert_eq!(
            OciRef::parse("oci://reg/x"),
            Err(OciRefError::Unpinned("oci://reg/x".into()))
        );
        let e = crate::config::Config::from_yaml(
            "serviceKey: {label: g}\nmembership: {wasm: {module: 'oci://reg/x@md5:abc'}}",
        )
        .unwrap_err();
        assert_eq!(e.field_path(), Some("membership.wasm.module"));
        assert!(
            e.to_string()
                .contains(&OciRefError::Digest("md5:abc".into()).to_string()),
            "{e}"
        );
    }
}
