//! The WebAssembly OCI artifact: the media types, and which layer of a
//! manifest is the component.

use oci_client::manifest::{OCI_IMAGE_INDEX_MEDIA_TYPE, OCI_IMAGE_MEDIA_TYPE, OciImageManifest};

/// The config media type of a WebAssembly OCI artifact.
pub const WASM_CONFIG_MEDIA_TYPE: &str = "application/vnd.wasm.config.v0+json";
/// The layer media type of a WebAssembly OCI artifact: the component.
pub const WASM_LAYER_MEDIA_TYPE: &str = "application/wasm";
/// The layer type of the older `wasm-to-oci` convention, also accepted.
const LEGACY_WASM_LAYER_MEDIA_TYPE: &str = "application/vnd.wasm.content.layer.v1+wasm";

/// The component layer of a WebAssembly artifact's manifest.
pub(super) fn wasm_layer(manifest: &[u8]) -> Result<oci_client::manifest::OciDescriptor, String> {
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

/// A WebAssembly artifact's manifest with `layers` (media type, digest).
#[cfg(test)]
pub(super) fn test_manifest(layers: &[(&str, &str)]) -> Vec<u8> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wasm_layer_is_found_or_its_absence_explained() {
        let d = format!("sha256:{}", "a".repeat(64));
        assert_eq!(
            wasm_layer(&test_manifest(&[(WASM_LAYER_MEDIA_TYPE, &d)]))
                .unwrap()
                .digest,
            d
        );
        let e = wasm_layer(&test_manifest(&[(
            "application/vnd.oci.image.layer.v1.tar",
            &d,
        )]))
        .unwrap_err();
        assert!(
            e.contains("not a WebAssembly artifact") && e.contains("oras push"),
            "{e}"
        );
        let e = wasm_layer(&test_manifest(&[
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
}
