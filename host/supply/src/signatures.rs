//! Cosign-compatible signatures of `oci://` modules, checked against the
//! public keys the config names (`moduleSignatures.keys`), offline.
//!
//! This module is the pure part: keys, the two forms a cosign signature
//! takes in a registry, and the decision whether one of them signs a given
//! manifest digest. Fetching the signatures is [`crate::oci`]'s job (`oci/signed.rs`).
//!
//! The two forms, both made by `cosign sign --key`:
//! - **Sigstore bundle** (cosign 3's default): an OCI referrer of the
//!   module's manifest, artifact type
//!   `application/vnd.dev.sigstore.bundle.v0.3+json`, whose one layer is the
//!   bundle. The bundle's DSSE envelope carries an in-toto statement whose
//!   subject is the manifest's sha256 and whose predicate type is
//!   `https://sigstore.dev/cosign/sign/v1`; the signature is over the
//!   envelope's pre-authentication encoding (PAE).
//! - **Simple signing** (cosign 2's default, `--new-bundle-format=false` in
//!   cosign 3): the tag `sha256-<hex>.sig` in the module's repository, an
//!   image whose layers are `application/vnd.dev.cosign.simplesigning.v1+json`
//!   payloads naming the manifest digest, each signed in the layer's
//!   `dev.cosignproject.cosign/signature` annotation.
//!
//! What is not checked, and why: no transparency log (Rekor) or timestamp
//! authority can be reached from a cluster here, so an entry in a bundle is
//! neither required nor consulted; a signature is exactly as trustworthy as
//! the custody of the private key. Keyless (certificate) signatures are not
//! accepted: they need Fulcio's roots and a transparency log.

use base64::{Engine as _, engine::general_purpose::STANDARD as BASE64};
use rustls::pki_types::{SignatureVerificationAlgorithm, SubjectPublicKeyInfoDer, pem::PemObject};
use serde::{Deserialize, Serialize};
use webpki::{Error as WebpkiError, RawPublicKeyEntity, ring as algs};

pub use crate::error::{KeyError, Rejected, SignatureError};
pub use crate::handoff::Verified;

/// The artifact type (and layer media type) of a sigstore bundle referrer.
pub const BUNDLE_MEDIA_TYPE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";
/// The layer media type of a simple-signing signature.
pub const SIMPLE_SIGNING_MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The layer annotation holding a simple-signing signature (base64).
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// The predicate type of `cosign sign`'s in-toto statement.
pub const COSIGN_SIGN_PREDICATE: &str = "https://sigstore.dev/cosign/sign/v1";
const IN_TOTO_PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
const SIMPLE_SIGNING_TYPE: &str = "cosign container image signature";

/// The algorithms a cosign key can sign with, paired as cosign pairs them
/// (`--signing-algorithm`): the hash is fixed by the key's type.
const ALGORITHMS: &[&dyn SignatureVerificationAlgorithm] = &[
    algs::ECDSA_P256_SHA256,
    algs::ECDSA_P384_SHA384,
    algs::ED25519,
    algs::RSA_PKCS1_2048_8192_SHA256,
    algs::RSA_PSS_2048_8192_SHA256_LEGACY_KEY,
];

/// One public key: where it came from (for messages) and its
/// SubjectPublicKeyInfo.
#[derive(Clone, Debug)]
pub struct PublicKey {
    pub name: String,
    spki: Vec<u8>,
    /// What signatures by this key may use: one, except for RSA (PKCS#1
    /// v1.5 and PSS share the key type).
    algorithms: Vec<&'static dyn SignatureVerificationAlgorithm>,
}

impl PublicKey {
    /// A PEM `PUBLIC KEY` (what `cosign generate-key-pair` writes as
    /// `cosign.pub`); `name` says where it came from.
    pub fn from_pem(name: &str, pem: &[u8]) -> Result<PublicKey, KeyError> {
        let spki = SubjectPublicKeyInfoDer::from_pem_slice(pem).map_err(|e| KeyError::NotPem {
            name: name.to_string(),
            source: Box::new(e),
        })?;
        let algorithms = key_algorithms(&spki);
        if algorithms.is_empty() {
            return Err(KeyError::Unsupported {
                name: name.to_string(),
            });
        }
        Ok(PublicKey {
            name: name.to_string(),
            spki: spki.as_ref().to_vec(),
            algorithms,
        })
    }

    fn verifies(&self, message: &[u8], signature: &[u8]) -> bool {
        let spki = SubjectPublicKeyInfoDer::from(self.spki.as_slice());
        let Ok(key) = RawPublicKeyEntity::try_from(&spki) else {
            return false;
        };
        self.algorithms
            .iter()
            .any(|alg| key.verify_signature(*alg, message, signature).is_ok())
    }
}

/// The algorithms a key signs with, found by asking webpki which ones its
/// SubjectPublicKeyInfo belongs to: a wrong pairing is refused before any
/// arithmetic, a right one fails only on the (empty) signature.
fn key_algorithms(
    spki: &SubjectPublicKeyInfoDer<'_>,
) -> Vec<&'static dyn SignatureVerificationAlgorithm> {
    let Ok(key) = RawPublicKeyEntity::try_from(spki) else {
        return Vec::new();
    };
    ALGORITHMS
        .iter()
        .filter(|alg| {
            matches!(
                key.verify_signature(**alg, b"", b""),
                Err(WebpkiError::InvalidSignatureForPublicKey)
            )
        })
        .copied()
        .collect()
}

/// A signature as found in the registry, kept (in the pull cache) so that a
/// cached module is verified again, offline, against the keys of the
/// config it is loaded under.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "form", rename_all = "kebab-case")]
pub enum Evidence {
    /// A sigstore bundle (JSON), from a referrer.
    Bundle {
        /// The referrer manifest's digest (for messages).
        manifest: String,
        #[serde(with = "base64_bytes")]
        bundle: Vec<u8>,
    },
    /// A simple-signing payload and its signature, from the `.sig` tag.
    SimpleSigning {
        /// The payload layer's digest (for messages).
        layer: String,
        #[serde(with = "base64_bytes")]
        payload: Vec<u8>,
        /// The annotation's value, base64 as cosign writes it.
        signature: String,
    },
}

impl Evidence {
    fn describe(&self) -> String {
        match self {
            Evidence::Bundle { manifest, .. } => format!("sigstore bundle {manifest}"),
            Evidence::SimpleSigning { layer, .. } => format!("simple-signing payload {layer}"),
        }
    }
}

/// Which key signed `manifest_hex` (64 hex digits) among `evidence`, or
/// why none did: every signature's reason, so that a wrong key is told
/// apart from a signature of another module.
pub fn verify(
    manifest_hex: &str,
    evidence: &[Evidence],
    keys: &[PublicKey],
) -> Result<Verified, SignatureError> {
    let mut rejected = Vec::new();
    for e in evidence {
        match verify_one(manifest_hex, e, keys) {
            Ok(key) => {
                return Ok(Verified {
                    key: key.to_string(),
                    signature: e.describe(),
                });
            }
            Err(why) => rejected.push(Rejected {
                signature: e.describe(),
                why,
            }),
        }
    }
    let manifest = manifest_hex.to_string();
    let keys = keys.iter().map(|k| k.name.clone()).collect();
    if evidence.is_empty() {
        return Err(SignatureError::Unsigned { manifest, keys });
    }
    Err(SignatureError::Invalid {
        manifest,
        keys,
        rejected,
    })
}

fn verify_one<'k>(
    manifest_hex: &str,
    evidence: &Evidence,
    keys: &'k [PublicKey],
) -> Result<&'k str, String> {
    let (message, signatures, subject) = match evidence {
        Evidence::Bundle { bundle, .. } => {
            let envelope = parse_bundle(bundle)?;
            let statement: serde_json::Value = serde_json::from_slice(&envelope.payload)
                .map_err(|e| format!("its payload is not an in-toto statement: {e}"))?;
            (
                pae(&envelope.payload_type, &envelope.payload),
                envelope.signatures,
                statement_subject(&statement, manifest_hex)?,
            )
        }
        Evidence::SimpleSigning {
            payload, signature, ..
        } => {
            let payload_json: serde_json::Value = serde_json::from_slice(payload)
                .map_err(|e| format!("the payload is not JSON: {e}"))?;
            let signature = BASE64
                .decode(signature.trim())
                .map_err(|e| format!("its signature annotation is not base64: {e}"))?;
            (
                payload.clone(),
                vec![signature],
                simple_signing_subject(&payload_json, manifest_hex)?,
            )
        }
    };
    subject?;
    for key in keys {
        if signatures.iter().any(|s| key.verifies(&message, s)) {
            return Ok(&key.name);
        }
    }
    Err("the signature does not verify under any configured key".to_string())
}

struct Envelope {
    payload_type: String,
    payload: Vec<u8>,
    signatures: Vec<Vec<u8>>,
}

fn parse_bundle(bundle: &[u8]) -> Result<Envelope, String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Bundle {
        media_type: Option<String>,
        dsse_envelope: Option<Dsse>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Dsse {
        payload: String,
        payload_type: String,
        #[serde(default)]
        signatures: Vec<DsseSignature>,
    }
    #[derive(Deserialize)]
    struct DsseSignature {
        sig: String,
    }
    let b: Bundle =
        serde_json::from_slice(bundle).map_err(|e| format!("not a sigstore bundle: {e}"))?;
    if let Some(t) = &b.media_type
        && !t.starts_with("application/vnd.dev.sigstore.bundle")
    {
        return Err(format!("its media type is {t}, not a sigstore bundle"));
    }
    let dsse = b.dsse_envelope.ok_or(
        "it holds no DSSE envelope (a bundle of `cosign sign-blob` or an attestation of \
         another kind, not `cosign sign`)",
    )?;
    if dsse.payload_type != IN_TOTO_PAYLOAD_TYPE {
        return Err(format!(
            "its payload type is {}, not {IN_TOTO_PAYLOAD_TYPE}",
            dsse.payload_type
        ));
    }
    let payload = BASE64
        .decode(&dsse.payload)
        .map_err(|e| format!("its payload is not base64: {e}"))?;
    let signatures = dsse
        .signatures
        .iter()
        .map(|s| BASE64.decode(&s.sig))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("a signature is not base64: {e}"))?;
    if signatures.is_empty() {
        return Err("its envelope has no signature".into());
    }
    Ok(Envelope {
        payload_type: dsse.payload_type,
        payload,
        signatures,
    })
}

/// DSSE's pre-authentication encoding: what a DSSE signature signs.
fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut m = format!(
        "DSSEv1 {} {payload_type} {} ",
        payload_type.len(),
        payload.len()
    )
    .into_bytes();
    m.extend_from_slice(payload);
    m
}

/// Whether an in-toto statement is `cosign sign`'s statement about this
/// manifest. The outer `Result` is a malformed statement, the inner one a
/// statement about something else: both refuse.
fn statement_subject(
    statement: &serde_json::Value,
    manifest_hex: &str,
) -> Result<Result<(), String>, String> {
    let predicate = statement["predicateType"].as_str().unwrap_or_default();
    if predicate != COSIGN_SIGN_PREDICATE {
        return Ok(Err(format!(
            "its statement's predicate type is {predicate:?}, not {COSIGN_SIGN_PREDICATE} \
             (an attestation, not a signature)"
        )));
    }
    let subjects = statement["subject"]
        .as_array()
        .ok_or("its statement has no subject")?;
    let named: Vec<&str> = subjects
        .iter()
        .filter_map(|s| s["digest"]["sha256"].as_str())
        .collect();
    if named.iter().any(|d| d.eq_ignore_ascii_case(manifest_hex)) {
        Ok(Ok(()))
    } else {
        Ok(Err(format!(
            "it signs sha256:{}, not this manifest",
            named.join(", sha256:")
        )))
    }
}

/// Whether a simple-signing payload names this manifest.
fn simple_signing_subject(
    payload: &serde_json::Value,
    manifest_hex: &str,
) -> Result<Result<(), String>, String> {
    let critical = &payload["critical"];
    let kind = critical["type"].as_str().unwrap_or_default();
    if kind != SIMPLE_SIGNING_TYPE {
        return Err(format!(
            "its payload's type is {kind:?}, not {SIMPLE_SIGNING_TYPE:?}"
        ));
    }
    let digest = critical["image"]["docker-manifest-digest"]
        .as_str()
        .ok_or("its payload names no docker-manifest-digest")?;
    if digest.eq_ignore_ascii_case(&format!("sha256:{manifest_hex}")) {
        Ok(Ok(()))
    } else {
        Ok(Err(format!("it signs {digest}, not this manifest")))
    }
}

mod base64_bytes {
    use base64::{Engine as _, engine::general_purpose::STANDARD};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        STANDARD.decode(text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::{
        rand::SystemRandom,
        signature::{ECDSA_P256_SHA256_ASN1_SIGNING, EcdsaKeyPair, KeyPair},
    };

    const MANIFEST: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const OTHER: &str = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";

    /// A P-256 key pair as cosign makes one, and its public key as PEM.
    fn key_pair() -> (EcdsaKeyPair, Vec<u8>) {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng)
            .unwrap();
        // SubjectPublicKeyInfo: id-ecPublicKey, prime256v1, the point.
        let mut spki = hex::decode("3059301306072a8648ce3d020106082a8648ce3d030107034200").unwrap();
        spki.extend_from_slice(pair.public_key().as_ref());
        let pem = format!(
            "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
            BASE64.encode(&spki)
        );
        (pair, pem.into_bytes())
    }

    fn sign(pair: &EcdsaKeyPair, message: &[u8]) -> Vec<u8> {
        pair.sign(&SystemRandom::new(), message)
            .unwrap()
            .as_ref()
            .to_vec()
    }

    fn bundle(pair: &EcdsaKeyPair, subject: &str, predicate: &str) -> Evidence {
        let statement = serde_json::json!({
            "_type": "https://in-toto.io/Statement/v1",
            "subject": [{"digest": {"sha256": subject}}],
            "predicateType": predicate,
            "predicate": {},
        });
        let payload = serde_json::to_vec(&statement).unwrap();
        let sig = sign(pair, &pae(IN_TOTO_PAYLOAD_TYPE, &payload));
        let bundle = serde_json::json!({
            "mediaType": BUNDLE_MEDIA_TYPE,
            "verificationMaterial": {"publicKey": {"hint": "x"}},
            "dsseEnvelope": {
                "payload": BASE64.encode(&payload),
                "payloadType": IN_TOTO_PAYLOAD_TYPE,
                "signatures": [{"sig": BASE64.encode(sig), "keyid": ""}],
            },
        });
        Evidence::Bundle {
            manifest: "sha256:referrer".into(),
            bundle: serde_json::to_vec(&bundle).unwrap(),
        }
    }

    fn simple(pair: &EcdsaKeyPair, subject: &str) -> Evidence {
        let payload = serde_json::to_vec(&serde_json::json!({
            "critical": {
                "identity": {"docker-reference": "registry/repo"},
                "image": {"docker-manifest-digest": format!("sha256:{subject}")},
                "type": SIMPLE_SIGNING_TYPE,
            },
            "optional": null,
        }))
        .unwrap();
        let signature = BASE64.encode(sign(pair, &payload));
        Evidence::SimpleSigning {
            layer: "sha256:layer".into(),
            payload,
            signature,
        }
    }

    #[test]
    fn both_forms_verify_under_the_signing_key_only() {
        let (pair, pem) = key_pair();
        let (other_pair, other_pem) = key_pair();
        let key = PublicKey::from_pem("signer.pub", &pem).unwrap();
        let other = PublicKey::from_pem("other.pub", &other_pem).unwrap();
        for evidence in [
            bundle(&pair, MANIFEST, COSIGN_SIGN_PREDICATE),
            simple(&pair, MANIFEST),
        ] {
            let ok = verify(
                MANIFEST,
                std::slice::from_ref(&evidence),
                &[other.clone(), key.clone()],
            )
            .unwrap();
            assert_eq!(ok.key, "signer.pub");
            let err = verify(
                MANIFEST,
                std::slice::from_ref(&evidence),
                std::slice::from_ref(&other),
            )
            .unwrap_err();
            // Typed: which manifest, which keys, and each signature's reason.
            let SignatureError::Invalid {
                manifest,
                keys,
                rejected,
            } = &err
            else {
                panic!("{err:?}")
            };
            assert_eq!(
                (manifest.as_str(), keys.as_slice()),
                (MANIFEST, &["other.pub".to_string()][..])
            );
            assert_eq!(rejected.len(), 1);
            assert_eq!(rejected[0].signature, evidence.describe());
            let err = err.to_string();
            assert!(
                err.contains("does not verify under any configured key"),
                "{err}"
            );
            assert!(err.contains("other.pub"), "{err}");
        }
        // The other key's signature is found among several.
        let mixed = [
            simple(&pair, MANIFEST),
            bundle(&other_pair, MANIFEST, COSIGN_SIGN_PREDICATE),
        ];
        assert_eq!(verify(MANIFEST, &mixed, &[other]).unwrap().key, "other.pub");
    }

    #[test]
    fn a_valid_signature_of_another_manifest_is_refused() {
        let (pair, pem) = key_pair();
        let key = PublicKey::from_pem("signer.pub", &pem).unwrap();
        for evidence in [
            bundle(&pair, OTHER, COSIGN_SIGN_PREDICATE),
            simple(&pair, OTHER),
        ] {
            let err = verify(MANIFEST, &[evidence], std::slice::from_ref(&key))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(&format!("signs sha256:{OTHER}, not this manifest")),
                "{err}"
            );
        }
        // An attestation by the same key is not a signature.
        let att = bundle(&pair, MANIFEST, "https://slsa.dev/provenance/v1");
        let err = verify(MANIFEST, &[att], &[key]).unwrap_err().to_string();
        assert!(err.contains("an attestation, not a signature"), "{err}");
    }

    #[test]
    fn tampering_with_the_payload_breaks_the_signature() {
        let (pair, pem) = key_pair();
        let key = PublicKey::from_pem("signer.pub", &pem).unwrap();
        let Evidence::SimpleSigning {
            layer,
            mut payload,
            signature,
        } = simple(&pair, MANIFEST)
        else {
            unreachable!()
        };
        // Same JSON meaning, other bytes: the signature covers the bytes.
        payload.push(b' ');
        let err = verify(
            MANIFEST,
            &[Evidence::SimpleSigning {
                layer,
                payload,
                signature,
            }],
            &[key],
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("does not verify"), "{err}");
    }

    #[test]
    fn no_signature_at_all_says_how_it_was_looked_for() {
        let (_, pem) = key_pair();
        let key = PublicKey::from_pem("/etc/portwise/keys/cosign.pub", &pem).unwrap();
        let err = verify(MANIFEST, &[], &[key]).unwrap_err();
        assert_eq!(
            err,
            SignatureError::Unsigned {
                manifest: MANIFEST.into(),
                keys: vec!["/etc/portwise/keys/cosign.pub".into()],
            }
        );
        let err = err.to_string();
        assert!(err.contains("not signed"), "{err}");
        assert!(err.contains(&format!("sha256-{MANIFEST}.sig")), "{err}");
        assert!(err.contains("/etc/portwise/keys/cosign.pub"), "{err}");
    }

    #[test]
    fn keys_that_are_not_cosign_public_keys_are_refused_by_name() {
        let err = PublicKey::from_pem("k.pub", b"not pem").unwrap_err();
        assert!(
            matches!(&err, KeyError::NotPem { name, .. } if name == "k.pub"),
            "{err:?}"
        );
        let err = err.to_string();
        assert!(err.starts_with("k.pub: not a PEM public key"), "{err}");
        // A private key where the public one belongs: a common mistake.
        let err = PublicKey::from_pem(
            "cosign.key",
            b"-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("cosign.key: not a PEM public key"), "{err}");
    }

    #[test]
    fn malformed_signatures_are_reasons_not_panics() {
        let (_, pem) = key_pair();
        let key = PublicKey::from_pem("k.pub", &pem).unwrap();
        let cases = [
            Evidence::Bundle {
                manifest: "m".into(),
                bundle: b"{".to_vec(),
            },
            Evidence::Bundle {
                manifest: "m".into(),
                bundle: br#"{"mediaType":"application/vnd.dev.sigstore.bundle.v0.3+json","messageSignature":{}}"#.to_vec(),
            },
            Evidence::SimpleSigning {
                layer: "l".into(),
                payload: b"[]".to_vec(),
                signature: "!!".into(),
            },
        ];
        let err = verify(MANIFEST, &cases, &[key]).unwrap_err().to_string();
        assert!(err.contains("not a sigstore bundle"), "{err}");
        assert!(err.contains("no DSSE envelope"), "{err}");
        assert!(err.contains("not base64"), "{err}");
    }

    #[test]
    fn evidence_round_trips_through_the_cache_format() {
        let (pair, _) = key_pair();
        for e in [
            bundle(&pair, MANIFEST, COSIGN_SIGN_PREDICATE),
            simple(&pair, MANIFEST),
        ] {
            let text = serde_json::to_string(&e).unwrap();
            assert_eq!(serde_json::from_str::<Evidence>(&text).unwrap(), e);
        }
    }
}
