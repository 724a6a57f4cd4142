//! The meaning layer: [`Config::validate`] and
//! [`CheckerExpr::validate_at`], checking what the parser cannot (ranges,
//! key syntax, names, `wasm` needing `modulesDir`) and building the same
//! path syntax as serde_path_to_error by hand, so an error points at the
//! field whichever layer found it.
//!
//! The bounds these checks enforce live here too, with the checks.

use std::{collections::BTreeMap, time::Duration};

use super::{
    CheckerExpr, Config, ConfigError, HttpGetSpec, KeySource, LIMITABLE_CHECKERS, OCI_SCHEME,
    OciRef, PolicyLimits, Scheme, WasmLimits,
    syntax::{
        check_dns_label, check_dns_subdomain, check_label_value, check_module_file_name,
        check_qualified_name, validate_path,
    },
};

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

/// Upper bound of `maxEndpointsPerSlice` (the EndpointSlice API's own limit).
pub const MAX_ENDPOINTS_PER_SLICE: usize = 1000;

/// Bounds that keep a per-module limit meaningful: a deadline under a
/// millisecond cannot be measured by the host's 1 ms epoch ticks, and a
/// call longer than a minute would hold a reconcile (and its Service's
/// slices) hostage.
pub const WASM_MAX_CALL_TIMEOUT: Duration = Duration::from_secs(60);
pub const WASM_MAX_MEMORY_MIB: u64 = 4096;
pub const WASM_MAX_PROBES_PER_CALL: u32 = 256;

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

impl Config {
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
        if let Some(cap) = self.max_concurrent_checks_per_namespace
            && !(1..=self.max_concurrent_checks).contains(&cap)
        {
            return Err(root.field("maxConcurrentChecksPerNamespace").issue(format!(
                "must be between 1 and maxConcurrentChecks ({}), got {cap}",
                self.max_concurrent_checks
            )));
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
        check_qualified_name(&self.policy_annotation)
            .map_err(|m| root.field("policyAnnotation").issue(m))?;
        let policies = root.field("policies");
        for (name, expr) in &self.policies {
            let at = policies.field(name);
            check_dns_label(name).map_err(|m| at.issue(format!("not a policy name: {m}")))?;
            expr.validate(&at, self.modules_dir.is_some())?;
        }
        check_scopes(
            &root.field("policyScopes"),
            &self.policy_scopes,
            &self.policies,
            "policies",
        )?;
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
            check_scopes(
                &p.field("scopes"),
                &shadow.scopes,
                &shadow.expressions,
                "shadow.expressions",
            )?;
        }
        if let Some(limits) = &self.membership_policies {
            check_policy_limits(&root.field("membershipPolicies"), limits)?;
        }
        Ok(())
    }
}

/// `membershipPolicies`: keywords it can limit, a probe timeout in range,
/// repositories that are `REGISTRY/REPOSITORY` (and some when `wasm` is
/// allowed: else no module could ever be accepted), a budget of at least one.
fn check_policy_limits(at: &FieldPath, limits: &PolicyLimits) -> Result<(), Issue> {
    for (i, c) in limits.checkers.iter().enumerate() {
        if !LIMITABLE_CHECKERS.contains(&c.as_str()) {
            return Err(at.field("checkers").index(i).issue(format!(
                "{c:?} is not a checker to allow: one of {} (constants and combinators are always allowed)",
                LIMITABLE_CHECKERS.join(", ")
            )));
        }
    }
    check_timeout(limits.max_probe_timeout).map_err(|m| at.field("maxProbeTimeout").issue(m))?;
    let repos = at.field("moduleRepositories");
    if limits.checkers.iter().any(|c| c == "wasm") && limits.module_repositories.is_empty() {
        return Err(repos.issue(
            "list at least one REGISTRY/REPOSITORY: `checkers` allows wasm, and a policy object's module must come from one of them",
        ));
    }
    for (i, r) in limits.module_repositories.iter().enumerate() {
        // Read as a reference pinned by any digest: a repository is what
        // stays of it, without a tag (or a digest of its own).
        let pinned = format!("{OCI_SCHEME}{r}@sha256:{}", "0".repeat(64));
        let whole = OciRef::parse(&pinned).ok().filter(|o| o.tag.is_none());
        if whole.is_none() {
            return Err(repos.index(i).issue(format!(
                "{r:?} is not REGISTRY/REPOSITORY (e.g. registry.example/team-a, no scheme, tag or digest)"
            )));
        }
    }
    if limits.max_modules_per_namespace == 0 {
        return Err(at
            .field("maxModulesPerNamespace")
            .issue("must be at least 1; to allow no modules, leave wasm out of checkers"));
    }
    if limits.max_per_namespace == 0 {
        return Err(at
            .field("maxPerNamespace")
            .issue("must be at least 1; to read no policy objects, leave membershipPolicies out"));
    }
    Ok(())
}

/// Each scope names an expression of `named` and lists at least one
/// namespace, each a namespace name.
fn check_scopes<T>(
    at: &FieldPath,
    scopes: &BTreeMap<String, Vec<String>>,
    named: &BTreeMap<String, T>,
    what: &str,
) -> Result<(), Issue> {
    for (name, namespaces) in scopes {
        let at = at.field(name);
        if !named.contains_key(name) {
            return Err(at.issue(format!("names no expression of {what}")));
        }
        if namespaces.is_empty() {
            return Err(at.issue(
                "list at least one namespace; to let every namespace pick it, leave it out",
            ));
        }
        for (i, ns) in namespaces.iter().enumerate() {
            check_dns_label(ns).map_err(|m| at.index(i).issue(format!("not a namespace: {m}")))?;
        }
    }
    Ok(())
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
                validate_path(&spec.path).map_err(|e| p.field("path").issue(e.to_string()))?;
                check_tls(spec).map_err(|(field, m)| p.field(field).issue(m))?;
                check_timeout(spec.timeout).map_err(|m| p.field("timeout").issue(m))
            }
            CheckerExpr::Grpc(spec) => {
                let p = path.field("grpc");
                check_grpc_service(&spec.service)
                    .map_err(|e| p.field("service").issue(e.to_string()))?;
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
                    Some(parsed) => {
                        Some(parsed.map_err(|e| p.field("module").issue(e.to_string()))?)
                    }
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
}

impl KeySource {
    fn validate(&self, path: &FieldPath) -> Result<(), Issue> {
        let (field, key) = match self {
            KeySource::Label(k) => ("label", k),
            KeySource::Annotation(k) => ("annotation", k),
        };
        check_qualified_name(key).map_err(|m| path.field(field).issue(m))
    }
}

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

/// `caFile` and `serverName` are about the TLS session, so only `HTTPS`
/// has them; a `serverName` is what SNI may carry, a DNS name.
fn check_tls(spec: &HttpGetSpec) -> Result<(), (&'static str, String)> {
    let https = spec.scheme == Scheme::Https;
    if spec.ca_file.is_some() && !https {
        return Err(("caFile", "is for scheme HTTPS only".into()));
    }
    if let Some(name) = &spec.server_name {
        if !https {
            return Err(("serverName", "is for scheme HTTPS only".into()));
        }
        check_dns_subdomain(name).map_err(|m| ("serverName", m))?;
    }
    Ok(())
}

/// A gRPC service name goes into a protobuf string and a log line: keep it
/// printable and short (grpc.health.v1 names are package-qualified, e.g.
/// `grpc.health.v1.Health`).
pub fn check_grpc_service(service: &str) -> Result<(), GrpcServiceError> {
    if service.len() > 256 {
        return Err(GrpcServiceError::TooLong(service.len()));
    }
    if let Some(c) = service
        .chars()
        .find(|c| c.is_control() || c.is_whitespace())
    {
        return Err(GrpcServiceError::Character {
            service: service.to_owned(),
            c,
        });
    }
    Ok(())
}

/// A gRPC service name refused by [`check_grpc_service`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GrpcServiceError {
    /// Its length in bytes.
    #[error("is {0} bytes, at most 256")]
    TooLong(usize),
    #[error("{service:?} contains {c:?}: a service name has no spaces or control characters")]
    Character { service: String, c: char },
}
