//! Which membership expression decides a Service: `membership`, or one of
//! the named `policies` that the Service's annotation picks.
//!
//! Checkers are otherwise chosen by port name for the whole cluster
//! (`perPort`), so two Services with an `http` port could not be decided
//! differently. A policy is chosen per Service, among expressions the
//! operator wrote: the annotation only names one. A name the file does not
//! have is an error that holds the Service as it is (the controller keeps
//! what is published and warns); falling back to `membership` would let a
//! typo change what a Service publishes without a word.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Service;

use crate::config::Config;

/// The expression that decides a Service.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Policy {
    /// `membership`: the annotation is absent or empty.
    Default,
    /// `policies.NAME`.
    Named(String),
}

impl Policy {
    /// How the policy is named in logs, metrics, Events and `check`:
    /// `membership` or `policies.NAME`, the config file's own path.
    pub fn label(&self) -> String {
        match self {
            Policy::Default => "membership".into(),
            Policy::Named(n) => format!("policies.{n}"),
        }
    }
}

/// A Service's annotation named a policy the file does not have.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownPolicy {
    pub name: String,
    /// The names the file has, for the message.
    pub known: Vec<String>,
}

impl std::fmt::Display for UnknownPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "policy {:?} is not in the configuration's policies",
            self.name
        )?;
        match self.known.as_slice() {
            [] => write!(f, " (it has none)"),
            known => write!(f, " ({})", known.join(", ")),
        }?;
        write!(
            f,
            "; what is published for this Service is kept until the name is fixed"
        )
    }
}

/// The policy `service` picks, by `config.policyAnnotation`.
///
/// A policy scoped to other namespaces (`policyScopes`) is refused like a
/// name the file does not have, and the error lists only the policies the
/// Service's namespace may pick: a team learns nothing of another's.
pub fn choose(service: &Service, config: &Config) -> Result<Policy, UnknownPolicy> {
    let may_pick = |name: &str| self::may_pick(&config.policy_scopes, name, service);
    match crate::align::picked_by_annotation(&service.metadata, &config.policy_annotation) {
        None => Ok(Policy::Default),
        Some(name) if config.policies.contains_key(name) && may_pick(name) => {
            Ok(Policy::Named(name.to_string()))
        }
        Some(name) => Err(UnknownPolicy {
            name: name.to_string(),
            known: config
                .policies
                .keys()
                .filter(|n| may_pick(n))
                .cloned()
                .collect(),
        }),
    }
}

/// Whether `service`'s namespace may pick `name` under `scopes` (a name
/// not scoped may be picked from every namespace).
pub(crate) fn may_pick(
    scopes: &BTreeMap<String, Vec<String>>,
    name: &str,
    service: &Service,
) -> bool {
    let ns = service.metadata.namespace.as_deref().unwrap_or_default();
    scopes
        .get(name)
        .is_none_or(|allowed| allowed.iter().any(|a| a == ns))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn config() -> Config {
        Config::from_yaml(
            "serviceKey: {label: app.example.com/group}\n\
             membership: podReady\n\
             policies:\n  strict: {all: [podReady, {tcpDial: {timeout: 1s}}]}\n  lenient: notTerminating\n",
        )
        .unwrap()
    }

    fn annotated(value: Option<&str>) -> Service {
        Service {
            metadata: ObjectMeta {
                annotations: value.map(|v| {
                    BTreeMap::from([("portwise.io/membership".to_string(), v.to_string())])
                }),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn the_annotation_picks_a_policy_and_its_absence_the_default() {
        let cfg = config();
        assert_eq!(choose(&annotated(None), &cfg), Ok(Policy::Default));
        assert_eq!(choose(&annotated(Some(" ")), &cfg), Ok(Policy::Default));
        assert_eq!(
            choose(&annotated(Some("strict")), &cfg),
            Ok(Policy::Named("strict".into()))
        );
        assert_eq!(Policy::Named("strict".into()).label(), "policies.strict");
        assert_eq!(Policy::Default.label(), "membership");
    }

    #[test]
    fn an_unknown_name_is_an_error_not_the_default() {
        let err = choose(&annotated(Some("strcit")), &config()).unwrap_err();
        assert_eq!(err.name, "strcit");
        let text = err.to_string();
        assert!(
            text.contains("\"strcit\"")
                && text.contains("lenient, strict")
                && text.contains("kept"),
            "{text}"
        );
    }

    #[test]
    fn policies_are_validated_like_membership() {
        for (yaml, at) in [
            ("policies: {Strict: podReady}", "policies.Strict"),
            (
                "policies: {strict: {tcpDial: {timeout: 0s}}}",
                "policies.strict.tcpDial.timeout",
            ),
            ("policyAnnotation: 'not a key!'", "policyAnnotation"),
        ] {
            let err = Config::from_yaml(&format!(
                "serviceKey: {{label: app.example.com/group}}\nmembership: podReady\n{yaml}\n"
            ))
            .unwrap_err()
            .to_string();
            assert!(err.contains(at), "{yaml}: {err}");
        }
    }

    /// Issue 45: a policy scoped to team-b's namespace is held and reported
    /// like an unknown name when a Service of another namespace picks it,
    /// and the message lists only what that namespace may pick. Fails
    /// when any namespace may pick any policy.
    #[test]
    fn a_scoped_policy_is_picked_only_from_its_namespaces() {
        let cfg = Config::from_yaml(
            "serviceKey: {label: app.example.com/group}\n\
             membership: podReady\n\
             policies:\n  strict: notTerminating\n  team-b-admin: {httpGet: {path: /admin}}\n\
             policyScopes:\n  team-b-admin: [team-b, team-b-canary]\n",
        )
        .unwrap();
        let in_ns = |ns: &str| {
            let mut svc = annotated(Some("team-b-admin"));
            svc.metadata.namespace = Some(ns.into());
            svc
        };
        assert_eq!(
            choose(&in_ns("team-b"), &cfg),
            Ok(Policy::Named("team-b-admin".into()))
        );
        let err = choose(&in_ns("team-a"), &cfg).unwrap_err();
        assert_eq!(err.name, "team-b-admin");
        assert_eq!(err.known, vec!["strict".to_string()], "{err}");
        // Unscoped policies stay open to every namespace.
        let mut strict = annotated(Some("strict"));
        strict.metadata.namespace = Some("team-a".into());
        assert_eq!(choose(&strict, &cfg), Ok(Policy::Named("strict".into())));
    }

    #[test]
    fn scopes_name_expressions_and_namespaces() {
        for (yaml, at) in [
            ("policyScopes: {nope: [a]}", "policyScopes.nope"),
            ("policyScopes: {strict: []}", "policyScopes.strict"),
            (
                "policyScopes: {strict: [Not_A_Namespace]}",
                "policyScopes.strict[0]",
            ),
            (
                "shadow: {expressions: {x: podReady}, scopes: {y: [a]}}",
                "shadow.scopes.y",
            ),
        ] {
            let err = Config::from_yaml(&format!(
                "serviceKey: {{label: app.example.com/group}}\nmembership: podReady\n\
                 policies: {{strict: podReady}}\n{yaml}\n"
            ))
            .unwrap_err()
            .to_string();
            assert!(err.contains(at), "{yaml}: {err}");
        }
    }
}
