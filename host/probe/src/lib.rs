//! portwise-probe: one HTTP GET and one TCP dial, shared by the built-in
//! checkers (`tcpDial`, `httpGet`) and by WebAssembly guests (the `probes`
//! imports of `wit/membership.wit`).
//!
//! A crate of its own because it is the one place portwise opens sockets to
//! pods: the core stays pure, and the checkers and the wasm host both call
//! these functions rather than owning network code. It may not depend on a
//! Kubernetes client or wasmtime.
//!
//! Probes point at pods, and pods misbehave: they accept and never answer,
//! send headers forever, stream a gigabyte, reset half-way. A probe is only
//! useful to the controller if it ends on time whatever the peer does, so:
//!
//! - the **whole** probe (connect, request, headers, body) runs under one
//!   deadline;
//! - memory is bounded: hyper's read buffer and header size are capped and the
//!   body is read frame by frame only until `max_body` bytes are held;
//! - nothing outlives the call: the HTTP connection is driven inside the
//!   probe's own future (no spawned task), so when the probe returns or its
//!   deadline fires, the socket is dropped;
//! - redirects are never followed (a `3xx` is just a status).
//!
//! Errors are classified so callers can tell "the pod does not serve"
//! ([`ProbeError::Timeout`], [`ProbeError::Refused`], [`ProbeError::Io`]) from
//! "this probe says nothing about the pod" ([`ProbeError::Unreachable`]: the
//! prober has no route or no sockets).

use std::{
    io,
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::{
    Request,
    header::{ACCEPT, CONNECTION, HOST, USER_AGENT},
};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// The `User-Agent` every probe sends.
pub const USER_AGENT_VALUE: &str = "portwise-probe";

/// The body size built-in checkers and guests get at most (matches
/// `max-body-bytes` in the WIT contract).
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// Upper bound on the status line plus response headers. Generous for any
/// health endpoint, small enough that a peer sending headers forever fails
/// fast with a bounded buffer.
const MAX_HEADER_BYTES: usize = 16 * 1024;

/// hyper's connection read buffer cap (its minimum is 8 KiB). Also bounds the
/// size of one body frame, hence the memory held beyond `max_body`.
const MAX_READ_BUFFER: usize = 16 * 1024;

/// Header count cap (hyper's default is 100; health endpoints need few).
const MAX_HEADERS: usize = 64;

/// Why a probe failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    /// The deadline elapsed before the probe finished (connect, headers or
    /// body). The pod did not answer in time.
    #[error("timed out")]
    Timeout,
    /// The connection was refused: nothing listens on the port.
    #[error("connection refused")]
    Refused,
    /// The prober could not even try: no route to the address, network or
    /// host unreachable, no local ports or file descriptors left. Such a
    /// failure is about the controller's side of the network, so it tells
    /// nothing about the pod (membership turns it into `abstain`).
    #[error("unreachable: {0}")]
    Unreachable(String),
    /// Any other I/O or protocol failure: reset, malformed or oversized
    /// response, invalid request path.
    #[error("{0}")]
    Io(String),
}

impl ProbeError {
    /// Classifies an I/O error from connecting or talking to the peer.
    ///
    /// Connection refused is [`ProbeError::Refused`]; errors that arise on the
    /// prober's side or on its path to the pod (no route, network/host
    /// unreachable, address not available, out of file descriptors or buffer
    /// space) are [`ProbeError::Unreachable`]; a timed-out socket is
    /// [`ProbeError::Timeout`]; the rest is [`ProbeError::Io`].
    pub fn from_io(err: &io::Error) -> Self {
        match err.kind() {
            io::ErrorKind::ConnectionRefused => return ProbeError::Refused,
            io::ErrorKind::TimedOut => return ProbeError::Timeout,
            io::ErrorKind::NetworkUnreachable
            | io::ErrorKind::HostUnreachable
            | io::ErrorKind::AddrNotAvailable
            | io::ErrorKind::NetworkDown => return ProbeError::Unreachable(err.to_string()),
            _ => {}
        }
        match err.raw_os_error() {
            Some(code) if is_local_resource_errno(code) => ProbeError::Unreachable(err.to_string()),
            _ => ProbeError::Io(err.to_string()),
        }
    }

    /// True when the failure says nothing about the pod, only about the
    /// prober (see [`ProbeError::Unreachable`]).
    pub fn is_inconclusive(&self) -> bool {
        matches!(self, ProbeError::Unreachable(_))
    }

    /// Classifies a hyper error: looks for an underlying I/O error first so a
    /// reset is reported as such, not as a generic protocol failure.
    fn from_hyper(err: &hyper::Error) -> Self {
        if err.is_timeout() {
            return ProbeError::Timeout;
        }
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
        while let Some(e) = source {
            if let Some(io_err) = e.downcast_ref::<io::Error>() {
                return match Self::from_io(io_err) {
                    ProbeError::Io(_) => ProbeError::Io(format!("{err}: {io_err}")),
                    other => other,
                };
            }
            source = e.source();
        }
        ProbeError::Io(err.to_string())
    }
}

/// Local resource exhaustion: EMFILE, ENFILE, ENOBUFS, ENOMEM (Linux numbers;
/// the names have no `io::ErrorKind`).
fn is_local_resource_errno(code: i32) -> bool {
    #[cfg(target_os = "linux")]
    {
        matches!(code, 24 | 23 | 105 | 12)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = code;
        false
    }
}

/// What an HTTP GET got back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpResponse {
    pub status: u16,
    /// At most `max_body` bytes of the body.
    pub body: Vec<u8>,
    /// True when the body was longer than `max_body` (the rest was not read).
    pub truncated: bool,
}

impl HttpResponse {
    /// `2xx`.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// Opens a TCP connection to `addr` and closes it again. Succeeds when the
/// three-way handshake completes within `timeout`.
pub async fn tcp_dial(addr: SocketAddr, timeout: Duration) -> Result<(), ProbeError> {
    // tokio polls the future once before looking at the deadline, and a
    // loopback connect can complete on that first poll.
    if timeout.is_zero() {
        return Err(ProbeError::Timeout);
    }
    match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
        Err(_) => Err(ProbeError::Timeout),
        Ok(Err(e)) => Err(ProbeError::from_io(&e)),
        Ok(Ok(stream)) => {
            drop(stream);
            Ok(())
        }
    }
}

/// Sends `GET http://<addr><path>` over HTTP/1.1 and returns the status and
/// up to `max_body` bytes of the body. The whole exchange is bounded by
/// `timeout`; redirects are not followed.
///
/// The body is read until its end or until more than `max_body` bytes have
/// arrived (then `truncated` is set and the connection is dropped), so a
/// peer that stalls in the middle of a body shorter than `max_body` makes the
/// probe time out, as kubelet's HTTP probe does.
pub async fn http_get(
    addr: SocketAddr,
    path: &str,
    timeout: Duration,
    max_body: usize,
) -> Result<HttpResponse, ProbeError> {
    portwise_core::config::validate_path(path).map_err(ProbeError::Io)?;
    if timeout.is_zero() {
        return Err(ProbeError::Timeout);
    }
    tokio::time::timeout(timeout, http_get_unbounded(addr, path, max_body))
        .await
        .unwrap_or(Err(ProbeError::Timeout))
}

/// `Host:` value for an address: `ip:port`, IPv6 in brackets, without a zone
/// index (which is not valid in a Host header).
fn host_header(addr: SocketAddr) -> String {
    match addr.ip() {
        IpAddr::V4(ip) => format!("{ip}:{}", addr.port()),
        IpAddr::V6(ip) => format!("[{ip}]:{}", addr.port()),
    }
}

async fn http_get_unbounded(
    addr: SocketAddr,
    path: &str,
    max_body: usize,
) -> Result<HttpResponse, ProbeError> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| ProbeError::from_io(&e))?;
    // Health checks are tiny request/response pairs; don't wait for Nagle.
    let _ = stream.set_nodelay(true);

    let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
        .max_buf_size(MAX_READ_BUFFER)
        .max_header_size(MAX_HEADER_BYTES)
        .max_headers(MAX_HEADERS)
        .handshake::<_, Empty<Bytes>>(TokioIo::new(stream))
        .await
        .map_err(|e| ProbeError::from_hyper(&e))?;

    let request = Request::get(path)
        .header(HOST, host_header(addr))
        .header(USER_AGENT, USER_AGENT_VALUE)
        .header(ACCEPT, "*/*")
        .header(CONNECTION, "close")
        .body(Empty::<Bytes>::new())
        .map_err(|e| ProbeError::Io(format!("invalid request: {e}")))?;

    let exchange = async move {
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| ProbeError::from_hyper(&e))?;
        let status = response.status().as_u16();
        let mut body = response.into_body();
        let mut buf = Vec::new();
        let mut truncated = false;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| ProbeError::from_hyper(&e))?;
            let Ok(data) = frame.into_data() else {
                continue; // trailers
            };
            let room = max_body - buf.len();
            if data.len() > room {
                buf.extend_from_slice(&data[..room]);
                truncated = true;
                break;
            }
            buf.extend_from_slice(&data);
        }
        Ok(HttpResponse {
            status,
            body: buf,
            truncated,
        })
    };

    // Drive the connection in this future rather than a spawned task, so
    // dropping the probe (deadline, truncation) closes the socket at once.
    tokio::pin!(exchange);
    tokio::pin!(conn);
    let mut conn_done = false;
    loop {
        tokio::select! {
            result = &mut exchange => return result,
            // Once the connection future has finished, any data it read is
            // already queued for the body, and any error reaches `exchange`
            // through hyper's dispatch channel; keep polling `exchange`.
            _ = &mut conn, if !conn_done => conn_done = true,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use tokio::{
        io::{AsyncReadExt, AsyncWriteExt},
        net::TcpListener,
    };

    use super::*;

    const T: Duration = Duration::from_millis(1500);

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

    async fn read_head(sock: &mut TcpStream) -> String {
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
        let (addr, mut heads) =
            serve(canned("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")).await;
        let r = http_get(addr, "/healthz?x=1", T, 1024).await.unwrap();
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
        let r = http_get(addr, "/", T, 1024).await.unwrap();
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
        let r = http_get(addr, "/old", T, 1024).await.unwrap();
        assert_eq!(r.status, 301);
        assert!(heads.recv().await.unwrap().starts_with("GET /old "));
        // Exactly one request was made.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(heads.try_recv().is_err());
    }

    #[tokio::test]
    async fn close_delimited_body_without_content_length() {
        let (addr, _h) = serve(canned("HTTP/1.1 200 OK\r\n\r\nuntil-eof")).await;
        let r = http_get(addr, "/", T, 1024).await.unwrap();
        assert_eq!(r.body, b"until-eof");
        assert!(!r.truncated);
    }

    #[tokio::test]
    async fn body_of_exactly_max_body_is_not_truncated() {
        let (addr, _h) = serve(canned("HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nabcd")).await;
        let r = http_get(addr, "/", T, 4).await.unwrap();
        assert_eq!((r.body.as_slice(), r.truncated), (&b"abcd"[..], false));
        let r = http_get(addr, "/", T, 3).await.unwrap();
        assert_eq!((r.body.as_slice(), r.truncated), (&b"abc"[..], true));
        let r = http_get(addr, "/", T, 0).await.unwrap();
        assert_eq!((r.body.len(), r.truncated, r.status), (0, true, 200));
    }

    #[tokio::test]
    async fn refused_when_nothing_listens() {
        // Bind then drop to get a port that is very likely closed.
        let addr = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        assert_eq!(http_get(addr, "/", T, 1024).await, Err(ProbeError::Refused));
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
        let r = http_get(addr, "/", Duration::from_millis(300), 1024).await;
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
        let r = http_get(addr, "/", Duration::from_millis(200), 1024).await;
        assert_eq!(r, Err(ProbeError::Timeout));
        assert!(start.elapsed() < Duration::from_millis(2000));
        drop(listener);
    }

    #[tokio::test]
    async fn endless_headers_fail_fast_with_bounded_buffer() {
        let (addr, _h) = serve(|mut sock: TcpStream| async move {
            let _ = sock.write_all(b"HTTP/1.1 200 OK\r\n").await;
            let line =
                b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";
            for _ in 0..1_000_000 {
                if sock.write_all(line).await.is_err() {
                    return;
                }
            }
        })
        .await;
        let start = Instant::now();
        let r = http_get(addr, "/", T, 1024).await;
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
        let r = http_get(addr, "/", Duration::from_millis(300), 1024).await;
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
        let r = http_get(addr, "/", T, 1000).await.unwrap();
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
        let r = http_get(addr, "/", T, MAX_BODY_BYTES).await.unwrap();
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
        let r = http_get(addr, "/", T, 1 << 20).await;
        assert!(matches!(r, Err(ProbeError::Io(_))), "{r:?}");
        assert!(start.elapsed() < T);
    }

    #[tokio::test]
    async fn eof_mid_body_is_an_io_error() {
        let (addr, _h) = serve(canned(
            "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort",
        ))
        .await;
        let r = http_get(addr, "/", T, 1024).await;
        assert!(matches!(r, Err(ProbeError::Io(_))), "{r:?}");
    }

    #[tokio::test]
    async fn garbage_response_is_an_io_error() {
        let (addr, _h) = serve(canned("SSH-2.0-OpenSSH_9.2\r\n")).await;
        let r = http_get(addr, "/", T, 1024).await;
        assert!(matches!(r, Err(ProbeError::Io(_))), "{r:?}");
    }

    #[tokio::test]
    async fn invalid_paths_are_rejected_before_connecting() {
        use portwise_core::config::validate_path;
        let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
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
                matches!(http_get(addr, bad, T, 0).await, Err(ProbeError::Io(_))),
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
            http_get(addr, "/", Duration::ZERO, 0).await,
            Err(ProbeError::Timeout)
        );
        assert_eq!(
            tcp_dial(addr, Duration::ZERO).await,
            Err(ProbeError::Timeout)
        );
    }
}
