//! portwise's Kubernetes API: the `MembershipPolicy` custom resource
//! (`portwise.io/v1alpha1`, issue 48), and the CustomResourceDefinition
//! generated from these types.
//!
//! The doc comments on the fields below are the schema's descriptions, so
//! they are what `kubectl explain membershippolicy.spec` prints: write them
//! for the team that writes a policy, not for the code.
//!
//! The checked-in copies of the CRD (deploy/helm/crds and deploy/kustomize)
//! are [`crd_yaml`]'s output, `portwise crd`; a test in the binary's crate
//! fails when they are stale.
//!
//! This crate only defines the resource. What acts on it (validating the
//! expression, pulling modules, writing status, choosing a policy for a
//! Service) is the controller's (`portwise-controller`'s `policies`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, CustomResourceExt};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

/// The API group of portwise's resources.
pub const GROUP: &str = "portwise.io";

/// Condition type: the spec is valid and within the operator's limits (its
/// message names the offending field the way the config file's errors do).
pub const CONDITION_ACCEPTED: &str = "Accepted";
/// Condition type: every WebAssembly module the policy names was pulled,
/// verified and compiled (else the pull or load error).
pub const CONDITION_MODULES_READY: &str = "ModulesReady";

/// Decides which pods back which ports of the Services it applies to, in the
/// language of portwise's configuration file. Only Services of the policy's
/// own namespace; a Service picks a policy by name with portwise's policy
/// annotation (`portwise.io/membership` by default).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "portwise.io",
    version = "v1alpha1",
    kind = "MembershipPolicy",
    plural = "membershippolicies",
    singular = "membershippolicy",
    shortname = "mpol",
    category = "portwise",
    namespaced,
    status = "MembershipPolicyStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "A membership policy of one namespace: which pods back which ports of the namespace's \
           Services that pick it. portwise validates the spec and reports the outcome in status.",
    // The same labels as every other object deploy/ installs, so that the
    // chart's copy (crds/, which Helm does not template) and the kustomize
    // base's (which adds part-of) are the same object.
    label("app.kubernetes.io/name", "portwise"),
    label("app.kubernetes.io/part-of", "portwise"),
    printcolumn(
        name = "Accepted",
        type_ = "string",
        description = "Whether portwise accepted the spec (the Accepted condition)",
        json_path = r#".status.conditions[?(@.type=="Accepted")].status"#
    ),
    printcolumn(
        name = "Services",
        type_ = "integer",
        description = "How many Services this policy decides",
        json_path = ".status.services"
    ),
    // Custom columns replace the default ones, Age included.
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    // A Service names the policy in an annotation, next to the operator's
    // policies of the config file, whose names are DNS labels; one kind of
    // name for both (Kubernetes alone would allow dots and 253 characters).
    validation = Rule::new("size(self.metadata.name) <= 63 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')")
        .message("metadata.name: a MembershipPolicy's name must be a DNS label (at most 63 characters: lower-case letters, digits and '-'), like the config file's policy names")
)]
#[serde(rename_all = "camelCase")]
pub struct MembershipPolicySpec {
    /// The checker expression that decides, per pod, per port and per
    /// address family, whether the pod backs the port: the language of
    /// portwise's configuration file (its `membership` key). Either a bare
    /// word (`podReady`, `notTerminating`, `include`, `exclude`, `abstain`)
    /// or a map with exactly one key: `portNames`, `tcpDial`, `httpGet`,
    /// `all`, `any`, `not`, `perPort`, `stable` or `wasm` (a WebAssembly
    /// module by digest, e.g. `{wasm: {module: "oci://REGISTRY/REPO@sha256:HEX",
    /// config: {...}}}`). Example: `{all: [podReady, {httpGet: {path: /healthz,
    /// timeout: 1s}}]}`. portwise validates the whole expression and reports
    /// errors, with the path of the offending field, in the Accepted
    /// condition.
    #[schemars(schema_with = "expression")]
    pub membership: serde_json::Value,

    /// An optional second expression, in the same language, judged next to
    /// `membership` on the same pods of the Services this policy decides:
    /// its differences are reported (the portwise_shadow_differences metric,
    /// ShadowDiffers Events on the Service, `portwise check --live`),
    /// nothing it decides is published. For trying a new checker on real
    /// traffic before it goes live: promote it by moving it to
    /// `membership`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "expression")]
    pub shadow: Option<serde_json::Value>,

    /// Which Services of this namespace the policy decides, besides those
    /// that name it. A Service still picks a policy by portwise's policy
    /// annotation; this adds the Services a label selector matches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub services: Option<ServiceSelection>,
}

/// Services of the policy's namespace that it decides.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSelection {
    /// A label selector over the Services of the policy's namespace (never
    /// another namespace's). A Service that names a policy in portwise's
    /// policy annotation keeps that choice.
    #[schemars(schema_with = "service_selector")]
    pub selector: LabelSelector,
}

/// What portwise found, written by portwise only (the status subresource).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MembershipPolicyStatus {
    /// The `metadata.generation` of the spec this status describes; older
    /// than the object's generation while portwise has not looked at an
    /// edit yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `Accepted`: the spec is valid and within the operator's limits; when
    /// False, the message names the offending field as the configuration
    /// file's errors do (`membership.perPort.ports.http.httpGet.timeout:
    /// ...`). `ModulesReady`: every WebAssembly module the policy names was
    /// pulled, verified and compiled; when False, the pull or load error.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// How many Services this policy decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub services: Option<i32>,
}

/// A checker expression: a bare word or a map with exactly one key, nested
/// to any depth. The apiserver cannot type "string or object" in a
/// structural schema except by leaving the node untyped and keeping what is
/// below it (`x-kubernetes-preserve-unknown-fields`); CEL cannot see such a
/// node either (the apiserver refuses rules on it), so the schema checks
/// only the outer shape: a non-empty word, or a map of exactly one key (an
/// expression is never a list). The rest is portwise's to validate, with
/// the config file's error paths, in status.
fn expression(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "x-kubernetes-preserve-unknown-fields": true,
        "minLength": 1,
        "maxLength": 63,
        "minProperties": 1,
        "maxProperties": 1,
        "maxItems": 0,
    })
}

/// A LabelSelector as Kubernetes defines it, plus what the apiserver checks
/// for its own selectors but not for a custom resource's: an operator it
/// knows, with values for `In`/`NotIn` and none for `Exists`/`DoesNotExist`.
/// Bounded, so that the rule's cost is bounded too.
fn service_selector(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = LabelSelector::json_schema(generator);
    if let Some(expressions) = schema
        .get_mut("properties")
        .and_then(|p| p.get_mut("matchExpressions"))
        .and_then(|m| m.as_object_mut())
    {
        expressions.insert("maxItems".into(), 32.into());
        if let Some(item) = expressions.get_mut("items").and_then(|i| i.as_object_mut()) {
            item.insert(
                "x-kubernetes-validations".into(),
                serde_json::json!([{
                    "rule": "self.operator in ['In', 'NotIn'] ? has(self.values) && size(self.values) > 0 : self.operator in ['Exists', 'DoesNotExist'] && (!has(self.values) || size(self.values) == 0)",
                    "message": "operator must be In or NotIn with values, or Exists or DoesNotExist without",
                }]),
            );
        }
    }
    schema
}

/// The CustomResourceDefinition, as checked in at deploy/helm/crds and
/// deploy/kustomize: what `portwise crd` prints.
pub fn crd_yaml() -> String {
    let mut crd = serde_json::to_value(MembershipPolicy::crd()).expect("a CRD serializes");
    integral_numbers_as_integers(&mut crd);
    let yaml = serde_saphyr::to_string(&crd).expect("a CRD serializes");
    format!(
        "# Generated from host/api (portwise-api) by `portwise crd`; do not edit.\n\
         # Regenerate both copies after changing the types:\n\
         #   cargo run -p portwise -- crd > deploy/helm/crds/membershippolicies.portwise.io.yaml\n\
         #   cargo run -p portwise -- crd > deploy/kustomize/membershippolicies.portwise.io.yaml\n\
         {yaml}"
    )
}

/// `minimum: 0`, not `0.0`: the schema's bounds are `f64` in k8s-openapi,
/// and kustomize writes an integral float as an integer, so the chart's
/// copy (crds/, applied verbatim) and the base's rendering would differ.
fn integral_numbers_as_integers(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Number(n) => {
            if let Some(f) = n
                .as_f64()
                .filter(|f| n.is_f64() && f.fract() == 0.0 && f.abs() < 9e15)
            {
                *n = serde_json::Number::from(f as i64);
            }
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(integral_numbers_as_integers),
        serde_json::Value::Object(m) => m.values_mut().for_each(integral_numbers_as_integers),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_crd_is_namespaced_with_status_and_columns() {
        let crd = MembershipPolicy::crd();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("membershippolicies.portwise.io")
        );
        assert_eq!(crd.spec.scope, "Namespaced");
        let v = &crd.spec.versions[0];
        assert!(v.subresources.as_ref().unwrap().status.is_some());
        let columns: Vec<_> = v
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(columns, ["Accepted", "Services", "Age"]);
    }

    #[test]
    fn a_spec_reads_bare_words_and_maps() {
        let p: MembershipPolicySpec = serde_json::from_value(serde_json::json!({
            "membership": {"all": ["podReady", {"tcpDial": {"timeout": "1s"}}]},
            "shadow": "podReady",
            "services": {"selector": {"matchLabels": {"team": "a"}}},
        }))
        .unwrap();
        assert_eq!(p.shadow, Some(serde_json::json!("podReady")));
        let back = serde_json::to_value(&p).unwrap();
        assert_eq!(back["membership"]["all"][1]["tcpDial"]["timeout"], "1s");
    }
}
