//! Failure counters, per module and kind.
//!
//! Every failure of a guest turns into `abstain`; these counters are how an
//! operator finds out it happened. They are plain atomics so the metrics code
//! can read them without this module depending on a metrics crate.

use std::{
    collections::BTreeMap,
    fmt,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

/// Why a guest call (or a module load) did not produce a verdict of the
/// guest's own making.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FailureKind {
    /// The module could not be read, compiled, instantiated or found, or its
    /// content does not match the pinned sha256.
    Load,
    /// `validate-config` rejected the configuration (or failed).
    Config,
    /// The guest trapped (panic, `unreachable`, stack overflow, ...).
    Trap,
    /// The guest ran past its compute deadline or the call's wall-clock
    /// timeout.
    Deadline,
    /// The guest hit its memory limit.
    Memory,
    /// The guest's answer could not be read (e.g. a reason that is not UTF-8).
    InvalidAnswer,
    /// The guest asked for a probe the host refused (another address, a bad
    /// path, too many probes). The call itself goes on: the guest gets
    /// `probe-error.denied` and decides.
    DeniedProbe,
}

impl FailureKind {
    pub const ALL: [FailureKind; 7] = [
        FailureKind::Load,
        FailureKind::Config,
        FailureKind::Trap,
        FailureKind::Deadline,
        FailureKind::Memory,
        FailureKind::InvalidAnswer,
        FailureKind::DeniedProbe,
    ];

    /// A stable label value (`load`, `config`, `trap`, `deadline`, `memory`,
    /// `invalid_answer`, `denied_probe`).
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Load => "load",
            FailureKind::Config => "config",
            FailureKind::Trap => "trap",
            FailureKind::Deadline => "deadline",
            FailureKind::Memory => "memory",
            FailureKind::InvalidAnswer => "invalid_answer",
            FailureKind::DeniedProbe => "denied_probe",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Counters of one module.
#[derive(Debug, Default)]
pub(crate) struct ModuleCounters {
    calls: AtomicU64,
    instantiations: AtomicU64,
    failures: [AtomicU64; FailureKind::ALL.len()],
    /// Its guests' log lines a second, for all its instances together.
    pub(crate) log_rate: crate::log_rate::LogRate,
}

impl ModuleCounters {
    pub(crate) fn call(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn instantiated(&self) {
        self.instantiations.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn fail(&self, kind: FailureKind) {
        self.failures[kind.index()].fetch_add(1, Ordering::Relaxed);
    }
}

/// One row of [`crate::WasmRuntime::failures`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailureCount {
    /// The module's file name (`ready-role.wasm`).
    pub module: String,
    pub kind: FailureKind,
    pub count: u64,
}

/// Counters of all modules, created on first use.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    modules: Mutex<BTreeMap<String, Arc<ModuleCounters>>>,
}

impl Counters {
    pub(crate) fn module(&self, name: &str) -> Arc<ModuleCounters> {
        let mut modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        modules.entry(name.to_string()).or_default().clone()
    }

    /// Every (module, kind) counter, zeros included, so a scrape sees the
    /// series before the first failure.
    pub(crate) fn failures(&self) -> Vec<FailureCount> {
        let modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        modules
            .iter()
            .flat_map(|(module, counters)| {
                FailureKind::ALL.iter().map(move |&kind| FailureCount {
                    module: module.clone(),
                    kind,
                    count: counters.failures[kind.index()].load(Ordering::Relaxed),
                })
            })
            .collect()
    }

    /// Guest `check` calls attempted, per module.
    pub(crate) fn calls(&self) -> Vec<(String, u64)> {
        let modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        modules
            .iter()
            .map(|(m, c)| (m.clone(), c.calls.load(Ordering::Relaxed)))
            .collect()
    }

    /// Guest log lines dropped over the module's rate, per module.
    pub(crate) fn log_lines_dropped(&self) -> Vec<(String, u64)> {
        let modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        modules
            .iter()
            .map(|(m, c)| (m.clone(), c.log_rate.dropped()))
            .collect()
    }

    /// Instances created, per module.
    pub(crate) fn instantiations(&self) -> Vec<(String, u64)> {
        let modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        modules
            .iter()
            .map(|(m, c)| (m.clone(), c.instantiations.load(Ordering::Relaxed)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_module_and_kind_including_zeros() {
        let c = Counters::default();
        c.module("a.wasm").fail(FailureKind::Trap);
        c.module("a.wasm").fail(FailureKind::Trap);
        c.module("b.wasm").fail(FailureKind::Load);
        c.module("b.wasm").call();
        let rows = c.failures();
        assert_eq!(rows.len(), 2 * FailureKind::ALL.len());
        let get = |m: &str, k| {
            rows.iter()
                .find(|r| r.module == m && r.kind == k)
                .unwrap()
                .count
        };
        assert_eq!(get("a.wasm", FailureKind::Trap), 2);
        assert_eq!(get("a.wasm", FailureKind::Load), 0);
        assert_eq!(get("b.wasm", FailureKind::Load), 1);
        assert_eq!(c.calls(), vec![("a.wasm".into(), 0), ("b.wasm".into(), 1)]);
    }

    #[test]
    fn labels_are_stable_and_distinct() {
        let labels: std::collections::HashSet<_> =
            FailureKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(labels.len(), FailureKind::ALL.len());
        assert_eq!(FailureKind::InvalidAnswer.to_string(), "invalid_answer");
    }
}
