//! Checks that read only the pod object: `podReady`, `notTerminating`,
//! `portNames`. Pure functions of a [`Subject`], so the runnable checkers in
//! `portwise-checkers` wrap them and the controller's decisions can be
//! tested without any checker tree.

use k8s_openapi::api::core::v1::{Pod, Service};

use super::{Subject, Verdict};
use crate::config::KeySource;

/// The Service asks for its pods whatever their readiness
/// (`spec.publishNotReadyAddresses`): the *readiness signals* (`podReady`,
/// `tcpDial`, `httpGet`) then yield and include, as the native controller
/// disregards readiness, so that peers (a StatefulSet's members) can find
/// each other before they are ready. The *membership signals* (`portNames`,
/// `notTerminating`, constants, guests) still decide: they say which pods
/// belong to a port, not whether they are ready.
pub fn readiness_yields(subject: &Subject) -> bool {
    publishes_not_ready(&subject.service)
}

fn publishes_not_ready(service: &Service) -> bool {
    service
        .spec
        .as_ref()
        .and_then(|s| s.publish_not_ready_addresses)
        .unwrap_or(false)
}

/// `podReady`: the pod's `Ready` condition is `True`, or readiness yields
/// ([`readiness_yields`]).
pub fn pod_ready(subject: &Subject) -> Verdict {
    pod_ready_in(&subject.service, &subject.pod)
}

/// [`pod_ready`] for a pod and Service without a port: what a guest's
/// `pod-ready` import answers.
pub fn pod_ready_in(service: &Service, pod: &Pod) -> Verdict {
    if publishes_not_ready(service) {
        return Verdict::include().because("podReady: the Service publishes not-ready addresses");
    }
    let ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
    match ready {
        Some(c) if c.status == "True" => Verdict::include(),
        Some(c) => Verdict::exclude().because(format!("podReady: Ready is {}", c.status)),
        None => Verdict::exclude().because("podReady: no Ready condition"),
    }
}

/// `notTerminating`: the pod has no deletionTimestamp.
pub fn not_terminating(subject: &Subject) -> Verdict {
    if subject.pod.metadata.deletion_timestamp.is_some() {
        Verdict::exclude().because("notTerminating: pod is terminating")
    } else {
        Verdict::include()
    }
}

/// `portNames(key)`: the pod's label/annotation `key` lists the Service
/// port's name, comma-separated, whitespace trimmed. An unnamed port matches
/// nothing (there is no name to list).
pub fn port_names(key: &KeySource, subject: &Subject) -> Verdict {
    let port = subject.port.name.as_str();
    if port.is_empty() {
        return Verdict::exclude().because("portNames: the Service port has no name");
    }
    let Some(list) = key.get(&subject.pod.metadata) else {
        return Verdict::exclude().because(format!("portNames: pod has no {key}"));
    };
    if list.split(',').any(|n| n.trim() == port) {
        Verdict::include()
    } else {
        Verdict::exclude().because(format!(
            "portNames: {key} = {list:?} does not list {port:?}"
        ))
    }
}
