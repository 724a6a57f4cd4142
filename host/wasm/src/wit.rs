//! What every WIT version defines alike, converted once.
//!
//! Each version's `bindgen!` makes its own Rust types, even for the types
//! the versions share word for word (the log level, the probe error, the
//! HTTP request and answer, the target, the verdict): the same WIT names in another
//! package are other types to Rust, and the traits their imports are
//! implemented through are other traits. The conversions, and the probe
//! imports every version declares alike, are written here once, as macros
//! that each version module expands next to its bindings: a fix to one is a
//! fix to all, and a new version gets them by naming the macros.

/// The exports a 0.1 and a 0.2 checker have; semver-compatible patch
/// versions (`@0.2.3`) are found by wasmtime's export lookup too.
pub(crate) const CHECKER_0_2: &str = "portwise:membership/checker@0.2.0";
pub(crate) const CHECKER_0_1: &str = "portwise:membership/checker@0.1.0";

/// Expands, in a module holding a version's `bindgen!`, the conversions
/// between that version's shared types and the host's.
macro_rules! alike_in_every_version {
    () => {
        impl From<self::portwise::membership::log::Level> for tracing::Level {
            fn from(level: self::portwise::membership::log::Level) -> Self {
                use self::portwise::membership::log::Level;
                match level {
                    Level::Trace => tracing::Level::TRACE,
                    Level::Debug => tracing::Level::DEBUG,
                    Level::Info => tracing::Level::INFO,
                    Level::Warn => tracing::Level::WARN,
                    Level::Error => tracing::Level::ERROR,
                }
            }
        }

        impl From<crate::probe_failure::ProbeFailure>
            for self::portwise::membership::probes::ProbeError
        {
            fn from(e: crate::probe_failure::ProbeFailure) -> Self {
                use crate::probe_failure::ProbeFailure;
                match e {
                    ProbeFailure::Timeout => Self::Timeout,
                    ProbeFailure::Refused => Self::Refused,
                    ProbeFailure::Denied(why) => Self::Denied(why),
                    ProbeFailure::Io(why) => Self::Io(why),
                }
            }
        }

        impl From<self::portwise::membership::probes::HttpRequest> for crate::probes::HttpGet {
            fn from(r: self::portwise::membership::probes::HttpRequest) -> Self {
                Self {
                    host: r.host,
                    port: r.port,
                    path: r.path,
                    timeout_ms: r.timeout_ms,
                    tls: false,
                    headers: Vec::new(),
                }
            }
        }

        impl From<portwise_probe::HttpResponse>
            for self::portwise::membership::probes::HttpResponse
        {
            fn from(r: portwise_probe::HttpResponse) -> Self {
                Self {
                    status: r.status,
                    body: r.body,
                    truncated: r.truncated,
                }
            }
        }

        /// What is being judged: the resolved port, the family and the
        /// address (`address`: the subject's, normalised by the caller, so
        /// the record can borrow it).
        pub(crate) fn target<'a>(
            subject: &'a portwise_core::membership::Subject,
            address: &'a str,
        ) -> self::portwise::membership::types::Target<'a> {
            use self::portwise::membership::types::{AddressFamily, Target};
            let port = &subject.port;
            Target {
                port_name: &port.name,
                service_port: u16::try_from(port.port).unwrap_or(0),
                target_port: port.target,
                protocol: if port.protocol.is_empty() {
                    "TCP"
                } else {
                    &port.protocol
                },
                family: match subject.family {
                    portwise_core::membership::Family::V4 => AddressFamily::Ipv4,
                    portwise_core::membership::Family::V6 => AddressFamily::Ipv6,
                },
                address,
            }
        }

        /// The guest's answer as the host's verdict, its reason cut to
        /// `max_reason` bytes.
        pub(crate) fn verdict(
            answer: self::portwise::membership::types::Verdict,
            max_reason: usize,
        ) -> portwise_core::membership::Verdict {
            use self::portwise::membership::types::Decision as Answer;
            use portwise_core::membership::Decision;
            let decision = match answer.decision {
                Answer::Include => Decision::Include,
                Answer::Exclude => Decision::Exclude,
                Answer::Abstain => Decision::Abstain,
            };
            portwise_core::membership::Verdict {
                decision,
                reason: answer
                    .reason
                    .map(|r| portwise_core::text::truncate(r, max_reason)),
            }
        }
    };
}

/// Expands, inside a version's `impl probes::Host for HostState` (with
/// that version's `probes` interface in scope as `probes`), the probe
/// imports every version declares alike: `http-get` and `tcp-dial`, each
/// the shared implementation ([`crate::probes`]) in the version's types.
macro_rules! probe_imports {
    () => {
        async fn http_get(
            &mut self,
            request: probes::HttpRequest,
        ) -> Result<probes::HttpResponse, probes::ProbeError> {
            let response = self.probe_http(request.into()).await?;
            Ok(response.into())
        }

        async fn tcp_dial(
            &mut self,
            host: String,
            port: u16,
            timeout_ms: u32,
        ) -> Result<(), probes::ProbeError> {
            Ok(self.probe_tcp(&host, port, timeout_ms).await?)
        }
    };
}

pub(crate) use {alike_in_every_version, probe_imports};
