//! The port probes' schema: `tcpDial`, `httpGet` and `grpc`, with the
//! fields users know from the kubelet's probes (`port`, `scheme`,
//! `httpHeaders`, `grpc.service`). Each field checks its own syntax while
//! the file is parsed, so a bad value is reported with its line and column;
//! rules across fields (a CA file needs HTTPS) are in `validate.rs`.

use std::{fmt, path::PathBuf, time::Duration};

use serde::{
    Deserialize, Deserializer,
    de::{self, Visitor},
};

use super::{
    duration::duration_str,
    syntax::{HeaderError, check_port_name, validate_header},
};

/// `tcpDial: {port, timeout}`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TcpDialSpec {
    /// Defaults to the Service port's target port on the pod.
    #[serde(default)]
    pub port: Option<ProbePort>,
    /// Defaults to 1s (kubelet's default probe timeout).
    #[serde(default = "default_probe_timeout", with = "duration_str")]
    pub timeout: Duration,
}

/// `httpGet: {path, port, scheme, httpHeaders, caFile, serverName, timeout}`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpGetSpec {
    /// Absolute path with optional query; defaults to `/`.
    #[serde(default = "default_http_path")]
    pub path: String,
    /// Defaults to the Service port's target port on the pod.
    #[serde(default)]
    pub port: Option<ProbePort>,
    #[serde(default)]
    pub scheme: Scheme,
    /// Sent after portwise's own `Host`, `User-Agent` and `Accept`, each of
    /// which a header of the same name replaces.
    #[serde(default)]
    pub http_headers: Vec<HttpHeader>,
    /// A PEM file of the certificate authorities the pod's certificate must
    /// chain to (HTTPS only). Without it HTTPS is not verified, as the
    /// kubelet does not verify: the probe asks "does it answer", and pods
    /// commonly serve self-signed certificates.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// The name sent for SNI and, with `caFile`, verified in the
    /// certificate; defaults to the pod's address.
    #[serde(default)]
    pub server_name: Option<String>,
    /// Defaults to 1s.
    #[serde(default = "default_probe_timeout", with = "duration_str")]
    pub timeout: Duration,
}

/// `grpc: {port, service, timeout}`: the grpc.health.v1 `Check` call, as the
/// kubelet's gRPC probe makes it (plaintext HTTP/2).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GrpcSpec {
    /// Defaults to the Service port's target port on the pod.
    #[serde(default)]
    pub port: Option<ProbePort>,
    /// The service name to ask about; `""` (the default) asks about the
    /// server as a whole.
    #[serde(default)]
    pub service: String,
    /// Defaults to 1s.
    #[serde(default = "default_probe_timeout", with = "duration_str")]
    pub timeout: Duration,
}

/// What an empty `tcpDial: {}` means.
impl Default for TcpDialSpec {
    fn default() -> Self {
        TcpDialSpec {
            port: None,
            timeout: default_probe_timeout(),
        }
    }
}

/// What an empty `httpGet: {}` means.
impl Default for HttpGetSpec {
    fn default() -> Self {
        HttpGetSpec {
            path: default_http_path(),
            port: None,
            scheme: Scheme::Http,
            http_headers: Vec::new(),
            ca_file: None,
            server_name: None,
            timeout: default_probe_timeout(),
        }
    }
}

fn default_probe_timeout() -> Duration {
    Duration::from_secs(1)
}
fn default_http_path() -> String {
    "/".to_owned()
}

/// `HTTP` or `HTTPS`, spelled as in a kubelet probe.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub enum Scheme {
    #[default]
    #[serde(rename = "HTTP")]
    Http,
    #[serde(rename = "HTTPS")]
    Https,
}

/// The port a probe reaches: a number, or the name of a container port of
/// the judged pod (looked up as a Service's named `targetPort` is, TCP
/// ports only, since probes dial TCP).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbePort {
    Number(u16),
    Name(String),
}

impl fmt::Display for ProbePort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProbePort::Number(n) => write!(f, "{n}"),
            ProbePort::Name(name) => write!(f, "{name:?}"),
        }
    }
}

impl<'de> Deserialize<'de> for ProbePort {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ProbePort;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a port number (1-65535) or a container port name")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ProbePort, E> {
                match u16::try_from(v) {
                    Ok(n) if n > 0 => Ok(ProbePort::Number(n)),
                    _ => Err(E::custom(format!("port {v} is not in 1-65535"))),
                }
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ProbePort, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) => Err(E::custom(format!("port {v} is not in 1-65535"))),
                }
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ProbePort, E> {
                check_port_name(v).map_err(E::custom)?;
                Ok(ProbePort::Name(v.to_owned()))
            }
        }
        d.deserialize_any(V)
    }
}

/// One entry of `httpHeaders`: `{name, value}`, as in a kubelet probe.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "RawHeader")]
pub struct HttpHeader {
    pub name: String,
    pub value: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHeader {
    name: String,
    value: String,
}

impl TryFrom<RawHeader> for HttpHeader {
    type Error = HeaderError;
    fn try_from(raw: RawHeader) -> Result<Self, HeaderError> {
        validate_header(&raw.name, &raw.value)?;
        Ok(HttpHeader {
            name: raw.name,
            value: raw.value,
        })
    }
}
