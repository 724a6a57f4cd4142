//! The pull cache: verified content of pulled modules, keyed by digest,
//! under the cache directory's `oci/` (layout: [`crate::cache_dir`]).
//!
//! Every read re-hashes what it read, so a damaged or planted entry is a
//! miss, not a module. The signatures found for a manifest are kept beside
//! it (they are verified again whenever the cache serves), and a tag's last
//! resolution in `tags/` (the tag cache, served only when the registry
//! cannot be reached). A tag entry says which digest runs, so unlike the
//! content it cannot be checked against itself: it is sealed like the
//! compiled-code cache ([`crate::sealed`], a key of its own in `tags/`), and
//! a writer of the cache volume without that key cannot plant one. Writes
//! are atomic (a temporary file renamed into place); a failure to write only
//! costs the next start a pull.

use std::{
    fs,
    io::Write,
    path::{Path, PathBuf},
};

use portwise_core::config::OciRef;

use super::{bounded::MAX_MANIFEST_BYTES, manifest::wasm_layer, signed::SIGNATURE_BUDGET_BYTES};
use crate::{
    content::{Content, sha256_hex},
    regular_file::{FileError, read_regular_file},
    sealed::{Lookup, SealedStore},
    signatures::Evidence,
};

/// What the tag cache's seals are made for, in place of an engine
/// fingerprint: a tag entry can never pass for anything else.
const TAG_SEAL_PURPOSE: &str = "0000000000000000portwise-oci-tag-cache-v1";

/// The signatures kept for a manifest: at most the search's budget of
/// them, base64 in JSON.
pub(super) const MAX_SIGNATURES_FILE_BYTES: u64 = 2 * SIGNATURE_BUDGET_BYTES;

/// The pull cache in one directory (`None`: nothing is cached).
pub(super) struct PullCache {
    pub(super) dir: Option<PathBuf>,
    /// The largest layer served (`maxModuleBytes`).
    pub(super) max: u64,
}

impl PullCache {
    /// The signatures kept for manifest `digest` (not verified here).
    pub(super) fn signatures(&self, digest: &str) -> Option<Vec<Evidence>> {
        let text = read(
            &self.dir("signatures")?.join(digest),
            MAX_SIGNATURES_FILE_BYTES,
        )?;
        serde_json::from_slice(&text).ok()
    }

    /// Keeps the module's signatures, for offline restarts.
    pub(super) fn store_signatures(&self, digest: &str, evidence: &[Evidence], r: &OciRef) {
        let Some(dir) = self.dir("signatures") else {
            return;
        };
        let text = serde_json::to_vec(evidence).expect("evidence serializes");
        if let Err(e) = write_atomic(&dir.join(digest), &text) {
            tracing::warn!(module = %r, "cannot cache the module's signatures: {e}");
        }
    }

    fn dir(&self, kind: &str) -> Option<PathBuf> {
        self.dir.as_ref().map(|c| c.join(kind))
    }

    /// The cached layer of manifest `digest`, re-hashed; its source is
    /// its path.
    pub(super) fn content(&self, digest: &str) -> Option<Content> {
        let manifest_path = self.dir("manifests")?.join(digest);
        let manifest = read(&manifest_path, MAX_MANIFEST_BYTES)?;
        if sha256_hex(&manifest) != digest {
            tracing::warn!(path = %manifest_path.display(), "cached manifest does not match its digest; pulling again");
            return None;
        }
        let layer = wasm_layer(&manifest).ok()?;
        let layer_hex = layer.digest.strip_prefix("sha256:")?.to_ascii_lowercase();
        let blob_path = self.dir("blobs")?.join(&layer_hex);
        let bytes = read(&blob_path, self.max)?;
        if sha256_hex(&bytes) != layer_hex {
            tracing::warn!(path = %blob_path.display(), "cached layer does not match its digest; pulling again");
            return None;
        }
        Some(Content {
            source: blob_path,
            bytes,
            sha256: layer_hex,
        })
    }

    /// The sealed tag store and the entry name of `r`'s tag.
    fn tag_entry(&self, r: &OciRef) -> Option<(SealedStore, String)> {
        let tag = r.tag.as_deref()?;
        let key = format!("{}/{}:{tag}", r.registry.to_ascii_lowercase(), r.repository);
        let store = SealedStore::new(self.dir("tags")?, TAG_SEAL_PURPOSE.to_string());
        Some((store, sha256_hex(key.as_bytes())))
    }

    /// What the tag of `r` pointed at when last resolved: the tag cache.
    /// Only an entry whose seal verifies is believed.
    pub(super) fn tag(&self, r: &OciRef) -> Option<String> {
        let (store, name) = self.tag_entry(r)?;
        match store.read(&name) {
            Lookup::Verified(bytes) => {
                let digest = String::from_utf8(bytes).ok()?;
                (digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()))
                    .then_some(digest)
            }
            Lookup::Rejected(why) => {
                tracing::warn!(module = %r, "the tag cache's entry is not trusted: {why}");
                None
            }
            Lookup::Off | Lookup::Miss => None,
        }
    }

    /// Caches verified content; returns the layer's path. Failures to write
    /// only cost the next start a pull.
    pub(super) fn store(
        &self,
        digest: &str,
        manifest: &[u8],
        layer_hex: &str,
        bytes: &[u8],
        r: &OciRef,
    ) -> Option<PathBuf> {
        let blob = self.dir("blobs")?.join(layer_hex);
        let write = || -> std::io::Result<()> {
            write_atomic(&blob, bytes)?;
            write_atomic(&self.dir("manifests").unwrap().join(digest), manifest)?;
            if r.digest.is_none()
                && let Some((store, name)) = self.tag_entry(r)
            {
                store.write(&name, digest.as_bytes());
            }
            Ok(())
        };
        match write() {
            Ok(()) => Some(blob),
            Err(e) => {
                tracing::warn!(module = %r, "cannot cache the pulled module: {e}");
                None
            }
        }
    }
}

/// The cached file at `path`, at most `limit` bytes, never through a
/// symlink nor blocking on a FIFO: anything else is a miss (logged when
/// something is there).
fn read(path: &Path, limit: u64) -> Option<Vec<u8>> {
    match read_regular_file(path, limit) {
        Ok(bytes) => Some(bytes),
        Err(FileError::Missing) => None,
        Err(FileError::Refused(why)) => {
            tracing::warn!("pull cache entry not used, pulling again: {why}");
            None
        }
    }
}

fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().expect("cache paths have a parent");
    fs::create_dir_all(dir)?;
    let mut tmp = tempfile_in(dir)?;
    tmp.1.write_all(bytes)?;
    tmp.1.sync_all()?;
    fs::rename(&tmp.0, path)
}

fn tempfile_in(dir: &Path) -> std::io::Result<(PathBuf, fs::File)> {
    let mut suffix = [0u8; 8];
    getrandom::fill(&mut suffix).map_err(|e| std::io::Error::other(e.to_string()))?;
    let path = dir.join(format!(".tmp-{}", hex::encode(suffix)));
    let file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)?;
    Ok((path, file))
}
