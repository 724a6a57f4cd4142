//! Panics in `check` (a trap once the panic aborts). It prints to stderr
//! first, which the host captures into its log.

use portwise_guest::{Checker, Input, Verdict};

struct Boom;

impl Checker for Boom {
    fn check(input: Input) -> Verdict {
        println!("hostile-trap: about to panic for pod {}", input.pod.name());
        panic!("hostile-trap: deliberate panic");
    }
}

portwise_guest::export!(Boom);
