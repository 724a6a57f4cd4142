//! Real sockets standing in for pods' servers.
//!
//! portwise's probes (`httpGet`, `tcpDial`) are judged against these, bound
//! on pod addresses inside the test network namespace. The HTTP responder is
//! a few lines of HTTP/1.1 by hand (over TLS when started so): its
//! behaviour (status, redirect, delay, hang, a required header) changes at
//! runtime, and every request is recorded so tests can count probe
//! observations (e.g. for `stable` thresholds). The gRPC health server is
//! the reference one (`probe_servers`).

use std::{
    io,
    net::{IpAddr, SocketAddr},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU16, AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    task::{JoinHandle, JoinSet},
};

/// How an [`HttpListener`] answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HttpMode {
    /// Answer with this status code.
    Status(u16),
    /// `302 Found` with this `Location`.
    Redirect(String),
    /// Accept, read the request, never answer.
    Hang,
}

/// One request an [`HttpListener`] saw.
#[derive(Clone, Debug)]
pub struct Request {
    pub path: String,
    /// The status answered; 0 when the listener hung.
    pub status: u16,
    pub at: Instant,
}

/// Counts requests being handled at once, across any listeners sharing it.
#[derive(Debug, Default)]
pub struct Concurrency {
    now: AtomicUsize,
    max: AtomicUsize,
}

impl Concurrency {
    pub fn new() -> Arc<Self> {
        Arc::default()
    }
    /// The most requests ever in flight at once.
    pub fn max(&self) -> usize {
        self.max.load(Ordering::SeqCst)
    }
    fn enter(&self) {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(now, Ordering::SeqCst);
    }
    fn leave(&self) {
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
}

#[derive(Debug)]
struct HttpState {
    status: AtomicU16,
    hang: AtomicBool,
    delay_ms: AtomicU64,
    location: Mutex<Option<String>>,
    /// Per-path answers that override the default status.
    routes: Mutex<std::collections::HashMap<String, u16>>,
    body: Mutex<String>,
    /// A header (lowercase name, value) a request must carry, else 401.
    required: Mutex<Option<(String, String)>>,
    requests: Mutex<Vec<Request>>,
    concurrency: Mutex<Option<Arc<Concurrency>>>,
}

/// An HTTP/1.1 server on one pod address.
#[derive(Debug)]
pub struct HttpListener {
    addr: SocketAddr,
    state: Arc<HttpState>,
    task: Option<JoinHandle<()>>,
}

impl HttpListener {
    /// Listens on `addr:port`, answering `200 ok` until told otherwise.
    pub async fn start(addr: impl Into<IpAddr>, port: u16) -> Result<Self> {
        Self::start_with(addr.into(), port, None).await
    }

    /// Like [`HttpListener::start`], but HTTPS with a self-signed
    /// certificate for `addr`, as pods commonly serve their admin ports.
    #[cfg(feature = "probes")]
    pub async fn start_tls(addr: impl Into<IpAddr>, port: u16) -> Result<Self> {
        let addr = addr.into();
        Self::start_with(
            addr,
            port,
            Some(crate::probe_servers::self_signed_acceptor(addr)?),
        )
        .await
    }

    async fn start_with(addr: IpAddr, port: u16, tls: Option<Acceptor>) -> Result<Self> {
        let addr = SocketAddr::new(addr, port);
        let listener = bind(addr).await?;
        let state = Arc::new(HttpState {
            status: AtomicU16::new(200),
            hang: AtomicBool::new(false),
            delay_ms: AtomicU64::new(0),
            location: Mutex::new(None),
            routes: Mutex::new(Default::default()),
            body: Mutex::new("ok\n".into()),
            required: Mutex::new(None),
            requests: Mutex::new(Vec::new()),
            concurrency: Mutex::new(None),
        });
        let st = state.clone();
        let task = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((stream, _)) => { conns.spawn(accept(stream, tls.clone(), st.clone())); }
                        Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                    },
                    Some(_) = conns.join_next(), if !conns.is_empty() => {}
                }
            }
        });
        Ok(Self {
            addr,
            state,
            task: Some(task),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sets how requests are answered from now on.
    pub fn set_mode(&self, mode: HttpMode) {
        match mode {
            HttpMode::Status(code) => {
                *self.state.location.lock().unwrap() = None;
                self.state.status.store(code, Ordering::SeqCst);
                self.state.hang.store(false, Ordering::SeqCst);
            }
            HttpMode::Redirect(loc) => {
                *self.state.location.lock().unwrap() = Some(loc);
                self.state.status.store(302, Ordering::SeqCst);
                self.state.hang.store(false, Ordering::SeqCst);
            }
            HttpMode::Hang => self.state.hang.store(true, Ordering::SeqCst),
        }
    }
    pub fn set_status(&self, code: u16) {
        self.set_mode(HttpMode::Status(code));
    }
    /// Answers requests for exactly `path` with `status`, whatever the mode
    /// (except `Hang`).
    pub fn route(&self, path: &str, status: u16) {
        self.state
            .routes
            .lock()
            .unwrap()
            .insert(path.to_string(), status);
    }
    /// Requests seen for `path`.
    pub fn requests_for(&self, path: &str) -> usize {
        self.state
            .requests
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.path == path)
            .count()
    }
    /// Answers `401` to requests without the header `name: value`.
    pub fn require_header(&self, name: &str, value: &str) {
        *self.state.required.lock().unwrap() = Some((name.to_ascii_lowercase(), value.into()));
    }
    pub fn set_body(&self, body: &str) {
        *self.state.body.lock().unwrap() = body.to_string();
    }
    /// Waits this long before answering each request.
    pub fn set_delay(&self, delay: Duration) {
        self.state
            .delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }
    /// Counts this listener's in-flight requests in `c`.
    pub fn track(&self, c: Arc<Concurrency>) {
        *self.state.concurrency.lock().unwrap() = Some(c);
    }
    /// Every request seen so far.
    pub fn requests(&self) -> Vec<Request> {
        self.state.requests.lock().unwrap().clone()
    }
    pub fn request_count(&self) -> usize {
        self.state.requests.lock().unwrap().len()
    }
    /// Requests seen so far that were answered with `status`.
    pub fn answered(&self, status: u16) -> usize {
        self.state
            .requests
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.status == status)
            .count()
    }
    /// Closes the socket and every open connection: dials are refused from now on.
    pub fn stop(mut self) {
        self.shutdown();
    }
    fn shutdown(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

impl Drop for HttpListener {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(feature = "probes")]
type Acceptor = tokio_rustls::TlsAcceptor;
/// Without the `probes` feature there is no TLS: a type with no values.
#[cfg(not(feature = "probes"))]
#[derive(Clone)]
enum Acceptor {}

/// Serves one connection, after a TLS handshake when the listener has TLS.
async fn accept(stream: TcpStream, tls: Option<Acceptor>, st: Arc<HttpState>) {
    match tls {
        None => serve_http(stream, st).await,
        #[cfg(feature = "probes")]
        Some(acceptor) => {
            if let Ok(stream) = acceptor.accept(stream).await {
                serve_http(stream, st).await
            }
        }
        #[cfg(not(feature = "probes"))]
        Some(never) => match never {},
    }
}

async fn serve_http<S>(mut stream: S, st: Arc<HttpState>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    // Read the request head; probes send no body.
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        if buf.len() > 16 * 1024 {
            return;
        }
    }
    let head = String::from_utf8_lossy(&buf);
    let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
    let tracker = st.concurrency.lock().unwrap().clone();
    if let Some(c) = &tracker {
        c.enter();
    }
    let hang = st.hang.load(Ordering::SeqCst);
    let routed = st.routes.lock().unwrap().get(&path).copied();
    let authorized = st
        .required
        .lock()
        .unwrap()
        .as_ref()
        .is_none_or(|(name, value)| {
            head.lines()
                .filter_map(|l| l.split_once(':'))
                .any(|(n, v)| n.trim().eq_ignore_ascii_case(name) && v.trim() == value)
        });
    let status = match (hang, routed) {
        (true, _) => 0,
        _ if !authorized => 401,
        (false, Some(code)) => code,
        (false, None) => st.status.load(Ordering::SeqCst),
    };
    st.requests.lock().unwrap().push(Request {
        path,
        status,
        at: Instant::now(),
    });
    if hang {
        // Hold the connection open until the peer gives up (the probe is in
        // flight until then) or we are stopped.
        while matches!(stream.read(&mut chunk).await, Ok(n) if n > 0) {}
        if let Some(c) = &tracker {
            c.leave();
        }
        return;
    }
    let delay = st.delay_ms.load(Ordering::SeqCst);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    let body = if authorized {
        st.body.lock().unwrap().clone()
    } else {
        "missing or wrong credentials\n".to_owned()
    };
    let location = if routed.is_some() {
        None
    } else {
        st.location.lock().unwrap().clone()
    };
    let mut resp = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n",
        reason(status),
        body.len()
    );
    if let Some(loc) = location {
        resp.push_str(&format!("Location: {loc}\r\n"));
    }
    resp.push_str("\r\n");
    resp.push_str(&body);
    // Leave before answering: the client may take its next request the
    // moment the answer arrives, and counting this one until after the write
    // would show two requests in flight where the client only ever had one.
    if let Some(c) = &tracker {
        c.leave();
    }
    let _ = stream.write_all(resp.as_bytes()).await;
    let _ = stream.shutdown().await;
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        204 => "No Content",
        301 => "Moved Permanently",
        302 => "Found",
        401 => "Unauthorized",
        404 => "Not Found",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

/// A TCP server on one pod address that accepts and holds connections.
#[derive(Debug)]
pub struct TcpListener {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    task: Option<JoinHandle<()>>,
}

impl TcpListener {
    pub async fn start(addr: impl Into<IpAddr>, port: u16) -> Result<Self> {
        let addr = SocketAddr::new(addr.into(), port);
        let listener = bind(addr).await?;
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        let task = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                tokio::select! {
                    res = listener.accept() => match res {
                        Ok((mut stream, _)) => {
                            count.fetch_add(1, Ordering::SeqCst);
                            conns.spawn(async move {
                                let mut sink = [0u8; 512];
                                while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {}
                            });
                        }
                        Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                    },
                    Some(_) = conns.join_next(), if !conns.is_empty() => {}
                }
            }
        });
        Ok(Self {
            addr,
            accepted,
            task: Some(task),
        })
    }
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
    /// Closes the socket and its connections: dials are refused from now on.
    pub fn stop(mut self) {
        self.shutdown();
    }
    fn shutdown(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

impl Drop for TcpListener {
    fn drop(&mut self) {
        self.shutdown();
    }
}

async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener> {
    match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => Ok(l),
        Err(e) if e.kind() == io::ErrorKind::AddrNotAvailable => Err(e).with_context(|| {
            format!(
                "binding {addr}: the address is not local. Pod ranges are local only inside \
                 the test network namespace (tests/netns)"
            )
        }),
        Err(e) => Err(e).with_context(|| format!("binding {addr}")),
    }
}
