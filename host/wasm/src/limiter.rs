//! The memory limit of an instance, and the memory of having refused it:
//! what tells a `memory` failure from a `trap`.

use wasmtime::{ResourceLimiter, StoreLimits, StoreLimitsBuilder};

/// Memory limit of a store: all its linear memories together. A component
/// may define (or instantiate a core module into) several memories, and a
/// limit per memory let each of them grow to the limit. Refusing growth
/// (rather than trapping in the host) lets the guest's allocator fail its
/// own way, usually with an `unreachable` trap.
///
/// Tables stay with wasmtime's [`StoreLimits`]. Neither can say afterwards
/// that it refused anything, and that is what turns such a trap into a
/// `memory` failure rather than a `trap`: a refusal of our limit is
/// recorded in `denied`.
#[derive(Debug)]
pub(crate) struct MemoryLimiter {
    limits: StoreLimits,
    max_bytes: usize,
    /// Bytes of all linear memories of the store (memories live as long
    /// as the store, so this only grows).
    used: usize,
    /// The growth allowed last, taken back if the memory then fails to grow.
    last_grant: usize,
    /// The last refused growth: (store total before, store total asked) in
    /// bytes.
    pub denied: Option<(usize, usize)>,
}

/// Tables hold function references; a checker needs few.
const MAX_TABLE_ELEMENTS: usize = 1_000_000;

impl MemoryLimiter {
    pub(crate) fn new(max_bytes: usize) -> Self {
        MemoryLimiter {
            limits: StoreLimitsBuilder::new()
                .table_elements(MAX_TABLE_ELEMENTS)
                .build(),
            max_bytes,
            used: 0,
            last_grant: 0,
            denied: None,
        }
    }

    /// Bytes of linear memory the store holds.
    #[cfg(test)]
    pub(crate) fn used(&self) -> usize {
        self.used
    }
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // A new memory is announced as growing from 0 to its minimum.
        let more = desired.saturating_sub(current);
        let total = self.used.saturating_add(more);
        if total > self.max_bytes {
            self.denied = Some((self.used, total));
            return Ok(false);
        }
        // Growth past the module's own declared maximum fails in wasmtime
        // (`memory_grow_failed` below) and stays a trap.
        if maximum.is_some_and(|max| desired > max) {
            return Ok(false);
        }
        self.used = total;
        self.last_grant = more;
        Ok(true)
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
        // Growth is one at a time per store: the failed one is the last grant.
        self.used = self
            .used
            .saturating_sub(std::mem::take(&mut self.last_grant));
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

    #[test]
    fn all_memories_of_a_store_count_against_one_limit() {
        // Four memories of 24 MiB: each is below the 64 MiB limit, the
        // store is not.
        let mut l = MemoryLimiter::new(64 << 20);
        assert!(l.memory_growing(0, 24 << 20, None).unwrap());
        assert!(l.memory_growing(0, 24 << 20, None).unwrap());
        assert_eq!(l.used(), 48 << 20);
        assert!(!l.memory_growing(0, 24 << 20, None).unwrap());
        assert_eq!(l.denied, Some((48 << 20, 72 << 20)));
        // Growing one of the first two counts only the difference.
        assert!(l.memory_growing(24 << 20, 40 << 20, None).unwrap());
        assert_eq!(l.used(), 64 << 20);
        assert!(
            !l.memory_growing(40 << 20, (40 << 20) + 65536, None)
                .unwrap()
        );
    }

    #[test]
    fn a_growth_that_fails_after_the_grant_is_taken_back() {
        let mut l = MemoryLimiter::new(64 << 20);
        assert!(l.memory_growing(0, 1 << 20, None).unwrap());
        assert!(l.memory_growing(1 << 20, 40 << 20, None).unwrap());
        l.memory_grow_failed(wasmtime::Error::msg("no")).unwrap();
        assert_eq!(l.used(), 1 << 20);
        // Past the memory's own maximum: refused, but not our limit.
        assert!(!l.memory_growing(1 << 20, 2 << 20, Some(1 << 20)).unwrap());
        assert!(l.denied.is_none());
    }
}
