//! Fetching a module's cosign signatures from its registry (checking
//! them is [`crate::signatures`]'s job): the sigstore bundles among the
//! manifest's referrers, and the `sha256-<hex>.sig` tag. Each manifest and
//! layer is small and must match its digest.

use futures::StreamExt;
use oci_client::{
    Reference, manifest::OCI_IMAGE_MEDIA_TYPE, manifest::OciImageManifest, secrets::RegistryAuth,
};
use portwise_core::config::OciRef;

use super::{
    Puller,
    errors::{Failure, error_chain, explain, is_not_found},
};
use crate::{
    content::sha256_hex,
    signatures::{BUNDLE_MEDIA_TYPE, Evidence, SIGNATURE_ANNOTATION, SIMPLE_SIGNING_MEDIA_TYPE},
};

/// A signature manifest or blob larger than this is not a cosign signature.
const MAX_SIGNATURE_BYTES: u64 = 1 << 20;
/// Signatures looked at per module, at most (each is a download).
const MAX_SIGNATURES: usize = 16;
/// What a registry may answer for an image manifest (Docker's schema 2 for
/// signatures pushed by older tools).
const DOCKER_MANIFEST_MEDIA_TYPE: &str = "application/vnd.docker.distribution.manifest.v2+json";

impl Puller {
    /// The cosign signatures the registry holds for manifest `digest`:
    /// sigstore bundles among its referrers (the referrers API, or the
    /// `sha256-<hex>` tag where the registry has none), then the
    /// `sha256-<hex>.sig` tag. Absent ones are not errors; a registry that
    /// cannot be asked is.
    pub(super) async fn signatures(
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
            .map_err(|e| {
                explain(
                    &self.auths,
                    r,
                    "listing the module's signatures (referrers)",
                    e,
                )
            })?;
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
            Err(e) => return Err(explain(&self.auths, r, "fetching a signature", e)),
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
