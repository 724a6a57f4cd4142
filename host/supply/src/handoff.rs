//! What crosses from the supply to the runtime, and what the runtime may
//! ask of it.
//!
//! The runtime (`portwise-wasm`) reads the modules directory itself
//! ([`crate::modules_dir`]) and keeps compiled code in the sealed store
//! ([`crate::sealed`]): both need nothing but the local disk. Everything
//! else it is handed as a [`Supply`], built by whoever builds the runtime
//! (`Supplier`, feature `fetch`): gunzipping a `.wasm.gz`, watching
//! the directory, pulling `oci://` modules. So the runtime crate builds
//! without the registry client, the signature verifier, the file watcher
//! and gzip, and `cargo tree -p portwise-wasm` shows it.

use std::{
    future::Future,
    path::{Path, PathBuf},
    pin::Pin,
    time::Duration,
};

use crate::{
    content::Content,
    decode::Component,
    error::{DecodeError, PullError, SetupError, WatchError},
};
use portwise_core::config::OciRef;

/// A boxed future, `Send`, as trait objects return them.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a runtime asks of the supply besides the local disk.
pub trait Supply: Send + Sync {
    /// The component module `name` holds: `stored` (whose sha256 is
    /// `stored_sha256`) gunzipped when the name says `.wasm.gz` (to at most
    /// `max_gunzipped` bytes), then checked to look like a component. CPU
    /// bound: the runtime calls it on its blocking pool.
    fn component<'a>(
        &self,
        name: &str,
        stored: &'a [u8],
        stored_sha256: &str,
        max_gunzipped: usize,
    ) -> Result<Component<'a>, DecodeError>;

    /// Starts watching the modules directory `dir`.
    fn watch(&self, dir: &Path) -> Result<Watching, WatchError>;

    /// A puller of `oci://` modules under `config`, keeping verified content
    /// in `cache` (`None`: every start pulls).
    fn puller(
        &self,
        config: &OciConfig,
        cache: Option<PathBuf>,
    ) -> Result<Box<dyn Pull>, SetupError>;
}

/// Pulls `oci://` modules ([`Supply::puller`]).
pub trait Pull: Send + Sync {
    /// The module `r` names, verified: from the pull cache when its digest
    /// is there, else from the registry (then cached).
    fn pull<'a>(&'a self, r: &'a OciRef) -> BoxFuture<'a, Result<Pulled, PullError>>;
}

/// A directory being watched ([`Supply::watch`]).
pub struct Watching {
    /// Dropping it stops the watch, and ends `rescans`.
    pub guard: Box<dyn Send + Sync>,
    /// Blocking: each item is a rescan due now (after a quiet period
    /// following changes, or every so often without any).
    pub rescans: Box<dyn Iterator<Item = ()> + Send>,
}

impl std::fmt::Debug for Watching {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Watching(..)")
    }
}

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
pub struct Pulled {
    /// The layer; its `source` is where it is cached, or the reference
    /// when the cache could not keep it.
    pub content: Content,
    /// The manifest's digest, 64 hex digits.
    pub manifest: String,
    /// Served from the cache without asking the registry.
    pub cached: bool,
    /// Why the registry was not used although it should have been (a tag
    /// served from its last resolution).
    pub fallback: Option<String>,
    /// The key (and signature) that verified it, under `moduleSignatures`.
    pub signed_by: Option<Verified>,
}

/// What verified a module: a key, and which of its signatures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    /// The key's name (its file).
    pub key: String,
    /// Which signature.
    pub signature: String,
}
