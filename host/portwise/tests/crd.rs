//! The checked-in copies of the MembershipPolicy CRD, where the installs
//! read them (the chart's crds/ and the kustomize base), against what the
//! types generate now (`portwise crd`): a change to host/api that is not
//! regenerated into both fails here.

const COPIES: &[&str] = &[
    "deploy/helm/crds/membershippolicies.portwise.io.yaml",
    "deploy/kustomize/membershippolicies.portwise.io.yaml",
];

#[test]
fn the_checked_in_crds_are_what_the_types_generate() {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let generated = portwise_api::crd_yaml();
    let mut stale = Vec::new();
    for path in COPIES {
        let checked_in =
            std::fs::read_to_string(repo.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
        if checked_in != generated {
            stale.push(*path);
        }
    }
    assert!(
        stale.is_empty(),
        "stale CRD (host/api changed since it was generated): {stale:?}\n\
         regenerate with:\n{}",
        COPIES
            .iter()
            .map(|p| format!("  cargo run -p portwise -- crd > {p}\n"))
            .collect::<String>()
    );
}

/// The base installs what it ships: the CRD is among its resources.
#[test]
fn the_kustomize_base_lists_the_crd() {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let k = std::fs::read_to_string(repo.join("deploy/kustomize/kustomization.yaml")).unwrap();
    assert!(
        k.lines()
            .any(|l| l.trim() == "- membershippolicies.portwise.io.yaml"),
        "deploy/kustomize/kustomization.yaml does not list membershippolicies.portwise.io.yaml"
    );
}
