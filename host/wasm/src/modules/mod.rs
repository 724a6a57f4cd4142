//! Loaded modules and the calls into them: the shared core of a
//! [`crate::WasmRuntime`] and the glue between its four jobs, one file each.
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
//!
//! - [`pool`]: instances of a version and the slots they occupy;
//! - [`reload`]: what the supply hands over (a rescan's changed files, a
//!   pulled module) compiled and installed, or refused;
//! - [`call`]: dispatching `check` and `validate-config` into a guest;
//! - [`failure`]: sorting what went wrong in a call.

mod bench;
mod call;
mod failure;
mod pool;
mod reload;

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, Mutex, RwLock, Weak, atomic::AtomicUsize},
};

use portwise_supply::Supply;
use tokio::sync::{Semaphore, broadcast};
use wasmtime::{Engine, component::Linker};

use crate::{
    Limits, ModuleEvent, ModuleInfo,
    compile::{CodeCache, CompileSource},
    error::LoadError,
    failures::{Counters, ModuleCounters},
    replay::ProbeMode,
    state::HostState,
    v0_1, v0_2,
};

tokio::task_local! {
    /// Set while a future runs whose instances are not to be pooled.
    static UNPOOLED: ();
}

/// Runs `future` so that the instances it makes are not pooled: work that
/// is not a check (building a checker, a rescan on the module watcher's
/// runtime) runs `validate-config` on a runtime that need not be the one
/// the checks run on (see [`pool`]).
pub(crate) async fn unpooled<F: std::future::Future>(future: F) -> F::Output {
    UNPOOLED.scope((), future).await
}

/// The runtime whose calls may reuse instances made now: the current one,
/// unless the work is [`unpooled`] (or there is no runtime).
fn serving_runtime() -> Option<tokio::runtime::Id> {
    if UNPOOLED.try_with(|()| ()).is_ok() {
        return None;
    }
    tokio::runtime::Handle::try_current().ok().map(|h| h.id())
}
pub(crate) use pool::ModuleVersion;
use reload::ScanState;

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
    pub limits: crate::CallLimits,
}

/// The shared core of a [`crate::WasmRuntime`].
pub(crate) struct Runtime {
    pub engine: Engine,
    /// Gunzip, the directory watch and pulls ([`crate::WasmConfig::supply`]).
    pub supply: Arc<dyn Supply>,
    pub linker: Linker<HostState>,
    pub cache: Option<CodeCache>,
    pub limits: Arc<Limits>,
    pub counters: Counters,
    pub dir: Option<PathBuf>,
    /// The modules the configuration's expressions name, each with the
    /// `sha256` pins they give it (lowercase); `None`: every module of the
    /// directory is loaded, and pins are known only from checkers built.
    pub referenced: Option<HashMap<String, Vec<String>>>,
    /// Where guests' probes go ([`crate::WasmConfig::probes`]).
    pub probes: ProbeMode,
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
        supply: Arc<dyn Supply>,
        cache: Option<CodeCache>,
        limits: Limits,
        dir: Option<PathBuf>,
        referenced: Option<HashMap<String, Vec<String>>>,
        probes: ProbeMode,
    ) -> wasmtime::Result<Self> {
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        // Both versions' imports: a component links against whichever it
        // was built for (their interface names carry the version).
        v0_1::MembershipChecker::add_to_linker::<HostState, wasmtime::component::HasSelf<HostState>>(
            &mut linker,
            |s| s,
        )?;
        v0_2::MembershipChecker::add_to_linker::<HostState, wasmtime::component::HasSelf<HostState>>(
            &mut linker,
            |s| s,
        )?;
        let slots = Arc::new(Semaphore::new(limits.max_instances.max(1) as usize));
        let scan = ScanState::new(
            dir.clone(),
            referenced.as_ref().map(|r| r.keys().cloned().collect()),
        );
        Ok(Runtime {
            engine,
            supply,
            linker,
            cache,
            limits: Arc::new(limits),
            counters: Counters::default(),
            dir,
            referenced,
            probes,
            events: broadcast::channel(64).0,
            modules: RwLock::new(HashMap::new()),
            scan: tokio::sync::Mutex::new(scan),
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
    pub(crate) fn infos(&self) -> Vec<ModuleInfo> {
        let modules = self.modules.read().unwrap_or_else(|e| e.into_inner());
        let mut infos: Vec<_> = modules.values().map(|m| m.info()).collect();
        infos.sort_by(|a, b| a.module.cmp(&b.module));
        infos
    }

    /// The last load failure of a module, if its latest load failed.
    pub(crate) async fn last_error(&self, module: &str) -> Option<Arc<LoadError>> {
        self.scan.lock().await.errors.get(module).cloned()
    }

    pub(crate) async fn load_errors(&self) -> Vec<(String, String)> {
        let scan = self.scan.lock().await;
        let mut errors: Vec<_> = scan
            .errors
            .iter()
            .map(|(m, e)| (m.clone(), e.to_string()))
            .collect();
        errors.sort();
        errors
    }

    pub(crate) fn register(&self, spec: &Arc<CheckerSpec>) {
        let mut users = self.users.lock().unwrap_or_else(|e| e.into_inner());
        users.retain(|u| u.strong_count() > 0);
        users.push(Arc::downgrade(spec));
    }

    /// The pins `module` must match: the configuration's and those of the
    /// checkers built on it.
    fn pins_of(&self, module: &str, users: &[Arc<CheckerSpec>]) -> Vec<String> {
        let mut pins: Vec<String> = users.iter().filter_map(|u| u.pin.clone()).collect();
        if let Some(configured) = self.referenced.as_ref().and_then(|r| r.get(module)) {
            pins.extend(configured.iter().cloned());
        }
        pins.sort_unstable();
        pins.dedup();
        pins
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
}
