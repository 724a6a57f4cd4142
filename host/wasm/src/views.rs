//! The pod and the Service of a call, as `portwise:membership@0.2.0`
//! resources: what the bindings name as the resource types, and what the
//! host side of those resources (`resources.rs`) reads.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, Service};

/// The pod under judgement, as a 0.2 guest sees it.
pub struct PodView {
    pub(crate) pod: Arc<Pod>,
}

/// The Service the slices are published for, as a 0.2 guest sees it.
pub struct ServiceView {
    pub(crate) service: Arc<Service>,
}
