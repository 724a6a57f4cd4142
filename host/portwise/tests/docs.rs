//! The docs' RBAC table (docs/operations.md#rbac) against the grants the
//! kustomize base and its `legacy-endpoints` component make: a verb the
//! code needs and the docs leave out, or one the docs promise and the
//! templates lack, fails here (issue 43: the docs had drifted from both).

use std::collections::{BTreeMap, BTreeSet};

/// (API group as the docs write it, resource) -> verbs.
type Grants = BTreeMap<(String, String), BTreeSet<String>>;

fn repo() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The rules of every ClusterRole and Role in a multi-document file.
fn granted(path: &str, component: Option<&str>, into: &mut Grants) {
    for doc in read(path).split("\n---\n") {
        let v: serde_json::Value =
            serde_saphyr::from_str(doc).unwrap_or_else(|e| panic!("{path}: {e}"));
        if !matches!(v["kind"].as_str(), Some("ClusterRole" | "Role")) {
            continue;
        }
        let namespaced = v["kind"] == "Role";
        for rule in v["rules"].as_array().expect("rules") {
            for group in rule["apiGroups"].as_array().expect("apiGroups") {
                let group = match group.as_str().unwrap() {
                    "" => "core",
                    g => g,
                };
                for resource in rule["resources"].as_array().expect("resources") {
                    let mut resource = resource.as_str().unwrap().to_string();
                    if namespaced {
                        resource.push_str(" (own namespace)");
                    }
                    if let Some(c) = component {
                        resource.push_str(&format!(" (component `{c}`)"));
                    }
                    let verbs = into.entry((group.to_string(), resource)).or_default();
                    for verb in rule["verbs"].as_array().expect("verbs") {
                        verbs.insert(verb.as_str().unwrap().to_string());
                    }
                }
            }
        }
    }
}

/// The table's rows: `| group | resource | verbs | used for |`, verbs as
/// `get, list, watch` or `create; get, update on `portwise` only`.
fn documented(docs: &str) -> Grants {
    let section = docs
        .split("\n## RBAC\n")
        .nth(1)
        .expect("docs/operations.md has an RBAC section");
    let mut out = Grants::new();
    for line in section
        .lines()
        .skip_while(|l| !l.starts_with("| API group"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
    {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let verbs = out
            .entry((cells[1].to_string(), cells[2].to_string()))
            .or_default();
        for part in cells[3].split([',', ';']) {
            // `get, update on `portwise` only`: the verb is the first word.
            let verb = part.split_whitespace().next().unwrap_or_default();
            if !verb.is_empty() {
                verbs.insert(verb.to_string());
            }
        }
    }
    out
}

#[test]
fn the_docs_rbac_table_is_what_the_base_grants() {
    let mut grants = Grants::new();
    granted("deploy/kustomize/rbac.yaml", None, &mut grants);
    granted(
        "deploy/kustomize/components/legacy-endpoints/rbac.yaml",
        Some("legacy-endpoints"),
        &mut grants,
    );
    assert!(grants.len() >= 6, "parsed too little: {grants:?}");
    let docs = documented(&read("docs/operations.md"));
    assert_eq!(
        docs, grants,
        "docs/operations.md#rbac (left) against deploy/kustomize (right)"
    );
}
