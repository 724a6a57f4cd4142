use std::time::Instant;

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};

use super::*;
use crate::http::host_header;

/// A plain GET of a valid path.
pub(crate) fn get(path: &str) -> HttpRequest {
    HttpRequest::get(path).unwrap()
}

pub(crate) const T: Duration = Duration::from_millis(1500);

/// A one-connection-at-a-time server that reads the request head, records
/// it, then runs `respond` on the socket.
async fn serve<F, Fut>(respond: F) -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<String>)
where
    F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let head = read_head(&mut sock).await;
            let _ = tx.send(head);
            tokio::spawn(respond(sock));
        }
    });
    (addr, rx)
}

pub(crate) async fn read_head<S: tokio::io::AsyncRead + Unpin>(sock: &mut S) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match sock.read(&mut byte).await {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

fn canned(raw: &'static str) -> impl Fn(TcpStream) -> futures::future::BoxFuture<'static, ()> {
    move |mut sock: TcpStream| {
        Box::pin(async move {
            let _ = sock.write_all(raw.as_bytes()).await;
            let _ = sock.shutdown().await;
        })
    }
}

#[tokio::test]
async fn ok_200_with_body_and_request_headers() {
    let (addr, mut heads) = serve(canned("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")).await;
    let r = http_get(addr, &get("/healthz?x=1"), T, 1024).await.unwrap();
    assert_eq!(
        r,
        HttpResponse {
            status: 200,
            body: b"ok".to_vec(),
            truncated: false
        }
    );
    assert!(r.is_success());
    let head = heads.recv().await.unwrap().to_ascii_lowercase();
    assert!(head.starts_with("get /healthz?x=1 http/1.1\r\n"), "{head}");
    assert!(head.contains(&format!("host: {addr}\r\n")), "{head}");
    assert!(head.contains("user-agent: portwise-probe\r\n"), "{head}");
    assert!(head.contains("connection: close\r\n"), "{head}");
}

#[tokio::test]
async fn status_500_is_returned_not_an_error() {
    let (addr, _h) = serve(canned(
        "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\nboom",
    ))
    .await;
    let r = http_get(addr, &get("/"), T, 1024).await.unwrap();
    assert_eq!(r.status, 500);
    assert_eq!(r.body, b"boom");
    assert!(!r.is_success());
}

#[tokio::test]
async fn redirect_is_not_followed() {
    let (addr, mut heads) = serve(canned(
        "HTTP/1.1 301 Moved Permanently\r\nLocation: /elsewhere\r\nContent-Length: 0\r\n\r\n",
    ))
    .await;
    let r = http_get(addr, &get("/old"), T, 1024).await.unwrap();
    assert_eq!(r.status, 301);
    assert!(heads.recv().await.unwrap().starts_with("GET /old "));
    // Exactly one request was made.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(heads.try_recv().is_err());
}

#[tokio::test]
async fn close_delimited_body_without_content_length() {
    let (addr, _h) = serve(canned("HTTP/1.1 200 OK\r\n\r\nuntil-eof")).await;
    let r = http_get(addr, &get("/"), T, 1024).await.unwrap();
    assert_eq!(r.body, b"until-eof");
    assert!(!r.truncated);
}

#[tokio::test]
async fn body_of_exactly_max_body_is_not_truncated() {
    let (addr, _h) = serve(canned("HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nabcd")).await;
    let r = http_get(addr, &get("/"), T, 4).await.unwrap();
    assert_eq!((r.body.as_slice(), r.truncated), (&b"abcd"[..], false));
    let r = http_get(addr, &get("/"), T, 3).await.unwrap();
    assert_eq!((r.body.as_slice(), r.truncated), (&b"abc"[..], true));
    let r = http_get(addr, &get("/"), T, 0).await.unwrap();
    assert_eq!((r.body.len(), r.truncated, r.status), (0, true, 200));
}

#[tokio::test]
async fn refused_when_nothing_listens() {
    // Bind then drop to get a port that is very likely closed.
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    assert_eq!(
        http_get(addr, &get("/"), T, 1024).await,
        Err(ProbeError::Refused)
    );
    assert_eq!(tcp_dial(addr, T).await, Err(ProbeError::Refused));
}

#[tokio::test]
async fn tcp_dial_succeeds_against_a_listener() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    assert_eq!(tcp_dial(addr, T).await, Ok(()));
}

#[tokio::test]
async fn accept_and_hang_times_out() {
    let (addr, _h) = serve(|sock: TcpStream| async move {
        tokio::time::sleep(Duration::from_secs(60)).await;
        drop(sock);
    })
    .await;
    let start = Instant::now();
    let r = http_get(addr, &get("/"), Duration::from_millis(300), 1024).await;
    let took = start.elapsed();
    assert_eq!(r, Err(ProbeError::Timeout));
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_millis(2000),
        "{took:?}"
    );
}

#[tokio::test]
async fn never_accepting_listener_times_out_http() {
    // A listener that never calls accept still completes handshakes (the
    // kernel backlog does), so the HTTP exchange is what hangs.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let start = Instant::now();
    let r = http_get(addr, &get("/"), Duration::from_millis(200), 1024).await;
    assert_eq!(r, Err(ProbeError::Timeout));
    assert!(start.elapsed() < Duration::from_millis(2000));
    drop(listener);
}

#[tokio::test]
async fn endless_headers_fail_fast_with_bounded_buffer() {
    let (addr, _h) = serve(|mut sock: TcpStream| async move {
        let _ = sock.write_all(b"HTTP/1.1 200 OK\r\n").await;
        let line = b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";
        for _ in 0..1_000_000 {
            if sock.write_all(line).await.is_err() {
                return;
            }
        }
    })
    .await;
    let start = Instant::now();
    let r = http_get(addr, &get("/"), T, 1024).await;
    assert!(
        matches!(r, Err(ProbeError::Io(ref m)) if m.contains("too large")),
        "{r:?}"
    );
    assert!(start.elapsed() < T);
}

#[tokio::test]
async fn slow_endless_headers_time_out() {
    let (addr, _h) = serve(|mut sock: TcpStream| async move {
        let _ = sock.write_all(b"HTTP/1.1 200 OK\r\n").await;
        loop {
            if sock.write_all(b"X-Slow: 1\r\n").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let r = http_get(addr, &get("/"), Duration::from_millis(300), 1024).await;
    assert_eq!(r, Err(ProbeError::Timeout));
}

#[tokio::test]
async fn huge_body_is_truncated_without_reading_it_all() {
    // Claims 1 GB and streams until the client goes away; counts bytes sent.
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let sent2 = sent.clone();
    let (addr, _h) = serve(move |mut sock: TcpStream| {
        let sent = sent2.clone();
        async move {
            let _ = sock
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1073741824\r\n\r\n")
                .await;
            let chunk = vec![b'x'; 64 * 1024];
            for _ in 0..(1 << 14) {
                if sock.write_all(&chunk).await.is_err() {
                    return;
                }
                sent.fetch_add(chunk.len(), std::sync::atomic::Ordering::Relaxed);
            }
        }
    })
    .await;
    let start = Instant::now();
    let r = http_get(addr, &get("/"), T, 1000).await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), 1000);
    assert!(r.truncated);
    assert!(r.body.iter().all(|b| *b == b'x'));
    assert!(start.elapsed() < T);
    // The server got stuck on a full socket buffer soon after we stopped.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let total = sent.load(std::sync::atomic::Ordering::Relaxed);
    assert!(total < 64 << 20, "server pushed {total} bytes");
}

#[tokio::test]
async fn huge_chunked_body_is_truncated() {
    let (addr, _h) = serve(|mut sock: TcpStream| async move {
        let _ = sock
            .write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            .await;
        let chunk = format!("{:x}\r\n{}\r\n", 4096, "y".repeat(4096));
        loop {
            if sock.write_all(chunk.as_bytes()).await.is_err() {
                return;
            }
        }
    })
    .await;
    let r = http_get(addr, &get("/"), T, MAX_BODY_BYTES).await.unwrap();
    assert_eq!(r.body.len(), MAX_BODY_BYTES);
    assert!(r.truncated);
}

#[tokio::test]
async fn reset_mid_response_is_an_io_error() {
    let (addr, _h) = serve(|mut sock: TcpStream| async move {
        let _ = sock
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\npartial")
            .await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        // SO_LINGER 0: close sends RST instead of FIN (and does not
        // block, the reason tokio deprecates set_linger).
        #[allow(deprecated)]
        let _ = sock.set_linger(Some(Duration::ZERO));
        drop(sock);
    })
    .await;
    let start = Instant::now();
    let r = http_get(addr, &get("/"), T, 1 << 20).await;
    assert!(matches!(r, Err(ProbeError::Io(_))), "{r:?}");
    assert!(start.elapsed() < T);
}

#[tokio::test]
async fn eof_mid_body_is_an_io_error() {
    let (addr, _h) = serve(canned(
        "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort",
    ))
    .await;
    let r = http_get(addr, &get("/"), T, 1024).await;
    assert!(matches!(r, Err(ProbeError::Io(_))), "{r:?}");
}

#[tokio::test]
async fn garbage_response_is_an_io_error() {
    let (addr, _h) = serve(canned("SSH-2.0-OpenSSH_9.2\r\n")).await;
    let r = http_get(addr, &get("/"), T, 1024).await;
    assert!(matches!(r, Err(ProbeError::Io(_))), "{r:?}");
}

#[tokio::test]
async fn invalid_paths_are_rejected_before_connecting() {
    use portwise_core::config::validate_path;
    for bad in [
        "healthz",
        "",
        "//evil/x",
        "/a b",
        "/x#frag",
        "http://other/",
    ] {
        assert!(validate_path(bad).is_err(), "{bad}");
        assert!(
            matches!(HttpRequest::get(bad), Err(ProbeError::Io(_))),
            "{bad}"
        );
    }
    for good in ["/", "/healthz", "/ready?verbose=1&x=%20"] {
        assert_eq!(validate_path(good), Ok(()), "{good}");
    }
}

#[test]
fn host_header_brackets_ipv6_and_drops_zone() {
    assert_eq!(host_header("10.0.0.1:80".parse().unwrap()), "10.0.0.1:80");
    assert_eq!(
        host_header("[fd00::1]:8080".parse().unwrap()),
        "[fd00::1]:8080"
    );
    let scoped = SocketAddr::V6(std::net::SocketAddrV6::new(
        "fe80::1".parse().unwrap(),
        80,
        0,
        3,
    ));
    assert_eq!(host_header(scoped), "[fe80::1]:80");
}

#[test]
fn io_errors_are_classified() {
    use io::ErrorKind as K;
    assert_eq!(
        ProbeError::from_io(&io::Error::from(K::ConnectionRefused)),
        ProbeError::Refused
    );
    assert_eq!(
        ProbeError::from_io(&io::Error::from(K::TimedOut)),
        ProbeError::Timeout
    );
    for k in [
        K::NetworkUnreachable,
        K::HostUnreachable,
        K::AddrNotAvailable,
        K::NetworkDown,
    ] {
        let e = ProbeError::from_io(&io::Error::from(k));
        assert!(e.is_inconclusive(), "{k:?} -> {e:?}");
    }
    #[cfg(target_os = "linux")]
    for errno in [24, 23, 105, 12, 101, 113] {
        let e = ProbeError::from_io(&io::Error::from_raw_os_error(errno));
        assert!(e.is_inconclusive(), "errno {errno} -> {e:?}");
    }
    for k in [K::ConnectionReset, K::UnexpectedEof, K::BrokenPipe] {
        assert!(matches!(
            ProbeError::from_io(&io::Error::from(k)),
            ProbeError::Io(_)
        ));
    }
}

#[tokio::test]
async fn zero_timeout_is_an_immediate_timeout() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    assert_eq!(
        http_get(addr, &get("/"), Duration::ZERO, 0).await,
        Err(ProbeError::Timeout)
    );
    assert_eq!(
        tcp_dial(addr, Duration::ZERO).await,
        Err(ProbeError::Timeout)
    );
}
