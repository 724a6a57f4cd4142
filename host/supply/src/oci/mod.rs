//! Modules from OCI registries: `oci://REGISTRY/REPOSITORY@sha256:DIGEST`
//! (or, with `allowTags`, `oci://REGISTRY/REPOSITORY:TAG`).
//!
//! A module is an OCI artifact as the WebAssembly OCI artifact conventions
//! lay it out (what `wkg oci push` and `oras push` with those media types
//! make): an image manifest whose config is
//! `application/vnd.wasm.config.v0+json` and whose one layer is the
//! component, `application/wasm` ([`manifest`]).
//!
//! [`Puller::pull`] serves a digest-pinned reference from the pull cache
//! when its manifest and layer are there ([`cache`]), else fetches it: the
//! manifest, its signatures under `moduleSignatures` ([`signed`]), then the
//! layer. What each step verifies, and in which order: the crate docs.
//! Credentials come from `registryAuth` ([`auth`]); a refusal says whose
//! they were ([`errors`]).

mod auth;
mod bounded;
mod cache;
mod errors;
mod manifest;
mod signed;

use std::{fs, path::PathBuf};

use futures::StreamExt;
use oci_client::{
    Client, Reference,
    client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol},
    manifest::{OCI_IMAGE_INDEX_MEDIA_TYPE, OCI_IMAGE_MEDIA_TYPE},
};
use portwise_core::config::OciRef;

use crate::{
    content::{Content, sha256_hex},
    error::{PullError, SetupError, SignatureError},
    handoff::{OciConfig, Pulled},
    signatures::{self, PublicKey},
};
use auth::Auths;
use cache::PullCache;
use errors::{Failure, error_chain, explain};
use manifest::wasm_layer;
pub use manifest::{WASM_CONFIG_MEDIA_TYPE, WASM_LAYER_MEDIA_TYPE};

/// Pulls modules and keeps their cache.
pub struct Puller {
    client: Client,
    /// Manifests and indexes, read under a limit ([`bounded`]).
    http: bounded::Http,
    auths: Auths,
    cache: PullCache,
    max: u64,
    keys: Vec<PublicKey>,
}

impl Puller {
    /// A puller; `cache` is the directory for verified content (`None`:
    /// every start pulls).
    pub fn new(config: &OciConfig, cache: Option<PathBuf>) -> Result<Puller, SetupError> {
        // reqwest is built without a crypto provider of its own (no
        // aws-lc): ring, as the Kubernetes client uses.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let auths = match &config.auth_file {
            Some(path) => Auths::load(path)?,
            None => Auths::default(),
        };
        let ca = match &config.ca_file {
            Some(path) => Some(fs::read(path).map_err(|source| SetupError::CaRead {
                path: path.clone(),
                source,
            })?),
            None => None,
        };
        let extra_root_certificates = ca
            .iter()
            .map(|data| Certificate {
                encoding: CertificateEncoding::Pem,
                data: data.clone(),
            })
            .collect();
        let user_agent = concat!("portwise/", env!("CARGO_PKG_VERSION"));
        let http = bounded::Http::new(
            ca.as_deref(),
            config.connect_timeout,
            config.read_timeout,
            user_agent,
        )?;
        let keys = config
            .signature_keys
            .iter()
            .map(|path| {
                let name = path.display().to_string();
                let pem = fs::read(path).map_err(|source| SetupError::KeyRead {
                    name: name.clone(),
                    source,
                })?;
                PublicKey::from_pem(&name, &pem).map_err(SetupError::Key)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let client = Client::try_from(ClientConfig {
            protocol: ClientProtocol::Https,
            extra_root_certificates,
            // An artifact is one manifest: no platform to pick.
            platform_resolver: None,
            connect_timeout: Some(config.connect_timeout),
            read_timeout: Some(config.read_timeout),
            user_agent,
            ..ClientConfig::default()
        })
        .map_err(|e| SetupError::Client(Box::new(e)))?;
        Ok(Puller {
            client,
            http,
            auths,
            cache: PullCache {
                dir: cache,
                max: config.max_module_bytes,
            },
            max: config.max_module_bytes,
            keys,
        })
    }

    /// The module `r` names: from the cache when its digest is there, else
    /// from the registry (then cached).
    pub async fn pull(&self, r: &OciRef) -> Result<Pulled, PullError> {
        // What the cache holds but may not serve (unsigned under these keys).
        let mut not_served = None;
        if let Some(digest) = &r.digest {
            match self.cached(digest) {
                Ok(pulled) => return Ok(pulled),
                Err(why) => not_served = why,
            }
        }
        match self.fetch(r).await {
            Ok(pulled) => Ok(pulled),
            Err(Failure::Refused(why)) => Err(why),
            Err(Failure::Unreachable(why)) => {
                // A tag's last resolution, if the registry cannot answer.
                if r.digest.is_none()
                    && let Some(digest) = self.cache.tag(r)
                {
                    match self.cached(&digest) {
                        Ok(mut pulled) => {
                            pulled.fallback = Some(format!(
                                "{why}; serving sha256:{digest}, what the tag last pointed at"
                            ));
                            return Ok(pulled);
                        }
                        Err(why) => not_served = why,
                    }
                }
                Err(PullError::Unreachable {
                    why,
                    cached: not_served,
                })
            }
        }
    }

    async fn fetch(&self, r: &OciRef) -> Result<Pulled, Failure> {
        let reference: Reference = r
            .reference()
            .parse()
            .map_err(|e| Failure::refused(format!("not a valid reference: {e}")))?;
        let auth = self.auths.for_registry(&r.registry.to_ascii_lowercase());
        let manifest_bytes = self
            .manifest_bounded(&bounded::Read {
                r,
                auth: &auth,
                at: &reference,
                accept: &[OCI_IMAGE_MEDIA_TYPE, OCI_IMAGE_INDEX_MEDIA_TYPE],
                limit: bounded::MAX_MANIFEST_BYTES,
                doing: "fetching the manifest",
            })
            .await?
            .ok_or_else(|| {
                Failure::refused(format!(
                    "fetching the manifest: {} has no such artifact ({reference})",
                    r.registry
                ))
            })?;
        let digest = sha256_hex(&manifest_bytes);
        if let Some(pin) = &r.digest
            && *pin != digest
        {
            return Err(Failure::Refused(PullError::PinMismatch {
                expected: pin.clone(),
                actual: digest,
            }));
        }
        let layer = wasm_layer(&manifest_bytes).map_err(Failure::refused)?;
        let size = u64::try_from(layer.size).unwrap_or(u64::MAX);
        if size > self.max {
            return Err(Failure::refused(format!(
                "its layer is {size} bytes, over maxModuleBytes ({} bytes); not downloaded",
                self.max
            )));
        }
        let layer_hex = layer
            .digest
            .strip_prefix("sha256:")
            .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(|| {
                Failure::refused(format!(
                    "layer digest {:?} is not sha256:<64 hex digits>",
                    layer.digest
                ))
            })?
            .to_ascii_lowercase();
        let signed_by = match self.keys.is_empty() {
            true => None,
            false => {
                let keys = &self.keys;
                let found = self
                    .signatures(r, &auth, &digest, |e| {
                        signatures::verify(&digest, std::slice::from_ref(e), keys).is_ok()
                    })
                    .await?;
                let verified = signatures::verify(&digest, &found.evidence, keys)
                    .map_err(|why| Failure::Refused(found.refusal(why)))?;
                // What was fetched: every read of the cache verifies them
                // again anyway, against whichever keys that config names.
                self.cache.store_signatures(&digest, &found.evidence, r);
                Some(verified)
            }
        };
        let bytes = self.fetch_blob(r, &reference, &layer, &layer_hex).await?;
        let source = self
            .cache
            .store(&digest, &manifest_bytes, &layer_hex, &bytes, r);
        Ok(Pulled {
            content: Content {
                source: source.unwrap_or_else(|| PathBuf::from(r.to_string())),
                bytes,
                // What fetch_blob checked the bytes against.
                sha256: layer_hex,
            },
            manifest: digest,
            cached: false,
            fallback: None,
            signed_by,
        })
    }

    /// The layer, refusing (and stopping the download) past the cap.
    async fn fetch_blob(
        &self,
        r: &OciRef,
        reference: &Reference,
        layer: &oci_client::manifest::OciDescriptor,
        layer_hex: &str,
    ) -> Result<Vec<u8>, Failure> {
        let mut blob = self
            .client
            .pull_blob_stream(reference, layer)
            .await
            .map_err(|e| explain(&self.auths, r, "fetching the layer", e))?;
        if let Some(len) = blob.content_length
            && len > self.max
        {
            return Err(Failure::refused(format!(
                "the registry sends {len} bytes for the layer, over maxModuleBytes ({} bytes); \
                 not downloaded",
                self.max
            )));
        }
        let mut bytes = Vec::with_capacity(usize::try_from(layer.size.max(0)).unwrap_or(0));
        while let Some(chunk) = blob.stream.next().await {
            let chunk = chunk.map_err(|e| {
                let text = error_chain(&e);
                // oci-client checks the digest as the stream ends.
                if text.to_ascii_lowercase().contains("digest") {
                    Failure::refused(format!(
                        "the layer's content does not match the sha256:{layer_hex} its manifest names: {text}"
                    ))
                } else {
                    Failure::Unreachable(format!(
                        "the layer's download from {} failed: {text}",
                        r.registry
                    ))
                }
            })?;
            if (bytes.len() + chunk.len()) as u64 > self.max {
                return Err(Failure::refused(format!(
                    "the layer is more than maxModuleBytes ({} bytes); download stopped",
                    self.max
                )));
            }
            bytes.extend_from_slice(&chunk);
        }
        let got = sha256_hex(&bytes);
        if got != layer_hex {
            return Err(Failure::Refused(PullError::LayerMismatch {
                expected: layer_hex.to_string(),
                actual: got,
            }));
        }
        Ok(bytes)
    }

    /// A digest's manifest and layer from the cache, both re-verified, and
    /// under `moduleSignatures` their signatures too. `Err(None)` is a miss;
    /// `Err(Some(why))` is content that is there but not signed by a
    /// configured key (the registry may have that signature: it is asked).
    fn cached(&self, digest: &str) -> Result<Pulled, Option<SignatureError>> {
        let content = self.cache.content(digest).ok_or(None)?;
        let signed_by = match self.keys.is_empty() {
            true => None,
            false => {
                let evidence = self.cache.signatures(digest).unwrap_or_default();
                match signatures::verify(digest, &evidence, &self.keys) {
                    Ok(v) => Some(v),
                    Err(why) => {
                        tracing::info!(
                            manifest = digest,
                            "cached module not served: {why}; asking the registry"
                        );
                        return Err(Some(why));
                    }
                }
            }
        };
        Ok(Pulled {
            content,
            manifest: digest.to_string(),
            cached: true,
            fallback: None,
            signed_by,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use manifest::test_manifest as manifest;

    /// A puller caching in a fresh directory, and a module to cache: (the
    /// directory, the puller, the layer, its digest, the manifest, its digest).
    fn cached_module() -> (tempfile::TempDir, Puller, Vec<u8>, String, Vec<u8>, String) {
        let dir = tempfile::tempdir().unwrap();
        let puller = Puller::new(&OciConfig::default(), Some(dir.path().to_path_buf())).unwrap();
        let wasm = b"\0asm\x0d\0\x01\0component".to_vec();
        let layer_hex = sha256_hex(&wasm);
        let m = manifest(&[(WASM_LAYER_MEDIA_TYPE, &format!("sha256:{layer_hex}"))]);
        let digest = sha256_hex(&m);
        (dir, puller, wasm, layer_hex, m, digest)
    }

    #[test]
    fn the_cache_serves_only_verified_content() {
        let (dir, puller, wasm, layer_hex, m, digest) = cached_module();
        let r = OciRef::parse(&format!("oci://r.example/x@sha256:{digest}")).unwrap();
        assert!(puller.cached(&digest).is_err());
        puller
            .cache
            .store(&digest, &m, &layer_hex, &wasm, &r)
            .unwrap();
        let hit = puller.cached(&digest).unwrap();
        assert_eq!(hit.content.bytes, wasm);
        assert_eq!(hit.content.sha256, layer_hex);
        assert!(hit.cached);
        // A damaged layer is a miss.
        fs::write(dir.path().join("blobs").join(&layer_hex), b"\0asm tampered").unwrap();
        assert!(puller.cached(&digest).is_err());
    }

    /// Issue 24: the tag cache decides which digest runs when the registry
    /// is away, so an entry planted by another writer of the cache volume
    /// (no key) is refused; the entry portwise wrote is served.
    #[test]
    fn a_planted_tag_entry_is_refused() {
        let (dir, puller, wasm, layer_hex, m, digest) = cached_module();
        let tagged = OciRef::parse("oci://r.example/x:v1").unwrap();
        assert_eq!(puller.cache.tag(&tagged), None);
        puller
            .cache
            .store(&digest, &m, &layer_hex, &wasm, &tagged)
            .unwrap();
        assert_eq!(puller.cache.tag(&tagged), Some(digest.clone()));

        // Another writer replaces every tag entry with its own digest, in
        // the old plain format and sealed with a key of its own.
        let planted = "ab".repeat(32);
        let tags = dir.path().join("tags");
        for entry in fs::read_dir(&tags).unwrap() {
            let path = entry.unwrap().path();
            if path.file_name().unwrap().to_string_lossy().starts_with('.') {
                continue;
            }
            let mut forged = planted.as_bytes().to_vec();
            forged.extend_from_slice(&[0u8; 32]);
            forged.extend_from_slice(b"pwseal01");
            fs::write(&path, &forged).unwrap();
            let plain = path.with_file_name(sha256_hex(b"r.example/x:v1"));
            fs::write(plain, planted.as_bytes()).unwrap();
        }
        assert_eq!(
            puller.cache.tag(&tagged),
            None,
            "a planted tag entry was believed"
        );
    }

    /// Issue 45: the pull cache followed symlinks, blocked on a FIFO and
    /// read files whole. A symlinked manifest or a FIFO for a layer is now
    /// a miss (logged with its path), at once.
    #[test]
    fn the_pull_cache_neither_follows_symlinks_nor_blocks_on_a_fifo() {
        use crate::regular_file::tests::{mkfifo, within_5s};
        let (dir, puller, wasm, layer_hex, m, digest) = cached_module();
        let r = OciRef::parse(&format!("oci://r.example/x@sha256:{digest}")).unwrap();
        puller
            .cache
            .store(&digest, &m, &layer_hex, &wasm, &r)
            .unwrap();
        let puller = std::sync::Arc::new(puller);
        let cached = |puller: &std::sync::Arc<Puller>| {
            let (p, d) = (puller.clone(), digest.clone());
            within_5s(move || p.cached(&d).is_ok())
        };
        assert!(cached(&puller));

        // The manifest, moved elsewhere and linked to: the bytes are right,
        // but the link could point anywhere.
        let manifest = dir.path().join("manifests").join(&digest);
        let elsewhere = dir.path().join("elsewhere");
        fs::rename(&manifest, &elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &manifest).unwrap();
        assert!(!cached(&puller), "served through a symlink");
        fs::remove_file(&manifest).unwrap();
        fs::rename(&elsewhere, &manifest).unwrap();
        assert!(cached(&puller));

        let blob = dir.path().join("blobs").join(&layer_hex);
        fs::remove_file(&blob).unwrap();
        mkfifo(&blob);
        assert!(!cached(&puller), "a FIFO was served");

        // Kept signatures past their bound are not read.
        let signatures = dir.path().join("signatures");
        fs::create_dir_all(&signatures).unwrap();
        let big = fs::File::create(signatures.join(&digest)).unwrap();
        big.set_len(super::cache::MAX_SIGNATURES_FILE_BYTES + 1)
            .unwrap();
        assert_eq!(puller.cache.signatures(&digest), None);
    }
}
