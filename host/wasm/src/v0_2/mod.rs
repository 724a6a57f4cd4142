//! `portwise:membership@0.2.x` (`wit/`, today 0.2.1): the pod and Service
//! are host resources the guest queries, so only what it reads is copied.
//! A 0.2.0 guest is served by the same bindings: wasmtime matches imports
//! and exports of semver-compatible versions, and 0.2.1 only adds imports.
//!
//! - the bindings (here) and the conversions every version shares
//!   ([`crate::wit`]);
//! - [`resources`]: the pod and Service views and their queries;
//! - [`host`]: the imports (`probes`, `log`) on the shared store state.

mod host;
pub(crate) mod resources;

wasmtime::component::bindgen!({
    path: "../../wit",
    world: "membership-checker",
    // Only the probes wait on I/O. The pod and Service queries are plain
    // lookups: synchronous, so a query costs a host call and no future.
    // They can trap (a handle the table does not know).
    imports: {
        "portwise:membership/probes.http-get": async,
        "portwise:membership/probes.tcp-dial": async,
        "portwise:membership/probes.http-get-with": async,
        "portwise:membership/probes.grpc-health": async,
        default: trappable,
    },
    exports: { default: async },
    ownership: Borrowing { duplicate_if_necessary: false },
    with: {
        "portwise:membership/types.pod": crate::v0_2::resources::PodView,
        "portwise:membership/types.service": crate::v0_2::resources::ServiceView,
    },
});

crate::wit::alike_in_every_version!();
