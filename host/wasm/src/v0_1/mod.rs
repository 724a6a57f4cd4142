//! `portwise:membership@0.1.0` (`wit/v0.1`): the pod and Service copied in
//! as records on every call. Still served for guests built against it
//! (docs/guests.md says for how long).
//!
//! - the bindings (here) and the conversions every version shares
//!   ([`crate::wit`]);
//! - [`records`]: a call's pod and Service as the records the guest gets;
//! - [`host`]: the imports (`probes`, `log`) on the shared store state.

mod host;
mod records;

pub(crate) use records::{Computed, Lists, pod, service};

wasmtime::component::bindgen!({
    path: "../../wit/v0.1",
    world: "membership-checker",
    // Probes await network I/O: async imports keep a probing guest from
    // blocking a runtime thread. Exports are async so calls run on a fiber
    // that the epoch deadline can interrupt and the caller can time out.
    imports: { default: async },
    exports: { default: async },
    // Records handed to the guest borrow from the informer's objects rather
    // than copying every label and annotation first (see `Computed`).
    ownership: Borrowing { duplicate_if_necessary: false },
});

crate::wit::alike_in_every_version!();
