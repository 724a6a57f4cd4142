//! The probes a guest asks for, after the checks: the one implementation
//! behind every WIT version's `http-get` and `tcp-dial`, and 0.2.1's
//! `http-get-with` and `grpc-health`.
//!
//! Where a probe may go is [`crate::authorize`]'s to say; this counts the
//! call's probes, logs and counts refusals, caps timeouts, and sends the
//! probe to the network, a recording or a replay ([`ProbeMode`]).

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use crate::{
    authorize::{Denial, Scope, authorize},
    failures::FailureKind,
    probe_failure::ProbeFailure,
    replay::ProbeMode,
    state::HostState,
};
use portwise_probe as probe;

/// A guest's `http-get`, in the terms every WIT version shares (each
/// version's request converts into it, [`crate::wit`]).
pub(crate) struct HttpGet {
    /// Empty: the address under judgement.
    pub host: String,
    pub port: u16,
    pub path: String,
    /// 0: the host's cap.
    pub timeout_ms: u32,
    /// HTTPS, unverified as the kubelet's (`http-get-with`, 0.2.1).
    pub tls: bool,
    /// Request headers (`http-get-with`, 0.2.1), checked as the
    /// configuration's `httpHeaders` are.
    pub headers: Vec<(String, String)>,
}

/// The TLS setup of every guest HTTPS probe: the kubelet's, no
/// verification (a guest has no way to name a CA). Built once. The error is
/// text because it goes to the guest as a probe failure's message.
fn guest_tls() -> Result<probe::Tls, String> {
    static TLS: std::sync::OnceLock<Result<probe::Tls, String>> = std::sync::OnceLock::new();
    TLS.get_or_init(|| probe::Tls::without_verification(None).map_err(|e| e.to_string()))
        .clone()
}

impl HostState {
    /// Decides where the call's next probe may go, counting it against the
    /// cap unless it was refused before naming anywhere ([`Denial::counts`]).
    fn admit(&mut self, host: &str, port: u16) -> Result<SocketAddr, ProbeFailure> {
        let scope = Scope {
            address: self.call.address,
            ports: self.call.ports.as_ref(),
            max_probes: self.call.max_probes,
        };
        let nth = self.call.probes + 1;
        let verdict = authorize(&scope, nth, host, port);
        if verdict.as_ref().err().is_none_or(Denial::counts) {
            self.call.probes = nth;
        }
        verdict.map_err(|why| self.deny(why.to_string()))
    }

    fn deny(&mut self, why: String) -> ProbeFailure {
        self.call.denied_probes += 1;
        self.counters.fail(FailureKind::DeniedProbe);
        let l = &self.call.labels;
        tracing::warn!(
            target: "portwise_wasm::guest",
            module = %l.module, service = %l.service(), pod = %l.pod(), port = %l.port,
            "probe denied: {why}"
        );
        ProbeFailure::Denied(why)
    }

    fn timeout(&self, timeout_ms: u32) -> Duration {
        let cap = self.limits.probe_timeout_cap;
        // 0 means "the host's cap".
        if timeout_ms == 0 {
            cap
        } else {
            Duration::from_millis(timeout_ms.into()).min(cap)
        }
    }

    /// The guest waited for the host: that time is not the guest's compute.
    fn credit(&mut self, waited: Duration) {
        self.call.compute_deadline += waited;
    }

    /// `GET http(s)://<address>:<port><path>` for the guest, after the
    /// checks.
    pub(crate) async fn probe_http(
        &mut self,
        request: HttpGet,
    ) -> Result<probe::HttpResponse, ProbeFailure> {
        let HttpGet {
            host,
            port,
            ref path,
            timeout_ms,
            tls,
            ref headers,
        } = request;
        let addr = self.admit(&host, port)?;
        if path.contains(['\r', '\n']) {
            return Err(self.deny(format!("path {path:?} contains CR or LF")));
        }
        let http = probe::HttpRequest::get(path)
            .and_then(|r| r.headers(headers.iter().map(|(n, v)| (n.as_str(), v.as_str()))));
        let mut http = match http {
            Ok(http) => http,
            Err(why) => return Err(self.deny(why.to_string())),
        };
        if tls {
            match guest_tls() {
                Ok(tls) => http = http.over(tls),
                Err(why) => return Err(ProbeFailure::Io(why)),
            }
        }
        let timeout = self.timeout(timeout_ms);
        if let ProbeMode::Replay(replay) = &self.probes {
            return replay.http(addr, path);
        }
        let started = Instant::now();
        let result = probe::http_get(addr, &http, timeout, probe::MAX_BODY_BYTES).await;
        self.credit(started.elapsed());
        let result = result.map_err(ProbeFailure::from);
        if let ProbeMode::Record(recorder) = &self.probes {
            recorder.http(addr, path, timeout, &result);
        }
        result
    }

    /// grpc.health.v1 `Check` for the guest, after the checks (0.2.1).
    pub(crate) async fn probe_grpc(
        &mut self,
        host: &str,
        port: u16,
        service: &str,
        timeout_ms: u32,
    ) -> Result<probe::GrpcHealth, ProbeFailure> {
        let addr = self.admit(host, port)?;
        if let Err(why) = portwise_core::config::check_grpc_service(service) {
            return Err(self.deny(format!("service: {why}")));
        }
        let timeout = self.timeout(timeout_ms);
        if let ProbeMode::Replay(replay) = &self.probes {
            return replay.grpc(addr, service);
        }
        let started = Instant::now();
        let result = probe::grpc_health(addr, service, timeout).await;
        self.credit(started.elapsed());
        let result = result.map_err(ProbeFailure::from);
        if let ProbeMode::Record(recorder) = &self.probes {
            recorder.grpc(addr, service, timeout, &result);
        }
        result
    }

    /// Opens and closes a TCP connection for the guest, after the checks.
    pub(crate) async fn probe_tcp(
        &mut self,
        host: &str,
        port: u16,
        timeout_ms: u32,
    ) -> Result<(), ProbeFailure> {
        let addr = self.admit(host, port)?;
        let timeout = self.timeout(timeout_ms);
        if let ProbeMode::Replay(replay) = &self.probes {
            return replay.tcp(addr);
        }
        let started = Instant::now();
        let result = probe::tcp_dial(addr, timeout).await;
        self.credit(started.elapsed());
        let result = result.map_err(ProbeFailure::from);
        if let ProbeMode::Record(recorder) = &self.probes {
            recorder.tcp(addr, timeout, &result);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{Limits, failures::ModuleCounters, state::CallLabels};

    fn state(address: Option<&str>) -> HostState {
        let limits = Arc::new(Limits {
            max_probes_per_call: 3,
            ..Limits::default()
        });
        let call = limits.for_expression(&Default::default()).unwrap();
        let mut s = HostState::new(limits, Arc::new(ModuleCounters::default()), 64 << 20);
        s.begin_call(
            address.map(|a| a.parse().unwrap()),
            CallLabels::default(),
            &call,
        );
        s
    }

    fn denied(r: Result<SocketAddr, ProbeFailure>) -> String {
        match r {
            Err(ProbeFailure::Denied(why)) => why,
            other => panic!("not denied: {other:?}"),
        }
    }

    #[test]
    fn probes_per_call_are_capped() {
        let mut s = state(Some("10.244.0.5"));
        for _ in 0..3 {
            assert!(s.admit("", 80).is_ok());
        }
        assert!(denied(s.admit("", 80)).contains("more than 3 probes"));
        let call = s.limits.for_expression(&Default::default()).unwrap();
        s.begin_call(
            Some("10.244.0.5".parse().unwrap()),
            CallLabels::default(),
            &call,
        );
        assert!(s.admit("", 80).is_ok());
        // An expression's own cap replaces the runtime's.
        let tighter = s
            .limits
            .for_expression(&portwise_core::config::WasmLimits {
                probes_per_call: Some(1),
                ..Default::default()
            })
            .unwrap();
        s.begin_call(
            Some("10.244.0.5".parse().unwrap()),
            CallLabels::default(),
            &tighter,
        );
        assert!(s.admit("", 80).is_ok());
        assert!(denied(s.admit("", 80)).contains("more than 1 probes"));
    }

    /// Probes to other addresses count against the cap (so a guest cannot
    /// scan past it), and every refusal is tallied as a denied probe.
    #[test]
    fn a_call_tallies_its_denied_probes() {
        let mut s = state(Some("10.244.0.5"));
        for host in ["10.244.0.6", "localhost", "10.244.0.5"] {
            let _ = s.admit(host, 80);
        }
        assert!(s.admit("", 0).is_err());
        assert!(denied(s.admit("", 80)).contains("more than 3 probes"));
        assert_eq!((s.call.probes, s.call.denied_probes), (4, 4));
    }

    /// 0.2.1's probes are checked as the configuration's fields are: a
    /// hop-by-hop header or a service name with spaces is denied before
    /// anything is dialled (the address is one nothing would answer on).
    #[tokio::test]
    async fn bad_headers_and_service_names_are_denied_before_dialling() {
        let mut s = state(Some("10.244.0.5"));
        let request = |headers: Vec<(String, String)>| HttpGet {
            host: String::new(),
            port: 80,
            path: "/".into(),
            timeout_ms: 1,
            tls: true,
            headers,
        };
        let refused = s
            .probe_http(request(vec![("Connection".into(), "close".into())]))
            .await;
        assert!(
            matches!(&refused, Err(ProbeFailure::Denied(why)) if why.contains("hop-by-hop")),
            "{refused:?}"
        );
        let refused = s.probe_grpc("", 50051, "two words", 1).await;
        assert!(
            matches!(&refused, Err(ProbeFailure::Denied(why)) if why.starts_with("service: ")),
            "{refused:?}"
        );
        assert_eq!(s.call.denied_probes, 2);
    }

    #[test]
    fn timeouts_are_capped_and_zero_means_the_cap() {
        let s = state(Some("10.244.0.5"));
        let cap = s.limits.probe_timeout_cap;
        assert_eq!(s.timeout(0), cap);
        assert_eq!(s.timeout(u32::MAX), cap);
        assert_eq!(s.timeout(10), Duration::from_millis(10));
    }
}
