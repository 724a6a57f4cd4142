//! Teams' `MembershipPolicy` objects (issue 48): what the controller knows
//! of each ([`Book`]), how one is read and built (`read.rs`), and the status
//! written back (`status.rs`). The watch and the task that keeps the book
//! are the wiring's (`wiring/policies.rs`).
//!
//! Why a book beside the judge's checkers: the config file's policies are
//! built once, at start; a policy object comes, changes and goes while
//! portwise runs, and its checker is rebuilt on every edit of its spec.
//! The book holds each object's latest build under a revision, so that a
//! verdict reached with an older build is never reused
//! (`crate::judge::memory::Basis`), and the core chooses among the
//! objects through the same view the status counts with
//! ([`Book::objects`]).
//!
//! Only the config file's `membershipPolicies` turns this on: without it,
//! the objects are not watched and the book stays empty, so nothing a team
//! writes can make portwise run anything.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, RwLock,
        atomic::{AtomicU64, Ordering},
    },
};

use k8s_openapi::api::core::v1::Service;
use kube::{
    ResourceExt,
    core::{Selector, SelectorExt},
};

use portwise_checkers::Checker;
use portwise_core::policy::{PolicyObject, Standing};

pub(crate) mod read;
pub(crate) mod status;

/// Every policy object's standing and latest build, by namespace and name.
#[derive(Default)]
pub struct Book {
    entries: RwLock<BTreeMap<(String, String), Entry>>,
    revisions: AtomicU64,
}

/// Which of an object's expressions a judge reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    /// `spec.membership`: what is published.
    Membership,
    /// `spec.shadow`: judged beside it, never published.
    Shadow,
}

/// One policy object, as last read.
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    pub(crate) uid: String,
    /// The `metadata.generation` read.
    pub(crate) generation: i64,
    pub(crate) created: i64,
    /// `spec.services.selector`, when it has one and it parsed.
    pub(crate) selector: Option<Selector>,
    /// What the `Accepted` condition says.
    pub(crate) accepted: Verdict,
    /// What the `ModulesReady` condition says (`None` while not accepted).
    pub(crate) modules: Option<Verdict>,
    /// The checker built from the spec, and its revision.
    pub(crate) checker: Option<(Arc<dyn Checker>, u64)>,
    /// The checker built from `spec.shadow`, when it has one (same
    /// revision).
    pub(crate) shadow: Option<Arc<dyn Checker>>,
    /// The modules its accepted spec names (the namespace's module budget).
    pub(crate) named_modules: Vec<String>,
}

/// A condition's outcome: `Ok` with a note, or the reason and message of a
/// refusal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Ok(String),
    Refused {
        reason: &'static str,
        message: String,
    },
}

impl Entry {
    /// Whether it can decide, as the core's choice reads it.
    pub(crate) fn standing(&self) -> Standing {
        match (&self.accepted, &self.modules, &self.checker) {
            (Verdict::Refused { message, .. }, _, _) => {
                Standing::NotReady(format!("not accepted: {message}"))
            }
            (_, Some(Verdict::Refused { message, .. }), _) => {
                Standing::NotReady(format!("modules not ready: {message}"))
            }
            (_, _, Some(_)) => Standing::Ready,
            _ => Standing::NotReady("not read yet".into()),
        }
    }
}

impl Book {
    /// A new revision number for a build.
    pub(crate) fn next_revision(&self) -> u64 {
        self.revisions.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub(crate) fn get(&self, ns: &str, name: &str) -> Option<Entry> {
        let entries = self.entries.read().expect("policy book poisoned");
        entries.get(&(ns.to_owned(), name.to_owned())).cloned()
    }

    pub(crate) fn set(&self, ns: &str, name: &str, entry: Entry) {
        let mut entries = self.entries.write().expect("policy book poisoned");
        entries.insert((ns.to_owned(), name.to_owned()), entry);
    }

    pub(crate) fn remove(&self, ns: &str, name: &str) -> Option<Entry> {
        let mut entries = self.entries.write().expect("policy book poisoned");
        entries.remove(&(ns.to_owned(), name.to_owned()))
    }

    /// The modules named by the accepted objects of `ns` other than
    /// `except`.
    pub(crate) fn modules_in(&self, ns: &str, except: &str) -> std::collections::BTreeSet<String> {
        let entries = self.entries.read().expect("policy book poisoned");
        entries
            .range((ns.to_owned(), String::new())..)
            .take_while(|((n, _), _)| n == ns)
            .filter(|((_, name), _)| name != except)
            .flat_map(|(_, e)| e.named_modules.iter().cloned())
            .collect()
    }

    /// The checker of `ns`'s object `name` (its `spec.membership`, or its
    /// `spec.shadow` for `Side::Shadow`), with its revision, if built.
    pub(crate) fn checker(
        &self,
        ns: &str,
        name: &str,
        side: Side,
    ) -> Option<(Arc<dyn Checker>, u64)> {
        // Under the lock, clone only the checker asked for (an Arc): the
        // judge asks once per Service and reconcile.
        let entries = self.entries.read().expect("policy book poisoned");
        let entry = entries.get(&(ns.to_owned(), name.to_owned()))?;
        let (checker, revision) = entry.checker.as_ref()?;
        match side {
            Side::Membership => Some((checker.clone(), *revision)),
            Side::Shadow => entry.shadow.as_ref().map(|s| (s.clone(), *revision)),
        }
    }

    /// Whether `ns`'s object `name` has a built shadow.
    pub(crate) fn has_shadow(&self, ns: &str, name: &str) -> bool {
        let entries = self.entries.read().expect("policy book poisoned");
        entries
            .get(&(ns.to_owned(), name.to_owned()))
            .is_some_and(|e| e.checker.is_some() && e.shadow.is_some())
    }

    /// The objects of `svc`'s namespace as the core chooses among them,
    /// each saying whether its selector matches `svc`.
    pub(crate) fn objects(&self, svc: &Service) -> Vec<PolicyObject> {
        let ns = svc.namespace().unwrap_or_default();
        let labels = svc.labels();
        let entries = self.entries.read().expect("policy book poisoned");
        entries
            .range((ns.clone(), String::new())..)
            .take_while(|((n, _), _)| *n == ns)
            .map(|((_, name), e)| PolicyObject {
                name: name.clone(),
                created: e.created,
                selects: e.selector.as_ref().is_some_and(|s| s.matches(labels)),
                standing: e.standing(),
            })
            .collect()
    }
}

/// An accepted policy object's expressions.
#[derive(Clone, Debug)]
pub struct Expressions {
    /// `spec.membership`.
    pub membership: portwise_core::config::CheckerExpr,
    /// `spec.shadow`, when it has one.
    pub shadow: Option<portwise_core::config::CheckerExpr>,
}

/// A namespace's policy objects as the controller reads them, for
/// `portwise check --live`: each as the core chooses among them for `svc`,
/// with its accepted expressions (`None` when not accepted; why is its
/// standing). Modules are not pulled here: the caller builds the ones that
/// decide.
///
/// `objects` in the order of a list (by name), the order in which the
/// controller reads them when it starts: the namespace's budgets refuse
/// what they refuse there (the newest past `maxPerNamespace`; whichever
/// object would take the namespace past `maxModulesPerNamespace`).
pub fn read_objects(
    objects: &[portwise_api::MembershipPolicy],
    limits: &portwise_core::config::PolicyLimits,
    svc: &Service,
) -> Vec<(PolicyObject, Option<Expressions>)> {
    let over = past_budget(objects.iter(), limits.max_per_namespace);
    let mut modules = std::collections::BTreeSet::new();
    objects
        .iter()
        .map(|o| {
            let name = o.name_any();
            let not_accepted = |message: String| {
                (
                    Standing::NotReady(format!("not accepted: {message}")),
                    false,
                    None,
                )
            };
            let (standing, selects, expr) = if over.contains(&name) {
                not_accepted(format!(
                    "more than {} MembershipPolicies in the namespace",
                    limits.max_per_namespace
                ))
            } else {
                match read::accept(&o.spec, limits) {
                    Ok(a) => match portwise_core::policy::with_modules(
                        &modules,
                        a.modules(),
                        limits.max_modules_per_namespace,
                    ) {
                        Err(over) => not_accepted(over.to_string()),
                        Ok(with) => {
                            modules = with;
                            (
                                Standing::Ready,
                                a.selector.as_ref().is_some_and(|s| s.matches(svc.labels())),
                                Some(Expressions {
                                    membership: a.membership,
                                    shadow: a.shadow,
                                }),
                            )
                        }
                    },
                    Err(Verdict::Refused { message, .. }) | Err(Verdict::Ok(message)) => {
                        not_accepted(message)
                    }
                }
            };
            (
                PolicyObject {
                    name,
                    created: created(o),
                    selects,
                    standing,
                },
                expr,
            )
        })
        .collect()
}

/// When `obj` was created, in seconds (an object without the time sorts
/// last: the newest).
pub(crate) fn created(obj: &portwise_api::MembershipPolicy) -> i64 {
    obj.creation_timestamp()
        .map(|t| t.0.as_second())
        .unwrap_or(i64::MAX)
}

/// The names of a namespace's `objects` past `max` (the newest), as
/// [`portwise_core::policy::over_budget`] picks them.
pub(crate) fn past_budget<'a>(
    objects: impl Iterator<Item = &'a portwise_api::MembershipPolicy>,
    max: usize,
) -> Vec<String> {
    let names: Vec<(i64, String)> = objects.map(|o| (created(o), o.name_any())).collect();
    let pairs: Vec<(i64, &str)> = names.iter().map(|(t, n)| (*t, n.as_str())).collect();
    portwise_core::policy::over_budget(&pairs, max)
        .into_iter()
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(
        name: &str,
        created: &str,
        membership: serde_json::Value,
    ) -> portwise_api::MembershipPolicy {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "portwise.io/v1alpha1",
            "kind": "MembershipPolicy",
            "metadata": {"name": name, "namespace": "team", "creationTimestamp": created},
            "spec": {"membership": membership},
        }))
        .unwrap()
    }

    fn module(hex: char) -> serde_json::Value {
        serde_json::json!({"wasm": {"module":
            format!("oci://registry.example/team/check@sha256:{}", hex.to_string().repeat(64))}})
    }

    /// `check --live` refuses what the controller's budgets refuse: past
    /// `maxModulesPerNamespace`, the policy that would take the namespace
    /// over is not accepted; one naming a module already counted is.
    #[test]
    fn check_live_applies_the_namespaces_module_budget() {
        let limits = portwise_core::config::PolicyLimits {
            checkers: vec!["podReady".into(), "wasm".into()],
            module_repositories: vec!["registry.example/team".into()],
            max_modules_per_namespace: 1,
            ..Default::default()
        };
        let objects = [
            policy("a", "2026-01-01T00:00:00Z", module('1')),
            policy("b", "2026-01-02T00:00:00Z", module('2')),
            policy(
                "c",
                "2026-01-03T00:00:00Z",
                serde_json::json!({"all": ["podReady", module('1')]}),
            ),
        ];
        let read = read_objects(&objects, &limits, &Service::default());
        let standing: Vec<_> = read
            .iter()
            .map(|(o, _)| (o.name.as_str(), o.standing.clone()))
            .collect();
        assert_eq!(standing[0], ("a", Standing::Ready));
        assert_eq!(standing[2], ("c", Standing::Ready));
        match &standing[1] {
            ("b", Standing::NotReady(why)) => {
                assert!(
                    why.contains("maxModulesPerNamespace") && why.contains("would name 2"),
                    "{why}"
                )
            }
            other => panic!("b: {other:?}"),
        }
        assert!(read[1].1.is_none(), "a refused policy has no expressions");
    }
}
