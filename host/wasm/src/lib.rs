//! portwise-wasm: WebAssembly membership checkers, user code that decides membership,
//! run so that it cannot hurt the controller.
//!
//! A guest is a component built against `wit/membership.wit`, mounted as a
//! `.wasm` file in `modulesDir`, or gzip-compressed as `.wasm.gz` (gunzipped
//! in memory, at most [`Limits::max_gunzipped_bytes`]), or pulled from a
//! registry (`oci://`). [`WasmRuntime`] loads the modules of the directory
//! that the configuration names ([`WasmConfig::expressions`]), keeps
//! watching it (including the kubelet's atomic `..data` swap of a
//! mounted ConfigMap) and hands out [`WasmChecker`]s that always call the
//! current version of their module.
//!
//! Where modules come from is [`portwise_supply`]'s job: it names the
//! files of the directory that changed and hands over their bytes and
//! sha256 ([`portwise_supply::ModulesDir`]); what needs more than the local
//! disk (gunzipping a `.wasm.gz`, watching the directory, pulling and
//! verifying `oci://` modules) this crate asks of the
//! [`portwise_supply::Supply`] it is built with ([`WasmConfig::supply`]);
//! compiled code is kept in the supply's sealed store. This crate compiles
//! what it is handed (or deserialises what the sealed store verified),
//! after checking pins on the bytes as stored and bounding what the
//! compiler gets (`bounds.rs`), links it, checks the configurations in use,
//! and swaps the new version in (`modules/reload.rs`: the reload is about what is serving and
//! which configurations use it, so it stays with the runtime). Who can
//! write modules, the cache and the registry, and what is verified when:
//! the threat model in `portwise_supply`'s crate docs.
//!
//! Containment, in the order a call meets it:
//! - a module that fails to compile, link or validate a configuration in use
//!   never replaces a working one; the failure is logged, counted and sent
//!   to [`WasmRuntime::subscribe`]rs (the controller turns it into an Event);
//! - each instance has a memory limit (all its linear memories together),
//!   each component a cap on its core instances, tables and memories, each
//!   call a compute deadline (epoch interruption) and a wall-clock timeout;
//!   [`budget`] is what all instances together may hold, which `portwise
//!   run` checks against the container's memory limit;
//! - probes reach only the address under judgement, with capped timeouts;
//!   WASI gives no files, environment, sockets or name lookups, and guest
//!   stdout/stderr go, bounded, to the log;
//! - any failure (load, trap, deadline, memory, unreadable answer) is an
//!   `abstain` with a reason, counted per module and kind
//!   ([`WasmRuntime::failures`]); the instance is discarded and the next
//!   call gets a fresh one.
//!
//! Compiled code is cached on disk (`compile.rs`, on the supply's sealed
//! store) so a restart does not pay the compile again; an entry runs only
//! if it carries a valid seal (an HMAC under a key private to the cache
//! directory), anything else is recompiled.
//!
//! Guest instances are created asynchronously on the tokio runtime of the
//! call that needs them and reused only by calls on that runtime (the
//! reasons: `modules/pool.rs`); compiling runs on the blocking pool.
//!
//! Why a crate of its own: wasmtime is by far the largest dependency and
//! running untrusted code is the riskiest job portwise has, so it is kept in
//! one place that everything else reaches through
//! [`portwise_checkers::WasmCheckers`]; the checker tree and the controller
//! build and test without it. The runtime crate runs components and nothing
//! else. It may not depend on a Kubernetes client (`kube`), on
//! `portwise-controller` or on a metrics library: it reports through
//! [`WasmRuntime::subscribe`] and plain counters
//! ([`WasmRuntime::failures`]), and the binary turns those into Events and
//! metrics. `k8s-openapi` types are fine (guests see the Pod and Service).
//! Nor may it depend on what fetching needs (the registry client, file
//! watching, gzip, the signature verifier): those are `portwise-supply`'s,
//! and cargo-deny checks both (`tests/deny`, `host/wasm/deny.toml`).

mod authorize;
mod bounds;
pub mod budget;
mod capture;
mod compile;
mod engine;
mod error;
mod facts;
mod failures;
mod limiter;
pub mod log_rate;
mod modules;
mod probe_failure;
mod probes;
pub mod replay;
mod state;
mod v0_1;
mod v0_2;
mod wasi;
mod wit;

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::Arc,
    thread,
    time::Duration,
};

use tokio::sync::broadcast;

pub use bounds::{BoundsError, CompileFigures, measure as measure_component};
pub use compile::CompileSource;
pub use error::{
    Failure, InstantiateError, LoadCause, LoadError, Rejection, WasmError, WhyNotLoaded,
};
pub use failures::{FailureCount, FailureKind};
pub use replay::{ProbeMode, Recorder, Recording, RecordingError, ReplayMiss, Replayer};

use modules::{CheckerSpec, Runtime};
use portwise_checkers::{BoxFuture, Checker};
use portwise_core::{
    config::{OCI_SCHEME, OciRef, WasmLimits, WasmSpec},
    membership::{Subject, Verdict},
};
use portwise_supply::{CodeCacheStats, OciConfig, PullError, Supply, WatchError, pull_cache_dir};

/// Resource limits for guests. The defaults suit small checkers written in
/// compiled languages and still leave room for Python and JavaScript ones.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The guest's own compute time per call (probe time not counted).
    pub deadline: Duration,
    /// Wall-clock bound of a whole call, probes included.
    pub call_timeout: Duration,
    /// Bytes of linear memory of an instance (all its memories together),
    /// unless its `wasm` expression's `limits.memoryMiB` says otherwise.
    pub memory_bytes: usize,
    /// The most memory any expression may give an instance: the pooling
    /// allocator reserves slots this large, so it is fixed when the runtime
    /// starts (`portwise run` sets it to the largest limit in the
    /// configuration). Never below `memory_bytes`.
    pub max_memory_bytes: usize,
    /// Upper bound on a probe's timeout, whatever the guest asks for.
    pub probe_timeout_cap: Duration,
    /// Probes one call may make.
    pub max_probes_per_call: u32,
    /// Ready instances kept per module for reuse (0: a fresh instance per
    /// call).
    pub idle_instances: usize,
    /// Component instance slots of the pooling allocator: must exceed the
    /// controller's concurrent checks plus the idle instances of all
    /// modules.
    pub max_instances: u32,
    /// Guest reasons (and validate-config messages) are cut to this many
    /// bytes.
    pub max_reason_bytes: usize,
    /// Bytes of stdout and of stderr logged per call.
    pub max_output_bytes: usize,
    /// Largest component a `.wasm.gz` module may inflate to; past it the
    /// load fails like any other (a gzip bomb costs the time to inflate
    /// this much, not the memory). The default, 64 MiB, is 3.5 times the
    /// largest example guest (Python, 18.5 MB).
    pub max_gunzipped_bytes: usize,
    /// Bounds on what is handed to the compiler, checked before it is
    /// (`bounds.rs`): the component's size (a `.wasm.gz` once gunzipped),
    /// the function bodies of all its core modules, and the largest one.
    /// Cranelift's memory grows with a function's size. The defaults are
    /// 3.5, 7.5 and 4.9 times the largest example guest's figures (the
    /// Python one: 18.5 MB, 13,412 functions, a 417 KiB body).
    pub max_component_bytes: usize,
    pub max_functions: u64,
    pub max_function_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            deadline: Duration::from_millis(100),
            call_timeout: Duration::from_secs(5),
            memory_bytes: 64 << 20,
            max_memory_bytes: 64 << 20,
            probe_timeout_cap: Duration::from_secs(2),
            max_probes_per_call: 16,
            idle_instances: 4,
            max_instances: 100,
            max_reason_bytes: 1024,
            max_output_bytes: 4096,
            max_gunzipped_bytes: 64 << 20,
            max_component_bytes: 64 << 20,
            max_functions: 100_000,
            max_function_bytes: 2 << 20,
        }
    }
}

impl Limits {
    /// The pooling allocator's memory slot: the larger of the default and
    /// the ceiling.
    pub(crate) fn memory_ceiling(&self) -> usize {
        self.memory_bytes.max(self.max_memory_bytes)
    }

    /// The bounds of one expression's calls: `overrides` where given, these
    /// limits otherwise. Fails when the memory asked for is past the
    /// ceiling the runtime started with.
    pub fn for_expression(&self, overrides: &WasmLimits) -> Result<CallLimits, LimitError> {
        let memory_bytes = match overrides.memory_mib {
            Some(mib) => usize::try_from(mib << 20).unwrap_or(usize::MAX),
            None => self.memory_bytes,
        };
        if memory_bytes > self.memory_ceiling() {
            return Err(LimitError::MemoryAboveCeiling {
                asked_mib: memory_bytes >> 20,
                ceiling_mib: self.memory_ceiling() >> 20,
            });
        }
        let call = CallLimits {
            deadline: overrides.deadline.unwrap_or(self.deadline),
            call_timeout: overrides.call_timeout.unwrap_or(self.call_timeout),
            memory_bytes,
            max_probes_per_call: overrides
                .probes_per_call
                .unwrap_or(self.max_probes_per_call),
        };
        // A deadline past the call timeout (one set, the other inherited)
        // is harmless: the call timeout fires first. The configuration
        // refuses it only when an expression sets both.
        Ok(call)
    }
}

/// Why an expression's `limits` cannot be had from this runtime.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// The pooling allocator's slots are as large as the ceiling the runtime
    /// started with; an instance cannot have more.
    #[error(
        "limits.memoryMiB {asked_mib} is above this runtime's ceiling of {ceiling_mib} MiB (set when it started: \
         raise --guest-memory-mib, or restart with this configuration so its largest limit counts)"
    )]
    MemoryAboveCeiling {
        asked_mib: usize,
        ceiling_mib: usize,
    },
}

/// The bounds of one `wasm` expression's calls: the runtime's [`Limits`]
/// with the expression's `limits` applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallLimits {
    /// The guest's own compute time per call.
    pub deadline: Duration,
    /// Wall clock of a whole call, probes included.
    pub call_timeout: Duration,
    /// Bytes of linear memory (all memories together) of the instances
    /// serving these calls.
    pub memory_bytes: usize,
    /// Probes one call may make.
    pub max_probes_per_call: u32,
}

/// How to build a [`WasmRuntime`].
#[derive(Clone)]
pub struct WasmConfig {
    /// What the runtime cannot do on its own: gunzip a `.wasm.gz`, watch
    /// `modules_dir`, pull `oci://` modules (`portwise_supply::Supplier`).
    pub supply: Arc<dyn Supply>,
    /// Load the `*.wasm` and `*.wasm.gz` files here that `expressions`
    /// name (and reload them on change, see `watch`).
    pub modules_dir: Option<PathBuf>,
    /// The configuration's `wasm` expressions, live and shadow
    /// (`Config::all_wasm_specs`): only the modules they name are read and
    /// compiled from `modules_dir` (any other file there is ignored), and
    /// their `sha256` pins are compared with a file's raw bytes before it
    /// is gunzipped or compiled, at the first load as on every reload.
    /// `None` loads every module file (tools and tests that name modules
    /// later).
    pub expressions: Option<Vec<WasmSpec>>,
    /// Compiled-code cache; `None` compiles on every start.
    pub cache_dir: Option<PathBuf>,
    /// Watch `modules_dir` for changes.
    pub watch: bool,
    pub limits: Limits,
    /// How `oci://` modules are pulled ([`WasmRuntime::pull`]); their
    /// verified content is cached under `cache_dir`'s `oci/`.
    pub oci: OciConfig,
    /// Where guests' probes go: the network ([`ProbeMode::Live`]), the
    /// network and a recording, or only a recording (`portwise check
    /// --record/--replay`). Probes are authorised first in every mode, so
    /// a denied probe is denied the same way.
    pub probes: ProbeMode,
}

impl std::fmt::Debug for WasmConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmConfig")
            .field("modules_dir", &self.modules_dir)
            .field("expressions", &self.expressions.as_ref().map(Vec::len))
            .field("cache_dir", &self.cache_dir)
            .field("watch", &self.watch)
            .field("limits", &self.limits)
            .field("oci", &self.oci)
            .field("probes", &self.probes)
            .finish_non_exhaustive()
    }
}

/// A module load succeeded (and is now serving) or failed (and the previous
/// version, if any, keeps serving), or a serving module's file went away.
///
/// Loads during [`WasmRuntime::new`] happen before anyone can subscribe:
/// read [`WasmRuntime::modules`] and [`WasmRuntime::load_errors`] for those.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleEvent {
    /// The module's file name.
    pub module: String,
    pub ok: bool,
    /// The content the event is about (absent when the file went away).
    pub sha256: Option<String>,
    /// How a successful load got its code (absent for failures).
    pub compiled: Option<CompileSource>,
    /// Human-readable; suitable for a Kubernetes Event.
    pub message: String,
}

/// A loaded module version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleInfo {
    pub module: String,
    /// Of the file as stored (what `sha256sum FILE` prints; for a
    /// `.wasm.gz`, of the compressed bytes). `sha256` pins compare with it.
    pub sha256: String,
    pub source: PathBuf,
    /// Size of the component (for a `.wasm.gz`, once gunzipped).
    pub size: usize,
    pub compiled: CompileSource,
    /// Time to gunzip (`.wasm.gz`) and compile, or load from the cache.
    pub load_time: Duration,
    /// The `portwise:membership` version the component was built against
    /// (`0.1` or `0.2`), chosen by what it exports.
    pub interface: &'static str,
}

/// Runs WebAssembly membership checkers.
pub struct WasmRuntime {
    rt: Arc<Runtime>,
    oci: OciConfig,
    oci_cache: Option<PathBuf>,
    _ticker: engine::Ticker,
    /// The directory watch; dropping it stops the watch and its thread.
    _watcher: Option<Box<dyn Send + Sync>>,
}

impl std::fmt::Debug for WasmRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmRuntime")
            .field("modules_dir", &self.rt.dir)
            .finish_non_exhaustive()
    }
}

/// `name` as a module key: a plain file name, `.wasm` appended unless it
/// ends in `.wasm` or `.wasm.gz`. A name means that one file: `check.wasm`
/// does not find `check.wasm.gz` (see [`WasmRuntime::checker`]).
fn module_key(name: &str) -> Result<String, WasmError> {
    if name.starts_with(OCI_SCHEME) {
        // One spelling per artifact (the digest in lowercase).
        return OciRef::parse(name)
            .map(|r| r.to_string())
            .map_err(|_| WasmError::ModuleName(name.to_string()));
    }
    if name.is_empty() || name.starts_with('.') || name.contains(['/', '\\', '\0']) {
        return Err(WasmError::ModuleName(name.to_string()));
    }
    Ok(if portwise_supply::decode::is_module_file(name) {
        name.to_string()
    } else {
        format!("{name}.wasm")
    })
}

/// A `sha256` pin as compared: any case in the configuration.
fn normalise_pin(pin: &str) -> String {
    pin.trim().to_ascii_lowercase()
}

impl WasmRuntime {
    /// Builds the engine, loads the modules of `modules_dir` that
    /// `expressions` name (all of them without; compiling or reading the
    /// cache) and starts watching the directory. Async because
    /// the first scan compiles on the caller's runtime (on its blocking
    /// pool), as every later one does on the watcher's.
    ///
    /// Modules that fail to load do not fail this call: they are reported
    /// (see [`WasmRuntime::load_errors`]) and checkers asking for them are
    /// refused.
    pub async fn new(config: WasmConfig) -> Result<Self, WasmError> {
        let oci_cache = config.cache_dir.as_deref().map(pull_cache_dir);
        let engine = engine::build(&config.limits).map_err(WasmError::Engine)?;
        let cache = config
            .cache_dir
            .map(|dir| compile::CodeCache::new(dir, engine::fingerprint(&engine)));
        let ticker = engine::Ticker::start(engine.clone()).map_err(WasmError::Ticker)?;
        let referenced = config.expressions.as_ref().map(|specs| {
            let mut referenced: HashMap<String, Vec<String>> = HashMap::new();
            for spec in specs {
                // A bad name is refused when its checker is built.
                let Ok(key) = module_key(&spec.module) else {
                    continue;
                };
                let pins = referenced.entry(key).or_default();
                if let Some(pin) = &spec.sha256 {
                    pins.push(normalise_pin(pin));
                }
            }
            referenced
        });
        let rt = Arc::new(
            Runtime::new(
                engine,
                config.supply,
                cache,
                config.limits,
                config.modules_dir.clone(),
                referenced,
                config.probes,
            )
            .map_err(WasmError::Engine)?,
        );
        modules::unpooled(rt.rescan()).await;
        let watcher = match (&config.modules_dir, config.watch) {
            (Some(dir), true) => Some(watch(rt.clone(), dir)?),
            _ => None,
        };
        Ok(WasmRuntime {
            rt,
            oci: config.oci,
            oci_cache,
            _ticker: ticker,
            _watcher: watcher,
        })
    }

    /// Module load events from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<ModuleEvent> {
        self.rt.events.subscribe()
    }

    /// The module versions currently serving.
    pub fn modules(&self) -> Vec<ModuleInfo> {
        self.rt.infos()
    }

    /// Modules whose latest load failed, with the reason.
    pub async fn load_errors(&self) -> Vec<(String, String)> {
        self.rt.load_errors().await
    }

    /// Failure counters per module and kind (zeros included).
    pub fn failures(&self) -> Vec<FailureCount> {
        self.rt.counters.failures()
    }

    /// Guest `check` calls attempted per module.
    pub fn calls(&self) -> Vec<(String, u64)> {
        self.rt.counters.calls()
    }

    /// Guest log lines dropped per module, over the rate each module may
    /// log at ([`log_rate`]).
    pub fn log_lines_dropped(&self) -> Vec<(String, u64)> {
        self.rt.counters.log_lines_dropped()
    }

    /// Guest instances created per module (for `validate-config`, after a
    /// failure, when all ready ones are busy, or when the calling runtime
    /// has none of its own yet).
    pub fn instantiations(&self) -> Vec<(String, u64)> {
        self.rt.counters.instantiations()
    }

    /// What the compiled-code cache did since this runtime started; `None`
    /// without a cache directory.
    pub fn code_cache_stats(&self) -> Option<CodeCacheStats> {
        self.rt.cache.as_ref().map(|c| c.stats())
    }

    pub fn limits(&self) -> &Limits {
        &self.rt.limits
    }

    /// Pulls the `oci://` modules `specs` name (others are skipped), verifies
    /// and compiles each like a file module, and makes it serve under its
    /// reference (`oci://REGISTRY/REPO@sha256:...`, the name checkers,
    /// Events and metrics use). Call it before building the checker tree,
    /// after subscribing: a failure is reported like a failed load (an
    /// event, the `load` failure counter) and a checker asking for that
    /// module is refused with the reason. A module already serving is not
    /// pulled again.
    ///
    /// Returns each reference's outcome.
    pub async fn pull(&self, specs: &[&WasmSpec]) -> Vec<(String, Result<ModuleInfo, WasmError>)> {
        let mut refs: Vec<OciRef> = Vec::new();
        for spec in specs {
            if let Some(Ok(r)) = spec.oci()
                && !refs.contains(&r)
            {
                refs.push(r);
            }
        }
        if refs.is_empty() {
            return Vec::new();
        }
        let puller = self
            .rt
            .supply
            .puller(&self.oci, self.oci_cache.clone())
            .map_err(Arc::new);
        let mut out = Vec::new();
        for r in refs {
            let key = r.to_string();
            if let Some(v) = self.rt.current(&key) {
                out.push((key, Ok(v.info())));
                continue;
            }
            let result = match &puller {
                Ok(p) => self.rt.install_pulled(&key, p.pull(&r).await).await,
                Err(e) => {
                    let setup = Err(PullError::Setup(e.clone()));
                    self.rt.install_pulled(&key, setup).await
                }
            };
            let result = result.map_err(|source| WasmError::Pull {
                module: key.clone(),
                source,
            });
            out.push((key, result));
        }
        out
    }

    /// Creates `runs` fresh instances of `module` (a loaded module's name)
    /// one after the other and returns how long each took; they are dropped,
    /// not pooled (`portwise check --bench`).
    pub async fn time_instantiation(
        &self,
        module: &str,
        runs: usize,
    ) -> Result<Vec<Duration>, WasmError> {
        let module = module_key(module)?;
        self.rt
            .time_instantiation(&module, runs)
            .await
            .map_err(|source| WasmError::Instantiate { module, source })
    }

    /// Rescans `modules_dir` now (the watcher does this on its own).
    pub async fn rescan(&self) {
        self.rt.rescan().await
    }

    /// Loads one `.wasm` (or `.wasm.gz`) file, named by its file name,
    /// outside any directory.
    pub async fn load_file(&self, path: &Path) -> Result<ModuleInfo, WasmError> {
        let module = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        module_key(&module)?;
        self.rt
            .load_file(path)
            .await
            .map_err(|source| WasmError::Load { module, source })
    }

    /// A checker running `module` with `config`. Refused when the module is
    /// not loaded, does not match `sha256`, or rejects the configuration
    /// (its `validate-config` runs here, once per module version and
    /// configuration).
    pub async fn checker(
        &self,
        module: &str,
        config: &serde_json::Value,
        sha256: Option<&str>,
    ) -> Result<WasmChecker, WasmError> {
        self.checker_with_limits(module, config, sha256, &WasmLimits::default())
            .await
    }

    /// [`WasmRuntime::checker`] with the expression's own `limits`.
    pub async fn checker_with_limits(
        &self,
        module: &str,
        config: &serde_json::Value,
        sha256: Option<&str>,
        limits: &WasmLimits,
    ) -> Result<WasmChecker, WasmError> {
        let module = module_key(module)?;
        let limits = self
            .rt
            .limits
            .for_expression(limits)
            .map_err(|source| WasmError::Limits {
                module: module.clone(),
                source,
            })?;
        let Some(version) = self.rt.current(&module) else {
            // Names are exact (the pin, the metrics and the Events are about
            // one file), but say so when the other spelling is loaded.
            let other = match module.strip_suffix(".gz") {
                Some(plain) => plain.to_string(),
                None => format!("{module}.gz"),
            };
            let other = self.rt.current(&other).map(|_| other);
            let why = match (self.rt.last_error(&module).await, &self.rt.dir) {
                (Some(e), _) => WhyNotLoaded::Failed(e),
                (None, _) if module.starts_with(OCI_SCHEME) => WhyNotLoaded::NotPulled,
                (None, Some(dir))
                    if self
                        .rt
                        .referenced
                        .as_ref()
                        .is_some_and(|r| !r.contains_key(&module)) =>
                {
                    WhyNotLoaded::NotNamed { dir: dir.clone() }
                }
                (None, Some(dir)) => WhyNotLoaded::NoSuchFile {
                    dir: dir.clone(),
                    other,
                },
                (None, None) => WhyNotLoaded::NoModulesDir,
            };
            return Err(WasmError::NotLoaded { module, why });
        };
        let pin = sha256.map(normalise_pin);
        if let Some(pin) = &pin
            && *pin != version.sha256
        {
            return Err(WasmError::PinMismatch {
                module,
                expected: pin.clone(),
                actual: version.sha256.clone(),
            });
        }
        let config = serde_json::to_string(config).expect("a JSON value serialises");
        // Checkers are built once, on whichever runtime builds the checker
        // tree, which need not be the one that will run the checks: the
        // instance that ran `validate-config` is not pooled there.
        if let Err(rejection) =
            modules::unpooled(version.validate(&self.rt, &config, &limits)).await
        {
            return Err(WasmError::ConfigRejected { module, rejection });
        }
        let spec = Arc::new(CheckerSpec {
            counters: self.rt.counters.module(&module),
            module,
            config,
            pin,
            limits,
        });
        self.rt.register(&spec);
        Ok(WasmChecker {
            rt: self.rt.clone(),
            spec,
        })
    }
}

/// Watches `dir` through the supply (debounced, and a rescan every so often
/// without events in case one was missed) and rescans on a thread of its
/// own, on a current-thread runtime of its own.
fn watch(rt: Arc<Runtime>, dir: &Path) -> Result<Box<dyn Send + Sync>, WasmError> {
    let watch_error = |source: WatchError| WasmError::Watch {
        dir: dir.to_path_buf(),
        source,
    };
    let watching = rt.supply.watch(dir).map_err(watch_error)?;
    let rescans = watching.rescans;
    thread::Builder::new()
        .name("portwise-wasm-watch".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!("module watcher cannot start: {e}");
                    return;
                }
            };
            // Ends when the watch (owned by the WasmRuntime) is dropped.
            for () in rescans {
                runtime.block_on(modules::unpooled(rt.rescan()));
            }
        })
        .map_err(|e| watch_error(WatchError(Box::new(e))))?;
    Ok(watching.guard)
}

/// A membership checker backed by a WebAssembly module. Always calls the
/// module's current version, so a hot swap takes effect on the next check.
pub struct WasmChecker {
    rt: Arc<Runtime>,
    spec: Arc<CheckerSpec>,
}

impl WasmChecker {
    pub fn module(&self) -> &str {
        &self.spec.module
    }

    /// The configuration handed to the guest, as JSON.
    pub fn config(&self) -> &str {
        &self.spec.config
    }
}

impl std::fmt::Debug for WasmChecker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmChecker")
            .field("module", &self.spec.module)
            .field("config", &self.spec.config)
            .field("sha256", &self.spec.pin)
            .finish()
    }
}

impl Checker for WasmChecker {
    fn check<'a>(&'a self, subject: &'a Subject) -> BoxFuture<'a, Verdict> {
        Box::pin(self.rt.check(&self.spec, subject))
    }
}

/// Lets `membership::build` resolve `wasm` expressions without depending on
/// wasmtime.
impl portwise_checkers::WasmCheckers for WasmRuntime {
    fn checker<'a>(
        &'a self,
        spec: &'a WasmSpec,
    ) -> BoxFuture<'a, Result<Arc<dyn Checker>, portwise_checkers::ProviderError>> {
        Box::pin(async move {
            let checker = self
                .checker_with_limits(
                    &spec.module,
                    &spec.config,
                    spec.sha256.as_deref(),
                    &spec.limits,
                )
                .await?;
            Ok(Arc::new(checker) as Arc<dyn Checker>)
        })
    }

    fn pull<'a>(
        &'a self,
        specs: &'a [&'a WasmSpec],
    ) -> BoxFuture<'a, Vec<(String, portwise_checkers::ProviderError)>> {
        Box::pin(async move {
            WasmRuntime::pull(self, specs)
                .await
                .into_iter()
                .filter_map(|(module, r)| r.err().map(|e| (module, e.into())))
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_names_are_plain_file_names() {
        assert_eq!(module_key("ready-role.wasm").unwrap(), "ready-role.wasm");
        assert_eq!(module_key("ready-role").unwrap(), "ready-role.wasm");
        assert_eq!(
            module_key("ready-role.wasm.gz").unwrap(),
            "ready-role.wasm.gz"
        );
        assert_eq!(module_key("ready-role.gz").unwrap(), "ready-role.gz.wasm");
        for bad in ["", "../x.wasm", "a/b.wasm", ".hidden.wasm", "..data"] {
            assert!(module_key(bad).is_err(), "{bad}");
        }
    }
}
