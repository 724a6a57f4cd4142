//! Spins forever in `check`: the host's epoch deadline must stop it.

use portwise_guest::{Checker, Input, Verdict};

struct Spin;

impl Checker for Spin {
    fn check(_: Input) -> Verdict {
        let mut n: u64 = 0;
        loop {
            n = std::hint::black_box(n.wrapping_add(1));
        }
    }
}

portwise_guest::export!(Spin);
