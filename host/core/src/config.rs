//! The configuration file: its format is a contract with users, documented in
//! docs/configuration.md (every key, every checker, with examples).
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
//!
//! The module is split along those jobs; every public item is re-exported
//! here, so `portwise_core::config::X` is the one path to use:
//!
//! - this file: the schema (the serde types of the file, their defaults,
//!   and the accessors and entry points on them: [`Config::from_yaml`],
//!   [`Config::load`]);
//! - `parse`: YAML to [`Config`] with path tracking (the shape layer);
//! - `validate`: [`Config::validate`], [`CheckerExpr::validate_at`] and the
//!   bounds they enforce (the meaning layer);
//! - `syntax`: string rules with no path attached (Kubernetes names,
//!   module file names, HTTP request paths), shared by validation and by
//!   other crates;
//! - `oci`: `oci://` module references ([`OciRef`]);
//! - `deadline`: the worst case of a check, per expression
//!   ([`CheckerExpr::worst_case`], [`Config::worst_cases`]);
//! - `duration`: humantime durations for serde;
//! - `error`: [`ConfigError`], what both layers report.

use std::{collections::BTreeMap, fmt, path::PathBuf, time::Duration};

use serde::Deserialize;

mod deadline;
mod duration;
mod error;
mod oci;
mod parse;
mod probes;
mod resource;
mod syntax;
mod validate;

pub use deadline::{CHECK_TIMEOUT_MARGIN, CheckTimeoutError};
use duration::{duration_opt, duration_str, optional_duration_str};
pub use error::ConfigError;
pub use oci::{OCI_SCHEME, OciRef, OciRefError};
pub use parse::MAX_NESTING;
pub use probes::{GrpcSpec, HttpGetSpec, HttpHeader, ProbePort, Scheme, TcpDialSpec};
pub use syntax::{
    HeaderError, PathError, PathRule, REFUSED_HEADERS, check_dns_label, check_dns_subdomain,
    check_label_value, check_port_name, check_qualified_name, validate_header, validate_path,
};
pub use validate::{
    GrpcServiceError, MAX_ENDPOINTS_PER_SLICE, MAX_PROBE_TIMEOUT, MIN_RESYNC_PERIOD,
    NATIVE_MANAGERS, WASM_MAX_CALL_TIMEOUT, WASM_MAX_MEMORY_MIB, WASM_MAX_PROBES_PER_CALL,
    check_grpc_service,
};

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
    /// The most of `maxConcurrentChecks` one namespace's checks hold at
    /// once (default: all of them, shared fairly with whoever waits).
    #[serde(default)]
    pub max_concurrent_checks_per_namespace: Option<usize>,
    /// Migration cleanup of the native controllers' leftovers.
    #[serde(default = "yes")]
    pub native_cleanup: bool,
    /// Also write v1 Endpoints (labelled skip-mirror).
    #[serde(default)]
    pub publish_legacy_endpoints: bool,
    /// No Node watch: no zones, no hints.
    #[serde(default)]
    pub disable_node_lookups: bool,
    /// Which pod addresses portwise probes and publishes.
    #[serde(default)]
    pub pod_addresses: PodAddresses,
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
    /// The checker expression deciding membership, for every Service whose
    /// annotation does not name one of `policies`.
    #[serde(default)]
    pub membership: CheckerExpr,
    /// Named membership expressions; a Service picks one with its
    /// `policyAnnotation` (see [`crate::policy`]). Named here, in the
    /// operator's file, for the reason shadows are: whoever may edit a
    /// Service chooses among what the platform allows, and cannot make
    /// portwise run anything new.
    #[serde(default)]
    pub policies: BTreeMap<String, CheckerExpr>,
    /// Who may pick each named policy: its name, the namespaces whose
    /// Services may. A policy not listed may be picked from every
    /// namespace. Why: a policy written for one team (an `httpGet` path
    /// with its token, a guest's config) must not run against another
    /// team's pods because that team annotated a Service with its name
    /// ([`crate::policy::choose`]).
    #[serde(default)]
    pub policy_scopes: BTreeMap<String, Vec<String>>,
    /// The Service annotation that names a policy.
    #[serde(default = "default_policy_annotation")]
    pub policy_annotation: String,
    /// Membership expressions judged next to the live one, publishing
    /// nothing: how a new checker is tried before it decides.
    #[serde(default)]
    pub shadow: Option<ShadowSpec>,
    /// Whether teams' `MembershipPolicy` objects decide the Services of
    /// their namespace, and within which limits. Absent: the objects are
    /// not read (the resource need not even be installed), and only this
    /// file's expressions run, as before.
    #[serde(default)]
    pub membership_policies: Option<PolicyLimits>,
}

/// `membershipPolicies: {checkers, maxProbeTimeout, moduleRepositories,
/// maxPerNamespace}`: what a team's `MembershipPolicy` may ask portwise to
/// run. A policy object outside them is not accepted (its status says
/// which field and why), so a team can only ever make portwise run what
/// the operator allowed here.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PolicyLimits {
    /// The checkers a policy object may use, by keyword. The constants and
    /// the combinators (`all`, `any`, `not`, `perPort`, `stable`) run
    /// nothing of their own and are always allowed. Default: every
    /// built-in check (`podReady`, `notTerminating`, `portNames`,
    /// `tcpDial`, `httpGet`, `grpc`); `wasm` only when listed.
    #[serde(default = "default_policy_checkers")]
    pub checkers: Vec<String>,
    /// The longest probe timeout a policy object may ask for.
    #[serde(default = "default_policy_probe_timeout", with = "duration_str")]
    pub max_probe_timeout: Duration,
    /// Where a policy object's `wasm` modules may come from:
    /// `REGISTRY/REPOSITORY` prefixes, matched whole path segment by
    /// segment (`registry.example/team-a` admits
    /// `oci://registry.example/team-a/check@sha256:…`, not
    /// `…/team-ab/…`). A policy object's module is always an `oci://`
    /// reference pinned by digest, and `moduleSignatures` apply to it.
    #[serde(default)]
    pub module_repositories: Vec<String>,
    /// How many policy objects of one namespace are read; past that, the
    /// newest are not accepted.
    #[serde(default = "default_policies_per_namespace")]
    pub max_per_namespace: usize,
    /// How many distinct modules the policy objects of one namespace may
    /// name together; a policy that would take its namespace past it is
    /// not accepted.
    #[serde(default = "default_modules_per_namespace")]
    pub max_modules_per_namespace: usize,
}

/// The checker keywords [`PolicyLimits::checkers`] may list: the checks
/// that read a pod, open a connection or run a guest.
pub const LIMITABLE_CHECKERS: [&str; 7] = [
    "podReady",
    "notTerminating",
    "portNames",
    "tcpDial",
    "httpGet",
    "grpc",
    "wasm",
];

fn default_policy_checkers() -> Vec<String> {
    LIMITABLE_CHECKERS[..6]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

fn default_policy_probe_timeout() -> Duration {
    Duration::from_secs(5)
}

fn default_policies_per_namespace() -> usize {
    16
}

fn default_modules_per_namespace() -> usize {
    4
}

impl Default for PolicyLimits {
    fn default() -> Self {
        PolicyLimits {
            checkers: default_policy_checkers(),
            max_probe_timeout: default_policy_probe_timeout(),
            module_repositories: Vec::new(),
            max_per_namespace: default_policies_per_namespace(),
            max_modules_per_namespace: default_modules_per_namespace(),
        }
    }
}

/// `podAddresses: {cidrs: [CIDR, ...], hostNetwork: BOOL}`.
///
/// Why: a pod's addresses are whatever its status says, and whoever can
/// write `pods/status` (a node's kubelet, or anyone granted it) can point
/// them at a Node, a ClusterIP or the apiserver. portwise would probe
/// there, and publish it for the Service's clients. `cidrs` names the
/// cluster's pod networks; a `hostNetwork` pod, whose address is its
/// Node's and so in none of them, is judged only when `hostNetwork` says
/// so. The built-in refusals ([`crate::align::is_endpoint_address`],
/// [`crate::align::is_metadata_address`]) hold either way.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PodAddresses {
    /// The pod networks, of either family. Empty: any address (portwise
    /// warns at start).
    #[serde(default)]
    pub cidrs: Vec<Cidr>,
    /// Judge (probe and publish) `hostNetwork` pods. Off: they are not
    /// judged, like a pod on a Node that is gone.
    #[serde(default)]
    pub host_network: bool,
}

impl PodAddresses {
    /// Whether a pod with its own network may be probed and published at
    /// `ip` (a `hostNetwork` pod's address is its Node's: `hostNetwork`
    /// decides for those, not `cidrs`).
    pub fn admits(&self, ip: std::net::IpAddr) -> bool {
        self.cidrs.is_empty() || self.cidrs.iter().any(|c| c.0.contains(&ip))
    }
}

/// A CIDR in `podAddresses.cidrs`: an address with no bits set past its
/// prefix (`10.244.0.0/16`, `fd00:10:244::/64`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr(pub ipnet::IpNet);

impl std::str::FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let net: ipnet::IpNet = s.parse().map_err(|_| {
            format!("{s:?} is not a CIDR: write an address, a slash and a prefix length, e.g. 10.244.0.0/16 or fd00:10:244::/64")
        })?;
        if net.trunc() != net {
            return Err(format!(
                "{s:?} has bits set past its /{} prefix: did you mean {}?",
                net.prefix_len(),
                net.trunc()
            ));
        }
        Ok(Cidr(net))
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
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
    /// Who may pick each named shadow, as `policyScopes` says for
    /// policies.
    #[serde(default)]
    pub scopes: BTreeMap<String, Vec<String>>,
    /// The Service annotation that picks a named shadow (`none` turns the
    /// default off for that Service).
    #[serde(default = "default_shadow_annotation")]
    pub annotation: String,
}

/// `portwise.io/membership`.
pub const DEFAULT_POLICY_ANNOTATION: &str = "portwise.io/membership";

fn default_policy_annotation() -> String {
    DEFAULT_POLICY_ANNOTATION.to_owned()
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
}

impl fmt::Display for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeySource::Label(k) => write!(f, "label {k}"),
            KeySource::Annotation(k) => write!(f, "annotation {k}"),
        }
    }
}

/// A checker expression: one row of the checker table in docs/configuration.md.
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
    /// A grpc.health.v1 `Check`.
    Grpc(GrpcSpec),
    All(Vec<CheckerExpr>),
    Any(Vec<CheckerExpr>),
    Not(Box<CheckerExpr>),
    PerPort(PerPortSpec),
    Stable(StableSpec),
    Wasm(WasmSpec),
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
    pub fn oci(&self) -> Option<Result<OciRef, OciRefError>> {
        self.module
            .starts_with(OCI_SCHEME)
            .then(|| OciRef::parse(&self.module))
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
    /// Memory of one instance (all its linear memories together), in MiB.
    #[serde(default, rename = "memoryMiB")]
    pub memory_mib: Option<u64>,
    /// Probes one call may make; more are denied.
    #[serde(default)]
    pub probes_per_call: Option<u32>,
}

impl Config {
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
            max_concurrent_checks_per_namespace: None,
            native_cleanup: true,
            publish_legacy_endpoints: false,
            disable_node_lookups: false,
            pod_addresses: PodAddresses::default(),
            modules_dir: None,
            registry_auth: None,
            registry_ca: None,
            max_module_bytes: DEFAULT_MAX_MODULE_BYTES,
            module_signatures: None,
            membership: CheckerExpr::default(),
            policies: BTreeMap::new(),
            policy_scopes: BTreeMap::new(),
            policy_annotation: default_policy_annotation(),
            shadow: None,
            membership_policies: None,
        }
    }

    /// Every `wasm` expression of the file: the live membership's, the
    /// policies' and the shadows'. What has to be pulled and sized for at start.
    pub fn all_wasm_specs(&self) -> Vec<&WasmSpec> {
        let mut out = self.membership.wasm_specs();
        out.extend(self.policies.values().flat_map(|p| p.wasm_specs()));
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
}

impl CheckerExpr {
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
            CheckerExpr::Grpc(_) => "grpc",
            CheckerExpr::All(_) => "all",
            CheckerExpr::Any(_) => "any",
            CheckerExpr::Not(_) => "not",
            CheckerExpr::PerPort(_) => "perPort",
            CheckerExpr::Stable(_) => "stable",
            CheckerExpr::Wasm(_) => "wasm",
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod abstain_limit_tests;

#[cfg(test)]
mod oci_tests;

#[cfg(test)]
mod probes_tests;
