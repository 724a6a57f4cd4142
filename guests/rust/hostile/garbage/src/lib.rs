//! Answers with a reason that is not UTF-8, which the component model
//! forbids: the host must treat the answer as invalid and abstain.

use portwise_guest::{Checker, Input, Verdict};

struct Garbage;

impl Checker for Garbage {
    fn check(_: Input) -> Verdict {
        // SAFETY: deliberately violated. The bytes are a valid allocation (so
        // the guest's own post-return cleanup frees them normally) but not
        // UTF-8; nothing in the guest reads them as text.
        let reason = unsafe { String::from_utf8_unchecked(vec![0xff, 0xfe, 0xfd]) };
        Verdict::include().because(reason)
    }
}

portwise_guest::export!(Garbage);
