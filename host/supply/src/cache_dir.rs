//! The cache directory (`--cache-dir`) and what lives in it:
//!
//! ```text
//! .portwise-cache-key               the sealed store's key (sealed.rs)
//! <sha256>-<engine>.sealed.cwasm    compiled code, sealed (sealed.rs)
//! oci/manifests/<sha256>            pulled manifests, by digest (oci/cache.rs)
//! oci/blobs/<sha256>                pulled layers (the components), by digest
//! oci/signatures/<sha256>           the signatures found for a manifest
//! oci/tags/<sha256 of REGISTRY/REPO:TAG>   a tag's last resolution
//! ```

use std::path::{Path, PathBuf};

/// `$XDG_CACHE_HOME/portwise/wasm`, else `$HOME/.cache/portwise/wasm`, else
/// `/var/cache/portwise/wasm`.
pub fn default_cache_dir() -> PathBuf {
    let from_env = |var: &str| {
        std::env::var_os(var)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(xdg) = from_env("XDG_CACHE_HOME") {
        return xdg.join("portwise").join("wasm");
    }
    if let Some(home) = from_env("HOME") {
        return home.join(".cache").join("portwise").join("wasm");
    }
    PathBuf::from("/var/cache/portwise/wasm")
}

/// Where pulled `oci://` modules are cached under `cache_dir`.
pub fn pull_cache_dir(cache_dir: &Path) -> PathBuf {
    cache_dir.join("oci")
}
