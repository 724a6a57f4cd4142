//! The WebAssembly guests: module loads, `portwise_guest_failures` and
//! `portwise_guest_log_lines_dropped`. Guest failures and dropped log lines
//! are counted by the WebAssembly runtime itself (plain atomics, so that
//! crate needs no metrics library and this one no wasmtime); collectors
//! read them at every scrape.

use std::{
    collections::BTreeMap,
    sync::{Arc, PoisonError, RwLock},
};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{
        MetricType,
        counter::{ConstCounter, Counter},
        family::Family as MetricFamily,
    },
    registry::Registry,
};

use super::labels::{GuestFailureLabels, ModuleLabels, ModuleLoad, ModuleLoadLabels, label};

/// Why a WebAssembly guest's answer was replaced by `abstain`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GuestFailure {
    /// The module could not be loaded or instantiated.
    Load,
    /// The guest trapped.
    Trap,
    /// The guest ran past its deadline (fuel or epoch).
    Deadline,
    /// The guest exceeded its memory limit.
    Memory,
    /// The guest returned something the host cannot use.
    Invalid,
    /// The guest asked for something it may not have (another address, ...).
    Denied,
}

impl GuestFailure {
    pub fn as_str(self) -> &'static str {
        match self {
            GuestFailure::Load => "load",
            GuestFailure::Trap => "trap",
            GuestFailure::Deadline => "deadline",
            GuestFailure::Memory => "memory",
            GuestFailure::Invalid => "invalid",
            GuestFailure::Denied => "denied",
        }
    }
}

/// Reads guest failure counts at scrape time: `(module, kind, count)` rows,
/// each count since the process started. Rows of the same module and kind
/// are added up (the runtime has more kinds than the metric has labels).
pub type GuestFailureSource = Box<dyn Fn() -> Vec<(String, GuestFailure, u64)> + Send + Sync>;

const GUEST_FAILURES_HELP: &str = "WebAssembly guest answers replaced by abstain, by module and kind \
     (load|trap|deadline|memory|invalid|denied)";

/// `portwise_guest_failures`: a counter family whose values live in the
/// WebAssembly runtime, read from its [`GuestFailureSource`] on every scrape
/// (no copy to keep in step). Without a source the family is declared and
/// empty, as a registered family with no series would be.
#[derive(Clone, Default)]
struct GuestFailures {
    source: Arc<RwLock<Option<GuestFailureSource>>>,
}

impl std::fmt::Debug for GuestFailures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestFailures").finish_non_exhaustive()
    }
}

impl Collector for GuestFailures {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let rows = match &*self.source.read().unwrap_or_else(PoisonError::into_inner) {
            Some(source) => source(),
            None => Vec::new(),
        };
        let mut totals = BTreeMap::<(String, &'static str), u64>::new();
        for (module, kind, count) in rows {
            *totals.entry((label(&module), kind.as_str())).or_default() += count;
        }
        // `Registry::register` appends the full stop to help texts; a
        // collector writes its own.
        let help = format!("{GUEST_FAILURES_HELP}.");
        let mut family =
            encoder.encode_descriptor("guest_failures", &help, None, MetricType::Counter)?;
        for ((module, kind), count) in totals {
            let labels = GuestFailureLabels { module, kind };
            ConstCounter::new(count).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// Reads each module's dropped log lines at scrape time: `(module, count)`
/// rows, each count since the process started.
pub type LogDropSource = Box<dyn Fn() -> Vec<(String, u64)> + Send + Sync>;

/// `portwise_guest_log_lines_dropped`: a counter family read from the
/// runtime's [`LogDropSource`] on every scrape, as [`GuestFailures`] is.
#[derive(Clone, Default)]
struct LogDrops {
    source: Arc<RwLock<Option<LogDropSource>>>,
}

impl std::fmt::Debug for LogDrops {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogDrops").finish_non_exhaustive()
    }
}

impl Collector for LogDrops {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let rows = match &*self.source.read().unwrap_or_else(PoisonError::into_inner) {
            Some(source) => source(),
            None => Vec::new(),
        };
        let mut family = encoder.encode_descriptor(
            "guest_log_lines_dropped",
            "WebAssembly guest log lines (the log import, stdout and stderr) dropped \
             because the module logged past its rate, by module.",
            None,
            MetricType::Counter,
        )?;
        for (module, count) in rows {
            let labels = ModuleLabels {
                module: label(&module),
            };
            ConstCounter::new(count).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// Module loads, guest failures and dropped guest log lines. Clones share
/// the series.
#[derive(Clone, Debug)]
pub struct Guests {
    failures: GuestFailures,
    log_drops: LogDrops,
    loads: MetricFamily<ModuleLoadLabels, Counter>,
}

impl Guests {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let guests = Guests {
            failures: GuestFailures::default(),
            log_drops: LogDrops::default(),
            loads: MetricFamily::default(),
        };
        registry.register_collector(Box::new(guests.failures.clone()));
        registry.register_collector(Box::new(guests.log_drops.clone()));
        registry.register(
            "module_loads",
            "WebAssembly module loads by module and result (compiled|cached|failed)",
            guests.loads.clone(),
        );
        guests
    }

    /// Makes `portwise_guest_failures` report what `source` says at every
    /// scrape (`module` is the file name in the modules directory); replaces
    /// any earlier source.
    pub fn read_failures(
        &self,
        source: impl Fn() -> Vec<(String, GuestFailure, u64)> + Send + Sync + 'static,
    ) {
        *self
            .failures
            .source
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(Box::new(source));
    }

    /// Makes `portwise_guest_log_lines_dropped_total` report what `source`
    /// says at every scrape; replaces any earlier source.
    pub fn read_log_drops(&self, source: impl Fn() -> Vec<(String, u64)> + Send + Sync + 'static) {
        *self
            .log_drops
            .source
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(Box::new(source));
    }

    /// Counts one module load.
    pub fn count_load(&self, module: &str, result: ModuleLoad) {
        self.loads
            .get_or_create(&ModuleLoadLabels {
                module: label(module),
                result: result.as_str(),
            })
            .inc();
    }
}
