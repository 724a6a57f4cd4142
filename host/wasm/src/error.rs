//! Why a module does not serve, or a checker cannot be built: the errors
//! the runtime hands to the checker tree, the binary and its reports.

use std::{path::PathBuf, sync::Arc};

use portwise_core::text::truncate;
use portwise_supply::{DecodeError, PullError, ReadError, WatchError};

use crate::{LimitError, bounds::BoundsError, failures::FailureKind};

/// The first 12 hex digits of a sha256, as messages show it.
fn short(sha256: &str) -> &str {
    sha256.get(..12).unwrap_or(sha256)
}

fn still_serving(serving: &Option<String>) -> String {
    match serving {
        Some(sha256) => format!("; still serving sha256 {}", short(sha256)),
        None => String::new(),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WasmError {
    #[error("cannot set up the WebAssembly engine: {0:#}")]
    Engine(#[source] wasmtime::Error),
    /// The engine's epoch ticker thread did not start.
    #[error("cannot set up the WebAssembly engine: {0}")]
    Ticker(#[source] std::io::Error),
    #[error("cannot watch {dir}: {source}")]
    Watch {
        dir: PathBuf,
        #[source]
        source: WatchError,
    },
    #[error("invalid module name {0:?}: expected a file name such as check.wasm or check.wasm.gz")]
    ModuleName(String),
    #[error("module {module}: {source}")]
    Limits { module: String, source: LimitError },
    #[error("module {module} is not loaded: {why}")]
    NotLoaded { module: String, why: WhyNotLoaded },
    /// A file handed to [`crate::WasmRuntime::load_file`] that did not
    /// become current.
    #[error("module {module}: {source}")]
    Load {
        module: String,
        #[source]
        source: Arc<LoadError>,
    },
    /// `portwise check --bench` could not create an instance.
    #[error("module {module}: {source}")]
    Instantiate {
        module: String,
        #[source]
        source: InstantiateError,
    },
    #[error("module {module} has sha256 {actual}, but the configuration pins {expected}")]
    PinMismatch {
        module: String,
        expected: String,
        actual: String,
    },
    #[error("module {module} rejects its configuration: {rejection}")]
    ConfigRejected {
        module: String,
        #[source]
        rejection: Rejection,
    },
    /// An `oci://` module that could not be pulled or installed; the
    /// message names the module.
    #[error("{source}")]
    Pull {
        module: String,
        #[source]
        source: Arc<LoadError>,
    },
}

/// Why no version of a module serves ([`WasmError::NotLoaded`]).
#[derive(Clone, Debug, thiserror::Error)]
pub enum WhyNotLoaded {
    /// Its latest load failed.
    #[error("{0}")]
    Failed(#[source] Arc<LoadError>),
    #[error("not pulled (oci:// modules are pulled when portwise starts)")]
    NotPulled,
    #[error(
        "no expression of the configuration names it, so it was not loaded from {}",
        dir.display()
    )]
    NotNamed { dir: PathBuf },
    /// No such file; `other` is the other spelling (`x.wasm` for
    /// `x.wasm.gz` and back) when that one is loaded.
    #[error(
        "no such file in {}{}",
        dir.display(),
        match other { Some(o) => format!(" ({o} is loaded: name that one)"), None => String::new() }
    )]
    NoSuchFile { dir: PathBuf, other: Option<String> },
    #[error("no modulesDir is configured")]
    NoModulesDir,
}

/// Why content handed to the runtime did not become the module's current
/// version (the serving one, if any, stays).
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read ([`crate::WasmRuntime::load_file`]).
    #[error("{0}")]
    Read(#[source] ReadError),
    /// Content of module `module` with digest `sha256` (as stored) was
    /// refused; `serving` is the digest of the version still serving.
    #[error(
        "module {module} (sha256 {}): {cause}{}",
        short(sha256),
        still_serving(serving)
    )]
    Refused {
        module: String,
        sha256: String,
        #[source]
        cause: LoadCause,
        serving: Option<String>,
    },
    /// An `oci://` module whose pull failed.
    #[error("module {module}: pull failed: {source}{}", still_serving(serving))]
    Pull {
        module: String,
        #[source]
        source: PullError,
        serving: Option<String>,
    },
}

/// Why content was refused ([`LoadError::Refused`]), in the order it is
/// checked: the pin, what the file holds, the compile bounds, the
/// compiler, the linker, the configurations in use.
#[derive(Debug, thiserror::Error)]
pub enum LoadCause {
    /// A pin in use does not match the content (compared before anything
    /// else: such content is neither gunzipped nor compiled).
    #[error("content does not match the sha256 {pin} pinned in the configuration")]
    PinMismatch { pin: String },
    #[error("{0}")]
    Decode(#[source] DecodeError),
    #[error("{0}")]
    Bounds(#[source] BoundsError),
    #[error("not a valid component: {}", truncate(format!("{source:#}"), 1024))]
    Compile {
        #[source]
        source: wasmtime::Error,
    },
    #[error("imports something portwise does not provide: {0:#}")]
    Imports(#[source] wasmtime::Error),
    /// It exports a checker interface (`export`) whose shape is not
    /// portwise's.
    #[error("exports {export} but not as portwise defines it: {source:#}")]
    Exports {
        export: &'static str,
        #[source]
        source: wasmtime::Error,
    },
    #[error(
        "not a portwise membership checker: exports neither {} nor {} (build it against \
         wit/membership.wit, world membership-checker)",
        crate::wit::CHECKER_0_2,
        crate::wit::CHECKER_0_1
    )]
    NotAChecker,
    /// The compile task panicked or was cancelled.
    #[error("compiling failed: {0}")]
    Compiling(#[source] tokio::task::JoinError),
    #[error("rejects configuration {}: {rejection}", truncate(config.to_string(), 200))]
    ConfigRejected {
        config: String,
        #[source]
        rejection: Rejection,
    },
}

/// Why a guest's `validate-config` did not accept a configuration.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// The guest's own answer (truncated to `maxReasonBytes`).
    #[error("{0}")]
    Guest(String),
    /// The call failed: a trap, a deadline, a memory limit...
    #[error("validate-config failed: {0}")]
    Failed(#[source] Failure),
}

/// Why a call produced no verdict of the guest's own making.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct Failure {
    pub kind: FailureKind,
    pub message: String,
}

/// Why `portwise check --bench` could not time an instance.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InstantiateError {
    #[error("module {0} is not loaded")]
    NotLoaded(String),
    #[error("{0}")]
    Failed(#[source] Failure),
}
