//! The series an operator of the native EndpointSlice controller knows,
//! with the same meaning: `endpoint_slice_controller_X` is `portwise_X`
//! (k8s.io/endpointslice/metrics). A dashboard or alert written for the
//! native controller carries over by changing the prefix.
//!
//! - `endpoints_added_per_sync`, `endpoints_removed_per_sync`: histograms,
//!   one observation per planned Service sync, buckets 2 .. 32768 as
//!   upstream's;
//! - `endpoints_desired`, `num_endpoint_slices`, `desired_endpoint_slices`:
//!   cluster-wide totals over the Services portwise serves, kept per Service
//!   so a Service's last figures can be replaced or taken out, as upstream's
//!   metrics cache does;
//! - `changes_total{operation=create|update|delete}`: EndpointSlice writes
//!   that succeeded;
//! - `syncs_total{result=success|error}`: every Service reconcile. Upstream
//!   also counts `stale` (a sync refused because its informer had not yet
//!   seen its own last write); portwise overlays its own writes on the cache
//!   instead of refusing, so it has no such result.

use std::{collections::HashMap, sync::PoisonError};

use prometheus_client::encoding::EncodeLabelSet;

use super::{
    labels::{gauge_value, label},
    registry::Metrics,
};

/// What one EndpointSlice write did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SliceChange {
    Create,
    Update,
    Delete,
}

impl SliceChange {
    pub const ALL: [SliceChange; 3] = [
        SliceChange::Create,
        SliceChange::Update,
        SliceChange::Delete,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SliceChange::Create => "create",
            SliceChange::Update => "update",
            SliceChange::Delete => "delete",
        }
    }
}

/// How one Service reconcile ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SyncResult {
    Success,
    Error,
}

impl SyncResult {
    pub const ALL: [SyncResult; 2] = [SyncResult::Success, SyncResult::Error];

    pub fn as_str(self) -> &'static str {
        match self {
            SyncResult::Success => "success",
            SyncResult::Error => "error",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct OperationLabels {
    pub(super) operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ResultLabels {
    pub(super) result: &'static str,
}

/// One Service's share of the totals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Share {
    endpoints: usize,
    slices: usize,
    desired_slices: usize,
}

/// The totals and each Service's share of them, by (namespace, service).
#[derive(Debug, Default)]
pub(super) struct Totals {
    shares: HashMap<(String, String), Share>,
    sum: Share,
}

impl Totals {
    /// Replaces (or, with `None`, removes) one Service's share; the new sum.
    fn put(&mut self, key: (String, String), share: Option<Share>) -> Share {
        let before = match share {
            Some(share) => self.shares.insert(key, share),
            None => self.shares.remove(&key),
        }
        .unwrap_or_default();
        let after = share.unwrap_or_default();
        self.sum = Share {
            endpoints: self.sum.endpoints - before.endpoints + after.endpoints,
            slices: self.sum.slices - before.slices + after.slices,
            desired_slices: self.sum.desired_slices - before.desired_slices + after.desired_slices,
        };
        self.sum
    }
}

impl Metrics {
    /// One planned sync of a Service: the endpoints it adds and removes.
    pub fn observe_sync_plan(&self, endpoints_added: usize, endpoints_removed: usize) {
        self.endpoints_added_per_sync
            .observe(endpoints_added as f64);
        self.endpoints_removed_per_sync
            .observe(endpoints_removed as f64);
    }

    /// A Service's endpoints, slices and desired slices once its sync is
    /// written, in the cluster-wide totals.
    pub(super) fn set_native_share(
        &self,
        namespace: &str,
        service: &str,
        endpoints: usize,
        slices: usize,
        desired_slices: usize,
    ) {
        let share = Share {
            endpoints,
            slices,
            desired_slices,
        };
        self.put_native_share(namespace, service, Some(share));
    }

    /// Takes a Service out of the totals (deleted, or no longer ours).
    pub(super) fn forget_native_share(&self, namespace: &str, service: &str) {
        self.put_native_share(namespace, service, None);
    }

    fn put_native_share(&self, namespace: &str, service: &str, share: Option<Share>) {
        let sum = self
            .native_totals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .put((label(namespace), label(service)), share);
        self.endpoints_desired.set(gauge_value(sum.endpoints));
        self.num_endpoint_slices.set(gauge_value(sum.slices));
        self.desired_endpoint_slices
            .set(gauge_value(sum.desired_slices));
    }

    /// Counts one EndpointSlice write that succeeded.
    pub fn count_slice_change(&self, change: SliceChange) {
        self.changes
            .get_or_create(&OperationLabels {
                operation: change.as_str(),
            })
            .inc();
    }

    /// Counts one Service reconcile by how it ended.
    pub fn count_sync(&self, result: SyncResult) {
        self.syncs
            .get_or_create(&ResultLabels {
                result: result.as_str(),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_replaced_or_removed_moves_the_sum() {
        let mut t = Totals::default();
        let a = ("ns".to_string(), "a".to_string());
        let b = ("ns".to_string(), "b".to_string());
        let share = |endpoints, slices, desired_slices| Share {
            endpoints,
            slices,
            desired_slices,
        };
        assert_eq!(t.put(a.clone(), Some(share(10, 2, 1))), share(10, 2, 1));
        assert_eq!(t.put(b.clone(), Some(share(3, 1, 1))), share(13, 3, 2));
        // Replaced, not added again.
        assert_eq!(t.put(a.clone(), Some(share(4, 1, 1))), share(7, 2, 2));
        assert_eq!(t.put(a.clone(), None), share(3, 1, 1));
        // Removing what is not there changes nothing.
        assert_eq!(t.put(a, None), share(3, 1, 1));
        assert_eq!(t.put(b, None), Share::default());
    }
}
