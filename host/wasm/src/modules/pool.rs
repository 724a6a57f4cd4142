//! Instances of a module version, and the slots they occupy.
//!
//! Instantiating a component costs more than most calls, so each version
//! keeps a few ready instances for reuse. Every live instance holds a slot
//! of the pooling allocator ([`Runtime::slot`]): when slots run out, idle
//! instances of all modules are dropped first, then calls wait for one
//! instead of failing to instantiate.
//!
//! # Which runtime an instance lives on
//!
//! An instance is created by the call that needs it, asynchronously on the
//! tokio runtime polling that call (`instantiate_async` in [`ModuleVersion::take`]),
//! and is only ever reused by calls on that same runtime: [`Ready`] records
//! the runtime's id, `take` throws away idle instances of any other runtime,
//! and `put_back` pools an instance only on the runtime that made it.
//! Instances made by work that is not a check (building a checker, which
//! happens on whichever runtime builds the checker tree, and a rescan on
//! the module watcher's runtime; see [`super::unpooled`]) are never pooled
//! at all: all they do is `validate-config`, on a runtime the checks need
//! not run on. Before, the instance that ran `validate-config` on such a
//! runtime went into the pool and served the controller's checks on its
//! main runtime.
//!
//! Why it matters: a `Store`'s host state may hold things bound to the
//! runtime that made them. Tokio sockets and timers register with its
//! driver, and wasmtime-wasi spawns background tasks onto the ambient
//! runtime (`wasmtime_wasi::runtime::spawn`: its `AsyncWriteStream` and
//! `AsyncReadStream` pipes, TCP sockets), and a guest keeps such resources in
//! its table from one call to the next (an output stream it fetched once,
//! say). Resumed on another runtime they are driven by a driver that is not
//! theirs, and once their runtime is dropped they fail or panic.
//!
//! In this host nothing of the kind outlives a call today, which is why no
//! test can make the old behaviour crash: stdout and stderr are [`Capture`]s
//! (plain memory), stdin is closed, TCP, UDP and name lookups are refused
//! before any socket exists, clock pollables make their timer only while
//! polled, and probes open and close their sockets within the call. The rule
//! keeps it safe when the host grows (an inherited stdout, a probe that keeps
//! a connection); the tests pin the rule itself by counting instantiations
//! (`tests/it/wasm/runtimes.rs::instances_run_on_the_runtime_that_created_them`).
//!
//! Nothing else in an instance cares which runtime polls it: wasmtime's
//! async calls are plain `Send` futures, an epoch deadline that yields
//! returns `Pending` and wakes itself, and the epoch is advanced by a thread
//! of its own ([`crate::engine::Ticker`]), not by any runtime.
//!
//! [`Capture`]: crate::capture::Capture

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::{runtime, sync::OwnedSemaphorePermit};
use wasmtime::{Store, UpdateDeadline};

use super::{
    Runtime,
    failure::{Failure, classify},
    serving_runtime,
};
use crate::{
    CallLimits, ModuleInfo,
    compile::CompileSource,
    engine::ticks,
    error::Rejection,
    failures::{FailureKind, ModuleCounters},
    state::{CallLabels, HostState},
    v0_1, v0_2,
};

/// Compute time an instantiation may take (start functions), at least.
const INSTANTIATE_BUDGET: Duration = Duration::from_secs(1);

/// Which `portwise:membership` a component was built against, chosen by
/// what it exports.
pub(crate) enum GuestPre {
    V01(v0_1::MembershipCheckerPre<HostState>),
    V02(v0_2::MembershipCheckerPre<HostState>),
}

impl GuestPre {
    pub(crate) fn interface(&self) -> &'static str {
        match self {
            GuestPre::V01(_) => "0.1",
            GuestPre::V02(_) => "0.2",
        }
    }
}

/// An instantiated guest of either version.
pub(super) enum Guest {
    V01(v0_1::MembershipChecker),
    V02(v0_2::MembershipChecker),
}

/// An instance ready for a call.
pub(super) struct Ready {
    pub(super) store: Store<HostState>,
    pub(super) guest: Guest,
    /// The memory limit the store was made with: instances are reused only
    /// by calls with the same limit.
    memory_bytes: usize,
    /// The runtime that created it and alone may call it again; `None` for
    /// instances made by [`super::unpooled`] work, which are not reused.
    runtime: Option<runtime::Id>,
    /// One of [`Runtime::slots`], held as long as the instance lives.
    _slot: OwnedSemaphorePermit,
}

/// One loaded content of one module.
pub(crate) struct ModuleVersion {
    pub name: String,
    /// `name`, shared with every call's log labels.
    pub(super) label: Arc<str>,
    /// Of the file as stored (compressed, for a `.wasm.gz`).
    pub sha256: String,
    pub source: PathBuf,
    /// Of the component (gunzipped).
    pub size: usize,
    /// The component's sha256 (gunzipped): its compiled-code cache key.
    pub code_sha256: String,
    pub compiled: CompileSource,
    pub load_time: Duration,
    pub(super) pre: GuestPre,
    pub(super) idle: Mutex<Vec<Ready>>,
    /// validate-config's answer per (configuration, memory limit).
    pub(super) validated: Mutex<HashMap<(String, usize), Result<(), Rejection>>>,
    pub(super) counters: Arc<ModuleCounters>,
}

impl std::fmt::Debug for ModuleVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModuleVersion")
            .field("name", &self.name)
            .field("sha256", &self.sha256)
            .finish()
    }
}

impl ModuleVersion {
    pub(crate) fn info(&self) -> ModuleInfo {
        ModuleInfo {
            module: self.name.clone(),
            sha256: self.sha256.clone(),
            source: self.source.clone(),
            size: self.size,
            compiled: self.compiled,
            load_time: self.load_time,
            interface: self.pre.interface(),
        }
    }

    pub(super) fn put_back(&self, ready: Ready, rt: &Runtime) {
        // A call waiting for a slot gets this one rather than the pool.
        if rt.waiting.load(Ordering::Acquire) > 0 {
            return;
        }
        if ready.runtime.is_none() || ready.runtime != serving_runtime() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < rt.limits.idle_instances {
            idle.push(ready);
        }
    }

    pub(super) async fn take(&self, rt: &Runtime, limits: &CallLimits) -> Result<Ready, Failure> {
        let here = serving_runtime();
        let mut foreign = Vec::new();
        let ready = match here {
            Some(here) => {
                let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
                // Instances of another runtime are never called here, and
                // those of a finished runtime never will be again.
                // Idle instances with another memory limit serve other
                // expressions: they stay.
                let mut other_limits = Vec::new();
                let found = loop {
                    match idle.pop() {
                        Some(ready) if ready.memory_bytes != limits.memory_bytes => {
                            other_limits.push(ready)
                        }
                        Some(ready) if ready.runtime == Some(here) => break Some(ready),
                        Some(other) => foreign.push(other),
                        None => break None,
                    }
                };
                idle.extend(other_limits);
                found
            }
            None => None,
        };
        // Dropped outside the lock: freeing a store takes a moment.
        drop(foreign);
        match ready {
            Some(ready) => Ok(ready),
            None => {
                let slot = rt.slot().await?;
                self.instantiate(rt, slot, here, limits).await
            }
        }
    }

    pub(super) async fn instantiate(
        &self,
        rt: &Runtime,
        slot: OwnedSemaphorePermit,
        runtime: Option<runtime::Id>,
        limits: &CallLimits,
    ) -> Result<Ready, Failure> {
        self.counters.instantiated();
        let mut store = Store::new(
            &rt.engine,
            HostState::new(
                rt.limits.clone(),
                self.counters.clone(),
                limits.memory_bytes,
            )
            .with_probes(rt.probes.clone()),
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
        store.data_mut().begin_call(None, labels, limits);
        // Start functions of language runtimes may initialise a while.
        store.data_mut().call.compute_deadline =
            Instant::now() + limits.deadline.max(INSTANTIATE_BUDGET);
        store.set_epoch_deadline(1);
        let instantiate = async {
            match &self.pre {
                GuestPre::V01(pre) => pre.instantiate_async(&mut store).await.map(Guest::V01),
                GuestPre::V02(pre) => pre.instantiate_async(&mut store).await.map(Guest::V02),
            }
        };
        let outcome = tokio::time::timeout(limits.call_timeout, instantiate).await;
        store.data().flush_output();
        match outcome {
            Ok(Ok(guest)) => Ok(Ready {
                store,
                guest,
                memory_bytes: limits.memory_bytes,
                runtime,
                _slot: slot,
            }),
            Ok(Err(e)) => {
                let failure = classify(&e, store.data(), limits);
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
}

impl Runtime {
    /// for a busy instance to finish.
    pub(super) async fn slot(&self) -> Result<OwnedSemaphorePermit, Failure> {
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
}
