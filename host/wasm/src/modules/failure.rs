//! Why a call produced no verdict of the guest's own making: a
//! [`Failure`], and the sorting of a wasmtime error into one.

use wasmtime::Trap;

use crate::{CallLimits, failures::FailureKind, state::HostState};
use portwise_core::text::truncate;

pub(crate) use crate::error::Failure;

impl Failure {
    pub(super) fn new(kind: FailureKind, message: impl Into<String>) -> Self {
        Failure {
            kind,
            message: message.into(),
        }
    }
}

/// Sorts a wasmtime error from a call into a failure kind.
pub(super) fn classify(e: &wasmtime::Error, state: &HostState, limits: &CallLimits) -> Failure {
    let memory = state.limiter.denied.map(|(current, desired)| {
        format!(
            "memory limit: growth of the instance's memories from {} to {} KiB in all refused (limit {} KiB)",
            current / 1024,
            desired / 1024,
            limits.memory_bytes / 1024
        )
    });
    // Trap's Display starts with "wasm trap: "; the kind already says so.
    let what = |trap: &Trap| {
        trap.to_string()
            .trim_start_matches("wasm trap: ")
            .to_string()
    };
    match e.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => Failure::new(
            FailureKind::Deadline,
            format!("ran past its compute deadline of {:?}", limits.deadline),
        ),
        Some(trap) => match memory {
            Some(m) => Failure::new(FailureKind::Memory, format!("{m}, then: {}", what(trap))),
            None => Failure::new(FailureKind::Trap, what(trap)),
        },
        None => match memory {
            Some(m) => Failure::new(FailureKind::Memory, format!("{m}: {e:#}")),
            None if crate::wasi::is_random_refusal(e) => Failure::new(
                FailureKind::Memory,
                format!(
                    "random bytes past the limit of {} KiB: {e:#}",
                    limits.memory_bytes.min(crate::wasi::MAX_RANDOM_BYTES) / 1024
                ),
            ),
            // No trap: the guest returned, but its answer could not be lifted
            // (invalid UTF-8, out-of-bounds pointers, bad discriminants).
            None => Failure::new(FailureKind::InvalidAnswer, truncate(format!("{e:#}"), 512)),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use wasmtime_wasi::{WasiView, p2::bindings::random::random::Host as _};

    use super::*;
    use crate::Limits;

    #[test]
    fn a_random_request_past_the_cap_is_a_memory_failure() {
        let limits = Limits::default();
        let call = limits.for_expression(&Default::default()).unwrap();
        let mut state = HostState::new(Arc::new(limits), Default::default(), call.memory_bytes);
        let Err(e) = state.ctx().ctx.random().get_random_bytes(32 << 20) else {
            panic!("32 MiB of random bytes were served");
        };
        let f = classify(&e, &state, &call);
        assert_eq!(f.kind, FailureKind::Memory, "{f}");
        assert!(
            f.message
                .contains("random bytes past the limit of 1024 KiB"),
            "{f}"
        );
    }
}
