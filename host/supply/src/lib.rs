//! portwise-supply: where WebAssembly modules come from. It fetches,
//! verifies and stores modules and their compiled code; it never runs
//! anything.
//!
//! - [`modules_dir`]: the `modulesDir` files, and which changed since the
//!   last look; [`watch`]: when to look again (the directory watch);
//! - [`decode`]: what a file holds (a `.wasm.gz` gunzipped, bounded; a file
//!   that is certainly not a component refused);
//! - [`oci`]: `oci://` modules pulled from registries, with the pull cache
//!   and the tag cache; [`signatures`]: cosign signatures, checked offline;
//! - [`sealed`]: the sealed store of compiled code (opaque bytes keyed by
//!   module sha256 and engine fingerprint); [`cache_dir`]: what lives where
//!   in `--cache-dir`.
//!
//! What the runtime (`portwise-wasm`) gets is a module's [`Content`]: its
//! bytes as stored, where they came from and their sha256, under the
//! module's name (its file name, or its `oci://` reference). It reads the
//! modules directory ([`ModulesDir`]) and uses the sealed store itself, and
//! asks for the rest through the [`Supply`] it is built with ([`handoff`]):
//! the component a `.wasm.gz` holds, the directory watch, pulls. It
//! compiles what it is handed (or deserialises what the sealed store
//! verified), links it, checks pins and the configurations in use, and
//! swaps the new version in.
//!
//! The feature `fetch` (on by default) is everything past the local disk
//! and plain bytes: [`oci`], [`signatures`], [`watch`], gunzip and the
//! [`Supplier`] that offers them. The runtime uses this crate without it.
//!
//! Why a crate of its own: fetching from registries, verifying signatures
//! and keeping files on disk is another job than running untrusted code,
//! with other dependencies (an HTTP and TLS stack, a signature verifier,
//! file watching, gzip); the runtime needs none of them and this crate
//! needs no wasmtime. Neither may grow the other's:
//! `tests/deny` (cargo-deny, `deny.toml` beside each crate) fails when
//! wasmtime or cranelift is among this crate's dependencies, or the
//! registry client, `notify`, `rustls-webpki` or `flate2` among
//! `portwise-wasm`'s.
//!
//! # Threat model: who can write where, and what is verified when
//!
//! What is verified here is *which* code runs, not whether it is safe: a
//! module is untrusted code however it arrives, and the runtime contains it
//! (memory, deadlines, probes only to the address under judgement). Compiled
//! code is the exception: deserialising it runs machine code outside that
//! sandbox, so it is sealed. Three places supply bytes, each writable by
//! someone other than portwise.
//!
//! ## `modulesDir`: a ConfigMap, mounted read-only
//!
//! Whoever may update the ConfigMap chooses the files; the kubelet writes
//! them (an atomic `..data` swap). Nothing here says who wrote a file: its
//! bytes are the module. Only the files the configuration's expressions
//! name are read ([`ModulesDir::only`]); any other file there is never
//! read, gunzipped nor compiled. Every read names them by their sha256 (of
//! the file as stored: for a `.wasm.gz`, of the compressed bytes). A
//! `sha256` pin in the configuration is compared by the runtime with that
//! digest before anything else: before the file is gunzipped or compiled,
//! at the first load and on every reload (content that does not match is
//! refused and the serving version stays), when a checker is built and on
//! every call. Without a pin, whoever can write the ConfigMap decides what
//! runs. A `.wasm.gz` is gunzipped to at most the runtime's
//! `Limits::max_gunzipped_bytes` (64 MiB; a gzip bomb costs the time to
//! inflate that much, not the memory), a file that is gzip, a core module
//! or not WebAssembly at all is refused before the compiler sees it, and so
//! is a component past the runtime's compile bounds (its size, function
//! count and largest function body).
//!
//! ## The registry: `oci://` modules
//!
//! Whoever may push to the repository chooses what a tag names; the
//! connection is HTTPS, trusting the system roots and `registryCA`. A pull
//! checks, in order:
//! - the manifest's sha256 against the reference's digest (the pin; only a
//!   tag, with `allowTags`, has none, and then the registry's answer at
//!   start is what runs);
//! - the manifest's shape (one `application/wasm` layer);
//! - with `moduleSignatures`, a cosign signature of the manifest by one of
//!   the configured keys ([`signatures`]), looked for before the layer is
//!   downloaded, so an unsigned module costs no download. No transparency
//!   log or timestamp authority is consulted and keyless signatures are not
//!   accepted: a signature is as trustworthy as the custody of its key;
//! - the layer's size, from the manifest, against `maxModuleBytes`, before
//!   the blob is requested; then the blob's `Content-Length`, and the bytes
//!   as they stream in: past the cap the download stops;
//! - the blob's sha256 against the manifest's layer digest.
//!
//! A digest-pinned module is content addressed: the registry can refuse or
//! fail, not change it. The sha256 handed to the runtime is the layer's, so
//! a `sha256` pin on an `oci://` module compares with the layer digest.
//!
//! ## `--cache-dir`: an `emptyDir`
//!
//! An `emptyDir` is created world-writable (0777): any container of the Pod
//! that mounts it can create, replace or delete files there, whatever its
//! uid; so can portwise's own uid and root on the node. Deleting anything
//! there is always safe: it costs a compile or a pull.
//!
//! Every file there is read through [`regular_file`]: not through a
//! symlink, not a FIFO or device (which would block the read), and not
//! past a limit, each refusal naming the path.
//!
//! The pull cache (`oci/`, [`oci`]) is keyed by digest and every read
//! re-hashes what it read: a manifest must hash to its file name, the layer
//! to the manifest's layer digest, and the layer must be within
//! `maxModuleBytes`; anything else is a miss and the registry is asked. A
//! digest-pinned module is served from it without asking the registry, so
//! a writer of the cache can only withhold it, not change it. The
//! signatures kept beside a manifest are verified again, against the keys
//! of the configuration being loaded, whenever the cache serves: a key
//! removed from the configuration stops a cached module too. The tag cache
//! (`oci/tags/`) holds the digest a tag last resolved to and is read only
//! when the registry cannot be reached. That digest chooses what runs, and
//! nothing in it can be checked against itself, so its entries are sealed
//! like compiled code (below; a key of its own in `oci/tags/`): a writer of
//! the cache without portwise's uid cannot plant or alter one, it can only
//! delete it (then the tag does not serve until the registry answers). The
//! same uid or root can, as they could change the binary; with
//! `moduleSignatures` the module must be signed by a configured key either
//! way. Serving a tag from there is reported as a failed pull all the same.
//!
//! The sealed store ([`sealed`]) holds compiled code, which would run
//! unchecked: wasmtime checks an artifact's header and engine compatibility,
//! nothing else ("arbitrary input could replace valid compiled code with any
//! other valid compiled code", `Module::deserialize`). So every entry
//! carries an HMAC-SHA256 over the artifact, the module's sha256 and the
//! engine fingerprint, under a key kept in the directory (mode 0600, owned
//! by our effective uid, not a symlink, exactly 32 bytes, or it is
//! replaced), and the runtime is handed an artifact only once its seal
//! verifies, from the memory that was verified. This protects against:
//! - damage: a flipped bit, a truncated or torn file (a crash after the
//!   rename but before the data reached the disk), a file some other
//!   program put there, an entry left by an older portwise that did not seal
//!   entries;
//! - a writer that can create, replace or delete files in the directory but
//!   runs as another uid and is not root: without the key it cannot make a
//!   tag, nor plant a key of its own (it would not be owned by our uid), and
//!   since the module hash and engine fingerprint are under the tag it
//!   cannot pass off one genuine entry as another either.
//!
//! It does not protect against anyone who can read the key: the same uid
//! (another process or container running as portwise's user with the volume
//! mounted), root on the node, or whoever can read the volume's backing
//! store (a snapshot of a persistent volume). Those could as well change the
//! binary or the process. Nor does it vouch for the module itself: that is
//! what `sha256` pins and signatures are for.
//!
//! Why not wasmtime's own cache (`Config::cache`): in wasmtime 48 it
//! zstd-decodes whatever file sits under the hash of its inputs and hands it
//! to the same loader as `deserialize`, trusting the directory exactly as
//! `deserialize_file` does (no digest, no key; the frames carry no
//! checksum), and its API is safe, which hides that trust rather than
//! checking it.

pub mod cache_dir;
pub mod content;
pub mod decode;
pub mod error;
pub mod handoff;
pub mod modules_dir;
pub mod regular_file;
pub mod sealed;

#[cfg(feature = "fetch")]
pub mod oci;
#[cfg(feature = "fetch")]
pub mod signatures;
#[cfg(feature = "fetch")]
mod supplier;
#[cfg(feature = "fetch")]
pub mod watch;

pub use cache_dir::{default_cache_dir, pull_cache_dir};
pub use content::{Content, sha256_hex};
pub use error::{
    DecodeError, KeyError, PullError, ReadError, Rejected, SetupError, SignatureError, WatchError,
};
pub use handoff::{OciConfig, Pull, Pulled, Supply, Watching};
pub use modules_dir::{ModuleFile, ModulesDir};
pub use sealed::{CodeCacheStats, KEY_FILE, Lookup, SealError, SealedStore};
#[cfg(feature = "fetch")]
pub use supplier::Supplier;
