//! deploy/helm, the Helm chart: `helm lint` passes, `helm template` renders,
//! the rendered default chart passes a server-side dry-run apply on the real
//! apiserver (Pod Security `restricted` included), its defaults are the
//! kustomize base object for object (so the two cannot drift apart), as are
//! its registry and signature values and the base's components for them, and
//! non-default values render what the values table promises. helm is built
//! from its Go module by tests/helm/build (cached by version).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail, ensure};
use portwise_tests::*;
use serde_json::{Value, json};

use super::support::*;

/// The release name and namespace whose names match the base's.
const RELEASE: &str = "portwise";
const NAMESPACE: &str = "portwise-system";

/// tests/helm/build: the cached helm binary, built if need be.
fn helm_binary() -> Result<PathBuf> {
    built_tool("tests/helm/build")
}

/// What one helm run printed.
struct HelmOutput {
    ok: bool,
    stdout: String,
    stderr: String,
}

/// Runs helm in the repository with its cache, config and data directories
/// in a throwaway directory (nothing of the user's Helm setup is read or
/// written), whatever the exit status.
fn helm_run(args: &[&str]) -> Result<HelmOutput> {
    let bin = helm_binary()?;
    let home = tempfile::Builder::new()
        .prefix("portwise-helm-")
        .tempdir()?;
    let out = Command::new(&bin)
        .args(args)
        .current_dir(repo())
        .env("HELM_CACHE_HOME", home.path().join("cache"))
        .env("HELM_CONFIG_HOME", home.path().join("config"))
        .env("HELM_DATA_HOME", home.path().join("data"))
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {}", bin.display()))?;
    Ok(HelmOutput {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// The API a cluster must serve for the chart's admission policy: every
/// minor the chart supports (1.35 and later) does, and `helm install`
/// finds it there; `helm template` is told so.
const ADMISSION_API: &str = "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy";

/// `helm template RELEASE deploy/helm -n portwise-system` with extra
/// arguments (`--set k=v`, ...), as on a cluster serving [`ADMISSION_API`];
/// fails unless helm exits 0. With the chart's `crds/` (`--include-crds`),
/// which `helm install` creates and `helm template` leaves out by default:
/// the base lists the same CRD among its resources.
fn template_as(release: &str, extra: &[&str]) -> Result<String> {
    let mut args = vec![
        "template",
        release,
        "deploy/helm",
        "--namespace",
        NAMESPACE,
        "--api-versions",
        ADMISSION_API,
        "--include-crds",
    ];
    args.extend_from_slice(extra);
    let out = helm_run(&args)?;
    ensure!(out.ok, "helm {args:?} failed:\n{}", out.stderr);
    Ok(out.stdout)
}

fn template(extra: &[&str]) -> Result<String> {
    template_as(RELEASE, extra)
}

/// A rendering that must be refused, with `message` in helm's error.
fn template_refused(extra: &[&str], message: &str) -> Result<()> {
    let mut args = vec!["template", RELEASE, "deploy/helm", "--namespace", NAMESPACE];
    args.extend_from_slice(extra);
    let out = helm_run(&args)?;
    ensure!(
        !out.ok,
        "helm {args:?} rendered, but must refuse:\n{}",
        out.stdout
    );
    ensure!(
        out.stderr.contains(message),
        "helm {args:?} failed without saying {message:?}:\n{}",
        out.stderr
    );
    Ok(())
}

// ---- YAML as data -------------------------------------------------------------

fn to_json(y: &yaml_rust2::Yaml) -> Value {
    use yaml_rust2::Yaml;
    match y {
        Yaml::Real(s) => s
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map_or(Value::String(s.clone()), Value::Number),
        Yaml::Integer(i) => json!(i),
        Yaml::String(s) => Value::String(s.clone()),
        Yaml::Boolean(b) => Value::Bool(*b),
        Yaml::Array(a) => Value::Array(a.iter().map(to_json).collect()),
        Yaml::Hash(h) => Value::Object(
            h.iter()
                .map(|(k, v)| {
                    let key = match k {
                        Yaml::String(s) => s.clone(),
                        other => to_json(other).to_string(),
                    };
                    (key, to_json(v))
                })
                .collect(),
        ),
        Yaml::Alias(_) | Yaml::Null | Yaml::BadValue => Value::Null,
    }
}

/// The non-empty documents of a YAML stream, as JSON values.
fn parse_docs(yaml: &str) -> Result<Vec<Value>> {
    let docs = yaml_rust2::YamlLoader::load_from_str(yaml).context("parsing rendered YAML")?;
    Ok(docs.iter().map(to_json).filter(|d| !d.is_null()).collect())
}

/// `Kind/namespace/name` of an object (`Kind//name` when cluster-scoped).
fn key(obj: &Value) -> String {
    format!(
        "{}/{}/{}",
        obj["kind"].as_str().unwrap_or_default(),
        obj["metadata"]["namespace"].as_str().unwrap_or_default(),
        obj["metadata"]["name"].as_str().unwrap_or_default()
    )
}

fn by_key(docs: Vec<Value>) -> Result<BTreeMap<String, Value>> {
    let mut out = BTreeMap::new();
    for d in docs {
        let k = key(&d);
        ensure!(out.insert(k.clone(), d).is_none(), "{k} rendered twice");
    }
    Ok(out)
}

fn rendered(extra: &[&str]) -> Result<BTreeMap<String, Value>> {
    by_key(parse_docs(&template(extra)?)?)
}

fn object<'a>(objs: &'a BTreeMap<String, Value>, key: &str) -> Result<&'a Value> {
    objs.get(key).with_context(|| {
        format!(
            "{key} not rendered; rendered: {:?}",
            objs.keys().collect::<Vec<_>>()
        )
    })
}

/// The portwise container's args of the rendered Deployment.
fn args(objs: &BTreeMap<String, Value>) -> Result<Vec<String>> {
    let d = object(objs, "Deployment/portwise-system/portwise")?;
    Ok(d["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .context("no args")?
        .iter()
        .map(|a| a.as_str().unwrap_or_default().to_string())
        .collect())
}

/// The config file the chart renders, parsed.
fn config(objs: &BTreeMap<String, Value>) -> Result<Value> {
    let cm = object(objs, "ConfigMap/portwise-system/portwise-config")?;
    let text = cm["data"]["config.yaml"]
        .as_str()
        .context("no data.config.yaml")?;
    parse_docs(text)?
        .into_iter()
        .next()
        .context("empty config.yaml")
}

// ---- comparing with the kustomize base ---------------------------------------

/// Labels only Helm adds (release bookkeeping). Everything else about the
/// objects must be the base's.
const HELM_ONLY_LABELS: &[&str] = &[
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
];

fn strip_labels(v: &mut Value) {
    match v {
        Value::Object(m) => {
            for l in HELM_ONLY_LABELS {
                m.remove(*l);
            }
            m.values_mut().for_each(strip_labels);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_labels),
        _ => {}
    }
}

/// Removes `obj[path]`, and the map holding it when that is left empty.
fn remove_path(obj: &mut Value, path: &[&str]) {
    let (last, parents) = path.split_last().expect("non-empty path");
    let mut cur = &mut *obj;
    for p in parents {
        match cur.get_mut(*p) {
            Some(next) => cur = next,
            None => return,
        }
    }
    if let Some(m) = cur.as_object_mut() {
        m.remove(*last);
        if m.is_empty() && !parents.is_empty() {
            remove_path(obj, parents);
        }
    }
}

/// An overlay's generated config ConfigMap may be `portwise-config-<hash>`
/// (an overlay that replaces the base's without `disableNameSuffixHash`);
/// the chart's and the base's are `portwise-config`.
fn unhash(name: &str) -> String {
    match name.rsplit_once('-') {
        Some((stem, hash)) if stem.ends_with("-config") && hash.len() == 10 => stem.to_string(),
        _ => name.to_string(),
    }
}

/// One form for both: Helm's own labels (and the name label on ConfigMaps)
/// and its checksum annotation gone,
/// the config ConfigMap under its unhashed name with its file parsed, the
/// Service type that the apiserver defaults anyway made explicit.
fn normalize(mut obj: Value) -> Result<Value> {
    strip_labels(&mut obj);
    // kubectl's kustomize does not know these kinds are cluster-scoped and
    // gives them the base's namespace, which the apiserver ignores.
    if matches!(
        obj["kind"].as_str(),
        Some("ValidatingAdmissionPolicy" | "ValidatingAdmissionPolicyBinding")
    ) {
        remove_path(&mut obj, &["metadata", "namespace"]);
    }
    remove_path(
        &mut obj,
        &[
            "spec",
            "template",
            "metadata",
            "annotations",
            "checksum/config",
        ],
    );
    match obj["kind"].as_str().unwrap_or_default() {
        "ConfigMap" => {
            // The base's generated ConfigMaps carry only kustomize's
            // `labels:` (part-of); the chart labels them like the rest.
            remove_path(&mut obj, &["metadata", "labels", "app.kubernetes.io/name"]);
            let name = unhash(obj["metadata"]["name"].as_str().unwrap_or_default());
            obj["metadata"]["name"] = json!(name);
            if let Some(text) = obj["data"]["config.yaml"].as_str() {
                let parsed = parse_docs(text)?.into_iter().next().unwrap_or_default();
                obj["data"]["config.yaml"] = parsed;
            }
        }
        "Deployment" => {
            if let Some(vols) = obj["spec"]["template"]["spec"]["volumes"].as_array_mut() {
                for v in vols {
                    if let Some(n) = v["configMap"]["name"].as_str() {
                        v["configMap"]["name"] = json!(unhash(n));
                    }
                }
            }
        }
        "Namespace" => {
            // Helm's own: keep the namespace (and its release records) on
            // uninstall. The base has no annotations on it.
            remove_path(
                &mut obj,
                &["metadata", "annotations", "helm.sh/resource-policy"],
            );
        }
        "Service" if obj["spec"].get("type").is_none() => {
            obj["spec"]["type"] = json!("ClusterIP");
        }
        _ => {}
    }
    Ok(obj)
}

/// Fails, naming each difference, unless `helm` and `base` hold the same
/// objects (same kinds and names) with the same content once normalized.
fn expect_same_objects(helm: &str, base: &str) -> Result<()> {
    let helm = by_key(
        parse_docs(helm)?
            .into_iter()
            .map(normalize)
            .collect::<Result<_>>()?,
    )?;
    let base = by_key(
        parse_docs(base)?
            .into_iter()
            .map(normalize)
            .collect::<Result<_>>()?,
    )?;
    let names = |m: &BTreeMap<String, Value>| m.keys().cloned().collect::<Vec<_>>();
    expect_eq(names(&helm), names(&base))?;
    let mut diffs = Vec::new();
    for (k, b) in &base {
        let h = &helm[k];
        if h != b {
            diffs.push(format!(
                "{k} differs\n--- chart:\n{}\n--- base:\n{}",
                serde_json::to_string_pretty(h)?,
                serde_json::to_string_pretty(b)?
            ));
        }
    }
    ensure!(
        diffs.is_empty(),
        "the chart's defaults drifted from deploy/kustomize:\n{}",
        diffs.join("\n")
    );
    Ok(())
}

// ---- the tests ----------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_chart_lints_and_renders() -> Result<()> {
    if portwise_tests::deferred::skip(&["helm"], "ship::helm::helm_chart_lints_and_renders") {
        return Ok(());
    }
    let keys = signing_key_files()?;
    tokio::task::spawn_blocking(move || -> Result<()> {
        let oci = oci_values(&keys);
        let version = helm_run(&["version", "--short"])?;
        ensure!(
            version.ok && version.stdout.starts_with("v4."),
            "helm version: {}{}",
            version.stdout,
            version.stderr
        );
        // The default values, and the non-default ones the other tests use.
        for extra in [
            &[][..],
            &["--set", "config.publishLegacyEndpoints=true"],
            &[
                "--set",
                "replicaCount=1",
                "--set",
                "leaderElection.enabled=false",
            ],
            &["--set", "namespace.create=true"],
            &strs(&oci),
        ] {
            let mut args = vec!["lint", "--strict", "deploy/helm", "--namespace", NAMESPACE];
            args.extend_from_slice(extra);
            let out = helm_run(&args)?;
            ensure!(
                out.ok && out.stdout.contains("1 chart(s) linted, 0 chart(s) failed"),
                "helm {args:?}:\n{}\n{}",
                out.stdout,
                out.stderr
            );
        }
        let docs = parse_docs(&template(&[])?)?;
        let mut kinds: Vec<_> = docs
            .iter()
            .map(|d| d["kind"].as_str().unwrap_or_default().to_string())
            .collect();
        kinds.sort();
        expect_eq(
            kinds,
            [
                "ClusterRole",
                "ClusterRoleBinding",
                "ConfigMap",
                "ConfigMap",
                "CustomResourceDefinition",
                "Deployment",
                "PodDisruptionBudget",
                "Role",
                "RoleBinding",
                "Service",
                "ServiceAccount",
                "ValidatingAdmissionPolicy",
                "ValidatingAdmissionPolicyBinding",
            ]
            .map(String::from)
            .to_vec(),
        )?;
        // The admission policy: named after the release, for its
        // ServiceAccount and `managedBy`; off where the cluster does not
        // serve the API, or when turned off.
        let objs = rendered(&["--set", "config.managedBy=pw-team"])?;
        let policy = object(
            &objs,
            "ValidatingAdmissionPolicy//portwise-writes-only-its-own",
        )?;
        expect_eq(
            &policy["spec"]["matchConditions"][0]["expression"],
            &json!("request.userInfo.username == 'system:serviceaccount:portwise-system:portwise'"),
        )?;
        expect_eq(
            &policy["spec"]["variables"][0],
            &json!({"name": "managedBy", "expression": "'pw-team'"}),
        )?;
        expect_eq(
            &object(
                &objs,
                "ValidatingAdmissionPolicyBinding//portwise-writes-only-its-own",
            )?["spec"]["policyName"],
            &json!("portwise-writes-only-its-own"),
        )?;
        let off = rendered(&["--set", "admissionPolicy.enabled=false"])?;
        let older = helm_run(&["template", RELEASE, "deploy/helm", "--namespace", NAMESPACE])?;
        ensure!(older.ok, "{}", older.stderr);
        for (why, objs) in [
            ("turned off", off),
            ("not served", by_key(parse_docs(&older.stdout)?)?),
        ] {
            ensure!(
                !objs
                    .keys()
                    .any(|k| k.starts_with("ValidatingAdmissionPolicy")),
                "an admission policy is rendered where the API is {why}"
            );
        }
        // Values that cannot work are refused at render time.
        template_refused(
            &["--set", "leaderElection.enabled=false"],
            "replicaCount > 1 needs leaderElection.enabled=true",
        )?;
        // Two sources of signing keys; a mounted ConfigMap of keys that
        // the config does not name (portwise would accept unsigned modules).
        let mut both = oci.clone();
        both.extend(["--set", "moduleSignatures.existingConfigMap=my-keys"].map(String::from));
        template_refused(
            &strs(&both),
            "moduleSignatures: set publicKeys or existingConfigMap, not both",
        )?;
        template_refused(
            &["--set", "moduleSignatures.existingConfigMap=my-keys"],
            "config.moduleSignatures.keys does not name its keys",
        )?;
        Ok(())
    })
    .await?
}

/// The NetworkPolicy on, with the apiserver's address (what it requires).
const NETWORK_POLICY: &[&str] = &[
    "--set",
    "networkPolicy.enabled=true",
    "--set",
    "networkPolicy.apiServer[0].cidr=10.96.0.1/32",
    "--set",
    "networkPolicy.apiServer[0].port=6443",
];

/// The chart refuses mistakes instead of ignoring them (issue 27): a
/// misspelt or leftover value and a wrong type fail on the schema; a
/// modules directory with nothing mounted there fails by name (the pod
/// would crash-loop with "cannot watch DIR"), unless an extra volume is
/// mounted at it; a NetworkPolicy without the apiserver fails. What the new
/// values promise is rendered: init containers, extra volumes and mounts,
/// and a NetworkPolicy that opens exactly the apiserver, the probed ports,
/// DNS and the metrics port. The install notes say how to check it.
#[test]
fn helm_chart_refuses_mistakes_and_renders_its_extras() -> Result<()> {
    if portwise_tests::deferred::skip(
        &["helm"],
        "ship::helm::helm_chart_refuses_mistakes_and_renders_its_extras",
    ) {
        return Ok(());
    }
    // The schema: unknown keys and wrong types, at the top and nested.
    template_refused(
        &["--set", "replicas=3"],
        "additional properties 'replicas' not allowed",
    )?;
    template_refused(
        &["--set", "image.tags=v1"],
        "at '/image': additional properties 'tags' not allowed",
    )?;
    template_refused(
        &["--set", "replicaCount=two"],
        "at '/replicaCount': got string, want integer",
    )?;
    template_refused(&["--set", "metrics.port=70000"], "/metrics/port")?;
    template_refused(
        &["--set", "logFormat=yaml"],
        "at '/logFormat': value must be one of",
    )?;
    let lint = helm_run(&[
        "lint",
        "--strict",
        "deploy/helm",
        "--set",
        "leaderElection.enable=true",
    ])?;
    ensure!(
        !lint.ok
            && format!("{}{}", lint.stdout, lint.stderr)
                .contains("additional properties 'enable' not allowed"),
        "helm lint accepted a misspelt value:\n{}{}",
        lint.stdout,
        lint.stderr
    );
    // A free-form config is the binary's to validate.
    template(&["--set", "config.somethingNew=1"])?;

    template_refused(
        &["--set", "modules.create=false"],
        "mounts nothing at config.modulesDir (/etc/portwise/modules)",
    )?;
    template(&[
        "--set",
        "modules.create=false",
        "--set",
        "config.modulesDir=null",
    ])?;
    let objs = rendered(&[
        "--set",
        "modules.create=false",
        "--set",
        "extraVolumes[0].name=modules-image",
        "--set",
        "extraVolumes[0].image.reference=registry.example/modules@sha256:0123",
        "--set",
        "extraVolumeMounts[0].name=modules-image",
        "--set",
        "extraVolumeMounts[0].mountPath=/etc/portwise/modules",
        "--set",
        "initContainers[0].name=warm",
        "--set",
        "initContainers[0].image=busybox",
    ])?;
    let pod = &object(&objs, "Deployment/portwise-system/portwise")?["spec"]["template"]["spec"];
    expect_eq(&pod["initContainers"][0]["name"], &json!("warm"))?;
    let volumes = pod["volumes"].as_array().context("volumes")?;
    ensure!(
        volumes.iter().any(|v| v["name"] == "modules-image"
            && v["image"]["reference"] == "registry.example/modules@sha256:0123"),
        "{volumes:?}"
    );
    ensure!(
        !volumes.iter().any(|v| v["name"] == "modules"),
        "{volumes:?}"
    );
    let mounts = pod["containers"][0]["volumeMounts"]
        .as_array()
        .context("mounts")?;
    ensure!(
        mounts
            .iter()
            .any(|m| m["name"] == "modules-image" && m["mountPath"] == "/etc/portwise/modules"),
        "{mounts:?}"
    );

    template_refused(
        &["--set", "networkPolicy.enabled=true"],
        "networkPolicy.enabled needs networkPolicy.apiServer",
    )?;
    ensure!(
        !rendered(&[])?
            .keys()
            .any(|k| k.starts_with("NetworkPolicy/")),
        "a NetworkPolicy is rendered by default"
    );
    let objs = rendered(
        &[
            NETWORK_POLICY,
            &["--set", "networkPolicy.probePorts={8080,8443}"],
        ]
        .concat(),
    )?;
    let np = object(&objs, "NetworkPolicy/portwise-system/portwise")?;
    expect_eq(
        &np["spec"]["podSelector"]["matchLabels"],
        &object(&objs, "Deployment/portwise-system/portwise")?["spec"]["selector"]["matchLabels"],
    )?;
    expect_eq(
        &np["spec"]["ingress"],
        &json!([{"ports": [{"port": 9090, "protocol": "TCP"}]}]),
    )?;
    expect_eq(
        &np["spec"]["egress"],
        &json!([
            {"to": [{"ipBlock": {"cidr": "10.96.0.1/32"}}], "ports": [{"port": 6443, "protocol": "TCP"}]},
            {"to": [{"namespaceSelector": {}}], "ports": [
                {"port": 8080, "protocol": "TCP"}, {"port": 8443, "protocol": "TCP"}]},
            {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]},
        ]),
    )?;

    let notes = helm_run(&[
        "install",
        RELEASE,
        "deploy/helm",
        "--namespace",
        NAMESPACE,
        "--dry-run=client",
    ])?;
    ensure!(notes.ok, "helm install --dry-run: {}", notes.stderr);
    ensure!(
        notes.stdout.contains("NOTES:")
            && notes.stdout.contains("rollout status deployment/portwise")
            && notes
                .stdout
                .contains("check --live --config /etc/portwise/config/config.yaml"),
        "the install notes do not say how to check the install:\n{}",
        notes.stdout
    );
    Ok(())
}

/// Every value in values.yaml has a row in the README's values tables, and
/// every row names a value that exists: a value is covered by a row for it
/// or for a map holding it (`config`, `resources`, ...).
#[test]
fn helm_chart_values_are_all_documented() -> Result<()> {
    if portwise_tests::deferred::skip(
        &["helm"],
        "ship::helm::helm_chart_values_are_all_documented",
    ) {
        return Ok(());
    }
    let values = std::fs::read_to_string(repo().join("deploy/helm/values.yaml"))?;
    let readme = std::fs::read_to_string(repo().join("deploy/helm/README.md"))?;
    let values = parse_docs(&values)?
        .into_iter()
        .next()
        .context("empty values.yaml")?;
    /// Every path (`a`, `a.b`, ...) and whether it is a leaf (not a
    /// non-empty map).
    fn walk(prefix: &str, v: &Value, out: &mut Vec<(String, bool)>) {
        if let Value::Object(m) = v {
            for (k, v) in m {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                let leaf = !matches!(v, Value::Object(m) if !m.is_empty());
                out.push((path.clone(), leaf));
                walk(&path, v, out);
            }
        }
    }
    let mut paths = Vec::new();
    walk("", &values, &mut paths);
    let section = readme
        .split_once("\n## Values")
        .and_then(|(_, rest)| rest.split_once("\n## "))
        .map(|(s, _)| s)
        .context("no \"## Values\" section in deploy/helm/README.md")?;
    // The first cell of each table row: `a.b` or `a`, `b`.
    let documented: Vec<String> = section
        .lines()
        .filter_map(|l| l.strip_prefix("| ")?.split_once(" |"))
        .flat_map(|(first, _)| {
            first
                .split(", ")
                .filter_map(|c| Some(c.strip_prefix('`')?.strip_suffix('`')?.to_string()))
                .collect::<Vec<_>>()
        })
        .collect();
    ensure!(!documented.is_empty(), "no rows in the values tables");
    let undocumented: Vec<_> = paths
        .iter()
        .filter(|(p, leaf)| {
            *leaf
                && !documented
                    .iter()
                    .any(|d| p == d || p.starts_with(&format!("{d}.")))
        })
        .map(|(p, _)| p)
        .collect();
    ensure!(
        undocumented.is_empty(),
        "values without a row in deploy/helm/README.md: {undocumented:?}"
    );
    let stale: Vec<_> = documented
        .iter()
        .filter(|d| !paths.iter().any(|(p, _)| p == *d))
        .collect();
    ensure!(
        stale.is_empty(),
        "rows for values that do not exist: {stale:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_chart_defaults_match_the_kustomize_base() -> Result<()> {
    if portwise_tests::deferred::skip(
        &["helm"],
        "ship::helm::helm_chart_defaults_match_the_kustomize_base",
    ) {
        return Ok(());
    }
    let cp = ControlPlane::shared().await?;
    let base = kustomize(cp, "deploy/kustomize").await?;
    let (with_namespace, defaults) = tokio::task::spawn_blocking(|| -> Result<_> {
        Ok((
            template(&["--set", "namespace.create=true"])?,
            template(&[])?,
        ))
    })
    .await??;
    expect_same_objects(&with_namespace, &base)?;
    // By default Helm leaves the namespace to `helm install
    // --create-namespace` (or an existing one): the rest is the same.
    expect_same_objects(&defaults, &only_kinds_except(&base, &["Namespace"]))?;

    // The legacy-endpoints component's grant is the chart's
    // publishLegacyEndpoints=true (which also sets it in the config file,
    // where the component leaves that to the overlay). The base's `labels:`
    // do not reach the component's objects; the overlay adds part-of, as
    // the chart does on every object.
    let dir = tempfile::Builder::new()
        .prefix("portwise-helm-legacy-")
        .tempdir()?;
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
         resources: [base]\ncomponents: [base/components/legacy-endpoints]\n\
         labels:\n- pairs: {app.kubernetes.io/part-of: portwise}\n  includeSelectors: false\n\
         configMapGenerator:\n- name: portwise-config\n  namespace: portwise-system\n  \
         behavior: replace\n  files: [config.yaml]\n",
    )?;
    copy_dir(&repo().join("deploy/kustomize"), &dir.path().join("base"))?;
    let cfg = std::fs::read_to_string(repo().join("deploy/kustomize/config.yaml"))?;
    ensure!(cfg.contains("publishLegacyEndpoints: false\n"));
    std::fs::write(
        dir.path().join("config.yaml"),
        cfg.replace(
            "publishLegacyEndpoints: false\n",
            "publishLegacyEndpoints: true\n",
        ),
    )?;
    let legacy_base = kustomize(cp, &dir.path().to_string_lossy()).await?;
    let legacy_chart = tokio::task::spawn_blocking(|| {
        template(&[
            "--set",
            "namespace.create=true",
            "--set",
            "config.publishLegacyEndpoints=true",
        ])
    })
    .await??;
    expect_same_objects(&legacy_chart, &legacy_base)?;
    Ok(())
}

/// The kustomize components registry-credentials and module-signatures on
/// the base, with the config keys their headers give, are the chart with
/// `registry.credentialsSecret=portwise-registry` and
/// `moduleSignatures.existingConfigMap=portwise-signing-keys` object for
/// object; both forms of the components' overlay (the keys' ConfigMap made
/// by kubectl, or generated by the overlay) pass a server-side dry run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_chart_oci_values_match_the_kustomize_components() -> Result<()> {
    if portwise_tests::deferred::skip(
        &["helm"],
        "ship::helm::helm_chart_oci_values_match_the_kustomize_components",
    ) {
        return Ok(());
    }
    let cp = ControlPlane::shared().await?;
    const AUTH: &str = "/etc/portwise/registry/config.json";
    const KEY: &str = "/etc/portwise/signing/release.pub";
    for (component, line) in [
        ("registry-credentials", format!("registryAuth: {AUTH}")),
        (
            "module-signatures",
            format!("moduleSignatures: {{keys: [{KEY}]}}"),
        ),
    ] {
        let path = format!("deploy/kustomize/components/{component}/kustomization.yaml");
        let header = std::fs::read_to_string(repo().join(&path))?;
        ensure!(
            header.contains(&line),
            "{path} no longer tells the config to say {line:?}"
        );
    }
    let overlay = |generate_keys: bool| -> Result<tempfile::TempDir> {
        let dir = tempfile::Builder::new()
            .prefix("portwise-helm-oci-")
            .tempdir()?;
        copy_dir(&repo().join("deploy/kustomize"), &dir.path().join("base"))?;
        let cfg = std::fs::read_to_string(repo().join("deploy/kustomize/config.yaml"))?;
        std::fs::write(
            dir.path().join("config.yaml"),
            format!("{cfg}registryAuth: {AUTH}\nmoduleSignatures: {{keys: [{KEY}]}}\n"),
        )?;
        let mut kustomization = String::from(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             resources: [base]\n\
             components: [base/components/registry-credentials, base/components/module-signatures]\n\
             labels:\n- pairs: {app.kubernetes.io/part-of: portwise}\n  includeSelectors: false\n\
             configMapGenerator:\n- name: portwise-config\n  namespace: portwise-system\n  \
             behavior: replace\n  files: [config.yaml]\n",
        );
        if generate_keys {
            // As the component's header shows it.
            std::fs::write(dir.path().join("cosign.pub"), RELEASE_PUB)?;
            kustomization.push_str(
                "- name: portwise-signing-keys\n  namespace: portwise-system\n  \
                 files: [release.pub=cosign.pub]\n",
            );
        }
        std::fs::write(dir.path().join("kustomization.yaml"), kustomization)?;
        Ok(dir)
    };
    let plain = overlay(false)?;
    let components = kustomize(cp, &plain.path().to_string_lossy()).await?;
    let chart = tokio::task::spawn_blocking(|| {
        template(&[
            "--set",
            "namespace.create=true",
            "--set",
            "registry.credentialsSecret=portwise-registry",
            "--set",
            "moduleSignatures.existingConfigMap=portwise-signing-keys",
            "--set",
            &format!("config.moduleSignatures.keys[0]={KEY}"),
        ])
    })
    .await??;
    expect_same_objects(&chart, &components)?;
    let objs = by_key(parse_docs(&components)?)?;
    let deployment = objs
        .values()
        .find(|o| o["kind"] == "Deployment")
        .context("no Deployment")?
        .clone();
    let objs = BTreeMap::from([(
        "Deployment/portwise-system/portwise".to_string(),
        deployment,
    )]);
    expect_eq(
        mounted_file(&objs, AUTH)?,
        (
            "Secret".into(),
            "portwise-registry".into(),
            ".dockerconfigjson".into(),
        ),
    )?;
    expect_eq(
        mounted_file(&objs, KEY)?,
        (
            "ConfigMap".into(),
            "portwise-signing-keys".into(),
            "release.pub".into(),
        ),
    )?;

    // The generated form: the Deployment mounts the generated (hashed)
    // ConfigMap, which holds the key.
    let generated_dir = overlay(true)?;
    let generated = kustomize(cp, &generated_dir.path().to_string_lossy()).await?;
    let objs = parse_docs(&generated)?;
    let keys = objs
        .iter()
        .find(|o| {
            o["kind"] == "ConfigMap"
                && o["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("portwise-signing-keys-"))
        })
        .with_context(|| format!("no generated portwise-signing-keys-<hash>:\n{generated}"))?;
    expect_eq(&keys["data"], &json!({"release.pub": RELEASE_PUB}))?;
    let deployment = objs
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .context("no Deployment")?
        .clone();
    let by_name = BTreeMap::from([(
        "Deployment/portwise-system/portwise".to_string(),
        deployment,
    )]);
    let (_, name, _) = mounted_file(&by_name, KEY)?;
    expect_eq(Some(name.as_str()), keys["metadata"]["name"].as_str())?;

    apply_base_namespace(cp).await?;
    dry_run(
        cp,
        "the base with registry-credentials and module-signatures",
        &components,
    )
    .await?;
    dry_run(
        cp,
        "the same with a generated signing-keys ConfigMap",
        &generated,
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_chart_passes_a_server_side_dry_run() -> Result<()> {
    if portwise_tests::deferred::skip(
        &["helm"],
        "ship::helm::helm_chart_passes_a_server_side_dry_run",
    ) {
        return Ok(());
    }
    let cp = ControlPlane::shared().await?;
    let module = module_as_base64_file()?;
    let keys = signing_key_files()?;
    let (with_namespace, defaults, features, oci, policy) =
        tokio::task::spawn_blocking(move || -> Result<_> {
            Ok((
                template(&["--set", "namespace.create=true"])?,
                template(&[])?,
                template(&[
                    "--set",
                    "config.publishLegacyEndpoints=true",
                    "--set",
                    "replicaCount=3",
                    "--set-file",
                    &format!(
                        "modules.binaryData.admin-check\\.wasm={}",
                        module.path().display()
                    ),
                ])?,
                template(&strs(&oci_values(&keys)))?,
                template(&[NETWORK_POLICY, &[
                    "--set",
                    "networkPolicy.probePorts={8080}",
                    "--set",
                    "networkPolicy.registries[0].cidr=0.0.0.0/0",
                    "--set",
                    "networkPolicy.registries[0].port=443",
                    "--set",
                    "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.name=monitoring",
                ]].concat())?,
            ))
        })
        .await??;
    apply_base_namespace(cp).await?;
    for (what, yaml) in [
        ("the default chart", &defaults),
        ("the chart with namespace.create", &with_namespace),
        ("legacy Endpoints, 3 replicas and a module", &features),
        ("registry credentials, a registry CA and signing keys", &oci),
        ("a NetworkPolicy", &policy),
    ] {
        dry_run(cp, what, yaml).await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_chart_values_render_what_they_promise() -> Result<()> {
    if portwise_tests::deferred::skip(
        &["helm"],
        "ship::helm::helm_chart_values_render_what_they_promise",
    ) {
        return Ok(());
    }
    let guest = guests_dir().join("admin-check.wasm");
    let module = module_as_base64_file()?;
    let keys = signing_key_files()?;
    tokio::task::spawn_blocking(move || -> Result<()> {
        let sa = json!([{"kind": "ServiceAccount", "name": "portwise", "namespace": NAMESPACE}]);

        // HA: replicas, leader election on the Lease the Role names, a PDB.
        let ha = rendered(&["--set", "replicaCount=3"])?;
        let d = object(&ha, "Deployment/portwise-system/portwise")?;
        expect_eq(&d["spec"]["replicas"], &json!(3))?;
        let a = args(&ha)?;
        for flag in [
            "--leader-elect",
            "--lease-namespace=$(POD_NAMESPACE)",
            "--lease-name=portwise",
        ] {
            ensure!(a.iter().any(|x| x == flag), "no {flag} in {a:?}");
        }
        let role = object(&ha, "Role/portwise-system/portwise-leader-election")?;
        expect_eq(&role["rules"][1]["resourceNames"], &json!(["portwise"]))?;
        object(&ha, "RoleBinding/portwise-system/portwise-leader-election")?;
        let pdb = object(&ha, "PodDisruptionBudget/portwise-system/portwise")?;
        expect_eq(&pdb["spec"]["minAvailable"], &json!(1))?;
        // Selectors carry the release, so two releases never share pods.
        let selector = json!({"app.kubernetes.io/name": "portwise", "app.kubernetes.io/instance": RELEASE});
        expect_eq(&d["spec"]["selector"]["matchLabels"], &selector)?;
        expect_eq(&pdb["spec"]["selector"]["matchLabels"], &selector)?;
        let svc = object(&ha, "Service/portwise-system/portwise-metrics")?;
        expect_eq(&svc["spec"]["selector"], &selector)?;

        // Another Lease name: the flag and the Role's resourceNames follow;
        // and a lease duration.
        let lease = rendered(&[
            "--set",
            "leaderElection.leaseName=pw-lease",
            "--set",
            "leaderElection.leaseDuration=30s",
        ])?;
        let a = args(&lease)?;
        ensure!(a.iter().any(|x| x == "--lease-name=pw-lease"), "{a:?}");
        ensure!(a.iter().any(|x| x == "--lease-duration=30s"), "{a:?}");
        let role = object(&lease, "Role/portwise-system/portwise-leader-election")?;
        expect_eq(&role["rules"][1]["resourceNames"], &json!(["pw-lease"]))?;

        // One replica without leader election: no Lease flags, no Role, no
        // PDB (it would block every drain).
        let single = rendered(&[
            "--set",
            "replicaCount=1",
            "--set",
            "leaderElection.enabled=false",
        ])?;
        let a = args(&single)?;
        ensure!(!a.iter().any(|x| x.starts_with("--lease") || x == "--leader-elect"), "{a:?}");
        for gone in [
            "Role/portwise-system/portwise-leader-election",
            "RoleBinding/portwise-system/portwise-leader-election",
            "PodDisruptionBudget/portwise-system/portwise",
        ] {
            ensure!(!single.contains_key(gone), "{gone} rendered without leader election");
        }

        // Sharding: --shards, and the ring's Leases granted (member names
        // follow the pods', so not by name); refused without election.
        let sharded = rendered(&["--set", "shards=8", "--set", "replicaCount=3"])?;
        let a = args(&sharded)?;
        ensure!(a.iter().any(|x| x == "--shards=8") && a.iter().any(|x| x == "--leader-elect"), "{a:?}");
        let role = object(&sharded, "Role/portwise-system/portwise-leader-election")?;
        expect_eq(
            &role["rules"][2],
            &json!({"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                    "verbs": ["list", "get", "update", "delete"]}),
        )?;
        let a = args(&lease)?;
        ensure!(!a.iter().any(|x| x.starts_with("--shards")), "{a:?}");
        let role = object(&lease, "Role/portwise-system/portwise-leader-election")?;
        expect_eq(&role["rules"].as_array().map(Vec::len), &Some(2))?;
        template_refused(
            &["--set", "shards=4", "--set", "replicaCount=1", "--set", "leaderElection.enabled=false"],
            "shards > 1 needs leaderElection.enabled=true",
        )?;
        template_refused(&["--set", "shards=0"], "/shards")?;

        // Legacy Endpoints: the config says so and the grant is there,
        // bound to the ServiceAccount.
        let legacy = rendered(&["--set", "config.publishLegacyEndpoints=true"])?;
        expect_eq(&config(&legacy)?["publishLegacyEndpoints"], &json!(true))?;
        let cr = object(&legacy, "ClusterRole//portwise-legacy-endpoints")?;
        expect_eq(
            &cr["rules"],
            &json!([{"apiGroups": [""], "resources": ["endpoints"], "verbs": ["create", "patch"]}]),
        )?;
        let crb = object(&legacy, "ClusterRoleBinding//portwise-legacy-endpoints")?;
        expect_eq(&crb["subjects"], &sa)?;
        expect_eq(&crb["roleRef"]["name"], &json!("portwise-legacy-endpoints"))?;
        let defaults = rendered(&[])?;
        expect_eq(&config(&defaults)?["publishLegacyEndpoints"], &json!(false))?;
        ensure!(!defaults.contains_key("ClusterRole//portwise-legacy-endpoints"));

        // No node lookups: no access to Nodes. No Events: no Event rules.
        let lean = rendered(&[
            "--set",
            "config.disableNodeLookups=true",
            "--set",
            "rbac.events=false",
        ])?;
        let rules = &object(&lean, "ClusterRole//portwise")?["rules"];
        expect_eq(&rules[0]["resources"], &json!(["services", "pods"]))?;
        ensure!(
            !rules.to_string().contains("events"),
            "Event rules with rbac.events=false: {rules}"
        );
        let rules = &object(&defaults, "ClusterRole//portwise")?["rules"];
        expect_eq(&rules[0]["resources"], &json!(["services", "pods", "nodes"]))?;

        // Endpoints are deleted only where the config needs it: native
        // cleanup (the default) or legacy publishing. No rule updates.
        let endpoints_verbs = |objs: &BTreeMap<String, Value>| -> Result<Value> {
            let rules = &object(objs, "ClusterRole//portwise")?["rules"];
            rules
                .as_array()
                .into_iter()
                .flatten()
                .find(|r| r["resources"] == json!(["endpoints"]))
                .map(|r| r["verbs"].clone())
                .context("no rule for endpoints")
        };
        expect_eq(endpoints_verbs(&defaults)?, json!(["get", "list", "watch", "delete"]))?;
        let no_cleanup = rendered(&["--set", "config.nativeCleanup=false"])?;
        expect_eq(endpoints_verbs(&no_cleanup)?, json!(["get", "list", "watch"]))?;
        expect_eq(endpoints_verbs(&legacy)?, json!(["get", "list", "watch", "delete"]))?;
        for objs in [&defaults, &no_cleanup, &legacy] {
            // Updates: the slices portwise publishes (resourceVersion-
            // checked), nothing else.
            for (key, obj) in objs.iter().filter(|(k, _)| k.starts_with("ClusterRole//")) {
                for rule in obj["rules"].as_array().into_iter().flatten() {
                    let updates = rule["verbs"]
                        .as_array()
                        .is_some_and(|v| v.contains(&json!("update")));
                    ensure!(
                        !updates || rule["resources"] == json!(["endpointslices"]),
                        "{key} grants update beyond endpointslices: {rule}"
                    );
                }
            }
        }

        // A config change is reloaded in place: the pod template does not
        // change (so nothing rolls), and the file is a directory mount (a
        // subPath mount is never updated by the kubelet).
        let pod_template = |objs: &BTreeMap<String, Value>| -> Result<Value> {
            Ok(object(objs, "Deployment/portwise-system/portwise")?["spec"]["template"].clone())
        };
        let annotation = |objs: &BTreeMap<String, Value>, key: &str| -> Result<Value> {
            Ok(pod_template(objs)?["metadata"]["annotations"][key].clone())
        };
        expect_eq(pod_template(&defaults)?, pod_template(&legacy)?)?;
        ensure!(pod_template(&defaults)?["metadata"]["annotations"].is_null());
        let mounts = &pod_template(&defaults)?["spec"]["containers"][0]["volumeMounts"];
        let config_mount = mounts
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["name"] == "config")
            .context("no config mount")?;
        expect_eq(config_mount, &json!({"name": "config", "mountPath": "/etc/portwise/config", "readOnly": true}))?;
        let args = &pod_template(&defaults)?["spec"]["containers"][0]["args"];
        ensure!(
            args.as_array().into_iter().flatten().any(|a| a == "--config=/etc/portwise/config/config.yaml"),
            "{args}"
        );
        // reloadConfig=false: a config change rolls the pods.
        let rolled = rendered(&["--set", "reloadConfig=false"])?;
        let rolled_legacy = rendered(&["--set", "reloadConfig=false", "--set", "config.publishLegacyEndpoints=true"])?;
        ensure!(annotation(&rolled, "checksum/config")?.is_string());
        ensure!(
            annotation(&rolled, "checksum/config")? != annotation(&rolled_legacy, "checksum/config")?,
            "the config changed, the pod template did not"
        );

        // Modules: a file's base64 given with --set-file (wrapped, as
        // `base64` prints it) lands byte for byte in binaryData; an existing
        // ConfigMap replaces the chart's.
        let wasm = std::fs::read(&guest)?;
        let with_module = rendered(&[
            "--set-file",
            &format!("modules.binaryData.admin-check\\.wasm={}", module.path().display()),
        ])?;
        let cm = object(&with_module, "ConfigMap/portwise-system/portwise-modules")?;
        let b64 = cm["binaryData"]["admin-check.wasm"].as_str().context("no binaryData")?;
        expect_eq(b64, base64(&wasm).as_str())?;
        let existing = rendered(&["--set", "modules.existingConfigMap=my-modules"])?;
        ensure!(!existing.contains_key("ConfigMap/portwise-system/portwise-modules"));
        let vols = &object(&existing, "Deployment/portwise-system/portwise")?["spec"]["template"]["spec"]["volumes"];
        ensure!(
            vols.as_array().is_some_and(|v| v.iter().any(|v| v["name"] == "modules"
                && v["configMap"]["name"] == "my-modules")),
            "modules volume does not use my-modules: {vols}"
        );

        // Another release name: every name carries it, the Lease too.
        let other = by_key(parse_docs(&template_as("edge", &[])?)?)?;
        for k in [
            "Deployment/portwise-system/edge-portwise",
            "ClusterRole//edge-portwise",
            "ConfigMap/portwise-system/edge-portwise-config",
            "ConfigMap/portwise-system/edge-portwise-modules",
            "Service/portwise-system/edge-portwise-metrics",
        ] {
            object(&other, k)?;
        }
        let d = object(&other, "Deployment/portwise-system/edge-portwise")?;
        let a: Vec<_> = d["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .context("no args")?
            .iter()
            .filter_map(|a| a.as_str())
            .collect();
        ensure!(a.contains(&"--lease-name=edge-portwise"), "{a:?}");

        // Image by digest; extra args after the base's.
        let digest = format!("sha256:{}", "a".repeat(64));
        let img = rendered(&[
            "--set",
            &format!("image.digest={digest}"),
            "--set",
            "extraArgs[0]=--check-timeout=5s",
        ])?;
        let c = &object(&img, "Deployment/portwise-system/portwise")?["spec"]["template"]["spec"]["containers"][0];
        expect_eq(&c["image"], &json!(format!("ghcr.io/portwise/portwise@{digest}")))?;
        expect_eq(c["args"].as_array().and_then(|a| a.last()), Some(&json!("--check-timeout=5s")))?;

        // Modules from OCI registries: the credentials Secret, the CA
        // ConfigMap and the chart's signing keys are mounted, and the config
        // file names the files those mounts provide.
        let oci_args = oci_values(&keys);
        let oci = rendered(&strs(&oci_args))?;
        let cfg = config(&oci)?;
        expect_eq(&cfg["registryAuth"], &json!("/etc/portwise/registry/config.json"))?;
        expect_eq(&cfg["registryCA"], &json!("/etc/portwise/registry-ca/ca.crt"))?;
        // Sorted by file name, whatever the order of the values.
        expect_eq(
            &cfg["moduleSignatures"],
            &json!({"keys": ["/etc/portwise/signing/backup.pub", "/etc/portwise/signing/release.pub"]}),
        )?;
        let file = |objs: &BTreeMap<String, Value>, cfg: &Value, ptr: &str| -> Result<(String, String, String)> {
            mounted_file(objs, cfg.pointer(ptr).and_then(Value::as_str).with_context(|| format!("no {ptr} in {cfg}"))?)
        };
        let owned = |k: &str, n: &str, key: &str| (k.to_string(), n.to_string(), key.to_string());
        expect_eq(file(&oci, &cfg, "/registryAuth")?, owned("Secret", "pull-secret", ".dockerconfigjson"))?;
        expect_eq(file(&oci, &cfg, "/registryCA")?, owned("ConfigMap", "registry-ca", "ca.crt"))?;
        let signing = object(&oci, "ConfigMap/portwise-system/portwise-signing-keys")?;
        expect_eq(&signing["data"], &json!({"release.pub": RELEASE_PUB, "backup.pub": BACKUP_PUB}))?;
        for (i, name) in ["backup.pub", "release.pub"].iter().enumerate() {
            let (kind, cm, key) = file(&oci, &cfg, &format!("/moduleSignatures/keys/{i}"))?;
            expect_eq((kind.as_str(), cm.as_str(), key.as_str()), ("ConfigMap", "portwise-signing-keys", *name))?;
            ensure!(signing["data"][&key].is_string(), "{key} is not in the signing-keys ConfigMap");
        }
        // The config file is one portwise reads, with those files.
        let text = object(&oci, "ConfigMap/portwise-system/portwise-config")?["data"]["config.yaml"]
            .as_str()
            .context("no config.yaml")?;
        let parsed = portwise_core::config::Config::from_yaml(text)
            .map_err(|e| anyhow::anyhow!("portwise refuses the rendered config: {e}\n{text}"))?;
        expect_eq(parsed.registry_auth.as_deref(), Some(std::path::Path::new("/etc/portwise/registry/config.json")))?;
        expect_eq(parsed.registry_ca.as_deref(), Some(std::path::Path::new("/etc/portwise/registry-ca/ca.crt")))?;
        expect_eq(
            parsed.module_signatures.map(|s| s.keys),
            Some(vec![PathBuf::from("/etc/portwise/signing/backup.pub"), PathBuf::from("/etc/portwise/signing/release.pub")]),
        )?;
        // The config file is reloaded; a rotated key alone (same file
        // names, so the same config file) rolls the pods.
        let keys_checksum = |objs: &BTreeMap<String, Value>| annotation(objs, "checksum/signing-keys");
        ensure!(keys_checksum(&oci)?.is_string(), "no checksum/signing-keys with signing keys");
        let mut rotated_args = oci_args.clone();
        rotated_args.extend([
            "--set-file".to_string(),
            format!("moduleSignatures.publicKeys.release\\.pub={}", keys.rotated.path().display()),
        ]);
        let rotated = rendered(&strs(&rotated_args))?;
        expect_eq(config(&rotated)?, cfg.clone())?;
        expect_eq(
            &object(&rotated, "ConfigMap/portwise-system/portwise-signing-keys")?["data"]["release.pub"],
            &json!(ROTATED_PUB),
        )?;
        ensure!(keys_checksum(&rotated)? != keys_checksum(&oci)?, "a signing key changed, the pod template did not");
        // None of it by default.
        let cfg = config(&defaults)?;
        for k in ["registryAuth", "registryCA", "moduleSignatures"] {
            ensure!(cfg.get(k).is_none(), "{k} in the default config: {cfg}");
        }
        ensure!(!defaults.contains_key("ConfigMap/portwise-system/portwise-signing-keys"));
        let vols = &object(&defaults, "Deployment/portwise-system/portwise")?["spec"]["template"]["spec"]["volumes"];
        expect_eq(
            vols.as_array().context("no volumes")?.iter().map(|v| v["name"].as_str().unwrap_or_default()).collect::<Vec<_>>(),
            vec!["config", "modules", "cache"],
        )?;

        // What config sets explicitly is kept; the mounts are still there.
        let mut explicit_args = oci_args.clone();
        explicit_args.extend(
            [
                "--set",
                "config.registryAuth=/etc/portwise/registry/other.json",
                "--set",
                "config.registryCA=/etc/ssl/certs/ca-certificates.crt",
                "--set",
                "config.moduleSignatures.keys[0]=/etc/portwise/signing/release.pub",
            ]
            .map(String::from),
        );
        let explicit = rendered(&strs(&explicit_args))?;
        let cfg = config(&explicit)?;
        expect_eq(&cfg["registryAuth"], &json!("/etc/portwise/registry/other.json"))?;
        expect_eq(&cfg["registryCA"], &json!("/etc/ssl/certs/ca-certificates.crt"))?;
        expect_eq(&cfg["moduleSignatures"], &json!({"keys": ["/etc/portwise/signing/release.pub"]}))?;
        expect_eq(file(&explicit, &cfg, "/moduleSignatures/keys/0")?, owned("ConfigMap", "portwise-signing-keys", "release.pub"))?;
        mounted_file(&explicit, "/etc/portwise/registry/config.json")?;
        mounted_file(&explicit, "/etc/portwise/registry-ca/ca.crt")?;

        // An existing ConfigMap of keys, named by the config: mounted, and
        // the chart creates none.
        let existing = rendered(&[
            "--set",
            "moduleSignatures.existingConfigMap=my-keys",
            "--set",
            "config.moduleSignatures.keys[0]=/etc/portwise/signing/ops.pub",
        ])?;
        ensure!(!existing.contains_key("ConfigMap/portwise-system/portwise-signing-keys"));
        let cfg = config(&existing)?;
        expect_eq(&cfg["moduleSignatures"], &json!({"keys": ["/etc/portwise/signing/ops.pub"]}))?;
        expect_eq(file(&existing, &cfg, "/moduleSignatures/keys/0")?, owned("ConfigMap", "my-keys", "ops.pub"))?;
        ensure!(cfg.get("registryAuth").is_none() && cfg.get("registryCA").is_none(), "{cfg}");
        Ok(())
    })
    .await?
}

// ---- small helpers ------------------------------------------------------------

/// Two cosign public keys (P-256, as `cosign generate-key-pair` makes), and
/// a third standing for a rotated `release.pub`. The chart only carries
/// them; tests/tests/it/oci.rs verifies real signatures.
const RELEASE_PUB: &str = "-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAELEc1m+R9cbUnRl+J09gJfs5G8hVJ
le0mpIxy9Tyqnq7RxWV1tyn3KGw58kjIvxibrHSAtDw/tVhTbK21u+qx0Q==
-----END PUBLIC KEY-----
";
const BACKUP_PUB: &str = "-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAER5ro8BuCuZZzADQS+3n56hHxELkI
4H2pyOq6zKOHenKzaw0WRj4sraRFNB3I1LPHBARpqfFqUxGeNmnVZUkCfg==
-----END PUBLIC KEY-----
";
const ROTATED_PUB: &str = "-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE1zazsCixW2LGdQqcsAYHWSTbANgr
/9wjFyyXNpZJj8dqOq36rCq1kjTJoryfqYu8SgCAIC6a5dybF4iJyThbCw==
-----END PUBLIC KEY-----
";

/// The public keys in files, for `--set-file`.
struct SigningKeyFiles {
    release: tempfile::NamedTempFile,
    backup: tempfile::NamedTempFile,
    rotated: tempfile::NamedTempFile,
}

fn signing_key_files() -> Result<SigningKeyFiles> {
    let file = |pem: &str| -> Result<tempfile::NamedTempFile> {
        let mut f = tempfile::Builder::new()
            .prefix("portwise-cosign-")
            .suffix(".pub")
            .tempfile()?;
        std::io::Write::write_all(&mut f, pem.as_bytes())?;
        Ok(f)
    };
    Ok(SigningKeyFiles {
        release: file(RELEASE_PUB)?,
        backup: file(BACKUP_PUB)?,
        rotated: file(ROTATED_PUB)?,
    })
}

/// The registry credentials Secret `pull-secret`, the CA ConfigMap
/// `registry-ca`, and two signing keys (release.pub, backup.pub) given
/// with `--set-file`, as the README shows.
fn oci_values(keys: &SigningKeyFiles) -> Vec<String> {
    [
        "--set".to_string(),
        "registry.credentialsSecret=pull-secret".to_string(),
        "--set".to_string(),
        "registry.caConfigMap=registry-ca".to_string(),
        "--set-file".to_string(),
        format!(
            "moduleSignatures.publicKeys.release\\.pub={}",
            keys.release.path().display()
        ),
        "--set-file".to_string(),
        format!(
            "moduleSignatures.publicKeys.backup\\.pub={}",
            keys.backup.path().display()
        ),
    ]
    .to_vec()
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// Where the rendered Deployment's container finds the file `path`: the
/// directory mount holding it (which must be readOnly) and the key of the
/// Secret or ConfigMap its volume projects there, as `(kind, name, key)`.
fn mounted_file(objs: &BTreeMap<String, Value>, path: &str) -> Result<(String, String, String)> {
    let spec = &object(objs, "Deployment/portwise-system/portwise")?["spec"]["template"]["spec"];
    let mounts = spec["containers"][0]["volumeMounts"]
        .as_array()
        .context("no volumeMounts")?;
    let (mount, file) = mounts
        .iter()
        .filter(|m| m.get("subPath").is_none())
        .find_map(|m| {
            let dir = m["mountPath"].as_str()?.trim_end_matches('/');
            let file = path.strip_prefix(dir)?.strip_prefix('/')?;
            (!file.is_empty() && !file.contains('/')).then_some((m, file))
        })
        .with_context(|| format!("no directory mount provides {path}: {mounts:?}"))?;
    ensure!(
        mount["readOnly"] == json!(true),
        "{path}: mount is not readOnly: {mount}"
    );
    let volume = spec["volumes"]
        .as_array()
        .context("no volumes")?
        .iter()
        .find(|v| v["name"] == mount["name"])
        .with_context(|| format!("{path}: no volume {}", mount["name"]))?;
    let (kind, name, source) = if let Some(s) = volume.get("secret") {
        ("Secret", &s["secretName"], s)
    } else if let Some(c) = volume.get("configMap") {
        ("ConfigMap", &c["name"], c)
    } else {
        bail!("{path}: volume is neither a Secret nor a ConfigMap: {volume}");
    };
    ensure!(
        source.get("optional").is_none_or(|o| o == &json!(false)),
        "{path}: an optional volume would start portwise without it: {volume}"
    );
    let key = match source.get("items").and_then(Value::as_array) {
        Some(items) => items
            .iter()
            .find(|i| i["path"] == file)
            .and_then(|i| i["key"].as_str())
            .with_context(|| format!("{path}: volume {volume} does not project {file}"))?,
        None => file,
    };
    Ok((
        kind.to_string(),
        name.as_str().unwrap_or_default().to_string(),
        key.to_string(),
    ))
}

/// Applies the base's Namespace (a dry run cannot create the namespace its
/// objects go into), idempotently as the kustomize test does: the chart's
/// with namespace.create=true is the same object.
async fn apply_base_namespace(cp: &ControlPlane) -> Result<()> {
    let base = kustomize(cp, "deploy/kustomize").await?;
    apply(cp, &only_kinds(&base, &["Namespace"])).await?;
    Ok(())
}

/// A server-side dry-run apply of `yaml` on the real apiserver: every
/// document applied, no warning (Pod Security `restricted` is enforced on
/// the namespace).
async fn dry_run(cp: &ControlPlane, what: &str, yaml: &str) -> Result<()> {
    let warnings = super::support::dry_run(cp, yaml)
        .await
        .with_context(|| format!("{what}: server-side dry run"))?;
    ensure!(
        !warnings.to_lowercase().contains("warning"),
        "{what}: the apiserver warned (Pod Security restricted is enforced on {NAMESPACE}):\n{warnings}"
    );
    Ok(())
}

/// The documents of `yaml` whose kind is not one of `kinds`, as one stream.
fn only_kinds_except(yaml: &str, kinds: &[&str]) -> String {
    documents(yaml)
        .into_iter()
        .filter(|(k, _)| !kinds.contains(&k.as_str()))
        .map(|(_, d)| d)
        .collect::<Vec<_>>()
        .join("---\n")
}

/// The admin-check guest's base64, wrapped at 76 columns as `base64`
/// prints it, in a file for `--set-file`.
fn module_as_base64_file() -> Result<tempfile::NamedTempFile> {
    let guest = guests_dir().join("admin-check.wasm");
    let wasm = std::fs::read(&guest)
        .map_err(|e| anyhow::anyhow!("{}: {e} (run guests/build rust first)", guest.display()))?;
    let b64 = base64(&wasm);
    let mut wrapped = String::new();
    for line in b64.as_bytes().chunks(76) {
        wrapped.push_str(std::str::from_utf8(line)?);
        wrapped.push('\n');
    }
    let mut f = tempfile::Builder::new()
        .prefix("admin-check-")
        .suffix(".wasm.b64")
        .tempfile()?;
    std::io::Write::write_all(&mut f, wrapped.as_bytes())?;
    Ok(f)
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

/// Standard base64 with padding, as Kubernetes' binaryData holds it.
fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The monitoring values: the ServiceMonitor scrapes the metrics Service's
/// port with the Service's own labels kept, the PrometheusRule is
/// files/rules.yaml exactly (what promtool tests, ship::alerts), the
/// dashboard ConfigMap is files/dashboard.json exactly, all off by default,
/// and a ServiceMonitor without the Service it scrapes is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_chart_renders_its_monitoring() -> Result<()> {
    if portwise_tests::deferred::skip(&["helm"], "ship::helm::helm_chart_renders_its_monitoring") {
        return Ok(());
    }
    tokio::task::spawn_blocking(|| -> Result<()> {
        let defaults = rendered(&[])?;
        for kind in ["ServiceMonitor/", "PrometheusRule/", "ConfigMap/portwise-system/portwise-dashboard"] {
            ensure!(
                !defaults.keys().any(|k| k.starts_with(kind)),
                "{kind} rendered by default"
            );
        }
        let on = rendered(&[
            "--set",
            "metrics.serviceMonitor.enabled=true",
            "--set",
            "metrics.serviceMonitor.labels.release=prom",
            "--set",
            "metrics.serviceMonitor.interval=15s",
            "--set",
            "metrics.prometheusRule.enabled=true",
            "--set",
            "metrics.grafanaDashboard.enabled=true",
            "--set",
            "metrics.grafanaDashboard.namespace=monitoring",
        ])?;
        let sm = object(&on, "ServiceMonitor/portwise-system/portwise")?;
        expect_eq(&sm["apiVersion"], &json!("monitoring.coreos.com/v1"))?;
        expect_eq(&sm["metadata"]["labels"]["release"], &json!("prom"))?;
        let svc = object(&on, "Service/portwise-system/portwise-metrics")?;
        // Every label the ServiceMonitor selects by is on the metrics Service.
        let selected = sm["spec"]["selector"]["matchLabels"]
            .as_object()
            .context("ServiceMonitor without matchLabels")?;
        ensure!(!selected.is_empty(), "ServiceMonitor selects everything");
        for (k, v) in selected {
            expect_eq(&svc["metadata"]["labels"][k], v)?;
        }
        expect_eq(
            &sm["spec"]["namespaceSelector"]["matchNames"],
            &json!([NAMESPACE]),
        )?;
        expect_eq(
            &sm["spec"]["endpoints"],
            &json!([{"port": "metrics", "path": "/metrics", "interval": "15s", "honorLabels": true}]),
        )?;
        expect_eq(&svc["spec"]["ports"][0]["name"], &json!("metrics"))?;

        let rule = object(&on, "PrometheusRule/portwise-system/portwise")?;
        let file = std::fs::read_to_string(repo().join("deploy/helm/files/rules.yaml"))?;
        let rules = parse_docs(&file)?
            .into_iter()
            .next()
            .context("files/rules.yaml is empty")?;
        expect_eq(&rule["spec"], &rules)?;
        let alerts = rules["groups"][0]["rules"]
            .as_array()
            .map(Vec::len)
            .unwrap_or_default();
        expect_eq(alerts, 8)?;

        let dash = object(&on, "ConfigMap/monitoring/portwise-dashboard")?;
        expect_eq(&dash["metadata"]["labels"]["grafana_dashboard"], &json!("1"))?;
        let shipped: Value = serde_json::from_str(
            dash["data"]["portwise.json"]
                .as_str()
                .context("no portwise.json in the dashboard ConfigMap")?,
        )?;
        let file: Value = serde_json::from_str(&std::fs::read_to_string(
            repo().join("deploy/helm/files/dashboard.json"),
        )?)?;
        expect_eq(&shipped, &file)?;

        template_refused(
            &[
                "--set",
                "metrics.serviceMonitor.enabled=true",
                "--set",
                "metrics.service.enabled=false",
            ],
            "metrics.serviceMonitor.enabled needs metrics.service.enabled",
        )?;
        // The schema refuses what the Prometheus Operator would not take.
        template_refused(
            &[
                "--set",
                "metrics.serviceMonitor.enabled=true",
                "--set",
                "metrics.serviceMonitor.interval=often",
            ],
            "interval",
        )?;
        Ok(())
    })
    .await?
}
