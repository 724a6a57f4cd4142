//! Events on the Services portwise serves (warnings, cleanups, shadow
//! reports), with notes bounded to what the API accepts.

use k8s_openapi::api::core::v1::Service;
use kube::{
    Resource, ResourceExt,
    runtime::events::{Event as KubeEvent, EventType, Recorder},
};
use tracing::warn;

/// Publishes Events as portwise (its managed-by name and this replica).
pub(crate) struct Events {
    recorder: Recorder,
}

impl Events {
    pub(crate) fn new(recorder: Recorder) -> Self {
        Events { recorder }
    }

    /// Publishes one Event on `svc`; a failure is logged, never fatal.
    pub(crate) async fn publish(
        &self,
        svc: &Service,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let ev = KubeEvent {
            type_,
            reason: reason.into(),
            note: Some(portwise_core::text::cut(note, 1000)),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &svc.object_ref(&())).await {
            warn!(service = %svc.name_any(), error = %e, "could not publish Event {reason}");
        }
    }
}
