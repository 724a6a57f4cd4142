//! Recording a guest's probes and answering them from a recording: the
//! [`ProbeMode`] of a [`crate::WasmConfig`], applied where every guest probe
//! goes through (`HostState::probe_http` and `probe_tcp`), *after* the host
//! has authorised the probe. A denied or invalid probe is therefore refused
//! exactly as live, in every mode, and never appears in a recording.
//!
//! The file (`portwise check --record FILE`, read back by `--replay FILE`)
//! is JSON, versioned ([`FORMAT`], [`VERSION`]), one entry per probe in the
//! order the guest made them; see `docs/guests.md`, "Benchmarking, recording
//! and replaying a checker", for an example.
//!
//! Replay matches a probe by (kind, address, port, path): the address is
//! always the one under judgement, the timeout is recorded but not matched.
//! Repeats of the same probe get the recorded answers in recorded order, and
//! once those are used up the last one again (a benchmark repeats every
//! decision). A probe with no recorded answer is a *miss*: the guest gets
//! `probe-error.io("replay: no recorded answer for GET 10.244.0.5:8080/ready")`
//! and the miss is kept for [`Replayer::misses`].

use std::{
    collections::{BTreeMap, HashMap},
    net::{IpAddr, SocketAddr},
    path::Path,
    sync::Mutex,
    time::Duration,
};

use serde::{Deserialize, Serialize};

use crate::probe_failure::ProbeFailure;
use portwise_probe::{GrpcHealth, HttpResponse, ServingStatus};

/// The `format` of every recording.
pub const FORMAT: &str = "portwise-probe-recording";
/// The recording version this host writes and reads.
pub const VERSION: u32 = 1;

/// Where a guest's probes go.
#[derive(Clone, Debug, Default)]
pub enum ProbeMode {
    /// To the network (what `portwise run` does).
    #[default]
    Live,
    /// To the network, and each probe with its answer into the recorder.
    Record(std::sync::Arc<Recorder>),
    /// Answered from a recording; nothing reaches the network.
    Replay(std::sync::Arc<Replayer>),
}

/// The kind of a probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProbeKind {
    /// `http-get`, and `http-get-with` (HTTPS and headers are not part of
    /// the key: a probe is matched by address, port and path).
    HttpGet,
    TcpDial,
    /// `grpc-health` (0.2.1); `path` holds the service name.
    GrpcHealth,
}

/// One probe a guest made, and what it got.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RecordedProbe {
    pub kind: ProbeKind,
    /// The address under judgement (probes reach no other).
    pub address: IpAddr,
    pub port: u16,
    /// The request path (`http-get`), or the service (`grpc-health`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The timeout the probe ran with, after the host's cap (informative:
    /// replay does not match on it).
    pub timeout_ms: u64,
    pub answer: RecordedAnswer,
}

/// What a probe got: an HTTP response, a connection, or the error the guest
/// saw (`probe-error.timeout`, `.refused` or `.io`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "camelCase", deny_unknown_fields)]
pub enum RecordedAnswer {
    /// `http-get` answered.
    #[serde(rename_all = "camelCase")]
    Response {
        status: u16,
        /// The body read (at most `max-body-bytes`) when it is UTF-8 ...
        #[serde(default, skip_serializing_if = "Option::is_none")]
        body: Option<String>,
        /// ... or else as hex.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        body_hex: Option<String>,
        truncated: bool,
    },
    /// `tcp-dial` connected.
    Connected,
    /// `grpc-health` answered with a serving status (`SERVING`,
    /// `NOT_SERVING`, `UNKNOWN`, `SERVICE_UNKNOWN`).
    Health {
        status: String,
    },
    /// `grpc-health`'s call ended with a gRPC status other than OK.
    GrpcFailed {
        code: u32,
        message: String,
    },
    Timeout,
    Refused,
    Io {
        message: String,
    },
}

impl RecordedAnswer {
    fn http(result: &Result<HttpResponse, ProbeFailure>) -> Self {
        match result {
            Ok(r) => {
                let (body, body_hex) = match std::str::from_utf8(&r.body) {
                    Ok(text) => (Some(text.to_string()), None),
                    Err(_) => (None, Some(hex::encode(&r.body))),
                };
                RecordedAnswer::Response {
                    status: r.status,
                    body,
                    body_hex,
                    truncated: r.truncated,
                }
            }
            Err(e) => Self::failure(e),
        }
    }

    fn tcp(result: &Result<(), ProbeFailure>) -> Self {
        match result {
            Ok(()) => RecordedAnswer::Connected,
            Err(e) => Self::failure(e),
        }
    }

    fn grpc(result: &Result<GrpcHealth, ProbeFailure>) -> Self {
        match result {
            Ok(GrpcHealth::Status(s)) => RecordedAnswer::Health {
                status: s.to_string(),
            },
            Ok(GrpcHealth::Failed { code, message }) => RecordedAnswer::GrpcFailed {
                code: *code,
                message: message.clone(),
            },
            Err(e) => Self::failure(e),
        }
    }

    fn failure(e: &ProbeFailure) -> Self {
        match e {
            ProbeFailure::Timeout => RecordedAnswer::Timeout,
            ProbeFailure::Refused => RecordedAnswer::Refused,
            // Denied probes never reach the mode; keep the message anyway.
            ProbeFailure::Io(m) | ProbeFailure::Denied(m) => {
                RecordedAnswer::Io { message: m.clone() }
            }
        }
    }

    fn error(&self) -> Option<ProbeFailure> {
        match self {
            RecordedAnswer::Timeout => Some(ProbeFailure::Timeout),
            RecordedAnswer::Refused => Some(ProbeFailure::Refused),
            RecordedAnswer::Io { message } => Some(ProbeFailure::Io(message.clone())),
            RecordedAnswer::Response { .. }
            | RecordedAnswer::Connected
            | RecordedAnswer::Health { .. }
            | RecordedAnswer::GrpcFailed { .. } => None,
        }
    }

    /// The answer to an `http-get`; `Err` also when the entry holds a
    /// `tcp-dial`'s answer (a hand-edited file).
    fn to_http(&self) -> Result<HttpResponse, ProbeFailure> {
        if let Some(e) = self.error() {
            return Err(e);
        }
        match self {
            RecordedAnswer::Response {
                status,
                body,
                body_hex,
                truncated,
            } => {
                let body = match (body, body_hex) {
                    (Some(text), _) => text.clone().into_bytes(),
                    (None, Some(h)) => hex::decode(h).map_err(|e| {
                        ProbeFailure::Io(format!("replay: the recorded bodyHex is not hex: {e}"))
                    })?,
                    (None, None) => Vec::new(),
                };
                Ok(HttpResponse {
                    status: *status,
                    body,
                    truncated: *truncated,
                })
            }
            _ => Err(ProbeFailure::Io(
                "replay: the recorded answer is not an http-get's".into(),
            )),
        }
    }

    /// The answer to a `grpc-health`.
    fn to_grpc(&self) -> Result<GrpcHealth, ProbeFailure> {
        if let Some(e) = self.error() {
            return Err(e);
        }
        match self {
            RecordedAnswer::Health { status } => {
                let status = match status.as_str() {
                    "SERVING" => ServingStatus::Serving,
                    "NOT_SERVING" => ServingStatus::NotServing,
                    "UNKNOWN" => ServingStatus::Unknown,
                    "SERVICE_UNKNOWN" => ServingStatus::ServiceUnknown,
                    other => {
                        return Err(ProbeFailure::Io(format!(
                            "replay: {other:?} is not a recorded serving status"
                        )));
                    }
                };
                Ok(GrpcHealth::Status(status))
            }
            RecordedAnswer::GrpcFailed { code, message } => Ok(GrpcHealth::Failed {
                code: *code,
                message: message.clone(),
            }),
            _ => Err(ProbeFailure::Io(
                "replay: the recorded answer is not a grpc-health's".into(),
            )),
        }
    }

    fn to_tcp(&self) -> Result<(), ProbeFailure> {
        match self {
            RecordedAnswer::Connected => Ok(()),
            RecordedAnswer::Timeout | RecordedAnswer::Refused | RecordedAnswer::Io { .. } => {
                Err(self.error().expect("an error answer"))
            }
            _ => Err(ProbeFailure::Io(
                "replay: the recorded answer is not a tcp-dial's".into(),
            )),
        }
    }
}

/// A whole recording file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Recording {
    /// Always [`FORMAT`].
    pub format: String,
    /// [`VERSION`] when written by this host.
    pub version: u32,
    /// In the order the guest made them.
    pub probes: Vec<RecordedProbe>,
}

impl Default for Recording {
    fn default() -> Self {
        Recording {
            format: FORMAT.into(),
            version: VERSION,
            probes: Vec::new(),
        }
    }
}

impl Recording {
    /// Parses a recording, refusing another format or version.
    pub fn from_json(text: &str) -> Result<Self, RecordingError> {
        // Look at the header first, so a newer version is named as such
        // rather than as an unknown field.
        let header: serde_json::Value =
            serde_json::from_str(text).map_err(RecordingError::NotJson)?;
        match header.get("format").and_then(|f| f.as_str()) {
            Some(FORMAT) => {}
            other => return Err(RecordingError::Format(other.map(str::to_string))),
        }
        match header.get("version").and_then(|v| v.as_u64()) {
            Some(v) if v == u64::from(VERSION) => {}
            Some(v) => return Err(RecordingError::Version(v)),
            None => return Err(RecordingError::NoVersion),
        }
        let recording: Recording = serde_json::from_value(header).map_err(RecordingError::Shape)?;
        for (i, p) in recording.probes.iter().enumerate() {
            match (p.kind, &p.path) {
                (ProbeKind::HttpGet, None) => return Err(RecordingError::HttpWithoutPath(i)),
                (ProbeKind::TcpDial, Some(_)) => return Err(RecordingError::TcpWithPath(i)),
                _ => {}
            }
        }
        Ok(recording)
    }

    pub fn read(path: &Path) -> Result<Self, RecordingError> {
        let at = |source| RecordingError::File {
            path: path.to_path_buf(),
            source: Box::new(source),
        };
        let text = std::fs::read_to_string(path).map_err(|e| at(RecordingError::Io(e)))?;
        Self::from_json(&text).map_err(at)
    }

    /// Pretty-printed JSON, ending in a newline.
    pub fn to_json(&self) -> String {
        let mut text = serde_json::to_string_pretty(self).expect("a recording serialises");
        text.push('\n');
        text
    }

    pub fn write(&self, path: &Path) -> Result<(), RecordingError> {
        std::fs::write(path, self.to_json()).map_err(|e| RecordingError::File {
            path: path.to_path_buf(),
            source: Box::new(RecordingError::Io(e)),
        })
    }
}

/// Why a recording cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum RecordingError {
    #[error("not JSON: {0}")]
    NotJson(serde_json::Error),
    /// The `format` field, when there is one, names something else.
    #[error("not a probe recording: \"format\" is {0:?}, expected {FORMAT:?}")]
    Format(Option<String>),
    #[error("recording version {0}: this portwise reads version {VERSION}")]
    Version(u64),
    #[error("no \"version\"")]
    NoVersion,
    /// The right format and version, but not the fields it has.
    #[error("{0}")]
    Shape(serde_json::Error),
    #[error("probes[{0}]: an http-get without a \"path\"")]
    HttpWithoutPath(usize),
    #[error("probes[{0}]: a tcp-dial with a \"path\"")]
    TcpWithPath(usize),
    #[error("{0}")]
    Io(std::io::Error),
    /// Any of the above, in this file.
    #[error("{}: {source}", path.display())]
    File {
        path: std::path::PathBuf,
        source: Box<RecordingError>,
    },
}

/// How a probe is named in messages: `GET 10.244.0.5:8080/ready`,
/// `TCP [fd00::5]:8080`.
fn describe(kind: ProbeKind, addr: SocketAddr, path: Option<&str>) -> String {
    match kind {
        ProbeKind::HttpGet => format!("GET {addr}{}", path.unwrap_or("")),
        ProbeKind::TcpDial => format!("TCP {addr}"),
        ProbeKind::GrpcHealth => format!("gRPC health {addr} service {:?}", path.unwrap_or("")),
    }
}

/// Collects the probes of a [`ProbeMode::Record`] run.
#[derive(Debug, Default)]
pub struct Recorder {
    /// `None` once [`Recorder::finish`]ed.
    probes: Mutex<Option<Vec<RecordedProbe>>>,
}

impl Recorder {
    pub fn new() -> Self {
        Recorder {
            probes: Mutex::new(Some(Vec::new())),
        }
    }

    fn push(&self, probe: RecordedProbe) {
        if let Some(probes) = self
            .probes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            probes.push(probe);
        }
    }

    pub(crate) fn http(
        &self,
        addr: SocketAddr,
        path: &str,
        timeout: Duration,
        result: &Result<HttpResponse, ProbeFailure>,
    ) {
        self.push(RecordedProbe {
            kind: ProbeKind::HttpGet,
            address: addr.ip(),
            port: addr.port(),
            path: Some(path.to_string()),
            timeout_ms: timeout.as_millis() as u64,
            answer: RecordedAnswer::http(result),
        });
    }

    pub(crate) fn tcp(
        &self,
        addr: SocketAddr,
        timeout: Duration,
        result: &Result<(), ProbeFailure>,
    ) {
        self.push(RecordedProbe {
            kind: ProbeKind::TcpDial,
            address: addr.ip(),
            port: addr.port(),
            path: None,
            timeout_ms: timeout.as_millis() as u64,
            answer: RecordedAnswer::tcp(result),
        });
    }

    pub(crate) fn grpc(
        &self,
        addr: SocketAddr,
        service: &str,
        timeout: Duration,
        result: &Result<GrpcHealth, ProbeFailure>,
    ) {
        self.push(RecordedProbe {
            kind: ProbeKind::GrpcHealth,
            address: addr.ip(),
            port: addr.port(),
            path: Some(service.to_string()),
            timeout_ms: timeout.as_millis() as u64,
            answer: RecordedAnswer::grpc(result),
        });
    }

    /// The probes recorded so far; later probes still go to the network
    /// but are no longer recorded.
    pub fn finish(&self) -> Recording {
        let probes = self
            .probes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .unwrap_or_default();
        Recording {
            probes,
            ..Recording::default()
        }
    }
}

type Key = (ProbeKind, IpAddr, u16, Option<String>);

/// Answers probes from a [`Recording`] ([`ProbeMode::Replay`]).
#[derive(Debug)]
pub struct Replayer {
    answers: Mutex<HashMap<Key, Cursor>>,
    /// Probes with no recorded answer, by description, with how often.
    misses: Mutex<BTreeMap<String, u64>>,
}

#[derive(Debug)]
struct Cursor {
    answers: Vec<RecordedAnswer>,
    next: usize,
}

/// A probe that had no recorded answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayMiss {
    /// `GET 10.244.0.5:8080/ready` or `TCP 10.244.0.5:8080`.
    pub probe: String,
    /// How many times the guest made it.
    pub count: u64,
}

impl Replayer {
    pub fn new(recording: Recording) -> Self {
        let mut answers: HashMap<Key, Cursor> = HashMap::new();
        for p in recording.probes {
            answers
                .entry((p.kind, p.address, p.port, p.path))
                .or_insert_with(|| Cursor {
                    answers: Vec::new(),
                    next: 0,
                })
                .answers
                .push(p.answer);
        }
        Replayer {
            answers: Mutex::new(answers),
            misses: Mutex::new(BTreeMap::new()),
        }
    }

    /// The next recorded answer for a probe; the last one again once all
    /// were given.
    fn next(&self, key: Key) -> Result<RecordedAnswer, ProbeFailure> {
        let mut answers = self.answers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(cursor) = answers.get_mut(&key) {
            let i = cursor.next.min(cursor.answers.len() - 1);
            cursor.next += 1;
            return Ok(cursor.answers[i].clone());
        }
        drop(answers);
        let (kind, ip, port, path) = key;
        let probe = describe(kind, SocketAddr::new(ip, port), path.as_deref());
        *self
            .misses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(probe.clone())
            .or_default() += 1;
        Err(ProbeFailure::Io(format!(
            "replay: no recorded answer for {probe}"
        )))
    }

    pub(crate) fn http(&self, addr: SocketAddr, path: &str) -> Result<HttpResponse, ProbeFailure> {
        self.next((
            ProbeKind::HttpGet,
            addr.ip(),
            addr.port(),
            Some(path.to_string()),
        ))?
        .to_http()
    }

    pub(crate) fn tcp(&self, addr: SocketAddr) -> Result<(), ProbeFailure> {
        self.next((ProbeKind::TcpDial, addr.ip(), addr.port(), None))?
            .to_tcp()
    }

    pub(crate) fn grpc(&self, addr: SocketAddr, service: &str) -> Result<GrpcHealth, ProbeFailure> {
        self.next((
            ProbeKind::GrpcHealth,
            addr.ip(),
            addr.port(),
            Some(service.to_string()),
        ))?
        .to_grpc()
    }

    /// The probes that found no recorded answer, sorted.
    pub fn misses(&self) -> Vec<ReplayMiss> {
        self.misses
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(probe, count)| ReplayMiss {
                probe: probe.clone(),
                count: *count,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_recording_round_trips_and_replays_in_order_then_repeats_the_last() {
        let rec = Recorder::new();
        let a = addr("10.244.0.5:8080");
        let ok = |status| {
            Ok(HttpResponse {
                status,
                body: b"{\"role\":\"primary\"}".to_vec(),
                truncated: false,
            })
        };
        rec.http(a, "/ready", Duration::from_secs(1), &ok(200));
        rec.http(a, "/ready", Duration::from_secs(1), &ok(503));
        rec.http(
            a,
            "/bin",
            Duration::from_secs(1),
            &Ok(HttpResponse {
                status: 200,
                body: vec![0xff, 0x00],
                truncated: true,
            }),
        );
        rec.tcp(
            addr("10.244.0.5:8081"),
            Duration::from_millis(500),
            &Err(ProbeFailure::Refused),
        );
        rec.tcp(
            addr("10.244.0.5:8082"),
            Duration::from_millis(500),
            &Err(ProbeFailure::Io("unreachable: no route".into())),
        );
        let recording = rec.finish();
        // Finished: nothing more is recorded.
        rec.tcp(addr("10.244.0.5:1"), Duration::ZERO, &Ok(()));
        assert!(rec.finish().probes.is_empty());

        let text = recording.to_json();
        assert!(
            text.contains(r#""format": "portwise-probe-recording""#),
            "{text}"
        );
        assert!(text.contains(r#""result": "refused""#), "{text}");
        assert!(text.contains(r#""bodyHex": "ff00""#), "{text}");
        let back = Recording::from_json(&text).unwrap();
        assert_eq!(back, recording);

        let r = Replayer::new(back);
        assert_eq!(r.http(a, "/ready").unwrap().status, 200);
        assert_eq!(r.http(a, "/ready").unwrap().status, 503);
        // Used up: the last answer again.
        assert_eq!(r.http(a, "/ready").unwrap().status, 503);
        let bin = r.http(a, "/bin").unwrap();
        assert_eq!((bin.body, bin.truncated), (vec![0xff, 0x00], true));
        assert_eq!(r.tcp(addr("10.244.0.5:8081")), Err(ProbeFailure::Refused));
        assert_eq!(
            r.tcp(addr("10.244.0.5:8082")),
            Err(ProbeFailure::Io("unreachable: no route".into()))
        );
        assert!(r.misses().is_empty());
    }

    /// gRPC health answers (0.2.1) record and replay like the others,
    /// keyed by the service.
    #[test]
    fn grpc_health_answers_round_trip() {
        let recorder = Recorder::new();
        let at = addr("10.244.0.5:50051");
        let t = Duration::from_millis(500);
        recorder.grpc(
            at,
            "db",
            t,
            &Ok(GrpcHealth::Status(ServingStatus::NotServing)),
        );
        let failed = GrpcHealth::Failed {
            code: 5,
            message: "unknown service".into(),
        };
        recorder.grpc(at, "cache", t, &Ok(failed.clone()));
        recorder.grpc(at, "slow", t, &Err(ProbeFailure::Timeout));
        let recording = Recording::from_json(&recorder.finish().to_json()).unwrap();
        let replay = Replayer::new(recording);
        assert_eq!(
            replay.grpc(at, "db"),
            Ok(GrpcHealth::Status(ServingStatus::NotServing))
        );
        assert_eq!(replay.grpc(at, "cache"), Ok(failed));
        assert_eq!(replay.grpc(at, "slow"), Err(ProbeFailure::Timeout));
        // Another service, or an HTTP probe at the same place, is a miss.
        assert!(replay.grpc(at, "other").is_err());
        assert!(replay.http(at, "db").is_err());
        assert_eq!(
            replay
                .misses()
                .iter()
                .map(|m| m.probe.as_str())
                .collect::<Vec<_>>(),
            [
                "GET 10.244.0.5:50051db",
                "gRPC health 10.244.0.5:50051 service \"other\""
            ]
        );
    }

    #[test]
    fn a_probe_not_recorded_is_a_named_miss() {
        let r = Replayer::new(Recording::default());
        let e = r.http(addr("10.244.0.5:8080"), "/ready").unwrap_err();
        assert_eq!(
            e,
            ProbeFailure::Io("replay: no recorded answer for GET 10.244.0.5:8080/ready".into())
        );
        r.http(addr("10.244.0.5:8080"), "/ready").unwrap_err();
        r.tcp(addr("[fd00::5]:9")).unwrap_err();
        assert_eq!(
            r.misses(),
            vec![
                ReplayMiss {
                    probe: "GET 10.244.0.5:8080/ready".into(),
                    count: 2
                },
                ReplayMiss {
                    probe: "TCP [fd00::5]:9".into(),
                    count: 1
                },
            ]
        );
    }

    #[test]
    fn other_formats_versions_and_bad_entries_are_refused() {
        for (text, says) in [
            ("[]", "not a probe recording"),
            (
                r#"{"format": "x", "version": 1, "probes": []}"#,
                "not a probe recording",
            ),
            (
                r#"{"format": "portwise-probe-recording", "version": 2, "probes": []}"#,
                "version 2",
            ),
            (
                r#"{"format": "portwise-probe-recording", "version": 1, "probes": [], "x": 1}"#,
                "unknown field",
            ),
            (
                r#"{"format": "portwise-probe-recording", "version": 1, "probes": [
                    {"kind": "http-get", "address": "10.0.0.1", "port": 80, "timeoutMs": 1,
                     "answer": {"result": "connected"}}]}"#,
                "without a \"path\"",
            ),
        ] {
            let e = Recording::from_json(text).unwrap_err().to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
    }
}
