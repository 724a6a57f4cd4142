//! The sealed store: compiled code on disk, so a restart does not
//! recompile. It holds opaque bytes (the runtime's serialised artifacts)
//! and never runs them; what it guarantees is that bytes it hands back are
//! bytes this store wrote, for this module and this engine.
//!
//! An entry is keyed by the module's content hash plus the engine
//! fingerprint (target, compiler settings, wasmtime version, computed by the
//! runtime): an artifact only ever loads into an engine that could have
//! produced it. Entries are written to a temporary file and renamed into
//! place, so a crash never leaves half an entry under a real name.
//!
//! ```text
//! entry = artifact ‖ tag (32 bytes) ‖ SEAL_MAGIC (8 bytes)
//! tag   = HMAC-SHA256(key, SEAL_DOMAIN ‖ module sha256 ‖ 0 ‖ engine fingerprint ‖ 0 ‖ artifact)
//! ```
//!
//! The tag is ring's HMAC-SHA256 (`ring::hmac`), verified with
//! `hmac::verify` (constant time).
//!
//! The key is 32 random bytes in [`KEY_FILE`] in the cache directory,
//! created with mode 0600 by the first runtime that uses the directory. It
//! is trusted only if it is a regular file (not a symlink), owned by our
//! effective uid, with no group or other permission bits, and 32 bytes long;
//! otherwise it is replaced, which invalidates every entry. An entry is read
//! into memory and verified there, and that same memory is handed back (not
//! a mapping of the file), so what was verified is what the runtime loads.
//! Whom this protects against, and whom not: the crate docs.
//!
//! A rejected entry is a cache miss: the runtime compiles the module again
//! and writes the entry anew (atomically); the rejection is logged with the
//! file name and counted ([`CodeCacheStats::rejected`]).

use std::{
    fs,
    io::{self, Write},
    os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::{
        OnceLock,
        atomic::{AtomicU64, Ordering},
    },
};

use ring::hmac;

use crate::regular_file::{FileError, open_regular, read_limited, read_regular_file_into};

/// What the compiled-code cache of a runtime did since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CodeCacheStats {
    /// Entries that verified and loaded (no compile).
    pub hits: u64,
    /// Loads that found no entry (compiled, entry written).
    pub misses: u64,
    /// Entries that were present but failed verification (missing or wrong
    /// seal, truncated, unreadable) or that the runtime refused (wasmtime
    /// would not load them): compiled instead and rewritten.
    pub rejected: u64,
}

/// The key file in the cache directory (see the module docs).
pub const KEY_FILE: &str = ".portwise-cache-key";
/// Ends every sealed entry.
pub const SEAL_MAGIC: &[u8; 8] = b"pwseal01";
/// Starts every tagged message, so the key can never authenticate anything
/// but a cache entry.
const SEAL_DOMAIN: &[u8] = b"portwise-wasm compiled-code cache entry v1\0";
const TAG_LEN: usize = 32;
/// What sealing adds after the artifact: the tag and [`SEAL_MAGIC`].
pub const SEAL_TRAILER_LEN: usize = TAG_LEN + SEAL_MAGIC.len();
/// Entries larger than this are not read (the compiled 18 MB Python guest is
/// 35 MB).
const MAX_ENTRY_BYTES: u64 = 1 << 30;

/// The cache key; never printed.
struct Key([u8; 32]);

impl Key {
    fn hmac(&self) -> hmac::Key {
        hmac::Key::new(hmac::HMAC_SHA256, &self.0)
    }
}

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

/// Sealed entries in one directory, for one engine fingerprint.
#[derive(Debug)]
pub struct SealedStore {
    dir: PathBuf,
    fingerprint: String,
    /// Read (or created) on first use; `None` if the directory cannot hold
    /// a trustworthy key, and then the store is off.
    key: OnceLock<Option<Key>>,
    counters: Counters,
}

/// What [`SealedStore::read`] found for a module.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The directory cannot hold a trustworthy key: no entry is read or
    /// written, nothing is counted.
    Off,
    /// No entry (counted as a miss): compile, then [`SealedStore::write`].
    Miss,
    /// An entry whose seal verifies: its artifact. Report what became of it
    /// with [`SealedStore::hit`] or [`SealedStore::reject`].
    Verified(Vec<u8>),
    /// An entry that does not verify, and why; already counted, logged and
    /// removed. Compile, then [`SealedStore::write`].
    Rejected(SealError),
}

/// Why an entry of the sealed store is not used ([`Lookup::Rejected`]).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// The entry is not a regular file within the size limit (the message
    /// names the path).
    #[error("{0}")]
    File(#[source] FileError),
    /// Too short for a seal, or without the trailer's magic.
    #[error("no seal ({len} bytes; truncated, or not written by this version)")]
    NoSeal { len: usize },
    #[error("seal does not verify (corrupt, truncated, or written with another key)")]
    Mismatch,
}

impl SealedStore {
    /// The store in `dir` for artifacts of the engine with `fingerprint`
    /// (hex, at least 16 digits).
    pub fn new(dir: PathBuf, fingerprint: String) -> Self {
        SealedStore {
            dir,
            fingerprint,
            key: OnceLock::new(),
            counters: Counters::default(),
        }
    }

    /// Where the entry for module `sha256` lives.
    pub fn path(&self, sha256: &str) -> PathBuf {
        // 16 hex digits of the engine fingerprint keep names short; the seal
        // covers the full one. `.sealed` keeps these apart from the unsealed
        // entries of older versions sharing a directory.
        self.dir
            .join(format!("{sha256}-{}.sealed.cwasm", &self.fingerprint[..16]))
    }

    pub fn stats(&self) -> CodeCacheStats {
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

    /// The entry for module `sha256`, verified.
    pub fn read(&self, sha256: &str) -> Lookup {
        let Some(key) = self.key() else {
            return Lookup::Off;
        };
        match self.read_verified(key, sha256, &self.path(sha256)) {
            Ok(None) => {
                self.counters.misses.fetch_add(1, Ordering::Relaxed);
                Lookup::Miss
            }
            Ok(Some(artifact)) => Lookup::Verified(artifact),
            Err(why) => {
                self.reject(sha256, &why.to_string());
                Lookup::Rejected(why)
            }
        }
    }

    /// The artifact [`SealedStore::read`] verified was loaded.
    pub fn hit(&self) {
        self.counters.hits.fetch_add(1, Ordering::Relaxed);
    }

    /// The entry for module `sha256` is not used, because of `why`:
    /// counted, logged and removed (the runtime compiles and writes anew).
    pub fn reject(&self, sha256: &str, why: &str) {
        let path = self.path(sha256);
        self.counters.rejected.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            path = %path.display(),
            "compiled-code cache entry rejected, recompiling: {why}"
        );
        let _ = fs::remove_file(&path);
    }

    /// Removes the entry for module `sha256`, if there is one (a module no
    /// longer loaded: its entry would only take space).
    pub fn remove(&self, sha256: &str) {
        let path = self.path(sha256);
        match fs::remove_file(&path) {
            Ok(()) => tracing::debug!(path = %path.display(), "compiled-code cache entry removed"),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(
                path = %path.display(),
                "cannot remove compiled-code cache entry: {e}"
            ),
        }
    }

    /// Seals `artifact` for module `sha256` and writes it, atomically. A
    /// failure is logged: it only costs the next start a compile.
    pub fn write(&self, sha256: &str, artifact: &[u8]) {
        let Some(key) = self.key() else { return };
        let tag = seal(key, sha256, &self.fingerprint, artifact);
        if let Err(e) = self.store(&self.path(sha256), &[artifact, &tag, SEAL_MAGIC]) {
            tracing::warn!(dir = %self.dir.display(), "cannot write compiled-code cache: {e}");
        }
    }

    /// The artifact of the entry at `path` if there is one and its seal
    /// verifies; `Ok(None)` if there is none; why not otherwise.
    fn read_verified(
        &self,
        key: &Key,
        sha256: &str,
        path: &Path,
    ) -> Result<Option<Vec<u8>>, SealError> {
        // The entry is read after the rest of the tagged message, so the
        // whole message is one slice for `hmac::verify`.
        let mut bytes = sealed_prefix(sha256, &self.fingerprint);
        let prefix_len = bytes.len();
        match read_regular_file_into(path, MAX_ENTRY_BYTES, &mut bytes) {
            Ok(()) => {}
            Err(FileError::Missing) => return Ok(None),
            Err(e @ FileError::Refused(_)) => return Err(SealError::File(e)),
        }
        let entry_len = bytes.len() - prefix_len;
        if entry_len < SEAL_TRAILER_LEN || !bytes.ends_with(SEAL_MAGIC) {
            return Err(SealError::NoSeal { len: entry_len });
        }
        let message_len = bytes.len() - SEAL_TRAILER_LEN;
        let (message, trailer) = bytes.split_at(message_len);
        if hmac::verify(&key.hmac(), message, &trailer[..TAG_LEN]).is_err() {
            return Err(SealError::Mismatch);
        }
        bytes.truncate(message_len);
        bytes.drain(..prefix_len);
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
    // SAFETY: geteuid has no preconditions and cannot fail.
    read_key_as(path, unsafe { libc::geteuid() })
}

/// [`read_key`] for a process whose effective uid is `euid`.
fn read_key_as(path: &Path, euid: u32) -> Result<Option<Key>, String> {
    let (mut file, meta) = match open_regular(path) {
        Ok(opened) => opened,
        Err(FileError::Missing) => return Ok(None),
        Err(FileError::Refused(why)) => return Err(why),
    };
    if meta.uid() != euid {
        return Err(format!("owned by uid {}, not {euid}", meta.uid()));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!("mode {mode:03o}, not 600"));
    }
    let mut bytes = Vec::with_capacity(32);
    read_limited(path, &mut file, 32, &mut bytes)
        .map_err(|e| e.to_string())
        .and_then(|()| {
            <[u8; 32]>::try_from(bytes.as_slice())
                .map_err(|_| format!("{} bytes, not 32", bytes.len()))
        })
        .map(|key| Some(Key(key)))
}

/// What the tag covers before the artifact: SEAL_DOMAIN ‖ module sha256 ‖ 0
/// ‖ engine fingerprint ‖ 0.
fn sealed_prefix(sha256: &str, fingerprint: &str) -> Vec<u8> {
    [
        SEAL_DOMAIN,
        sha256.as_bytes(),
        b"\0",
        fingerprint.as_bytes(),
        b"\0",
    ]
    .concat()
}

/// The tag of an entry (ring's HMAC-SHA256, the message in two parts so
/// the artifact is not copied).
fn seal(key: &Key, sha256: &str, fingerprint: &str, artifact: &[u8]) -> [u8; TAG_LEN] {
    let mut context = hmac::Context::with_key(&key.hmac());
    context.update(&sealed_prefix(sha256, fingerprint));
    context.update(artifact);
    context
        .sign()
        .as_ref()
        .try_into()
        .expect("HMAC-SHA256 tags are 32 bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "0000000000000000000000000000000000000000000000000000000000000001";

    fn scratch() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    fn store(dir: &Path) -> SealedStore {
        SealedStore::new(dir.to_path_buf(), "f".repeat(64))
    }

    fn key_of(dir: &Path) -> Vec<u8> {
        fs::read(dir.join(KEY_FILE)).unwrap()
    }

    #[test]
    fn hmac_matches_rfc_4231() {
        let tag = |key: &[u8], parts: &[&[u8]]| {
            let mut context = hmac::Context::with_key(&hmac::Key::new(hmac::HMAC_SHA256, key));
            parts.iter().for_each(|p| context.update(p));
            hex::encode(context.sign())
        };
        // Test case 1.
        assert_eq!(
            tag(&[0x0b; 20], &[b"Hi There"]),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        );
        // Test case 2, the message in two parts.
        assert_eq!(
            tag(b"Jefe", &[b"what do ya want ", b"for nothing?"]),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // Test case 6: a key longer than the block is hashed first.
        assert_eq!(
            tag(
                &[0xaa; 131],
                &[b"Test Using Larger Than Block-Size Key - Hash Key First"]
            ),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn the_seal_format_is_unchanged() {
        // HMAC-SHA256 under key [7; 32] of SEAL_DOMAIN ‖ SHA ‖ 0 ‖ "f" * 64
        // ‖ 0 ‖ "artifact bytes", as any HMAC implementation computes it
        // (Python's hmac here): entries written before stay valid.
        let tag = seal(&Key([7; 32]), SHA, &"f".repeat(64), b"artifact bytes");
        assert_eq!(
            hex::encode(tag),
            "b0cc89a9ed576063160fb63bb33f3b6284d6126af70fbba76c196ffc43238f8a"
        );
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
    fn a_key_owned_by_another_user_is_not_trusted() {
        // Whatever uid runs this: the check is against the uid passed in,
        // one that does not own the file.
        let dir = scratch();
        let path = dir.path().join(KEY_FILE);
        fs::write(&path, [9u8; 32]).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        let owner = fs::metadata(&path).unwrap().uid();
        let other = owner.wrapping_add(4242);
        let why = read_key_as(&path, other).unwrap_err();
        assert_eq!(why, format!("owned by uid {owner}, not {other}"));
        // Its owner trusts it.
        assert_eq!(read_key_as(&path, owner).unwrap().unwrap().0, [9u8; 32]);
    }

    #[test]
    fn a_key_owned_by_another_user_is_replaced() {
        // SAFETY: no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("not root: cannot give a file away (the check itself: above)");
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
    fn opaque_entries_round_trip_and_damaged_ones_are_rejected_and_removed() {
        let dir = scratch();
        let s = store(dir.path());
        assert_eq!(s.read(SHA), Lookup::Miss);
        s.write(SHA, b"artifact bytes");
        let entry = fs::read(s.path(SHA)).unwrap();
        assert_eq!(entry.len(), b"artifact bytes".len() + SEAL_TRAILER_LEN);
        assert!(entry.ends_with(SEAL_MAGIC));
        assert_eq!(s.read(SHA), Lookup::Verified(b"artifact bytes".to_vec()));
        s.hit();
        // The seal covers the module: another module's name does not verify.
        let other = "0000000000000000000000000000000000000000000000000000000000000002";
        fs::copy(s.path(SHA), s.path(other)).unwrap();
        assert_eq!(s.read(other), Lookup::Rejected(SealError::Mismatch));
        assert!(!s.path(other).exists());
        // And the engine: another fingerprint's store does not verify it.
        let elsewhere = SealedStore::new(dir.path().to_path_buf(), "e".repeat(64));
        fs::copy(s.path(SHA), elsewhere.path(SHA)).unwrap();
        assert!(matches!(elsewhere.read(SHA), Lookup::Rejected(_)));
        // Refused by the runtime: counted and removed.
        s.reject(SHA, "wasmtime refuses it");
        assert!(!s.path(SHA).exists());
        assert_eq!(
            s.stats(),
            CodeCacheStats {
                hits: 1,
                misses: 1,
                rejected: 2
            }
        );
        // A directory that cannot hold a key: off, nothing counted.
        let file = dir.path().join("not-a-directory");
        fs::write(&file, b"").unwrap();
        let off = store(&file);
        assert_eq!(off.read(SHA), Lookup::Off);
        off.write(SHA, b"x");
        assert_eq!(off.stats(), CodeCacheStats::default());
    }

    /// Issue 45: a FIFO in place of an entry or of the key blocked the
    /// open (no `O_NONBLOCK`); an oversized entry was refused without
    /// naming it.
    #[test]
    fn a_fifo_or_an_oversized_file_in_the_store_is_refused_without_blocking() {
        use crate::regular_file::tests::{mkfifo, within_5s};
        let dir = scratch();
        let path = dir.path().to_path_buf();
        store(&path).write(SHA, b"artifact bytes");
        let entry = store(&path).path(SHA);

        fs::remove_file(&entry).unwrap();
        mkfifo(&entry);
        let p = path.clone();
        let lookup = within_5s(move || store(&p).read(SHA));
        assert!(
            matches!(&lookup, Lookup::Rejected(SealError::File(FileError::Refused(why)))
                if why.contains(&entry.display().to_string()) && why.contains("a FIFO")),
            "{lookup:?}"
        );
        assert!(!entry.exists(), "the FIFO was not removed");

        // Sparse: past the limit without taking the space.
        let big = fs::File::create(&entry).unwrap();
        big.set_len(MAX_ENTRY_BYTES + 1).unwrap();
        let p = path.clone();
        let lookup = within_5s(move || store(&p).read(SHA));
        assert!(
            matches!(&lookup, Lookup::Rejected(SealError::File(FileError::Refused(why)))
                if why.contains(&entry.display().to_string()) && why.contains("over the limit")),
            "{lookup:?}"
        );

        // The key: replaced, not waited on.
        let key = path.join(KEY_FILE);
        fs::remove_file(&key).unwrap();
        mkfifo(&key);
        let p = path.clone();
        within_5s(move || store(&p).write(SHA, b"artifact bytes"));
        assert!(fs::symlink_metadata(&key).unwrap().is_file());
        assert_eq!(key_of(&path).len(), 32);
        assert_eq!(
            store(&path).read(SHA),
            Lookup::Verified(b"artifact bytes".to_vec())
        );
    }
}
