//! One version source (issue 46 item 1): the workspace version in
//! Cargo.toml (`[workspace.package] version`, which every host crate
//! inherits, so it is this crate's `CARGO_PKG_VERSION`) is the version of
//! the binary, the image, the chart's `appVersion` and the Rust guest SDK.
//! Each place that repeats it is read here and compared, so a release
//! bumps them together or this (Rust-only tier) test fails.
//!
//! What is checked, and what is not:
//!
//! - `deploy/helm/Chart.yaml` `appVersion` (the binary the chart deploys)
//!   is the workspace version. The chart's own `version` is not: it is the
//!   SemVer of the chart's values and templates (CHANGELOG.md,
//!   "Versioning"), and only has to be a version.
//! - The default image of the chart (`values.yaml` `image`, whose empty
//!   tag is the chart's `appVersion`) and of the kustomize base
//!   (`kustomization.yaml` `images`) are the same image: the released one
//!   (what `deploy/release` pushes), tagged with the workspace version. The
//!   suite installs its own build (`localhost/portwise:dev`) by overriding
//!   it; the real node imports that build under the released name too.
//! - The docs' install commands of the released chart
//!   (`oci://ghcr.io/portwise/charts/portwise --version …` in
//!   docs/operations.md and deploy/helm/README.md) name the workspace
//!   version.
//! - The Rust guest SDK (`guests/rust/portwise-guest`, the helper crate
//!   guest authors depend on) has the workspace version, and the lock files
//!   that build it (`guests/Cargo.lock`, the Rust template's) record that
//!   version, since `--locked` builds refuse a stale one. So do the
//!   JavaScript and Python SDK packages (`guests/sdk/js/package.json`, the
//!   npm package `@portwise/guest`; `guests/sdk/python/pyproject.toml`, the
//!   wheel `portwise-guest`), and the WIT they carry is the contract's,
//!   byte for byte. The other guest package files are not SDKs: the example
//!   guests and the templates carry their own versions (a template's is the
//!   user's project's; `guests/js`'s 0.2.0 names the WIT package it binds),
//!   and the Go helper is a module whose version is a git tag
//!   (`guests/go/vX.Y.Z`), not in its files. The WIT package version
//!   (`portwise:membership@X.Y.Z`) is versioned on its own and not checked
//!   here.
//! - CHANGELOG.md has a section for the workspace version (`## X.Y.Z — date`).

use std::path::{Path, PathBuf};

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn yaml(path: &str) -> serde_json::Value {
    serde_saphyr::from_str(&read(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `version = "…"` in the `[section]` of a Cargo.toml.
fn toml_version(text: &str, section: &str) -> Option<String> {
    let mut inside = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            inside = line == section;
            continue;
        }
        if inside && let Some(v) = line.strip_prefix("version = ") {
            return Some(v.trim_matches('"').to_string());
        }
    }
    None
}

/// The version a Cargo.lock records for the package `name`.
fn locked_version(lock: &str, name: &str) -> Option<String> {
    let entry = format!("name = \"{name}\"\n");
    lock.split("[[package]]\n")
        .find(|p| p.starts_with(&entry))
        .and_then(|p| p.lines().find_map(|l| l.strip_prefix("version = ")))
        .map(|v| v.trim_matches('"').to_string())
}

fn is_version(v: &str) -> bool {
    let core = v.split(['-', '+']).next().unwrap_or_default();
    let parts: Vec<&str> = core.split('.').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

#[test]
fn the_workspace_version_is_the_workspace_package_s() {
    assert!(is_version(VERSION), "{VERSION}");
    assert_eq!(
        toml_version(&read("Cargo.toml"), "[workspace.package]").as_deref(),
        Some(VERSION)
    );
    // Every workspace crate inherits it: the lock file records it for each.
    let lock = read("Cargo.lock");
    for name in [
        "portwise",
        "portwise-core",
        "portwise-probe",
        "portwise-checkers",
        "portwise-wasm",
        "portwise-supply",
        "portwise-controller",
    ] {
        assert_eq!(
            locked_version(&lock, name).as_deref(),
            Some(VERSION),
            "Cargo.lock: {name}"
        );
    }
}

#[test]
fn the_chart_deploys_the_workspace_version() {
    let chart = yaml("deploy/helm/Chart.yaml");
    assert_eq!(
        chart["appVersion"].as_str(),
        Some(VERSION),
        "deploy/helm/Chart.yaml appVersion is not the workspace version (Cargo.toml)"
    );
    let own = chart["version"].as_str().expect("Chart.yaml version");
    assert!(is_version(own), "Chart.yaml version {own:?}");
}

/// The default image's (repository, tag) of the chart and the base.
fn default_images() -> [(String, String); 2] {
    let values = yaml("deploy/helm/values.yaml");
    let chart = (
        values["image"]["repository"]
            .as_str()
            .expect("values.yaml image.repository")
            .to_string(),
        values["image"]["tag"]
            .as_str()
            .expect("values.yaml image.tag")
            .to_string(),
    );
    let kustomization = yaml("deploy/kustomize/kustomization.yaml");
    let image = kustomization["images"]
        .as_array()
        .and_then(|i| i.iter().find(|i| i["name"] == "portwise"))
        .expect("kustomization.yaml images: portwise");
    let base = (
        image["newName"].as_str().expect("newName").to_string(),
        image["newTag"].as_str().expect("newTag").to_string(),
    );
    [chart, base]
}

#[test]
fn the_default_image_is_the_released_one_at_the_workspace_version() {
    let [(repository, tag), base] = default_images();
    // An empty tag is the chart's appVersion (the `portwise.image` helper).
    let chart_tag = if tag.is_empty() {
        yaml("deploy/helm/Chart.yaml")["appVersion"]
            .as_str()
            .expect("Chart.yaml appVersion")
            .to_string()
    } else {
        tag
    };
    assert_eq!(
        (repository.clone(), chart_tag),
        base,
        "the chart's default image (values.yaml) and the kustomize base's differ"
    );
    assert!(
        !repository.starts_with("localhost/"),
        "{repository}: the default image is the released one, not a local build"
    );
    assert_eq!(
        base.1, VERSION,
        "{repository}: the released image's default tag is the workspace version"
    );
}

#[test]
fn the_docs_install_the_workspace_version() {
    const CHART: &str = "oci://ghcr.io/portwise/charts/portwise --version ";
    let mut seen = 0;
    for path in ["docs/operations.md", "deploy/helm/README.md"] {
        for (i, line) in read(path).lines().enumerate() {
            let Some(rest) = line.split(CHART).nth(1) else {
                continue;
            };
            let version = rest.split_whitespace().next().unwrap_or_default();
            assert_eq!(version, VERSION, "{path}:{}: {line}", i + 1);
            seen += 1;
        }
    }
    assert!(seen >= 2, "no `{CHART}…` in the install docs");
}

#[test]
fn the_rust_guest_sdk_has_the_workspace_version() {
    assert_eq!(
        toml_version(&read("guests/rust/portwise-guest/Cargo.toml"), "[package]").as_deref(),
        Some(VERSION),
        "guests/rust/portwise-guest/Cargo.toml"
    );
    for lock in ["guests/Cargo.lock", "guests/templates/rust/Cargo.lock"] {
        assert_eq!(
            locked_version(&read(lock), "portwise-guest").as_deref(),
            Some(VERSION),
            "{lock} records another portwise-guest"
        );
    }
}

#[test]
fn the_js_and_python_guest_sdks_have_the_workspace_version() {
    let package: serde_json::Value =
        serde_json::from_str(&read("guests/sdk/js/package.json")).expect("package.json");
    assert_eq!(
        package["version"].as_str(),
        Some(VERSION),
        "guests/sdk/js/package.json"
    );
    assert_eq!(
        toml_version(&read("guests/sdk/python/pyproject.toml"), "[project]").as_deref(),
        Some(VERSION),
        "guests/sdk/python/pyproject.toml"
    );
    // They carry the WIT a checker builds against: the contract's, whole.
    let wit = read("wit/membership.wit");
    for copy in [
        "guests/sdk/js/wit/membership.wit",
        "guests/sdk/python/src/portwise_guest/wit/membership.wit",
    ] {
        assert!(
            read(copy) == wit,
            "{copy} differs from wit/membership.wit: copy it over"
        );
    }
}

#[test]
fn the_changelog_has_the_workspace_version() {
    let changelog = read("CHANGELOG.md");
    let heading = format!("\n## {VERSION} — ");
    assert!(
        changelog.contains(&heading),
        "CHANGELOG.md has no `## {VERSION} — DATE` section"
    );
    // Unreleased stays on top, above the newest release.
    let unreleased = changelog.find("\n## Unreleased\n").expect("## Unreleased");
    assert!(unreleased < changelog.find(&heading).unwrap());
}

#[test]
fn the_readers_read_what_they_should() {
    let lock = "[[package]]\nname = \"a\"\nversion = \"1.2.3\"\n\n[[package]]\nname = \"ab\"\nversion = \"9.9.9\"\n";
    assert_eq!(locked_version(lock, "a").as_deref(), Some("1.2.3"));
    assert_eq!(locked_version(lock, "ab").as_deref(), Some("9.9.9"));
    assert_eq!(locked_version(lock, "b"), None);
    let toml = "[package]\nname = \"x\"\nversion = \"0.2.0\"\n[features]\nversion = \"no\"\n";
    assert_eq!(toml_version(toml, "[package]").as_deref(), Some("0.2.0"));
    assert!(is_version("0.2.0") && is_version("1.0.0-rc.1"));
    assert!(!is_version("dev") && !is_version("0.2") && !is_version("v0.2.0"));
}

/// `portwise --version` prints the workspace version, the git revision
/// and the commit's date (host/portwise/build.rs): in this checkout, the
/// commit's full name.
#[test]
fn portwise_version_prints_version_and_revision() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_portwise"))
        .arg("--version")
        .output()
        .expect("running portwise --version");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).expect("UTF-8");
    let rest = text
        .trim_end()
        .strip_prefix(&format!("portwise {VERSION} (revision "))
        .unwrap_or_else(|| panic!("{text:?}"));
    let (revision, date) = rest
        .strip_suffix(')')
        .and_then(|r| r.split_once(", "))
        .unwrap_or_else(|| panic!("{text:?}"));
    assert!(
        revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_hexdigit()),
        "{text:?}"
    );
    assert!(!date.is_empty(), "{text:?}");
    let git = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(repo())
        .output();
    if let Ok(head) = git
        && head.status.success()
    {
        assert_eq!(revision, String::from_utf8_lossy(&head.stdout).trim());
    }
}
