//! The guest SDKs as packages (issue 46 item 7): what a guest author gets
//! is what is published, not the checkout. `guests/sdk/pack --publish`,
//! the release's command for them, builds the WIT package
//! (`portwise:membership`) and publishes it with `wkg` to the suite's
//! registry (TLS with the control plane's CA, htpasswd), packs the Rust
//! helper crate (`cargo package`), the JavaScript one (`npm pack`) and the
//! Python one (a wheel); the packed files are checked. Then templates are
//! copied into a temporary directory outside the checkout and built
//! against those packages alone: the Rust template against the packed
//! crate (a crates.io patch to the unpacked `.crate`, offline), the Python
//! and C templates against the WIT that `wkg get` fetches from the
//! registry, the JavaScript template against the packed npm package
//! (`npm install` of the `.tgz` beside its pinned toolchain). Each
//! component replays its template's committed recordings into the
//! committed verdict tables, the check the templates' READMEs give for CI.
//! (The Go template is built against the helper module laid out as the Go
//! module proxy serves it: host/portwise's templates test.)
//!
//! Needs the registry and wkg (tests/wkg/build; both deferred on a cold
//! machine, so the test is skipped there and says so), the guests'
//! toolchains (guests/build: wasm32-wasip2, componentize-py, componentize-js
//! in npm's cache, clang and the tools of guests/build-polyglot) and the
//! `portwise` binary.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
};

use anyhow::{Context, Result, ensure};
use portwise_tests::{registry::Registry, *};

use super::support::repo;

const TEST: &str = "ship::sdk::templates_build_from_the_published_packages";
/// The WIT package the templates build against (wit/membership.wit).
const WIT_PACKAGE: &str = "portwise:membership@0.2.1";
/// The SDKs' version: the workspace's (host/portwise/tests/versions.rs).
const VERSION: &str = env!("CARGO_PKG_VERSION");

fn ran(what: &str, out: std::io::Result<Output>) -> Result<String> {
    let out = out.with_context(|| format!("running {what}"))?;
    portwise_tests::stdout_of(what, &out)
}

fn cache() -> PathBuf {
    std::env::var_os("PORTWISE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/portwise")
        })
}

/// wkg: tests/wkg/build, which builds it into the tools cache if need be
/// (under ./test, a cold machine defers that and this test is skipped).
fn wkg() -> Result<PathBuf> {
    let printed = ran(
        "tests/wkg/build",
        Command::new(repo().join("tests/wkg/build"))
            .stderr(Stdio::inherit())
            .output(),
    )?;
    Ok(PathBuf::from(printed.trim()))
}

/// A wkg config that maps the `portwise` namespace to the suite's registry
/// (`HOST/portwise/portwise/membership:VERSION`: wkg puts the namespace
/// after the prefix), trusting its CA, with its user.
fn wkg_config(reg: &Registry, path: &Path) -> Result<()> {
    let host = reg.host();
    let ca = std::fs::read_to_string(reg.ca_file())?;
    std::fs::write(
        path,
        format!(
            "[namespace_registries]\n\
             portwise = {{ registry = \"{host}\", metadata = {{ preferredProtocol = \"oci\", \
             oci = {{ registry = \"{host}\", namespacePrefix = \"portwise/\" }} }} }}\n\
             [registry.\"{host}\".oci]\n\
             auth = {{ username = \"{user}\", password = \"{password}\" }}\n\
             [[registry.\"{host}\".oci.extra_root_certificates]]\n\
             encoding = \"pem\"\n\
             data = \"\"\"\n{ca}\"\"\"\n",
            user = registry::USER,
            password = registry::PASSWORD,
        ),
    )?;
    Ok(())
}

/// Copies a directory tree, leaving out build output.
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        if entry.file_type()?.is_dir() {
            if !matches!(
                entry.file_name().to_str(),
                Some("target" | "build" | "node_modules")
            ) {
                copy_tree(&src, &dst)?;
            }
        } else {
            std::fs::copy(&src, &dst)?;
        }
    }
    Ok(())
}

/// `portwise check --replay` of each recording in `template`'s testdata
/// with the component `wasm`: the committed table, line for line.
fn replays(portwise: &Path, template: &Path, wasm: &Path, scratch: &Path) -> Result<()> {
    let testdata = template.join("testdata");
    // A directory of its own: `check --wasm` loads every module beside it.
    let dir = scratch.join("module");
    std::fs::create_dir_all(&dir)?;
    let module = dir.join(wasm.file_name().context("a file")?);
    std::fs::copy(wasm, &module)?;
    for name in ["http", "tcp"] {
        let config = std::fs::read_to_string(testdata.join(format!("config-{name}.json")))?;
        let out = Command::new(portwise)
            .arg("check")
            .arg("--wasm")
            .arg(&module)
            .args(["--wasm-config", config.trim()])
            .args(["--pod", "pod.yaml", "--service", "service.yaml"])
            .arg("--replay")
            .arg(format!("probes-{name}.json"))
            .current_dir(&testdata)
            .env("PORTWISE_CACHE_DIR", scratch.join("compiled"))
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .output();
        let table = ran(&format!("portwise check --replay ({name})"), out)?;
        let want = std::fs::read_to_string(testdata.join(format!("expected-{name}.txt")))?;
        ensure!(
            table == want,
            "{}: the replay of probes-{name}.json differs from expected-{name}.txt:\n{table}",
            template.display()
        );
    }
    Ok(())
}

/// The files of a gzipped tarball (`.crate`, `npm pack`'s `.tgz`).
fn tar_list(file: &Path) -> Result<Vec<String>> {
    let out = ran(
        "tar -tzf",
        Command::new("tar").arg("-tzf").arg(file).output(),
    )?;
    Ok(out.lines().map(str::to_string).collect())
}

/// The packed crate, checked and unpacked: the directory a crates.io
/// download gives.
fn unpack_the_crate(krate: &Path, work: &Path) -> Result<PathBuf> {
    let files = tar_list(krate)?;
    let root = format!("portwise-guest-{VERSION}/");
    for want in [
        "Cargo.toml",
        "README.md",
        "src/lib.rs",
        "wit/membership.wit",
    ] {
        ensure!(
            files.iter().any(|f| *f == format!("{root}{want}")),
            "{} lacks {want}: {files:?}",
            krate.display()
        );
    }
    let unpacked = work.join("crates");
    std::fs::create_dir_all(&unpacked)?;
    ran(
        "tar -xzf (the .crate)",
        Command::new("tar")
            .arg("-xzf")
            .arg(krate)
            .arg("-C")
            .arg(&unpacked)
            .output(),
    )?;
    Ok(unpacked.join(root.trim_end_matches('/')))
}

/// The Rust template, copied out, built against the unpacked crate only.
fn build_the_rust_template(work: &Path, krate: &Path) -> Result<(PathBuf, PathBuf)> {
    let checker = work.join("my-rust-checker");
    copy_tree(&repo().join("guests/templates/rust"), &checker)?;
    let manifest = std::fs::read_to_string(checker.join("Cargo.toml"))?;
    ensure!(
        !manifest.contains("path ="),
        "the Rust template has a path dependency:\n{manifest}"
    );
    // The target directory host/portwise's templates test builds its copy
    // in, kept between runs: only the helper and the copy rebuild.
    let target = cache().join("guests-outside-target");
    ran(
        "cargo build (the Rust template, outside the checkout)",
        Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
            .args([
                "build",
                "--release",
                "--offline",
                "--locked",
                "--target",
                "wasm32-wasip2",
                "--config",
            ])
            .arg(format!(
                "patch.crates-io.portwise-guest.path={:?}",
                krate.display().to_string()
            ))
            .current_dir(&checker)
            .env("CARGO_TARGET_DIR", &target)
            .env_remove("CARGO_BUILD_TARGET")
            .output(),
    )?;
    // What it was built from: the unpacked crate, nothing in the checkout.
    let metadata = ran(
        "cargo metadata",
        Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
            .args(["metadata", "--offline", "--format-version", "1", "--config"])
            .arg(format!(
                "patch.crates-io.portwise-guest.path={:?}",
                krate.display().to_string()
            ))
            .current_dir(&checker)
            .output(),
    )?;
    let metadata: serde_json::Value = serde_json::from_str(&metadata)?;
    let guest = metadata["packages"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == "portwise-guest"))
        .context("cargo metadata: no portwise-guest")?;
    let from = guest["manifest_path"].as_str().unwrap_or_default();
    ensure!(
        Path::new(from).starts_with(krate) && guest["version"] == VERSION,
        "portwise-guest came from {from} ({}), not the packed crate",
        guest["version"]
    );
    let repo = repo().canonicalize()?;
    for p in metadata["packages"].as_array().into_iter().flatten() {
        let path = p["manifest_path"].as_str().unwrap_or_default();
        ensure!(
            !Path::new(path).starts_with(&repo),
            "the copied template builds {path} from the checkout"
        );
    }
    Ok((
        checker,
        target.join("wasm32-wasip2/release/my_checker.wasm"),
    ))
}

/// `wkg get` of the contract's WIT into `checker/wit`, as the templates'
/// READMEs say, from the suite's registry.
fn wkg_get(wkg: &Path, config: &Path, checker: &Path, cache: &Path) -> Result<()> {
    ensure!(!checker.join("wit").exists(), "the template ships a wit/");
    std::fs::create_dir_all(checker.join("wit"))?;
    ran(
        &format!("wkg get (into {})", checker.display()),
        Command::new(wkg)
            .args(["get", WIT_PACKAGE, "--format", "wit", "--output"])
            .arg("wit/membership.wit")
            .arg("--config")
            .arg(config)
            .arg("--cache")
            .arg(cache)
            .current_dir(checker)
            .output(),
    )?;
    let fetched = std::fs::read_to_string(checker.join("wit/membership.wit"))?;
    ensure!(
        fetched.contains("package portwise:membership@0.2.1;")
            && fetched.contains("world membership-checker"),
        "wkg get gave no membership-checker world:\n{fetched}"
    );
    Ok(())
}

/// The tools `guests/build-polyglot --tools` pins (wasm-tools, wit-bindgen,
/// the adapter), by name.
fn polyglot_tools() -> Result<std::collections::HashMap<String, String>> {
    let printed = ran(
        "guests/build-polyglot --tools",
        Command::new(repo().join("guests/build-polyglot"))
            .arg("--tools")
            .output(),
    )?;
    Ok(printed
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect())
}

/// The C template, copied out, its WIT fetched from the registry with `wkg
/// get`, built by its own `build` with the pinned tools.
fn build_the_c_template(wkg: &Path, config: &Path, work: &Path) -> Result<(PathBuf, PathBuf)> {
    let checker = work.join("my-c-checker");
    copy_tree(&repo().join("guests/templates/c"), &checker)?;
    wkg_get(wkg, config, &checker, &work.join("wkg-cache-c"))?;
    let tools = polyglot_tools()?;
    let tool = |name: &str| {
        tools
            .get(name)
            .cloned()
            .with_context(|| format!("guests/build-polyglot --tools printed no {name}"))
    };
    let wasm = work.join("my-c-checker.wasm");
    ran(
        "the C template's build, outside the checkout",
        Command::new(checker.join("build"))
            .arg(&wasm)
            .current_dir(&checker)
            .env("WIT_BINDGEN", tool("wit_bindgen")?)
            .env("WASM_TOOLS", tool("wasm_tools")?)
            .env("ADAPTER", tool("adapter")?)
            .output(),
    )?;
    Ok((checker, wasm))
}

/// The JavaScript template, copied out, with the packed `@portwise/guest`
/// installed by npm next to its pinned toolchain (`npm install --save-dev
/// <tgz>`, the README's npm route), built by componentize-js against the
/// package's WIT (`node_modules/@portwise/guest/wit`).
fn build_the_js_template(tgz: &Path, work: &Path) -> Result<(PathBuf, PathBuf)> {
    let checker = work.join("my-js-checker");
    copy_tree(&repo().join("guests/templates/js"), &checker)?;
    // The toolchain comes from npm's cache when guests/build has installed
    // it (the same pins), else from the registry.
    ran(
        "npm install (the JavaScript template, with the packed @portwise/guest)",
        Command::new("npm")
            .args([
                "install",
                "--prefer-offline",
                "--no-audit",
                "--no-fund",
                "--loglevel=error",
                "--save-dev",
            ])
            .arg(tgz)
            .current_dir(&checker)
            .output(),
    )?;
    let wit = checker.join("node_modules/@portwise/guest/wit");
    ensure!(
        std::fs::read(wit.join("membership.wit"))?
            == std::fs::read(repo().join("wit/membership.wit"))?,
        "the installed @portwise/guest's WIT is not the contract's"
    );
    let wasm = work.join("my-js-checker.wasm");
    ran(
        "componentize-js (the JavaScript template, outside the checkout)",
        Command::new(checker.join("node_modules/.bin/componentize-js"))
            .arg("checker.js")
            .arg("--wit")
            .arg(&wit)
            .args([
                "--world-name",
                "membership-checker",
                "-d",
                "http",
                "-d",
                "fetch-event",
                "-o",
            ])
            .arg(&wasm)
            .current_dir(&checker)
            .output(),
    )?;
    Ok((checker, wasm))
}

/// The Python template, copied out, its WIT fetched from the registry with
/// `wkg get` (as its README says), built by componentize-py.
fn build_the_python_template(wkg: &Path, config: &Path, work: &Path) -> Result<(PathBuf, PathBuf)> {
    let checker = work.join("my-python-checker");
    copy_tree(&repo().join("guests/templates/python"), &checker)?;
    wkg_get(wkg, config, &checker, &work.join("wkg-cache-get"))?;
    let tools = std::env::var_os("PORTWISE_TOOLS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache().join("tools"));
    let componentize = tools.join("python/bin/componentize-py");
    ensure!(
        componentize.is_file(),
        "{} is missing: guests/build python installs it",
        componentize.display()
    );
    let wasm = work.join("my-python-checker.wasm");
    ran(
        "componentize-py (the Python template, outside the checkout)",
        Command::new(&componentize)
            .args(["-d", "wit", "-w", "membership-checker", "componentize"])
            .args(["-p", ".", "checker", "-o"])
            .arg(&wasm)
            .current_dir(&checker)
            .output(),
    )?;
    Ok((checker, wasm))
}

/// The npm package and the wheel hold the contract's WIT: the tarball
/// lists it, and the wheel, installed into a venv of its own, points at it.
fn check_js_and_python(tgz: &Path, wheel: &Path, work: &Path) -> Result<()> {
    let wit = std::fs::read(repo().join("wit/membership.wit"))?;
    let files = tar_list(tgz)?;
    for want in [
        "package/package.json",
        "package/index.js",
        "package/wit/membership.wit",
    ] {
        ensure!(
            files.iter().any(|f| f == want),
            "{} lacks {want}: {files:?}",
            tgz.display()
        );
    }
    let env = work.join("wheel-venv");
    ran(
        "python3 -m venv",
        Command::new("python3")
            .args(["-m", "venv"])
            .arg(&env)
            .output(),
    )?;
    ran(
        "pip install (the wheel)",
        Command::new(env.join("bin/pip"))
            .args([
                "install",
                "--quiet",
                "--no-index",
                "--disable-pip-version-check",
            ])
            .arg(wheel)
            .output(),
    )?;
    let dir = ran(
        "python -m portwise_guest",
        Command::new(env.join("bin/python"))
            .args(["-m", "portwise_guest"])
            .current_dir(work)
            .output(),
    )?;
    let dir = PathBuf::from(dir.trim());
    ensure!(
        dir.starts_with(&env) && std::fs::read(dir.join("membership.wit"))? == wit,
        "the wheel's WIT ({}) is not the contract's",
        dir.display()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn templates_build_from_the_published_packages() -> Result<()> {
    if deferred::skip(&["registry", "wkg"], TEST) {
        return Ok(());
    }
    let cp = ControlPlane::shared().await?;
    let reg = Registry::start(cp).await?;
    let wkg = tokio::task::spawn_blocking(wkg).await??;
    let portwise = portwise_bin()?;
    // Outside the checkout (the system's temporary directory).
    let work = tempfile::Builder::new().prefix("portwise-sdk-").tempdir()?;
    ensure!(
        !work.path().starts_with(repo()),
        "the scratch is in the checkout"
    );
    let config = work.path().join("wkg.toml");
    wkg_config(&reg, &config)?;
    let work_path = work.path().to_path_buf();
    tokio::task::spawn_blocking(move || -> Result<()> {
        let work = work_path.as_path();
        // Packed and the WIT package published as a release does it.
        let printed = ran(
            "guests/sdk/pack --publish",
            Command::new(repo().join("guests/sdk/pack"))
                .arg(work.join("packages"))
                .arg("--publish")
                .arg("--wkg-config")
                .arg(&config)
                .env("PORTWISE_WKG", &wkg)
                .output(),
        )?;
        let files: Vec<PathBuf> = printed.lines().map(PathBuf::from).collect();
        let [_wit, krate, tgz, wheel] = files.as_slice() else {
            anyhow::bail!("guests/sdk/pack printed {printed:?}");
        };
        check_js_and_python(tgz, wheel, work)?;

        let krate = unpack_the_crate(krate, work)?;
        let (rust, wasm) = build_the_rust_template(work, &krate)?;
        replays(&portwise, &rust, &wasm, &work.join("replay-rust"))?;

        let (python, wasm) = build_the_python_template(&wkg, &config, work)?;
        replays(&portwise, &python, &wasm, &work.join("replay-python"))?;

        let (c, wasm) = build_the_c_template(&wkg, &config, work)?;
        replays(&portwise, &c, &wasm, &work.join("replay-c"))?;

        let (js, wasm) = build_the_js_template(tgz, work)?;
        replays(&portwise, &js, &wasm, &work.join("replay-js"))?;
        Ok(())
    })
    .await?
    .with_context(|| format!("registry log:\n{}", reg.logs()))?;
    Ok(())
}
