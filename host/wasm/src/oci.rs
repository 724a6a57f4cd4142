//! Modules from OCI registries: `oci://REGISTRY/REPOSITORY@sha256:DIGEST`.
//!
//! A module is an OCI artifact as the WebAssembly OCI artifact conventions
//! lay it out (what `wkg oci push` and `oras push` with those media types
//! make): an image manifest whose config is
//! `application/vnd.wasm.config.v0+json` and whose one layer is the
//! component, `application/wasm`.
//!
//! What a pull checks, in order:
//! - the manifest's sha256 against the reference's digest (the pin);
//! - the manifest's shape (one `application/wasm` layer);
//! - the layer's size, from the manifest, against `maxModuleBytes`, before
//!   the blob is requested; then the blob's `Content-Length`, and the bytes
//!   as they stream in: past the cap the download stops;
//! - the blob's sha256 against the manifest's layer digest.
//!
//! With `moduleSignatures`, a cosign signature of the manifest by one of the
//! configured keys is required too ([`crate::signatures`]); it is looked
//! for after the pin is checked and before the layer is downloaded, so an
//! unsigned module costs no download. The signatures found are
//! cached beside the manifest (`oci/signatures/<sha256>`) and verified
//! again, against the keys of the config being loaded, whenever the cache
//! serves: a key removed from the config stops a cached module too, and a
//! signed module restarts with the registry down.
//!
//! Verified content is cached on disk under the code cache's directory,
//! keyed by digest: `oci/manifests/<sha256>`, `oci/blobs/<sha256>`. Every
//! read re-hashes what it read, so a damaged or planted entry is a miss, not
//! a module. A digest-pinned reference whose manifest and layer are cached
//! is served without asking the registry at all (content addressed: the
//! registry could only say the same thing), so a restart works with the
//! registry down. A tag (`allowTags`) is resolved at every start; its last
//! resolution is kept in `oci/tags/`, served when the registry cannot be
//! reached.

use std::{
    collections::HashMap,
    fs,
    io::Write,
    path::{Path, PathBuf},
    time::Duration,
};

use futures::StreamExt;
use oci_client::{
    Client, Reference,
    client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol},
    errors::OciDistributionError,
    manifest::{OCI_IMAGE_INDEX_MEDIA_TYPE, OCI_IMAGE_MEDIA_TYPE, OciImageManifest},
    secrets::RegistryAuth,
};
use portwise_core::config::OciRef;

use crate::{
    modules::sha256_hex,
    signatures::{
        self, BUNDLE_MEDIA_TYPE, Evidence, PublicKey, SIGNATURE_ANNOTATION,
        SIMPLE_SIGNING_MEDIA_TYPE,
    },
};

/// A signature manifest or blob larger than this is not a cosign signature.
const MAX_SIGNATURE_BYTES: u64 = 1 << 20;
/// Signatures looked at per module, at most (each is a download).
const MAX_SIGNATURES: usize = 16;
/// What a registry may answer for an image manifest (Docker's schema 2 for
/// signatures pushed by older tools).
const DOCKER_MANIFEST_MEDIA_TYPE: &str = "application/vnd.docker.distribution.manifest.v2+json";

/// The config media type of a WebAssembly OCI artifact.
pub const WASM_CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
/// The layer media type of a WebAssembly OCI artifact: the component.
pub const WASM_LAYER_MEDIA_TYPE: &str = "application/wasm";
/// The layer type of the older `wasm-to-oci` convention, also accepted.
const LEGACY_WASM_LAYER_MEDIA_TYPE: &str = "application/vnd.wasm.content.layer.v1+wasm";

/// How `oci://` modules are pulled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OciConfig {
    /// A Docker config JSON (`{"auths": {"REGISTRY": {"auth": ...}}}`).
    pub auth_file: Option<PathBuf>,
    /// PEM certificates trusted besides the system's roots.
    pub ca_file: Option<PathBuf>,
    /// The largest module accepted.
    pub max_module_bytes: u64,
    /// Connecting to a registry gives up after this long.
    pub connect_timeout: Duration,
    /// A registry that sends nothing for this long has failed the pull.
    pub read_timeout: Duration,
    /// `moduleSignatures.keys`: PEM public keys; when not empty, a module
    /// without a valid signature by one of them is refused.
    pub signature_keys: Vec<PathBuf>,
}

impl Default for OciConfig {
    fn default() -> Self {
        OciConfig {
            auth_file: None,
            ca_file: None,
            max_module_bytes: portwise_core::config::DEFAULT_MAX_MODULE_BYTES,
            connect_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(30),
            signature_keys: Vec::new(),
        }
    }
}

/// A pulled (or cached) module: the component's bytes and where they came
/// from.
#[derive(Debug)]
pub(crate) struct Pulled {
    pub bytes: Vec<u8>,
    /// The manifest's digest, 64 hex digits.
    pub manifest: String,
    /// Where the layer is cached (the module's `source`), or the reference.
    pub source: PathBuf,
    /// Served from the cache without asking the registry.
    pub cached: bool,
    /// Why the registry was not used although it should have been (a tag
    /// served from its last resolution).
    pub fallback: Option<String>,
    /// The key (and signature) that verified it, under `moduleSignatures`.
    pub signed_by: Option<signatures::Verified>,
}

/// Credentials per registry, from a Docker config JSON.
#[derive(Default)]
struct Auths {
    file: Option<PathBuf>,
    by_registry: HashMap<String, (String, String)>,
}

impl Auths {
    fn load(path: &Path) -> Result<Auths, String> {
        let text = fs::read(path)
            .map_err(|e| format!("cannot read registryAuth {}: {e}", path.display()))?;
        let by_registry = parse_docker_config(&text)
            .map_err(|e| format!("registryAuth {}: {e}", path.display()))?;
        Ok(Auths {
            file: Some(path.to_path_buf()),
            by_registry,
        })
    }

    fn for_registry(&self, registry: &str) -> RegistryAuth {
        match self.by_registry.get(registry) {
            Some((user, password)) => RegistryAuth::Basic(user.clone(), password.clone()),
            None => RegistryAuth::Anonymous,
        }
    }

    /// Says whose credentials a refusal was about.
    fn describe(&self, registry: &str) -> String {
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

/// Pulls modules and keeps their cache.
pub(crate) struct Puller {
    client: Client,
    auths: Auths,
    cache: Option<PathBuf>,
    max: u64,
    keys: Vec<PublicKey>,
}

impl Puller {
    /// A puller; `cache` is the directory for verified content (`None`:
    /// every start pulls).
    pub fn new(config: &OciConfig, cache: Option<PathBuf>) -> Result<Puller, String> {
        // reqwest is built without a crypto provider of its own (no
        // aws-lc): ring, as the Kubernetes client uses.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let auths = match &config.auth_file {
            Some(path) => Auths::load(path)?,
            None => Auths::default(),
        };
        let extra_root_certificates = match &config.ca_file {
            Some(path) => {
                let data = fs::read(path)
                    .map_err(|e| format!("cannot read registryCA {}: {e}", path.display()))?;
                vec![Certificate {
                    encoding: CertificateEncoding::Pem,
                    data,
                }]
            }
            None => Vec::new(),
        };
        let keys = config
            .signature_keys
            .iter()
            .map(|path| {
                let name = path.display().to_string();
                let pem = fs::read(path).map_err(|e| {
                    format!("moduleSignatures: cannot read the public key {name}: {e}")
                })?;
                PublicKey::from_pem(&name, &pem).map_err(|e| format!("moduleSignatures: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let client = Client::try_from(ClientConfig {
            protocol: ClientProtocol::Https,
            extra_root_certificates,
            // An artifact is one manifest: no platform to pick.
            platform_resolver: None,
            connect_timeout: Some(config.connect_timeout),
            read_timeout: Some(config.read_timeout),
            user_agent: concat!("portwise/", env!("CARGO_PKG_VERSION")),
            ..ClientConfig::default()
        })
        .map_err(|e| format!("cannot set up the registry client: {e}"))?;
        Ok(Puller {
            client,
            auths,
            cache,
            max: config.max_module_bytes,
            keys,
        })
    }

    /// The module `r` names: from the cache when its digest is there, else
    /// from the registry (then cached).
    pub async fn pull(&self, r: &OciRef) -> Result<Pulled, String> {
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
                    && let Some(digest) = self.cached_tag(r)
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
                Err(match not_served {
                    Some(cached) => format!("{why}; the cached copy is not served: {cached}"),
                    None => why,
                })
            }
        }
    }

    async fn fetch(&self, r: &OciRef) -> Result<Pulled, Failure> {
        let reference: Reference = r
            .reference()
            .parse()
            .map_err(|e| Failure::Refused(format!("not a valid reference: {e}")))?;
        let auth = self.auths.for_registry(&r.registry.to_ascii_lowercase());
        let (manifest_bytes, _) = self
            .client
            .pull_manifest_raw(
                &reference,
                &auth,
                &[OCI_IMAGE_MEDIA_TYPE, OCI_IMAGE_INDEX_MEDIA_TYPE],
            )
            .await
            .map_err(|e| self.explain(r, "fetching the manifest", e))?;
        let digest = sha256_hex(&manifest_bytes);
        if let Some(pin) = &r.digest
            && *pin != digest
        {
            return Err(Failure::Refused(format!(
                "the registry's manifest has sha256:{digest}, not the sha256:{pin} the reference pins; \
                 refused"
            )));
        }
        let layer = wasm_layer(&manifest_bytes).map_err(Failure::Refused)?;
        let size = u64::try_from(layer.size).unwrap_or(u64::MAX);
        if size > self.max {
            return Err(Failure::Refused(format!(
                "its layer is {size} bytes, over maxModuleBytes ({} bytes); not downloaded",
                self.max
            )));
        }
        let layer_hex = layer
            .digest
            .strip_prefix("sha256:")
            .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(|| {
                Failure::Refused(format!(
                    "layer digest {:?} is not sha256:<64 hex digits>",
                    layer.digest
                ))
            })?
            .to_ascii_lowercase();
        let signed_by = match self.keys.is_empty() {
            true => None,
            false => {
                let evidence = self.signatures(r, &auth, &digest).await?;
                let verified =
                    signatures::verify(&digest, &evidence, &self.keys).map_err(Failure::Refused)?;
                // All of them: every read of the cache verifies them again
                // anyway, against whichever keys that config names.
                self.store_signatures(&digest, &evidence, r);
                Some(verified)
            }
        };
        let bytes = self.fetch_blob(r, &reference, &layer, &layer_hex).await?;
        let source = self.store(&digest, &manifest_bytes, &layer_hex, &bytes, r);
        Ok(Pulled {
            bytes,
            manifest: digest,
            source: source.unwrap_or_else(|| PathBuf::from(r.to_string())),
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
            .map_err(|e| self.explain(r, "fetching the layer", e))?;
        if let Some(len) = blob.content_length
            && len > self.max
        {
            return Err(Failure::Refused(format!(
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
                    Failure::Refused(format!(
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
                return Err(Failure::Refused(format!(
                    "the layer is more than maxModuleBytes ({} bytes); download stopped",
                    self.max
                )));
            }
            bytes.extend_from_slice(&chunk);
        }
        let got = sha256_hex(&bytes);
        if got != layer_hex {
            return Err(Failure::Refused(format!(
                "the layer's content has sha256:{got}, not the sha256:{layer_hex} its manifest names"
            )));
        }
        Ok(bytes)
    }

    /// An oci-client error as a message that says what to do.
    fn explain(&self, r: &OciRef, doing: &str, e: OciDistributionError) -> Failure {
        use OciDistributionError as E;
        let who = self.auths.describe(&r.registry.to_ascii_lowercase());
        match &e {
            E::AuthenticationFailure(_) | E::UnauthorizedError { .. } => Failure::Refused(format!(
                "{} refused the credentials {doing} {who}: {e}",
                r.registry
            )),
            E::ServerError { code: 401, .. } | E::ServerError { code: 403, .. } => {
                Failure::Refused(format!("{} refused access {doing} {who}: {e}", r.registry))
            }
            _ if is_not_found(&e) => {
                Failure::Refused(format!("{doing}: {} has no such artifact: {e}", r.registry))
            }
            E::RegistryError { envelope, .. }
                if envelope.errors.iter().any(|x| {
                    matches!(
                        x.code,
                        oci_client::errors::OciErrorCode::Unauthorized
                            | oci_client::errors::OciErrorCode::Denied
                    )
                }) =>
            {
                Failure::Refused(format!(
                    "{} refused the credentials {doing} {who}: {e}",
                    r.registry
                ))
            }
            _ => Failure::Unreachable(format!(
                "{doing} from {} failed: {}",
                r.registry,
                error_chain(&e)
            )),
        }
    }

    /// The cosign signatures the registry holds for manifest `digest`:
    /// sigstore bundles among its referrers (the referrers API, or the
    /// `sha256-<hex>` tag where the registry has none), then the
    /// `sha256-<hex>.sig` tag. Absent ones are not errors; a registry that
    /// cannot be asked is.
    async fn signatures(
        &self,
        r: &OciRef,
        auth: &RegistryAuth,
        digest: &str,
    ) -> Result<Vec<Evidence>, Failure> {
        let subject = Reference::with_digest(
            r.registry.clone(),
            r.repository.clone(),
            format!("sha256:{digest}"),
        );
        let mut out = Vec::new();
        let index = self
            .client
            .pull_referrers(&subject, Some(BUNDLE_MEDIA_TYPE))
            .await
            .map_err(|e| self.explain(r, "listing the module's signatures (referrers)", e))?;
        for entry in index
            .manifests
            .iter()
            // Registries may ignore the filter.
            .filter(|m| m.artifact_type.as_deref() == Some(BUNDLE_MEDIA_TYPE))
            .take(MAX_SIGNATURES)
        {
            let at = Reference::with_digest(
                r.registry.clone(),
                r.repository.clone(),
                entry.digest.clone(),
            );
            let Some(manifest) = self.signature_manifest(r, auth, &at, &entry.digest).await? else {
                continue;
            };
            for layer in manifest
                .layers
                .iter()
                .filter(|l| l.media_type == BUNDLE_MEDIA_TYPE)
            {
                let bundle = self.signature_blob(r, &at, layer).await?;
                out.push(Evidence::Bundle {
                    manifest: entry.digest.clone(),
                    bundle,
                });
            }
        }
        let sig_tag = Reference::with_tag(
            r.registry.clone(),
            r.repository.clone(),
            format!("sha256-{digest}.sig"),
        );
        if let Some(manifest) = self.signature_manifest(r, auth, &sig_tag, "").await? {
            for layer in manifest
                .layers
                .iter()
                .filter(|l| l.media_type == SIMPLE_SIGNING_MEDIA_TYPE)
                .take(MAX_SIGNATURES)
            {
                let Some(signature) = layer
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(SIGNATURE_ANNOTATION))
                else {
                    continue;
                };
                let payload = self.signature_blob(r, &sig_tag, layer).await?;
                out.push(Evidence::SimpleSigning {
                    layer: layer.digest.clone(),
                    payload,
                    signature: signature.clone(),
                });
            }
        }
        Ok(out)
    }

    /// A signature's manifest; `None` when the registry has none there.
    /// `digest` (when not empty) is checked against the bytes.
    async fn signature_manifest(
        &self,
        r: &OciRef,
        auth: &RegistryAuth,
        at: &Reference,
        digest: &str,
    ) -> Result<Option<OciImageManifest>, Failure> {
        let bytes = match self
            .client
            .pull_manifest_raw(
                at,
                auth,
                &[OCI_IMAGE_MEDIA_TYPE, DOCKER_MANIFEST_MEDIA_TYPE],
            )
            .await
        {
            Ok((bytes, _)) => bytes,
            // No such tag: not signed in that form.
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) => return Err(self.explain(r, "fetching a signature", e)),
        };
        if bytes.len() as u64 > MAX_SIGNATURE_BYTES {
            return Err(Failure::Refused(format!(
                "the signature manifest {at} is {} bytes, not a cosign signature",
                bytes.len()
            )));
        }
        if !digest.is_empty() && format!("sha256:{}", sha256_hex(&bytes)) != digest {
            return Err(Failure::Refused(format!(
                "the signature manifest {at} does not match its digest"
            )));
        }
        serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            Failure::Refused(format!(
                "the signature manifest {at} is not an image manifest: {e}"
            ))
        })
    }

    /// A signature's layer, small and matching its digest.
    async fn signature_blob(
        &self,
        r: &OciRef,
        at: &Reference,
        layer: &oci_client::manifest::OciDescriptor,
    ) -> Result<Vec<u8>, Failure> {
        if layer.size < 0 || layer.size as u64 > MAX_SIGNATURE_BYTES {
            return Err(Failure::Refused(format!(
                "the signature layer {} is {} bytes, not a cosign signature",
                layer.digest, layer.size
            )));
        }
        let mut blob = self
            .client
            .pull_blob_stream(at, layer)
            .await
            .map_err(|e| self.explain(r, "fetching a signature", e))?;
        let mut bytes = Vec::new();
        while let Some(chunk) = blob.stream.next().await {
            let chunk = chunk.map_err(|e| {
                Failure::Unreachable(format!(
                    "a signature's download from {} failed: {}",
                    r.registry,
                    error_chain(&e)
                ))
            })?;
            if (bytes.len() + chunk.len()) as u64 > MAX_SIGNATURE_BYTES {
                return Err(Failure::Refused(format!(
                    "the signature layer {} is larger than its manifest says",
                    layer.digest
                )));
            }
            bytes.extend_from_slice(&chunk);
        }
        if format!("sha256:{}", sha256_hex(&bytes)) != layer.digest {
            return Err(Failure::Refused(format!(
                "the signature layer {} does not match its digest",
                layer.digest
            )));
        }
        Ok(bytes)
    }

    fn cached_signatures(&self, digest: &str) -> Option<Vec<Evidence>> {
        let text = fs::read(self.dir("signatures")?.join(digest)).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// Keeps the module's signatures, for offline restarts.
    fn store_signatures(&self, digest: &str, evidence: &[Evidence], r: &OciRef) {
        let Some(dir) = self.dir("signatures") else {
            return;
        };
        let text = serde_json::to_vec(evidence).expect("evidence serializes");
        if let Err(e) = write_atomic(&dir.join(digest), &text) {
            tracing::warn!(module = %r, "cannot cache the module's signatures: {e}");
        }
    }

    fn dir(&self, kind: &str) -> Option<PathBuf> {
        self.cache.as_ref().map(|c| c.join(kind))
    }

    /// A digest's manifest and layer from the cache, both re-verified, and
    /// under `moduleSignatures` their signatures too. `Err(None)` is a miss;
    /// `Err(Some(why))` is content that is there but not signed by a
    /// configured key (the registry may have that signature: it is asked).
    fn cached(&self, digest: &str) -> Result<Pulled, Option<String>> {
        let (bytes, blob_path) = self.cached_content(digest).ok_or(None)?;
        let signed_by = match self.keys.is_empty() {
            true => None,
            false => {
                let evidence = self.cached_signatures(digest).unwrap_or_default();
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
            bytes,
            manifest: digest.to_string(),
            source: blob_path,
            cached: true,
            fallback: None,
            signed_by,
        })
    }

    /// The cached layer of manifest `digest`, re-hashed, and its path.
    fn cached_content(&self, digest: &str) -> Option<(Vec<u8>, PathBuf)> {
        let manifest_path = self.dir("manifests")?.join(digest);
        let manifest = fs::read(&manifest_path).ok()?;
        if sha256_hex(&manifest) != digest {
            tracing::warn!(path = %manifest_path.display(), "cached manifest does not match its digest; pulling again");
            return None;
        }
        let layer = wasm_layer(&manifest).ok()?;
        let layer_hex = layer.digest.strip_prefix("sha256:")?.to_ascii_lowercase();
        let blob_path = self.dir("blobs")?.join(&layer_hex);
        let meta = fs::metadata(&blob_path).ok()?;
        if meta.len() > self.max {
            return None;
        }
        let bytes = fs::read(&blob_path).ok()?;
        if sha256_hex(&bytes) != layer_hex {
            tracing::warn!(path = %blob_path.display(), "cached layer does not match its digest; pulling again");
            return None;
        }
        Some((bytes, blob_path))
    }

    fn tag_file(&self, r: &OciRef) -> Option<PathBuf> {
        let tag = r.tag.as_deref()?;
        let key = format!("{}/{}:{tag}", r.registry.to_ascii_lowercase(), r.repository);
        Some(self.dir("tags")?.join(sha256_hex(key.as_bytes())))
    }

    fn cached_tag(&self, r: &OciRef) -> Option<String> {
        let text = fs::read_to_string(self.tag_file(r)?).ok()?;
        let digest = text.trim().to_string();
        (digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit())).then_some(digest)
    }

    /// Caches verified content; returns the layer's path. Failures to write
    /// only cost the next start a pull.
    fn store(
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
                && let Some(tag) = self.tag_file(r)
            {
                write_atomic(&tag, digest.as_bytes())?;
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

/// Why a fetch failed: the registry said no (or sent something wrong), or
/// it could not be asked.
enum Failure {
    Refused(String),
    Unreachable(String),
}

/// The registry has nothing at that name (as opposed to: refused, failed).
fn is_not_found(e: &OciDistributionError) -> bool {
    use OciDistributionError as E;
    match e {
        E::ImageManifestNotFoundError(_) | E::ServerError { code: 404, .. } => true,
        E::RegistryError { envelope, .. } => envelope.errors.iter().any(|x| {
            matches!(
                x.code,
                oci_client::errors::OciErrorCode::ManifestUnknown
                    | oci_client::errors::OciErrorCode::NameUnknown
                    | oci_client::errors::OciErrorCode::BlobUnknown
            )
        }),
        _ => false,
    }
}

/// `e` with its sources, which carry the useful part (connection refused,
/// certificate unknown...).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        let text = inner.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        source = inner.source();
    }
    s
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

/// The component layer of a WebAssembly artifact's manifest.
fn wasm_layer(manifest: &[u8]) -> Result<oci_client::manifest::OciDescriptor, String> {
    let versioned: serde_json::Value =
        serde_json::from_slice(manifest).map_err(|e| format!("the manifest is not JSON: {e}"))?;
    let media_type = versioned
        .get("mediaType")
        .and_then(|m| m.as_str())
        .unwrap_or(OCI_IMAGE_MEDIA_TYPE);
    if media_type == OCI_IMAGE_INDEX_MEDIA_TYPE {
        return Err(
            "the reference is an image index, not a WebAssembly artifact: pin the digest of the \
             artifact's own manifest"
                .into(),
        );
    }
    if media_type != OCI_IMAGE_MEDIA_TYPE {
        return Err(format!(
            "the manifest is {media_type}, not an OCI image manifest ({OCI_IMAGE_MEDIA_TYPE})"
        ));
    }
    let m: OciImageManifest = serde_json::from_slice(manifest)
        .map_err(|e| format!("not a valid OCI image manifest: {e}"))?;
    let wasm: Vec<_> = m
        .layers
        .iter()
        .filter(|l| {
            l.media_type == WASM_LAYER_MEDIA_TYPE || l.media_type == LEGACY_WASM_LAYER_MEDIA_TYPE
        })
        .collect();
    match wasm.as_slice() {
        [one] => {
            if m.config.media_type != WASM_CONFIG_MEDIA_TYPE {
                tracing::debug!(
                    config = %m.config.media_type,
                    "artifact config is not {WASM_CONFIG_MEDIA_TYPE}; using its {WASM_LAYER_MEDIA_TYPE} layer anyway"
                );
            }
            Ok((*one).clone())
        }
        [] => Err(format!(
            "not a WebAssembly artifact: no {WASM_LAYER_MEDIA_TYPE} layer (layers: {}; config: {}); \
             push it with wkg oci push, or oras push --artifact-type {WASM_CONFIG_MEDIA_TYPE} FILE:{WASM_LAYER_MEDIA_TYPE}",
            m.layers
                .iter()
                .map(|l| l.media_type.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            m.config.media_type
        )),
        _ => Err(format!(
            "{} {WASM_LAYER_MEDIA_TYPE} layers: a module artifact has exactly one",
            wasm.len()
        )),
    }
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

    fn manifest(layers: &[(&str, &str)]) -> Vec<u8> {
        let layers: Vec<_> = layers
            .iter()
            .map(|(t, d)| serde_json::json!({"mediaType": t, "digest": d, "size": 10}))
            .collect();
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_IMAGE_MEDIA_TYPE,
            "config": {"mediaType": WASM_CONFIG_MEDIA_TYPE, "digest": format!("sha256:{}", "0".repeat(64)), "size": 2},
            "layers": layers,
        }))
        .unwrap()
    }

    #[test]
    fn the_wasm_layer_is_found_or_its_absence_explained() {
        let d = format!("sha256:{}", "a".repeat(64));
        assert_eq!(
            wasm_layer(&manifest(&[(WASM_LAYER_MEDIA_TYPE, &d)]))
                .unwrap()
                .digest,
            d
        );
        let e =
            wasm_layer(&manifest(&[("application/vnd.oci.image.layer.v1.tar", &d)])).unwrap_err();
        assert!(
            e.contains("not a WebAssembly artifact") && e.contains("oras push"),
            "{e}"
        );
        let e = wasm_layer(&manifest(&[
            (WASM_LAYER_MEDIA_TYPE, &d),
            (WASM_LAYER_MEDIA_TYPE, &d),
        ]))
        .unwrap_err();
        assert!(e.contains("exactly one"), "{e}");
        let index = serde_json::to_vec(
            &serde_json::json!({"schemaVersion": 2, "mediaType": OCI_IMAGE_INDEX_MEDIA_TYPE, "manifests": []}),
        )
        .unwrap();
        assert!(wasm_layer(&index).unwrap_err().contains("image index"));
    }

    #[test]
    fn the_cache_serves_only_verified_content() {
        let dir = tempfile::tempdir().unwrap();
        let puller = Puller::new(&OciConfig::default(), Some(dir.path().to_path_buf())).unwrap();
        let wasm = b"\0asm\x0d\0\x01\0component".to_vec();
        let layer_hex = sha256_hex(&wasm);
        let m = manifest(&[(WASM_LAYER_MEDIA_TYPE, &format!("sha256:{layer_hex}"))]);
        let digest = sha256_hex(&m);
        let r = OciRef::parse(&format!("oci://r.example/x@sha256:{digest}")).unwrap();
        assert!(puller.cached(&digest).is_err());
        puller.store(&digest, &m, &layer_hex, &wasm, &r).unwrap();
        let hit = puller.cached(&digest).unwrap();
        assert_eq!(hit.bytes, wasm);
        assert!(hit.cached);
        // A damaged layer is a miss.
        fs::write(dir.path().join("blobs").join(&layer_hex), b"\0asm tampered").unwrap();
        assert!(puller.cached(&digest).is_err());
    }
}
