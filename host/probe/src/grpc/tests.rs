use std::net::SocketAddr;

use tokio::net::TcpListener;
use tonic_health::ServingStatus as Reference;

use super::*;

const T: Duration = Duration::from_millis(1500);

/// tonic-health's server, the reference implementation, with `db` not
/// serving and the server as a whole (`""`) serving.
async fn reference_server() -> SocketAddr {
    let (reporter, service) = tonic_health::server::health_reporter();
    reporter.set_service_status("", Reference::Serving).await;
    reporter
        .set_service_status("db", Reference::NotServing)
        .await;
    reporter
        .set_service_status("cache", Reference::Serving)
        .await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        // Keep the reporter alive with the server.
        let _reporter = reporter;
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            )
            .await
            .unwrap();
    });
    addr
}

#[tokio::test]
async fn the_reference_server_s_statuses_come_through() {
    let addr = reference_server().await;
    let status = |s: ServingStatus| Ok(GrpcHealth::Status(s));
    assert_eq!(
        grpc_health(addr, "", T).await,
        status(ServingStatus::Serving)
    );
    assert_eq!(
        grpc_health(addr, "cache", T).await,
        status(ServingStatus::Serving)
    );
    assert_eq!(
        grpc_health(addr, "db", T).await,
        status(ServingStatus::NotServing)
    );
    // An unknown service is a NOT_FOUND call status, not a serving status.
    match grpc_health(addr, "nope", T).await {
        Ok(GrpcHealth::Failed { code: 5, .. }) => {}
        other => panic!("unknown service: {other:?}"),
    }
}

#[tokio::test]
async fn a_server_without_a_health_service_is_unimplemented() {
    // tonic's router answers UNIMPLEMENTED for a service it does not host.
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Host the health service under another name by routing nothing to it:
    // an empty router still answers gRPC, with UNIMPLEMENTED.
    drop(health);
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_optional_service::<tonic_health::pb::health_server::HealthServer<
                tonic_health::server::HealthService,
            >>(None)
            .serve_with_incoming(
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            )
            .await
            .unwrap();
    });
    let answer = grpc_health(addr, "", T).await.unwrap();
    assert!(
        matches!(answer, GrpcHealth::Failed { code: 12, .. }),
        "{answer:?}"
    );
    assert_eq!(
        answer.to_string(),
        "the server has no grpc.health.v1 service"
    );
}

#[tokio::test]
async fn a_plain_http_server_is_not_a_grpc_server() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        let (mut sock, _) = listener.accept().await.unwrap();
        let _ = sock
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            .await;
    });
    assert!(matches!(
        grpc_health(addr, "", T).await,
        Err(ProbeError::Io(_))
    ));
}

#[tokio::test]
async fn refused_and_zero_timeout() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    assert_eq!(grpc_health(addr, "", T).await, Err(ProbeError::Refused));
    assert_eq!(
        grpc_health(addr, "", Duration::ZERO).await,
        Err(ProbeError::Timeout)
    );
}

#[tokio::test]
async fn a_server_that_never_answers_times_out() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (_sock, _) = listener.accept().await.unwrap();
        std::future::pending::<()>().await;
    });
    assert_eq!(
        grpc_health(addr, "", Duration::from_millis(200)).await,
        Err(ProbeError::Timeout)
    );
}

#[test]
fn the_request_is_the_protobuf_encoding() {
    assert_eq!(encode_request(""), b"");
    assert_eq!(encode_request("db"), b"\x0a\x02db");
    let long = "s".repeat(200);
    let encoded = encode_request(&long);
    assert_eq!(&encoded[..3], b"\x0a\xc8\x01");
    assert_eq!(&frame(b"ab")[..], b"\x00\x00\x00\x00\x02ab");
}

#[test]
fn responses_decode_and_malformed_ones_are_errors() {
    assert_eq!(
        decode_response(b"\0\0\0\0\x02\x08\x01"),
        Ok(ServingStatus::Serving)
    );
    assert_eq!(
        decode_response(b"\0\0\0\0\x02\x08\x02"),
        Ok(ServingStatus::NotServing)
    );
    // proto3 leaves the default out: an empty message is UNKNOWN.
    assert_eq!(decode_response(b"\0\0\0\0\0"), Ok(ServingStatus::Unknown));
    // Unknown fields (field 2 string, field 3 fixed32) are skipped.
    assert_eq!(
        decode_response(b"\0\0\0\0\x0b\x12\x02hi\x1d\0\0\0\0\x08\x03"),
        Ok(ServingStatus::ServiceUnknown)
    );
    assert_eq!(
        decode_response(b"\0\0\0\0\x02\x08\x09"),
        Ok(ServingStatus::Other(9))
    );
    for bad in [
        &b""[..],
        b"\0\0\0",
        b"\x01\0\0\0\x02\x08\x01",
        b"\0\0\0\0\x05\x08\x01",
        b"\0\0\0\0\x02\x08\x01extra",
        b"\0\0\0\0\x01\x08",
        b"\0\0\0\0\x02\x0f\x01",
    ] {
        assert!(decode_response(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn grpc_messages_are_percent_decoded() {
    assert_eq!(percent_decode(b"no%20such%20service"), "no such service");
    assert_eq!(percent_decode(b"100%"), "100%");
    assert_eq!(percent_decode(b"%zz"), "%zz");
}
