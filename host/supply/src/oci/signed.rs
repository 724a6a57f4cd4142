//! Fetching a module's cosign signatures from its registry (checking
//! them is [`crate::signatures`]'s job): the sigstore bundles among the
//! manifest's referrers, and the `sha256-<hex>.sig` tag. Each manifest and
//! layer is small and must match its digest.

use futures::StreamExt;
use oci_client::{
    Reference,
    manifest::{OCI_IMAGE_INDEX_MEDIA_TYPE, OCI_IMAGE_MEDIA_TYPE, OciImageIndex, OciImageManifest},
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
    /// `why` (the verdict on `evidence`), with what was passed over: a
    /// signature that was there but unusable is told apart from none.
    pub fn refusal(&self, why: String) -> String {
        match self.passed_over.as_slice() {
            [] => why,
            passed => format!(
                "{why}; {} signature(s) passed over: {}",
                passed.len(),
                passed.join("; ")
            ),
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
                Err(Failure::Refused(format!(
                    "{what} ({n} bytes) is past the {SIGNATURE_BUDGET_BYTES} bytes of signatures \
                 fetched per module; the search stopped there"
                )))
            }
        }
    }
}

impl Puller {
    /// The cosign signatures the registry holds for manifest `digest`:
    /// sigstore bundles among its referrers (the referrers API, or the
    /// `sha256-<hex>` tag where the registry has none), then the
    /// `sha256-<hex>.sig` tag. It stops at the first one `enough` accepts.
    /// Absent signatures are not errors, and neither is a bad one (too
    /// big, wrong digest, not a manifest): it is passed over with its
    /// reason, so junk pushed beside a real signature cannot block the
    /// module. A registry that cannot be asked is an error.
    pub(super) async fn signatures(
        &self,
        r: &OciRef,
        auth: &RegistryAuth,
        digest: &str,
        enough: impl Fn(&Evidence) -> bool,
    ) -> Result<Found, Failure> {
        let subject = Reference::with_digest(
            r.registry.clone(),
            r.repository.clone(),
            format!("sha256:{digest}"),
        );
        let mut found = Found::default();
        let mut budget = Budget {
            left: SIGNATURE_BUDGET_BYTES,
            spent: false,
        };
        let index = self.referrers(r, auth, &subject, digest).await?;
        // Registries may ignore the filter.
        let bundles = index
            .manifests
            .iter()
            .filter(|m| m.artifact_type.as_deref() == Some(BUNDLE_MEDIA_TYPE));
        for entry in bundles {
            match self.bundles_at(r, auth, entry, &mut budget).await {
                Ok(bundles) => {
                    for bundle in bundles {
                        let e = Evidence::Bundle {
                            manifest: entry.digest.clone(),
                            bundle,
                        };
                        let done = enough(&e);
                        found.evidence.push(e);
                        if done {
                            return Ok(found);
                        }
                    }
                }
                Err(Failure::Refused(why)) => {
                    found
                        .passed_over
                        .push(format!("referrer {}: {why}", entry.digest));
                    if budget.spent {
                        return Ok(found);
                    }
                }
                Err(unreachable) => return Err(unreachable),
            }
        }
        let sig_tag = Reference::with_tag(
            r.registry.clone(),
            r.repository.clone(),
            format!("sha256-{digest}.sig"),
        );
        let manifest = match self
            .signature_manifest(r, auth, &sig_tag, "", &mut budget)
            .await
        {
            Ok(m) => m,
            Err(Failure::Refused(why)) => {
                found.passed_over.push(format!("{sig_tag}: {why}"));
                return Ok(found);
            }
            Err(unreachable) => return Err(unreachable),
        };
        for layer in manifest.iter().flat_map(|m| &m.layers) {
            if layer.media_type != SIMPLE_SIGNING_MEDIA_TYPE {
                continue;
            }
            let Some(signature) = layer
                .annotations
                .as_ref()
                .and_then(|a| a.get(SIGNATURE_ANNOTATION))
            else {
                continue;
            };
            match self.signature_blob(r, &sig_tag, layer, &mut budget).await {
                Ok(payload) => {
                    let e = Evidence::SimpleSigning {
                        layer: layer.digest.clone(),
                        payload,
                        signature: signature.clone(),
                    };
                    let done = enough(&e);
                    found.evidence.push(e);
                    if done {
                        break;
                    }
                }
                Err(Failure::Refused(why)) => {
                    found
                        .passed_over
                        .push(format!("{sig_tag} layer {}: {why}", layer.digest));
                    if budget.spent {
                        break;
                    }
                }
                Err(unreachable) => return Err(unreachable),
            }
        }
        Ok(found)
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
                Failure::Refused(format!(
                    "{DOING}: the referrers index is not an image index: {e}"
                ))
            }),
        }
    }

    /// The sigstore bundles of one referrer, `entry` of the index.
    async fn bundles_at(
        &self,
        r: &OciRef,
        auth: &RegistryAuth,
        entry: &oci_client::manifest::ImageIndexEntry,
        budget: &mut Budget,
    ) -> Result<Vec<Vec<u8>>, Failure> {
        let declared = u64::try_from(entry.size).unwrap_or(u64::MAX);
        if declared > MAX_SIGNATURE_BYTES {
            return Err(too_big("manifest", &entry.digest, declared));
        }
        let at = Reference::with_digest(
            r.registry.clone(),
            r.repository.clone(),
            entry.digest.clone(),
        );
        let Some(manifest) = self
            .signature_manifest(r, auth, &at, &entry.digest, budget)
            .await?
        else {
            return Ok(Vec::new());
        };
        let mut bundles = Vec::new();
        for layer in manifest
            .layers
            .iter()
            .filter(|l| l.media_type == BUNDLE_MEDIA_TYPE)
        {
            bundles.push(self.signature_blob(r, &at, layer, budget).await?);
        }
        Ok(bundles)
    }

    /// A signature's manifest; `None` when the registry has none there.
    /// `digest` (when not empty) is checked against the bytes.
    async fn signature_manifest(
        &self,
        r: &OciRef,
        auth: &RegistryAuth,
        at: &Reference,
        digest: &str,
        budget: &mut Budget,
    ) -> Result<Option<OciImageManifest>, Failure> {
        // Read under the size any signature has; the budget counts what
        // was read (so the search costs at most the budget plus one).
        let bytes = match self
            .manifest_bounded(&Read {
                r,
                auth,
                at,
                accept: &[OCI_IMAGE_MEDIA_TYPE, DOCKER_MANIFEST_MEDIA_TYPE],
                limit: MAX_SIGNATURE_BYTES,
                doing: "fetching a signature",
            })
            .await?
        {
            Some(bytes) => bytes,
            // No such tag: not signed in that form.
            None => return Ok(None),
        };
        budget.take(bytes.len() as u64, &format!("the signature manifest {at}"))?;
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
        budget: &mut Budget,
    ) -> Result<Vec<u8>, Failure> {
        let declared = u64::try_from(layer.size).unwrap_or(u64::MAX);
        // Refused on what the manifest declares, before any download.
        if declared > MAX_SIGNATURE_BYTES {
            return Err(too_big("layer", &layer.digest, declared));
        }
        budget.take(declared, &format!("the signature layer {}", layer.digest))?;
        let mut blob = self
            .client
            .pull_blob_stream(at, layer)
            .await
            .map_err(|e| explain(&self.auths, r, "fetching a signature", e))?;
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
}

/// A signature `what` (manifest, layer) over the size any signature has.
fn too_big(what: &str, name: &str, bytes: u64) -> Failure {
    Failure::Refused(format!(
        "the signature {what} {name} is {bytes} bytes, over the {MAX_SIGNATURE_BYTES} a cosign \
         signature may have; not downloaded"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(budget.spent, "{why}");
        assert!(why.contains("sha256:x") && why.contains("stopped"), "{why}");
    }

    #[test]
    fn a_refusal_names_what_was_passed_over() {
        let none = Found::default();
        assert_eq!(none.refusal("not signed".into()), "not signed");
        let found = Found {
            evidence: Vec::new(),
            passed_over: vec!["referrer sha256:a: too big".into(), "b: not JSON".into()],
        };
        let why = found.refusal("not signed".into());
        assert!(
            why.starts_with("not signed; 2 signature(s) passed over")
                && why.contains("sha256:a: too big")
                && why.contains("b: not JSON"),
            "{why}"
        );
    }
}
