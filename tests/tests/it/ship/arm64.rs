//! The arm64 binary (issue 46): cross-compiled by `deploy/build-binary
//! --arch arm64` (static musl, Zig as the C toolchain) and run under
//! `qemu-aarch64-static`, to prove it works, not just links: its
//! `--version` says what the host binary's does, a template guest's
//! recorded probes replay through its cranelift JIT for aarch64 into the
//! committed table, and the core crate's unit tests pass on arm64.
//!
//! Deferred on a cold machine like the image (the cross build is a release
//! build of every dependency); warm, the script rebuilds what changed.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
};

use anyhow::{Context, Result, ensure};
use portwise_tests::*;

use super::support::repo;

const TEST: &str = "ship::arm64::the_arm64_binary_runs_under_emulation";
const QEMU: &str = "qemu-aarch64-static";

/// `EM_AARCH64` in an ELF header's `e_machine` (bytes 18..20, little end).
const EM_AARCH64: u16 = 183;

fn ran(what: &str, out: &Output) -> Result<String> {
    stdout_of(what, out)
}

/// `program args` under qemu, in `dir`.
fn emulated(program: &Path, args: &[&str], dir: &Path) -> Result<Output> {
    Command::new(QEMU)
        .arg(program)
        .args(args)
        .current_dir(dir)
        .env("PORTWISE_CACHE_DIR", dir.join("cache"))
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .output()
        .with_context(|| {
            format!("running {QEMU} (Debian: qemu-user-static; tests/setup installs it)")
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_arm64_binary_runs_under_emulation() -> Result<()> {
    if deferred::skip(&["arm64"], TEST) {
        return Ok(());
    }
    let built = tokio::task::spawn_blocking(|| {
        Command::new(repo().join("deploy/build-binary"))
            .args(["--arch", "arm64", "--core-tests"])
            .stderr(Stdio::inherit())
            .output()
    })
    .await??;
    let printed = ran("deploy/build-binary --arch arm64 --core-tests", &built)?;
    let mut paths = printed.lines().map(PathBuf::from);
    let (bin, core_tests) = (
        paths.next().context("build-binary printed no binary")?,
        paths.next().context("build-binary printed no core tests")?,
    );

    // Built for arm64, statically: an ELF for aarch64 with no interpreter.
    let elf = std::fs::read(&bin)?;
    ensure!(
        elf.starts_with(b"\x7fELF") && u16::from_le_bytes([elf[18], elf[19]]) == EM_AARCH64,
        "{} is not an aarch64 ELF",
        bin.display()
    );
    let dir = tempfile::Builder::new()
        .prefix("portwise-arm64-")
        .tempdir()?;
    std::fs::create_dir(dir.path().join("cache"))?;

    // The same version and revision as the host binary of this checkout.
    let arm = ran(
        "--version under qemu",
        &emulated(&bin, &["--version"], dir.path())?,
    )?;
    let host = ran(
        "the host binary's --version",
        &Command::new(portwise_bin()?).arg("--version").output()?,
    )?;
    expect_eq(arm.trim(), host.trim())?;

    // A guest's decisions, replayed: cranelift compiles the component for
    // aarch64 and the emulated CPU runs it, into the committed table.
    let module = guests_dir().join("templates/rust-template.wasm");
    ensure!(
        module.is_file(),
        "{} is missing (guests/build)",
        module.display()
    );
    let testdata = repo().join("guests/templates/rust/testdata");
    let file = |name: &str| testdata.join(name).display().to_string();
    let config = std::fs::read_to_string(testdata.join("config-tcp.json"))?;
    let table = ran(
        "check --replay under qemu",
        &emulated(
            &bin,
            &[
                "check",
                "--wasm",
                &module.display().to_string(),
                "--wasm-config",
                config.trim(),
                "--pod",
                &file("pod.yaml"),
                "--service",
                &file("service.yaml"),
                "--replay",
                &file("probes-tcp.json"),
            ],
            dir.path(),
        )?,
    )?;
    expect_eq(
        table,
        std::fs::read_to_string(testdata.join("expected-tcp.txt"))?,
    )?;

    // The core crate's unit tests, on arm64.
    let report = ran(
        "portwise-core's unit tests under qemu",
        &emulated(&core_tests, &["--test-threads=2"], dir.path())?,
    )?;
    let passed: usize = report
        .lines()
        .find_map(|l| l.strip_prefix("test result: ok. "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .context(format!("no test result in:\n{report}"))?;
    ensure!(passed >= 100, "only {passed} core tests ran:\n{report}");
    println!("arm64 under qemu: --version, a replayed guest and {passed} core tests");
    Ok(())
}

/// `org.opencontainers.image.*` annotations every image manifest carries.
const ANNOTATION: &str = "org.opencontainers.image.";

/// A blob of the OCI layout at `dir`, by digest.
fn blob(dir: &Path, digest: &str) -> Result<Vec<u8>> {
    let hex = digest
        .strip_prefix("sha256:")
        .context("not a sha256 digest")?;
    let path = dir.join("blobs/sha256").join(hex);
    std::fs::read(&path).with_context(|| format!("reading {}", path.display()))
}

fn json_blob(dir: &Path, digest: &str) -> Result<serde_json::Value> {
    Ok(serde_json::from_slice(&blob(dir, digest)?)?)
}

/// The `e_machine` of `/portwise` in an image's layers (gzip tars).
fn machine_of_binary(dir: &Path, manifest: &serde_json::Value) -> Result<u16> {
    let scratch = tempfile::Builder::new()
        .prefix("portwise-layer-")
        .tempdir()?;
    for layer in manifest["layers"].as_array().into_iter().flatten() {
        let digest = layer["digest"]
            .as_str()
            .context("a layer without a digest")?;
        let path = dir
            .join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:"));
        let out = Command::new("tar")
            .arg("-xf")
            .arg(&path)
            .arg("-C")
            .arg(scratch.path())
            .output()?;
        ran(&format!("tar -xf {}", path.display()), &out)?;
    }
    let elf =
        std::fs::read(scratch.path().join("portwise")).context("no /portwise in the image")?;
    ensure!(elf.starts_with(b"\x7fELF"), "/portwise is not an ELF");
    Ok(u16::from_le_bytes([elf[18], elf[19]]))
}

/// `deploy/build-image --index` makes an image index of linux/amd64 and
/// linux/arm64 whose images hold the binary of their architecture and
/// carry the OCI annotations (source, revision, version, licences).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_index_holds_both_architectures_with_their_annotations() -> Result<()> {
    if deferred::skip(
        &["image", "arm64"],
        "ship::arm64::the_image_index_holds_both_architectures_with_their_annotations",
    ) {
        return Ok(());
    }
    // The suite's own image build uses the same target directory.
    wait_for_image_build().await?;
    let dir = tempfile::Builder::new()
        .prefix("portwise-index-")
        .tempdir()?;
    let layout = dir.path().join("index");
    let image = format!("localhost/portwise-index-test:{}", std::process::id());
    const SOURCE: &str = "https://example.invalid/portwise";
    let target =
        Path::new(&std::env::var("HOME").unwrap_or_default()).join(".cache/portwise/target-image");
    let built = {
        let (image, layout) = (image.clone(), layout.clone());
        tokio::task::spawn_blocking(move || {
            let mut build = Command::new(repo().join("deploy/build-image"));
            build
                .arg("--index")
                .arg(&layout)
                .env("IMAGE", &image)
                .env("PORTWISE_SOURCE", SOURCE)
                .env("CARGO_TARGET_DIR", &target)
                .stderr(Stdio::inherit());
            // Under ./test the suite's image build has just compiled this
            // commit's amd64 binary: pack it rather than compile again.
            if std::env::var_os("PORTWISE_IMAGE_BUILD").is_some() {
                build.env(
                    "PORTWISE_AMD64_BINARY",
                    target.join("x86_64-unknown-linux-musl/release/portwise"),
                );
            }
            build.output()
        })
        .await??
    };
    let removed = |what: &str| {
        let _ = Command::new("podman")
            .args(["manifest", "rm", what])
            .output();
        for arch in ["amd64", "arm64"] {
            let _ = Command::new("podman")
                .args(["rmi", &format!("{what}-{arch}")])
                .output();
        }
    };
    let result = (|| -> Result<()> {
        ran("deploy/build-image --index", &built)?;
        let outer: serde_json::Value =
            serde_json::from_slice(&std::fs::read(layout.join("index.json"))?)?;
        let index_digest = outer["manifests"][0]["digest"]
            .as_str()
            .context("the layout's index.json names nothing")?;
        let index = json_blob(&layout, index_digest)?;
        expect_eq(
            index["mediaType"].as_str(),
            Some("application/vnd.oci.image.index.v1+json"),
        )?;
        let revision = ran(
            "git rev-parse HEAD",
            &Command::new("git")
                .args(["rev-parse", "HEAD"])
                .current_dir(repo())
                .output()?,
        )?;
        let mut platforms = Vec::new();
        for entry in index["manifests"].as_array().into_iter().flatten() {
            let arch = entry["platform"]["architecture"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            expect_eq(entry["platform"]["os"].as_str(), Some("linux"))?;
            let manifest = json_blob(&layout, entry["digest"].as_str().unwrap_or_default())?;
            let annotations = &manifest["annotations"];
            for (key, want) in [
                ("source", SOURCE),
                ("revision", revision.trim()),
                ("version", env!("CARGO_PKG_VERSION")),
                ("licenses", "Apache-2.0"),
            ] {
                expect_eq(
                    (
                        arch.as_str(),
                        key,
                        annotations[format!("{ANNOTATION}{key}")].as_str(),
                    ),
                    (arch.as_str(), key, Some(want)),
                )?;
            }
            let config = json_blob(
                &layout,
                manifest["config"]["digest"].as_str().unwrap_or_default(),
            )?;
            expect_eq(config["architecture"].as_str(), Some(arch.as_str()))?;
            let machine = machine_of_binary(&layout, &manifest)?;
            let want = match arch.as_str() {
                "amd64" => 62, // EM_X86_64
                "arm64" => EM_AARCH64,
                other => anyhow::bail!("unexpected architecture {other} in the index"),
            };
            expect_eq((arch.as_str(), machine), (arch.as_str(), want))?;
            platforms.push(arch);
        }
        platforms.sort();
        expect_eq(platforms, vec!["amd64".to_string(), "arm64".to_string()])
    })();
    removed(&image);
    result
}
