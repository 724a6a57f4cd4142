//! The memory limit of an instance, and the memory of having refused it:
//! what tells a `memory` failure from a `trap`.

use wasmtime::{ResourceLimiter, StoreLimits, StoreLimitsBuilder};

/// Memory limit per linear memory, enforced by wasmtime's [`StoreLimits`].
/// Refusing growth (rather than trapping in the host) lets the guest's
/// allocator fail its own way, usually with an `unreachable` trap.
///
/// `StoreLimits` cannot say afterwards that it refused anything, and that is
/// what turns such a trap into a `memory` failure rather than a `trap`: this
/// wrapper delegates every decision to it and only records a refusal of our
/// limit in `denied`.
#[derive(Debug)]
pub(crate) struct MemoryLimiter {
    limits: StoreLimits,
    max_bytes: usize,
    /// The last refused growth: (current, desired) bytes.
    pub denied: Option<(usize, usize)>,
}

/// Tables hold function references; a checker needs few.
const MAX_TABLE_ELEMENTS: usize = 1_000_000;

impl MemoryLimiter {
    pub(crate) fn new(max_bytes: usize) -> Self {
        MemoryLimiter {
            limits: StoreLimitsBuilder::new()
                .memory_size(max_bytes)
                .table_elements(MAX_TABLE_ELEMENTS)
                .build(),
            max_bytes,
            denied: None,
        }
    }
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let allowed = self.limits.memory_growing(current, desired, maximum)?;
        // Only our limit is a memory failure; growth past the module's own
        // declared maximum fails in wasmtime anyway and stays a trap.
        if !allowed && desired > self.max_bytes {
            self.denied = Some((current, desired));
        }
        Ok(allowed)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.limits.table_growing(current, desired, maximum)
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.limits.memory_grow_failed(error)
    }

    fn table_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.limits.table_grow_failed(error)
    }

    fn instances(&self) -> usize {
        self.limits.instances()
    }

    fn tables(&self) -> usize {
        self.limits.tables()
    }

    fn memories(&self) -> usize {
        self.limits.memories()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limiter_refuses_growth_past_the_limit_and_remembers_it() {
        let mut l = MemoryLimiter::new(1 << 20);
        assert!(l.memory_growing(0, 1 << 20, None).unwrap());
        assert!(l.denied.is_none());
        assert!(!l.memory_growing(1 << 20, 2 << 20, None).unwrap());
        assert_eq!(l.denied, Some((1 << 20, 2 << 20)));
    }
}
