//! Which membership expression decides a Service: `membership`, one of
//! the named `policies` that the Service's annotation picks, or a
//! `MembershipPolicy` object of the Service's own namespace.
//!
//! Checkers are otherwise chosen by port name for the whole cluster
//! (`perPort`), so two Services with an `http` port could not be decided
//! differently. A policy is chosen per Service, among expressions the
//! operator wrote or allowed: the annotation only names one. A name that
//! names nothing is an error that holds the Service as it is (the
//! controller keeps what is published and warns); falling back to
//! `membership` would let a typo change what a Service publishes without a
//! word. A policy object that is not ready (refused, or its modules not
//! loaded) holds its Services the same way.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Service;

use crate::config::Config;

mod limits;

/// The expression that decides a Service.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Policy {
    /// `membership`: nothing picks another.
    Default,
    /// `policies.NAME`.
    Named(String),
    /// The `MembershipPolicy` NAME of the Service's namespace.
    Object(String),
}

impl Policy {
    /// How the policy is named in logs, metrics, Events and `check`:
    /// `membership` or `policies.NAME`, the config file's own path, or
    /// `membershippolicy/NAME`, as kubectl names the object.
    pub fn label(&self) -> String {
        match self {
            Policy::Default => "membership".into(),
            Policy::Named(n) => format!("policies.{n}"),
            Policy::Object(n) => format!("membershippolicy/{n}"),
        }
    }
}

/// One `MembershipPolicy` of the Service's namespace, as far as choosing
/// goes: the controller's view of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyObject {
    pub name: String,
    /// `metadata.creationTimestamp`, in seconds: of several objects whose
    /// selector matches a Service, the oldest decides.
    pub created: i64,
    /// Its `spec.services.selector` matches the Service.
    pub selects: bool,
    /// Whether it can decide.
    pub standing: Standing,
}

/// Whether a policy object can decide.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Standing {
    /// Accepted, its checker built.
    Ready,
    /// Not (yet) able to decide: why, as its status says.
    NotReady(String),
}

/// Why no policy was chosen: the Service is held as it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotChosen {
    /// The annotation names nothing this namespace may pick.
    Unknown(UnknownPolicy),
    /// The policy object that would decide cannot (yet).
    NotReady { name: String, why: String },
}

impl NotChosen {
    /// The name the Service picked (or the object that selects it).
    pub fn name(&self) -> &str {
        match self {
            NotChosen::Unknown(u) => &u.name,
            NotChosen::NotReady { name, .. } => name,
        }
    }
}

impl std::fmt::Display for NotChosen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotChosen::Unknown(u) => u.fmt(f),
            NotChosen::NotReady { name, why } => write!(
                f,
                "MembershipPolicy {name:?} cannot decide yet ({why}); what is published for this \
                 Service is kept until it can"
            ),
        }
    }
}

/// A Service's annotation named a policy the namespace does not have.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownPolicy {
    pub name: String,
    /// The names the Service could pick, for the message.
    pub known: Vec<String>,
    /// Whether policy objects are read (`membershipPolicies`), so that
    /// the message says where a name could have come from.
    pub objects: bool,
}

impl std::fmt::Display for UnknownPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.objects {
            write!(
                f,
                "policy {:?} is neither a MembershipPolicy of this namespace nor in the configuration's policies",
                self.name
            )?;
        } else {
            write!(
                f,
                "policy {:?} is not in the configuration's policies",
                self.name
            )?;
        }
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

/// The policy `service` picks: by `config.policyAnnotation`, a policy
/// object of its namespace (`objects`) first, then one of the file's
/// `policies`; without the annotation, the oldest object whose selector
/// matches it, else `membership`.
///
/// A policy scoped to other namespaces (`policyScopes`) is refused like a
/// name the file does not have, and the error lists only the policies the
/// Service's namespace may pick: a team learns nothing of another's.
pub fn choose(
    service: &Service,
    config: &Config,
    objects: &[PolicyObject],
) -> Result<Policy, NotChosen> {
    let may_pick = |name: &str| self::may_pick(&config.policy_scopes, name, service);
    let object = |o: &PolicyObject| match &o.standing {
        Standing::Ready => Ok(Policy::Object(o.name.clone())),
        Standing::NotReady(why) => Err(NotChosen::NotReady {
            name: o.name.clone(),
            why: why.clone(),
        }),
    };
    match crate::align::picked_by_annotation(&service.metadata, &config.policy_annotation) {
        None => objects
            .iter()
            .filter(|o| o.selects)
            .min_by(|a, b| (a.created, &a.name).cmp(&(b.created, &b.name)))
            .map_or(Ok(Policy::Default), object),
        Some(name) => {
            if let Some(o) = objects.iter().find(|o| o.name == name) {
                object(o)
            } else if config.policies.contains_key(name) && may_pick(name) {
                Ok(Policy::Named(name.to_string()))
            } else {
                let mut known: Vec<String> = objects.iter().map(|o| o.name.clone()).collect();
                known.extend(config.policies.keys().filter(|n| may_pick(n)).cloned());
                known.sort();
                known.dedup();
                Err(NotChosen::Unknown(UnknownPolicy {
                    name: name.to_string(),
                    known,
                    objects: config.membership_policies.is_some(),
                }))
            }
        }
    }
}

/// Which of a namespace's policy objects are past `max` (the operator's
/// `maxPerNamespace`): the newest. `objects` are (created, name).
pub fn over_budget<'a>(objects: &[(i64, &'a str)], max: usize) -> Vec<&'a str> {
    let mut sorted = objects.to_vec();
    sorted.sort();
    sorted.into_iter().skip(max).map(|(_, n)| n).collect()
}

/// A policy whose modules would take its namespace past the operator's
/// `maxModulesPerNamespace`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "with this policy's modules, the namespace's policies would name {count} modules; \
     the operator allows {max} (membershipPolicies.maxModulesPerNamespace)"
)]
pub struct ModulesOverBudget {
    pub count: usize,
    pub max: usize,
}

/// The modules a namespace's policies name once a policy naming `adding`
/// joins those naming `held` (a module named twice counts once), or why
/// that is past `max`. One rule for the controller and `check --live`.
pub fn with_modules(
    held: &BTreeSet<String>,
    adding: impl IntoIterator<Item = String>,
    max: usize,
) -> Result<BTreeSet<String>, ModulesOverBudget> {
    let mut all = held.clone();
    all.extend(adding);
    if all.len() > max {
        Err(ModulesOverBudget {
            count: all.len(),
            max,
        })
    } else {
        Ok(all)
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
        assert_eq!(choose(&annotated(None), &cfg, &[]), Ok(Policy::Default));
        assert_eq!(
            choose(&annotated(Some(" ")), &cfg, &[]),
            Ok(Policy::Default)
        );
        assert_eq!(
            choose(&annotated(Some("strict")), &cfg, &[]),
            Ok(Policy::Named("strict".into()))
        );
        assert_eq!(Policy::Named("strict".into()).label(), "policies.strict");
        assert_eq!(Policy::Default.label(), "membership");
    }

    #[test]
    fn an_unknown_name_is_an_error_not_the_default() {
        let err = choose(&annotated(Some("strcit")), &config(), &[]).unwrap_err();
        assert_eq!(err.name(), "strcit");
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
            choose(&in_ns("team-b"), &cfg, &[]),
            Ok(Policy::Named("team-b-admin".into()))
        );
        let NotChosen::Unknown(err) = choose(&in_ns("team-a"), &cfg, &[]).unwrap_err() else {
            panic!("an unknown name")
        };
        assert_eq!(err.name, "team-b-admin");
        assert_eq!(err.known, vec!["strict".to_string()], "{err}");
        // Unscoped policies stay open to every namespace.
        let mut strict = annotated(Some("strict"));
        strict.metadata.namespace = Some("team-a".into());
        assert_eq!(
            choose(&strict, &cfg, &[]),
            Ok(Policy::Named("strict".into()))
        );
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

    fn object(name: &str, created: i64, selects: bool, standing: Standing) -> PolicyObject {
        PolicyObject {
            name: name.into(),
            created,
            selects,
            standing,
        }
    }

    /// Issue 48: a Service's annotation names a policy object of its
    /// namespace before one of the file's; an object that cannot decide
    /// holds the Service; an unknown name lists both kinds. Fails when the
    /// file's policy of the same name wins, or when a not-ready object
    /// falls back to `membership`.
    #[test]
    fn the_annotation_names_an_object_of_the_namespace_first() {
        let cfg = config();
        let objects = [
            object("strict", 10, false, Standing::Ready),
            object(
                "broken",
                11,
                false,
                Standing::NotReady("spec.membership: bad".into()),
            ),
        ];
        assert_eq!(
            choose(&annotated(Some("strict")), &cfg, &objects),
            Ok(Policy::Object("strict".into()))
        );
        assert_eq!(
            choose(&annotated(Some("lenient")), &cfg, &objects),
            Ok(Policy::Named("lenient".into()))
        );
        let held = choose(&annotated(Some("broken")), &cfg, &objects).unwrap_err();
        assert_eq!(held.name(), "broken");
        assert!(held.to_string().contains("spec.membership: bad"), "{held}");
        let NotChosen::Unknown(u) = choose(&annotated(Some("nope")), &cfg, &objects).unwrap_err()
        else {
            panic!("an unknown name")
        };
        assert_eq!(u.known, ["broken", "lenient", "strict"]);
        // Without annotation and selector: the file's `membership`.
        assert_eq!(
            choose(&annotated(None), &cfg, &objects),
            Ok(Policy::Default)
        );
        assert_eq!(
            Policy::Object("strict".into()).label(),
            "membershippolicy/strict"
        );
    }

    /// The oldest object whose selector matches decides a Service without
    /// the annotation (by name among equals); the annotation still wins.
    #[test]
    fn of_objects_that_select_a_service_the_oldest_decides() {
        let cfg = config();
        let objects = [
            object("newer", 20, true, Standing::Ready),
            object("b-old", 10, true, Standing::Ready),
            object("a-old", 10, true, Standing::Ready),
            object("oldest", 1, false, Standing::Ready),
        ];
        assert_eq!(
            choose(&annotated(None), &cfg, &objects),
            Ok(Policy::Object("a-old".into()))
        );
        assert_eq!(
            choose(&annotated(Some("newer")), &cfg, &objects),
            Ok(Policy::Object("newer".into()))
        );
        let held = [object("sel", 1, true, Standing::NotReady("modules".into()))];
        assert!(matches!(
            choose(&annotated(None), &cfg, &held),
            Err(NotChosen::NotReady { .. })
        ));
    }

    #[test]
    fn the_newest_objects_past_the_budget_are_not_read() {
        let objects = [(30, "c"), (10, "a"), (20, "b"), (20, "a2")];
        assert_eq!(over_budget(&objects, 2), ["b", "c"]);
        assert!(over_budget(&objects, 4).is_empty());
    }

    #[test]
    fn a_module_named_twice_counts_once_against_the_budget() {
        let held: BTreeSet<String> = ["oci://r/a".to_string()].into();
        let again = with_modules(&held, ["oci://r/a".to_string()], 1).unwrap();
        assert_eq!(again, held);
        let over = with_modules(&held, ["oci://r/b".to_string()], 1).unwrap_err();
        assert_eq!(over, ModulesOverBudget { count: 2, max: 1 });
        assert!(
            over.to_string()
                .contains("would name 2 modules; the operator allows 1")
        );
    }
}
