//! `httpGet`: one HTTP/1.1 GET, plain or over TLS, with the request headers
//! the operator or the guest chose.

use std::{
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::{
    Request,
    header::{ACCEPT, CONNECTION, HOST, HeaderName, HeaderValue, USER_AGENT},
};
use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpStream,
};

use crate::{
    MAX_HEADER_BYTES, MAX_HEADERS, MAX_READ_BUFFER, ProbeError, USER_AGENT_VALUE, drive, tls::Tls,
};

/// What to ask: the path, extra headers and, for HTTPS, the TLS setup.
/// Validated when built, so a request that exists can be sent.
#[derive(Clone, Debug)]
pub struct HttpRequest {
    path: String,
    headers: Vec<(HeaderName, HeaderValue)>,
    tls: Option<Tls>,
}

impl HttpRequest {
    /// A plain-HTTP GET of `path` (origin form, e.g. `/healthz?x=1`).
    pub fn get(path: &str) -> Result<HttpRequest, ProbeError> {
        portwise_core::config::validate_path(path).map_err(|e| ProbeError::Io(e.to_string()))?;
        Ok(HttpRequest {
            path: path.to_owned(),
            headers: Vec::new(),
            tls: None,
        })
    }

    /// Adds request headers, in order (a name may repeat). A header named
    /// `Host`, `User-Agent` or `Accept` replaces the probe's own.
    pub fn headers<'h>(
        mut self,
        headers: impl IntoIterator<Item = (&'h str, &'h str)>,
    ) -> Result<HttpRequest, ProbeError> {
        for (name, value) in headers {
            portwise_core::config::validate_header(name, value)
                .map_err(|e| ProbeError::Io(e.to_string()))?;
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|e| ProbeError::Io(format!("header {name:?}: {e}")))?;
            let value = HeaderValue::from_str(value)
                .map_err(|e| ProbeError::Io(format!("header {name}: {e}")))?;
            self.headers.push((name, value));
        }
        Ok(self)
    }

    /// Sends the request over TLS (`scheme: HTTPS`).
    pub fn over(mut self, tls: Tls) -> HttpRequest {
        self.tls = Some(tls);
        self
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    /// `http` or `https`, for reasons and logs.
    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }

    fn build(&self, addr: SocketAddr) -> Result<Request<Empty<Bytes>>, ProbeError> {
        let mut builder = Request::get(self.path.as_str());
        let given = |n: &HeaderName| self.headers.iter().any(|(h, _)| h == n);
        for (name, value) in [
            (HOST, host_header(addr)),
            (USER_AGENT, USER_AGENT_VALUE.to_owned()),
            (ACCEPT, "*/*".to_owned()),
        ] {
            if !given(&name) {
                builder = builder.header(name, value);
            }
        }
        for (name, value) in &self.headers {
            builder = builder.header(name, value);
        }
        builder
            .header(CONNECTION, "close")
            .body(Empty::<Bytes>::new())
            .map_err(|e| ProbeError::Io(format!("invalid request: {e}")))
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

/// Sends `request` to `addr` over HTTP/1.1 (over TLS when the request has
/// it) and returns the status and up to `max_body` bytes of the body. The
/// whole exchange, TLS handshake included, is bounded by `timeout`;
/// redirects are not followed.
///
/// The body is read until its end or until more than `max_body` bytes have
/// arrived (then `truncated` is set and the connection is dropped), so a
/// peer that stalls in the middle of a body shorter than `max_body` makes the
/// probe time out, as kubelet's HTTP probe does.
pub async fn http_get(
    addr: SocketAddr,
    request: &HttpRequest,
    timeout: Duration,
    max_body: usize,
) -> Result<HttpResponse, ProbeError> {
    if timeout.is_zero() {
        return Err(ProbeError::Timeout);
    }
    tokio::time::timeout(timeout, exchange(addr, request, max_body))
        .await
        .unwrap_or(Err(ProbeError::Timeout))
}

/// `Host:` value for an address: `ip:port`, IPv6 in brackets, without a zone
/// index (which is not valid in a Host header).
pub(crate) fn host_header(addr: SocketAddr) -> String {
    match addr.ip() {
        IpAddr::V4(ip) => format!("{ip}:{}", addr.port()),
        IpAddr::V6(ip) => format!("[{ip}]:{}", addr.port()),
    }
}

async fn exchange(
    addr: SocketAddr,
    request: &HttpRequest,
    max_body: usize,
) -> Result<HttpResponse, ProbeError> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| ProbeError::from_io(&e))?;
    // Health checks are tiny request/response pairs; don't wait for Nagle.
    let _ = stream.set_nodelay(true);
    let http = request.build(addr)?;
    match &request.tls {
        None => exchange_on(stream, http, max_body).await,
        Some(tls) => {
            let stream = tls
                .connector()
                .connect(tls.server_name(addr.ip()), stream)
                .await
                .map_err(|e| match ProbeError::from_io(&e) {
                    ProbeError::Io(m) => ProbeError::Io(format!("TLS: {m}")),
                    other => other,
                })?;
            exchange_on(stream, http, max_body).await
        }
    }
}

async fn exchange_on<S>(
    stream: S,
    request: Request<Empty<Bytes>>,
    max_body: usize,
) -> Result<HttpResponse, ProbeError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
        .max_buf_size(MAX_READ_BUFFER)
        .max_header_size(MAX_HEADER_BYTES)
        .max_headers(MAX_HEADERS)
        .handshake::<_, Empty<Bytes>>(TokioIo::new(stream))
        .await
        .map_err(|e| ProbeError::from_hyper(&e))?;

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

    drive(exchange, conn).await
}
