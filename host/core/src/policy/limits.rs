//! The operator's limits on a team's `MembershipPolicy`
//! ([`PolicyLimits`], the config file's `membershipPolicies`): what an
//! expression of a policy object may ask portwise to run.
//!
//! Why here and not in the schema: the limits are the operator's, in the
//! config file, and change with it; the CRD's schema is the same in every
//! cluster. Why refusals name fields: a team reads the message in its
//! policy's `Accepted` condition, and should find the field it has to
//! change the way an operator finds it in the file's errors.

use std::time::Duration;

use crate::config::{CheckerExpr, ConfigError, PolicyLimits};

impl PolicyLimits {
    /// Whether `expr`, found at `path` of a policy object
    /// (`spec.membership`), stays within the limits. `expr` is valid
    /// already ([`CheckerExpr::from_json`]); the error names the first
    /// field past a limit.
    pub fn admit(&self, expr: &CheckerExpr, path: &str) -> Result<(), ConfigError> {
        self.walk(expr, path)
            .map_err(|(path, message)| ConfigError::Invalid {
                file: None,
                path,
                message,
                line: None,
                column: None,
            })
    }

    fn walk(&self, expr: &CheckerExpr, at: &str) -> Result<(), (String, String)> {
        let kind = expr.kind();
        let here = format!("{at}.{kind}");
        let allowed = |kind: &str| self.checkers.iter().any(|c| c == kind);
        match expr {
            CheckerExpr::Include | CheckerExpr::Exclude | CheckerExpr::Abstain => return Ok(()),
            CheckerExpr::All(xs) | CheckerExpr::Any(xs) => {
                return xs
                    .iter()
                    .enumerate()
                    .try_for_each(|(i, x)| self.walk(x, &format!("{here}[{i}]")));
            }
            CheckerExpr::Not(x) => return self.walk(x, &here),
            CheckerExpr::Stable(s) => return self.walk(&s.checker, &format!("{here}.checker")),
            CheckerExpr::PerPort(p) => {
                for (name, x) in &p.ports {
                    self.walk(x, &format!("{here}.ports.{name}"))?;
                }
                return match &p.fallback {
                    Some(f) => self.walk(f, &format!("{here}.fallback")),
                    None => Ok(()),
                };
            }
            _ if !allowed(kind) => {
                let at = match expr {
                    // A bare word sits at `at` itself.
                    CheckerExpr::PodReady | CheckerExpr::NotTerminating => at.to_owned(),
                    _ => here,
                };
                return Err((
                    at,
                    format!(
                        "{kind} is not allowed in a MembershipPolicy here; the operator allows {}",
                        self.checkers.join(", ")
                    ),
                ));
            }
            _ => {}
        }
        let timeout = |t: Duration| {
            if t > self.max_probe_timeout {
                Err((
                    format!("{here}.timeout"),
                    format!(
                        "{} is above the operator's maximum of {} for policy objects",
                        humantime::format_duration(t),
                        humantime::format_duration(self.max_probe_timeout)
                    ),
                ))
            } else {
                Ok(())
            }
        };
        match expr {
            CheckerExpr::TcpDial(s) => timeout(s.timeout),
            CheckerExpr::Grpc(s) => timeout(s.timeout),
            CheckerExpr::HttpGet(s) => {
                if s.ca_file.is_some() {
                    // A path on portwise's own filesystem: a team must not
                    // have it read files it cannot read itself.
                    return Err((
                        format!("{here}.caFile"),
                        "a MembershipPolicy cannot name a file of portwise's: leave caFile out \
                         (the certificate is then not verified), or ask the operator for a policy \
                         in the config file"
                            .into(),
                    ));
                }
                timeout(s.timeout)
            }
            CheckerExpr::Wasm(spec) => self.admit_module(spec, &here),
            _ => Ok(()),
        }
    }

    /// A policy object's module: `oci://`, pinned by digest, from one of
    /// `moduleRepositories`.
    fn admit_module(
        &self,
        spec: &crate::config::WasmSpec,
        here: &str,
    ) -> Result<(), (String, String)> {
        let at = format!("{here}.module");
        let Some(Ok(oci)) = spec.oci() else {
            return Err((
                at,
                format!(
                    "{:?}: a MembershipPolicy's module is an OCI artifact pinned by digest, \
                     oci://REGISTRY/REPOSITORY@sha256:HEX (modulesDir is the operator's)",
                    spec.module
                ),
            ));
        };
        if oci.digest.is_none() || spec.allow_tags {
            return Err((
                if spec.allow_tags {
                    format!("{here}.allowTags")
                } else {
                    at
                },
                "a MembershipPolicy's module is pinned by digest (@sha256:HEX); tags are not allowed"
                    .into(),
            ));
        }
        let repository = format!("{}/{}", oci.registry, oci.repository);
        let within = |prefix: &String| {
            repository == *prefix
                || repository
                    .strip_prefix(prefix.as_str())
                    .is_some_and(|rest| rest.starts_with('/'))
        };
        if self.module_repositories.iter().any(within) {
            Ok(())
        } else if self.module_repositories.is_empty() {
            Err((at, "the operator allows modules from no repository".into()))
        } else {
            Err((
                at,
                format!(
                    "{repository} is not a repository the operator allows modules from ({})",
                    self.module_repositories.join(", ")
                ),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn refusal(limits: &PolicyLimits, spec: serde_json::Value) -> Option<String> {
        let expr = CheckerExpr::from_json(&spec, "spec.membership", true).expect("valid");
        limits
            .admit(&expr, "spec.membership")
            .err()
            .map(|e| e.to_string())
    }

    #[test]
    fn built_ins_are_allowed_by_default_and_wasm_is_not() {
        let limits = PolicyLimits::default();
        assert_eq!(
            refusal(
                &limits,
                json!({"all": ["podReady", {"not": {"httpGet": {"path": "/ready", "timeout": "2s"}}},
                                {"perPort": {"ports": {"db": {"tcpDial": {}}}, "fallback": "include"}}]})
            ),
            None
        );
        let wasm = json!({"any": ["exclude", {"wasm": {"module": format!("oci://registry.example/team-a/check@{DIGEST}")}}]});
        let err = refusal(&limits, wasm).unwrap();
        assert!(
            err.contains("spec.membership.any[1].wasm") && err.contains("not allowed"),
            "{err}"
        );
    }

    #[test]
    fn a_bare_word_outside_the_list_is_named_where_it_sits() {
        let limits = PolicyLimits {
            checkers: vec!["tcpDial".into()],
            ..Default::default()
        };
        let err = refusal(&limits, json!({"all": ["include", "podReady"]})).unwrap();
        assert!(
            err.starts_with("spec.membership.all[1]: podReady is not allowed"),
            "{err}"
        );
        assert!(err.contains("allows tcpDial"), "{err}");
    }

    #[test]
    fn timeouts_past_the_operators_maximum_are_refused() {
        let limits = PolicyLimits {
            max_probe_timeout: Duration::from_secs(2),
            ..Default::default()
        };
        assert_eq!(
            refusal(&limits, json!({"tcpDial": {"timeout": "2s"}})),
            None
        );
        let err = refusal(
            &limits,
            json!({"stable": {"checker": {"grpc": {"timeout": "3s"}}}}),
        )
        .unwrap();
        assert!(
            err.starts_with("spec.membership.stable.checker.grpc.timeout: 3s is above"),
            "{err}"
        );
    }

    #[test]
    fn a_policy_object_never_names_a_file_of_portwise() {
        let err = refusal(
            &PolicyLimits::default(),
            json!({"httpGet": {"scheme": "HTTPS", "caFile": "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"}}),
        )
        .unwrap();
        assert!(err.starts_with("spec.membership.httpGet.caFile:"), "{err}");
    }

    #[test]
    fn modules_come_by_digest_from_the_allowed_repositories_only() {
        let limits = PolicyLimits {
            checkers: vec!["wasm".into()],
            module_repositories: vec!["registry.example/team-a".into()],
            ..Default::default()
        };
        let module = |m: String| json!({"wasm": {"module": m}});
        assert_eq!(
            refusal(
                &limits,
                module(format!("oci://registry.example/team-a/check@{DIGEST}"))
            ),
            None
        );
        assert_eq!(
            refusal(
                &limits,
                module(format!("oci://registry.example/team-a@{DIGEST}"))
            ),
            None
        );
        for (m, says) in [
            (
                format!("oci://registry.example/team-ab/check@{DIGEST}"),
                "is not a repository the operator allows",
            ),
            (
                format!("oci://other.example/team-a/check@{DIGEST}"),
                "is not a repository the operator allows",
            ),
            ("check.wasm".to_string(), "modulesDir is the operator's"),
        ] {
            let err = refusal(&limits, module(m.clone())).unwrap();
            assert!(
                err.starts_with("spec.membership.wasm.module:") && err.contains(says),
                "{m}: {err}"
            );
        }
        let tagged = json!({"wasm": {"module": "oci://registry.example/team-a/check:v1", "allowTags": true}});
        let err = refusal(&limits, tagged).unwrap();
        assert!(err.starts_with("spec.membership.wasm.allowTags:"), "{err}");
    }
}
