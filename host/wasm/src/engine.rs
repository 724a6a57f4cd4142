//! The wasmtime `Engine`: one per runtime, configured for many short calls
//! into untrusted code.
//!
//! - The pooling allocator, so instantiating (after a trap, or when all
//!   ready instances are busy) is a slot reuse rather than fresh mmaps.
//! - Epoch interruption, the cheap way to bound a guest's time (fuel costs
//!   4-30% per call). A dedicated thread ticks the epoch; it is a thread and
//!   not a task so deadlines hold even when the async runtime is starved by
//!   the very guest being interrupted.
//! - A fingerprint of everything that makes compiled code incompatible, for
//!   the on-disk cache key.

use std::{
    hash::Hasher,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::Duration,
};

use sha2::{Digest, Sha256};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::Limits;

/// How often the epoch advances. Deadlines are rounded up to this.
pub(crate) const EPOCH_TICK: Duration = Duration::from_millis(2);

/// Core instances one component may hold. Components made by language
/// toolchains (Python, JavaScript) hold a dozen or more (the interpreter,
/// libc, adapters and shims each are one); the Rust guests hold a few.
pub(crate) const MAX_CORE_INSTANCES_PER_COMPONENT: u32 = 64;
/// Tables one component may hold (about one per core instance at most).
pub(crate) const MAX_TABLES_PER_COMPONENT: u32 = 64;
/// Linear memories one component may hold (every toolchain's output has
/// one). The memory limit counts all of them together ([`crate::limiter`]);
/// this caps the address space the pool reserves (a memory slot is about
/// 4 GiB of it: 100 instance slots reserve 1.7 TB, as before the cap).
pub(crate) const MAX_MEMORIES_PER_COMPONENT: u32 = 4;

pub(crate) fn build(limits: &Limits) -> wasmtime::Result<Engine> {
    let mut config = Config::new();
    config.wasm_component_model(true);
    config.epoch_interruption(true);

    let instances = limits.max_instances.max(1);
    let mut pool = PoolingAllocationConfig::new();
    // Every component instance slot gets its own share of each pool, so
    // whatever one component holds, another slot still finds room: a
    // component past a share fails to load, naming the cap.
    pool.total_component_instances(instances)
        .max_core_instances_per_component(MAX_CORE_INSTANCES_PER_COMPONENT)
        .max_tables_per_component(MAX_TABLES_PER_COMPONENT)
        .max_memories_per_component(MAX_MEMORIES_PER_COMPONENT)
        .total_core_instances(instances.saturating_mul(MAX_CORE_INSTANCES_PER_COMPONENT))
        .total_tables(instances.saturating_mul(MAX_TABLES_PER_COMPONENT))
        .total_memories(instances.saturating_mul(MAX_MEMORIES_PER_COMPONENT))
        .total_stacks(instances)
        .max_memory_size(limits.memory_ceiling());
    config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    Engine::new(&config)
}

/// A hex digest identifying compiled code compatibility: target, compiler
/// flags, tunables, wasm features and the wasmtime version (all covered by
/// `precompile_compatibility_hash`).
pub(crate) fn fingerprint(engine: &Engine) -> String {
    struct ShaHasher(Sha256);
    impl Hasher for ShaHasher {
        fn finish(&self) -> u64 {
            0 // unused: the digest is read below
        }
        fn write(&mut self, bytes: &[u8]) {
            self.0.update(bytes);
        }
    }
    let mut hasher = ShaHasher(Sha256::new());
    std::hash::Hash::hash(&engine.precompile_compatibility_hash(), &mut hasher);
    hex::encode(hasher.0.finalize())
}

/// Advances the engine's epoch every [`EPOCH_TICK`] until dropped.
pub(crate) struct Ticker {
    stop: Arc<AtomicBool>,
}

impl Ticker {
    pub(crate) fn start(engine: Engine) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        thread::Builder::new()
            .name("portwise-wasm-epoch".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    thread::sleep(EPOCH_TICK);
                    engine.increment_epoch();
                }
            })?;
        Ok(Ticker { stop })
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Epoch ticks covering `d`, at least one.
pub(crate) fn ticks(d: Duration) -> u64 {
    let tick = EPOCH_TICK.as_nanos();
    (d.as_nanos().div_ceil(tick)).clamp(1, u64::MAX as u128) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_round_up_and_are_never_zero() {
        assert_eq!(ticks(Duration::ZERO), 1);
        assert_eq!(ticks(EPOCH_TICK), 1);
        assert_eq!(ticks(EPOCH_TICK + Duration::from_nanos(1)), 2);
        assert_eq!(ticks(EPOCH_TICK * 50), 50);
    }

    #[test]
    fn fingerprint_is_stable_and_tracks_the_configuration() {
        let a = build(&Limits::default()).unwrap();
        let b = build(&Limits::default()).unwrap();
        assert_eq!(fingerprint(&a), fingerprint(&b));
        assert_eq!(fingerprint(&a).len(), 64);
        let mut other = Config::new();
        other.consume_fuel(true);
        let c = Engine::new(&other).unwrap();
        assert_ne!(fingerprint(&a), fingerprint(&c));
    }
}
