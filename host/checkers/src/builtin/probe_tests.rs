//! The kubelet-style probe fields on the built-ins: a port by number or
//! container-port name, and the gRPC answers' verdicts.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, ContainerPort, Pod, PodSpec};
use portwise_core::{
    config::ProbePort,
    membership::{Decision, ResolvedPort, Verdict},
};
use portwise_probe::{GrpcHealth, ProbeError, ServingStatus};
use tokio::net::TcpListener;

use super::{
    tests::{local, pod, subject},
    *,
};
use crate::Checker;

/// `pod("a")` whose app container declares `ports` (name, number,
/// protocol) and whose sidecar declares `sidecar`.
fn pod_with_ports(ports: &[(&str, u16, &str)], sidecar: &[(&str, u16)]) -> Pod {
    let declared = |ports: Vec<(&str, u16, &str)>| {
        Some(
            ports
                .into_iter()
                .map(|(name, n, proto)| ContainerPort {
                    name: Some(name.into()),
                    container_port: n.into(),
                    protocol: Some(proto.into()),
                    ..Default::default()
                })
                .collect(),
        )
    };
    let mut p = pod("a", Some("True"), &[]);
    p.spec = Some(PodSpec {
        containers: vec![Container {
            name: "app".into(),
            ports: declared(ports.to_vec()),
            ..Default::default()
        }],
        init_containers: Some(vec![Container {
            name: "proxy".into(),
            restart_policy: Some("Always".into()),
            ports: declared(sidecar.iter().map(|(n, p)| (*n, *p, "TCP")).collect()),
            ..Default::default()
        }]),
        ..Default::default()
    });
    p
}

async fn listening() -> (TcpListener, u16) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    (l, port)
}

/// A port nothing listens on: the Service's target port in these tests, so
/// that only a probe aimed elsewhere can include.
async fn closed_port() -> u16 {
    let (l, port) = listening().await;
    drop(l);
    port
}

fn dial(port: ProbePort) -> TcpDial {
    TcpDial {
        port: Some(port),
        timeout: Duration::from_secs(1),
    }
}

#[tokio::test]
async fn a_named_admin_port_decides_another_port() {
    let (_admin, admin) = listening().await;
    let (_mesh, mesh) = listening().await;
    let target = closed_port().await;
    let p = pod_with_ports(
        &[("admin", admin, "TCP"), ("dns", admin, "UDP")],
        &[("mesh", mesh)],
    );
    let s = subject(p, "kafka", local(), target);
    // The Service's own target port is closed: the default probe excludes.
    let default = TcpDial {
        port: None,
        timeout: Duration::from_secs(1),
    };
    assert_eq!(default.check(&s).await.decision, Decision::Exclude);
    assert_eq!(
        dial(ProbePort::Name("admin".into())).check(&s).await,
        Verdict::include()
    );
    assert_eq!(
        dial(ProbePort::Number(admin)).check(&s).await,
        Verdict::include()
    );
    // A sidecar's port is found as a named targetPort is.
    assert_eq!(
        dial(ProbePort::Name("mesh".into())).check(&s).await,
        Verdict::include()
    );
}

#[tokio::test]
async fn a_port_name_the_pod_lacks_excludes_and_says_so() {
    let (_admin, admin) = listening().await;
    let p = pod_with_ports(&[("admin", admin, "TCP"), ("dns", admin, "UDP")], &[]);
    let s = subject(p, "kafka", local(), admin);
    for missing in ["metrics", "dns"] {
        let v = dial(ProbePort::Name(missing.into())).check(&s).await;
        assert_eq!(v.decision, Decision::Exclude, "{missing}");
        assert_eq!(
            v.reason.as_deref(),
            Some(format!("tcpDial: the pod has no TCP container port named {missing:?}").as_str())
        );
    }
}

#[tokio::test]
async fn a_portless_service_is_probed_where_the_probe_names_a_port() {
    let (_admin, admin) = listening().await;
    let p = pod_with_ports(&[("admin", admin, "TCP")], &[]);
    let mut s = subject(p, "", local(), 0);
    s.port = ResolvedPort::portless();
    let default = TcpDial {
        port: None,
        timeout: Duration::from_secs(1),
    };
    assert_eq!(default.check(&s).await.decision, Decision::Exclude);
    assert_eq!(
        dial(ProbePort::Name("admin".into())).check(&s).await,
        Verdict::include()
    );
}

#[test]
fn grpc_answers_map_as_the_kubelet_s() {
    let v = |r| Grpc::verdict("grpc 10.0.0.1:50051", r);
    assert_eq!(
        v(Ok(GrpcHealth::Status(ServingStatus::Serving))),
        Verdict::include()
    );
    for (answer, reason) in [
        (GrpcHealth::Status(ServingStatus::NotServing), "NOT_SERVING"),
        (GrpcHealth::Status(ServingStatus::Unknown), "UNKNOWN"),
        (
            GrpcHealth::Status(ServingStatus::ServiceUnknown),
            "SERVICE_UNKNOWN",
        ),
        (
            GrpcHealth::Failed {
                code: 5,
                message: "unknown service".into(),
            },
            "the server does not know the service",
        ),
        (
            GrpcHealth::Failed {
                code: 12,
                message: String::new(),
            },
            "the server has no grpc.health.v1 service",
        ),
        (
            GrpcHealth::Failed {
                code: 14,
                message: "draining".into(),
            },
            "gRPC status 14: draining",
        ),
    ] {
        let verdict = v(Ok(answer));
        assert_eq!(verdict.decision, Decision::Exclude);
        assert_eq!(
            verdict.reason.as_deref(),
            Some(format!("grpc 10.0.0.1:50051: {reason}").as_str())
        );
    }
    assert_eq!(v(Err(ProbeError::Refused)).decision, Decision::Exclude);
}
