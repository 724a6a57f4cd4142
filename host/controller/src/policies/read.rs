//! Reading one `MembershipPolicy`: its spec checked as the config file's
//! expressions are and against the operator's limits (the `Accepted`
//! condition), then its checker built, its modules pulled and loaded first
//! (the `ModulesReady` condition).

use std::{sync::Arc, time::Duration};

use kube::core::Selector;

use portwise_api::MembershipPolicySpec;
use portwise_checkers::{BuildContext, Checker, WasmCheckers};
use portwise_core::config::{CheckerExpr, PolicyLimits};

use super::Verdict;

/// Condition reasons, as `kubectl describe` shows them.
pub(crate) mod reason {
    /// `Accepted=True`; `ModulesReady=True`.
    pub(crate) const ACCEPTED: &str = "Accepted";
    pub(crate) const READY: &str = "Ready";
    /// The spec is not a valid expression (or selector).
    pub(crate) const INVALID: &str = "Invalid";
    /// Valid, but past the operator's `membershipPolicies` limits.
    pub(crate) const NOT_ALLOWED: &str = "NotAllowed";
    /// The namespace has more policies than `maxPerNamespace`; this is
    /// among the newest.
    pub(crate) const TOO_MANY: &str = "TooManyPolicies";
    /// A module did not pull (registry, digest, signature, size).
    pub(crate) const PULL_FAILED: &str = "PullFailed";
    /// The checker could not be built (a module that does not load, a
    /// guest that rejects its config, no WebAssembly runtime).
    pub(crate) const LOAD_FAILED: &str = "LoadFailed";
    /// `ModulesReady=Unknown` while the spec is not accepted.
    pub(crate) const NOT_ACCEPTED: &str = "NotAccepted";
}

/// A spec that was accepted: what to build.
#[derive(Debug)]
pub(crate) struct Accepted {
    pub(crate) membership: CheckerExpr,
    pub(crate) shadow: Option<CheckerExpr>,
    pub(crate) selector: Option<Selector>,
}

impl Accepted {
    /// The modules its expressions name, `spec.membership`'s first.
    pub(crate) fn modules(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for spec in self
            .membership
            .wasm_specs()
            .into_iter()
            .chain(self.shadow.iter().flat_map(|s| s.wasm_specs()))
        {
            if !names.contains(&spec.module) {
                names.push(spec.module.clone());
            }
        }
        names
    }
}

fn refused(reason: &'static str, message: impl ToString) -> Verdict {
    Verdict::Refused {
        reason,
        message: message.to_string(),
    }
}

/// Checks `spec` (`Accepted`): a valid expression, within `limits`, and a
/// selector that parses. Errors name the field from `spec.` on.
pub(crate) fn accept(
    spec: &MembershipPolicySpec,
    limits: &PolicyLimits,
) -> Result<Accepted, Verdict> {
    // `modulesDir` is the operator's: reading as if there were one lets
    // the limits say why a file module is refused, in their words.
    let membership = CheckerExpr::from_json(&spec.membership, "spec.membership", true)
        .map_err(|e| refused(reason::INVALID, e))?;
    limits
        .admit(&membership, "spec.membership")
        .map_err(|e| refused(reason::NOT_ALLOWED, e))?;
    let shadow = match &spec.shadow {
        Some(shadow) => {
            let expr = CheckerExpr::from_json(shadow, "spec.shadow", true)
                .map_err(|e| refused(reason::INVALID, e))?;
            limits
                .admit(&expr, "spec.shadow")
                .map_err(|e| refused(reason::NOT_ALLOWED, e))?;
            Some(expr)
        }
        None => None,
    };
    let selector = match &spec.services {
        Some(s) => Some(
            Selector::try_from(s.selector.clone())
                .map_err(|e| refused(reason::INVALID, format!("spec.services.selector: {e}")))?,
        ),
        None => None,
    };
    Ok(Accepted {
        membership,
        shadow,
        selector,
    })
}

/// The checkers built from an accepted spec.
pub(crate) struct Built {
    pub(crate) membership: Arc<dyn Checker>,
    pub(crate) shadow: Option<Arc<dyn Checker>>,
}

/// Builds the accepted expressions' checkers (`ModulesReady`): their
/// `oci://` modules pulled first. A shadow that does not build fails the
/// whole: the team asked for it, and a shadow silently missing would read
/// as one that agrees.
pub(crate) async fn build(
    accepted: &Accepted,
    wasm: Option<&dyn WasmCheckers>,
    resync_period: Duration,
) -> Result<Built, Verdict> {
    let mut specs = accepted.membership.wasm_specs();
    if let Some(shadow) = &accepted.shadow {
        specs.extend(shadow.wasm_specs());
    }
    if !specs.is_empty() {
        let Some(wasm) = wasm else {
            return Err(refused(
                reason::LOAD_FAILED,
                "portwise runs no WebAssembly runtime (it starts one when the config file's \
                 membershipPolicies.checkers lists wasm)",
            ));
        };
        let failed = wasm.pull(&specs).await;
        if !failed.is_empty() {
            let message = failed
                .iter()
                .map(|(module, e)| format!("{module}: {e}"))
                .collect::<Vec<_>>()
                .join("; ");
            return Err(refused(reason::PULL_FAILED, message));
        }
    }
    let ctx = BuildContext {
        wasm,
        stable_ttl: BuildContext::stable_ttl_for(resync_period),
        stable_spacing: BuildContext::stable_spacing_for(resync_period),
    };
    let membership = portwise_checkers::build_at(&accepted.membership, &ctx, "spec.membership")
        .await
        .map_err(|e| refused(reason::LOAD_FAILED, e))?;
    let shadow = match &accepted.shadow {
        Some(expr) => Some(
            portwise_checkers::build_at(expr, &ctx, "spec.shadow")
                .await
                .map_err(|e| refused(reason::LOAD_FAILED, e))?,
        ),
        None => None,
    };
    Ok(Built { membership, shadow })
}
