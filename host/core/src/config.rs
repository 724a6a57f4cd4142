//! The configuration file: the contract in `../shared/config.md`.
//!
//! Users write this file by hand (in a cluster, a ConfigMap), so a mistake in
//! it must stop portwise at start with a message that points at the field:
//! `membership.perPort.ports.http.httpGet.timeout: invalid duration "1x"`.
//! Two layers make that happen:
//!
//! - **shape**, checked while parsing: serde with `deny_unknown_fields`, the
//!   checker grammar as an externally tagged enum (a bare word or a map with
//!   exactly one key), durations as humantime strings; serde_path_to_error
//!   tracks where the parser is, so every type error carries its path;
//! - **meaning**, checked by [`Config::validate`] after parsing, walking the
//!   same tree and building the same path syntax by hand (ranges, key syntax,
//!   the manager name, module names, `wasm` needing `modulesDir`).
//!
//! [`Config::validate`] is public so configurations built in code (tests,
//! `portwise check`) go through the same rules as files.

use std::{
    collections::BTreeMap,
    fmt,
    path::{Path, PathBuf},
    time::Duration,
};

use serde::Deserialize;

/// managed-by values of the native controllers: portwise must never claim
/// their slices (or they would fight over them).
pub const NATIVE_MANAGERS: [&str; 2] = [
    "endpointslice-controller.k8s.io",
    "endpointslicemirroring-controller.k8s.io",
];

/// The largest probe timeout a configuration may ask for. A check holds a
/// slot of `maxConcurrentChecks` while it runs; minutes-long probes would
/// starve every other Service.
pub const MAX_PROBE_TIMEOUT: Duration = Duration::from_secs(60);

/// The shortest `resyncPeriod`: below this, resync is a hot loop.
pub const MIN_RESYNC_PERIOD: Duration = Duration::from_millis(100);

/// The deepest YAML nesting a configuration file may have.
pub const MAX_NESTING: usize = 32;

/// Upper bound of `maxEndpointsPerSlice` (the EndpointSlice API's own limit).
pub const MAX_ENDPOINTS_PER_SLICE: usize = 1000;

/// The whole configuration file.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// Value of the `endpointslice.kubernetes.io/managed-by` label on the
    /// slices portwise writes, and its server-side-apply field manager.
    #[serde(default = "default_managed_by")]
    pub managed_by: String,
    /// How a Service opts in; the key's value names the pod group.
    pub service_key: KeySource,
    /// How pods join a group; `None` means the same key as `service_key`
    /// (use [`Config::pod_key`]).
    #[serde(default)]
    pub pod_key: Option<KeySource>,
    /// Probes re-run at least this often.
    #[serde(default = "default_resync_period", with = "duration_str")]
    pub resync_period: Duration,
    /// How long an `abstain` keeps what was published; a (pod, port,
    /// family) that has abstained without a break for longer counts as
    /// `exclude`. `None`: [`default_abstain_limit`] (use
    /// [`Config::abstain_limit`]).
    #[serde(default, with = "optional_duration_str")]
    pub abstain_limit: Option<Duration>,
    #[serde(default = "default_max_endpoints_per_slice")]
    pub max_endpoints_per_slice: usize,
    /// Global bound on checks in flight.
    #[serde(default = "default_max_concurrent_checks")]
    pub max_concurrent_checks: usize,
    /// Migration cleanup of the native controllers' leftovers.
    #[serde(default = "yes")]
    pub native_cleanup: bool,
    /// Also write v1 Endpoints (labelled skip-mirror).
    #[serde(default)]
    pub publish_legacy_endpoints: bool,
    /// No Node watch: no zones, no hints.
    #[serde(default)]
    pub disable_node_lookups: bool,
    /// Where `wasm` checkers are loaded from.
    #[serde(default)]
    pub modules_dir: Option<PathBuf>,
    /// Credentials for `oci://` modules: a Docker config JSON
    /// (`~/.docker/config.json`, the `.dockerconfigjson` of a
    /// `kubernetes.io/dockerconfigjson` Secret). Without it, pulls are
    /// anonymous.
    #[serde(default)]
    pub registry_auth: Option<PathBuf>,
    /// PEM certificates trusted for registries besides the system's roots
    /// (a registry behind a private CA).
    #[serde(default, rename = "registryCA")]
    pub registry_ca: Option<PathBuf>,
    /// The largest `oci://` module accepted; a larger layer is refused from
    /// its manifest, before its download starts. Default 64 MiB.
    #[serde(default = "default_max_module_bytes")]
    pub max_module_bytes: u64,
    /// When set, every `oci://` module must carry a cosign signature by one
    /// of these keys, or it is refused.
    #[serde(default)]
    pub module_signatures: Option<ModuleSignatures>,
    /// The checker expression deciding membership.
    #[serde(default)]
    pub membership: CheckerExpr,
    /// Membership expressions judged next to the live one, publishing
    /// nothing: how a new checker is tried before it decides.
    #[serde(default)]
    pub shadow: Option<ShadowSpec>,
}

/// `moduleSignatures: {keys: [FILE, ...]}`.
///
/// Signatures are what `cosign sign --key` makes (a sigstore bundle
/// referrer, or the older `sha256-<digest>.sig` tag), verified offline
/// against these public keys: no transparency log is consulted. They apply
/// to `oci://` modules, shadows' included; a `modulesDir` file is the
/// operator's own (pin it with `sha256`).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ModuleSignatures {
    /// PEM public key files (`cosign.pub`); a signature by any one of them
    /// is enough.
    pub keys: Vec<PathBuf>,
}

/// `shadow: {membership, expressions, annotation}`.
///
/// A shadow expression is judged on every reconcile of a Service it applies
/// to, right after the live one, and its verdicts are only compared: the
/// differences go to a metric, an Event on the Service and `portwise check
/// --live`. Named expressions live here, in the operator's file, rather
/// than in the annotation itself, because an expression can run probes
/// and WebAssembly: who may write a Service must not choose what portwise
/// runs.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ShadowSpec {
    /// The shadow of every managed Service, unless its annotation picks
    /// another (or `none`).
    #[serde(default)]
    pub membership: Option<CheckerExpr>,
    /// Named shadows; a Service picks one with `annotation: NAME`.
    #[serde(default)]
    pub expressions: BTreeMap<String, CheckerExpr>,
    /// The Service annotation that picks a named shadow (`none` turns the
    /// default off for that Service).
    #[serde(default = "default_shadow_annotation")]
    pub annotation: String,
}

/// `portwise.io/shadow`.
pub const DEFAULT_SHADOW_ANNOTATION: &str = "portwise.io/shadow";

fn default_shadow_annotation() -> String {
    DEFAULT_SHADOW_ANNOTATION.to_owned()
}

/// The default `maxModuleBytes`: 64 MiB, 3.5 times the largest example
/// guest (Python, 18.5 MB).
pub const DEFAULT_MAX_MODULE_BYTES: u64 = 64 << 20;

fn default_max_module_bytes() -> u64 {
    DEFAULT_MAX_MODULE_BYTES
}

fn default_managed_by() -> String {
    "portwise".to_owned()
}
fn default_resync_period() -> Duration {
    Duration::from_secs(30)
}
/// The default `abstainLimit`: five minutes, or two resync periods when
/// that is longer (an abstain must be seen twice to outlast it).
///
/// Five minutes is Kubernetes' own patience with a node it cannot reach
/// (the default `tolerationSeconds` of `node.kubernetes.io/unreachable`
/// before its pods are evicted). A controller that lost its own network
/// for less keeps every endpoint; a pod gone from the network for longer
/// stops getting traffic even if its Pod object lingers.
pub fn default_abstain_limit(resync_period: Duration) -> Duration {
    Duration::from_secs(300).max(resync_period * 2)
}
fn default_max_endpoints_per_slice() -> usize {
    100
}
fn default_max_concurrent_checks() -> usize {
    16
}
fn yes() -> bool {
    true
}

/// Where a key lives on an object: exactly one of `label` / `annotation`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum KeySource {
    Label(String),
    Annotation(String),
}

impl KeySource {
    /// The key itself.
    pub fn key(&self) -> &str {
        match self {
            KeySource::Label(k) | KeySource::Annotation(k) => k,
        }
    }

    /// Looks the key up on an object's metadata.
    pub fn get<'a>(
        &self,
        meta: &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    ) -> Option<&'a str> {
        let map = match self {
            KeySource::Label(_) => meta.labels.as_ref(),
            KeySource::Annotation(_) => meta.annotations.as_ref(),
        };
        map.and_then(|m| m.get(self.key())).map(String::as_str)
    }

    fn validate(&self, path: &FieldPath) -> Result<(), Issue> {
        let (field, key) = match self {
            KeySource::Label(k) => ("label", k),
            KeySource::Annotation(k) => ("annotation", k),
        };
        check_qualified_name(key).map_err(|m| path.field(field).issue(m))
    }
}

impl fmt::Display for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeySource::Label(k) => write!(f, "label {k}"),
            KeySource::Annotation(k) => write!(f, "annotation {k}"),
        }
    }
}

/// A checker expression: one row of the table in `config.md`.
#[derive(Clone, Debug, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum CheckerExpr {
    /// The pod's Ready condition is True.
    #[default]
    PodReady,
    /// The pod has no deletionTimestamp.
    NotTerminating,
    Include,
    Exclude,
    Abstain,
    /// The pod's label/annotation lists the Service port's name.
    PortNames(KeySource),
    TcpDial(TcpDialSpec),
    HttpGet(HttpGetSpec),
    All(Vec<CheckerExpr>),
    Any(Vec<CheckerExpr>),
    Not(Box<CheckerExpr>),
    PerPort(PerPortSpec),
    Stable(StableSpec),
    Wasm(WasmSpec),
}

/// `tcpDial: {timeout}`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TcpDialSpec {
    /// Defaults to 1s (kubelet's default probe timeout).
    #[serde(default = "default_probe_timeout", with = "duration_str")]
    pub timeout: Duration,
}

/// `httpGet: {path, timeout}`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpGetSpec {
    /// Absolute path with optional query; defaults to `/`.
    #[serde(default = "default_http_path")]
    pub path: String,
    /// Defaults to 1s.
    #[serde(default = "default_probe_timeout", with = "duration_str")]
    pub timeout: Duration,
}

fn default_probe_timeout() -> Duration {
    Duration::from_secs(1)
}
fn default_http_path() -> String {
    "/".to_owned()
}

/// `perPort: {ports: {NAME: E}, fallback: E}`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PerPortSpec {
    /// By Service port name. The key `""` addresses an unnamed port.
    pub ports: BTreeMap<String, CheckerExpr>,
    /// For ports not listed; `None` means `exclude`.
    #[serde(default)]
    pub fallback: Option<Box<CheckerExpr>>,
}

/// `stable: {checker, successThreshold, failureThreshold}`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StableSpec {
    pub checker: Box<CheckerExpr>,
    /// Consecutive includes needed to flip an excluded member in; default 1.
    #[serde(default = "one")]
    pub success_threshold: u32,
    /// Consecutive excludes needed to flip an included member out; default 3.
    #[serde(default = "three")]
    pub failure_threshold: u32,
}

fn one() -> u32 {
    1
}
fn three() -> u32 {
    3
}

/// `wasm: {module, config, sha256}`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WasmSpec {
    /// A file name inside `modulesDir` (no directories); a `.wasm.gz` is
    /// gunzipped on load. Or an OCI artifact,
    /// `oci://REGISTRY/REPOSITORY@sha256:DIGEST` (optionally `:TAG@sha256:…`),
    /// pulled at start ([`OciRef`]).
    pub module: String,
    /// Handed to the guest as JSON; `null` when absent.
    #[serde(default)]
    pub config: serde_json::Value,
    /// Pins the module's content: 64 hex digits (compare case-insensitively),
    /// the digest of the file as stored (compressed, for a `.wasm.gz`).
    #[serde(default)]
    pub sha256: Option<String>,
    /// Limits of this expression's guest calls, each defaulting to the
    /// runtime's (`portwise run --guest-deadline`, `--guest-memory-mib`, ...).
    #[serde(default)]
    pub limits: WasmLimits,
    /// Lets an `oci://` module name a tag without a digest: what runs then
    /// is whatever the tag points at when portwise starts.
    #[serde(default)]
    pub allow_tags: bool,
}

impl WasmSpec {
    /// The OCI reference, when `module` is `oci://...` (unvalidated: see
    /// [`OciRef::parse`]).
    pub fn oci(&self) -> Option<Result<OciRef, String>> {
        self.module
            .starts_with(OCI_SCHEME)
            .then(|| OciRef::parse(&self.module))
    }
}

/// The scheme of a module pulled from an OCI registry.
pub const OCI_SCHEME: &str = "oci://";

/// `oci://REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST]`, parsed.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct OciRef {
    /// Host, with its port if any (`registry.example:5000`).
    pub registry: String,
    /// `team/checkers/tier-check`: lowercase path components.
    pub repository: String,
    pub tag: Option<String>,
    /// 64 lowercase hex digits: the manifest's sha256.
    pub digest: Option<String>,
}

impl OciRef {
    /// Parses an `oci://` reference. A tag alone is accepted here;
    /// configuration validation refuses it without `allowTags`.
    pub fn parse(s: &str) -> Result<OciRef, String> {
        let rest = s
            .strip_prefix(OCI_SCHEME)
            .ok_or_else(|| format!("{s:?} does not start with {OCI_SCHEME}"))?;
        let (name, digest) = match rest.split_once('@') {
            Some((name, d)) => {
                let hex = d.strip_prefix("sha256:").ok_or_else(|| {
                    format!("digest {d:?} must be sha256:<64 hex digits> (the manifest's digest)")
                })?;
                if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(format!(
                        "digest {d:?} must be sha256:<64 hex digits> (the manifest's digest)"
                    ));
                }
                (name, Some(hex.to_ascii_lowercase()))
            }
            None => (rest, None),
        };
        let (registry, path) = name.split_once('/').ok_or_else(|| {
            format!("{s:?} must name a registry and a repository: oci://REGISTRY/REPOSITORY@sha256:DIGEST")
        })?;
        if registry.is_empty()
            || !registry
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
        {
            return Err(format!("{registry:?} is not a registry host[:port]"));
        }
        // A ':' after the last '/' starts the tag.
        let (repository, tag) = match path.rsplit_once(':') {
            Some((repo, tag)) if !tag.contains('/') => (repo, Some(tag.to_string())),
            _ => (path, None),
        };
        let component_ok = |c: &str| {
            !c.is_empty()
                && c.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
                && c.as_bytes()[0].is_ascii_alphanumeric()
        };
        if !repository.split('/').all(component_ok) {
            return Err(format!(
                "repository {repository:?} must be lowercase path components ([a-z0-9._-], separated by '/')"
            ));
        }
        if let Some(tag) = &tag
            && (tag.is_empty()
                || tag.len() > 128
                || !tag
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
                || tag.starts_with(['.', '-']))
        {
            return Err(format!("tag {tag:?} is not a valid OCI tag"));
        }
        if tag.is_none() && digest.is_none() {
            return Err(format!(
                "{s:?} names neither a digest nor a tag: add @sha256:<manifest digest>"
            ));
        }
        Ok(OciRef {
            registry: registry.to_string(),
            repository: repository.to_string(),
            tag,
            digest,
        })
    }

    /// `REGISTRY/REPOSITORY[:TAG][@sha256:DIGEST]`, as registries' clients
    /// write references.
    pub fn reference(&self) -> String {
        let mut s = format!("{}/{}", self.registry, self.repository);
        if let Some(t) = &self.tag {
            s.push(':');
            s.push_str(t);
        }
        if let Some(d) = &self.digest {
            s.push_str("@sha256:");
            s.push_str(d);
        }
        s
    }
}

impl std::fmt::Display for OciRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{OCI_SCHEME}{}", self.reference())
    }
}

/// `wasm: {limits: {deadline, callTimeout, memoryMiB, probesPerCall}}`: the
/// bounds of one expression's guest calls. What a key leaves out is the
/// runtime's default. Two expressions on one module may differ: instances
/// are kept apart by memory limit, and the rest applies per call.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WasmLimits {
    /// The guest's own compute time per call (probe time not counted).
    #[serde(default, with = "duration_opt")]
    pub deadline: Option<Duration>,
    /// Wall clock of a whole call, probes included.
    #[serde(default, with = "duration_opt")]
    pub call_timeout: Option<Duration>,
    /// Memory of one instance (per linear memory), in MiB.
    #[serde(default, rename = "memoryMiB")]
    pub memory_mib: Option<u64>,
    /// Probes one call may make; more are denied.
    #[serde(default)]
    pub probes_per_call: Option<u32>,
}

/// Bounds that keep a per-module limit meaningful: a deadline under a
/// millisecond cannot be measured by the host's 1 ms epoch ticks, and a
/// call longer than a minute would hold a reconcile (and its Service's
/// slices) hostage.
pub const WASM_MAX_CALL_TIMEOUT: Duration = Duration::from_secs(60);
pub const WASM_MAX_MEMORY_MIB: u64 = 4096;
pub const WASM_MAX_PROBES_PER_CALL: u32 = 256;

impl WasmLimits {
    fn validate(&self, path: &FieldPath) -> Result<(), Issue> {
        let ms = Duration::from_millis(1);
        if let Some(d) = self.deadline
            && !(ms..=WASM_MAX_CALL_TIMEOUT).contains(&d)
        {
            return Err(path
                .field("deadline")
                .issue(format!("must be between 1ms and 60s, got {d:?}")));
        }
        if let Some(t) = self.call_timeout
            && !(ms..=WASM_MAX_CALL_TIMEOUT).contains(&t)
        {
            return Err(path
                .field("callTimeout")
                .issue(format!("must be between 1ms and 60s, got {t:?}")));
        }
        if let (Some(d), Some(t)) = (self.deadline, self.call_timeout)
            && d > t
        {
            return Err(path.field("deadline").issue(format!(
                "{d:?} is longer than callTimeout {t:?}: the call would time out first"
            )));
        }
        if let Some(m) = self.memory_mib
            && !(1..=WASM_MAX_MEMORY_MIB).contains(&m)
        {
            return Err(path.field("memoryMiB").issue(format!(
                "must be between 1 and {WASM_MAX_MEMORY_MIB}, got {m}"
            )));
        }
        if let Some(n) = self.probes_per_call
            && n > WASM_MAX_PROBES_PER_CALL
        {
            return Err(path.field("probesPerCall").issue(format!(
                "must be at most {WASM_MAX_PROBES_PER_CALL}, got {n}"
            )));
        }
        Ok(())
    }
}

/// Optional humantime durations.
mod duration_opt {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        #[derive(Deserialize)]
        struct Wrapped(#[serde(with = "super::duration_str")] Duration);
        Ok(Option::<Wrapped>::deserialize(d)?.map(|Wrapped(d)| d))
    }
}

/// Durations as humantime strings (`500ms`, `1s`, `2m`).
mod duration_str {
    use std::{fmt, time::Duration};

    use serde::de::{self, Deserializer, Visitor};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Duration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration such as 500ms, 1s or 2m")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Duration, E> {
                humantime::parse_duration(s.trim())
                    .map_err(|e| E::custom(format!("invalid duration {s:?}: {e}")))
            }
        }
        d.deserialize_str(V)
    }
}

/// [`duration_str`] for an optional field (absent: `None`).
mod optional_duration_str {
    use std::time::Duration;

    use serde::de::Deserializer;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        super::duration_str::deserialize(d).map(Some)
    }
}

/// A problem found in a configuration, with the path of the field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {}: {source}", file.display())]
    Read {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}", DisplayInvalid(self))]
    Invalid {
        /// The file, when loaded with [`Config::load`].
        file: Option<PathBuf>,
        /// `membership.perPort.ports.http.httpGet.timeout`; `.` for the root.
        path: String,
        message: String,
        /// 1-based position in the YAML text, when the parser knows it.
        line: Option<u64>,
        column: Option<u64>,
    },
}

impl ConfigError {
    /// The path of the offending field, if the error is about one.
    pub fn field_path(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { path, .. } => Some(path),
            ConfigError::Read { .. } => None,
        }
    }

    fn in_file(self, name: &Path) -> Self {
        match self {
            ConfigError::Invalid {
                path,
                message,
                line,
                column,
                ..
            } => ConfigError::Invalid {
                file: Some(name.to_owned()),
                path,
                message,
                line,
                column,
            },
            other => other,
        }
    }
}

struct DisplayInvalid<'a>(&'a ConfigError);

impl fmt::Display for DisplayInvalid<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ConfigError::Invalid {
            file,
            path,
            message,
            line,
            column,
        } = self.0
        else {
            return Ok(());
        };
        if let Some(file) = file {
            write!(f, "{}: ", file.display())?;
        }
        write!(f, "{path}: {message}")?;
        match (line, column) {
            (Some(l), Some(c)) => write!(f, " (line {l}, column {c})"),
            (Some(l), None) => write!(f, " (line {l})"),
            _ => Ok(()),
        }
    }
}

impl Config {
    /// Parses and validates a configuration from YAML text.
    pub fn from_yaml(text: &str) -> Result<Config, ConfigError> {
        let config = parse(text)?;
        config.validate()?;
        Ok(config)
    }

    /// Reads, parses and validates a configuration file. Errors name the file
    /// and the field.
    pub fn load(file: impl AsRef<Path>) -> Result<Config, ConfigError> {
        let file = file.as_ref();
        let text = std::fs::read_to_string(file).map_err(|source| ConfigError::Read {
            file: file.to_owned(),
            source,
        })?;
        Config::from_yaml(&text).map_err(|e| e.in_file(file))
    }

    /// A configuration with every default and the given service key (the
    /// minimal valid file is `serviceKey: {...}`).
    pub fn with_service_key(service_key: KeySource) -> Config {
        Config {
            managed_by: default_managed_by(),
            service_key,
            pod_key: None,
            resync_period: default_resync_period(),
            abstain_limit: None,
            max_endpoints_per_slice: default_max_endpoints_per_slice(),
            max_concurrent_checks: default_max_concurrent_checks(),
            native_cleanup: true,
            publish_legacy_endpoints: false,
            disable_node_lookups: false,
            modules_dir: None,
            registry_auth: None,
            registry_ca: None,
            max_module_bytes: DEFAULT_MAX_MODULE_BYTES,
            module_signatures: None,
            membership: CheckerExpr::default(),
            shadow: None,
        }
    }

    /// Every `wasm` expression of the file: the live membership's and the
    /// shadows'. What has to be pulled and sized for at start.
    pub fn all_wasm_specs(&self) -> Vec<&WasmSpec> {
        let mut out = self.membership.wasm_specs();
        if let Some(sh) = &self.shadow {
            out.extend(sh.membership.iter().flat_map(|m| m.wasm_specs()));
            out.extend(sh.expressions.values().flat_map(|e| e.wasm_specs()));
        }
        out
    }

    /// How long an abstain keeps what was published (`abstainLimit`).
    pub fn abstain_limit(&self) -> Duration {
        self.abstain_limit
            .unwrap_or_else(|| default_abstain_limit(self.resync_period))
    }

    /// The key pods join a group by (`podKey`, defaulting to `serviceKey`).
    pub fn pod_key(&self) -> &KeySource {
        self.pod_key.as_ref().unwrap_or(&self.service_key)
    }

    /// Checks everything the parser cannot: ranges, key syntax, names, and
    /// that `wasm` checkers have a `modulesDir`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_inner().map_err(Issue::into_error)
    }

    fn validate_inner(&self) -> Result<(), Issue> {
        let root = FieldPath::root();

        let p = root.field("managedBy");
        if NATIVE_MANAGERS.contains(&self.managed_by.as_str()) {
            return Err(p.issue(format!(
                "{:?} belongs to a native Kubernetes controller; pick a value of your own",
                self.managed_by
            )));
        }
        if self.managed_by.is_empty() {
            return Err(p.issue("must not be empty"));
        }
        check_label_value(&self.managed_by).map_err(|m| p.issue(m))?;

        self.service_key.validate(&root.field("serviceKey"))?;
        if let Some(k) = &self.pod_key {
            k.validate(&root.field("podKey"))?;
        }
        if let Some(limit) = self.abstain_limit
            && limit < self.resync_period
        {
            return Err(root.field("abstainLimit").issue(format!(
                "must be at least resyncPeriod ({}): an abstain is re-checked once a period",
                humantime::format_duration(self.resync_period)
            )));
        }
        if self.resync_period < MIN_RESYNC_PERIOD {
            return Err(root.field("resyncPeriod").issue(format!(
                "must be at least {}",
                humantime::format_duration(MIN_RESYNC_PERIOD)
            )));
        }
        if !(1..=MAX_ENDPOINTS_PER_SLICE).contains(&self.max_endpoints_per_slice) {
            return Err(root.field("maxEndpointsPerSlice").issue(format!(
                "must be between 1 and {MAX_ENDPOINTS_PER_SLICE}, got {}",
                self.max_endpoints_per_slice
            )));
        }
        if self.max_concurrent_checks == 0 {
            return Err(root
                .field("maxConcurrentChecks")
                .issue("must be at least 1"));
        }
        if let Some(dir) = &self.modules_dir
            && dir.as_os_str().is_empty()
        {
            return Err(root.field("modulesDir").issue("must not be empty"));
        }
        if self.max_module_bytes == 0 {
            return Err(root.field("maxModuleBytes").issue("must be at least 1"));
        }
        if let Some(sigs) = &self.module_signatures {
            let keys = root.field("moduleSignatures").field("keys");
            if sigs.keys.is_empty() {
                return Err(keys.issue(
                    "name at least one public key file (cosign.pub); to accept unsigned \
                     modules, leave moduleSignatures out",
                ));
            }
            if let Some(i) = sigs.keys.iter().position(|k| k.as_os_str().is_empty()) {
                return Err(keys.index(i).issue("must not be empty"));
            }
        }
        self.membership
            .validate(&root.field("membership"), self.modules_dir.is_some())?;
        if let Some(shadow) = &self.shadow {
            let p = root.field("shadow");
            check_qualified_name(&shadow.annotation).map_err(|m| p.field("annotation").issue(m))?;
            if let Some(m) = &shadow.membership {
                m.validate(&p.field("membership"), self.modules_dir.is_some())?;
            }
            let named = p.field("expressions");
            for (name, expr) in &shadow.expressions {
                let at = named.field(name);
                check_dns_label(name).map_err(|m| at.issue(format!("not a shadow name: {m}")))?;
                if name == "none" {
                    return Err(at.issue("`none` is reserved: it turns the shadow off"));
                }
                expr.validate(&at, self.modules_dir.is_some())?;
            }
        }
        Ok(())
    }
}

impl CheckerExpr {
    /// Validates this expression as if it sat at `path` (e.g. `membership`).
    /// `has_modules_dir` says whether `wasm` expressions can be loaded.
    pub fn validate_at(&self, path: &str, has_modules_dir: bool) -> Result<(), ConfigError> {
        self.validate(&FieldPath(path.to_owned()), has_modules_dir)
            .map_err(Issue::into_error)
    }

    fn validate(&self, path: &FieldPath, has_modules_dir: bool) -> Result<(), Issue> {
        match self {
            CheckerExpr::PodReady
            | CheckerExpr::NotTerminating
            | CheckerExpr::Include
            | CheckerExpr::Exclude
            | CheckerExpr::Abstain => Ok(()),
            CheckerExpr::PortNames(key) => key.validate(&path.field("portNames")),
            CheckerExpr::TcpDial(spec) => check_timeout(spec.timeout)
                .map_err(|m| path.field("tcpDial").field("timeout").issue(m)),
            CheckerExpr::HttpGet(spec) => {
                let p = path.field("httpGet");
                validate_path(&spec.path).map_err(|m| p.field("path").issue(m))?;
                check_timeout(spec.timeout).map_err(|m| p.field("timeout").issue(m))
            }
            CheckerExpr::All(children) | CheckerExpr::Any(children) => {
                let p = path.field(if matches!(self, CheckerExpr::All(_)) {
                    "all"
                } else {
                    "any"
                });
                children
                    .iter()
                    .enumerate()
                    .try_for_each(|(i, c)| c.validate(&p.index(i), has_modules_dir))
            }
            CheckerExpr::Not(inner) => inner.validate(&path.field("not"), has_modules_dir),
            CheckerExpr::PerPort(spec) => {
                let p = path.field("perPort");
                let ports = p.field("ports");
                for (name, expr) in &spec.ports {
                    let at = ports.field(name);
                    if !name.is_empty() {
                        check_dns_label(name)
                            .map_err(|m| at.issue(format!("not a Service port name: {m}")))?;
                    }
                    expr.validate(&at, has_modules_dir)?;
                }
                match &spec.fallback {
                    Some(f) => f.validate(&p.field("fallback"), has_modules_dir),
                    None => Ok(()),
                }
            }
            CheckerExpr::Stable(spec) => {
                let p = path.field("stable");
                if spec.success_threshold == 0 {
                    return Err(p.field("successThreshold").issue("must be at least 1"));
                }
                if spec.failure_threshold == 0 {
                    return Err(p.field("failureThreshold").issue("must be at least 1"));
                }
                spec.checker.validate(&p.field("checker"), has_modules_dir)
            }
            CheckerExpr::Wasm(spec) => {
                let p = path.field("wasm");
                let oci = match spec.oci() {
                    Some(parsed) => Some(parsed.map_err(|m| p.field("module").issue(m))?),
                    None => {
                        check_module_file_name(&spec.module)
                            .map_err(|m| p.field("module").issue(m))?;
                        None
                    }
                };
                if let Some(r) = &oci
                    && r.digest.is_none()
                    && !spec.allow_tags
                {
                    return Err(p.field("module").issue(format!(
                        "{} names a tag without a digest: a tag can move, so what runs would \
                         depend on when portwise starts; pin it (:{}@sha256:<manifest digest>) \
                         or set allowTags: true",
                        spec.module,
                        r.tag.as_deref().unwrap_or_default()
                    )));
                }
                if spec.allow_tags && oci.is_none() {
                    return Err(p.field("allowTags").issue("only applies to oci:// modules"));
                }
                if let Some(sum) = &spec.sha256
                    && (sum.len() != 64 || !sum.bytes().all(|b| b.is_ascii_hexdigit()))
                {
                    return Err(p.field("sha256").issue(format!(
                        "must be 64 hexadecimal digits (a SHA-256 digest), got {sum:?}"
                    )));
                }
                spec.limits.validate(&p.field("limits"))?;
                if oci.is_none() && !has_modules_dir {
                    return Err(p.issue("a wasm checker needs `modulesDir` to be set"));
                }
                Ok(())
            }
        }
    }

    /// Every `wasm` expression in this tree, depth first.
    pub fn wasm_specs(&self) -> Vec<&WasmSpec> {
        fn walk<'a>(e: &'a CheckerExpr, out: &mut Vec<&'a WasmSpec>) {
            match e {
                CheckerExpr::Wasm(spec) => out.push(spec),
                CheckerExpr::All(xs) | CheckerExpr::Any(xs) => xs.iter().for_each(|x| walk(x, out)),
                CheckerExpr::Not(x) => walk(x, out),
                CheckerExpr::Stable(s) => walk(&s.checker, out),
                CheckerExpr::PerPort(p) => {
                    p.ports.values().for_each(|x| walk(x, out));
                    if let Some(f) = &p.fallback {
                        walk(f, out);
                    }
                }
                _ => {}
            }
        }
        let mut out = Vec::new();
        walk(self, &mut out);
        out
    }

    /// The expression's keyword (`podReady`, `all`, ...), for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            CheckerExpr::PodReady => "podReady",
            CheckerExpr::NotTerminating => "notTerminating",
            CheckerExpr::Include => "include",
            CheckerExpr::Exclude => "exclude",
            CheckerExpr::Abstain => "abstain",
            CheckerExpr::PortNames(_) => "portNames",
            CheckerExpr::TcpDial(_) => "tcpDial",
            CheckerExpr::HttpGet(_) => "httpGet",
            CheckerExpr::All(_) => "all",
            CheckerExpr::Any(_) => "any",
            CheckerExpr::Not(_) => "not",
            CheckerExpr::PerPort(_) => "perPort",
            CheckerExpr::Stable(_) => "stable",
            CheckerExpr::Wasm(_) => "wasm",
        }
    }
}

/// A field path in serde_path_to_error's syntax: `a.b[2].c`.
#[derive(Clone, Debug)]
struct FieldPath(String);

impl FieldPath {
    fn root() -> Self {
        FieldPath(String::new())
    }
    fn field(&self, name: &str) -> Self {
        if self.0.is_empty() {
            FieldPath(name.to_owned())
        } else {
            FieldPath(format!("{}.{name}", self.0))
        }
    }
    fn index(&self, i: usize) -> Self {
        FieldPath(format!("{}[{i}]", self.0))
    }
    fn issue(&self, message: impl Into<String>) -> Issue {
        Issue {
            path: self.clone(),
            message: message.into(),
        }
    }
}

struct Issue {
    path: FieldPath,
    message: String,
}

impl Issue {
    fn into_error(self) -> ConfigError {
        ConfigError::Invalid {
            file: None,
            path: if self.path.0.is_empty() {
                ".".to_owned()
            } else {
                self.path.0
            },
            message: self.message,
            line: None,
            column: None,
        }
    }
}

/// YAML → [`Config`] with path tracking, no semantic checks.
fn parse(text: &str) -> Result<Config, ConfigError> {
    let mut track = serde_path_to_error::Track::new();
    // Real files nest about a dozen levels. The parser's default depth
    // budget (64) is more than a 2 MiB thread stack (a test thread, a
    // tokio worker) can deserialize into nested checker expressions in a
    // debug build, about 32 KiB per level: refuse at MAX_NESTING instead
    // of overflowing the stack (docs/reliability.md).
    let mut budget = serde_saphyr::Budget::default();
    budget.max_depth = MAX_NESTING;
    let options = serde_saphyr::options! { with_snippet: false, budget: Some(budget) };
    let result = serde_saphyr::with_deserializer_from_str_with_options(text, options, |de| {
        Config::deserialize(serde_path_to_error::Deserializer::new(de, &mut track))
    });
    result.map_err(|err| {
        let location = err.location().filter(|l| l.line() > 0);
        ConfigError::Invalid {
            file: None,
            path: tidy_path(&track.path().to_string()),
            message: saphyr_message(&err),
            line: location.map(|l| l.line()),
            column: location.map(|l| l.column()),
        }
    })
}

/// serde_path_to_error writes `?` for a map key it has not read yet (e.g.
/// a duplicate key); the enclosing map is the useful path then.
fn tidy_path(path: &str) -> String {
    let trimmed = path
        .strip_suffix(".?")
        .or_else(|| path.strip_suffix('?'))
        .unwrap_or(path);
    if trimmed.is_empty() {
        ".".to_owned()
    } else {
        trimmed.to_owned()
    }
}

/// The parser's message in our words where its own are about its internals,
/// without its location suffix (we print ours).
fn saphyr_message(err: &serde_saphyr::Error) -> String {
    use serde_saphyr::Error as E;
    match err.without_snippet() {
        E::ExpectedMappingEndAfterEnumVariantValue { .. } => {
            return "this map must have exactly one key".to_owned();
        }
        E::ExternallyTaggedEnumExpectedScalarOrMapping { .. } => {
            return "expected a word (e.g. podReady) or a map with exactly one key".to_owned();
        }
        _ => {}
    }
    let text = err.without_snippet().to_string();
    let text = text
        .rfind(" at line ")
        .map_or(text.as_str(), |i| &text[..i]);
    text.replace(", set DuplicateKeyPolicy in Options if acceptable", "")
}

// ---- Kubernetes name syntax (apimachinery's validation, restated) ----

fn is_alnum(b: u8) -> bool {
    b.is_ascii_alphanumeric()
}

/// `(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?`, at most 63 characters.
pub fn check_label_value(v: &str) -> Result<(), String> {
    if v.len() > 63 {
        return Err(format!("{v:?} is longer than 63 characters"));
    }
    if v.is_empty() {
        return Ok(());
    }
    let b = v.as_bytes();
    let inner_ok = b
        .iter()
        .all(|&c| is_alnum(c) || matches!(c, b'-' | b'_' | b'.'));
    if !inner_ok || !is_alnum(b[0]) || !is_alnum(b[b.len() - 1]) {
        return Err(format!(
            "{v:?} is not a valid label value: alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric"
        ));
    }
    Ok(())
}

/// A label or annotation key: `[prefix/]name`, prefix a DNS-1123 subdomain,
/// name as a non-empty label value.
pub fn check_qualified_name(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if name.is_empty() {
        return Err(format!(
            "{key:?} is not a valid key: the name part must not be empty"
        ));
    }
    check_label_value(name).map_err(|m| format!("{key:?} is not a valid key: {m}"))?;
    if let Some(p) = prefix {
        check_dns_subdomain(p).map_err(|m| format!("{key:?} is not a valid key: prefix {m}"))?;
    }
    Ok(())
}

/// RFC 1123 subdomain: dot-separated labels, lowercase, at most 253 chars.
pub fn check_dns_subdomain(v: &str) -> Result<(), String> {
    if v.is_empty() || v.len() > 253 {
        return Err(format!("{v:?} must be 1 to 253 characters"));
    }
    for part in v.split('.') {
        check_dns_label(part)
            .map_err(|_| format!("{v:?} is not a lowercase RFC 1123 subdomain"))?;
    }
    Ok(())
}

/// RFC 1123 label: `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 chars.
pub fn check_dns_label(v: &str) -> Result<(), String> {
    let b = v.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-';
    if ok {
        Ok(())
    } else {
        Err(format!("{v:?} is not a lowercase RFC 1123 label"))
    }
}

fn check_timeout(t: Duration) -> Result<(), String> {
    if t.is_zero() {
        return Err("must be greater than 0".to_owned());
    }
    if t > MAX_PROBE_TIMEOUT {
        return Err(format!(
            "{} is above the maximum of {}",
            humantime::format_duration(t),
            humantime::format_duration(MAX_PROBE_TIMEOUT)
        ));
    }
    Ok(())
}

/// A module is named by a plain file name inside `modulesDir`: no
/// directories, so a configuration cannot load code from elsewhere.
fn check_module_file_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".to_owned());
    }
    if name == "." || name == ".." || name.contains(['/', '\\', '\0']) {
        return Err(format!(
            "{name:?} must be a plain file name inside modulesDir (no '/', no '..')"
        ));
    }
    if name.starts_with("..") {
        // `..data` and friends are the kubelet's atomic-swap internals.
        return Err(format!("{name:?} must not start with '..'"));
    }
    Ok(())
}

/// Checks that `path` can be sent as the request target: absolute
/// (`/...`), optional query, no whitespace or control characters.
///
/// Here rather than in `portwise-probe` because configuration is validated
/// with it too; the probe refuses the same paths at request time (a guest can
/// ask for any path), so both get the same rule and message.
pub fn validate_path(path: &str) -> Result<(), String> {
    if !path.starts_with('/') {
        return Err(format!("path {path:?} must start with '/'"));
    }
    if path.starts_with("//") {
        // `//host/x` parses as an authority form in some stacks.
        return Err(format!("path {path:?} must not start with '//'"));
    }
    if path.contains('#') {
        return Err(format!("path {path:?} must not contain a fragment ('#')"));
    }
    match path.parse::<http::Uri>() {
        Ok(uri) if uri.scheme().is_none() && uri.authority().is_none() => Ok(()),
        Ok(_) => Err(format!("path {path:?} is not an origin-form path")),
        Err(e) => Err(format!("path {path:?} is not a valid request path: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED_EXAMPLE: &str = r#"
managedBy: portwise
serviceKey: {annotation: port-mapper.example.com/group}
modulesDir: /etc/portwise/modules
membership:
  perPort:
    ports:
      http:  {all: [podReady, {httpGet: {path: /healthz, timeout: 1s}}]}
      https: {tcpDial: {timeout: 1s}}
      admin: {wasm: {module: admin-check.wasm, config: {minReplicas: 2}}}
    fallback: {all: [podReady, {portNames: {annotation: port-mapper.example.com/ports}}]}
"#;

    const FULL_HEADER: &str = r#"
managedBy: portwise             # managed-by label value and field owner
serviceKey:
  annotation: example.com/group
podKey:
  annotation: example.com/group
resyncPeriod: 30s
maxEndpointsPerSlice: 100
maxConcurrentChecks: 16
nativeCleanup: true
publishLegacyEndpoints: false
disableNodeLookups: false
modulesDir: /etc/portwise/modules
membership: podReady
"#;

    fn err(yaml: &str) -> ConfigError {
        match Config::from_yaml(yaml) {
            Ok(c) => panic!("expected an error, parsed {c:#?}"),
            Err(e) => e,
        }
    }

    /// Asserts the error names `path` (and the message contains `needle`).
    fn assert_err(yaml: &str, path: &str, needle: &str) {
        let e = err(yaml);
        let shown = e.to_string();
        assert_eq!(e.field_path(), Some(path), "{shown}");
        assert!(shown.starts_with(&format!("{path}: ")), "{shown}");
        assert!(shown.contains(needle), "{shown:?} lacks {needle:?}");
    }

    fn with_membership(m: &str) -> String {
        format!("serviceKey: {{label: group}}\nmodulesDir: /m\nmembership: {m}\n")
    }

    #[test]
    fn seed_example_parses() {
        let c = Config::from_yaml(SEED_EXAMPLE).unwrap();
        assert_eq!(c.managed_by, "portwise");
        assert_eq!(
            c.service_key,
            KeySource::Annotation("port-mapper.example.com/group".into())
        );
        assert_eq!(c.pod_key(), &c.service_key);
        let CheckerExpr::PerPort(pp) = &c.membership else {
            panic!("{:?}", c.membership)
        };
        assert_eq!(
            pp.ports.keys().collect::<Vec<_>>(),
            ["admin", "http", "https"]
        );
        assert_eq!(
            pp.ports["http"],
            CheckerExpr::All(vec![
                CheckerExpr::PodReady,
                CheckerExpr::HttpGet(HttpGetSpec {
                    path: "/healthz".into(),
                    timeout: Duration::from_secs(1)
                }),
            ])
        );
        assert_eq!(
            pp.ports["https"],
            CheckerExpr::TcpDial(TcpDialSpec {
                timeout: Duration::from_secs(1)
            })
        );
        assert_eq!(
            pp.ports["admin"],
            CheckerExpr::Wasm(WasmSpec {
                module: "admin-check.wasm".into(),
                config: serde_json::json!({"minReplicas": 2}),
                sha256: None,
                limits: WasmLimits::default(),
                allow_tags: false,
            })
        );
        assert_eq!(
            pp.fallback.as_deref(),
            Some(&CheckerExpr::All(vec![
                CheckerExpr::PodReady,
                CheckerExpr::PortNames(KeySource::Annotation(
                    "port-mapper.example.com/ports".into()
                )),
            ]))
        );
    }

    #[test]
    fn full_header_parses_with_every_field() {
        let c = Config::from_yaml(FULL_HEADER).unwrap();
        assert_eq!(
            c,
            Config {
                pod_key: Some(KeySource::Annotation("example.com/group".into())),
                modules_dir: Some("/etc/portwise/modules".into()),
                ..Config::with_service_key(KeySource::Annotation("example.com/group".into()))
            }
        );
    }

    #[test]
    fn defaults() {
        let c = Config::from_yaml("serviceKey: {label: app.example.com/group}").unwrap();
        assert_eq!(
            c,
            Config::with_service_key(KeySource::Label("app.example.com/group".into()))
        );
        assert_eq!(c.managed_by, "portwise");
        assert_eq!(c.resync_period, Duration::from_secs(30));
        assert_eq!(c.abstain_limit(), Duration::from_secs(300));
        assert_eq!(
            (c.max_endpoints_per_slice, c.max_concurrent_checks),
            (100, 16)
        );
        assert!(c.native_cleanup && !c.publish_legacy_endpoints && !c.disable_node_lookups);
        assert_eq!(c.membership, CheckerExpr::PodReady);
        assert_eq!(
            c.pod_key(),
            &KeySource::Label("app.example.com/group".into())
        );
    }

    #[test]
    fn every_checker_row_parses() {
        let wasm = format!("{{wasm: {{module: a.wasm, sha256: {}}}}}", "aB".repeat(32));
        let cases: Vec<(&str, CheckerExpr)> = vec![
            ("podReady", CheckerExpr::PodReady),
            ("notTerminating", CheckerExpr::NotTerminating),
            ("include", CheckerExpr::Include),
            ("exclude", CheckerExpr::Exclude),
            ("abstain", CheckerExpr::Abstain),
            (
                "{portNames: {label: ports}}",
                CheckerExpr::PortNames(KeySource::Label("ports".into())),
            ),
            (
                "{tcpDial: {timeout: 500ms}}",
                CheckerExpr::TcpDial(TcpDialSpec {
                    timeout: Duration::from_millis(500),
                }),
            ),
            (
                "{tcpDial: {}}",
                CheckerExpr::TcpDial(TcpDialSpec {
                    timeout: Duration::from_secs(1),
                }),
            ),
            (
                "{httpGet: {path: '/ready?x=1', timeout: 2s}}",
                CheckerExpr::HttpGet(HttpGetSpec {
                    path: "/ready?x=1".into(),
                    timeout: Duration::from_secs(2),
                }),
            ),
            ("{all: []}", CheckerExpr::All(vec![])),
            (
                "{any: [include, exclude]}",
                CheckerExpr::Any(vec![CheckerExpr::Include, CheckerExpr::Exclude]),
            ),
            (
                "{not: abstain}",
                CheckerExpr::Not(Box::new(CheckerExpr::Abstain)),
            ),
            (
                "{not: {not: podReady}}",
                CheckerExpr::Not(Box::new(CheckerExpr::Not(Box::new(CheckerExpr::PodReady)))),
            ),
            (
                "{perPort: {ports: {web: include}}}",
                CheckerExpr::PerPort(PerPortSpec {
                    ports: [("web".to_owned(), CheckerExpr::Include)].into(),
                    fallback: None,
                }),
            ),
            (
                "{stable: {checker: podReady, successThreshold: 2, failureThreshold: 3}}",
                CheckerExpr::Stable(StableSpec {
                    checker: Box::new(CheckerExpr::PodReady),
                    success_threshold: 2,
                    failure_threshold: 3,
                }),
            ),
            (
                "{stable: {checker: podReady}}",
                CheckerExpr::Stable(StableSpec {
                    checker: Box::new(CheckerExpr::PodReady),
                    success_threshold: 1,
                    failure_threshold: 3,
                }),
            ),
            (
                &wasm,
                CheckerExpr::Wasm(WasmSpec {
                    module: "a.wasm".into(),
                    config: serde_json::Value::Null,
                    sha256: Some("aB".repeat(32)),
                    limits: WasmLimits::default(),
                    allow_tags: false,
                }),
            ),
        ];
        for (yaml, want) in cases {
            let c =
                Config::from_yaml(&with_membership(yaml)).unwrap_or_else(|e| panic!("{yaml}: {e}"));
            assert_eq!(c.membership, want, "{yaml}");
        }
    }

    #[test]
    fn block_style_yaml_parses() {
        let yaml = r#"
serviceKey:
  label: group
membership:
  any:
    - not: podReady
    - httpGet:
        path: /healthz
        timeout: 250ms
"#;
        let c = Config::from_yaml(yaml).unwrap();
        assert_eq!(
            c.membership,
            CheckerExpr::Any(vec![
                CheckerExpr::Not(Box::new(CheckerExpr::PodReady)),
                CheckerExpr::HttpGet(HttpGetSpec {
                    path: "/healthz".into(),
                    timeout: Duration::from_millis(250)
                }),
            ])
        );
    }

    // ---- one test per kind of bad input ----

    #[test]
    fn bad_duration_names_its_path() {
        let yaml = r#"
serviceKey: {annotation: g}
membership:
  perPort:
    ports:
      http: {httpGet: {path: /x, timeout: 1x}}
"#;
        assert_err(
            yaml,
            "membership.perPort.ports.http.httpGet.timeout",
            r#"invalid duration "1x""#,
        );
        assert_err(
            "serviceKey: {label: g}\nresyncPeriod: soon",
            "resyncPeriod",
            "invalid duration \"soon\"",
        );
        assert_err(
            "serviceKey: {label: g}\nresyncPeriod: 10",
            "resyncPeriod",
            "invalid duration",
        );
    }

    #[test]
    fn bad_duration_reports_line() {
        let e = err("serviceKey: {label: g}\nresyncPeriod: soon\n");
        assert!(e.to_string().contains("(line 2"), "{e}");
    }

    #[test]
    fn unknown_top_level_key() {
        assert_err(
            "serviceKey: {label: g}\nresyncPeriodd: 1s",
            "resyncPeriodd",
            "unknown field",
        );
    }

    #[test]
    fn unknown_key_inside_checker() {
        assert_err(
            &with_membership("{httpGet: {path: /, timout: 1s}}"),
            "membership.httpGet.timout",
            "unknown field",
        );
        assert_err(
            &with_membership("{stable: {checker: podReady, successTreshold: 2}}"),
            "membership.stable.successTreshold",
            "unknown field",
        );
    }

    #[test]
    fn unknown_checker_name() {
        assert_err(&with_membership("podready"), "membership", "podready");
        assert_err(
            &with_membership("{all: [podReady, {tcpdial: {}}]}"),
            "membership.all[1]",
            "tcpdial",
        );
    }

    #[test]
    fn checker_map_with_two_keys() {
        assert_err(
            &with_membership("{not: podReady, all: []}"),
            "membership.not",
            "exactly one key",
        );
        assert_err(
            &with_membership("{tcpDial: {timeout: 1s}, httpGet: {path: /}}"),
            "membership.tcpDial",
            "exactly one key",
        );
    }

    #[test]
    fn checker_of_wrong_shape() {
        // A list where an expression is expected.
        assert_err(
            &with_membership("[podReady]"),
            "membership",
            "a word (e.g. podReady) or a map",
        );
        // A scalar where a list is expected.
        let e = err(&with_membership("{all: podReady}"));
        assert_eq!(e.field_path(), Some("membership.all"), "{e}");
    }

    #[test]
    fn missing_required_fields() {
        assert_err("managedBy: portwise", ".", "serviceKey");
        assert_err(
            &with_membership("{stable: {successThreshold: 2}}"),
            "membership.stable",
            "checker",
        );
        assert_err(
            &with_membership("{perPort: {fallback: include}}"),
            "membership.perPort",
            "ports",
        );
        assert_err(
            &with_membership("{wasm: {config: 1}}"),
            "membership.wasm",
            "module",
        );
    }

    #[test]
    fn key_source_needs_exactly_one_of_label_or_annotation() {
        assert_err(
            "serviceKey: {label: a, annotation: b}",
            "serviceKey.label",
            "exactly one key",
        );
        assert_err("serviceKey: {name: a}", "serviceKey", "name");
        assert_err("serviceKey: a", "serviceKey", "");
    }

    #[test]
    fn key_syntax_is_validated() {
        assert_err(
            "serviceKey: {label: 'bad key'}",
            "serviceKey.label",
            "not a valid key",
        );
        assert_err(
            "serviceKey: {label: g}\npodKey: {annotation: 'UPPER.example.com/x'}",
            "podKey.annotation",
            "prefix",
        );
        assert_err(
            "serviceKey: {annotation: 'example.com/'}",
            "serviceKey.annotation",
            "name part",
        );
        assert_err(
            &with_membership("{portNames: {annotation: '-x'}}"),
            "membership.portNames.annotation",
            "not a valid key",
        );
        for good in [
            "g",
            "example.com/group",
            "a.b-c/d_e.f",
            "port-mapper.example.com/ports",
        ] {
            assert_eq!(check_qualified_name(good), Ok(()), "{good}");
        }
    }

    #[test]
    fn managed_by_must_not_be_native_and_must_be_a_label_value() {
        for native in NATIVE_MANAGERS {
            assert_err(
                &format!("managedBy: {native}\nserviceKey: {{label: g}}"),
                "managedBy",
                "native Kubernetes controller",
            );
        }
        assert_err(
            "managedBy: 'has space'\nserviceKey: {label: g}",
            "managedBy",
            "label value",
        );
        assert_err(
            &format!("managedBy: {}\nserviceKey: {{label: g}}", "a".repeat(64)),
            "managedBy",
            "63",
        );
        assert_err(
            "managedBy: ''\nserviceKey: {label: g}",
            "managedBy",
            "empty",
        );
    }

    #[test]
    fn numeric_ranges() {
        assert_err(
            "serviceKey: {label: g}\nmaxEndpointsPerSlice: 0",
            "maxEndpointsPerSlice",
            "between 1 and 1000",
        );
        assert_err(
            "serviceKey: {label: g}\nmaxEndpointsPerSlice: 1001",
            "maxEndpointsPerSlice",
            "1001",
        );
        assert_err(
            "serviceKey: {label: g}\nmaxEndpointsPerSlice: -1",
            "maxEndpointsPerSlice",
            "",
        );
        assert_err(
            "serviceKey: {label: g}\nmaxConcurrentChecks: 0",
            "maxConcurrentChecks",
            "at least 1",
        );
        assert_err(
            "serviceKey: {label: g}\nresyncPeriod: 1ms",
            "resyncPeriod",
            "at least",
        );
        assert_err(
            "serviceKey: {label: g}\nnativeCleanup: maybe",
            "nativeCleanup",
            "",
        );
        Config::from_yaml("serviceKey: {label: g}\nmaxEndpointsPerSlice: 1000").unwrap();
        Config::from_yaml("serviceKey: {label: g}\nmaxEndpointsPerSlice: 1").unwrap();
    }

    #[test]
    fn thresholds_at_least_one() {
        assert_err(
            &with_membership("{stable: {checker: podReady, successThreshold: 0}}"),
            "membership.stable.successThreshold",
            "at least 1",
        );
        assert_err(
            &with_membership("{any: [{stable: {checker: podReady, failureThreshold: 0}}]}"),
            "membership.any[0].stable.failureThreshold",
            "at least 1",
        );
    }

    #[test]
    fn http_path_must_be_absolute() {
        assert_err(
            &with_membership("{httpGet: {path: healthz}}"),
            "membership.httpGet.path",
            "start with '/'",
        );
        assert_err(
            &with_membership("{httpGet: {path: '/a b'}}"),
            "membership.httpGet.path",
            "",
        );
    }

    #[test]
    fn timeouts_positive_and_capped() {
        assert_err(
            &with_membership("{tcpDial: {timeout: 0s}}"),
            "membership.tcpDial.timeout",
            "greater than 0",
        );
        assert_err(
            &with_membership("{httpGet: {path: /, timeout: 2h}}"),
            "membership.httpGet.timeout",
            "maximum",
        );
    }

    #[test]
    fn sha256_must_be_64_hex() {
        assert_err(
            &with_membership("{wasm: {module: a.wasm, sha256: abc}}"),
            "membership.wasm.sha256",
            "64 hexadecimal",
        );
        assert_err(
            &with_membership(&format!(
                "{{wasm: {{module: a.wasm, sha256: {}}}}}",
                "g".repeat(64)
            )),
            "membership.wasm.sha256",
            "64 hexadecimal",
        );
    }

    #[test]
    fn wasm_module_is_a_plain_file_name() {
        for bad in ["../x.wasm", "dir/x.wasm", "/abs.wasm", "..", "..data", "''"] {
            let m = if bad == "''" {
                bad.to_owned()
            } else {
                format!("'{bad}'")
            };
            assert_err(
                &with_membership(&format!("{{wasm: {{module: {m}}}}}")),
                "membership.wasm.module",
                "",
            );
        }
    }

    #[test]
    fn wasm_requires_modules_dir() {
        assert_err(
            "serviceKey: {label: g}\nmembership: {perPort: {ports: {admin: {wasm: {module: a.wasm}}}}}",
            "membership.perPort.ports.admin.wasm",
            "modulesDir",
        );
    }

    #[test]
    fn per_port_names_are_port_names() {
        assert_err(
            &with_membership("{perPort: {ports: {HTTP: include}}}"),
            "membership.perPort.ports.HTTP",
            "port name",
        );
        // The empty name addresses the unnamed port.
        Config::from_yaml(&with_membership("{perPort: {ports: {'': include}}}")).unwrap();
    }

    #[test]
    fn nested_error_inside_fallback() {
        assert_err(
            &with_membership(
                "{perPort: {ports: {}, fallback: {all: [podReady, {tcpDial: {timeout: nope}}]}}}",
            ),
            "membership.perPort.fallback.all[1].tcpDial.timeout",
            "invalid duration \"nope\"",
        );
    }

    #[test]
    fn duplicate_keys_are_rejected() {
        assert_err(
            "serviceKey: {label: g}\nserviceKey: {label: h}",
            ".",
            "duplicate mapping key: serviceKey",
        );
        assert_err(
            &with_membership("{perPort: {ports: {http: include, http: exclude}}}"),
            "membership.perPort.ports",
            "duplicate mapping key: http",
        );
    }

    #[test]
    fn yaml_syntax_error_is_reported() {
        let e = err("serviceKey: {label: g\n");
        assert!(e.field_path().is_some(), "{e}");
    }

    #[test]
    fn empty_document_is_an_error() {
        let e = err("");
        assert!(e.field_path().is_some(), "{e}");
    }

    #[test]
    fn load_names_the_file() {
        let dir = std::env::temp_dir().join(format!("portwise-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.yaml");
        std::fs::write(&good, SEED_EXAMPLE).unwrap();
        assert!(Config::load(&good).is_ok());
        let bad = dir.join("bad.yaml");
        std::fs::write(&bad, "serviceKey: {label: g}\nmaxConcurrentChecks: 0\n").unwrap();
        let e = Config::load(&bad).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("{}: maxConcurrentChecks: ", bad.display())),
            "{e}"
        );
        let missing = dir.join("missing.yaml");
        let e = Config::load(&missing).unwrap_err();
        assert!(matches!(e, ConfigError::Read { .. }), "{e}");
        assert!(e.to_string().contains("missing.yaml"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn wasm_limits_parse_and_default_to_none() {
        let c = Config::from_yaml(&with_membership(
            "{wasm: {module: a.wasm, limits: {deadline: 20ms, callTimeout: 2s, memoryMiB: 16, probesPerCall: 2}}}",
        ))
        .unwrap();
        let CheckerExpr::Wasm(spec) = &c.membership else {
            panic!("{:?}", c.membership)
        };
        assert_eq!(
            spec.limits,
            WasmLimits {
                deadline: Some(Duration::from_millis(20)),
                call_timeout: Some(Duration::from_secs(2)),
                memory_mib: Some(16),
                probes_per_call: Some(2),
            }
        );
        let c = Config::from_yaml(&with_membership("{wasm: {module: a.wasm}}")).unwrap();
        let CheckerExpr::Wasm(spec) = &c.membership else {
            panic!()
        };
        assert_eq!(spec.limits, WasmLimits::default());
    }

    #[test]
    fn bad_wasm_limits_name_the_key() {
        for (limits, field, words) in [
            ("{deadline: 0s}", "deadline", "between 1ms and 60s"),
            ("{callTimeout: 2m}", "callTimeout", "between 1ms and 60s"),
            (
                "{deadline: 3s, callTimeout: 1s}",
                "deadline",
                "longer than callTimeout",
            ),
            ("{memoryMiB: 0}", "memoryMiB", "between 1 and 4096"),
            ("{memoryMiB: 5000}", "memoryMiB", "between 1 and 4096"),
            ("{probesPerCall: 1000}", "probesPerCall", "at most 256"),
        ] {
            let yaml = with_membership(&format!("{{wasm: {{module: a.wasm, limits: {limits}}}}}"));
            let e = Config::from_yaml(&yaml).unwrap_err();
            assert_eq!(
                e.field_path(),
                Some(format!("membership.wasm.limits.{field}").as_str()),
                "{limits}: {e}"
            );
            assert!(e.to_string().contains(words), "{limits}: {e}");
        }
        let e = Config::from_yaml(&with_membership(
            "{wasm: {module: a.wasm, limits: {memory: 16}}}",
        ))
        .unwrap_err();
        assert!(e.to_string().contains("memory"), "{e}");
    }

    #[test]
    fn shadow_parses_and_bad_shadows_name_the_key() {
        let c = Config::from_yaml(&with_membership(
            "podReady\nshadow: {membership: notTerminating, expressions: {next: {tcpDial: {timeout: 1s}}}}",
        ))
        .unwrap();
        let shadow = c.shadow.unwrap();
        assert_eq!(shadow.membership, Some(CheckerExpr::NotTerminating));
        assert!(shadow.expressions.contains_key("next"));
        assert_eq!(shadow.annotation, DEFAULT_SHADOW_ANNOTATION);
        for (yaml, field) in [
            ("{expressions: {Next: podReady}}", "shadow.expressions.Next"),
            ("{expressions: {none: podReady}}", "shadow.expressions.none"),
            (
                "{expressions: {next: {tcpDial: {timeout: 0s}}}}",
                "shadow.expressions.next.tcpDial.timeout",
            ),
            (
                "{membership: {httpGet: {path: x}}}",
                "shadow.membership.httpGet.path",
            ),
            ("{annotation: 'not a key!'}", "shadow.annotation"),
        ] {
            let e = Config::from_yaml(&with_membership(&format!("podReady\nshadow: {yaml}")))
                .unwrap_err();
            assert_eq!(e.field_path(), Some(field), "{yaml}: {e}");
        }
    }

    #[test]
    fn programmatic_configs_are_validated_too() {
        let mut c = Config::with_service_key(KeySource::Label("g".into()));
        c.membership = CheckerExpr::All(vec![CheckerExpr::Wasm(WasmSpec {
            module: "x.wasm".into(),
            config: serde_json::Value::Null,
            sha256: None,
            limits: WasmLimits::default(),
            allow_tags: false,
        })]);
        let e = c.validate().unwrap_err();
        assert_eq!(e.field_path(), Some("membership.all[0].wasm"));
        let e = CheckerExpr::Not(Box::new(CheckerExpr::TcpDial(TcpDialSpec {
            timeout: Duration::ZERO,
        })))
        .validate_at("check", false)
        .unwrap_err();
        assert_eq!(e.field_path(), Some("check.not.tcpDial.timeout"));
    }
}

#[cfg(test)]
mod abstain_limit_tests {
    use super::*;

    #[test]
    fn abstain_limit_defaults_to_five_minutes_or_two_periods_and_is_checked() {
        let c = Config::from_yaml("serviceKey: {label: g}\n").unwrap();
        assert_eq!(c.abstain_limit(), Duration::from_secs(300));
        let c = Config::from_yaml("serviceKey: {label: g}\nresyncPeriod: 10m\n").unwrap();
        assert_eq!(
            c.abstain_limit(),
            Duration::from_secs(1200),
            "a valid file stays valid"
        );
        let c = Config::from_yaml("serviceKey: {label: g}\nabstainLimit: 90s\n").unwrap();
        assert_eq!(c.abstain_limit(), Duration::from_secs(90));
        let e = Config::from_yaml("serviceKey: {label: g}\nabstainLimit: 10s\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("abstainLimit") && e.contains("resyncPeriod"),
            "{e}"
        );
        let e = Config::from_yaml("serviceKey: {label: g}\nabstainLimit: later\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("abstainLimit"), "{e}");
    }
}

#[cfg(test)]
mod oci_tests {
    use super::*;

    fn membership(expr: &str) -> String {
        format!("serviceKey: {{label: g}}\nmembership: {expr}\n")
    }

    #[test]
    fn oci_references_parse() {
        let d = "AB".repeat(32);
        let r = OciRef::parse(&format!(
            "oci://reg.example:5000/team/tier-check:v1@sha256:{d}"
        ))
        .unwrap();
        assert_eq!(r.registry, "reg.example:5000");
        assert_eq!(r.repository, "team/tier-check");
        assert_eq!(r.tag.as_deref(), Some("v1"));
        assert_eq!(r.digest, Some("ab".repeat(32)));
        assert_eq!(
            r.to_string(),
            format!(
                "oci://reg.example:5000/team/tier-check:v1@sha256:{}",
                "ab".repeat(32)
            )
        );
        let r = OciRef::parse("oci://10.244.255.1:5000/x:latest").unwrap();
        assert_eq!((r.tag.as_deref(), r.digest), (Some("latest"), None));
        for (bad, why) in [
            ("oci://reg/x", "neither a digest nor a tag"),
            ("oci://reg/x@sha256:abc", "64 hex digits"),
            ("oci://reg/x@md5:abc", "sha256:"),
            ("oci://reg", "registry and a repository"),
            ("oci://reg/Upper", "lowercase"),
            ("oci://reg/x:-bad", "not a valid OCI tag"),
        ] {
            let e = OciRef::parse(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn oci_modules_need_a_digest_unless_tags_are_allowed_and_no_modules_dir() {
        let d = "ab".repeat(32);
        // A digest: valid, without modulesDir.
        Config::from_yaml(&membership(&format!(
            "{{wasm: {{module: 'oci://reg.example/x@sha256:{d}'}}}}"
        )))
        .unwrap();
        let e = Config::from_yaml(&membership("{wasm: {module: 'oci://reg.example/x:v1'}}"))
            .unwrap_err();
        assert_eq!(e.field_path(), Some("membership.wasm.module"), "{e}");
        assert!(e.to_string().contains("allowTags"), "{e}");
        Config::from_yaml(&membership(
            "{wasm: {module: 'oci://reg.example/x:v1', allowTags: true}}",
        ))
        .unwrap();
        let e = Config::from_yaml(&membership("{wasm: {module: a.wasm, allowTags: true}}"))
            .unwrap_err();
        assert_eq!(e.field_path(), Some("membership.wasm.allowTags"), "{e}");
        let e = Config::from_yaml(&format!("maxModuleBytes: 0\n{}", membership("podReady")))
            .unwrap_err();
        assert_eq!(e.field_path(), Some("maxModuleBytes"), "{e}");
        let c = Config::from_yaml(&format!(
            "registryAuth: /etc/portwise/registry/config.json\nregistryCA: /ca.pem\n{}",
            membership("podReady")
        ))
        .unwrap();
        assert_eq!(c.max_module_bytes, DEFAULT_MAX_MODULE_BYTES);
        assert_eq!(
            c.registry_auth.as_deref(),
            Some(Path::new("/etc/portwise/registry/config.json"))
        );
    }

    #[test]
    fn module_signatures_name_key_files() {
        let c = Config::from_yaml(&format!(
            "moduleSignatures: {{keys: [/keys/a.pub, /keys/b.pub]}}\n{}",
            membership("podReady")
        ))
        .unwrap();
        assert_eq!(
            c.module_signatures.unwrap().keys,
            vec![PathBuf::from("/keys/a.pub"), PathBuf::from("/keys/b.pub")]
        );
        let e = Config::from_yaml(&format!(
            "moduleSignatures: {{keys: []}}\n{}",
            membership("podReady")
        ))
        .unwrap_err();
        assert_eq!(e.field_path(), Some("moduleSignatures.keys"), "{e}");
        assert!(e.to_string().contains("leave moduleSignatures out"), "{e}");
        let e = Config::from_yaml(&format!(
            "moduleSignatures: {{keys: [/a.pub, '']}}\n{}",
            membership("podReady")
        ))
        .unwrap_err();
        assert_eq!(e.field_path(), Some("moduleSignatures.keys[1]"), "{e}");
        // A typo is refused, not ignored (signatures would silently be off).
        let e = Config::from_yaml(&format!(
            "moduleSignatures: {{key: [/a.pub]}}\n{}",
            membership("podReady")
        ))
        .unwrap_err();
        assert!(e.to_string().contains("key"), "{e}");
        assert!(
            Config::from_yaml(&membership("podReady"))
                .unwrap()
                .module_signatures
                .is_none()
        );
    }
}
