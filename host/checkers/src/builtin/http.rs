//! `httpGet`: the HTTP port probe, and how its answer maps to a verdict.

use std::time::Duration;

use portwise_core::membership::{Subject, Verdict};
use portwise_probe::{self as probe, ProbeError};

use super::probe::{port_probe, verdict_for_probe_error};
use crate::{BoxFuture, Checker};

/// Body bytes an `httpGet` reads: enough for a snippet in the reason.
const HTTP_BODY_FOR_REASON: usize = 1024;
/// Body characters quoted in an `exclude` reason.
const REASON_BODY_CHARS: usize = 120;

/// `httpGet(path, timeout)`: `GET http://<address>:<target><path>`; 2xx
/// includes, redirects are not followed.
#[derive(Debug)]
pub struct HttpGet {
    pub path: String,
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
        Box::pin(port_probe("httpGet", subject, move |addr| async move {
            let result =
                probe::http_get(addr, &self.path, self.timeout, HTTP_BODY_FOR_REASON).await;
            Self::verdict(&format!("httpGet {addr}{}", self.path), result)
        }))
    }
}
