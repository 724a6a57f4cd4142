//! `httpGet`: the HTTP(S) port probe, and how its answer maps to a verdict.

use std::time::Duration;

use portwise_core::{
    config::ProbePort,
    membership::{Subject, Verdict},
};
use portwise_probe::{self as probe, HttpRequest, ProbeError};

use super::probe::{port_probe, verdict_for_probe_error};
use crate::{BoxFuture, Checker};

/// Body bytes an `httpGet` reads: enough for a snippet in the reason.
const HTTP_BODY_FOR_REASON: usize = 1024;
/// Body characters quoted in an `exclude` reason.
const REASON_BODY_CHARS: usize = 120;

/// `httpGet(path, port, scheme, headers, timeout)`: `GET
/// <scheme>://<address>:<port><path>`; 2xx includes, redirects are not
/// followed.
#[derive(Debug)]
pub struct HttpGet {
    pub request: HttpRequest,
    pub port: Option<ProbePort>,
    pub timeout: Duration,
}

impl HttpGet {
    /// The verdict for a probe result.
    pub fn verdict(what: &str, result: Result<probe::HttpResponse, ProbeError>) -> Verdict {
        match result {
            Ok(r) if r.is_success() => Verdict::include(),
            Ok(r) => {
                let body = String::from_utf8_lossy(&r.body);
                let body: String = body.trim().chars().take(REASON_BODY_CHARS).collect();
                let reason = if body.is_empty() {
                    format!("{what}: status {}", r.status)
                } else {
                    format!("{what}: status {}: {body}", r.status)
                };
                Verdict::exclude().because(reason)
            }
            Err(e) => verdict_for_probe_error(what, &e),
        }
    }
}

impl Checker for HttpGet {
    fn check<'a>(&'a self, subject: &'a Subject) -> BoxFuture<'a, Verdict> {
        Box::pin(port_probe(
            "httpGet",
            subject,
            self.port.as_ref(),
            move |addr| async move {
                let result =
                    probe::http_get(addr, &self.request, self.timeout, HTTP_BODY_FOR_REASON).await;
                // `https://10.244.0.7:8443/admin` (the scheme only for HTTPS,
                // as reasons read before it existed).
                let scheme = match self.request.scheme() {
                    "http" => String::new(),
                    s => format!("{s}://"),
                };
                Self::verdict(
                    &format!("httpGet {scheme}{addr}{}", self.request.path()),
                    result,
                )
            },
        ))
    }
}
