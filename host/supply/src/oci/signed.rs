//! Fetching a module's cosign signatures from its registry (checking
//! them is [`crate::signatures`]'s job): the `sha256-<hex>.sig` tag, then
//! the sigstore bundles among the manifest's referrers, smallest first
//! ([`search`]). Each manifest and layer is small and must match its
//! digest.

use std::{cmp::Reverse, collections::BinaryHeap};

use futures::StreamExt;
use oci_client::{
    Reference,
    manifest::{
        ImageIndexEntry, OCI_IMAGE_INDEX_MEDIA_TYPE, OCI_IMAGE_MEDIA_TYPE, OciDescriptor,
        OciImageIndex, OciImageManifest,
    },
    secrets::RegistryAuth,
};
use portwise_core::config::OciRef;

use super::{
    Puller,
    bounded::{MAX_MANIFEST_BYTES, Read},
    errors::{Failure, error_chain, explain},
};
use crate::{
    content::sha256_hex,
    error::{PullError, SignatureError},
    signatures::{BUNDLE_MEDIA_TYPE, Evidence, SIGNATURE_ANNOTATION, SIMPLE_SIGNING_MEDIA_TYPE},
};

/// A signature manifest or blob larger than this is not a cosign signature.
const MAX_SIGNATURE_BYTES: u64 = 1 << 20;
/// Signature bytes (manifests and layers) fetched per module, at most.
/// Bounded by bytes, not by count: a count would let whoever can push to
/// the repository, without the key, hide the real signature behind enough
/// junk; bytes bound the memory and the downloads whatever they push.
pub(super) const SIGNATURE_BUDGET_BYTES: u64 = 8 << 20;
/// What a registry may answer for an image manifest (Docker's schema 2 for
/// signatures pushed by older tools).
const DOCKER_MANIFEST_MEDIA_TYPE: &str = "application/vnd.docker.distribution.manifest.v2+json";

/// What a signature search found: the signatures fetched, and why each
/// one that could not be used was passed over.
#[derive(Default)]
pub(super) struct Found {
    pub evidence: Vec<Evidence>,
    pub passed_over: Vec<String>,
}

impl Found {
    /// Keeps `e`; whether it is `enough` to end the search.
    fn keep(&mut self, e: Evidence, enough: &impl Fn(&Evidence) -> bool) -> bool {
        let done = enough(&e);
        self.evidence.push(e);
        done
    }

    /// `why` (the verdict on `evidence`), with what was passed over: a
    /// signature that was there but unusable is told apart from none.
    pub fn refusal(&self, why: SignatureError) -> PullError {
        PullError::Unsigned {
            source: why,
            passed_over: self.passed_over.clone(),
        }
    }
}

/// The bytes a search may still fetch; `spent` once a fetch did not fit,
/// which ends the search.
struct Budget {
    left: u64,
    spent: bool,
}

impl Budget {
    /// Takes `n` bytes, or says why not.
    fn take(&mut self, n: u64, what: &str) -> Result<(), Failure> {
        match self.left.checked_sub(n) {
            Some(left) => {
                self.left = left;
                Ok(())
            }
            None => {
                self.spent = true;
                Err(Failure::refused(format!(
                    "{what} ({n} bytes) is past the {SIGNATURE_BUDGET_BYTES} bytes of signatures \
                 fetched per module; the search stopped there"
                )))
            }
        }
    }
}

/// Where a search gets its bytes: the registry ([`Registry`]), or a test's
/// fake. Sizes, digests, the budget and the order are the search's
/// ([`search`]); a source only fetches.
pub(super) trait Source {
    /// The `.sig` tag, for messages.
    fn sig_tag(&self) -> String;
    /// The `.sig` tag's manifest, at most `limit` bytes; `None`: no such tag.
    async fn sig_tag_manifest(&self, limit: u64) -> Result<Option<Vec<u8>>, Failure>;
    /// The index of the manifest's referrers (an empty one when it has none).
    async fn referrers(&self) -> Result<OciImageIndex, Failure>;
    /// Referrer `digest`'s manifest, at most `limit` bytes; `None`: gone.
    async fn referrer_manifest(&self, digest: &str, limit: u64)
    -> Result<Option<Vec<u8>>, Failure>;
    /// A layer of the `.sig` manifest (`referrer` `None`) or of a
    /// referrer's, at most its declared size.
    async fn layer(
        &self,
        referrer: Option<&str>,
        layer: &OciDescriptor,
    ) -> Result<Vec<u8>, Failure>;
}

/// What a referrer search fetches: a referrer's manifest, or a bundle one
/// lists (with the referrer's digest).
enum Candidate<'a> {
    Manifest(&'a ImageIndexEntry),
    Bundle(&'a str, OciDescriptor),
}

/// Candidates, the smallest (declared size) first, ties in the order they
/// were found.
#[derive(Default)]
struct Queue<'a> {
    candidates: Vec<Option<Candidate<'a>>>,
    order: BinaryHeap<Reverse<(u64, usize)>>,
}

impl<'a> Queue<'a> {
    fn push(&mut self, size: u64, candidate: Candidate<'a>) {
        self.order.push(Reverse((size, self.candidates.len())));
        self.candidates.push(Some(candidate));
    }

    fn pop(&mut self) -> Option<(u64, Candidate<'a>)> {
        let Reverse((size, at)) = self.order.pop()?;
        self.candidates[at].take().map(|c| (size, c))
    }
}

/// A declared size as bytes; a negative one sorts, and is refused, last.
fn declared(size: i64) -> u64 {
    u64::try_from(size).unwrap_or(u64::MAX)
}

/// The cosign signatures `source` holds for a manifest: the
/// `sha256-<hex>.sig` tag's simple-signing layers first, then the sigstore
/// bundles among its referrers. It stops at the first one `enough`
/// accepts. Absent signatures are not errors, and neither is a bad one
/// (too big, wrong digest, not a manifest): it is passed over with its
/// reason, so junk pushed beside a real signature cannot block the module.
/// A registry that cannot be asked is an error.
///
/// Smallest first, within the `.sig` manifest, and among the referrer
/// manifests and the bundles they list (one queue: a small bundle goes
/// before a big manifest): a signature is a few KB, so junk of up to 1 MiB
/// a piece spends the budget only after every smaller candidate was tried,
/// wherever the registry lists it. The `.sig` tag comes first because
/// referrers can be added without limit; the tag holds one manifest.
pub(super) async fn search(
    source: &impl Source,
    enough: impl Fn(&Evidence) -> bool,
) -> Result<Found, Failure> {
    let mut found = Found::default();
    let mut budget = Budget {
        left: SIGNATURE_BUDGET_BYTES,
        spent: false,
    };
    // Pass over a refused fetch; `Ok(true)` when that ends the search.
    let pass_over = |found: &mut Found, budget: &Budget, what: String, e: Failure| match e {
        Failure::Refused(why) => {
            found.passed_over.push(format!("{what}: {why}"));
            Ok(budget.spent)
        }
        unreachable => Err(unreachable),
    };

    let sig_tag = source.sig_tag();
    let manifest = match source.sig_tag_manifest(MAX_SIGNATURE_BYTES).await {
        Ok(bytes) => bytes
            .map(|bytes| parse_manifest(&bytes, &sig_tag, "", &mut budget))
            .transpose(),
        Err(e) => Err(e),
    };
    match manifest {
        Ok(manifest) => {
            let mut layers: Vec<(&OciDescriptor, &String)> = manifest
                .iter()
                .flat_map(|m| &m.layers)
                .filter(|l| l.media_type == SIMPLE_SIGNING_MEDIA_TYPE)
                .filter_map(|l| Some((l, l.annotations.as_ref()?.get(SIGNATURE_ANNOTATION)?)))
                .collect();
            layers.sort_by_key(|(l, _)| declared(l.size));
            for (layer, signature) in layers {
                match fetch_layer(source, None, layer, &mut budget).await {
                    Ok(payload) => {
                        let e = Evidence::SimpleSigning {
                            layer: layer.digest.clone(),
                            payload,
                            signature: signature.clone(),
                        };
                        if found.keep(e, &enough) {
                            return Ok(found);
                        }
                    }
                    Err(e) => {
                        let what = format!("{sig_tag} layer {}", layer.digest);
                        if pass_over(&mut found, &budget, what, e)? {
                            return Ok(found);
                        }
                    }
                }
            }
        }
        Err(e) => {
            if pass_over(&mut found, &budget, sig_tag.clone(), e)? {
                return Ok(found);
            }
        }
    }

    let index = source.referrers().await?;
    // Referrer manifests and the bundles they list, one queue.
    let mut queue = Queue::default();
    // Registries may ignore the filter.
    for entry in &index.manifests {
        if entry.artifact_type.as_deref() == Some(BUNDLE_MEDIA_TYPE) {
            queue.push(declared(entry.size), Candidate::Manifest(entry));
        }
    }
    while let Some((size, candidate)) = queue.pop() {
        match candidate {
            Candidate::Manifest(entry) => {
                let manifest = if size > MAX_SIGNATURE_BYTES {
                    Err(too_big("manifest", &entry.digest, size))
                } else {
                    // Read no more than declared: the digest covers that much.
                    match source.referrer_manifest(&entry.digest, size).await {
                        Ok(bytes) => bytes
                            .map(|b| parse_manifest(&b, &entry.digest, &entry.digest, &mut budget))
                            .transpose(),
                        Err(e) => Err(e),
                    }
                };
                match manifest {
                    Ok(manifest) => {
                        for layer in manifest.into_iter().flat_map(|m| m.layers) {
                            if layer.media_type == BUNDLE_MEDIA_TYPE {
                                let size = declared(layer.size);
                                queue.push(size, Candidate::Bundle(&entry.digest, layer));
                            }
                        }
                    }
                    Err(e) => {
                        let what = format!("referrer {}", entry.digest);
                        if pass_over(&mut found, &budget, what, e)? {
                            return Ok(found);
                        }
                    }
                }
            }
            Candidate::Bundle(referrer, layer) => {
                match fetch_layer(source, Some(referrer), &layer, &mut budget).await {
                    Ok(bundle) => {
                        let e = Evidence::Bundle {
                            manifest: referrer.to_string(),
                            bundle,
                        };
                        if found.keep(e, &enough) {
                            return Ok(found);
                        }
                    }
                    Err(e) => {
                        let what = format!("referrer {referrer} layer {}", layer.digest);
                        if pass_over(&mut found, &budget, what, e)? {
                            return Ok(found);
                        }
                    }
                }
            }
        }
    }
    Ok(found)
}

/// A signature manifest read from `at`, counted against the budget and
/// checked against `digest` (when not empty).
fn parse_manifest(
    bytes: &[u8],
    at: &str,
    digest: &str,
    budget: &mut Budget,
) -> Result<OciImageManifest, Failure> {
    // The budget counts what was read (so the search costs at most the
    // budget plus one manifest).
    budget.take(bytes.len() as u64, &format!("the signature manifest {at}"))?;
    if !digest.is_empty() && format!("sha256:{}", sha256_hex(bytes)) != digest {
        return Err(Failure::refused(format!(
            "the signature manifest {at} does not match its digest"
        )));
    }
    serde_json::from_slice(bytes).map_err(|e| {
        Failure::refused(format!(
            "the signature manifest {at} is not an image manifest: {e}"
        ))
    })
}

/// A signature's layer, small and matching its digest: refused on what its
/// manifest declares, before any download.
async fn fetch_layer(
    source: &impl Source,
    referrer: Option<&str>,
    layer: &OciDescriptor,
    budget: &mut Budget,
) -> Result<Vec<u8>, Failure> {
    let size = declared(layer.size);
    if size > MAX_SIGNATURE_BYTES {
        return Err(too_big("layer", &layer.digest, size));
    }
    budget.take(size, &format!("the signature layer {}", layer.digest))?;
    let bytes = source.layer(referrer, layer).await?;
    if format!("sha256:{}", sha256_hex(&bytes)) != layer.digest {
        return Err(Failure::refused(format!(
            "the signature layer {} does not match its digest",
            layer.digest
        )));
    }
    Ok(bytes)
}

/// The registry as a [`Source`]: the signatures of manifest `digest` of
/// `r`'s repository.
struct Registry<'a> {
    puller: &'a Puller,
    r: &'a OciRef,
    auth: &'a RegistryAuth,
    digest: &'a str,
}

impl Registry<'_> {
    fn at_tag(&self, tag: String) -> Reference {
        Reference::with_tag(self.r.registry.clone(), self.r.repository.clone(), tag)
    }

    fn at_digest(&self, digest: &str) -> Reference {
        Reference::with_digest(
            self.r.registry.clone(),
            self.r.repository.clone(),
            digest.to_string(),
        )
    }

    async fn manifest(&self, at: &Reference, limit: u64) -> Result<Option<Vec<u8>>, Failure> {
        self.puller
            .manifest_bounded(&Read {
                r: self.r,
                auth: self.auth,
                at,
                accept: &[OCI_IMAGE_MEDIA_TYPE, DOCKER_MANIFEST_MEDIA_TYPE],
                limit,
                doing: "fetching a signature",
            })
            .await
    }
}

impl Source for Registry<'_> {
    fn sig_tag(&self) -> String {
        self.at_tag(format!("sha256-{}.sig", self.digest))
            .to_string()
    }

    async fn sig_tag_manifest(&self, limit: u64) -> Result<Option<Vec<u8>>, Failure> {
        let at = self.at_tag(format!("sha256-{}.sig", self.digest));
        self.manifest(&at, limit).await
    }

    async fn referrers(&self) -> Result<OciImageIndex, Failure> {
        let subject = self.at_digest(&format!("sha256:{}", self.digest));
        self.puller
            .referrers(self.r, self.auth, &subject, self.digest)
            .await
    }

    async fn referrer_manifest(
        &self,
        digest: &str,
        limit: u64,
    ) -> Result<Option<Vec<u8>>, Failure> {
        self.manifest(&self.at_digest(digest), limit).await
    }

    async fn layer(
        &self,
        referrer: Option<&str>,
        layer: &OciDescriptor,
    ) -> Result<Vec<u8>, Failure> {
        let at = match referrer {
            Some(digest) => self.at_digest(digest),
            None => self.at_tag(format!("sha256-{}.sig", self.digest)),
        };
        let r = self.r;
        let mut blob = self
            .puller
            .client
            .pull_blob_stream(&at, layer)
            .await
            .map_err(|e| explain(&self.puller.auths, r, "fetching a signature", e))?;
        let mut bytes = Vec::new();
        while let Some(chunk) = blob.stream.next().await {
            let chunk = chunk.map_err(|e| {
                Failure::Unreachable(format!(
                    "a signature's download from {} failed: {}",
                    r.registry,
                    error_chain(&e)
                ))
            })?;
            if (bytes.len() + chunk.len()) as u64 > declared(layer.size) {
                return Err(Failure::refused(format!(
                    "the signature layer {} is larger than its manifest says",
                    layer.digest
                )));
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(bytes)
    }
}

impl Puller {
    /// The cosign signatures the registry holds for manifest `digest` of
    /// `r`'s repository ([`search`]).
    pub(super) async fn signatures(
        &self,
        r: &OciRef,
        auth: &RegistryAuth,
        digest: &str,
        enough: impl Fn(&Evidence) -> bool,
    ) -> Result<Found, Failure> {
        let registry = Registry {
            puller: self,
            r,
            auth,
            digest,
        };
        search(&registry, enough).await
    }

    /// The referrers of manifest `digest` that are sigstore bundles: the
    /// referrers API, or where the registry has none (404) the
    /// `sha256-<hex>` tag of the tag schema; an empty index when neither
    /// has any (as the distribution spec says to treat it).
    async fn referrers(
        &self,
        r: &OciRef,
        auth: &RegistryAuth,
        subject: &Reference,
        digest: &str,
    ) -> Result<OciImageIndex, Failure> {
        const DOING: &str = "listing the module's signatures (referrers)";
        let tag = Reference::with_tag(
            r.registry.clone(),
            r.repository.clone(),
            format!("sha256-{digest}"),
        );
        let read = |at| Read {
            r,
            auth,
            at,
            accept: &[OCI_IMAGE_INDEX_MEDIA_TYPE],
            limit: MAX_MANIFEST_BYTES,
            doing: DOING,
        };
        let api = self
            .get_bounded(
                &read(subject),
                &format!("referrers/sha256:{digest}?artifactType={BUNDLE_MEDIA_TYPE}"),
            )
            .await?;
        let body = match api {
            Some(body) => Some(body),
            None => self.manifest_bounded(&read(&tag)).await?,
        };
        match body {
            None => Ok(OciImageIndex {
                schema_version: 2,
                media_type: Some(OCI_IMAGE_INDEX_MEDIA_TYPE.into()),
                manifests: Vec::new(),
                artifact_type: None,
                annotations: None,
            }),
            Some(body) => serde_json::from_slice(&body).map_err(|e| {
                Failure::refused(format!(
                    "{DOING}: the referrers index is not an image index: {e}"
                ))
            }),
        }
    }
}

/// A signature `what` (manifest, layer) over the size any signature has.
fn too_big(what: &str, name: &str, bytes: u64) -> Failure {
    Failure::refused(format!(
        "the signature {what} {name} is {bytes} bytes, over the {MAX_SIGNATURE_BYTES} a cosign \
         signature may have; not downloaded"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::{cell::RefCell, collections::HashMap};

    /// A registry in memory: the `.sig` manifest, the referrers index, and
    /// manifests and blobs by digest. Logs what was fetched, in order.
    #[derive(Default)]
    struct Fake {
        sig: Option<Vec<u8>>,
        referrers: Vec<ImageIndexEntry>,
        by_digest: HashMap<String, Vec<u8>>,
        fetched: RefCell<Vec<String>>,
    }

    impl Fake {
        fn get(&self, digest: &str, limit: u64) -> Result<Option<Vec<u8>>, Failure> {
            self.fetched.borrow_mut().push(digest.to_string());
            match self.by_digest.get(digest) {
                Some(b) if b.len() as u64 > limit => Err(Failure::refused("over the limit".into())),
                found => Ok(found.cloned()),
            }
        }

        /// Stores `bytes`; their descriptor.
        fn put(&mut self, media_type: &str, bytes: Vec<u8>) -> OciDescriptor {
            let digest = format!("sha256:{}", sha256_hex(&bytes));
            let d = OciDescriptor {
                media_type: media_type.into(),
                digest: digest.clone(),
                size: bytes.len() as i64,
                urls: None,
                annotations: None,
                artifact_type: None,
            };
            self.by_digest.insert(digest, bytes);
            d
        }

        /// A manifest of `layers`, as a referrer of the module.
        fn referrer(&mut self, layers: &[OciDescriptor]) {
            let d = self.put(OCI_IMAGE_MEDIA_TYPE, manifest(layers));
            self.referrers.push(ImageIndexEntry {
                media_type: d.media_type,
                digest: d.digest,
                size: d.size,
                platform: None,
                annotations: None,
                artifact_type: Some(BUNDLE_MEDIA_TYPE.into()),
            });
        }

        /// A referrer entry of `bytes` (junk: not a manifest).
        fn junk_referrer(&mut self, bytes: Vec<u8>) {
            let d = self.put(OCI_IMAGE_MEDIA_TYPE, bytes);
            self.referrers.push(ImageIndexEntry {
                media_type: d.media_type,
                digest: d.digest,
                size: d.size,
                platform: None,
                annotations: None,
                artifact_type: Some(BUNDLE_MEDIA_TYPE.into()),
            });
        }
    }

    impl Source for Fake {
        fn sig_tag(&self) -> String {
            "r.example/x:sha256-0.sig".into()
        }
        async fn sig_tag_manifest(&self, _limit: u64) -> Result<Option<Vec<u8>>, Failure> {
            self.fetched.borrow_mut().push(".sig".into());
            Ok(self.sig.clone())
        }
        async fn referrers(&self) -> Result<OciImageIndex, Failure> {
            self.fetched.borrow_mut().push("referrers".into());
            Ok(OciImageIndex {
                schema_version: 2,
                media_type: Some(OCI_IMAGE_INDEX_MEDIA_TYPE.into()),
                manifests: self.referrers.clone(),
                artifact_type: None,
                annotations: None,
            })
        }
        async fn referrer_manifest(
            &self,
            digest: &str,
            limit: u64,
        ) -> Result<Option<Vec<u8>>, Failure> {
            self.get(digest, limit)
        }
        async fn layer(
            &self,
            _referrer: Option<&str>,
            layer: &OciDescriptor,
        ) -> Result<Vec<u8>, Failure> {
            Ok(self
                .get(&layer.digest, declared(layer.size))?
                .unwrap_or_default())
        }
    }

    fn manifest(layers: &[OciDescriptor]) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": OCI_IMAGE_MEDIA_TYPE,
            "config": {"mediaType": "application/vnd.oci.empty.v1+json",
                       "digest": format!("sha256:{}", sha256_hex(b"{}")), "size": 2},
            "layers": layers,
        }))
        .unwrap()
    }

    /// 1 MiB of junk, different for each `i`: the most a signature
    /// manifest or layer may be.
    fn junk(i: u8) -> Vec<u8> {
        let mut bytes = vec![b' '; MAX_SIGNATURE_BYTES as usize];
        bytes[0] = i;
        bytes
    }

    const REAL: &[u8] = b"{\"the\": \"real signature\"}";

    fn is_real(e: &Evidence) -> bool {
        match e {
            Evidence::Bundle { bundle, .. } => bundle == REAL,
            Evidence::SimpleSigning { payload, .. } => payload == REAL,
        }
    }

    fn run(fake: &Fake) -> Found {
        match futures::executor::block_on(search(fake, is_real)) {
            Ok(found) => found,
            Err(Failure::Refused(e)) => panic!("{e}"),
            Err(Failure::Unreachable(e)) => panic!("{e}"),
        }
    }

    /// Issue 45: eight referrers of 1 MiB listed before the real one spent
    /// the 8 MiB budget before it was reached.
    #[test]
    fn eight_big_referrers_listed_first_do_not_hide_the_real_signature() {
        let mut fake = Fake::default();
        for i in 0..8 {
            fake.junk_referrer(junk(i));
        }
        let real = fake.put(BUNDLE_MEDIA_TYPE, REAL.to_vec());
        fake.referrer(&[real]);
        let found = run(&fake);
        assert!(
            found.evidence.iter().any(is_real),
            "not found; passed over: {:?}",
            found.passed_over
        );
        // Smallest first: the real one before any junk.
        assert_eq!(
            fake.fetched.borrow().len(),
            4,
            "{:?}",
            fake.fetched.borrow()
        );
    }

    /// A small referrer manifest listing eight 1 MiB bundles, before the
    /// real one: bundles are tried smallest first across referrers.
    #[test]
    fn big_bundles_of_a_small_referrer_do_not_hide_the_real_signature() {
        let mut fake = Fake::default();
        let big: Vec<OciDescriptor> = (0..8)
            .map(|i| fake.put(BUNDLE_MEDIA_TYPE, junk(i)))
            .collect();
        fake.referrer(&big);
        let real = fake.put(BUNDLE_MEDIA_TYPE, REAL.to_vec());
        fake.referrer(&[real]);
        let found = run(&fake);
        assert!(
            found.evidence.iter().any(is_real),
            "not found; passed over: {:?}",
            found.passed_over
        );
    }

    /// The `.sig` tag is tried before the referrers, however many there
    /// are: they are not even listed when it holds the signature.
    #[test]
    fn the_sig_tag_is_tried_before_the_referrers() {
        let mut fake = Fake::default();
        for i in 0..8 {
            fake.junk_referrer(junk(i));
        }
        let mut payload = fake.put(SIMPLE_SIGNING_MEDIA_TYPE, REAL.to_vec());
        payload.annotations = Some([(SIGNATURE_ANNOTATION.to_string(), "c2ln".into())].into());
        let big = {
            let mut d = fake.put(SIMPLE_SIGNING_MEDIA_TYPE, junk(9));
            d.annotations = payload.annotations.clone();
            d
        };
        fake.sig = Some(manifest(&[big, payload]));
        let found = run(&fake);
        assert!(
            found.evidence.iter().any(is_real),
            "{:?}",
            found.passed_over
        );
        assert_eq!(found.evidence.len(), 1, "the 1 MiB layer was fetched first");
        assert!(
            !fake.fetched.borrow().iter().any(|f| f == "referrers"),
            "{:?}",
            fake.fetched.borrow()
        );
    }

    #[test]
    fn a_budget_refuses_what_does_not_fit_and_ends_the_search() {
        let mut budget = Budget {
            left: 10,
            spent: false,
        };
        assert!(budget.take(4, "a").is_ok() && budget.take(6, "b").is_ok());
        assert!(!budget.spent);
        let Err(Failure::Refused(why)) = budget.take(1, "the signature layer sha256:x") else {
            panic!("a take past the budget was allowed");
        };
        let why = why.to_string();
        assert!(budget.spent, "{why}");
        assert!(why.contains("sha256:x") && why.contains("stopped"), "{why}");
    }

    #[test]
    fn a_refusal_names_what_was_passed_over() {
        let unsigned = SignatureError::Unsigned {
            manifest: "ab".repeat(32),
            keys: vec!["k.pub".into()],
        };
        let none = Found::default();
        assert_eq!(
            none.refusal(unsigned.clone()).to_string(),
            unsigned.to_string()
        );
        let found = Found {
            evidence: Vec::new(),
            passed_over: vec!["referrer sha256:a: too big".into(), "b: not JSON".into()],
        };
        let why = found.refusal(unsigned.clone()).to_string();
        assert!(
            why.starts_with(&format!("{unsigned}; 2 signature(s) passed over"))
                && why.contains("sha256:a: too big")
                && why.contains("b: not JSON"),
            "{why}"
        );
    }
}
