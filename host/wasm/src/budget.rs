//! The process's guest memory budget: the most linear memory the guest
//! instances of a configuration can hold at once, against the container's
//! memory limit. Pure arithmetic; `portwise run` reads the limit (the
//! cgroup) and refuses to start when the worst case does not fit, so that
//! hostile guests cost abstains, not an OOM kill that the standby, loading
//! the same modules, would repeat.
//!
//! Who holds an instance at once:
//! - each live check in flight (`maxConcurrentChecks` of them) holds at most
//!   one (an expression's children run one after the other), of any module
//!   the live expressions (membership, policies) name: the largest limit
//!   among them counts;
//! - each shadow check likewise, from a pool of its own of the same size;
//! - every module keeps up to [`crate::Limits::idle_instances`] ready ones,
//!   with the memory their last call grew them to;
//! - a reload validates the configurations in use on one instance at a
//!   time;
//!
//! and never more than [`crate::Limits::max_instances`] in all. Each counts
//! its memory limit (all its linear memories together) plus
//! [`INSTANCE_OVERHEAD_BYTES`].

use std::collections::BTreeMap;

use portwise_core::config::WasmSpec;

use crate::{Limits, wasi::MAX_RANDOM_BYTES};

/// Host memory of an instance besides its linear memories: its async stack
/// (wasmtime's default, 2 MiB), the random bytes WASI may hand it in one
/// call, its tables, instance state and WASI context (rounded up to 4 MiB).
pub const INSTANCE_OVERHEAD_BYTES: u64 = (2 << 20) + MAX_RANDOM_BYTES as u64 + (1 << 20);

/// What the controller needs besides its guests: its caches, the compiled
/// code of the modules, the HTTP clients (the 10k-pod load test peaked at
/// 150 MiB RSS with no guests).
pub const CONTROLLER_RESERVE_BYTES: u64 = 128 << 20;

/// How a module is used by a configuration: its largest memory limit over
/// the expressions that name it, and by which pool of checks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModuleUse {
    pub memory_bytes: u64,
    /// Named by `membership` or a policy.
    pub live: bool,
    /// Named by a shadow expression.
    pub shadow: bool,
}

/// The modules of a configuration, by name, from each `wasm` expression's
/// module, effective memory limit and pool.
#[derive(Clone, Debug, Default)]
pub struct ModuleUses(pub BTreeMap<String, ModuleUse>);

impl ModuleUses {
    /// Adds one `wasm` expression's use of `module`.
    pub fn add(&mut self, module: &str, memory_bytes: u64, shadow: bool) {
        let u = self.0.entry(module.to_string()).or_default();
        u.memory_bytes = u.memory_bytes.max(memory_bytes);
        if shadow {
            u.shadow = true;
        } else {
            u.live = true;
        }
    }
}

/// The modules of these expressions, by their module names, each with
/// its largest effective memory limit under `limits`.
pub fn module_uses<'a>(
    live: impl IntoIterator<Item = &'a WasmSpec>,
    shadow: impl IntoIterator<Item = &'a WasmSpec>,
    limits: &Limits,
) -> ModuleUses {
    let mut uses = ModuleUses::default();
    let live = live.into_iter().map(|s| (s, false));
    for (spec, is_shadow) in live.chain(shadow.into_iter().map(|s| (s, true))) {
        let bytes = match spec.limits.memory_mib {
            Some(mib) => mib.saturating_mul(1 << 20),
            None => limits.memory_bytes as u64,
        };
        let name = crate::module_key(&spec.module).unwrap_or_else(|_| spec.module.clone());
        uses.add(&name, bytes, is_shadow);
    }
    uses
}

/// One term of the worst case, for the error message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Term {
    pub instances: u64,
    /// Per instance, the overhead included.
    pub bytes_each: u64,
    /// What holds them, naming the module(s).
    pub what: String,
}

/// The most guest memory the configuration's instances can hold at once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorstCase {
    pub bytes: u64,
    pub terms: Vec<Term>,
}

/// Which modules a term is about.
type Pick = fn(&ModuleUse) -> bool;

impl WorstCase {
    /// `uses` run with `checks` checks in flight per pool (live, shadow)
    /// and the runtime's `limits`.
    pub fn of(uses: &ModuleUses, checks: usize, limits: &Limits) -> WorstCase {
        let each = |u: &ModuleUse| u.memory_bytes.saturating_add(INSTANCE_OVERHEAD_BYTES);
        let largest = |pick: Pick| {
            uses.0
                .iter()
                .filter(|&(_, u)| pick(u))
                .max_by_key(|(_, u)| u.memory_bytes)
                .map(|(m, u)| (m.clone(), each(u)))
        };
        let checks = checks as u64;
        let mut terms = Vec::new();
        let pools: [(&str, Pick); 2] = [("live", |u| u.live), ("shadow", |u| u.shadow)];
        for (pool, pick) in pools {
            if let Some((module, bytes_each)) = largest(pick) {
                terms.push(Term {
                    instances: checks,
                    bytes_each,
                    what: format!("{pool} checks in flight, on {module}"),
                });
            }
        }
        let idle = limits.idle_instances as u64;
        if idle > 0 {
            for (module, u) in &uses.0 {
                terms.push(Term {
                    instances: idle,
                    bytes_each: each(u),
                    what: format!("idle instances of {module}"),
                });
            }
        }
        if let Some((module, bytes_each)) = largest(|_| true) {
            terms.push(Term {
                instances: 1,
                bytes_each,
                what: format!("a reload validating {module}"),
            });
        }
        let sum = terms.iter().fold(0u64, |acc, t| {
            acc.saturating_add(t.instances.saturating_mul(t.bytes_each))
        });
        // The pooling allocator has no more slots than this.
        let slots = u64::from(limits.max_instances.max(1))
            .saturating_mul(terms.iter().map(|t| t.bytes_each).max().unwrap_or(0));
        WorstCase {
            bytes: sum.min(slots),
            terms,
        }
    }

    /// Refuses a worst case past `container_limit` (bytes; `None`: no
    /// limit) less [`CONTROLLER_RESERVE_BYTES`].
    pub fn fits(&self, container_limit: Option<u64>) -> Result<(), BudgetError> {
        let Some(limit) = container_limit else {
            return Ok(());
        };
        let budget = limit.saturating_sub(CONTROLLER_RESERVE_BYTES);
        if self.bytes <= budget {
            return Ok(());
        }
        Err(BudgetError {
            worst: self.clone(),
            limit,
        })
    }
}

/// A configuration whose guests could hold more memory than the container
/// has: an OOM kill waiting for a guest that allocates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BudgetError {
    pub worst: WorstCase,
    pub limit: u64,
}

impl std::error::Error for BudgetError {}

fn mib(bytes: u64) -> u64 {
    bytes.div_ceil(1 << 20)
}

impl std::fmt::Display for BudgetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "WebAssembly guests could hold {} MiB at once, more than the container's memory limit of {} MiB \
             less {} MiB for portwise itself: ",
            mib(self.worst.bytes),
            mib(self.limit),
            mib(CONTROLLER_RESERVE_BYTES),
        )?;
        for (i, t) in self.worst.terms.iter().enumerate() {
            let sep = if i == 0 { "" } else { " + " };
            write!(
                f,
                "{sep}{} × {} MiB ({})",
                t.instances,
                mib(t.bytes_each),
                t.what
            )?;
        }
        write!(
            f,
            " (each instance: its limits.memoryMiB, else --guest-memory-mib, plus {} MiB). \
             Lower limits.memoryMiB of these modules or maxConcurrentChecks, or raise the memory limit",
            mib(INSTANCE_OVERHEAD_BYTES)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn limits() -> Limits {
        Limits::default() // 4 idle instances per module, 100 slots
    }

    #[test]
    fn sixteen_checks_at_64_mib_do_not_fit_512_mib() {
        let mut uses = ModuleUses::default();
        uses.add("hog.wasm", 64 * MIB, false);
        let w = WorstCase::of(&uses, 16, &limits());
        // 16 in flight, 4 idle, 1 validating, 68 MiB each.
        assert_eq!(w.bytes, 21 * 68 * MIB);
        let e = w.fits(Some(512 * MIB)).unwrap_err().to_string();
        assert!(e.contains("could hold 1428 MiB at once"), "{e}");
        assert!(e.contains("memory limit of 512 MiB less 128 MiB"), "{e}");
        assert!(
            e.contains("16 × 68 MiB (live checks in flight, on hog.wasm)"),
            "{e}"
        );
        assert!(e.contains("4 × 68 MiB (idle instances of hog.wasm)"), "{e}");
        assert!(e.contains("Lower limits.memoryMiB"), "{e}");
        // No limit, or a large one: fine.
        assert!(w.fits(None).is_ok());
        assert!(w.fits(Some(2048 * MIB)).is_ok());
    }

    #[test]
    fn the_largest_limit_of_each_pool_counts_for_its_checks() {
        let mut uses = ModuleUses::default();
        uses.add("small.wasm", 8 * MIB, false);
        uses.add("big.wasm", 32 * MIB, false);
        uses.add("big.wasm", 16 * MIB, false); // another expression, lower
        uses.add("shadow.wasm", 12 * MIB, true);
        let w = WorstCase::of(&uses, 10, &limits());
        let each = |m: u64| m * MIB + INSTANCE_OVERHEAD_BYTES;
        let expected = 10 * each(32) // live: big.wasm
            + 10 * each(12) // shadow
            + 4 * (each(8) + each(32) + each(12)) // idle
            + each(32); // a reload
        assert_eq!(w.bytes, expected);
        assert_eq!(w.terms[0].what, "live checks in flight, on big.wasm");
        assert_eq!(w.terms[1].what, "shadow checks in flight, on shadow.wasm");
        assert!(w.fits(Some(expected + CONTROLLER_RESERVE_BYTES)).is_ok());
        assert!(
            w.fits(Some(expected + CONTROLLER_RESERVE_BYTES - 1))
                .is_err()
        );
    }

    #[test]
    fn no_modules_need_nothing_and_slots_cap_the_count() {
        let w = WorstCase::of(&ModuleUses::default(), 16, &limits());
        assert_eq!(w.bytes, 0);
        assert!(w.fits(Some(CONTROLLER_RESERVE_BYTES)).is_ok());
        let mut uses = ModuleUses::default();
        uses.add("a.wasm", 64 * MIB, false);
        let few = Limits {
            max_instances: 3,
            ..limits()
        };
        assert_eq!(WorstCase::of(&uses, 16, &few).bytes, 3 * 68 * MIB);
    }
}
