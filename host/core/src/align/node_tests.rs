use k8s_openapi::api::core::v1::{PodSpec, ServiceSpec};

use super::*;

fn pod_on(node: Option<&str>) -> Pod {
    Pod {
        spec: Some(PodSpec {
            node_name: node.map(str::to_string),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn svc(pnra: bool) -> Service {
    Service {
        spec: Some(ServiceSpec {
            publish_not_ready_addresses: Some(pnra),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Found by the oracle (issue 12): the native controller leaves out pods
/// whose Node does not exist, except under publishNotReadyAddresses.
#[test]
fn pods_on_a_missing_node_are_left_out_unless_not_ready_addresses_are_published() {
    let known = |n: &str| n == "node-1";
    assert!(on_known_node(&svc(false), &pod_on(Some("node-1")), &known));
    assert!(!on_known_node(&svc(false), &pod_on(Some("gone")), &known));
    assert!(on_known_node(&svc(true), &pod_on(Some("gone")), &known));
    assert!(on_known_node(&svc(false), &pod_on(None), &known));
}
