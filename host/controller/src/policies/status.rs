//! A policy object's status: what portwise found ([`super::Entry`]) and
//! how many Services it decides, written to the status subresource only
//! when it differs from what is there.
//!
//! Why `lastTransitionTime` is carried over: it says when a condition last
//! changed its status, so a status that is written again unchanged (a
//! count that moved, a new generation read the same way) keeps its times,
//! as Kubernetes' own conditions do.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
};

use portwise_api::{
    CONDITION_ACCEPTED, CONDITION_MODULES_READY, MembershipPolicy, MembershipPolicyStatus,
};

use super::{Entry, Verdict, read::reason};

/// The status `obj` should have, given what reading it found and the
/// number of Services it decides; the transition times of conditions whose
/// status did not change are `obj`'s own.
pub(crate) fn desired(
    obj: &MembershipPolicy,
    entry: &Entry,
    services: i32,
) -> MembershipPolicyStatus {
    let generation = entry.generation;
    let previous = obj
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let condition = |type_: &str, status: &str, reason: &str, message: &str| {
        let since = previous
            .iter()
            .find(|c| c.type_ == type_ && c.status == status)
            .map(|c| c.last_transition_time.clone())
            .unwrap_or_else(|| Time(Timestamp::now()));
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            // The API caps a condition's message at 32768 bytes.
            message: bounded(message, 32_768),
            observed_generation: Some(generation),
            last_transition_time: since,
        }
    };
    let accepted = match &entry.accepted {
        Verdict::Ok(note) => condition(CONDITION_ACCEPTED, "True", reason::ACCEPTED, note),
        Verdict::Refused { reason, message } => {
            condition(CONDITION_ACCEPTED, "False", reason, message)
        }
    };
    let modules = match &entry.modules {
        Some(Verdict::Ok(note)) => condition(CONDITION_MODULES_READY, "True", reason::READY, note),
        Some(Verdict::Refused { reason, message }) => {
            condition(CONDITION_MODULES_READY, "False", reason, message)
        }
        None => condition(
            CONDITION_MODULES_READY,
            "Unknown",
            reason::NOT_ACCEPTED,
            "modules are loaded once the spec is accepted",
        ),
    };
    MembershipPolicyStatus {
        observed_generation: Some(generation),
        conditions: vec![accepted, modules],
        services: Some(services),
    }
}

/// Writes `status` to `obj` unless it has it already; `managed_by` is the
/// field manager. A failure is logged and left to the next sync.
pub(crate) async fn write(
    api: &Api<MembershipPolicy>,
    obj: &MembershipPolicy,
    status: MembershipPolicyStatus,
    managed_by: &str,
) {
    if obj.status.as_ref() == Some(&status) {
        return;
    }
    // A merge patch replaces the condition list whole: portwise is the
    // only writer of this status.
    let patch = serde_json::json!({ "status": status });
    if let Err(e) = api
        .patch_status(
            &obj.name_any(),
            &PatchParams {
                field_manager: Some(managed_by.to_owned()),
                ..Default::default()
            },
            &Patch::Merge(&patch),
        )
        .await
    {
        tracing::warn!(namespace = %obj.namespace().unwrap_or_default(), policy = %obj.name_any(),
            error = %e, "could not write the MembershipPolicy's status");
    }
}

/// `s`, cut at a character boundary to at most `max` bytes.
fn bounded(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(accepted: Verdict, modules: Option<Verdict>) -> Entry {
        Entry {
            uid: "u".into(),
            generation: 3,
            created: 0,
            selector: None,
            accepted,
            modules,
            checker: None,
            shadow: None,
            named_modules: Vec::new(),
        }
    }

    /// A status written again with the same condition statuses keeps their
    /// transition times; a condition that flips gets a new one. Fails when
    /// every write stamps the time anew (each status sync would then write).
    #[test]
    fn unchanged_conditions_keep_their_transition_times() {
        let refused = Verdict::Refused {
            reason: reason::INVALID,
            message: "spec.membership: bad".into(),
        };
        let mut obj = MembershipPolicy::new("p", Default::default());
        let first = desired(&obj, &entry(refused.clone(), None), 0);
        assert_eq!(first.observed_generation, Some(3));
        let accepted = &first.conditions[0];
        assert_eq!(
            (accepted.status.as_str(), accepted.reason.as_str()),
            ("False", "Invalid")
        );
        assert_eq!(accepted.message, "spec.membership: bad");
        assert_eq!(first.conditions[1].status, "Unknown");

        // Back-date what is "there", then ask again: same times.
        let old = Time(Timestamp::from_second(1_000_000).unwrap());
        let mut there = first.clone();
        there
            .conditions
            .iter_mut()
            .for_each(|c| c.last_transition_time = old.clone());
        obj.status = Some(there.clone());
        assert_eq!(desired(&obj, &entry(refused, None), 0), there);

        // Accepted flips: a new time for it, and ModulesReady's too.
        let ok = desired(
            &obj,
            &entry(Verdict::Ok(String::new()), Some(Verdict::Ok(String::new()))),
            2,
        );
        assert_eq!(ok.services, Some(2));
        assert!(
            ok.conditions
                .iter()
                .all(|c| c.status == "True" && c.last_transition_time != old)
        );
    }

    #[test]
    fn messages_are_cut_at_a_character_boundary() {
        let s = "é".repeat(20_000);
        let cut = bounded(&s, 32_768);
        assert!(cut.len() <= 32_768 && cut.chars().all(|c| c == 'é'));
    }
}
