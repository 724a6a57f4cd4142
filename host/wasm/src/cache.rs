//! Compiled code on disk, so a restart does not recompile.
//!
//! Compiling a Python guest takes seconds; loading its precompiled artifact
//! takes milliseconds. An entry is keyed by the module's content hash plus
//! the engine fingerprint (target, compiler settings, wasmtime version): an
//! artifact only ever loads into an engine that could have produced it.
//! Entries are written to a temporary file and renamed into place, so a
//! crash never leaves half an entry under a real name.
//!
//! # Integrity: what is verified, and against whom
//!
//! Deserialising an artifact runs the machine code in it: wasmtime checks
//! its header and engine compatibility, nothing else ("arbitrary input could
//! replace valid compiled code with any other valid compiled code",
//! `Module::deserialize`). So every entry is sealed, and an entry is handed
//! to wasmtime only once its seal verifies:
//!
//! ```text
//! entry = artifact ‖ tag (32 bytes) ‖ SEAL_MAGIC (8 bytes)
//! tag   = HMAC-SHA256(key, SEAL_DOMAIN ‖ module sha256 ‖ 0 ‖ engine fingerprint ‖ 0 ‖ artifact)
//! ```
//!
//! The key is 32 random bytes in [`KEY_FILE`] in the cache directory,
//! created with mode 0600 by the first runtime that uses the directory. It
//! is trusted only if it is a regular file (not a symlink), owned by our
//! effective uid, with no group or other permission bits, and 32 bytes long;
//! otherwise it is replaced, which invalidates every entry. The entry is read
//! into memory, verified and deserialised from that same memory (not mapped
//! from the file), so what was verified is what runs.
//!
//! This protects against:
//! - damage: a flipped bit, a truncated or torn file (a crash after the
//!   rename but before the data reached the disk), a file some other
//!   program put there, an entry left by an older portwise that did not seal
//!   entries;
//! - a writer that can create, replace or delete files in the directory but
//!   runs as another uid and is not root. That is the case worth having: an
//!   `emptyDir` is created world-writable (0777), so any container of the
//!   Pod that mounts it can write there whatever its uid. Without the key it
//!   cannot make a tag, nor plant a key of its own (it would not be owned by
//!   our uid), and since the module hash and engine fingerprint are under
//!   the tag it cannot pass off one genuine entry as another either.
//!
//! It does not protect against anyone who can read the key: the same uid
//! (another process or container running as portwise's user with the volume
//! mounted), root on the node, or whoever can read the volume's backing store
//! (a snapshot of a persistent volume). Those could as well change the binary
//! or the process. Nor does it vouch for the `.wasm` itself (that is what
//! `sha256` pins are for). Deleting entries, or the key, only costs a
//! recompile.
//!
//! Why not wasmtime's own cache (`Config::cache`, feature `cache`): in
//! wasmtime 48 it zstd-decodes whatever file sits under the hash of its
//! inputs and hands it to the same loader as `deserialize`, trusting the
//! directory exactly as `deserialize_file` does (no digest, no key; the
//! frames carry no checksum), and its API is safe, which hides that trust
//! rather than checking it.
//!
//! A rejected entry is a cache miss: the module is compiled from its
//! `.wasm`, the entry rewritten (atomically), a warning with the file name
//! logged, and the rejection counted ([`CodeCacheStats::rejected`]; the load
//! itself counts as `compiled`).

use std::{
    fs,
    io::{self, Read, Write},
    os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::{
        OnceLock,
        atomic::{AtomicU64, Ordering},
    },
};

use sha2::{Digest, Sha256};
use wasmtime::{Engine, component::Component};

/// Where a component came from, and what it cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompileSource {
    /// Compiled from the `.wasm` bytes now.
    Compiled,
    /// Loaded from the compiled-code cache.
    Cached,
}

/// What the compiled-code cache of a runtime did since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CodeCacheStats {
    /// Entries that verified and loaded (no compile).
    pub hits: u64,
    /// Loads that found no entry (compiled, entry written).
    pub misses: u64,
    /// Entries that were present but failed verification (missing or wrong
    /// seal, truncated, unreadable) or that wasmtime refused: compiled
    /// instead and rewritten.
    pub rejected: u64,
}

/// The key file in the cache directory (see the module docs).
pub const KEY_FILE: &str = ".portwise-cache-key";
/// Ends every sealed entry.
const SEAL_MAGIC: &[u8; 8] = b"pwseal01";
/// Starts every tagged message, so the key can never authenticate anything
/// but a cache entry.
const SEAL_DOMAIN: &[u8] = b"portwise-wasm compiled-code cache entry v1\0";
const TAG_LEN: usize = 32;
const TRAILER_LEN: usize = TAG_LEN + SEAL_MAGIC.len();
/// Entries larger than this are not read (the compiled 18 MB Python guest is
/// 35 MB).
const MAX_ENTRY_BYTES: u64 = 1 << 30;

/// The cache key; never printed.
struct Key([u8; 32]);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

#[derive(Debug, Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    rejected: AtomicU64,
}

#[derive(Debug)]
pub(crate) struct CodeCache {
    dir: PathBuf,
    fingerprint: String,
    /// Read (or created) on first use; `None` if the directory cannot hold
    /// a trustworthy key, and then the cache is off.
    key: OnceLock<Option<Key>>,
    counters: Counters,
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
            dir,
            fingerprint,
            key: OnceLock::new(),
            counters: Counters::default(),
        }
    }

    pub(crate) fn path(&self, sha256: &str) -> PathBuf {
        // 16 hex digits of the engine fingerprint keep names short; the seal
        // covers the full one. `.sealed` keeps these apart from the unsealed
        // entries of older versions sharing a directory.
        self.dir
            .join(format!("{sha256}-{}.sealed.cwasm", &self.fingerprint[..16]))
    }

    pub(crate) fn stats(&self) -> CodeCacheStats {
        CodeCacheStats {
            hits: self.counters.hits.load(Ordering::Relaxed),
            misses: self.counters.misses.load(Ordering::Relaxed),
            rejected: self.counters.rejected.load(Ordering::Relaxed),
        }
    }

    fn key(&self) -> Option<&Key> {
        self.key
            .get_or_init(|| match load_or_create_key(&self.dir) {
                Ok(key) => Some(key),
                Err(e) => {
                    tracing::warn!(
                        dir = %self.dir.display(),
                        "compiled-code cache disabled: no usable key: {e}"
                    );
                    None
                }
            })
            .as_ref()
    }

    /// Loads the component for `sha256`, compiling (and caching) on a miss.
    pub(crate) fn load(
        &self,
        engine: &Engine,
        sha256: &str,
        wasm: &[u8],
    ) -> wasmtime::Result<Loaded> {
        let Some(key) = self.key() else {
            return Ok(Loaded {
                component: Component::from_binary(engine, wasm)?,
                source: CompileSource::Compiled,
                rejected: None,
            });
        };
        let path = self.path(sha256);
        let rejected = match self.read_verified(key, sha256, &path) {
            Ok(None) => {
                self.counters.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
            Ok(Some(artifact)) => {
                // SAFETY: `artifact` carries a valid tag under our key, which
                // only `seal` below makes, over the exact output of
                // `Component::serialize` for this module and engine; wasmtime
                // reads the same memory we verified. What the key does and
                // does not vouch for: the module docs.
                match unsafe { Component::deserialize(engine, &artifact) } {
                    Ok(component) => {
                        self.counters.hits.fetch_add(1, Ordering::Relaxed);
                        return Ok(Loaded {
                            component,
                            source: CompileSource::Cached,
                            rejected: None,
                        });
                    }
                    Err(e) => Some(format!("wasmtime refuses it: {e:#}")),
                }
            }
            Err(why) => Some(why),
        };
        if let Some(why) = &rejected {
            self.counters.rejected.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                path = %path.display(),
                "compiled-code cache entry rejected, recompiling: {why}"
            );
            let _ = fs::remove_file(&path);
        }
        let component = Component::from_binary(engine, wasm)?;
        match component.serialize() {
            Ok(artifact) => {
                let tag = seal(key, sha256, &self.fingerprint, &artifact);
                if let Err(e) = self.store(&path, &[&artifact, &tag, SEAL_MAGIC]) {
                    tracing::warn!(dir = %self.dir.display(), "cannot write compiled-code cache: {e}");
                }
            }
            Err(e) => tracing::warn!("cannot serialise compiled component: {e:#}"),
        }
        Ok(Loaded {
            component,
            source: CompileSource::Compiled,
            rejected,
        })
    }

    /// The artifact of the entry at `path` if there is one and its seal
    /// verifies; `Ok(None)` if there is none; why not otherwise.
    fn read_verified(
        &self,
        key: &Key,
        sha256: &str,
        path: &Path,
    ) -> Result<Option<Vec<u8>>, String> {
        let mut file = match fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
        {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot open it: {e}")),
        };
        let meta = file
            .metadata()
            .map_err(|e| format!("cannot stat it: {e}"))?;
        if !meta.is_file() {
            return Err("not a regular file".into());
        }
        if meta.len() > MAX_ENTRY_BYTES {
            return Err(format!("{} bytes is too large", meta.len()));
        }
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        (&mut file)
            .take(MAX_ENTRY_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| format!("cannot read it: {e}"))?;
        if bytes.len() as u64 > MAX_ENTRY_BYTES {
            return Err("grew too large while being read".into());
        }
        if bytes.len() < TRAILER_LEN || !bytes.ends_with(SEAL_MAGIC) {
            return Err(format!(
                "no seal ({} bytes; truncated, or not written by this version)",
                bytes.len()
            ));
        }
        let artifact_len = bytes.len() - TRAILER_LEN;
        let expected = seal(key, sha256, &self.fingerprint, &bytes[..artifact_len]);
        if !constant_time_eq(&expected, &bytes[artifact_len..artifact_len + TAG_LEN]) {
            return Err(
                "seal does not verify (corrupt, truncated, or written with another key)".into(),
            );
        }
        bytes.truncate(artifact_len);
        Ok(Some(bytes))
    }

    /// Writes `parts` to `path` atomically: a new temporary file (never an
    /// existing one, nor through a symlink planted under its name), synced,
    /// then renamed over `path`.
    fn store(&self, path: &Path, parts: &[&[u8]]) -> io::Result<()> {
        fs::create_dir_all(&self.dir)?;
        let tmp = temporary(
            &self.dir,
            path.file_name().and_then(|n| n.to_str()).unwrap_or("entry"),
        );
        let mut file = create_new_private(&tmp)?;
        let written = parts
            .iter()
            .try_for_each(|p| file.write_all(p))
            .and_then(|()| file.sync_all());
        drop(file);
        if let Err(e) = written.and_then(|()| fs::rename(&tmp, path)) {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        Ok(())
    }
}

/// A fresh temporary name next to `name` in `dir` (hidden, unique within
/// the process).
fn temporary(dir: &Path, name: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    dir.join(format!(
        ".{name}.{}.{}.tmp",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Creates `path`, failing if anything (a file, a symlink) is there already.
fn create_new_private(path: &Path) -> io::Result<fs::File> {
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

/// The directory's key: the existing one if it can be trusted, else a new
/// one (replacing an untrusted one). Two runtimes racing here agree on one
/// key: a new key is written in full under a temporary name and hard-linked
/// into place, which fails if another got there first.
fn load_or_create_key(dir: &Path) -> io::Result<Key> {
    fs::create_dir_all(dir)?;
    let path = dir.join(KEY_FILE);
    for _ in 0..4 {
        match read_key(&path) {
            Ok(Some(key)) => return Ok(key),
            Ok(None) => {}
            Err(why) => {
                tracing::warn!(
                    path = %path.display(),
                    "replacing the compiled-code cache key ({why}); every cached entry will be recompiled"
                );
                fs::remove_file(&path)?;
            }
        }
        let mut key = [0u8; 32];
        getrandom::fill(&mut key).map_err(|e| io::Error::other(e.to_string()))?;
        let tmp = temporary(dir, KEY_FILE);
        let written = create_new_private(&tmp).and_then(|mut f| {
            f.write_all(&key)?;
            f.sync_all()
        });
        let linked = written.and_then(|()| fs::hard_link(&tmp, &path));
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => return Ok(Key(key)),
            // Another runtime made one meanwhile: use that.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other(
        "the key file keeps changing under us (another process replacing it?)",
    ))
}

/// `Ok(None)`: no key file. `Err`: a key file that must not be trusted.
fn read_key(path: &Path) -> Result<Option<Key>, String> {
    let mut file = match fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err("a symlink".into()),
        Err(e) => return Err(format!("cannot open it: {e}")),
    };
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot stat it: {e}"))?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    if meta.uid() != euid {
        return Err(format!("owned by uid {}, not {euid}", meta.uid()));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!("mode {mode:03o}, not 600"));
    }
    let mut key = [0u8; 32];
    let mut rest = Vec::new();
    file.read_exact(&mut key)
        .and_then(|()| (&mut file).take(1).read_to_end(&mut rest))
        .map_err(|e| format!("not 32 bytes: {e}"))?;
    if !rest.is_empty() {
        return Err("longer than 32 bytes".into());
    }
    Ok(Some(Key(key)))
}

/// The tag of an entry.
fn seal(key: &Key, sha256: &str, fingerprint: &str, artifact: &[u8]) -> [u8; TAG_LEN] {
    hmac_sha256(
        &key.0,
        &[
            SEAL_DOMAIN,
            sha256.as_bytes(),
            b"\0",
            fingerprint.as_bytes(),
            b"\0",
            artifact,
        ],
    )
}

/// HMAC-SHA256 (RFC 2104) of the concatenation of `parts`.
fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut block = [0u8; BLOCK];
    if key.len() > BLOCK {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.map(|b| b ^ byte);
    let mut inner = Sha256::new();
    inner.update(pad(0x36));
    for part in parts {
        inner.update(part);
    }
    let mut outer = Sha256::new();
    outer.update(pad(0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// Equality whose time does not depend on where the inputs differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

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

#[cfg(test)]
mod tests {
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

    fn key_of(dir: &Path) -> Vec<u8> {
        fs::read(dir.join(KEY_FILE)).unwrap()
    }

    #[test]
    fn hmac_matches_rfc_4231() {
        let hex = |b: [u8; 32]| hex::encode(b);
        // Test case 1.
        assert_eq!(
            hex(hmac_sha256(&[0x0b; 20], &[b"Hi There"])),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        );
        // Test case 2, the message in two parts.
        assert_eq!(
            hex(hmac_sha256(
                b"Jefe",
                &[b"what do ya want ", b"for nothing?"]
            )),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // Test case 6: a key longer than the block is hashed first.
        assert_eq!(
            hex(hmac_sha256(
                &[0xaa; 131],
                &[b"Test Using Larger Than Block-Size Key - Hash Key First"]
            )),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn constant_time_eq_compares_all_bytes_and_lengths() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"xbc", b"abc"));
        assert!(!constant_time_eq(b"ab", b"abc"));
    }

    #[test]
    fn the_key_is_created_private_and_reused() {
        let dir = scratch();
        let first = load_or_create_key(dir.path()).unwrap();
        let meta = fs::metadata(dir.path().join(KEY_FILE)).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(meta.len(), 32);
        let again = load_or_create_key(dir.path()).unwrap();
        assert_eq!(first.0, again.0);
        // Racing runtimes agree on one key.
        let other = scratch();
        let keys: Vec<[u8; 32]> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| load_or_create_key(other.path()).unwrap().0))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(keys.windows(2).all(|w| w[0] == w[1]));
    }

    #[test]
    fn an_untrustworthy_key_is_replaced() {
        let dir = scratch();
        let path = dir.path().join(KEY_FILE);
        let original = load_or_create_key(dir.path()).unwrap().0;

        // Readable by others: whoever read it could forge entries.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let replaced = load_or_create_key(dir.path()).unwrap().0;
        assert_ne!(replaced, original);
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );

        // A symlink to a key file of someone's choosing.
        let planted = dir.path().join("planted");
        fs::write(&planted, [7u8; 32]).unwrap();
        fs::set_permissions(&planted, fs::Permissions::from_mode(0o600)).unwrap();
        fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(&planted, &path).unwrap();
        let key = load_or_create_key(dir.path()).unwrap().0;
        assert_ne!(key, [7u8; 32]);
        assert!(!fs::symlink_metadata(&path).unwrap().is_symlink());

        // The wrong length.
        fs::write(&path, [1u8; 31]).unwrap();
        assert_ne!(load_or_create_key(dir.path()).unwrap().0[..31], [1u8; 31]);
        assert_eq!(key_of(dir.path()).len(), 32);
    }

    #[test]
    fn a_key_owned_by_another_user_is_replaced() {
        // SAFETY: no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("not root: cannot give a file away, skipping");
            return;
        }
        let dir = scratch();
        let path = dir.path().join(KEY_FILE);
        fs::write(&path, [9u8; 32]).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::chown(&path, Some(4242), Some(4242)).unwrap();
        let key = load_or_create_key(dir.path()).unwrap().0;
        assert_ne!(key, [9u8; 32]);
        assert_eq!(fs::metadata(&path).unwrap().uid(), 0);
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
