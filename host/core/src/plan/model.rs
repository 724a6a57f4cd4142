//! What the planner takes and gives: the judged members, the published
//! ones, the plan and its figures.

use std::{collections::BTreeMap, net::IpAddr, sync::Arc};

use k8s_openapi::api::{
    core::v1::{Pod, Service},
    discovery::v1::EndpointSlice,
};

use super::trigger::{TriggerMemory, Triggers};
use crate::membership::{Decision, Family, ResolvedPort};

/// The largest `maxEndpointsPerSlice` the API accepts.
pub const MAX_ENDPOINTS_PER_SLICE: usize = 1000;

/// The zone of a node, by name (`topology.kubernetes.io/zone`).
pub type ZoneLookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// One judged (Service port, family, pod): what the checker said.
#[derive(Clone, Debug)]
pub struct Judged {
    pub port: ResolvedPort,
    pub family: Family,
    pub pod: Arc<Pod>,
    pub address: IpAddr,
    pub decision: Decision,
}

/// A member after abstentions are settled: it is published.
#[derive(Clone, Debug)]
pub struct Member {
    pub port: ResolvedPort,
    pub family: Family,
    pub pod: Arc<Pod>,
    pub address: IpAddr,
}

/// Everything the planner looks at.
pub struct PlanInput<'a> {
    pub service: &'a Service,
    /// Value of the managed-by label; also the server-side apply field owner.
    pub managed_by: &'a str,
    /// Clamped to 1..=1000.
    pub max_endpoints_per_slice: usize,
    pub judged: &'a [Judged],
    /// Zone of a node; `None` when node lookups are disabled.
    pub zones: Option<ZoneLookup<'a>>,
    /// Live slices that may be ours (the shell passes candidates); the
    /// planner keeps only those [`super::is_ours`] accepts, and ignores the rest.
    pub owned: &'a [Arc<EndpointSlice>],
    /// Any live slice in the Service's namespace, by name.
    pub lookup: &'a dyn Fn(&str) -> Option<Arc<EndpointSlice>>,
    /// What dates the writes (the trigger-time annotation).
    pub triggers: Triggers<'a>,
}

/// The writes to make.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    /// Complete desired slices for server-side apply; only those that differ
    /// from their live state. Slices that gain an endpoint (publish one their
    /// live state does not show; every new slice with endpoints) come first,
    /// the rest after; by name within each part. Written in this order, an
    /// endpoint moving between slices of its (port, family) is in its new
    /// slice before its old slice drops it, so a failed apply (which holds
    /// back the rest of its set, see `apply.rs`) never unpublishes it.
    pub applies: Vec<EndpointSlice>,
    /// Names of owned slices that are no longer wanted. Sorted.
    pub deletes: Vec<String>,
    /// Written last, after the deletes: the applies that took in an
    /// endpoint another slice gives up, again, without the
    /// `portwise.io/moving-in` annotation their first write carries (see
    /// `moves.rs`: Cilium releases a backend when any slice drops it).
    pub finishes: Vec<EndpointSlice>,
    /// Names we wanted but someone else holds.
    pub collisions: Vec<Collision>,
    pub summary: Summary,
    /// The members published, abstentions settled (input order).
    pub members: Vec<Member>,
    /// The trigger times this plan saw, for the next plan of the Service
    /// ([`PlanInput::triggers`]) once this one is written.
    pub trigger_memory: TriggerMemory,
}

/// A wanted slice name held by a slice that is not ours.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Collision {
    pub name: String,
    /// Who holds it, for the Event (manager and Service).
    pub holder: String,
}

/// Figures for metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Endpoints published per (Service port name, `IPv4`/`IPv6`); every
    /// (port, family) of the Service is present, also with 0.
    pub endpoints: BTreeMap<(String, String), usize>,
    /// Slices that exist for the Service once the plan is applied.
    pub slices: usize,
    /// Slices the Service would need with perfect packing: per (ports,
    /// family), `ceil(endpoints / maxEndpointsPerSlice)` per set of port
    /// numbers, or 1 (the placeholder) for a port without members. The native controller's
    /// `desired_endpoint_slices`, in portwise's layout.
    pub desired_slices: usize,
    /// Endpoints this plan publishes that no live slice of their (port,
    /// family, target port) shows, and live ones it drops: the native
    /// controller's `endpoints_added_per_sync` / `_removed_per_sync`. An
    /// endpoint that only changes its conditions is neither.
    pub endpoints_added: usize,
    pub endpoints_removed: usize,
}
