//! The checkers that answer from the objects alone, without I/O: the pod
//! facts of [`portwise_core::membership::facts`] and the constants.

use portwise_core::{
    config::KeySource,
    membership::{Decision, Subject, Verdict, facts},
};

use crate::{BoxFuture, Checker};

/// `podReady`: the pod's `Ready` condition is `True`.
#[derive(Debug, Default)]
pub struct PodReady;

impl Checker for PodReady {
    fn check<'a>(&'a self, subject: &'a Subject) -> BoxFuture<'a, Verdict> {
        Box::pin(std::future::ready(facts::pod_ready(subject)))
    }

    fn probes(&self) -> bool {
        false
    }
}

/// `notTerminating`: the pod has no deletionTimestamp.
#[derive(Debug, Default)]
pub struct NotTerminating;

impl Checker for NotTerminating {
    fn check<'a>(&'a self, subject: &'a Subject) -> BoxFuture<'a, Verdict> {
        Box::pin(std::future::ready(facts::not_terminating(subject)))
    }

    fn probes(&self) -> bool {
        false
    }
}

/// `include`, `exclude`, `abstain`.
#[derive(Debug)]
pub struct Constant(pub Decision);

impl Checker for Constant {
    fn check<'a>(&'a self, _: &'a Subject) -> BoxFuture<'a, Verdict> {
        Box::pin(std::future::ready(Verdict {
            decision: self.0,
            reason: None,
        }))
    }

    fn probes(&self) -> bool {
        false
    }
}

/// `portNames(key)`: the pod's label/annotation `key` lists the Service
/// port's name (see [`facts::port_names`]).
#[derive(Debug)]
pub struct PortNames(pub KeySource);

impl Checker for PortNames {
    fn check<'a>(&'a self, subject: &'a Subject) -> BoxFuture<'a, Verdict> {
        Box::pin(std::future::ready(facts::port_names(&self.0, subject)))
    }

    fn probes(&self) -> bool {
        false
    }
}
