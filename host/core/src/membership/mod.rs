//! Membership: does this pod's address back this Service port?
//!
//! A checker answers [`Decision::Include`], [`Decision::Exclude`] or
//! [`Decision::Abstain`] for one [`Subject`]: a (Service port, address family,
//! pod) triple. Checkers compose (`all`, `any`, `not`, `perPort`, `stable`);
//! the composition rules live in [`algebra`] as pure functions so every
//! truth-table row is unit tested without I/O, and the checks that read only
//! the pod object live in [`facts`]. The runnable checker tree (probes,
//! WebAssembly, async plumbing) is built on these in `portwise-checkers`.

pub mod algebra;
pub mod facts;

use std::{net::IpAddr, sync::Arc};

use k8s_openapi::api::core::v1::{Pod, Service};

/// The three answers a checker can give.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Decision {
    Include,
    Exclude,
    /// "I cannot tell": the controller keeps what it last published.
    Abstain,
}

/// A decision plus a reason for logs and `portwise check`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub decision: Decision,
    pub reason: Option<String>,
}

impl Verdict {
    pub fn include() -> Self {
        Self {
            decision: Decision::Include,
            reason: None,
        }
    }
    pub fn exclude() -> Self {
        Self {
            decision: Decision::Exclude,
            reason: None,
        }
    }
    pub fn abstain() -> Self {
        Self {
            decision: Decision::Abstain,
            reason: None,
        }
    }
    pub fn because(mut self, reason: impl Into<String>) -> Self {
        self.reason = Some(reason.into());
        self
    }
}

/// IPv4 or IPv6, as in `Service.spec.ipFamilies`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    /// The one spelling users see, in metrics, logs, `check` and Events:
    /// Kubernetes' own (`spec.ipFamilies`, a slice's `addressType`).
    pub fn as_str(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// One Service port resolved against one pod.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ResolvedPort {
    /// The Service port's name ("" when unnamed).
    pub name: String,
    /// The Service port number.
    pub port: i32,
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    /// The container port this Service port resolves to on this pod; 0 for
    /// a port-less Service ([`ResolvedPort::portless`]).
    pub target: u16,
}

impl ResolvedPort {
    /// What a headless Service without ports is judged under: no name, no
    /// number, nothing to probe. Readiness, pod facts and guests still
    /// decide; port probes exclude (there is no port to reach).
    pub fn portless() -> Self {
        Self {
            name: String::new(),
            port: 0,
            protocol: "TCP".into(),
            target: 0,
        }
    }

    pub fn is_portless(&self) -> bool {
        self.port == 0 && self.target == 0
    }
}

/// What one check judges.
#[derive(Clone, Debug)]
pub struct Subject {
    pub service: Arc<Service>,
    pub pod: Arc<Pod>,
    pub port: ResolvedPort,
    pub family: Family,
    /// The pod address under judgement, in `family`.
    pub address: IpAddr,
}
