//! Fixtures shared by the host's WebAssembly tests and its overhead
//! benchmark (which includes this file by path): where the built guests are,
//! realistic label maps, and the Service and `Subject` around a test pod.
//! Each user needs only some of them.
#![allow(dead_code)]

use std::{collections::BTreeMap, net::IpAddr, path::PathBuf, sync::Arc};

use k8s_openapi::{
    api::core::v1::{Pod, Service, ServicePort, ServiceSpec},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use portwise_core::membership::{Family, ResolvedPort, Subject};

/// Where `guests/build` puts the example guests (`PORTWISE_GUESTS_DIR`,
/// default `~/.cache/portwise/guests`).
pub fn guests_dir() -> PathBuf {
    std::env::var_os("PORTWISE_GUESTS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME is set"))
                .join(".cache/portwise/guests")
        })
}

/// `n` realistic keys and values (`{prefix}.example.com/key-NN`), the size
/// real pods carry, for what crossing into a guest costs.
pub fn kv(prefix: &str, n: usize) -> BTreeMap<String, String> {
    (0..n)
        .map(|i| {
            (
                format!("{prefix}.example.com/key-{i:02}"),
                format!("value-{i:02}-{}", "v".repeat(20)),
            )
        })
        .collect()
}

/// `pod` judged at `address` for port `port_name` (80 → `target`) of a
/// Service named `web` in the pod's namespace, labelled `service_labels`.
pub fn subject_for(
    pod: Pod,
    service_labels: Option<BTreeMap<String, String>>,
    port_name: &str,
    target: u16,
    address: IpAddr,
) -> Subject {
    let service = Service {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: pod.metadata.namespace.clone(),
            uid: Some("4f1d1c9e-0000-4000-8000-000000000002".into()),
            labels: service_labels,
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            ports: Some(vec![ServicePort {
                name: Some(port_name.into()),
                port: 80,
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    };
    Subject {
        service: Arc::new(service),
        pod: Arc::new(pod),
        port: ResolvedPort {
            name: port_name.into(),
            port: 80,
            protocol: "TCP".into(),
            target,
        },
        family: if address.is_ipv4() {
            Family::V4
        } else {
            Family::V6
        },
        address,
    }
}
