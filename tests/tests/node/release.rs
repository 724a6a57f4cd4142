//! The release rehearsal (issue 46): `deploy/release`, the command the
//! release workflow runs on a tag, run against the suite's own registry
//! (the CNCF distribution registry, TLS and htpasswd), and the result
//! installed on the real node the way docs/operations.md says: the chart
//! from the registry (`helm install oci://…`), the image it names pulled
//! by containerd from the registry by digest, with a pull Secret. Then
//! what a cautious user checks: the signatures of the index, of both its
//! images and of the chart, and the SBOM attestation, with `cosign verify`
//! as the docs write it; the binaries against their checksums; and the
//! arm64 entry of the same index, whose binary runs under qemu.

use std::{
    io::Read as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, ensure};
use portwise_tests::{
    built_tool,
    cosign::{Cosign, cosign_binary},
    deferred, env_file, expect_eq,
    node::RealNode,
    portwise_bin,
    registry::{self, Registry},
    repo_root,
};

use crate::support::*;

const TEST: &str = "release::the_release_installs_from_the_registry_signed_with_its_sbom";
const QEMU: &str = "qemu-aarch64-static";
/// `EM_AARCH64`, bytes 18..20 of an ELF header.
const EM_AARCH64: u16 = 183;

fn ran(what: &str, out: std::process::Output) -> Result<String> {
    portwise_tests::stdout_of(what, &out)
}

/// The descriptor of `platform`'s (`amd64`, `arm64`) image in an index.
fn entry<'a>(index: &'a serde_json::Value, arch: &str) -> Result<&'a serde_json::Value> {
    index["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["platform"]["architecture"] == arch && m["platform"]["os"] == "linux")
        .with_context(|| format!("no linux/{arch} entry in the index: {index}"))
}

/// The `/portwise` of an image's layers (tar archives, compressed or not),
/// unpacked into `dir`.
fn binary_of(layers: &[Vec<u8>], dir: &Path) -> Result<PathBuf> {
    for (i, layer) in layers.iter().enumerate() {
        let file = dir.join(format!(".layer-{i}"));
        std::fs::write(&file, layer)?;
        ran(
            "tar -xf LAYER",
            Command::new("tar")
                .arg("-xf")
                .arg(&file)
                .arg("-C")
                .arg(dir)
                .output()?,
        )?;
        std::fs::remove_file(&file)?;
    }
    let bin = dir.join("portwise");
    ensure!(bin.is_file(), "no /portwise in the image's layers");
    Ok(bin)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_release_installs_from_the_registry_signed_with_its_sbom() -> Result<()> {
    if deferred::skip(&["image", "arm64", "release"], TEST) {
        return Ok(());
    }
    let node = RealNode::shared().await?;
    node.portwise_image()?;
    let reg = Registry::start_signed_by(&node.pki_dir()).await?;
    let cosign = Cosign::new(&reg)?;
    let key = cosign.generate_key_pair("release")?;
    let work = tempfile::Builder::new()
        .prefix("portwise-release-")
        .tempdir()?;
    let auth = work.path().join("auth.json");
    reg.write_auth(&auth, registry::USER, registry::PASSWORD)?;
    let registry = format!("{}/rehearsal", reg.host());
    let out = work.path().join("out");

    // 1. The release, as the workflow runs it (with a key pair instead of
    //    keyless signing).
    let cache = Path::new(&std::env::var("HOME")?).join(".cache/portwise");
    let released = {
        let mut c = Command::new(repo_root().join("deploy/release"));
        c.args(["--registry", &registry, "--key"])
            .arg(&key.private)
            .arg("--ca-file")
            .arg(reg.ca_file())
            .arg("--out")
            .arg(&out)
            .env("REGISTRY_AUTH_FILE", &auth)
            .env("COSIGN", cosign_binary()?)
            .env("HELM", built_tool("tests/helm/build")?)
            .env("COSIGN_PASSWORD", "")
            .env("CARGO_TARGET_DIR", cache.join("target-image"))
            .stderr(Stdio::inherit());
        // Under ./test the suite's image build has just compiled this
        // commit's amd64 binary: pack it rather than compile again.
        if std::env::var_os("PORTWISE_IMAGE_BUILD").is_some() {
            c.env(
                "PORTWISE_AMD64_BINARY",
                cache.join("target-image/x86_64-unknown-linux-musl/release/portwise"),
            );
        }
        tokio::task::spawn_blocking(move || c.output()).await??
    };
    ran("deploy/release", released)?;
    let env = env_file(&out.join("release.env"))?;
    let get = |k: &str| -> Result<&str> {
        env.get(k)
            .map(String::as_str)
            .with_context(|| format!("no {k} in release.env: {env:?}"))
    };
    let version = env!("CARGO_PKG_VERSION");
    expect_eq(get("VERSION")?, version)?;
    let image = get("IMAGE")?;
    expect_eq(image, format!("{registry}/portwise").as_str())?;
    let image_digest = get("IMAGE_DIGEST")?;
    let chart = get("CHART")?;
    let chart_digest = get("CHART_DIGEST")?;

    // 2. The binaries match their checksums; the amd64 one is this build.
    ran(
        "sha256sum --check SHA256SUMS",
        Command::new("sha256sum")
            .args(["--check", "--strict", "SHA256SUMS"])
            .current_dir(&out)
            .output()?,
    )?;
    let sums = std::fs::read_to_string(out.join("SHA256SUMS"))?;
    for arch in ["amd64", "arm64"] {
        ensure!(
            sums.contains(&format!("portwise-{version}-linux-{arch}")),
            "SHA256SUMS lacks the {arch} binary:\n{sums}"
        );
    }
    let host_version = ran(
        "portwise --version",
        Command::new(portwise_bin()?).arg("--version").output()?,
    )?;
    let amd64_version = ran(
        "the released amd64 binary's --version",
        Command::new(out.join(format!("portwise-{version}-linux-amd64")))
            .arg("--version")
            .output()?,
    )?;
    expect_eq(amd64_version.trim(), host_version.trim())?;

    // 3. The index holds both architectures; each is signed, and so are
    //    the index and the chart: `cosign verify` as docs/operations.md
    //    writes it (with the key instead of the workflow's identity). A
    //    key the release did not sign with is refused.
    let repo = "rehearsal/portwise";
    let (index, digest) = reg.manifest(repo, version).await?;
    expect_eq(digest.as_str(), image_digest)?;
    let pubkey = key.public.display().to_string();
    let verify = |reference: &str| {
        cosign.run_args(&[
            "verify",
            "--key",
            &pubkey,
            "--insecure-ignore-tlog=true",
            reference,
        ])
    };
    let mut platforms = Vec::new();
    for arch in ["amd64", "arm64"] {
        let d = entry(&index, arch)?["digest"]
            .as_str()
            .context("an entry without a digest")?
            .to_string();
        verify(&format!("{image}@{d}"))?;
        platforms.push(d);
    }
    verify(&format!("{image}@{image_digest}"))?;
    let chart_ref = chart.trim_start_matches("oci://");
    verify(&format!("{chart_ref}@{chart_digest}"))?;
    let stranger = cosign.generate_key_pair("stranger")?;
    let refused = cosign.run_args(&[
        "verify",
        "--key",
        &stranger.public.display().to_string(),
        "--insecure-ignore-tlog=true",
        &format!("{image}@{image_digest}"),
    ]);
    ensure!(
        refused.is_err(),
        "cosign verify accepted a key the release never signed with"
    );

    // 4. The SBOM: a signed CycloneDX attestation whose predicate names
    //    this version, stored as an OCI referrer of the index (the
    //    registry has no referrers API: the `sha256-HEX` tag schema).
    let attested = cosign.run_args(&[
        "verify-attestation",
        "--key",
        &pubkey,
        "--insecure-ignore-tlog=true",
        "--type",
        "cyclonedx",
        &format!("{image}@{image_digest}"),
    ])?;
    let statement = attested
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find_map(|envelope| {
            use base64::Engine as _;
            let payload = envelope["payload"].as_str()?;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(payload)
                .ok()?;
            serde_json::from_slice::<serde_json::Value>(&bytes).ok()
        })
        .with_context(|| format!("no in-toto statement in:\n{attested}"))?;
    expect_eq(
        statement["predicateType"].as_str(),
        Some("https://cyclonedx.org/bom"),
    )?;
    let bom = &statement["predicate"];
    expect_eq(
        bom["metadata"]["component"]["name"].as_str(),
        Some("portwise"),
    )?;
    expect_eq(
        bom["metadata"]["component"]["version"].as_str(),
        Some(version),
    )?;
    let components = bom["components"].as_array().map_or(0, Vec::len);
    ensure!(components > 100, "the SBOM lists {components} components");
    let hex = image_digest.trim_start_matches("sha256:");
    let (referrers, _) = reg.manifest(repo, &format!("sha256-{hex}")).await?;
    let mut sbom_referrer = false;
    for r in referrers["manifests"].as_array().into_iter().flatten() {
        let d = r["digest"]
            .as_str()
            .context("a referrer without a digest")?;
        let (m, _) = reg.manifest(repo, d).await?;
        if m["subject"]["digest"] == image_digest
            && m["annotations"]["dev.sigstore.bundle.predicateType"] == "https://cyclonedx.org/bom"
        {
            sbom_referrer = true;
        }
    }
    ensure!(
        sbom_referrer,
        "no referrer of {image_digest} holds the CycloneDX attestation: {referrers}"
    );

    // 5. Install from the registry: containerd trusts its CA, a pull
    //    Secret holds the credentials, the chart comes by its OCI
    //    reference, and names the image by the index's digest.
    node.trust_registry(&reg.host(), &reg.ca_file())?;
    delete_namespace(node, SYSTEM_NS)?;
    node.kubectl(&["create", "namespace", SYSTEM_NS])?;
    node.kubectl(&[
        "-n",
        SYSTEM_NS,
        "create",
        "secret",
        "docker-registry",
        "portwise-pull",
        &format!("--docker-server={}", reg.host()),
        &format!("--docker-username={}", registry::USER),
        &format!("--docker-password={}", registry::PASSWORD),
    ])?;
    let ca = reg.ca_file().display().to_string();
    let auth_path = auth.display().to_string();
    node.helm(&[
        "install",
        "portwise",
        chart,
        "--version",
        version,
        "-n",
        SYSTEM_NS,
        "--wait",
        "--timeout",
        "3m",
        "--ca-file",
        &ca,
        "--registry-config",
        &auth_path,
        "--set",
        "imagePullSecrets[0].name=portwise-pull",
    ])?;
    two_ready_one_leader(node, "portwise").await?;

    // The pods run the index by digest, and containerd fetched the amd64
    // image's layers, not the arm64 one's.
    let images = node.kubectl(&[
        "-n",
        SYSTEM_NS,
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/instance=portwise",
        "-o",
        "jsonpath={range .items[*]}{.spec.containers[0].image} {.status.containerStatuses[0].imageID}{\"\\n\"}{end}",
    ])?;
    let want = format!("{image}@{image_digest}");
    let lines: Vec<&str> = images.lines().filter(|l| !l.is_empty()).collect();
    ensure!(lines.len() == 2, "expected two pods:\n{images}");
    for line in &lines {
        let (spec, id) = line.split_once(' ').unwrap_or((line, ""));
        expect_eq(spec, want.as_str())?;
        ensure!(
            id.ends_with(image_digest),
            "the pod's imageID {id:?} is not the index {image_digest}"
        );
    }
    let content = node.ctr(&["content", "ls", "-q"])?;
    let layers_of = |m: &serde_json::Value| -> Vec<String> {
        m["layers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|l| l["digest"].as_str().map(str::to_string))
            .collect()
    };
    let (amd64, _) = reg.manifest(repo, &platforms[0]).await?;
    let (arm64, _) = reg.manifest(repo, &platforms[1]).await?;
    for layer in layers_of(&amd64) {
        ensure!(
            content.contains(&layer),
            "containerd lacks the amd64 layer {layer}"
        );
    }
    for layer in layers_of(&arm64) {
        ensure!(
            !content.contains(&layer),
            "containerd fetched the arm64 layer {layer} for an amd64 node"
        );
    }

    // 6. The arm64 entry of the same index: its binary is an aarch64 ELF
    //    that runs under qemu and says the same version and revision.
    let mut layers = Vec::new();
    for layer in layers_of(&arm64) {
        layers.push(reg.blob(repo, &layer).await?);
    }
    let unpacked = work.path().join("arm64");
    std::fs::create_dir(&unpacked)?;
    let bin = binary_of(&layers, &unpacked)?;
    let mut head = [0u8; 20];
    std::fs::File::open(&bin)?.read_exact(&mut head)?;
    ensure!(
        head.starts_with(b"\x7fELF") && u16::from_le_bytes([head[18], head[19]]) == EM_AARCH64,
        "the arm64 image's /portwise is not an aarch64 ELF"
    );
    let emulated = ran(
        "the arm64 image's binary under qemu",
        Command::new(QEMU)
            .arg(&bin)
            .arg("--version")
            .env_remove("KUBECONFIG")
            .output()
            .context("running qemu-aarch64-static (tests/setup installs it)")?,
    )?;
    expect_eq(emulated.trim(), host_version.trim())?;

    helm_uninstall(node, "portwise")?;
    std::fs::remove_dir_all(Path::new(node.env("CONTAINERD_CERTS_D")?).join(reg.host()))?;
    println!(
        "released {version}: {image}@{image_digest} ({} entries), {chart}@{chart_digest}, SBOM of {components} components",
        platforms.len()
    );
    Ok(())
}
