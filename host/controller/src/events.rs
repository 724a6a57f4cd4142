//! Events on the Services portwise serves (warnings, cleanups, shadow
//! reports), with notes bounded to what the API accepts.

use k8s_openapi::api::core::v1::Service;
use kube::{
    Resource, ResourceExt,
    runtime::events::{Event as KubeEvent, EventType, Recorder},
};
use tracing::warn;

/// Every Event reason portwise records, with its type: the one list the
/// docs' Events table (docs/operations.md) is checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    SelectorIgnored,
    ExternalNameIgnored,
    EndpointSliceNameCollision,
    NativeEndpointsCleanedUp,
    EndpointsOwnedByOther,
    PolicyUnknown,
    /// The MembershipPolicy that would decide cannot yet (not accepted,
    /// modules not ready): the Service is held.
    PolicyNotReady,
    /// A Service's deciding policy changed (a policy object, or back).
    PolicyChosen,
    ShadowDiffers,
    ShadowAgrees,
    ShadowUnknown,
    /// On portwise's own Pod, by the binary (`portwise run`'s module report).
    ModuleLoadFailed,
    /// On portwise's own Pod, by the binary: a changed config file was
    /// refused, the running one keeps running.
    ConfigReloadFailed,
    /// On a shard ring's bucket Lease: this replica took the bucket.
    BucketAcquired,
    /// On a bucket Lease: handed over, or released on leaving.
    BucketReleased,
    /// On a bucket Lease: the term ended without a release (renewals
    /// failed); the replica stopped writing there.
    BucketLost,
}

impl Reason {
    pub const ALL: [Reason; 16] = [
        Reason::SelectorIgnored,
        Reason::ExternalNameIgnored,
        Reason::EndpointSliceNameCollision,
        Reason::NativeEndpointsCleanedUp,
        Reason::EndpointsOwnedByOther,
        Reason::PolicyUnknown,
        Reason::PolicyNotReady,
        Reason::PolicyChosen,
        Reason::ShadowDiffers,
        Reason::ShadowAgrees,
        Reason::ShadowUnknown,
        Reason::ModuleLoadFailed,
        Reason::ConfigReloadFailed,
        Reason::BucketAcquired,
        Reason::BucketReleased,
        Reason::BucketLost,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::SelectorIgnored => "SelectorIgnored",
            Reason::ExternalNameIgnored => "ExternalNameIgnored",
            Reason::EndpointSliceNameCollision => "EndpointSliceNameCollision",
            Reason::NativeEndpointsCleanedUp => "NativeEndpointsCleanedUp",
            Reason::EndpointsOwnedByOther => "EndpointsOwnedByOther",
            Reason::PolicyUnknown => "PolicyUnknown",
            Reason::PolicyNotReady => "PolicyNotReady",
            Reason::PolicyChosen => "PolicyChosen",
            Reason::ShadowDiffers => "ShadowDiffers",
            Reason::ShadowAgrees => "ShadowAgrees",
            Reason::ShadowUnknown => "ShadowUnknown",
            Reason::ModuleLoadFailed => "ModuleLoadFailed",
            Reason::ConfigReloadFailed => "ConfigReloadFailed",
            Reason::BucketAcquired => "BucketAcquired",
            Reason::BucketReleased => "BucketReleased",
            Reason::BucketLost => "BucketLost",
        }
    }

    pub fn event_type(self) -> EventType {
        match self {
            Reason::NativeEndpointsCleanedUp
            | Reason::ShadowDiffers
            | Reason::ShadowAgrees
            | Reason::PolicyChosen
            | Reason::BucketAcquired
            | Reason::BucketReleased => EventType::Normal,
            _ => EventType::Warning,
        }
    }
}

/// Publishes Events as portwise (its managed-by name and this replica).
pub(crate) struct Events {
    recorder: Recorder,
}

impl Events {
    pub(crate) fn new(recorder: Recorder) -> Self {
        Events { recorder }
    }

    /// Publishes one Event on `svc`; a failure is logged, never fatal.
    pub(crate) async fn publish(&self, svc: &Service, reason: Reason, note: String) {
        let ev = KubeEvent {
            type_: reason.event_type(),
            reason: reason.as_str().into(),
            note: Some(portwise_core::text::cut(note, 1000)),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &svc.object_ref(&())).await {
            warn!(service = %svc.name_any(), error = %e, reason = reason.as_str(), "could not publish Event");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The docs' Events table lists every reason the code records, with its
    /// type, and nothing else (issue 43: `PolicyUnknown` was missing).
    #[test]
    fn the_docs_events_table_is_the_code_s() {
        let docs = include_str!("../../../docs/operations.md");
        let table = docs
            .split("\n## Events\n")
            .nth(1)
            .expect("docs/operations.md has an Events section");
        let rows: Vec<(String, String)> = table
            .lines()
            .skip_while(|l| !l.starts_with("| reason"))
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                (cells[1].trim_matches('`').to_string(), cells[2].to_string())
            })
            .collect();
        let code: Vec<(String, String)> = Reason::ALL
            .iter()
            .map(|r| {
                let t = match r.event_type() {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                };
                (r.as_str().to_string(), t.to_string())
            })
            .collect();
        let mut sorted_rows = rows.clone();
        sorted_rows.sort();
        let mut sorted_code = code.clone();
        sorted_code.sort();
        assert_eq!(
            sorted_rows, sorted_code,
            "docs/operations.md#events against events::Reason"
        );
    }
}
