//! The combinators: `all`, `any`, `not` and `perPort`. They run their
//! children in order under the algebra's rules, stop once the answer is
//! settled, and pass on the deciding child's reason.

use std::{collections::BTreeMap, sync::Arc};

use portwise_core::membership::{
    Decision, Subject, Verdict,
    algebra::{self, Fold},
};

use crate::{BoxFuture, Checker};

/// Runs children in order under a [`Fold`], stopping once it settles. The
/// verdict carries the reason of the deciding child (or of the first
/// abstaining one).
async fn fold_children(
    mut fold: Fold,
    children: &[Arc<dyn Checker>],
    subject: &Subject,
) -> Verdict {
    let mut first_abstain: Option<Verdict> = None;
    for child in children {
        let v = child.check(subject).await;
        if fold.push(v.decision).is_some() {
            return v;
        }
        if v.decision == Decision::Abstain && first_abstain.is_none() {
            first_abstain = Some(v);
        }
    }
    match fold.finish() {
        Decision::Abstain => first_abstain.unwrap_or_else(Verdict::abstain),
        d => Verdict {
            decision: d,
            reason: None,
        },
    }
}

/// `all(...)`: the first `exclude` wins, later children do not run.
#[derive(Debug)]
pub struct All(pub Vec<Arc<dyn Checker>>);

impl Checker for All {
    fn check<'a>(&'a self, subject: &'a Subject) -> BoxFuture<'a, Verdict> {
        Box::pin(fold_children(Fold::all(), &self.0, subject))
    }

    fn probes(&self) -> bool {
        self.0.iter().any(|c| c.probes())
    }
}

/// `any(...)`: the first `include` wins, later children do not run.
#[derive(Debug)]
pub struct Any(pub Vec<Arc<dyn Checker>>);

impl Checker for Any {
    fn check<'a>(&'a self, subject: &'a Subject) -> BoxFuture<'a, Verdict> {
        Box::pin(async move {
            let v = fold_children(Fold::any(), &self.0, subject).await;
            if v.decision == Decision::Exclude && v.reason.is_none() && !self.0.is_empty() {
                return v.because("any: no checker included");
            }
            v
        })
    }

    fn probes(&self) -> bool {
        self.0.iter().any(|c| c.probes())
    }
}

/// `not(...)`: include ↔ exclude, abstain stays.
#[derive(Debug)]
pub struct Not(pub Arc<dyn Checker>);

impl Checker for Not {
    fn check<'a>(&'a self, subject: &'a Subject) -> BoxFuture<'a, Verdict> {
        Box::pin(async move {
            let v = self.0.check(subject).await;
            Verdict {
                decision: algebra::not(v.decision),
                reason: Some(match v.reason {
                    Some(r) => format!("not: {r}"),
                    None => format!("not: inner checker answered {:?}", v.decision),
                }),
            }
        })
    }

    fn probes(&self) -> bool {
        self.0.probes()
    }
}

/// `perPort({name: checker}, fallback)`: routes by the Service port's name.
#[derive(Debug)]
pub struct PerPort {
    pub ports: BTreeMap<String, Arc<dyn Checker>>,
    /// For unlisted ports (`exclude` when the configuration has none).
    pub fallback: Arc<dyn Checker>,
}

impl Checker for PerPort {
    fn check<'a>(&'a self, subject: &'a Subject) -> BoxFuture<'a, Verdict> {
        self.ports
            .get(&subject.port.name)
            .unwrap_or(&self.fallback)
            .check(subject)
    }

    fn probes(&self) -> bool {
        self.fallback.probes() || self.ports.values().any(|c| c.probes())
    }
}
