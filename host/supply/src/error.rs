//! The errors the supply hands to the runtime and the binary.
//!
//! Compiled with or without `fetch`, because the runtime names them
//! ([`crate::Supply`]) and builds without `fetch`: the errors of libraries
//! only `fetch` brings (the registry client, the HTTP stack, the PEM
//! parser, the file watcher) are kept as boxed sources, which a caller can
//! still downcast.

use std::{io, path::PathBuf, sync::Arc};

/// A library error kept as a source (see the module docs).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `n` bytes for a message: whole MiB when it is a whole number of them.
fn bytes_text(n: usize) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else {
        format!("{n} bytes")
    }
}

/// Why a module file's bytes are not a component to compile
/// ([`crate::decode`]).
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("not a valid gzip file: {0}")]
    Gzip(#[source] io::Error),
    #[error(
        "gunzips to more than {}, the limit for a module's gunzipped size",
        bytes_text(*max)
    )]
    TooLarge { max: usize },
    #[error("gzip-compressed, not WebAssembly: only a file named *.wasm.gz is gunzipped (once)")]
    Gzipped,
    #[error("not a WebAssembly file (no \\0asm header)")]
    NotWasm,
    #[error(
        "a core WebAssembly module, not a component: build for wasm32-wasip2, or wrap it with \
         `wasm-tools component new` and the WASI preview1 adapter"
    )]
    CoreModule,
}

/// Why a module file could not be read ([`crate::ModuleFile::read`]).
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{}: not a file name", path.display())]
    NotAFileName { path: PathBuf },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Why the modules directory is not watched ([`crate::Supply::watch`]): the
/// watcher's error (`notify::Error`).
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct WatchError(pub BoxError);

/// Why a public key of `moduleSignatures` is not usable
/// ([`crate::signatures::PublicKey::from_pem`]).
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("{name}: not a PEM public key (-----BEGIN PUBLIC KEY-----, as cosign.pub): {source}")]
    NotPem {
        name: String,
        #[source]
        source: BoxError,
    },
    #[error(
        "{name}: a public key of a type cosign does not sign with; \
         ECDSA P-256 (cosign's default), P-384, Ed25519 and RSA are accepted"
    )]
    Unsupported { name: String },
}

/// Why a puller could not be set up ([`crate::Supply::puller`]): the files
/// the configuration names, or the registry client.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("cannot read registryAuth {}: {source}", path.display())]
    AuthRead {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A Docker config that does not parse; `why` says which entry.
    #[error("registryAuth {}: {why}", path.display())]
    Auth { path: PathBuf, why: String },
    #[error("cannot read registryCA {}: {source}", path.display())]
    CaRead {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("registryCA is not a PEM bundle: {0}")]
    CaPem(#[source] BoxError),
    #[error("moduleSignatures: cannot read the public key {name}: {source}")]
    KeyRead {
        name: String,
        #[source]
        source: io::Error,
    },
    #[error("moduleSignatures: {0}")]
    Key(#[source] KeyError),
    #[error("cannot set up the registry client: {0}")]
    Client(#[source] BoxError),
}

/// One signature that does not sign the module under the configured keys,
/// and why ([`SignatureError::Invalid`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejected {
    /// Which signature (`sigstore bundle sha256:...`).
    pub signature: String,
    pub why: String,
}

/// Why no configured key signed a manifest
/// ([`crate::signatures::verify`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error(
        "it is not signed: the registry has no cosign signature of sha256:{manifest} \
         (neither a sigstore bundle referrer nor the sha256-{manifest}.sig tag), and \
         moduleSignatures requires one by {}",
        keys.join(" or ")
    )]
    Unsigned {
        /// The manifest's digest, 64 hex digits.
        manifest: String,
        /// The configured keys' names.
        keys: Vec<String>,
    },
    #[error(
        "none of its {} signature(s) is a valid signature of sha256:{manifest} by {}: {}",
        rejected.len(),
        keys.join(" or "),
        rejected.iter().map(|r| format!("{}: {}", r.signature, r.why)).collect::<Vec<_>>().join("; ")
    )]
    Invalid {
        manifest: String,
        keys: Vec<String>,
        /// Every signature found, each with its reason.
        rejected: Vec<Rejected>,
    },
}

/// Why an `oci://` module was not pulled ([`crate::Pull::pull`]).
#[derive(Clone, Debug, thiserror::Error)]
pub enum PullError {
    /// The puller could not be set up, so no module is pulled.
    #[error("{0}")]
    Setup(#[source] Arc<SetupError>),
    /// The manifest the registry sent is not the one the reference pins.
    #[error(
        "the registry's manifest has sha256:{actual}, not the sha256:{expected} the reference \
         pins; refused"
    )]
    PinMismatch {
        /// The reference's digest, 64 hex digits.
        expected: String,
        /// The manifest's.
        actual: String,
    },
    /// The layer's bytes are not the ones its manifest names.
    #[error(
        "the layer's content has sha256:{actual}, not the sha256:{expected} its manifest names"
    )]
    LayerMismatch { expected: String, actual: String },
    /// Under `moduleSignatures`, no configured key signed the manifest;
    /// `passed_over` are the signatures found but not usable (too big,
    /// malformed, unreadable), each with why.
    #[error("{source}{}", passed_over_text(passed_over))]
    Unsigned {
        #[source]
        source: SignatureError,
        passed_over: Vec<String>,
    },
    /// The registry refused, or sent something this puller refuses; the
    /// text names the registry, the step and whose credentials.
    #[error("{0}")]
    Refused(String),
    /// The registry could not be asked; `cached` is why the pull cache's
    /// copy was not served instead.
    #[error("{why}{}", match cached { Some(c) => format!("; the cached copy is not served: {c}"), None => String::new() })]
    Unreachable {
        why: String,
        cached: Option<SignatureError>,
    },
}

fn passed_over_text(passed: &[String]) -> String {
    match passed {
        [] => String::new(),
        passed => format!(
            "; {} signature(s) passed over: {}",
            passed.len(),
            passed.join("; ")
        ),
    }
}
