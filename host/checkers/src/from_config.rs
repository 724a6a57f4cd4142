//! From configuration to checkers: turns a [`CheckerExpr`] into a tree of
//! [`Checker`] trait objects.
//!
//! WebAssembly checkers come from a [`WasmCheckers`] provider handed in
//! through [`BuildContext`], so `membership` does not depend on the wasm
//! runtime (and tests build every other checker without wasmtime).

use std::{path::PathBuf, sync::Arc, time::Duration};

use portwise_core::{
    config::{CheckerExpr, HttpGetSpec, Scheme, WasmSpec},
    membership::Decision,
};
use portwise_probe::{HttpRequest, ProbeError, Tls, TlsError};

use crate::{
    BoxFuture, Checker,
    builtin::{
        All, Any, Constant, Grpc, HttpGet, Not, NotTerminating, PerPort, PodReady, PortNames,
        Stable, TcpDial,
    },
};

/// Why a provider cannot build a checker: the provider's own error, whose
/// text goes into the [`BuildError`].
pub type ProviderError = Box<dyn std::error::Error + Send + Sync>;

/// Supplies `wasm` checkers (implemented by the wasm runtime).
pub trait WasmCheckers: Send + Sync {
    /// A checker for `spec.module` (a file name in `modulesDir`) with the
    /// guest's `config`, pinned by `sha256` when given and bounded by
    /// `limits`. An `Err` says why the module cannot serve (missing, wrong
    /// digest, config rejected by the guest, a limit past the runtime's
    /// ceiling...). Async: building runs the guest's `validate-config`.
    fn checker<'a>(
        &'a self,
        spec: &'a WasmSpec,
    ) -> BoxFuture<'a, Result<Arc<dyn Checker>, ProviderError>>;

    /// Pulls the `oci://` modules of `specs` that are not serving yet, so
    /// that [`WasmCheckers::checker`] can serve them: what a policy object
    /// names is only known after start. Returns the error of each module
    /// that did not pull, by module. A provider that pulls nothing refuses
    /// nothing here (its `checker` says why a module is missing).
    fn pull<'a>(
        &'a self,
        specs: &'a [&'a WasmSpec],
    ) -> BoxFuture<'a, Vec<(String, ProviderError)>> {
        let _ = specs;
        Box::pin(async { Vec::new() })
    }
}

/// What building needs besides the expression.
#[derive(Clone, Copy)]
pub struct BuildContext<'a> {
    /// Where `wasm` checkers come from; `None` makes `wasm` a build error.
    pub wasm: Option<&'a dyn WasmCheckers>,
    /// How long a `stable` state survives without being used. Should be
    /// several `resyncPeriod`s, so a state outlives a missed resync but a
    /// deleted pod's state goes away.
    pub stable_ttl: Duration,
    /// The least time between two observations that a `stable` threshold
    /// counts separately ([`BuildContext::stable_spacing_for`]); zero counts
    /// every check.
    pub stable_spacing: Duration,
}

impl BuildContext<'_> {
    /// [`BuildContext::stable_spacing`] for a resync period: 90% of it. The
    /// resync re-checks every Service once a period; any other reconcile
    /// (an unrelated pod update, a status heartbeat) checks again in
    /// between, and counting those would let a threshold of 3 trip within
    /// one period. kubelet counts one probe per `periodSeconds`; the 10%
    /// slack keeps a resync that runs a little early from being dropped.
    pub fn stable_spacing_for(resync_period: Duration) -> Duration {
        resync_period.mul_f64(0.9)
    }

    /// Default [`BuildContext::stable_ttl`].
    pub const DEFAULT_STABLE_TTL: Duration = Duration::from_secs(600);

    /// The TTL for a given resync period: ten periods, at least the default.
    pub fn stable_ttl_for(resync_period: Duration) -> Duration {
        (resync_period * 10).max(Self::DEFAULT_STABLE_TTL)
    }
}

impl Default for BuildContext<'_> {
    fn default() -> Self {
        BuildContext {
            wasm: None,
            stable_ttl: Self::DEFAULT_STABLE_TTL,
            stable_spacing: Duration::ZERO,
        }
    }
}

impl std::fmt::Debug for BuildContext<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BuildContext")
            .field("wasm", &self.wasm.is_some())
            .field("stable_ttl", &self.stable_ttl)
            .field("stable_spacing", &self.stable_spacing)
            .finish()
    }
}

/// A checker that could not be built, with the configuration path of the
/// expression (`membership.perPort.ports.admin.wasm`).
#[derive(Debug, thiserror::Error)]
#[error("{path}: {kind}")]
pub struct BuildError {
    pub path: String,
    #[source]
    pub kind: BuildErrorKind,
}

/// Why a checker could not be built ([`BuildError::kind`]).
#[derive(Debug, thiserror::Error)]
pub enum BuildErrorKind {
    #[error("WebAssembly checkers are not available here (no wasm runtime)")]
    NoWasmRuntime,
    /// The provider refused the module; its error (the wasm runtime's
    /// `WasmError`) is the source, for callers that tell causes apart.
    #[error("{0}")]
    Wasm(#[source] ProviderError),
    /// An `httpGet` path or header the prober refuses.
    #[error("{0}")]
    Request(#[source] ProbeError),
    /// HTTPS set up without a `caFile` (the `serverName` is not a DNS name).
    #[error("{0}")]
    Tls(#[source] TlsError),
    #[error("{}: {source}", file.display())]
    CaFileRead {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {source}", file.display())]
    CaFile {
        file: PathBuf,
        #[source]
        source: TlsError,
    },
}

/// Builds the checker for `expr`, found at `membership` in the configuration.
pub async fn build(
    expr: &CheckerExpr,
    ctx: &BuildContext<'_>,
) -> Result<Arc<dyn Checker>, BuildError> {
    build_at(expr, ctx, "membership").await
}

/// Builds the checker for `expr`; `path` names where it sits, for errors.
/// Boxed: an expression nests expressions, and an async fn cannot call
/// itself unboxed.
pub fn build_at<'a>(
    expr: &'a CheckerExpr,
    ctx: &'a BuildContext<'_>,
    path: &'a str,
) -> BoxFuture<'a, Result<Arc<dyn Checker>, BuildError>> {
    Box::pin(build_expr(expr, ctx, path))
}

async fn build_expr(
    expr: &CheckerExpr,
    ctx: &BuildContext<'_>,
    path: &str,
) -> Result<Arc<dyn Checker>, BuildError> {
    let at = |kw: &str| format!("{path}.{kw}");
    Ok(match expr {
        CheckerExpr::PodReady => Arc::new(PodReady),
        CheckerExpr::NotTerminating => Arc::new(NotTerminating),
        CheckerExpr::Include => Arc::new(Constant(Decision::Include)),
        CheckerExpr::Exclude => Arc::new(Constant(Decision::Exclude)),
        CheckerExpr::Abstain => Arc::new(Constant(Decision::Abstain)),
        CheckerExpr::PortNames(key) => Arc::new(PortNames(key.clone())),
        CheckerExpr::TcpDial(spec) => Arc::new(TcpDial {
            port: spec.port.clone(),
            timeout: spec.timeout,
        }),
        CheckerExpr::HttpGet(spec) => Arc::new(http_get(spec, &at("httpGet")).await?),
        CheckerExpr::Grpc(spec) => Arc::new(Grpc {
            port: spec.port.clone(),
            service: spec.service.clone(),
            timeout: spec.timeout,
        }),
        CheckerExpr::All(children) => Arc::new(All(build_list(children, ctx, &at("all")).await?)),
        CheckerExpr::Any(children) => Arc::new(Any(build_list(children, ctx, &at("any")).await?)),
        CheckerExpr::Not(inner) => Arc::new(Not(build_at(inner, ctx, &at("not")).await?)),
        CheckerExpr::PerPort(spec) => {
            let base = at("perPort");
            let mut ports = std::collections::BTreeMap::new();
            for (name, e) in &spec.ports {
                let checker = build_at(e, ctx, &format!("{base}.ports.{name}")).await?;
                ports.insert(name.clone(), checker);
            }
            let fallback = match &spec.fallback {
                Some(f) => build_at(f, ctx, &format!("{base}.fallback")).await?,
                None => Arc::new(Constant(Decision::Exclude)),
            };
            Arc::new(PerPort { ports, fallback })
        }
        CheckerExpr::Stable(spec) => {
            let inner = build_at(&spec.checker, ctx, &format!("{}.checker", at("stable"))).await?;
            Arc::new(
                Stable::new(
                    inner,
                    spec.success_threshold,
                    spec.failure_threshold,
                    ctx.stable_ttl,
                )
                .counting_every(ctx.stable_spacing),
            )
        }
        CheckerExpr::Wasm(spec) => {
            let Some(provider) = ctx.wasm else {
                return Err(BuildError {
                    path: at("wasm"),
                    kind: BuildErrorKind::NoWasmRuntime,
                });
            };
            provider.checker(spec).await.map_err(|e| BuildError {
                path: at("wasm"),
                kind: BuildErrorKind::Wasm(e),
            })?
        }
    })
}

/// An `httpGet` checker; reads `caFile` now, so a missing or malformed
/// bundle is a build error naming the field, not a failure at every probe.
async fn http_get(spec: &HttpGetSpec, path: &str) -> Result<HttpGet, BuildError> {
    let error = |field: &str, kind: BuildErrorKind| BuildError {
        path: format!("{path}.{field}"),
        kind,
    };
    let mut request = HttpRequest::get(&spec.path)
        .map_err(|e| error("path", BuildErrorKind::Request(e)))?
        .headers(
            spec.http_headers
                .iter()
                .map(|h| (h.name.as_str(), h.value.as_str())),
        )
        .map_err(|e| error("httpHeaders", BuildErrorKind::Request(e)))?;
    if spec.scheme == Scheme::Https {
        let server_name = spec.server_name.as_deref();
        let tls = match &spec.ca_file {
            None => Tls::without_verification(server_name)
                .map_err(|e| error("serverName", BuildErrorKind::Tls(e)))?,
            Some(file) => {
                let pem = tokio::fs::read(file).await.map_err(|source| {
                    let file = file.clone();
                    error("caFile", BuildErrorKind::CaFileRead { file, source })
                })?;
                Tls::verifying(&pem, server_name).map_err(|source| {
                    let file = file.clone();
                    error("caFile", BuildErrorKind::CaFile { file, source })
                })?
            }
        };
        request = request.over(tls);
    }
    Ok(HttpGet {
        request,
        port: spec.port.clone(),
        timeout: spec.timeout,
    })
}

async fn build_list(
    children: &[CheckerExpr],
    ctx: &BuildContext<'_>,
    path: &str,
) -> Result<Vec<Arc<dyn Checker>>, BuildError> {
    let mut built = Vec::with_capacity(children.len());
    for (i, c) in children.iter().enumerate() {
        built.push(build_at(c, ctx, &format!("{path}[{i}]")).await?);
    }
    Ok(built)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use portwise_core::{
        config::Config,
        membership::{Subject, Verdict},
    };

    use crate::{
        BoxFuture,
        builtin::tests::{pod, subject},
    };

    fn expr(yaml: &str) -> CheckerExpr {
        Config::from_yaml(&format!(
            "serviceKey: {{label: g}}\nmodulesDir: /m\nmembership: {yaml}"
        ))
        .unwrap_or_else(|e| panic!("{yaml}: {e}"))
        .membership
    }

    fn at(port: &str, p: k8s_openapi::api::core::v1::Pod) -> Subject {
        subject(p, port, "127.0.0.1".parse().unwrap(), 9)
    }

    #[tokio::test]
    async fn a_ca_file_is_read_at_build_and_its_errors_name_the_field() {
        let ctx = BuildContext::default();
        let build_with = |file: &std::path::Path| {
            expr(&format!(
                "{{perPort: {{ports: {{admin: {{httpGet: {{scheme: HTTPS, caFile: '{}'}}}}}}}}}}",
                file.display()
            ))
        };
        let dir = std::env::temp_dir().join(format!("portwise-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("missing.pem");
        let e = build(&build_with(&missing), &ctx).await.err().unwrap();
        assert_eq!(e.path, "membership.perPort.ports.admin.httpGet.caFile");
        assert!(
            matches!(&e.kind, BuildErrorKind::CaFileRead { file, source }
                if *file == missing && source.kind() == std::io::ErrorKind::NotFound),
            "{e}"
        );
        assert!(
            e.to_string()
                .starts_with(&format!("{}: {}", e.path, missing.display())),
            "{e}"
        );
        let garbage = dir.join("garbage.pem");
        std::fs::write(&garbage, "not a certificate").unwrap();
        let e = build(&build_with(&garbage), &ctx).await.err().unwrap();
        assert_eq!(e.path, "membership.perPort.ports.admin.httpGet.caFile");
        assert!(
            matches!(&e.kind, BuildErrorKind::CaFile { file, source: TlsError::NoCertificate }
                if *file == garbage),
            "{e}"
        );
        assert!(e.to_string().contains("no PEM certificate"), "{e}");
        // HTTPS without a bundle builds (the kubelet's unverified HTTPS).
        build(&expr("{httpGet: {scheme: HTTPS, port: 8443}}"), &ctx)
            .await
            .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn builds_every_builtin() {
        let ctx = BuildContext::default();
        let ready = pod("a", Some("True"), &[("ports", "http")]);
        let unready = pod("b", Some("False"), &[]);
        let cases = [
            ("podReady", &ready, Decision::Include),
            ("podReady", &unready, Decision::Exclude),
            ("notTerminating", &unready, Decision::Include),
            ("include", &unready, Decision::Include),
            ("exclude", &ready, Decision::Exclude),
            ("abstain", &ready, Decision::Abstain),
            (
                "{portNames: {annotation: ports}}",
                &ready,
                Decision::Include,
            ),
            ("{portNames: {label: ports}}", &ready, Decision::Exclude),
            ("{not: podReady}", &unready, Decision::Include),
            (
                "{all: [podReady, {portNames: {annotation: ports}}]}",
                &ready,
                Decision::Include,
            ),
            ("{all: [podReady, abstain]}", &ready, Decision::Abstain),
            ("{any: [podReady, abstain]}", &unready, Decision::Abstain),
            ("{any: [podReady, include]}", &unready, Decision::Include),
            (
                "{perPort: {ports: {http: include}}}",
                &ready,
                Decision::Include,
            ),
            (
                "{perPort: {ports: {other: include}}}",
                &ready,
                Decision::Exclude,
            ),
            (
                "{perPort: {ports: {other: exclude}, fallback: abstain}}",
                &ready,
                Decision::Abstain,
            ),
            (
                "{stable: {checker: podReady, successThreshold: 2}}",
                &ready,
                Decision::Include,
            ),
        ];
        for (yaml, p, want) in cases {
            let c = build(&expr(yaml), &ctx).await.unwrap();
            assert_eq!(
                c.check(&at("http", p.clone())).await.decision,
                want,
                "{yaml}"
            );
        }
    }

    /// Which trees may open a connection (and so take a check permit):
    /// any with a probe anywhere, no other (issue 45).
    #[tokio::test]
    async fn only_trees_with_a_probe_say_they_probe() {
        let ctx = BuildContext::default();
        for (yaml, probes) in [
            ("podReady", false),
            ("notTerminating", false),
            ("include", false),
            ("{portNames: {annotation: ports}}", false),
            ("{all: [podReady, {not: notTerminating}]}", false),
            ("{perPort: {ports: {http: podReady}}}", false),
            ("{stable: {checker: podReady, successThreshold: 2}}", false),
            ("{tcpDial: {timeout: 1s}}", true),
            ("{httpGet: {path: /healthz}}", true),
            ("{all: [podReady, {tcpDial: {timeout: 1s}}]}", true),
            ("{any: [podReady, {not: {httpGet: {path: /}}}]}", true),
            (
                "{perPort: {ports: {http: podReady}, fallback: {tcpDial: {timeout: 1s}}}}",
                true,
            ),
            ("{perPort: {ports: {http: {tcpDial: {timeout: 1s}}}}}", true),
            (
                "{stable: {checker: {tcpDial: {timeout: 1s}}, successThreshold: 2}}",
                true,
            ),
        ] {
            let c = build(&expr(yaml), &ctx).await.unwrap();
            assert_eq!(c.probes(), probes, "{yaml}");
        }
    }

    #[tokio::test]
    async fn probe_checkers_hit_the_subject_address_and_target() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let c = build(&expr("{tcpDial: {timeout: 1s}}"), &BuildContext::default())
            .await
            .unwrap();
        let s = subject(
            pod("a", None, &[]),
            "tcp",
            "127.0.0.1".parse().unwrap(),
            port,
        );
        assert_eq!(c.check(&s).await.decision, Decision::Include);
        let c = build(
            &expr("{httpGet: {path: /healthz, timeout: 200ms}}"),
            &BuildContext::default(),
        )
        .await
        .unwrap();
        // The listener never answers HTTP: the probe times out, the pod is out.
        assert_eq!(c.check(&s).await.decision, Decision::Exclude);
    }

    #[tokio::test]
    async fn wasm_without_provider_is_an_error_naming_the_path() {
        let e = build(
            &expr("{perPort: {ports: {admin: {wasm: {module: a.wasm}}}}}"),
            &BuildContext::default(),
        )
        .await
        .unwrap_err();
        assert_eq!(e.path, "membership.perPort.ports.admin.wasm");
        assert!(
            e.to_string()
                .starts_with("membership.perPort.ports.admin.wasm: "),
            "{e}"
        );
        let e = build(
            &expr("{all: [podReady, {not: {wasm: {module: a.wasm}}}]}"),
            &BuildContext::default(),
        )
        .await
        .unwrap_err();
        assert_eq!(e.path, "membership.all[1].not.wasm");
    }

    /// A provider that records what it was asked for.
    #[derive(Default)]
    struct FakeWasm(Mutex<Vec<(String, serde_json::Value, Option<String>)>>);

    #[derive(Debug)]
    struct Answer(Decision);
    impl Checker for Answer {
        fn check<'a>(&'a self, _: &'a Subject) -> BoxFuture<'a, Verdict> {
            Box::pin(std::future::ready(Verdict {
                decision: self.0,
                reason: None,
            }))
        }
    }

    impl WasmCheckers for FakeWasm {
        fn checker<'a>(
            &'a self,
            spec: &'a WasmSpec,
        ) -> BoxFuture<'a, Result<Arc<dyn Checker>, ProviderError>> {
            self.0.lock().unwrap().push((
                spec.module.clone(),
                spec.config.clone(),
                spec.sha256.clone(),
            ));
            Box::pin(async move {
                if spec.module == "broken.wasm" {
                    return Err("failed to compile: bad magic".into());
                }
                Ok(Arc::new(Answer(Decision::Include)) as Arc<dyn Checker>)
            })
        }
    }

    #[tokio::test]
    async fn wasm_goes_through_the_provider() {
        let provider = FakeWasm::default();
        let ctx = BuildContext {
            wasm: Some(&provider),
            ..Default::default()
        };
        let sum = "ab".repeat(32);
        let c = build(
            &expr(&format!(
                "{{wasm: {{module: admin-check.wasm, config: {{minReplicas: 2}}, sha256: {sum}}}}}"
            )),
            &ctx,
        )
        .await
        .unwrap();
        assert_eq!(
            c.check(&at("admin", pod("a", None, &[]))).await.decision,
            Decision::Include
        );
        assert_eq!(
            provider.0.lock().unwrap()[0],
            (
                "admin-check.wasm".into(),
                serde_json::json!({"minReplicas": 2}),
                Some(sum)
            )
        );
        let e = build(
            &expr("{any: [exclude, {wasm: {module: broken.wasm}}]}"),
            &ctx,
        )
        .await
        .unwrap_err();
        assert_eq!(e.path, "membership.any[1].wasm");
        assert!(matches!(e.kind, BuildErrorKind::Wasm(_)), "{e:?}");
        assert_eq!(
            e.to_string(),
            "membership.any[1].wasm: failed to compile: bad magic"
        );
    }

    #[tokio::test]
    async fn seed_config_builds_and_routes() {
        let yaml = r#"
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
        let config = Config::from_yaml(yaml).unwrap();
        let provider = FakeWasm::default();
        let ctx = BuildContext {
            wasm: Some(&provider),
            stable_ttl: BuildContext::stable_ttl_for(config.resync_period),
            stable_spacing: BuildContext::stable_spacing_for(config.resync_period),
        };
        let c = build(&config.membership, &ctx).await.unwrap();
        let key = "port-mapper.example.com/ports";
        // Fallback port: podReady and portNames decide, no probe runs.
        assert_eq!(
            c.check(&at("metrics", pod("a", Some("True"), &[(key, "metrics")])))
                .await
                .decision,
            Decision::Include
        );
        assert_eq!(
            c.check(&at("metrics", pod("a", Some("True"), &[(key, "http")])))
                .await
                .decision,
            Decision::Exclude
        );
        // http: an unready pod is excluded before the probe would run.
        assert_eq!(
            c.check(&at("http", pod("a", Some("False"), &[])))
                .await
                .decision,
            Decision::Exclude
        );
        // admin goes to the wasm provider.
        assert_eq!(
            c.check(&at("admin", pod("a", None, &[]))).await.decision,
            Decision::Include
        );
    }
}
