//! Loaded modules and the calls into them.
//!
//! A module is a `.wasm` file, or a gzip-compressed `.wasm.gz` one (the
//! name decides, not the content); each successful load of its content is a
//! [`ModuleVersion`] with its own `InstancePre`, its own small pool of ready
//! instances and its own record of validated configurations. Checkers look
//! the current version up by name on every call, so a reload swaps versions
//! under running checkers; a failed reload leaves the current version alone.
//!
//! Instances are reused while they behave. Any failure (trap, deadline,
//! unreadable answer, cancelled call) drops the instance: its state is
//! unknown, and a trapped component instance cannot be entered again anyway.

use std::{
    collections::{HashMap, HashSet},
    fs,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, RwLock, Weak,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};

use sha2::{Digest, Sha256};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, broadcast};
use wasmtime::{Engine, Store, Trap, UpdateDeadline, component::Linker};

use crate::{
    Limits, ModuleEvent, ModuleInfo,
    bindings::{
        self, MembershipChecker, MembershipCheckerPre, WitDecision, WitPod, WitService, WitTarget,
        WitVerdict,
    },
    cache::{CodeCache, CompileSource},
    engine::ticks,
    failures::{Counters, FailureKind, ModuleCounters},
    host::{CallLabels, HostState},
    truncate,
};
use portwise_core::membership::{Decision, Subject, Verdict};

/// Compute time an instantiation may take (start functions), at least.
const INSTANTIATE_BUDGET: Duration = Duration::from_secs(1);

/// Why a call produced no verdict of the guest's own making.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Failure {
    pub kind: FailureKind,
    pub message: String,
}

impl Failure {
    fn new(kind: FailureKind, message: impl Into<String>) -> Self {
        Failure {
            kind,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind, self.message)
    }
}

/// What a checker built on a module needs: the module, its configuration
/// and an optional content pin. Registered (weakly) with the runtime so a
/// reload can validate the configurations in use before swapping.
#[derive(Debug)]
pub(crate) struct CheckerSpec {
    pub module: String,
    /// The configuration as JSON text, exactly as handed to the guest.
    pub config: String,
    pub pin: Option<String>,
    pub counters: Arc<ModuleCounters>,
}

/// An instance ready for a call.
struct Ready {
    store: Store<HostState>,
    guest: MembershipChecker,
    /// One of [`Runtime::slots`], held as long as the instance lives.
    _slot: OwnedSemaphorePermit,
}

/// One loaded content of one module.
pub(crate) struct ModuleVersion {
    pub name: String,
    /// `name`, shared with every call's log labels.
    label: Arc<str>,
    /// Of the file as stored (compressed, for a `.wasm.gz`).
    pub sha256: String,
    pub source: PathBuf,
    /// Of the component (gunzipped).
    pub size: usize,
    pub compiled: CompileSource,
    pub load_time: Duration,
    pre: MembershipCheckerPre<HostState>,
    idle: Mutex<Vec<Ready>>,
    validated: Mutex<HashMap<String, Result<(), String>>>,
    counters: Arc<ModuleCounters>,
}

impl std::fmt::Debug for ModuleVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModuleVersion")
            .field("name", &self.name)
            .field("sha256", &self.sha256)
            .finish()
    }
}

/// Whether a directory entry is a module: `*.wasm` or `*.wasm.gz`.
pub(crate) fn is_module_file(name: &str) -> bool {
    name.ends_with(".wasm") || is_gzipped(name)
}

/// Whether a module is stored gzip-compressed: by its name only, so what a
/// file is never depends on guessing from its bytes.
fn is_gzipped(name: &str) -> bool {
    name.ends_with(".wasm.gz")
}

/// `n` bytes for a message: whole MiB when it is a whole number of them.
fn bytes_text(n: usize) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else {
        format!("{n} bytes")
    }
}

/// The content of a `.wasm.gz`, refusing to inflate past `max` bytes.
///
/// One pass that stops reading at `max + 1` bytes: a gzip bomb costs at
/// most the time and memory of inflating `max` bytes, then is refused.
/// Concatenated gzip members are read as one stream, as `gunzip` does.
pub(crate) fn gunzip(gz: &[u8], max: usize) -> Result<Vec<u8>, String> {
    use flate2::read::MultiGzDecoder;
    use std::io::Read;
    let limit = u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1);
    let mut wasm = Vec::new();
    MultiGzDecoder::new(gz)
        .take(limit)
        .read_to_end(&mut wasm)
        .map_err(|e| format!("not a valid gzip file: {e}"))?;
    if wasm.len() > max {
        return Err(format!(
            "gunzips to more than {}, the limit for a module's gunzipped size",
            bytes_text(max)
        ));
    }
    Ok(wasm)
}

/// Refuses what is certainly not a component, with a message that says what
/// it is instead.
fn check_header(bytes: &[u8]) -> Result<(), String> {
    if bytes.starts_with(&[0x1f, 0x8b]) {
        return Err(
            "gzip-compressed, not WebAssembly: only a file named *.wasm.gz is gunzipped (once)"
                .into(),
        );
    }
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        return Err("not a WebAssembly file (no \\0asm header)".into());
    }
    if bytes[4..8] == [1, 0, 0, 0] {
        return Err(
            "a core WebAssembly module, not a component: build for wasm32-wasip2, or wrap it with \
                    `wasm-tools component new` and the WASI preview1 adapter"
                .into(),
        );
    }
    Ok(())
}

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

impl ModuleVersion {
    fn info(&self) -> ModuleInfo {
        ModuleInfo {
            module: self.name.clone(),
            sha256: self.sha256.clone(),
            source: self.source.clone(),
            size: self.size,
            compiled: self.compiled,
            load_time: self.load_time,
        }
    }

    fn put_back(&self, ready: Ready, rt: &Runtime) {
        // A call waiting for a slot gets this one rather than the pool.
        if rt.waiting.load(Ordering::Acquire) > 0 {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < rt.limits.idle_instances {
            idle.push(ready);
        }
    }

    async fn take(&self, rt: &Runtime) -> Result<Ready, Failure> {
        let ready = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match ready {
            Some(ready) => Ok(ready),
            None => {
                let slot = rt.slot().await?;
                self.instantiate(rt, slot).await
            }
        }
    }

    async fn instantiate(
        &self,
        rt: &Runtime,
        slot: OwnedSemaphorePermit,
    ) -> Result<Ready, Failure> {
        let mut store = Store::new(
            &rt.engine,
            HostState::new(rt.limits.clone(), self.counters.clone()),
        );
        store.limiter(|s| &mut s.limiter);
        // Runs when the epoch deadline passes while the guest executes: stop
        // it once its compute time is used up, otherwise yield to the async
        // runtime and look again a tick later.
        store.epoch_deadline_callback(|ctx| {
            let left = ctx
                .data()
                .call
                .compute_deadline
                .saturating_duration_since(Instant::now());
            if left.is_zero() {
                Ok(UpdateDeadline::Interrupt)
            } else {
                Ok(UpdateDeadline::Yield(ticks(left).min(5)))
            }
        });
        let labels = CallLabels {
            module: self.label.clone(),
            ..Default::default()
        };
        store.data_mut().begin_call(None, labels);
        // Start functions of language runtimes may initialise a while.
        store.data_mut().call.compute_deadline =
            Instant::now() + rt.limits.deadline.max(INSTANTIATE_BUDGET);
        store.set_epoch_deadline(1);
        let outcome = tokio::time::timeout(
            rt.limits.call_timeout,
            self.pre.instantiate_async(&mut store),
        )
        .await;
        store.data().flush_output();
        match outcome {
            Ok(Ok(guest)) => Ok(Ready {
                store,
                guest,
                _slot: slot,
            }),
            Ok(Err(e)) => {
                let failure = classify(&e, store.data(), &rt.limits);
                let kind = if failure.kind == FailureKind::Memory {
                    FailureKind::Memory
                } else {
                    FailureKind::Load
                };
                Err(Failure::new(
                    kind,
                    format!("cannot instantiate: {}", failure.message),
                ))
            }
            Err(_) => Err(Failure::new(
                FailureKind::Deadline,
                "instantiation timed out",
            )),
        }
    }

    /// Runs `validate-config` once per configuration for this version.
    pub(crate) async fn validate(&self, rt: &Runtime, config: &str) -> Result<(), String> {
        if let Some(known) = self
            .validated
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(config)
        {
            return known.clone();
        }
        let result = match self.call_validate(rt, config).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(message)) => Err(truncate(message, rt.limits.max_reason_bytes)),
            Err(failure) => Err(format!("validate-config failed: {failure}")),
        };
        self.validated
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(config.to_string(), result.clone());
        result
    }

    async fn call_validate(
        &self,
        rt: &Runtime,
        config: &str,
    ) -> Result<Result<(), String>, Failure> {
        let mut ready = self.take(rt).await?;
        let labels = CallLabels {
            module: self.label.clone(),
            ..Default::default()
        };
        ready.store.data_mut().begin_call(None, labels);
        ready.store.set_epoch_deadline(1);
        let call = ready
            .guest
            .portwise_membership_checker()
            .call_validate_config(&mut ready.store, config);
        let outcome = tokio::time::timeout(rt.limits.call_timeout, call).await;
        self.settle(ready, outcome, rt)
    }

    async fn call_check(
        &self,
        rt: &Runtime,
        config: &str,
        subject: &Subject,
        service: WitService<'_>,
        pod: WitPod<'_>,
        target: WitTarget<'_>,
    ) -> Result<WitVerdict, Failure> {
        let labels = CallLabels {
            module: self.label.clone(),
            service: Some(subject.service.clone()),
            pod: Some(subject.pod.clone()),
            port: if subject.port.name.is_empty() {
                subject.port.port.to_string()
            } else {
                subject.port.name.clone()
            },
        };
        let mut ready = self.take(rt).await?;
        ready
            .store
            .data_mut()
            .begin_call(Some(subject.address), labels);
        ready.store.set_epoch_deadline(1);
        let call = ready.guest.portwise_membership_checker().call_check(
            &mut ready.store,
            config,
            service,
            pod,
            target,
        );
        let outcome = tokio::time::timeout(rt.limits.call_timeout, call).await;
        self.settle(ready, outcome, rt)
    }

    /// Logs the guest's output, returns a healthy instance to the pool and
    /// turns everything else into a [`Failure`] (dropping the instance).
    fn settle<R>(
        &self,
        ready: Ready,
        outcome: Result<wasmtime::Result<R>, tokio::time::error::Elapsed>,
        rt: &Runtime,
    ) -> Result<R, Failure> {
        let limits = &rt.limits;
        let stderr_tail = ready.store.data().flush_output();
        match outcome {
            Ok(Ok(value)) => {
                self.put_back(ready, rt);
                Ok(value)
            }
            Ok(Err(e)) => {
                let mut failure = classify(&e, ready.store.data(), limits);
                if let Some(tail) = stderr_tail
                    && failure.kind != FailureKind::Deadline
                {
                    failure.message = format!("{} (stderr: {tail})", failure.message);
                }
                Err(failure)
            }
            Err(_) => Err(Failure::new(
                FailureKind::Deadline,
                format!("call did not finish within {:?}", limits.call_timeout),
            )),
        }
    }
}

/// Sorts a wasmtime error from a call into a failure kind.
fn classify(e: &wasmtime::Error, state: &HostState, limits: &Limits) -> Failure {
    let memory = state.limiter.denied.map(|(current, desired)| {
        format!(
            "memory limit: growth from {} to {} KiB refused (limit {} KiB)",
            current / 1024,
            desired / 1024,
            limits.memory_bytes / 1024
        )
    });
    // Trap's Display starts with "wasm trap: "; the kind already says so.
    let what = |trap: &Trap| {
        trap.to_string()
            .trim_start_matches("wasm trap: ")
            .to_string()
    };
    match e.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => Failure::new(
            FailureKind::Deadline,
            format!("ran past its compute deadline of {:?}", limits.deadline),
        ),
        Some(trap) => match memory {
            Some(m) => Failure::new(FailureKind::Memory, format!("{m}, then: {}", what(trap))),
            None => Failure::new(FailureKind::Trap, what(trap)),
        },
        None => match memory {
            Some(m) => Failure::new(FailureKind::Memory, format!("{m}: {e:#}")),
            // No trap: the guest returned, but its answer could not be lifted
            // (invalid UTF-8, out-of-bounds pointers, bad discriminants).
            None => Failure::new(FailureKind::InvalidAnswer, truncate(format!("{e:#}"), 512)),
        },
    }
}

fn verdict(answer: WitVerdict, max_reason: usize) -> Verdict {
    let decision = match answer.decision {
        WitDecision::Include => Decision::Include,
        WitDecision::Exclude => Decision::Exclude,
        WitDecision::Abstain => Decision::Abstain,
    };
    Verdict {
        decision,
        reason: answer.reason.map(|r| truncate(r, max_reason)),
    }
}

/// A file's identity as far as rescans care: where its content lives (the
/// kubelet swaps `..data` to a new directory), its size and mtime.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Stamp {
    target: Option<PathBuf>,
    len: u64,
    modified: Option<SystemTime>,
}

#[derive(Default)]
struct ScanState {
    stamps: HashMap<String, Stamp>,
    /// Modules present at some point and gone from the directory now.
    removed: HashSet<String>,
    /// The last load failure per module, while it is the latest news.
    errors: HashMap<String, String>,
}

/// The shared core of a [`crate::WasmRuntime`].
pub(crate) struct Runtime {
    pub engine: Engine,
    pub linker: Linker<HostState>,
    pub cache: Option<CodeCache>,
    pub limits: Arc<Limits>,
    pub counters: Counters,
    pub dir: Option<PathBuf>,
    pub events: broadcast::Sender<ModuleEvent>,
    modules: RwLock<HashMap<String, Arc<ModuleVersion>>>,
    scan: tokio::sync::Mutex<ScanState>,
    users: Mutex<Vec<Weak<CheckerSpec>>>,
    /// Live instances (busy or idle), at most the pooling allocator's
    /// component instance slots: when they run out, calls wait for one
    /// instead of failing to instantiate.
    slots: Arc<Semaphore>,
    /// Calls waiting for a slot; while there are any, finished instances
    /// are dropped instead of pooled.
    waiting: AtomicUsize,
}

impl Runtime {
    pub(crate) fn new(
        engine: Engine,
        cache: Option<CodeCache>,
        limits: Limits,
        dir: Option<PathBuf>,
    ) -> wasmtime::Result<Self> {
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        MembershipChecker::add_to_linker::<HostState, wasmtime::component::HasSelf<HostState>>(
            &mut linker,
            |s| s,
        )?;
        let slots = Arc::new(Semaphore::new(limits.max_instances.max(1) as usize));
        Ok(Runtime {
            engine,
            linker,
            cache,
            limits: Arc::new(limits),
            counters: Counters::default(),
            dir,
            events: broadcast::channel(64).0,
            modules: RwLock::new(HashMap::new()),
            scan: tokio::sync::Mutex::new(ScanState::default()),
            users: Mutex::new(Vec::new()),
            slots,
            waiting: AtomicUsize::new(0),
        })
    }

    pub(crate) fn current(&self, module: &str) -> Option<Arc<ModuleVersion>> {
        self.modules
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(module)
            .cloned()
    }

    /// A slot for a new instance. When none is free, idle instances of all
    /// modules are dropped first; then the call waits (within its timeout)
    /// for a busy instance to finish.
    async fn slot(&self) -> Result<OwnedSemaphorePermit, Failure> {
        if let Ok(slot) = self.slots.clone().try_acquire_owned() {
            return Ok(slot);
        }
        for version in self
            .modules
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
        {
            version
                .idle
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clear();
        }
        if let Ok(slot) = self.slots.clone().try_acquire_owned() {
            return Ok(slot);
        }
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::AcqRel);
            }
        }
        self.waiting.fetch_add(1, Ordering::AcqRel);
        let _waiting = Waiting(&self.waiting);
        match tokio::time::timeout(self.limits.call_timeout, self.slots.clone().acquire_owned())
            .await
        {
            Ok(Ok(slot)) => Ok(slot),
            Ok(Err(_)) => unreachable!("the slot semaphore is never closed"),
            Err(_) => Err(Failure::new(
                FailureKind::Deadline,
                format!(
                    "all {} instance slots stayed busy for {:?}",
                    self.limits.max_instances, self.limits.call_timeout
                ),
            )),
        }
    }

    pub(crate) fn infos(&self) -> Vec<ModuleInfo> {
        let modules = self.modules.read().unwrap_or_else(|e| e.into_inner());
        let mut infos: Vec<_> = modules.values().map(|m| m.info()).collect();
        infos.sort_by(|a, b| a.module.cmp(&b.module));
        infos
    }

    /// The last load failure of a module, if its latest load failed.
    pub(crate) async fn last_error(&self, module: &str) -> Option<String> {
        self.scan.lock().await.errors.get(module).cloned()
    }

    pub(crate) async fn load_errors(&self) -> Vec<(String, String)> {
        let scan = self.scan.lock().await;
        let mut errors: Vec<_> = scan
            .errors
            .iter()
            .map(|(m, e)| (m.clone(), e.clone()))
            .collect();
        errors.sort();
        errors
    }

    pub(crate) fn register(&self, spec: &Arc<CheckerSpec>) {
        let mut users = self.users.lock().unwrap_or_else(|e| e.into_inner());
        users.retain(|u| u.strong_count() > 0);
        users.push(Arc::downgrade(spec));
    }

    fn users_of(&self, module: &str) -> Vec<Arc<CheckerSpec>> {
        let mut users = self.users.lock().unwrap_or_else(|e| e.into_inner());
        users.retain(|u| u.strong_count() > 0);
        users
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|u| u.module == module)
            .collect()
    }

    fn report(
        &self,
        module: &str,
        ok: bool,
        sha256: Option<&str>,
        compiled: Option<CompileSource>,
        message: String,
    ) {
        if ok {
            tracing::info!(module, sha256, "{message}");
        } else {
            tracing::warn!(module, sha256, "{message}");
        }
        // No receivers is fine: nobody asked to hear about it.
        let _ = self.events.send(ModuleEvent {
            module: module.to_string(),
            ok,
            sha256: sha256.map(str::to_string),
            compiled,
            message,
        });
    }

    /// Gunzips (a `.wasm.gz`), compiles (or loads from cache) and links a
    /// module's content. `stored` and `sha256` are the file as stored.
    fn compile(
        &self,
        name: &str,
        source: &Path,
        stored: &[u8],
        sha256: &str,
    ) -> Result<ModuleVersion, String> {
        let started = Instant::now();
        // The cache is keyed by the component's own hash, so `x.wasm` and
        // any `x.wasm.gz` of it share one entry.
        let gunzipped;
        let (bytes, code_sha256) = if is_gzipped(name) {
            gunzipped = gunzip(stored, self.limits.max_gunzipped_bytes)?;
            let code_sha256 = sha256_hex(&gunzipped);
            (&gunzipped[..], code_sha256)
        } else {
            (stored, sha256.to_string())
        };
        check_header(bytes)?;
        let (component, compiled, _) = match &self.cache {
            Some(cache) => cache.load(&self.engine, &code_sha256, bytes),
            None => wasmtime::component::Component::from_binary(&self.engine, bytes)
                .map(|c| (c, CompileSource::Compiled, Duration::ZERO)),
        }
        .map_err(|e| {
            format!(
                "not a valid component: {}",
                truncate(format!("{e:#}"), 1024)
            )
        })?;
        let load_time = started.elapsed();
        let instance_pre = self
            .linker
            .instantiate_pre(&component)
            .map_err(|e| format!("imports something portwise does not provide: {e:#}"))?;
        let pre = MembershipCheckerPre::new(instance_pre).map_err(|e| {
            format!("not a portwise membership checker (world portwise:membership/membership-checker@0.1.x): {e:#}")
        })?;
        Ok(ModuleVersion {
            name: name.to_string(),
            label: name.into(),
            sha256: sha256.to_string(),
            source: source.to_path_buf(),
            size: bytes.len(),
            compiled,
            load_time,
            pre,
            idle: Mutex::new(Vec::new()),
            validated: Mutex::new(HashMap::new()),
            counters: self.counters.module(name),
        })
    }

    /// Loads new content for `name` and makes it current, unless it fails to
    /// compile, does not match a pin in use, or rejects a configuration in
    /// use: then the current version (if any) keeps serving.
    async fn install(
        &self,
        scan: &mut ScanState,
        name: &str,
        source: &Path,
        bytes: &[u8],
    ) -> Result<ModuleInfo, String> {
        let sha256 = sha256_hex(bytes);
        let counters = self.counters.module(name);
        let fail = |scan: &mut ScanState, message: String| {
            counters.fail(FailureKind::Load);
            let serving = match self.current(name) {
                Some(v) => format!("; still serving sha256 {}", &v.sha256[..12]),
                None => String::new(),
            };
            let message = format!(
                "module {name} (sha256 {}): {message}{serving}",
                &sha256[..12]
            );
            scan.errors.insert(name.to_string(), message.clone());
            self.report(name, false, Some(&sha256), None, message.clone());
            Err(message)
        };
        // Compiling blocks; keep it off the async runtime's core threads.
        let compiled = block_in_place_or_inline(|| self.compile(name, source, bytes, &sha256));
        let version = match compiled {
            Ok(v) => v,
            Err(message) => return fail(scan, message),
        };
        let users = self.users_of(name);
        if let Some(pin) = users
            .iter()
            .filter_map(|u| u.pin.as_deref())
            .find(|pin| *pin != sha256)
        {
            return fail(
                scan,
                format!("content does not match the sha256 {pin} pinned in the configuration"),
            );
        }
        let mut configs: Vec<&str> = users.iter().map(|u| u.config.as_str()).collect();
        configs.sort_unstable();
        configs.dedup();
        for config in configs {
            if let Err(message) = version.validate(self, config).await {
                return fail(
                    scan,
                    format!(
                        "rejects configuration {}: {message}",
                        truncate(config.to_string(), 200)
                    ),
                );
            }
        }
        let info = version.info();
        let compiled = version.compiled;
        let how = match compiled {
            CompileSource::Compiled => "compiled",
            CompileSource::Cached => "loaded from the compiled-code cache",
        };
        let message = format!(
            "module {name} (sha256 {}) {how} in {:.1} ms and serving",
            &sha256[..12],
            version.load_time.as_secs_f64() * 1000.0
        );
        self.modules
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string(), Arc::new(version));
        scan.errors.remove(name);
        self.report(name, true, Some(&sha256), Some(compiled), message);
        Ok(info)
    }

    /// Loads one file under its file name.
    pub(crate) async fn load_file(&self, path: &Path) -> Result<ModuleInfo, String> {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| format!("{}: not a file name", path.display()))?
            .to_string();
        let bytes = fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut scan = self.scan.lock().await;
        if let Some(current) = self.current(&name)
            && current.sha256 == sha256_hex(&bytes)
        {
            return Ok(current.info());
        }
        self.install(&mut scan, &name, path, &bytes).await
    }

    /// Brings the loaded modules in line with the directory. Unchanged files
    /// (same resolved path, size and mtime) are not even read; changed files
    /// with unchanged content are read and hashed but not reloaded.
    pub(crate) async fn rescan(&self) {
        let Some(dir) = &self.dir else { return };
        let mut scan = self.scan.lock().await;
        let entries = match fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) => {
                tracing::warn!(dir = %dir.display(), "cannot read modulesDir: {e}");
                return;
            }
        };
        let mut present = HashSet::new();
        for entry in entries.flatten() {
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            // Skip the kubelet's `..data` and `..2026_...` entries and any
            // hidden temporary file.
            if name.starts_with('.') || !is_module_file(&name) {
                continue;
            }
            let path = dir.join(&name);
            // Follows symlinks: a dangling link in the middle of a swap is
            // skipped now and picked up by the event that completes the swap.
            let Ok(meta) = fs::metadata(&path) else {
                continue;
            };
            if !meta.is_file() {
                continue;
            }
            present.insert(name.clone());
            let stamp = Stamp {
                target: fs::canonicalize(&path).ok(),
                len: meta.len(),
                modified: meta.modified().ok(),
            };
            if scan.stamps.get(&name) == Some(&stamp) {
                continue;
            }
            let bytes = match fs::read(&path) {
                Ok(bytes) => bytes,
                Err(e) => {
                    tracing::warn!(module = %name, "cannot read {}: {e}", path.display());
                    continue;
                }
            };
            scan.stamps.insert(name.clone(), stamp);
            if self
                .current(&name)
                .is_some_and(|v| v.sha256 == sha256_hex(&bytes))
            {
                continue;
            }
            let _ = self.install(&mut scan, &name, &path, &bytes).await;
        }
        scan.stamps.retain(|name, _| present.contains(name));
        let loaded: Vec<String> = self
            .modules
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect();
        for name in loaded {
            if present.contains(&name) {
                scan.removed.remove(&name);
            } else if scan.removed.insert(name.clone()) {
                self.report(
                    &name,
                    false,
                    None,
                    None,
                    format!(
                        "module {name} is gone from {}; still serving the last loaded version",
                        dir.display()
                    ),
                );
            }
        }
    }

    /// One guest decision, never failing: every failure is an abstain with a
    /// reason, counted by kind.
    pub(crate) async fn check(&self, spec: &CheckerSpec, subject: &Subject) -> Verdict {
        spec.counters.call();
        match self.try_check(spec, subject).await {
            Ok(verdict) => verdict,
            Err(failure) => {
                spec.counters.fail(failure.kind);
                match failure.kind {
                    FailureKind::Load | FailureKind::Config => {
                        tracing::debug!(module = %spec.module, "{failure}")
                    }
                    _ => tracing::warn!(
                        module = %spec.module,
                        pod = subject.pod.metadata.name.as_deref().unwrap_or(""),
                        port = %subject.port.name,
                        "guest failed, abstaining: {failure}"
                    ),
                }
                Verdict::abstain().because(format!("wasm {}: {failure}", spec.module))
            }
        }
    }

    async fn try_check(&self, spec: &CheckerSpec, subject: &Subject) -> Result<Verdict, Failure> {
        let version = self
            .current(&spec.module)
            .ok_or_else(|| Failure::new(FailureKind::Load, "module is not loaded"))?;
        if let Some(pin) = &spec.pin
            && *pin != version.sha256
        {
            return Err(Failure::new(
                FailureKind::Load,
                format!(
                    "content sha256 {} does not match the pinned {pin}",
                    version.sha256
                ),
            ));
        }
        version
            .validate(self, &spec.config)
            .await
            .map_err(|m| Failure::new(FailureKind::Config, m))?;
        let computed = bindings::Computed::new(subject);
        let lists = bindings::Lists::new(subject, &computed);
        let service = bindings::service(&subject.service, &lists);
        let pod = bindings::pod(&subject.pod, &lists);
        let target = bindings::target(subject, &computed);
        let (pod_name, port_name, address) = (pod.name, target.port_name, target.address);
        let answer = version
            .call_check(self, &spec.config, subject, service, pod, target)
            .await?;
        let verdict = verdict(answer, self.limits.max_reason_bytes);
        tracing::debug!(
            module = %spec.module,
            pod = pod_name,
            port = port_name,
            address,
            decision = ?verdict.decision,
            reason = verdict.reason.as_deref().unwrap_or(""),
            "guest verdict"
        );
        Ok(verdict)
    }
}

/// Runs a blocking closure without stalling the async runtime: on a
/// multi-threaded runtime the worker hands its other tasks off first; on a
/// current-thread runtime (or none) it simply runs.
fn block_in_place_or_inline<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_check_explains_what_the_file_is() {
        assert!(
            check_header(b"hello world")
                .unwrap_err()
                .contains("not a WebAssembly file")
        );
        assert!(
            check_header(b"\0asm\x01\0\0\0rest")
                .unwrap_err()
                .contains("core WebAssembly module")
        );
        assert!(check_header(b"\0asm\x0d\0\x01\0rest").is_ok());
    }

    fn gzip(parts: &[&[u8]]) -> Vec<u8> {
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        for part in parts {
            gz.write_all(part).unwrap();
        }
        gz.finish().unwrap()
    }

    #[test]
    fn only_wasm_and_wasm_gz_files_are_modules() {
        for name in ["a.wasm", "a.wasm.gz"] {
            assert!(is_module_file(name), "{name}");
        }
        for name in [
            "a.gz",
            "a.wasm.gz.tmp",
            "a.wasmgz",
            "a.tar.gz",
            "a.wasm.zst",
        ] {
            assert!(!is_module_file(name), "{name}");
        }
        assert!(is_gzipped("a.wasm.gz") && !is_gzipped("a.wasm"));
    }

    #[test]
    fn gunzip_returns_the_content_up_to_and_including_the_cap() {
        let wasm = b"\0asm\x0d\0\x01\0component bytes".repeat(1000);
        assert_eq!(gunzip(&gzip(&[&wasm]), 1 << 20).unwrap(), wasm);
        // Exactly at the cap is allowed.
        assert_eq!(gunzip(&gzip(&[&wasm]), wasm.len()).unwrap(), wasm);
        // Concatenated members are one stream, as for `gunzip`.
        let mut two = gzip(&[&wasm[..100]]);
        two.extend(gzip(&[&wasm[100..]]));
        assert_eq!(gunzip(&two, 1 << 20).unwrap(), wasm);
    }

    #[test]
    fn gunzip_refuses_content_past_the_cap_naming_it() {
        let wasm = vec![7u8; 4096];
        let e = gunzip(&gzip(&[&wasm]), 4095).unwrap_err();
        assert!(e.contains("gunzips to more than 4095 bytes"), "{e}");
        // A bomb: 100 MiB of zeros is about 100 KB gzipped. Refused at the
        // cap, after inflating (not keeping) 64 MiB.
        let zeros = vec![0u8; 1 << 20];
        let bomb = gzip(&vec![&zeros[..]; 100]);
        assert!(bomb.len() < 200_000, "{}", bomb.len());
        let started = Instant::now();
        let e = gunzip(&bomb, 64 << 20).unwrap_err();
        assert!(e.contains("gunzips to more than 64 MiB, the limit"), "{e}");
        eprintln!(
            "100 MiB bomb ({} KB gzipped) refused in {:.0} ms",
            bomb.len() / 1024,
            started.elapsed().as_secs_f64() * 1e3
        );
    }

    #[test]
    fn corrupt_gzip_is_a_clear_error() {
        let good = gzip(&[b"\0asm\x0d\0\x01\0rest of the component"]);
        let mut bad_crc = good.clone();
        let n = bad_crc.len();
        bad_crc[n - 8] ^= 0xff;
        let mut bad_data = good.clone();
        bad_data[12] ^= 0xff;
        for (what, bytes) in [
            ("plain wasm", &b"\0asm\x0d\0\x01\0rest"[..]),
            ("truncated", &good[..good.len() / 2]),
            ("bad checksum", &bad_crc[..]),
            ("bad data", &bad_data[..]),
        ] {
            let e = gunzip(bytes, 1 << 20).unwrap_err();
            assert!(e.starts_with("not a valid gzip file: "), "{what}: {e}");
        }
    }

    #[test]
    fn a_gzipped_file_not_named_gz_is_explained() {
        let e = check_header(&gzip(&[b"\0asm\x0d\0\x01\0"])).unwrap_err();
        assert!(e.contains("*.wasm.gz"), "{e}");
    }

    #[test]
    fn verdict_reasons_are_truncated_on_a_char_boundary() {
        let v = verdict(
            WitVerdict {
                decision: WitDecision::Include,
                reason: Some("é".repeat(1000)),
            },
            11,
        );
        assert_eq!(v.decision, Decision::Include);
        let reason = v.reason.unwrap();
        assert!(reason.starts_with("éééé"), "{reason}");
        assert!(reason.contains("truncated"), "{reason}");
        assert!(reason.len() < 80);
    }
}
