//! Does a live object need a write? Compares desired and live on the fields
//! portwise owns, after undoing the apiserver's defaulting, so a steady
//! state costs zero writes while manual edits are still seen and repaired.
//!
//! Labels and annotations: ours must be present with our values; extra keys
//! written by others are theirs (server-side apply leaves them alone, so
//! asking for their removal would write forever). Keys we applied earlier
//! and no longer want are found through `managedFields` when the live object
//! still carries it.
//!
//! The trigger-time annotation of slices ([`super::trigger`]) is not
//! compared: it dates a write rather than describing a desired state, so a
//! slice is never written for it alone, and the planner sets it only on the
//! writes that change endpoints.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::discovery::v1::{Endpoint, EndpointPort, EndpointSlice},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};

/// Whether `live` must be re-applied to become `desired`.
pub fn slice_differs(desired: &EndpointSlice, live: &EndpointSlice, manager: &str) -> bool {
    slice_meta_differs(desired, live, manager)
        || !endpoints_equal(desired.endpoints.as_deref(), live.endpoints.as_deref())
}

/// Everything but the endpoints (and the trigger-time annotation).
pub fn slice_meta_differs(desired: &EndpointSlice, live: &EndpointSlice, manager: &str) -> bool {
    desired.address_type != live.address_type
        || !ports_equal(desired.ports.as_deref(), live.ports.as_deref())
        || meta_differs_except(
            &desired.metadata,
            &live.metadata,
            manager,
            &[super::trigger::TRIGGER_TIME_ANNOTATION],
        )
}

/// Whether a write changes what consumers read from a slice: creates it
/// (`live` is `None`), or changes its endpoints or ports.
pub fn slice_content_differs(desired: &EndpointSlice, live: Option<&EndpointSlice>) -> bool {
    live.is_none_or(|live| {
        desired.address_type != live.address_type
            || !ports_equal(desired.ports.as_deref(), live.ports.as_deref())
            || !endpoints_equal(desired.endpoints.as_deref(), live.endpoints.as_deref())
    })
}

/// Labels, annotations and owner references, as described in the module docs.
pub fn meta_differs(desired: &ObjectMeta, live: &ObjectMeta, manager: &str) -> bool {
    meta_differs_except(desired, live, manager, &[])
}

/// [`meta_differs`], not looking at the annotations `ignored`.
fn meta_differs_except(
    desired: &ObjectMeta,
    live: &ObjectMeta,
    manager: &str,
    ignored: &[&str],
) -> bool {
    let missing = |want: &Option<BTreeMap<String, String>>,
                   have: &Option<BTreeMap<String, String>>,
                   ignored: &[&str]| {
        want.iter()
            .flatten()
            .filter(|(k, _)| !ignored.contains(&k.as_str()))
            .any(|(k, v)| have.as_ref().and_then(|h| h.get(k)) != Some(v))
    };
    if missing(&desired.labels, &live.labels, &[])
        || missing(&desired.annotations, &live.annotations, ignored)
    {
        return true;
    }
    let live_refs = live.owner_references.as_deref().unwrap_or_default();
    if desired
        .owner_references
        .iter()
        .flatten()
        .any(|r| !live_refs.contains(r))
    {
        return true;
    }
    let unwanted = |field: &str, want: &Option<BTreeMap<String, String>>, ignored: &[&str]| {
        applied_keys(live, manager, field)
            .iter()
            .filter(|k| !ignored.contains(&k.as_str()))
            .any(|k| !want.as_ref().is_some_and(|w| w.contains_key(k)))
    };
    unwanted("f:labels", &desired.labels, &[])
        || unwanted("f:annotations", &desired.annotations, ignored)
}

/// Keys of `metadata.<field>` that `manager` owns, read from the live
/// object's `managedFields`: through server-side apply (older portwise) or
/// through its creates and updates ([`super::replace`]), which the
/// apiserver records as `Update` entries owning the fields they set.
pub(crate) fn applied_keys(live: &ObjectMeta, manager: &str, field: &str) -> Vec<String> {
    owned_entries(live, manager, field)
        .filter_map(|k| k.strip_prefix("f:"))
        .map(str::to_string)
        .collect()
}

/// The uids of the owner references `manager` owns (`k:{"uid":…}` entries).
pub(crate) fn owned_owner_uids(live: &ObjectMeta, manager: &str) -> Vec<String> {
    owned_entries(live, manager, "f:ownerReferences")
        .filter_map(|k| k.strip_prefix("k:"))
        .filter_map(|k| serde_json::from_str::<serde_json::Value>(k).ok())
        .filter_map(|v| v.get("uid")?.as_str().map(str::to_string))
        .collect()
}

/// The raw member keys of `metadata.<field>` in `manager`'s own entries
/// (not a subresource's).
fn owned_entries<'a>(
    live: &'a ObjectMeta,
    manager: &'a str,
    field: &'a str,
) -> impl Iterator<Item = &'a str> + 'a {
    live.managed_fields
        .iter()
        .flatten()
        .filter(move |e| {
            e.manager.as_deref() == Some(manager)
                && matches!(e.operation.as_deref(), Some("Apply" | "Update"))
        })
        .filter(|e| e.subresource.as_deref().unwrap_or_default().is_empty())
        .filter_map(|e| e.fields_v1.as_ref())
        .filter_map(move |f| f.0.get("f:metadata")?.get(field)?.as_object())
        .flat_map(|m| m.keys())
        .map(String::as_str)
}

/// Ports after the apiserver's defaulting (name `""`, protocol `TCP`).
pub fn ports_equal(a: Option<&[EndpointPort]>, b: Option<&[EndpointPort]>) -> bool {
    let norm = |p: &EndpointPort| EndpointPort {
        name: Some(p.name.clone().unwrap_or_default()),
        protocol: Some(p.protocol.clone().unwrap_or_else(|| "TCP".into())),
        ..p.clone()
    };
    let (a, b) = (a.unwrap_or_default(), b.unwrap_or_default());
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| norm(x) == norm(y))
}

/// Endpoint lists, in order, after undoing empty-vs-absent differences.
pub fn endpoints_equal(a: Option<&[Endpoint]>, b: Option<&[Endpoint]>) -> bool {
    let (a, b) = (a.unwrap_or_default(), b.unwrap_or_default());
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| endpoint_equal(x, y))
}

/// One endpoint, ignoring what the API cannot tell apart (an empty hints
/// object and no hints, a `targetRef.resourceVersion` we never set).
pub fn endpoint_equal(a: &Endpoint, b: &Endpoint) -> bool {
    a == b || normalize_endpoint(a) == normalize_endpoint(b)
}

fn normalize_endpoint(e: &Endpoint) -> Endpoint {
    let mut e = e.clone();
    if e.conditions.is_none() {
        e.conditions = Some(Default::default());
    }
    if let Some(h) = &mut e.hints {
        if h.for_zones.as_ref().is_some_and(Vec::is_empty) {
            h.for_zones = None;
        }
        if h.for_nodes.as_ref().is_some_and(Vec::is_empty) {
            h.for_nodes = None;
        }
        if h.for_zones.is_none() && h.for_nodes.is_none() {
            e.hints = None;
        }
    }
    if let Some(r) = &mut e.target_ref {
        r.resource_version = None;
    }
    if e.deprecated_topology
        .as_ref()
        .is_some_and(BTreeMap::is_empty)
    {
        e.deprecated_topology = None;
    }
    e
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::discovery::v1::{EndpointConditions, EndpointHints},
        apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry},
    };

    use super::*;

    fn labels(kv: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
        Some(
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn ports_default_name_and_protocol() {
        let ours = EndpointPort {
            name: Some(String::new()),
            port: Some(80),
            protocol: Some("TCP".into()),
            app_protocol: None,
        };
        let defaulted = EndpointPort {
            name: None,
            protocol: None,
            ..ours.clone()
        };
        assert!(ports_equal(
            Some(std::slice::from_ref(&ours)),
            Some(&[defaulted])
        ));
        let udp = EndpointPort {
            protocol: Some("UDP".into()),
            ..ours.clone()
        };
        assert!(!ports_equal(
            Some(std::slice::from_ref(&ours)),
            Some(&[udp])
        ));
        assert!(!ports_equal(Some(&[ours]), None));
    }

    #[test]
    fn endpoints_ignore_empty_hints_and_resource_version() {
        let a = Endpoint {
            addresses: vec!["10.0.0.1".into()],
            conditions: Some(EndpointConditions::default()),
            hints: Some(EndpointHints {
                for_zones: Some(vec![]),
                for_nodes: None,
            }),
            ..Default::default()
        };
        let b = Endpoint {
            addresses: vec!["10.0.0.1".into()],
            ..Default::default()
        };
        assert!(endpoint_equal(&a, &b));
        assert!(endpoints_equal(Some(&[]), None));
        let c = Endpoint {
            addresses: vec!["10.0.0.2".into()],
            ..Default::default()
        };
        assert!(!endpoint_equal(&a, &c));
    }

    #[test]
    fn labels_are_a_subset_check_with_managed_fields_for_removals() {
        let desired = ObjectMeta {
            labels: labels(&[("a", "1")]),
            ..Default::default()
        };
        let mut live = ObjectMeta {
            labels: labels(&[("a", "1"), ("theirs", "x")]),
            ..Default::default()
        };
        assert!(!meta_differs(&desired, &live, "portwise"));
        live.labels = labels(&[("a", "2")]);
        assert!(meta_differs(&desired, &live, "portwise"));
        live.labels = labels(&[("a", "1"), ("old", "y")]);
        assert!(
            !meta_differs(&desired, &live, "portwise"),
            "unknown ownership: leave it"
        );
        live.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some("portwise".into()),
            operation: Some("Apply".into()),
            fields_v1: Some(FieldsV1(serde_json::json!({
                "f:metadata": {"f:labels": {"f:a": {}, "f:old": {}}}
            }))),
            ..Default::default()
        }]);
        assert!(
            meta_differs(&desired, &live, "portwise"),
            "we applied `old` and no longer want it"
        );
        assert!(!meta_differs(&desired, &live, "someone-else"));
    }

    #[test]
    fn trigger_time_is_not_compared_but_content_is() {
        use super::super::trigger::TRIGGER_TIME_ANNOTATION;
        let key = TRIGGER_TIME_ANNOTATION;
        let slice = |annotation: Option<&str>, address: &str| EndpointSlice {
            metadata: ObjectMeta {
                labels: labels(&[("a", "1")]),
                annotations: annotation.map(|v| BTreeMap::from([(key.to_string(), v.to_string())])),
                ..Default::default()
            },
            address_type: "IPv4".into(),
            endpoints: Some(vec![Endpoint {
                addresses: vec![address.into()],
                ..Default::default()
            }]),
            ports: None,
        };
        let desired = slice(None, "10.0.0.1");
        let mut live = slice(Some("2026-01-01T00:00:00Z"), "10.0.0.1");
        // We applied the annotation before and do not ask for it now.
        live.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some("portwise".into()),
            operation: Some("Apply".into()),
            fields_v1: Some(FieldsV1(serde_json::json!({
                "f:metadata": {"f:labels": {"f:a": {}}, "f:annotations": {format!("f:{key}"): {}}}
            }))),
            ..Default::default()
        }]);
        assert!(!slice_differs(&desired, &live, "portwise"));
        let other_value = slice(Some("2026-02-02T00:00:00Z"), "10.0.0.1");
        assert!(!slice_differs(&other_value, &live, "portwise"));
        assert!(!slice_content_differs(&desired, Some(&live)));
        // Meta differences still count; content is endpoints, ports, new.
        let mut relabelled = desired.clone();
        relabelled.metadata.labels = labels(&[("a", "2")]);
        assert!(slice_differs(&relabelled, &live, "portwise"));
        assert!(!slice_content_differs(&relabelled, Some(&live)));
        let moved = slice(None, "10.0.0.2");
        assert!(slice_content_differs(&moved, Some(&live)));
        assert!(slice_content_differs(&desired, None));
        // Other annotations are still compared.
        let mut other = desired.clone();
        other.metadata.annotations = Some(BTreeMap::from([("x".to_string(), "y".to_string())]));
        assert!(slice_differs(&other, &live, "portwise"));
    }
}
