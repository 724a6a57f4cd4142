//! How a guest's probe failed: what the live prober, a recording and a
//! replay all speak ([`crate::replay`] records and answers with it, the
//! host hands it to the guest as the WIT's `probe-error`).

use portwise_probe as probe;

/// Why a probe failed, in the terms every WIT version shares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ProbeFailure {
    Timeout,
    Refused,
    Denied(String),
    Io(String),
}

impl From<probe::ProbeError> for ProbeFailure {
    fn from(e: probe::ProbeError) -> Self {
        match e {
            probe::ProbeError::Timeout => ProbeFailure::Timeout,
            probe::ProbeError::Refused => ProbeFailure::Refused,
            // The WIT has no "unreachable" case: the prefix lets a guest tell
            // a failure on the prober's side from one on the pod's.
            probe::ProbeError::Unreachable(why) => ProbeFailure::Io(format!("unreachable: {why}")),
            probe::ProbeError::Io(why) => ProbeFailure::Io(why),
        }
    }
}
