//! Label values (the enums the controller counts by, spelled as the
//! series spell them) and the label sets of the series.

use prometheus_client::encoding::EncodeLabelSet;

use portwise_core::membership::Decision;

/// Which native leftover a migration cleanup deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CleanupKind {
    /// The legacy `v1/Endpoints` object of the Service.
    Endpoints,
    /// An EndpointSlice managed by `endpointslice-controller.k8s.io`.
    EndpointSlice,
}

impl CleanupKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CleanupKind::Endpoints => "endpoints",
            CleanupKind::EndpointSlice => "endpointslice",
        }
    }
}

/// How loading a module from the modules directory went.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ModuleLoad {
    /// Compiled from the `.wasm` file.
    Compiled,
    /// Taken from the compiled-code cache (no compilation).
    Cached,
    /// Failed; the previous version (if any) stays in service.
    Failed,
}

impl ModuleLoad {
    pub fn as_str(self) -> &'static str {
        match self {
            ModuleLoad::Compiled => "compiled",
            ModuleLoad::Cached => "cached",
            ModuleLoad::Failed => "failed",
        }
    }
}

/// A write portwise issued to the apiserver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WriteKind {
    /// A create or update: a POST, a resourceVersion-checked PUT, or the
    /// server-side apply an update falls back to (`crate::apply`). The
    /// label keeps its name, `apply`, from when every write was one.
    Apply,
    /// A delete.
    Delete,
}

impl WriteKind {
    pub fn as_str(self) -> &'static str {
        match self {
            WriteKind::Apply => "apply",
            WriteKind::Delete => "delete",
        }
    }
}

/// A phase of one reconcile, for `portwise_reconcile_phase_duration_seconds`:
/// where a reconcile's time goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReconcilePhase {
    /// From the pod change that asked for the reconcile to the Service
    /// being ready in the queue: nothing, unless a reconcile of the same
    /// Service was under way and had to end first. Only for reconciles a
    /// pod change asked for.
    Trigger,
    /// Ready in the queue until handed out: its namespace's turn and a
    /// reconcile slot (`--reconcile-concurrency`).
    Queue,
    /// Reading the caches, deciding and running the checkers.
    Judge,
    /// Planning the slices from the verdicts.
    Plan,
    /// The EndpointSlice writes (apiserver round trips).
    Write,
    /// What follows the writes: native cleanup, legacy Endpoints, metrics.
    Finish,
}

impl ReconcilePhase {
    pub const ALL: [ReconcilePhase; 6] = [
        ReconcilePhase::Trigger,
        ReconcilePhase::Queue,
        ReconcilePhase::Judge,
        ReconcilePhase::Plan,
        ReconcilePhase::Write,
        ReconcilePhase::Finish,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ReconcilePhase::Trigger => "trigger",
            ReconcilePhase::Queue => "queue",
            ReconcilePhase::Judge => "judge",
            ReconcilePhase::Plan => "plan",
            ReconcilePhase::Write => "write",
            ReconcilePhase::Finish => "finish",
        }
    }
}

/// A stage of the cold start, for `portwise_cold_start_seconds`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ColdStartStage {
    /// Every cache has made its first list (the process turns ready).
    Synced,
    /// Every Service the synced caches held has been reconciled once.
    Reconciled,
}

impl ColdStartStage {
    pub fn as_str(self) -> &'static str {
        match self {
            ColdStartStage::Synced => "synced",
            ColdStartStage::Reconciled => "reconciled",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct StageLabels {
    pub(super) stage: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub(super) struct PhaseLabels {
    pub(super) phase: &'static str,
}

/// The label value for a decision.
pub fn decision_label(decision: Decision) -> &'static str {
    match decision {
        Decision::Include => "include",
        Decision::Exclude => "exclude",
        Decision::Abstain => "abstain",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct NamespaceLabels {
    pub(super) namespace: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ServiceLabels {
    pub(super) namespace: String,
    pub(super) service: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct NotJudgedLabels {
    pub(super) namespace: String,
    pub(super) service: String,
    pub(super) reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ShadowLabels {
    pub(super) namespace: String,
    pub(super) service: String,
    pub(super) shadow: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ShadowPortLabels {
    pub(super) namespace: String,
    pub(super) service: String,
    pub(super) shadow: String,
    pub(super) port: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct PublishedLabels {
    pub(super) namespace: String,
    pub(super) service: String,
    pub(super) port: String,
    pub(super) family: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct DecisionLabels {
    pub(super) decision: &'static str,
    /// The expression that decided (`membership`, `policies.NAME`).
    pub(super) policy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct KindLabels {
    pub(super) kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ErrorLabels {
    pub(super) kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ModuleLabels {
    pub(super) module: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct GuestFailureLabels {
    pub(super) module: String,
    pub(super) kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ModuleLoadLabels {
    pub(super) module: String,
    pub(super) result: &'static str,
}

/// A label value escaped for the text exposition. prometheus-client 0.23
/// writes label values verbatim, and module file names (or a future error
/// kind) could hold a quote or a newline that would corrupt the whole scrape.
pub(super) fn label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

pub(super) fn gauge_value(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
