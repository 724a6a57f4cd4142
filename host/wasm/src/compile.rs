//! Compile or deserialise: a module's component, from the sealed store of
//! compiled code ([`portwise_supply::sealed`]) when it holds a verified
//! entry for this module and engine, else compiled from its bytes (and the
//! entry written). Serialising and deserialising are wasmtime's, so they
//! are here; the store only keeps opaque bytes, and what its seal does and
//! does not vouch for is in `portwise_supply`'s crate docs.
//!
//! A rejected entry is a cache miss: the module is compiled from its
//! `.wasm`, the entry rewritten (atomically), a warning with the file name
//! logged, and the rejection counted ([`CodeCacheStats::rejected`]; the load
//! itself counts as `compiled`).
//!
//! Bounded: every reload of a module with new content adds an entry (a new
//! sha256), so after each load the runtime drops the entries it loaded or
//! wrote that no loaded module uses any more ([`CodeCache::retain`]). Entries
//! it has not touched (other engines' fingerprints, modules of the previous
//! start not loaded yet, such as `oci://` modules pulled later) and the key
//! are left alone.

use std::{collections::HashSet, path::PathBuf, sync::Mutex};

use portwise_supply::sealed::{CodeCacheStats, Lookup, SealedStore};
use wasmtime::{Engine, component::Component};

/// Where a component came from, and what it cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompileSource {
    /// Compiled from the `.wasm` bytes now.
    Compiled,
    /// Loaded from the compiled-code cache.
    Cached,
}

/// The compiled-code cache of a runtime: the sealed store for its engine.
#[derive(Debug)]
pub(crate) struct CodeCache {
    store: SealedStore,
    /// The modules (sha256) whose entries this runtime read or wrote and
    /// has not removed since.
    touched: Mutex<HashSet<String>>,
}

/// A component and how it was obtained.
pub(crate) struct Loaded {
    pub component: Component,
    pub source: CompileSource,
    /// Why the cache entry present was not used, if it was not.
    pub rejected: Option<String>,
}

impl CodeCache {
    pub(crate) fn new(dir: PathBuf, fingerprint: String) -> Self {
        CodeCache {
            store: SealedStore::new(dir, fingerprint),
            touched: Mutex::new(HashSet::new()),
        }
    }

    /// Removes the entries this runtime touched whose module is not in
    /// `loaded` (the sha256s of the components serving): a module replaced
    /// by new content, or new content that failed to load.
    pub(crate) fn retain(&self, loaded: &HashSet<&str>) {
        let mut touched = self.touched.lock().unwrap_or_else(|e| e.into_inner());
        touched.retain(|sha256| {
            let keep = loaded.contains(sha256.as_str());
            if !keep {
                self.store.remove(sha256);
            }
            keep
        });
    }

    #[cfg(test)]
    pub(crate) fn path(&self, sha256: &str) -> PathBuf {
        self.store.path(sha256)
    }

    pub(crate) fn stats(&self) -> CodeCacheStats {
        self.store.stats()
    }

    /// Loads the component for `sha256`, compiling (and caching) on a miss.
    pub(crate) fn load(
        &self,
        engine: &Engine,
        sha256: &str,
        wasm: &[u8],
    ) -> wasmtime::Result<Loaded> {
        self.touched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(sha256.to_string());
        let rejected = match self.store.read(sha256) {
            Lookup::Off => {
                return Ok(Loaded {
                    component: Component::from_binary(engine, wasm)?,
                    source: CompileSource::Compiled,
                    rejected: None,
                });
            }
            Lookup::Miss => None,
            Lookup::Rejected(why) => Some(why.to_string()),
            Lookup::Verified(artifact) => {
                // SAFETY: `artifact` carries a valid tag under the store's
                // key, which only `SealedStore::write` makes, over the exact
                // output of `Component::serialize` for this module and
                // engine (below); wasmtime reads the same memory the store
                // verified. What the key does and does not vouch for:
                // `portwise_supply`'s crate docs.
                match unsafe { Component::deserialize(engine, &artifact) } {
                    Ok(component) => {
                        self.store.hit();
                        return Ok(Loaded {
                            component,
                            source: CompileSource::Cached,
                            rejected: None,
                        });
                    }
                    Err(e) => {
                        let why = format!("wasmtime refuses it: {e:#}");
                        self.store.reject(sha256, &why);
                        Some(why)
                    }
                }
            }
        };
        let component = Component::from_binary(engine, wasm)?;
        match component.serialize() {
            Ok(artifact) => self.store.write(sha256, &artifact),
            Err(e) => tracing::warn!("cannot serialise compiled component: {e:#}"),
        }
        Ok(Loaded {
            component,
            source: CompileSource::Compiled,
            rejected,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::{fs, os::unix::fs::PermissionsExt, path::Path};

    use portwise_supply::sealed::{KEY_FILE, SEAL_MAGIC, SEAL_TRAILER_LEN as TRAILER_LEN};

    use super::*;

    /// The smallest component: no imports, no exports.
    const EMPTY_COMPONENT: &[u8] = b"\0asm\x0d\0\x01\0";
    const SHA: &str = "0000000000000000000000000000000000000000000000000000000000000001";

    fn scratch() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    fn cache(dir: &Path) -> CodeCache {
        CodeCache::new(dir.to_path_buf(), "f".repeat(64))
    }

    #[test]
    fn entries_are_sealed_and_anything_else_is_a_miss_that_gets_rewritten() {
        let engine = Engine::default();
        let dir = scratch();
        let c = cache(dir.path());
        let load = |c: &CodeCache| c.load(&engine, SHA, EMPTY_COMPONENT).unwrap();

        let first = load(&c);
        assert_eq!(first.source, CompileSource::Compiled);
        assert_eq!(first.rejected, None);
        let entry = c.path(SHA);
        let sealed = fs::read(&entry).unwrap();
        assert!(sealed.ends_with(SEAL_MAGIC));
        assert_eq!(load(&c).source, CompileSource::Cached);
        assert_eq!(
            c.stats(),
            CodeCacheStats {
                hits: 1,
                misses: 1,
                rejected: 0
            }
        );

        let artifact_len = sealed.len() - TRAILER_LEN;
        let mut flipped = sealed.clone();
        flipped[artifact_len / 2] ^= 0x01;
        let mut bad_tag = sealed.clone();
        bad_tag[artifact_len] ^= 0x80;
        let damaged: [(&str, Vec<u8>, &str); 5] = [
            ("a flipped bit", flipped, "does not verify"),
            ("truncated", sealed[..sealed.len() / 2].to_vec(), "no seal"),
            ("shorter than a seal", sealed[..10].to_vec(), "no seal"),
            ("no seal", sealed[..artifact_len].to_vec(), "no seal"),
            ("a wrong tag", bad_tag, "does not verify"),
        ];
        for (i, (what, bytes, why)) in damaged.into_iter().enumerate() {
            fs::write(&entry, &bytes).unwrap();
            let loaded = load(&c);
            assert_eq!(loaded.source, CompileSource::Compiled, "{what}");
            let rejected = loaded.rejected.unwrap_or_default();
            assert!(rejected.contains(why), "{what}: {rejected}");
            assert_eq!(c.stats().rejected, i as u64 + 1, "{what}");
            // Rewritten: the next load is a hit.
            assert_eq!(fs::read(&entry).unwrap(), sealed, "{what}");
            assert_eq!(load(&c).source, CompileSource::Cached, "{what}");
        }

        // A genuine entry under another module's name.
        let other = "0000000000000000000000000000000000000000000000000000000000000002";
        fs::copy(&entry, c.path(other)).unwrap();
        let loaded = c.load(&engine, other, EMPTY_COMPONENT).unwrap();
        assert_eq!(loaded.source, CompileSource::Compiled);

        // Another key (a fresh directory key): every entry is rejected.
        fs::remove_file(dir.path().join(KEY_FILE)).unwrap();
        let fresh = cache(dir.path());
        let loaded = load(&fresh);
        assert_eq!(loaded.source, CompileSource::Compiled);
        assert!(loaded.rejected.unwrap().contains("another key"));
        assert_eq!(load(&fresh).source, CompileSource::Cached);
    }

    #[test]
    fn entries_are_written_atomically_and_never_through_a_planted_file() {
        let engine = Engine::default();
        let dir = scratch();
        let c = cache(dir.path());
        c.load(&engine, SHA, EMPTY_COMPONENT).unwrap();
        let names: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        // The entry and the key; no temporary file left behind.
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");
        let meta = fs::metadata(c.path(SHA)).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);

        // A symlink where the entry goes is replaced, not written through.
        let victim = dir.path().join("victim");
        fs::write(&victim, b"keep me").unwrap();
        fs::remove_file(c.path(SHA)).unwrap();
        std::os::unix::fs::symlink(&victim, c.path(SHA)).unwrap();
        let loaded = c.load(&engine, SHA, EMPTY_COMPONENT).unwrap();
        assert_eq!(loaded.source, CompileSource::Compiled);
        assert!(loaded.rejected.is_some());
        assert_eq!(fs::read(&victim).unwrap(), b"keep me");
        assert!(!fs::symlink_metadata(c.path(SHA)).unwrap().is_symlink());
    }

    #[test]
    fn a_directory_that_cannot_hold_a_key_turns_the_cache_off() {
        let engine = Engine::default();
        let dir = scratch();
        let file = dir.path().join("not-a-directory");
        fs::write(&file, b"").unwrap();
        let c = cache(&file);
        let loaded = c.load(&engine, SHA, EMPTY_COMPONENT).unwrap();
        assert_eq!(loaded.source, CompileSource::Compiled);
        assert_eq!(c.stats(), CodeCacheStats::default());
    }
}
