//! Registry credentials (`registryAuth`): a Docker config JSON, read per
//! registry.

use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
};

use oci_client::secrets::RegistryAuth;

use crate::error::SetupError;

/// Credentials per registry, from a Docker config JSON.
#[derive(Default)]
pub(super) struct Auths {
    file: Option<PathBuf>,
    by_registry: HashMap<String, (String, String)>,
}

impl Auths {
    pub(super) fn load(path: &Path) -> Result<Auths, SetupError> {
        let text = fs::read(path).map_err(|source| SetupError::AuthRead {
            path: path.to_path_buf(),
            source,
        })?;
        let by_registry = parse_docker_config(&text).map_err(|why| SetupError::Auth {
            path: path.to_path_buf(),
            why,
        })?;
        Ok(Auths {
            file: Some(path.to_path_buf()),
            by_registry,
        })
    }

    pub(super) fn for_registry(&self, registry: &str) -> RegistryAuth {
        match self.by_registry.get(registry) {
            Some((user, password)) => RegistryAuth::Basic(user.clone(), password.clone()),
            None => RegistryAuth::Anonymous,
        }
    }

    /// Says whose credentials a refusal was about.
    pub(super) fn describe(&self, registry: &str) -> String {
        match (self.by_registry.get(registry), &self.file) {
            (Some((user, _)), Some(file)) => {
                format!("as user {user:?} (from {})", file.display())
            }
            (None, Some(file)) => format!(
                "anonymously ({} has no entry for {registry})",
                file.display()
            ),
            _ => "anonymously (no registryAuth is configured)".to_string(),
        }
    }
}

/// The registry part of an `auths` key: `https://r.example:5000/v1/` and
/// `r.example:5000` both name `r.example:5000`.
fn registry_of_key(key: &str) -> String {
    let key = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    key.split('/').next().unwrap_or(key).to_ascii_lowercase()
}

/// `{"auths": {KEY: {"auth": base64(user:password)} | {"username", "password"}}}`.
/// The credentials by registry; the error says which entry is wrong.
fn parse_docker_config(text: &[u8]) -> Result<HashMap<String, (String, String)>, String> {
    use base64::Engine;
    let json: serde_json::Value =
        serde_json::from_slice(text).map_err(|e| format!("not JSON: {e}"))?;
    let auths = json
        .get("auths")
        .and_then(|a| a.as_object())
        .ok_or("no \"auths\" object (expected the ~/.docker/config.json format)")?;
    let mut out = HashMap::new();
    for (key, entry) in auths {
        let field = |name: &str| entry.get(name).and_then(|v| v.as_str()).map(str::to_string);
        let creds = match (field("auth"), field("username"), field("password")) {
            (Some(auth), _, _) if !auth.is_empty() => {
                let decoded = base64::engine::general_purpose::STANDARD
                    .decode(auth.trim())
                    .map_err(|e| format!("auths.{key}.auth is not base64: {e}"))?;
                let decoded = String::from_utf8(decoded)
                    .map_err(|_| format!("auths.{key}.auth is not UTF-8"))?;
                let (user, password) = decoded
                    .split_once(':')
                    .ok_or_else(|| format!("auths.{key}.auth is not base64(user:password)"))?;
                (user.to_string(), password.to_string())
            }
            (_, Some(user), Some(password)) => (user, password),
            // Entries for credential helpers or tokens carry nothing usable.
            _ => continue,
        };
        out.insert(registry_of_key(key), creds);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_config_auths_by_registry() {
        let cfg = br#"{"auths": {
            "https://reg.example:5000/v1/": {"auth": "YWxpY2U6czNjcjN0"},
            "other.example": {"username": "bob", "password": "pw:with:colons"},
            "helper.example": {"identitytoken": "x"}
        }}"#;
        let auths = parse_docker_config(cfg).unwrap();
        assert_eq!(
            auths["reg.example:5000"],
            ("alice".to_string(), "s3cr3t".to_string())
        );
        assert_eq!(auths["other.example"].1, "pw:with:colons");
        assert!(!auths.contains_key("helper.example"));
        assert!(parse_docker_config(b"{}").unwrap_err().contains("auths"));
        assert!(
            parse_docker_config(br#"{"auths": {"r": {"auth": "!!"}}}"#)
                .unwrap_err()
                .contains("not base64")
        );
    }
}
