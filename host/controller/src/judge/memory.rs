//! What the judge remembers of a Service's subjects between judgements,
//! kept in the Service's row of the [`crate::table::ServiceTable`]: apart
//! from the judge, so the table needs nothing else of it.

use std::{collections::HashMap, net::IpAddr, sync::Arc, time::Instant};

use portwise_core::{
    membership::{Family, Verdict},
    policy::Policy,
};

/// A subject as the judge remembers it between reconciles: one pod
/// address under one port.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SubjectKey {
    /// A Service that switches policy is judged afresh: verdicts and
    /// abstain runs of another expression say nothing about this one.
    pub(crate) policy: Policy,
    pub(crate) pod_uid: String,
    pub(crate) port: String,
    pub(crate) family: Family,
    pub(crate) address: IpAddr,
}

/// What a verdict was reached under: it is reused only while all of it
/// holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Basis {
    pub(crate) service_rv: String,
    pub(crate) pod_rv: String,
    pub(crate) target: u16,
    /// The build of a policy object's checker that judged (0 for the
    /// config file's policies, built once).
    pub(crate) revision: u64,
}

/// What the judge remembers of one subject.
#[derive(Clone, Debug)]
pub(crate) struct Remembered {
    pub(crate) verdict: Verdict,
    pub(crate) basis: Basis,
    /// When the verdict was reached.
    pub(crate) at: Instant,
    /// Since when the subject has abstained without a break, if it abstains.
    pub(crate) abstaining_since: Option<Instant>,
}

/// One Service's subjects, as its last judgement left them.
pub(crate) type Memory = HashMap<SubjectKey, Remembered>;

/// Whose verdicts a Service's row keeps ([`crate::table::Row::verdicts`]):
/// the live judge's, or a shadow's (by where the configuration defines it),
/// so a shadow never disturbs the live verdicts, nor one shadow another's.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Id {
    Live,
    Shadow(Arc<str>),
}
