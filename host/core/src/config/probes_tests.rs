//! The kubelet-style probe fields: what parses, and the error each bad
//! value gets (with its path, and its line where the parser knows it).

use std::{path::PathBuf, time::Duration};

use super::{
    tests::{assert_err, err, with_membership},
    *,
};

fn expr(m: &str) -> CheckerExpr {
    Config::from_yaml(&with_membership(m))
        .unwrap_or_else(|e| panic!("{m}: {e}"))
        .membership
}

#[test]
fn every_probe_field_parses() {
    let yaml = "
  httpGet:
    path: /admin/ready
    port: admin
    scheme: HTTPS
    httpHeaders:
      - {name: Authorization, value: Bearer abc}
      - {name: Host, value: kafka.local}
    caFile: /etc/portwise/ca.pem
    serverName: kafka-0.kafka.team.svc
    timeout: 2s";
    assert_eq!(
        expr(yaml),
        CheckerExpr::HttpGet(HttpGetSpec {
            path: "/admin/ready".into(),
            port: Some(ProbePort::Name("admin".into())),
            scheme: Scheme::Https,
            http_headers: vec![
                HttpHeader {
                    name: "Authorization".into(),
                    value: "Bearer abc".into()
                },
                HttpHeader {
                    name: "Host".into(),
                    value: "kafka.local".into()
                },
            ],
            ca_file: Some(PathBuf::from("/etc/portwise/ca.pem")),
            server_name: Some("kafka-0.kafka.team.svc".into()),
            timeout: Duration::from_secs(2),
        })
    );
    assert_eq!(
        expr("{tcpDial: {port: 9644}}"),
        CheckerExpr::TcpDial(TcpDialSpec {
            port: Some(ProbePort::Number(9644)),
            timeout: Duration::from_secs(1),
        })
    );
    assert_eq!(
        expr("{grpc: {port: grpc-health, service: db}}"),
        CheckerExpr::Grpc(GrpcSpec {
            port: Some(ProbePort::Name("grpc-health".into())),
            service: "db".into(),
            timeout: Duration::from_secs(1),
        })
    );
    assert_eq!(
        expr("{grpc: {}}"),
        CheckerExpr::Grpc(GrpcSpec {
            port: None,
            service: String::new(),
            timeout: Duration::from_secs(1),
        })
    );
    // The deadline covers a grpc probe's timeout like any other probe's.
    let c = Config::from_yaml(&with_membership("{grpc: {timeout: 7s}}")).unwrap();
    assert_eq!(
        c.membership.worst_case(Duration::ZERO),
        Duration::from_secs(7)
    );
}

#[test]
fn a_bad_port_is_named_with_its_line() {
    for (port, needle) in [
        ("70000", "port 70000 is not in 1-65535"),
        ("0", "port 0 is not in 1-65535"),
        ("-1", "port -1 is not in 1-65535"),
        ("Admin", "not a container port name"),
        ("a-very-long-port-name", "not a container port name"),
        ("'8080'", "not a container port name"),
        ("[1]", "a port number (1-65535) or a container port name"),
    ] {
        let yaml = format!("serviceKey: {{label: g}}\nmembership:\n  tcpDial:\n    port: {port}\n");
        let e = err(&yaml);
        assert_eq!(e.field_path(), Some("membership.tcpDial.port"), "{e}");
        assert!(e.to_string().contains(needle), "{port}: {e}");
        assert!(e.to_string().contains("(line 4"), "{port}: {e}");
    }
}

#[test]
fn scheme_is_spelled_as_in_the_kubelet() {
    assert_err(
        &with_membership("{httpGet: {scheme: https}}"),
        "membership.httpGet.scheme",
        "HTTPS",
    );
}

#[test]
fn hop_by_hop_and_malformed_headers_are_refused() {
    for (header, needle) in [
        ("{name: Connection, value: close}", "hop-by-hop"),
        ("{name: Transfer-Encoding, value: chunked}", "hop-by-hop"),
        ("{name: 'x y', value: z}", "not a valid HTTP field name"),
        ("{name: X-A, value: \"a\\nb\"}", "visible ASCII"),
        ("{name: X-A}", "missing field `value`"),
        ("{name: X-A, value: b, extra: c}", "unknown field"),
    ] {
        let e = err(&with_membership(&format!(
            "{{httpGet: {{httpHeaders: [{header}]}}}}"
        )));
        let shown = e.to_string();
        assert!(
            e.field_path()
                .is_some_and(|p| p.starts_with("membership.httpGet.httpHeaders")),
            "{shown}"
        );
        assert!(shown.contains(needle), "{header}: {shown}");
    }
}

#[test]
fn tls_fields_need_https_and_a_server_name_is_a_dns_name() {
    assert_err(
        &with_membership("{httpGet: {caFile: /ca.pem}}"),
        "membership.httpGet.caFile",
        "HTTPS only",
    );
    assert_err(
        &with_membership("{httpGet: {serverName: a.example}}"),
        "membership.httpGet.serverName",
        "HTTPS only",
    );
    assert_err(
        &with_membership("{httpGet: {scheme: HTTPS, serverName: 'not a name'}}"),
        "membership.httpGet.serverName",
        "RFC 1123 subdomain",
    );
}

#[test]
fn a_grpc_service_name_is_printable_and_short() {
    assert_err(
        &with_membership("{grpc: {service: 'two words'}}"),
        "membership.grpc.service",
        "no spaces",
    );
    assert_err(
        &with_membership(&format!("{{grpc: {{service: {}}}}}", "s".repeat(300))),
        "membership.grpc.service",
        "at most 256",
    );
    assert_err(
        &with_membership("{grpc: {port: 50051, sevice: x}}"),
        "membership.grpc.sevice",
        "unknown field",
    );
}
