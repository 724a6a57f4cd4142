//! `grpc`: the grpc.health.v1 `Check` call, as the kubelet's gRPC probe
//! makes it (plaintext HTTP/2, one unary call).
//!
//! The protocol is two one-field messages, so they are framed here over
//! hyper's HTTP/2 client: `HealthCheckRequest { string service = 1; }` and
//! `HealthCheckResponse { ServingStatus status = 1; }`, each behind gRPC's
//! five-byte length prefix. tonic would bring tower, prost and a code
//! generator into the controller for the same call; the probe's tests run
//! against tonic-health's server instead, the reference the framing must
//! agree with.

use std::{fmt, net::SocketAddr, time::Duration};

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::{
    HeaderMap, Request, StatusCode,
    header::{CONTENT_TYPE, TE, USER_AGENT},
};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;

use crate::{MAX_HEADER_BYTES, ProbeError, USER_AGENT_VALUE, http::host_header};

/// The largest response body read: a health answer is 7 bytes; anything
/// past this is not a health server.
const MAX_RESPONSE_BYTES: usize = 4 * 1024;

/// How the call ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GrpcHealth {
    /// The server answered with a status.
    Status(ServingStatus),
    /// The call ended with a gRPC status other than OK: NOT_FOUND (5) when
    /// the server does not know the service, UNIMPLEMENTED (12) when it has
    /// no health service at all.
    Failed { code: u32, message: String },
}

/// `grpc.health.v1.HealthCheckResponse.ServingStatus`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServingStatus {
    Unknown,
    Serving,
    NotServing,
    /// Only `Watch` sends it, but a server may answer `Check` with it too.
    ServiceUnknown,
    /// A value newer than this client.
    Other(u64),
}

impl ServingStatus {
    fn from_wire(v: u64) -> ServingStatus {
        match v {
            0 => ServingStatus::Unknown,
            1 => ServingStatus::Serving,
            2 => ServingStatus::NotServing,
            3 => ServingStatus::ServiceUnknown,
            n => ServingStatus::Other(n),
        }
    }
}

impl fmt::Display for ServingStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServingStatus::Unknown => f.write_str("UNKNOWN"),
            ServingStatus::Serving => f.write_str("SERVING"),
            ServingStatus::NotServing => f.write_str("NOT_SERVING"),
            ServingStatus::ServiceUnknown => f.write_str("SERVICE_UNKNOWN"),
            ServingStatus::Other(n) => write!(f, "status {n}"),
        }
    }
}

impl fmt::Display for GrpcHealth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GrpcHealth::Status(s) => s.fmt(f),
            GrpcHealth::Failed { code: 5, .. } => {
                f.write_str("the server does not know the service")
            }
            GrpcHealth::Failed { code: 12, .. } => {
                f.write_str("the server has no grpc.health.v1 service")
            }
            GrpcHealth::Failed { code, message } if message.is_empty() => {
                write!(f, "gRPC status {code}")
            }
            GrpcHealth::Failed { code, message } => write!(f, "gRPC status {code}: {message}"),
        }
    }
}

/// Asks `addr` for the health of `service` (`""`: the server as a whole).
/// The whole call is bounded by `timeout`, which the server is told too
/// (`grpc-timeout`).
pub async fn grpc_health(
    addr: SocketAddr,
    service: &str,
    timeout: Duration,
) -> Result<GrpcHealth, ProbeError> {
    if timeout.is_zero() {
        return Err(ProbeError::Timeout);
    }
    tokio::time::timeout(timeout, check(addr, service, timeout))
        .await
        .unwrap_or(Err(ProbeError::Timeout))
}

async fn check(
    addr: SocketAddr,
    service: &str,
    timeout: Duration,
) -> Result<GrpcHealth, ProbeError> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| ProbeError::from_io(&e))?;
    let _ = stream.set_nodelay(true);
    let (mut sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .max_header_list_size(MAX_HEADER_BYTES as u32)
        // What the peer may send before the probe reads: a little more than
        // the largest answer it accepts.
        .initial_stream_window_size((2 * MAX_RESPONSE_BYTES) as u32)
        .initial_connection_window_size((2 * MAX_RESPONSE_BYTES) as u32)
        .handshake::<_, Full<Bytes>>(TokioIo::new(stream))
        .await
        .map_err(|e| ProbeError::from_hyper(&e))?;
    let request = Request::post(format!(
        "http://{}/grpc.health.v1.Health/Check",
        host_header(addr)
    ))
    .header(CONTENT_TYPE, "application/grpc")
    .header(TE, "trailers")
    .header(USER_AGENT, USER_AGENT_VALUE)
    .header("grpc-timeout", format!("{}m", timeout.as_millis().max(1)))
    .body(Full::new(frame(&encode_request(service))))
    .map_err(|e| ProbeError::Io(format!("invalid request: {e}")))?;

    let exchange = async move {
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| ProbeError::from_hyper(&e))?;
        let (parts, mut body) = response.into_parts();
        if parts.status != StatusCode::OK {
            return Err(ProbeError::Io(format!(
                "HTTP status {}: not a gRPC server",
                parts.status.as_u16()
            )));
        }
        // A trailers-only answer (an error before any message) carries the
        // status in the headers.
        if let Some(failed) = failure(&parts.headers)? {
            return Ok(failed);
        }
        let mut data = BytesMut::new();
        let mut trailers = None;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| ProbeError::from_hyper(&e))?;
            match frame.into_data() {
                Ok(chunk) => {
                    if data.len() + chunk.len() > MAX_RESPONSE_BYTES {
                        return Err(ProbeError::Io(format!(
                            "response over {MAX_RESPONSE_BYTES} bytes: not a health answer"
                        )));
                    }
                    data.extend_from_slice(&chunk);
                }
                Err(frame) => trailers = frame.into_trailers().ok(),
            }
        }
        let trailers =
            trailers.ok_or_else(|| ProbeError::Io("the answer has no gRPC status".into()))?;
        if let Some(failed) = failure(&trailers)? {
            return Ok(failed);
        }
        if !trailers.contains_key("grpc-status") {
            return Err(ProbeError::Io("the answer has no gRPC status".into()));
        }
        decode_response(&data).map(GrpcHealth::Status)
    };
    // Driven here, not spawned, as the HTTP probe's connection is; unlike
    // HTTP/1.1, a failed HTTP/2 connection (a peer that answers in
    // HTTP/1.1, a GOAWAY) does not always reach the pending call, so its
    // error ends the probe.
    tokio::pin!(exchange);
    tokio::select! {
        biased;
        result = &mut exchange => result,
        ended = conn => match ended {
            Err(e) => Err(ProbeError::from_hyper(&e)),
            Ok(()) => exchange.await,
        },
    }
}

/// `Some` when `headers` carry a non-OK `grpc-status`.
fn failure(headers: &HeaderMap) -> Result<Option<GrpcHealth>, ProbeError> {
    let Some(code) = headers.get("grpc-status") else {
        return Ok(None);
    };
    let code: u32 = code
        .to_str()
        .ok()
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| ProbeError::Io(format!("invalid grpc-status {code:?}")))?;
    if code == 0 {
        return Ok(None);
    }
    let message = headers
        .get("grpc-message")
        .map(|m| percent_decode(m.as_bytes()))
        .unwrap_or_default();
    Ok(Some(GrpcHealth::Failed { code, message }))
}

/// gRPC's length-prefixed message: uncompressed flag, big-endian length.
fn frame(message: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(5 + message.len());
    out.push(0);
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out.into()
}

/// `HealthCheckRequest { string service = 1; }`; proto3 leaves an empty
/// string out.
fn encode_request(service: &str) -> Vec<u8> {
    let mut out = Vec::new();
    if !service.is_empty() {
        out.push(0x0a); // field 1, length-delimited
        put_varint(&mut out, service.len() as u64);
        out.extend_from_slice(service.as_bytes());
    }
    out
}

/// The status in one framed `HealthCheckResponse`. Unknown fields are
/// skipped, as protobuf readers do; an absent status is proto3's default,
/// UNKNOWN.
fn decode_response(data: &[u8]) -> Result<ServingStatus, ProbeError> {
    let bad = |why: &str| ProbeError::Io(format!("malformed health answer: {why}"));
    if data.len() < 5 {
        return Err(bad("shorter than a message prefix"));
    }
    if data[0] != 0 {
        return Err(bad("compressed, though no compression was offered"));
    }
    let len = u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize;
    let mut message = data[5..]
        .get(..len)
        .ok_or_else(|| bad("shorter than its length prefix"))?;
    if data.len() != 5 + len {
        return Err(bad("more than one message"));
    }
    let mut status = 0;
    while !message.is_empty() {
        let key = take_varint(&mut message).ok_or_else(|| bad("truncated field key"))?;
        let skip = match key & 7 {
            0 => {
                let v = take_varint(&mut message).ok_or_else(|| bad("truncated varint"))?;
                if key >> 3 == 1 {
                    status = v;
                }
                0
            }
            1 => 8,
            2 => take_varint(&mut message).ok_or_else(|| bad("truncated length"))? as usize,
            5 => 4,
            _ => return Err(bad("unknown wire type")),
        };
        message = message.get(skip..).ok_or_else(|| bad("truncated field"))?;
    }
    Ok(ServingStatus::from_wire(status))
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn take_varint(data: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = data.split_first()?;
        *data = rest;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// `grpc-message` is percent-encoded (gRPC over HTTP/2, "Responses").
fn percent_decode(raw: &[u8]) -> String {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (raw[i], raw.get(i + 1).copied(), raw.get(i + 2).copied()) {
            (b'%', Some(h), Some(l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap() * 16 + hex(l).unwrap()) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests;
